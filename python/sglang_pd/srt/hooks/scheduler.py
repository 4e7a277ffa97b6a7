"""Hooks on SGLang's `Scheduler` (managers/scheduler.py): metrics labels, state export, faults, step timing."""

from __future__ import annotations

import logging
import time

from sglang_pd.srt.mem_cache.common import request_kv_len as kv_len
from sglang_pd.srt.mem_cache.tree_integrity import check_integrity
from sglang_pd.srt.state import INTERNAL_STATE_KEY, current, mode_name

logger = logging.getLogger(__name__)


def run_integrity_check(scheduler) -> None:
    """Check tree/allocator/ledger invariants now (scheduler thread) and keep the report."""
    tree = getattr(scheduler, "tree_cache", None)
    if tree is None or getattr(tree, "disable", True):
        return
    state = current()
    state.record_integrity(check_integrity(tree, scheduler.token_to_kv_pool_allocator, state.lock_ledger,
                                           idle=scheduler.is_fully_idle()))


_MAX_LISTED = 64


def queue_rids(scheduler) -> dict[str, list[str]]:
    """The request ids in each of SGLang's queues of this scheduler (first 64 each; read-only).

    Decode: prealloc -> transfer -> waiting -> running, and retracted; prefill: bootstrap -> waiting
    -> running -> inflight (sending KV)."""
    running = scheduler.running_batch.reqs if scheduler.running_batch is not None else []
    queues = {"waiting": scheduler.waiting_queue, "running": running}
    prealloc = scheduler.disagg_decode_prealloc_queue
    if prealloc is not None:
        queues.update(prealloc=prealloc.queue, retracted=prealloc.retracted_queue,
                      transfer=scheduler.disagg_decode_transfer_queue.queue)
    if scheduler.disagg_prefill_bootstrap_queue is not None:
        queues.update(bootstrap=scheduler.disagg_prefill_bootstrap_queue.queue,
                      inflight=scheduler.disagg_prefill_inflight_queue or [])
    return {name: [str(getattr(item, "req", item).rid) for item in list(items)[:_MAX_LISTED]]
            for name, items in queues.items()}


def after_get_internal_state(result, scheduler, recv_req):
    """Add this scheduler's sglang_pd snapshot (with a fresh integrity check and its queues) to the reply."""
    state = current()
    try:
        run_integrity_check(scheduler)
        result.internal_state[INTERNAL_STATE_KEY] = dict(state.snapshot(), queues=queue_rids(scheduler))
    except Exception as exc:  # observability must never take the scheduler down
        state.hook_failed("get_internal_state", "state snapshot failed")
        result.internal_state[INTERNAL_STATE_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def around_set_internal_state(original, scheduler, recv_req):
    """Take sglang_pd fault keys out of a set_internal_state request; pass the rest to SGLang."""
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    try:
        remaining = current().faults.arm_from_keys(dict(recv_req.server_args))
    except ValueError as exc:
        logger.warning("sglang_pd: %s", exc)
        return SetInternalStateReqOutput(updated=False)
    if len(remaining) == len(recv_req.server_args):
        return original(scheduler, recv_req)
    if not remaining:
        return SetInternalStateReqOutput(updated=True)
    recv_req.server_args = remaining
    return original(scheduler, recv_req)


def after_init_disaggregation(result, scheduler):
    """Label this scheduler's metrics with its role and backend; export them if metrics are on."""
    from sglang.srt.runtime_context import get_observability

    state = current()
    role = mode_name(scheduler.disaggregation_mode)
    backend = mode_name(scheduler.transfer_backend)
    try:
        if get_observability().enable_metrics:
            state.counters.bind(role, backend)
        else:
            state.counters.role, state.counters.backend = role, backend
    except Exception:
        state.hook_failed("init_disaggregation", "could not set up metrics")
    return result


def before_run_batch(scheduler, batch, pp_proxy_tensors=None):
    """Decode only: a forward starts now; the SLO step meter closes the previous step's sample."""
    if mode_name(scheduler.disaggregation_mode) == "decode" and batch.forward_mode.is_decode():
        current().slo.on_step_start(time.perf_counter(), batch.batch_size(), sum(kv_len(r) for r in batch.reqs),
                                    bool(scheduler._sched_idled))
