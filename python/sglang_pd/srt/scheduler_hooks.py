"""Hook that carries the scheduler's sglang_pd state to the HTTP process."""

from __future__ import annotations

import logging

from sglang_pd.process_state import STATE, mode_name
from sglang_pd.srt.mem_cache.tree_integrity import check_integrity

INTERNAL_STATE_KEY = "sglang_pd"
logger = logging.getLogger(__name__)


def run_integrity_check(scheduler) -> None:
    """Check tree/allocator/ledger invariants now (scheduler thread) and keep the report."""
    tree = getattr(scheduler, "tree_cache", None)
    if tree is None or getattr(tree, "disable", True):
        return
    idle = scheduler.is_fully_idle()
    STATE.record_integrity(check_integrity(tree, scheduler.token_to_kv_pool_allocator, STATE.lock_ledger,
                                           idle=idle))


def after_get_internal_state(result, scheduler, recv_req):
    """Add this scheduler's sglang_pd snapshot (with a fresh integrity check) to the reply."""
    try:
        run_integrity_check(scheduler)
        result.internal_state[INTERNAL_STATE_KEY] = STATE.snapshot()
    except Exception as exc:  # observability must never take the scheduler down
        STATE.count_hook_error("get_internal_state")
        logger.exception("sglang_pd: state snapshot failed")
        result.internal_state[INTERNAL_STATE_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def around_set_internal_state(original, scheduler, recv_req):
    """Take sglang_pd fault keys out of a set_internal_state request; pass the rest to SGLang."""
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    try:
        remaining = STATE.faults.arm_from_keys(dict(recv_req.server_args))
    except ValueError as exc:
        logger.warning("sglang_pd: %s", exc)
        return SetInternalStateReqOutput(updated=False)
    if len(remaining) == len(recv_req.server_args):
        return original(scheduler, recv_req)
    if not remaining:
        return SetInternalStateReqOutput(updated=True)
    recv_req.server_args = remaining
    return original(scheduler, recv_req)


def after_retract_decode(result, batch):
    """Count decode retractions (their locks are released through the ledger-checked unlock)."""
    retracted, _ratio, _to_abort = result
    STATE.num_retracted += len(retracted)
    return result


def after_init_disaggregation(result, scheduler):
    """Label this scheduler's metrics with its role and backend; export them if metrics are on."""
    from sglang.srt.runtime_context import get_observability

    role = mode_name(scheduler.disaggregation_mode)
    backend = mode_name(scheduler.transfer_backend)
    try:
        if get_observability().enable_metrics:
            STATE.counters.bind(role, backend)
        else:
            STATE.counters.role, STATE.counters.backend = role, backend
    except Exception:
        STATE.count_hook_error("init_disaggregation")
        logger.exception("sglang_pd: could not set up metrics")
    return result


def after_evict(result, tree_cache, *args, **kwargs):
    """Count evicted tokens (any tree, any caller)."""
    num = getattr(result, "num_tokens_evicted", 0) or 0
    if num:
        STATE.counters.add("evicted_tokens_total", num)
    return result
