"""NIXL with the KV pool in host memory, progress that cannot hang, and pages counted at NIXL.

Upstream registers every KV buffer with NIXL as "VRAM"; with a CPU KV pool UCX refuses it and the
server dies at start-up. On a CPU device we declare the buffers "DRAM" (prefill and decode both:
prefill builds its destination lists from the kinds decode advertises) and turn the agent's
progress thread off (it busy-polls a core); prefill's transfer worker then drives progress itself.

A transfer that never completes would spin that worker forever (upstream's wait is unbounded while
no error is seen). We bound it: past SGLANG_PD_NIXL_STALL_TIMEOUT_S the transfer reads as "ERR",
upstream's own failure path fails the room and tells decode, and decode releases lock and pages.

Pages are counted where NIXL is asked to move them (`send_kvcache`), per bootstrap room: the room
is taken from the chunk the worker thread just dequeued.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time

from sglang_pd.process_state import STATE
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.mem_cache.common import bytes_per_page

logger = logging.getLogger(__name__)

STALL_ENV = "SGLANG_PD_NIXL_STALL_TIMEOUT_S"  # declared in sglang_pd.config
DEFAULT_STALL_TIMEOUT_S = 60.0
_HOST_MEMORY = contextvars.ContextVar("sglang_pd_nixl_host_memory", default=False)
_worker = threading.local()  # per transfer-worker thread: room, deadline, stalled


def stall_timeout_s() -> float:
    """Seconds after which an unfinished NIXL transfer is declared failed (env, validated)."""
    raw = os.environ.get(STALL_ENV, str(DEFAULT_STALL_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{STALL_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{STALL_ENV} must be > 0, got {value}")
    return value


def _kv_on_host() -> bool:
    from sglang.srt.runtime_context import get_device

    return str(get_device().device) == "cpu"


def around_manager_init(original, mgr, args, *rest, **kwargs):
    """On a CPU device: KV buffers are DRAM, and the agent created inside runs without progress thread."""
    on_host = _kv_on_host()
    if on_host:
        args.kv_data_mem_kinds = ["DRAM"] * len(args.kv_data_ptrs)
    token = _HOST_MEMORY.set(on_host)
    try:
        return original(mgr, args, *rest, **kwargs)
    finally:
        _HOST_MEMORY.reset(token)


def before_agent_config_init(*args, **kwargs):
    """Inside a host-memory NixlKVManager: no busy-polling progress thread."""
    if _HOST_MEMORY.get():
        kwargs["enable_prog_thread"] = False
        return args, kwargs
    return None


def after_queue_get(chunk, queue, *args, **kwargs):
    """Remember which room this transfer-worker thread is serving."""
    room = getattr(chunk, "room", None)
    if room is not None:
        _worker.room = int(room)
        _worker.stalled = STATE.faults.take(Fault.NIXL_STALL, int(room))
    return chunk


def after_send_kvcache(handle, mgr, peer_name, prefill_kv_indices, *args, **kwargs):
    """Count the KV pages (and bytes) NIXL was just asked to move for the current room."""
    room = getattr(_worker, "room", None)
    pages = len(prefill_kv_indices)
    STATE.prefill_log.record_nixl_pages(room, pages, pages * bytes_per_page(mgr.kv_args))
    return handle


def around_await_handles(original, mgr, handles, *args, **kwargs):
    """Arm this thread's stall deadline for the batch being awaited."""
    _worker.deadline = time.monotonic() + stall_timeout_s()
    _worker.reported = False
    try:
        return original(mgr, handles, *args, **kwargs)
    finally:
        _worker.deadline = None


def after_check_xfer_state(state, agent, handle, *args, **kwargs):
    """Past the deadline an unfinished transfer reads as ERR (upstream then fails the room)."""
    deadline = getattr(_worker, "deadline", None)
    if deadline is None:
        return state
    if getattr(_worker, "stalled", False) and state == "DONE":
        state = "PROC"  # injected stall: the transfer never reports completion
    if state not in ("DONE", "ERR") and time.monotonic() > deadline:
        if not _worker.reported:
            _worker.reported = True
            logger.error("sglang_pd: NIXL transfer for room %s stalled for more than %.0f s; failing it",
                         getattr(_worker, "room", None), stall_timeout_s())
            STATE.prefill_log.record_stall()
        return "ERR"
    return state
