"""HTTP endpoints sglang_pd adds to SGLang's FastAPI app (served on the server's own port).

GET /sglang_pd/info  -> version, role, hooks applied in the HTTP and scheduler processes.
GET /sglang_pd/stats -> the scheduler-side state (prefill transfer log, handshake guard, ...).
SGLang's /health also answers 503 while a PD thread is dead (srt/hooks/http_server.py).
"""

from __future__ import annotations

import sglang_pd
from sglang_pd.process_state import STATE, mode_name
from sglang_pd.srt.fault_injection import KEY_PREFIX
from sglang_pd.srt.fault_injection import enabled as fault_injection_enabled
from sglang_pd.srt.disaggregation.slo_http import mount_retry_after
from sglang_pd.srt.hooks.http_server import mount_health_guard
from sglang_pd.srt.scheduler_hooks import INTERNAL_STATE_KEY

INFO_PATH = "/sglang_pd/info"
STATS_PATH = "/sglang_pd/stats"
FAULTS_PATH = "/sglang_pd/faults"


async def scheduler_states() -> list[dict]:
    """The sglang_pd state of every scheduler of this server (SGLang's get_internal_state round trip)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    states = await get_global_state().tokenizer_manager.get_internal_state()
    return [s.get(INTERNAL_STATE_KEY, {}) for s in states]


def _server_args():
    from sglang.srt.entrypoints.http_server import get_global_state

    return get_global_state().tokenizer_manager.server_args


def _role() -> str:
    return mode_name(_server_args().disaggregation_mode)


async def info() -> dict:
    """Plugin version, this server's role and every hook sglang_pd applied."""
    schedulers = await scheduler_states()
    return {
        "name": "sglang_pd",
        "version": sglang_pd.__version__,
        "sglang_version": sglang_pd.SUPPORTED_SGLANG_VERSION,
        "role": _role(),
        "model_path": str(_server_args().model_path),
        "page_size": int(_server_args().page_size or 1),
        "transfer_backend": str(_server_args().disaggregation_transfer_backend),
        "http_hooks": STATE.patched_hooks(),
        "scheduler_hooks": [s.get("applied_hooks", []) for s in schedulers],
    }


async def stats() -> dict:
    """Scheduler-side counters of every DP rank, and this HTTP process's peer guard (bootstrap server)."""
    return {"role": _role(), "schedulers": await scheduler_states(),
            "http_process": {"handshake": STATE.peer_guard.snapshot()}}


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


def before_launch_server(*args, **kwargs):
    """Mount our routes on SGLang's app before it starts serving."""
    from sglang.srt.entrypoints.http_server import app

    existing = {getattr(r, "path", None) for r in app.routes}
    if INFO_PATH not in existing:
        app.add_api_route(INFO_PATH, info, methods=["GET"])
        app.add_api_route(STATS_PATH, stats, methods=["GET"])
        if fault_injection_enabled():
            app.add_api_route(FAULTS_PATH, arm_faults, methods=["POST"])
        mount_retry_after(app)
        mount_health_guard(app)
