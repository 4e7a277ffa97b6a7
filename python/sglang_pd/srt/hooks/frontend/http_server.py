"""Hook on SGLang's HTTP server (entrypoints/http_server.py) and the routes sglang_pd adds to its app.

GET /sglang_pd/info   -> version, role, how the subprocesses started, hooks applied in the HTTP and
                         scheduler processes.
GET /sglang_pd/stats  -> the scheduler-side state of every DP rank (counters, ledger, integrity, ...).
POST /sglang_pd/faults -> arm test faults (mounted only with SGLANG_PD_ENABLE_FAULT_INJECTION=1).
SGLang's /health and /health_generate answer 503 while a PD thread is dead (srt/http/health.py).
Concurrent callers of these routes share one question to the schedulers (srt/metrics/single_flight.py).
"""

from __future__ import annotations

import sglang_pd
from sglang_pd.srt.http import HealthGuardMiddleware
from sglang_pd.srt.http import RetryAfterMiddleware
from sglang_pd.srt.fault_injection import KEY_PREFIX
from sglang_pd.srt.metrics import RefreshBeforeScrape
from sglang_pd.srt.metrics import SingleFlight
from sglang_pd.srt.state import INTERNAL_STATE_KEY, current, mode_name

INFO_PATH = "/sglang_pd/info"
STATS_PATH = "/sglang_pd/stats"
FAULTS_PATH = "/sglang_pd/faults"


async def _ask_schedulers() -> list[dict]:
    from sglang.srt.entrypoints.http_server import get_global_state

    states = await get_global_state().tokenizer_manager.get_internal_state()
    return [s.get(INTERNAL_STATE_KEY, {}) for s in states]


# Every route of ours that asks the schedulers (/sglang_pd/stats, /sglang_pd/info, the refresh before a
# /metrics scrape, /health's dead-thread question) shares the question out: each answer runs the tree
# integrity check on every scheduler, and these routes are open to anyone without --api-key.
_SCHEDULERS = SingleFlight(_ask_schedulers)


async def _scheduler_states() -> list[dict]:
    """Every DP rank's sglang_pd state (shared with concurrent callers: read it, never mutate it)."""
    return await _SCHEDULERS.result()


def _server_args():
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state().tokenizer_manager.server_args


def _role() -> str:
    return mode_name(_server_args().disaggregation_mode)


async def info() -> dict:
    """Plugin version, this server's role and every hook sglang_pd applied."""
    schedulers = await _scheduler_states()
    return {
        "name": "sglang_pd",
        "version": sglang_pd.__version__,
        "sglang_version": sglang_pd.SUPPORTED_SGLANG_VERSION,
        "role": _role(),
        "model_path": str(_server_args().model_path),
        "page_size": int(_server_args().page_size or 1),
        "transfer_backend": str(_server_args().disaggregation_transfer_backend),
        "peers": current().peer_guard.sources.mode,   # this-host | authenticated | unauthenticated-remote
        "process_start": current().start_method.snapshot(),  # {method: forkserver | spawn, reason}
        "http_hooks": current().patched_hooks(),
        "scheduler_hooks": [s.get("applied_hooks", []) for s in schedulers],
    }


async def stats() -> dict:
    """Scheduler-side counters of every DP rank, and this HTTP process's peer guard (bootstrap server) and
    counters. /metrics sums a counter over the processes that export it: the schedulers, and this process
    once `metrics_exported`."""
    counters = current().counters
    return {"role": _role(), "schedulers": await _scheduler_states(),
            "http_process": {"handshake": current().peer_guard.snapshot(), "counters": counters.snapshot(),
                             # whether this process's counters are in /metrics (bound at its first bootstrap count)
                             "metrics_exported": counters.bound}}


async def arm_faults(body: dict) -> dict:
    """Arm test faults on every scheduler: body {"<fault>": count}. Only mounted when enabled."""
    from sglang.srt.entrypoints.http_server import get_global_state
    from sglang.srt.managers.io_struct import SetInternalStateReq

    keys = {f"{KEY_PREFIX}{name}": int(count) for name, count in body.items()}
    updated = await get_global_state().tokenizer_manager.set_internal_state(SetInternalStateReq(server_args=keys))
    if not all(updated):
        from fastapi import HTTPException

        raise HTTPException(status_code=400, detail=f"faults refused: {sorted(body)}; see server log")
    return {"armed": body}


def before_launch_server(server_args, init_tokenizer_manager_func=None, run_scheduler_process_func=None,
                         run_detokenizer_process_func=None, execute_warmup_func=None, launch_callback=None):
    """Mount our routes and middlewares before the app serves: the scrape refresh (integrity computed
    for every /metrics scrape) and, with a TTFT target, Retry-After on early-rejection 503s."""
    from sglang.srt.entrypoints.http_server import app

    settings = current().settings
    existing = {getattr(r, "path", None) for r in app.routes}
    if INFO_PATH in existing:
        return
    app.add_api_route(INFO_PATH, info, methods=["GET"])
    app.add_api_route(STATS_PATH, stats, methods=["GET"])
    if settings.fault_injection:
        app.add_api_route(FAULTS_PATH, arm_faults, methods=["POST"])
    app.add_middleware(RefreshBeforeScrape, refresh=_refresh_schedulers)
    if settings.ttft_target_s is not None:
        app.add_middleware(RetryAfterMiddleware)
    app.add_middleware(HealthGuardMiddleware, dead_threads=_dead_pd_threads)


async def _refresh_schedulers() -> None:
    """Every scheduler runs its integrity check (and updates its gauges) now: see srt/hooks/scheduling/scheduler.py."""
    await _scheduler_states()


async def _dead_pd_threads() -> dict[str, str]:
    """name -> role of every dead PD thread of this server (this HTTP process and its schedulers)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    dead: dict[str, str] = {}
    bootstrap = getattr(get_global_state().tokenizer_manager, "bootstrap_server", None)
    thread = getattr(bootstrap, "thread", None)
    if thread is not None and not thread.is_alive():
        dead[thread.name] = "bootstrap_http_server"
    for state in await _scheduler_states():
        threads = (state.get("handshake") or {}).get("threads") or {}
        dead.update(threads.get("dead") or {})
    return dead
