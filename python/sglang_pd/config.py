"""Every setting of sglang_pd: environment variables under one prefix, declared once, validated once.

`validate(environ)` returns one message per bad value, naming the variable; the plugin refuses to
activate (one log line each) rather than run with a setting it cannot honour. A setting whose failure
would leave the server less safe than its operator asked for (the peer secret) is `refuse_start`:
`fatal_problems(environ)` names those, and the plugin then stops the server from starting at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

PREFIX = "SGLANG_PD_"


@dataclass(frozen=True)
class Setting:
    """One environment setting."""

    name: str
    default: str | None
    help: str
    check: Callable[[str], str | None]  # returns a problem or None
    refuse_start: bool = False          # a bad value stops the server instead of deactivating the plugin


def _positive(unit: str) -> Callable[[str], str | None]:
    """A check that the value is a number > 0, its messages naming `unit`."""
    def check(value: str) -> str | None:
        try:
            return None if float(value) > 0 else f"must be > 0 {unit}"
        except ValueError:
            return f"is not a number of {unit}"

    return check


def _flag(value: str) -> str | None:
    return None if value in ("0", "1") else "must be 0 or 1"


def _path(value: str) -> str | None:
    return None if value.strip() else "must be a folder path"


def _secret_file(value: str) -> str | None:
    """The peer secret file must hold keys of >= 32 characters; the message never shows its content."""
    from sglang_pd.srt.disaggregation.peer_auth import SecretFileError, read_keys

    try:
        read_keys(value)
    except SecretFileError as exc:
        return f"is unusable: {exc}"
    return None


SETTINGS: tuple[Setting, ...] = (
    Setting(f"{PREFIX}NIXL_STALL_TIMEOUT_S", "60",
            "seconds after which an unfinished NIXL transfer is failed (its lock and pages released)",
            _positive("seconds")),
    Setting(f"{PREFIX}ENABLE_FAULT_INJECTION", "0",
            "1 mounts POST /sglang_pd/faults and accepts test faults; never set it in production", _flag),
    Setting(f"{PREFIX}RADIX_RESUME", "1",
            "1: a resumed retracted decode request re-matches the radix tree and restores only the uncached"
            " part; 0: SGLang's full restore", _flag),
    Setting(f"{PREFIX}BATCHED_EVICTION", "1",
            "1: decode plans each admission round at once and evicts once for it; 0: SGLang's per-request"
            " eviction", _flag),
    Setting(f"{PREFIX}MODEL_DIR", None,
            "where built-in model folders are written (default ~/.cache/sglang_pd/models)", _path),
    # SLO-aware decode admission (srt/disaggregation/slo_controller.py); unset = upstream behaviour.
    Setting(f"{PREFIX}ITL_TARGET_MS", None,
            "decode: target inter-token latency (ms); waiting requests join the running batch only while "
            "the learned step time stays within it (an empty batch always takes one)", _positive("milliseconds")),
    Setting(f"{PREFIX}TTFT_TARGET_MS", None,
            "decode: refuse a new request at once (HTTP 503 + Retry-After) when its predicted time to "
            "first token exceeds this many ms", _positive("milliseconds")),
    # Hostile peers (srt/disaggregation/peer_auth.py, handshake_gate.py); README "Security model".
    Setting(f"{PREFIX}PEER_SECRET_FILE", None,
            "path of a file holding the PD deployment's shared secret (one key per line, >= 32 characters; the "
            "first signs, all verify: rotation). Every handshake message and bootstrap request is then "
            "authenticated (HMAC-SHA256, timestamp + nonce). Same file on every PD server; unset: peers are "
            "not authenticated (one warning at start-up)", _secret_file, refuse_start=True),
    Setting(f"{PREFIX}PEER_AUTH_MAX_SKEW_S", "30",
            "seconds a signed handshake message stays acceptable (clocks of PD servers must agree within it)",
            _positive("seconds"), refuse_start=True),
    Setting(f"{PREFIX}UNCLAIMED_ROOM_TTL_S", "120",
            "prefill: seconds a room's transfer infos are kept while no local request claims the room",
            _positive("seconds")),
)


def validate(environ: Mapping[str, str] | None = None) -> list[str]:
    """Problems with the settings in `environ` (default os.environ), one message each; [] if fine."""
    env = os.environ if environ is None else environ
    known = {s.name for s in SETTINGS}
    problems = [f"{s.name}={env[s.name]!r} {msg}" for s in SETTINGS
                if s.name in env and (msg := s.check(env[s.name]))]
    problems += [f"{name} is not a sglang_pd setting (known: {', '.join(sorted(known))})"
                 for name in env if name.startswith(PREFIX) and name not in known]
    return problems


def fatal_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Problems that must stop the server from starting (bad refuse_start settings; see module doc)."""
    env = os.environ if environ is None else environ
    problems = [f"{s.name}={env[s.name]!r} {msg}" for s in SETTINGS
                if s.refuse_start and s.name in env and (msg := s.check(env[s.name]))]
    if env.get(f"{PREFIX}PEER_SECRET_FILE") and env.get("SGLANG_DISAGG_STAGING_BUFFER", "").lower() in ("1", "true"):
        problems.append(f"{PREFIX}PEER_SECRET_FILE cannot be combined with SGLANG_DISAGG_STAGING_BUFFER=1: SGLang "
                        "sends staging requests on sockets sglang_pd does not sign")
    return problems


def enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """The 0/1 flag setting `name` (full name, e.g. SGLANG_PD_RADIX_RESUME) with its declared default."""
    env = os.environ if environ is None else environ
    default = next(s.default for s in SETTINGS if s.name == name)
    return env.get(name, default) == "1"
