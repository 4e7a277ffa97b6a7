"""A PD deployment on 127.0.0.1: prefill + N decode (+ optional plain server and router)."""

from __future__ import annotations

import concurrent.futures as cf
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sglang_pd.harness.cpu_env import cpu_server_args, server_env
from sglang_pd.harness.cpu_placement import CpuPlacement, PlacementKeeper
from sglang_pd.harness.test_logs import write_private_file
from sglang_pd.harness.deployment_requests import DeploymentRequests
from sglang_pd.harness.server import ServerProcess, ServerStartError, free_port, wait_healthy_rebinding
from sglang_pd.launch_router import auth_headers, wait_registered
from sglang_pd.models import DEFAULT_MODEL, ensure_model_dir, is_real_model
from sglang_pd.config import BOOTSTRAP_ADDRESSES, ENABLE_FAULT_INJECTION, PEER_SECRET_FILE

TRANSFER_BACKENDS = ("mooncake_tcp", "nixl")
# SGLang loads only the entry-point plugins SGLANG_PLUGINS names (when it is set); no plugin is called
# "none", so this keeps sglang_pd from loading in every process: the servers run upstream alone.
NO_PLUGINS_ENV = ("SGLANG_PLUGINS", "none")
BOOTSTRAP_FLAG = "--disaggregation-bootstrap-port"
NCCL_FLAG = "--nccl-port"  # the scheduler's torch.distributed rendezvous (SGLang would pick it itself)


@dataclass(frozen=True)
class DeploymentConfig:
    """What to start. Sizes default to what 2 CPU cores and the tiny model handle comfortably."""

    model: str = DEFAULT_MODEL
    page_size: int = 1
    transfer_backend: str = "mooncake_tcp"
    decode_radix: bool = True
    num_decode: int = 1
    with_plain: bool = False
    with_router: bool = False
    router_args: tuple[str, ...] = ()
    prefill_max_total_tokens: int = 16384
    decode_max_total_tokens: int = 8192
    num_reserved_decode_tokens: int = 64
    extra_prefill_args: tuple[str, ...] = ()
    extra_decode_args: tuple[str, ...] = ()
    startup_timeout_s: float = 420.0
    log_dir: Path | None = None
    fault_injection: bool = False  # mount POST /sglang_pd/faults (tests only)
    enable_metrics: bool = True    # SGLang's /metrics (with sglang_pd:* metrics) on every server
    env_overrides: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    plugin: bool = True            # False: sglang_pd not loaded (NO_PLUGINS_ENV); upstream SGLang alone
    decode_attention_backend: str = "torch_native"   # or sglang_pd_shared_prefix (registered by the plugin)
    prefill_attention_backend: str = "torch_native"  # the plain server always runs torch_native
    api_key: str | None = None     # SGLang's --api-key on every server and the router; the harness sends it
    # CPUs per role (cpu_placement.py), applied and checked by start() and PDDeployment.restart (not by
    # ServerProcess.restart alone, which keeps a server's CPUs but moves no scheduler); None: every CPU.
    cpu_placement: CpuPlacement | None = None

    def __post_init__(self):
        if self.transfer_backend not in TRANSFER_BACKENDS:
            raise ValueError(f"transfer_backend {self.transfer_backend!r} not in {TRANSFER_BACKENDS}")
        if self.page_size < 1 or self.num_decode < 1:
            raise ValueError(f"page_size ({self.page_size}) and num_decode ({self.num_decode}) must be >= 1")
        if self.api_key is not None and not self.plugin:
            raise ValueError("api_key: the harness checks a keyed deployment through /sglang_pd/*, so it needs "
                             "plugin=True")
        if not self.plugin and self.fault_injection:
            raise ValueError("fault_injection is a sglang_pd route: it needs plugin=True")
        for role, backend in (("decode", self.decode_attention_backend), ("prefill", self.prefill_attention_backend)):
            if not self.plugin and backend != "torch_native":
                raise ValueError(f"{role}_attention_backend {backend!r} is registered by sglang_pd: it needs "
                                 "plugin=True")


def with_extra_args(args: list[str], extra: tuple[str, ...], role: str) -> list[str]:
    """`args` followed by `extra`; raises ValueError naming any flag of `extra` that `args` already sets:
    SGLang would silently take the later value, and a run would not be the deployment it says it is."""
    flag = lambda a: a.split("=", 1)[0]  # noqa: E731
    clash = sorted({flag(a) for a in extra if a.startswith("--")} & {flag(a) for a in args if a.startswith("--")})
    if clash:
        raise ValueError(f"extra {role} server arguments {clash} are set by the harness itself; "
                         f"use DeploymentConfig's own field for them")
    return [*args, *extra]


def router_metrics_args(port: int | None = None) -> list[str]:
    """sglang-router exports Prometheus on a fixed default port (29000, all interfaces): give each
    router its own loopback port (`port`, else a free one) so several can run on one host."""
    return ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(port or free_port())]


class PDDeployment(DeploymentRequests):
    """Starts the configured servers (context manager); `stop()` ends exactly what it started."""

    def __init__(self, config: DeploymentConfig = DeploymentConfig()):
        self.config = config
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="sglang_pd-"))
        self.model_dir = ensure_model_dir(config.model)
        self.env = server_env()
        if config.fault_injection:
            self.env[ENABLE_FAULT_INJECTION] = "1"
        self.env.update(dict(config.env_overrides))
        if self.env.get(PEER_SECRET_FILE) and BOOTSTRAP_ADDRESSES not in self.env:
            self.env[BOOTSTRAP_ADDRESSES] = "127.0.0.1"  # every prefill here binds there (ports may move: any port)
        if not config.plugin:
            self.env.update([NO_PLUGINS_ENV])
        place = config.cpu_placement
        bootstrap = free_port()
        self.prefill = self._server("prefill", self._prefill_args(bootstrap), place and place.prefill,
                                    {BOOTSTRAP_FLAG: bootstrap})
        self.decodes = [self._server(f"decode{i}", self._decode_args(), place and place.decode)
                        for i in range(config.num_decode)]
        self.plain = self._server("plain", self._plain_args(), place and place.client) if config.with_plain else None
        self._routing_cpus = place and place.client  # the router and launcher run beside the client
        self.router: ServerProcess | None = None
        self.headers = auth_headers(config.api_key)  # on every request the harness sends
        # (server, flag, taken port, new port): each port a server lost to another socket before binding it
        self.port_rebinds: list[tuple[str, str, int, int]] = []
        self._placement = PlacementKeeper(place) if place else None

    # ---- argv -------------------------------------------------------------------------------------
    def _common_args(self, max_total_tokens: int, attention_backend: str = "torch_native") -> list[str]:
        tokenizer = [] if is_real_model(self.config.model) else ["--skip-tokenizer-init"]
        return ["--model-path", str(self.model_dir), *tokenizer, "--host", "127.0.0.1", "--page-size", str(self.config.page_size),
                "--max-total-tokens", str(max_total_tokens), "--log-level", "warning",
                *(["--enable-metrics"] if self.config.enable_metrics else []),
                *(["--api-key", self.config.api_key] if self.config.api_key else []),
                *cpu_server_args(attention_backend)]

    def _prefill_args(self, bootstrap_port: int) -> list[str]:
        args = [*self._common_args(self.config.prefill_max_total_tokens, self.config.prefill_attention_backend),
                "--disaggregation-mode", "prefill",
                "--disaggregation-transfer-backend", self.config.transfer_backend,
                BOOTSTRAP_FLAG, str(bootstrap_port)]
        return with_extra_args(args, self.config.extra_prefill_args, "prefill")

    def _decode_args(self) -> list[str]:
        radix = (["--disaggregation-decode-enable-radix-cache"] if self.config.decode_radix
                 else ["--disaggregation-decode-retraction-backup", "cpu_tensor"])
        args = [*self._common_args(self.config.decode_max_total_tokens, self.config.decode_attention_backend),
                "--disaggregation-mode", "decode",
                "--disaggregation-transfer-backend", self.config.transfer_backend,
                "--num-reserved-decode-tokens", str(self.config.num_reserved_decode_tokens), *radix]
        return with_extra_args(args, self.config.extra_decode_args, "decode")

    def _plain_args(self) -> list[str]:
        return self._common_args(self.config.decode_max_total_tokens)

    def _server(self, name: str, args: list[str], cpus: frozenset[int] | None,
                ports: dict[str, int] | None = None) -> ServerProcess:
        """An SGLang server given every port it listens on (harness/ports.py): its HTTP port, the
        torch.distributed port its scheduler binds, and those in `ports` (already in `args`)."""
        own = {"--port": free_port(), NCCL_FLAG: free_port()}
        clash = sorted(set(own) & {a.split("=", 1)[0] for a in args})
        if clash:
            raise ValueError(f"{name}: {clash} are chosen by the harness (harness/ports.py), not passed in")
        argv = [sys.executable, "-m", "sglang.launch_server", *args, *[str(a) for kv in own.items() for a in kv]]
        return ServerProcess(name, argv, self.env, own["--port"], self.log_dir, cpus=cpus,
                             other_ports={NCCL_FLAG: own[NCCL_FLAG], **(ports or {})})

    @property
    def bootstrap_port(self) -> int:
        """Prefill's bootstrap server port (follows a rebind: see harness/ports.py)."""
        return self.prefill.ports[BOOTSTRAP_FLAG]

    # ---- lifecycle --------------------------------------------------------------------------------
    @property
    def servers(self) -> list[ServerProcess]:
        """Every SGLang server of this deployment (router excluded)."""
        return [self.prefill, *self.decodes, *([self.plain] if self.plain else [])]

    def start(self) -> "PDDeployment":
        """Start all servers together, wait for health, then the router. Stops all on failure."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        try:
            for server in self.servers:
                server.start()
            with cf.ThreadPoolExecutor(len(self.servers)) as pool:
                for fut in [pool.submit(self._wait_rebinding, s, deadline) for s in self.servers]:
                    fut.result()
            self._check_plugin_loaded()
            self._apply_placement(self.servers)
            if self.config.with_router:
                self.router = self._start_router(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_rebinding(self, server: ServerProcess, deadline: float) -> None:
        """Wait for `server`, moving it to fresh ports if one of its own was taken (recorded in `port_rebinds`)."""
        self.port_rebinds += [(server.name, *move) for move in wait_healthy_rebinding(server, deadline)]

    @property
    def placement_checked(self) -> dict[str, int]:
        """Process name -> processes verified on its CPUs by the last check ({} without a placement)."""
        return dict(self._placement.checked) if self._placement else {}

    def _apply_placement(self, procs: list[ServerProcess]) -> None:
        """With a CPU placement: take on each of `procs` started on a placement's CPUs (a decode server's
        scheduler moved to `decode_scheduler` when set), then check every placed process."""
        for proc in procs:
            if proc.cpus is not None:
                self._placement.apply(proc, is_decode=proc in self.decodes)
        if self._placement:
            self._placement.check()

    def settle_placement(self) -> int:
        """Move back to the decode CPUs the threads a moved main thread (split decode-step) has started
        since (SGLang 0.5.23 starts 2 ZMQ threads with the first request). Returns how many threads were
        moved (0 without a placement). Call it after a first request, then `check_placement`."""
        return self._placement.settle() if self._placement else 0

    def check_placement(self) -> dict[str, int]:
        """Raise RuntimeError naming any thread of a placed server, router or launcher still running
        (children included) allowed on other CPUs than its role's; moves nothing. Returns how many
        processes were checked per placed process ({} without a placement)."""
        return self._placement.check() if self._placement else {}

    def restart(self, server: ServerProcess, deadline: float) -> None:
        """Restart `server` (same argv, env, port; see ServerProcess.restart) and wait for its health; with
        a CPU placement its new processes are placed again (a decode server's new scheduler moved) and checked."""
        if self._placement:
            self._placement.forget(server)
        server.restart(deadline)
        self._apply_placement([server])

    def _check_plugin_loaded(self) -> None:
        """Raise ServerStartError naming a server whose sglang_pd state is not the configured one
        (GET /sglang_pd/info answers exactly when the plugin is active there)."""
        for server in self.servers:
            status = requests.get(server.url + "/sglang_pd/info", headers=self.headers, timeout=30).status_code
            if (status == 200) != self.config.plugin:
                want = "active" if self.config.plugin else "not loaded"
                raise ServerStartError(f"{server.name}: sglang_pd should be {want} but GET /sglang_pd/info "
                                       f"answered {status}; see {server.log_path}")

    def _start_router(self, deadline: float) -> ServerProcess:
        port, metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                "--host", "127.0.0.1", "--port", str(port),
                "--prefill", self.prefill.url, str(self.bootstrap_port),
                *[a for d in self.decodes for a in ("--decode", d.url)],
                "--log-level", "warn", "--health-check-interval-secs", "2", *router_metrics_args(metrics_port),
                *(["--api-key", self.config.api_key] if self.config.api_key else []), *self.config.router_args]
        return self._start_routing(ServerProcess("router", argv, self.env, port, self.log_dir,
                                                 health_path="/readiness", cpus=self._routing_cpus,
                                                 other_ports={"--prometheus-port": metrics_port}), deadline)

    def start_launcher(self, policy: str, timeout_s: float = 120) -> ServerProcess:
        """Start `python -m sglang_pd.launch_router` over this deployment (caller stops it)."""
        port = free_port()
        argv = [sys.executable, "-m", "sglang_pd.launch_router", "--policy", policy, "--port", str(port),
                "--prefill", self.prefill.url, str(self.bootstrap_port),
                *[a for d in self.decodes for a in ("--decode", d.url)],
                "--router-arg=--log-level", "--router-arg=warn",
                "--router-arg=--health-check-interval-secs", "--router-arg=2",
                *[f"--router-arg={a}" for a in router_metrics_args()], *self._api_key_file_args()]
        router = ServerProcess(f"launcher-{policy}", argv, self.env, port, self.log_dir, health_path="/readiness",
                               cpus=self._routing_cpus)
        return self._start_routing(router, time.monotonic() + timeout_s)

    def _api_key_file_args(self) -> list[str]:
        """`--api-key-file` for the launcher: the key written to a 0600 file in this deployment's log folder."""
        if not self.config.api_key:
            return []
        path = write_private_file(self.log_dir / "api_key", self.config.api_key + "\n")
        return ["--api-key-file", str(path)]

    def _start_routing(self, router: ServerProcess, deadline: float) -> ServerProcess:
        """Start `router`; return once it routes to every server of this deployment (stopped on failure).

        /readiness (liveness is /health) can turn 200 while the router has registered only some of the
        workers; traffic sent then would pin conversations to the ones it knows (see launch_router)."""
        router.start()
        try:
            self._wait_rebinding(router, deadline)
            self._apply_placement([router])
            wait_registered(router.url, [self.prefill.url, *[d.url for d in self.decodes]],
                            max(1.0, deadline - time.monotonic()), api_key=self.config.api_key)
        except BaseException:
            router.stop()
            raise
        return router

    def stop(self) -> None:
        """Stop the router and every server this deployment started (in parallel)."""
        procs = [p for p in [self.router, *self.servers] if p is not None]
        with cf.ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(lambda p: p.stop(), procs))

    def __enter__(self) -> "PDDeployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise ServerStartError naming any server (or router) that has exited."""
        for proc in [p for p in [self.router, *self.servers] if p is not None]:
            if not proc.is_running():
                raise ServerStartError(f"{proc.name} is not running; see {proc.log_path}")
