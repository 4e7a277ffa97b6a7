"""Every setting of sglang_pd: environment variables under one prefix, declared once, parsed once.

`Settings.from_env()` parses every `SGLANG_PD_*` variable into one frozen object, or raises
`SettingsError` naming each bad value and each unknown name. `problems()` lists the same messages
without raising. Each process builds its objects from that one object (`srt/state.py`); nothing
else reads the environment for a setting of ours. Clients (harness, benchmarks) set these
variables on servers by the names exported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from sglang_pd.secret_file import SecretFileError, read_keys

PREFIX = "SGLANG_PD_"
NIXL_STALL_TIMEOUT_S = f"{PREFIX}NIXL_STALL_TIMEOUT_S"
ENABLE_FAULT_INJECTION = f"{PREFIX}ENABLE_FAULT_INJECTION"
RADIX_RESUME = f"{PREFIX}RADIX_RESUME"
BATCHED_EVICTION = f"{PREFIX}BATCHED_EVICTION"
MODEL_DIR = f"{PREFIX}MODEL_DIR"
ITL_TARGET_MS = f"{PREFIX}ITL_TARGET_MS"
TTFT_TARGET_MS = f"{PREFIX}TTFT_TARGET_MS"
LOCAL_PREFILL_TOKENS = f"{PREFIX}LOCAL_PREFILL_TOKENS"
LOCAL_PREFILL_STEP_TOKENS = f"{PREFIX}LOCAL_PREFILL_STEP_TOKENS"
LOCAL_PREFILL_BALANCE_TOKENS = f"{PREFIX}LOCAL_PREFILL_BALANCE_TOKENS"
TEST_LOGS = f"{PREFIX}TEST_LOGS"
MOONCAKE_MAX_BATCH_DESCRIPTORS = f"{PREFIX}MOONCAKE_MAX_BATCH_DESCRIPTORS"
PEER_SECRET_FILE = f"{PREFIX}PEER_SECRET_FILE"
PEER_AUTH_MAX_SKEW_S = f"{PREFIX}PEER_AUTH_MAX_SKEW_S"
MAX_PEER_AUTH_SKEW_S = 120.0
PEER_CURVE = f"{PREFIX}PEER_CURVE"
KV_DIGEST = f"{PREFIX}KV_DIGEST"
ALLOW_UNAUTHENTICATED_REMOTE_PEERS = f"{PREFIX}ALLOW_UNAUTHENTICATED_REMOTE_PEERS"
BOOTSTRAP_ADDRESSES = f"{PREFIX}BOOTSTRAP_ADDRESSES"
UNCLAIMED_ROOM_TTL_S = f"{PREFIX}UNCLAIMED_ROOM_TTL_S"
IDLE_WAIT_US = f"{PREFIX}IDLE_WAIT_US"
TRANSFER_WORKER_NICE = f"{PREFIX}TRANSFER_WORKER_NICE"
HELPER_THREADS_BATCH = f"{PREFIX}HELPER_THREADS_BATCH"
CPU_FORKSERVER = f"{PREFIX}CPU_FORKSERVER"
MAX_PARALLEL_SAMPLES = f"{PREFIX}MAX_PARALLEL_SAMPLES"
SHARED_PREFIX_KERNELS = f"{PREFIX}SHARED_PREFIX_KERNELS"


class SettingsError(ValueError):
    """One or more bad settings; `problems` holds one message per bad value or unknown name."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _positive(unit: str, scale: float = 1.0) -> Callable[[str], float]:
    """A parser of a number > 0 in `unit`, returned multiplied by `scale`; messages name `unit`."""
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"is not a number of {unit}") from None
        if not number > 0:
            raise ValueError(f"must be > 0 {unit}")
        return number * scale

    return parse


def _seconds_up_to(cap: float) -> Callable[[str], float]:
    """A parser of a number of seconds in (0, cap]."""
    positive = _positive("seconds")

    def parse(value: str) -> float:
        number = positive(value)
        if number > cap:
            raise ValueError(f"exceeds the cap of {cap:g} seconds")
        return number

    return parse


def _count(minimum: int) -> Callable[[str], int]:
    """A parser of a whole number of tokens >= `minimum`."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError("is not a whole number of tokens") from None
        if number < minimum:
            raise ValueError(f"must be >= {minimum} tokens")
        return number

    return parse


def _bounded_count(minimum: int, maximum: int, unit: str) -> Callable[[str], int]:
    """A parser of a whole number of `unit` in [minimum, maximum]."""
    def parse(value: str) -> int:
        if not value.isdigit() or not minimum <= int(value) <= maximum:
            raise ValueError(f"must be a whole number of {unit} in [{minimum}, {maximum}]")
        return int(value)

    return parse


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return value == "1"


def _one_of(*choices: str) -> Callable[[str], str]:
    """A parser of one of `choices`."""
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _whole(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError("must be a whole number >= 1")
    return int(value)


def _folder(value: str) -> Path:
    if not value.strip():
        raise ValueError("must be a folder path")
    return Path(value)


def _host_ports(value: str) -> tuple[tuple[str, int | None], ...]:
    """A comma-separated list of `host` or `host:port` (IPv6 in brackets: `[::1]:8998`); empty means none."""
    entries = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, port = item, None
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"entry {item!r} is not host or host:port")
                port = rest[1:]
        elif item.count(":") == 1:
            host, port = item.split(":")
        if not host or any(c.isspace() or c in "/@?#" for c in host):
            raise ValueError(f"entry {item!r} is not host or host:port")
        if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"entry {item!r} has a port outside [1, 65535]")
        entries.append((host, None if port is None else int(port)))
    return tuple(entries)


def _secret_file(value: str) -> Path:
    """A private file of strong keys (secret_file.read_keys); the message names the path, never the content."""
    try:
        read_keys(value)
    except SecretFileError as exc:
        raise ValueError(f"is unusable: {exc}") from None
    return Path(value)


@dataclass(frozen=True)
class Setting:
    """One environment setting and the Settings field it fills."""

    name: str
    field: str
    default: str | None  # as written in the environment; None: unset means the field's own default
    help: str
    parse: Callable[[str], Any]  # raises ValueError with the problem (without the name)


SETTINGS: tuple[Setting, ...] = (
    Setting(NIXL_STALL_TIMEOUT_S, "nixl_stall_timeout_s", "60",
            "seconds after which an unfinished NIXL transfer is failed (its lock and pages released)",
            _positive("seconds")),
    Setting(ENABLE_FAULT_INJECTION, "fault_injection", "0",
            "1 mounts POST /sglang_pd/faults and accepts test faults; never set it in production", _flag),
    Setting(RADIX_RESUME, "radix_resume", "1",
            "1: a resumed retracted decode request re-matches the radix tree and restores only the uncached"
            " part; 0: SGLang's full restore", _flag),
    Setting(BATCHED_EVICTION, "batched_eviction", "1",
            "1: decode plans each admission round at once and evicts once for it; 0: SGLang's per-request"
            " eviction", _flag),
    Setting(MODEL_DIR, "model_dir", None,
            "where built-in model folders are written (default ~/.cache/sglang_pd/models)", _folder),
    # SLO-aware decode admission (srt/slo/controller.py); unset = upstream behaviour.
    Setting(ITL_TARGET_MS, "itl_target_s", None,
            "decode: target inter-token latency (ms); waiting requests join the running batch only while "
            "the learned step time stays within it (an empty batch always takes one)",
            _positive("milliseconds", 1e-3)),
    Setting(TTFT_TARGET_MS, "ttft_target_s", None,
            "decode: refuse a new request at once (HTTP 503 + Retry-After) when its predicted time to "
            "first token exceeds this many ms", _positive("milliseconds", 1e-3)),
    # Decode-local prefill (srt/local_prefill/queue.py); 0 = off = every request goes to prefill.
    Setting(LOCAL_PREFILL_TOKENS, "local_prefill_tokens", "0",
            "decode: when at most this many prompt tokens are missing from the decode radix tree, decode "
            "computes them itself and tells prefill to drop the request (0 = off)", _count(0)),
    Setting(LOCAL_PREFILL_STEP_TOKENS, "local_prefill_step_tokens", "256",
            "decode: at most this many local-prefill tokens run between two decode steps (protects ITL); "
            f"must be >= {LOCAL_PREFILL_TOKENS}", _count(1)),
    Setting(LOCAL_PREFILL_BALANCE_TOKENS, "local_prefill_balance_tokens", "0",
            f"decode: a request past {LOCAL_PREFILL_TOKENS} with at most this many uncached tokens is also computed on "
            "decode when decode would finish it first: its tokens plus those queued for local extends do not exceed the "
            f"uncached tokens decode still waits for from prefill (0 = off; > {LOCAL_PREFILL_TOKENS}, <= {LOCAL_PREFILL_STEP_TOKENS})",
            _count(0)),
    Setting(MOONCAKE_MAX_BATCH_DESCRIPTORS, "mooncake_max_batch_descriptors", "512",
            "mooncake: a transfer batch with more descriptors is sent as consecutive batches of at most this "
            "many (its TCP transport refuses a batch over its per-peer queue limit: ~2,048 here)", _whole),
    # Hostile peers (srt/auth/peer_auth.py, handshake/gate.py); README "Security model".
    Setting(PEER_SECRET_FILE, "peer_secret_file", None,
            "path of a file holding the PD deployment's shared secret (mode 600, owned by the server's user; one "
            "key per line, each of >= 256 bits, e.g. `openssl rand -hex 32`; the first signs, all verify: rotation). Every handshake message and bootstrap request is then "
            "authenticated (HMAC-SHA256, timestamp + nonce). Same file on every PD server; unset: peers are "
            f"not authenticated and only this host may talk to the PD sockets (see {ALLOW_UNAUTHENTICATED_REMOTE_PEERS})",
            _secret_file),
    Setting(ALLOW_UNAUTHENTICATED_REMOTE_PEERS, "allow_unauthenticated_remote_peers", "0",
            f"every PD server: 1 lets other hosts talk to the bootstrap routes and rank sockets without "
            f"{PEER_SECRET_FILE} (upstream's behaviour; a warning at start-up and in /sglang_pd/info). 0 (default): "
            "without a secret, messages from any source address but this host's own are refused unread, counted "
            "and logged once per source", _flag),
    Setting(BOOTSTRAP_ADDRESSES, "bootstrap_addresses", "",
            f"decode with {PEER_SECRET_FILE} (required there): the prefill bootstrap servers it signs bootstrap "
            "requests for, comma-separated `host` (any port) or `host:port`; a request naming another address is "
            "refused (HTTP 400) and never signed. Prefill signs for its own bootstrap server without it. No "
            "meaning without a secret (docs/security.md)", _host_ports),
    Setting(PEER_CURVE, "peer_curve", "0",
            f"1: the PD rank sockets speak ZMQ CURVE with a key pair derived from {PEER_SECRET_FILE} (required): a "
            "peer without the secret cannot send a single frame (libzmq buffers an unfinished multipart message "
            "without bound before any check runs), and control messages are encrypted. Every PD server of the "
            "deployment must set it alike; the pair comes from the first key, so a key rotation needs all "
            "servers restarted together", _flag),
    Setting(KV_DIGEST, "kv_digest", "auto",
            "prefill and decode: 1 checks each transferred request's KV before decode uses or caches it: prefill "
            "sends a BLAKE2b-128 digest of the KV rows it sent in the room's (signed) status, decode compares its own "
            "and fails the request on a mismatch or a missing digest; 0 off; auto (default): on when "
            f"{PEER_SECRET_FILE} is set. Set it alike on every PD server", _one_of("auto", "0", "1")),
    Setting(PEER_AUTH_MAX_SKEW_S, "peer_auth_max_skew_s", "30",
            "seconds a signed handshake message stays acceptable (clocks of PD servers must agree within it); at "
            f"most {MAX_PEER_AUTH_SKEW_S:g}: a wider window is a longer replay window", _seconds_up_to(MAX_PEER_AUTH_SKEW_S)),
    Setting(UNCLAIMED_ROOM_TTL_S, "unclaimed_room_ttl_s", "120",
            "prefill: seconds a room's transfer infos are kept while no local request claims the room",
            _positive("seconds")),
    # PD schedulers waiting on transfers (srt/threads/idle_wait.py).
    Setting(IDLE_WAIT_US, "idle_wait_us", "500",
            "prefill and decode: microseconds a scheduler with transfers or handshakes in flight and nothing to "
            "run sleeps before it looks again (upstream spins a core on sleep(0); 0 keeps that)",
            _bounded_count(0, 100_000, "microseconds")),
    # Prefill's transfer workers below the schedulers (srt/threads/worker_priority.py).
    Setting(TRANSFER_WORKER_NICE, "transfer_worker_nice", "19",
            "prefill: Linux nice value of mooncake's KV transfer worker threads, which spin while their transfer "
            "runs (batch_transfer_sync polls without sleeping); 0 leaves them at the process's priority (upstream)",
            _bounded_count(0, 19, "nice levels")),
    # Helper threads without wake-up preemption (srt/threads/helper_threads.py).
    Setting(HELPER_THREADS_BATCH, "helper_threads_batch", "0",
            "prefill and decode: 1 runs every thread of the HTTP and detokenizer processes and the scheduler's "
            "Python and ZMQ helper threads at Linux SCHED_BATCH (no wake-up preemption), the scheduler thread at "
            "SCHED_OTHER; 0 (default) leaves every thread as upstream starts it", _flag),
    # How SGLang's subprocesses start (srt/processes/start_method.py).
    Setting(CPU_FORKSERVER, "cpu_forkserver", "1",
            "every server on --device cpu: 1 (default) starts SGLang's scheduler and detokenizer processes from a "
            "forkserver that imported them once (a PD pair: 30% less CPU to start here, docs/start_up.md); 0 keeps "
            "upstream's spawn. "
            "Never on other devices, nor with --enable-memory-saver or --numa-node", _flag),
    # Hostile requests (srt/http/request_checks.py).
    Setting(MAX_PARALLEL_SAMPLES, "max_parallel_samples", "128",
            "every server: a request whose sampling_params.n (parallel samples) exceeds this, or with n above 1 "
            "asks for more copies than this of all its prompts together, is refused with HTTP 400 before SGLang "
            "copies it (upstream has no cap: n = 10**6 stalls the HTTP process)",
            _bounded_count(1, 1_000_000, "parallel samples")),
    # The sglang_pd_shared_prefix attention backend's kernels (srt/attention/device_form.py).
    Setting(SHARED_PREFIX_KERNELS, "shared_prefix_kernels", "auto",
            "servers with --attention-backend / --decode-attention-backend sglang_pd_shared_prefix: auto (default) "
            "runs the device's own kernels (CPU: torch's fused kernel + a C kernel; CUDA: Triton, which needs "
            "--cuda-graph-backend-decode disabled); cpu or triton picks one, refused where the device cannot run "
            "it (triton on a CPU device only under TRITON_INTERPRET=1, for tests)", _one_of("auto", "cpu", "triton")),
    Setting(TEST_LOGS, "test_logs", None,
            "tests only: folder where the integration tier keeps server logs and its test peer secret (default: a new "
            "folder per test session under /tmp/sglang_pd-test-logs)",
            _folder),
)


@dataclass(frozen=True)
class Settings:
    """The parsed settings of one process (defaults = every variable unset)."""

    nixl_stall_timeout_s: float = 60.0
    fault_injection: bool = False
    radix_resume: bool = True
    batched_eviction: bool = True
    model_dir: Path | None = None
    itl_target_s: float | None = None
    ttft_target_s: float | None = None
    local_prefill_tokens: int = 0
    local_prefill_step_tokens: int = 256
    local_prefill_balance_tokens: int = 0
    mooncake_max_batch_descriptors: int = 512
    peer_secret_file: Path | None = None
    peer_auth_max_skew_s: float = 30.0
    peer_curve: bool = False
    kv_digest: str = "auto"
    allow_unauthenticated_remote_peers: bool = False
    bootstrap_addresses: tuple[tuple[str, int | None], ...] = ()
    unclaimed_room_ttl_s: float = 120.0
    idle_wait_us: int = 500
    transfer_worker_nice: int = 19
    helper_threads_batch: bool = False
    cpu_forkserver: bool = True
    max_parallel_samples: int = 128
    shared_prefix_kernels: str = "auto"
    test_logs: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Parse `environ` (default os.environ); raises SettingsError naming every problem."""
        values, problems = _parse(os.environ if environ is None else environ)
        if problems:
            raise SettingsError(problems)
        return cls(**values)

    @property
    def kv_digest_on(self) -> bool:
        """SGLANG_PD_KV_DIGEST resolved: 1, or auto with a peer secret."""
        return self.kv_digest == "1" or (self.kv_digest == "auto" and self.peer_secret_file is not None)

    @property
    def models_root(self) -> Path:
        """Where built-in model folders are written: model_dir, else ~/.cache/sglang_pd/models."""
        return self.model_dir or Path.home() / ".cache" / "sglang_pd" / "models"


def _parse(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for setting in SETTINGS:
        raw = env.get(setting.name, setting.default)
        if raw is None:
            continue
        try:
            values[setting.field] = setting.parse(raw)
        except ValueError as exc:
            problems.append(f"{setting.name}={raw!r} {exc}")
    problems += _conflicts(values, env)
    known = {s.name for s in SETTINGS}
    problems += [f"{name} is not a sglang_pd setting (known: {', '.join(sorted(known))})"
                 for name in env if name.startswith(PREFIX) and name not in known]
    return values, problems


def _conflicts(values: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """Settings that are fine alone but not together, one message naming both."""
    problems = []
    if values.get("peer_secret_file") and env.get("SGLANG_DISAGG_STAGING_BUFFER", "").lower() in ("1", "true"):
        problems.append(f"{PEER_SECRET_FILE} cannot be combined with SGLANG_DISAGG_STAGING_BUFFER=1: SGLang sends "
                        "staging requests on sockets sglang_pd does not sign")
    if values.get("peer_curve") and not values.get("peer_secret_file"):
        problems.append(f"{PEER_CURVE}=1 needs {PEER_SECRET_FILE}: the CURVE key pair is derived from the secret")
    if values.get("peer_secret_file") and values.get("allow_unauthenticated_remote_peers"):
        problems.append(f"{ALLOW_UNAUTHENTICATED_REMOTE_PEERS}=1 has no meaning with {PEER_SECRET_FILE}: with a secret "
                        "every host may talk and the MAC decides; unset one of them")
    if values.get("bootstrap_addresses") and not values.get("peer_secret_file"):
        problems.append(f"{BOOTSTRAP_ADDRESSES} has no meaning without {PEER_SECRET_FILE}: it lists the addresses a "
                        "decode signs bootstrap requests for, and without a secret nothing is signed; unset it")
    threshold = values.get("local_prefill_tokens", 0)
    step = values.get("local_prefill_step_tokens", Settings.local_prefill_step_tokens)
    if threshold > step:
        problems.append(f"{LOCAL_PREFILL_TOKENS}={threshold} exceeds {LOCAL_PREFILL_STEP_TOKENS}={step}: a request's "
                        "uncached tokens run in one local extend, which must fit one step's budget")
    balance = values.get("local_prefill_balance_tokens", 0)
    if balance and not threshold:
        problems.append(f"{LOCAL_PREFILL_BALANCE_TOKENS}={balance} needs {LOCAL_PREFILL_TOKENS} > 0: it widens decode-local prefill, which is off")
    elif balance and not threshold < balance <= step:
        problems.append(f"{LOCAL_PREFILL_BALANCE_TOKENS}={balance} must be > {LOCAL_PREFILL_TOKENS}={threshold} and "
                        f"<= {LOCAL_PREFILL_STEP_TOKENS}={step}: a balanced request's tokens run in one local extend")
    return problems


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Problems with the settings in `environ` (default os.environ), one message each; [] if fine."""
    return _parse(os.environ if environ is None else environ)[1]


def markdown_table() -> str:
    """The README's settings table, generated from SETTINGS (read-only): name, default, help text."""
    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for setting in SETTINGS:
        default = "unset" if setting.default is None else f"`{setting.default}`"
        help_text = setting.help.replace("|", r"\|")  # a bare | would end the cell
        rows.append(f"| `{setting.name}` | {default} | {help_text} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
