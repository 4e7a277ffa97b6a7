"""Thin hooks of SLO-aware decode admission; the logic lives in SloController (slo_controller.py).

Without SGLANG_PD_ITL_TARGET_MS / SGLANG_PD_TTFT_TARGET_MS the admission and entry hooks call
SGLang's original unchanged; the step meter only reads the clock and the batch size.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from sglang_pd.process_state import STATE, mode_name
from sglang_pd.srt.mem_cache.common import RequestKind, request_kind

logger = logging.getLogger(__name__)


def _is_decode(scheduler) -> bool:
    return mode_name(scheduler.disaggregation_mode) == "decode"


def _kv_len(req) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def before_run_batch(scheduler, batch, *args, **kwargs):
    """Decode only: a forward starts now; the meter closes the previous step's sample."""
    if _is_decode(scheduler) and batch.forward_mode.is_decode():
        STATE.slo.on_step_start(time.perf_counter(), batch.batch_size(), sum(_kv_len(r) for r in batch.reqs),
                                bool(scheduler._sched_idled))


def around_get_new_prebuilt_batch(original, scheduler, running_batch):
    """Let only the first `admission_for(...)` waiting requests join; learn TTFT from those that do."""
    slo = STATE.slo
    if slo.itl_target_s is None and slo.ttft_target_s is None:
        return original(scheduler, running_batch)
    waiting = scheduler.waiting_queue
    num_admit = slo.admission_for(running_batch.batch_size(), sum(_kv_len(r) for r in running_batch.reqs),
                                  [_kv_len(r) for r in waiting]) if waiting else None
    if num_admit is None or num_admit >= len(waiting):
        batch = original(scheduler, running_batch)
    else:
        held = waiting[num_admit:]
        scheduler.waiting_queue = waiting[:num_admit]
        try:
            batch = original(scheduler, running_batch)
        finally:  # upstream rebinds waiting_queue to what it did not take; the held ones stay behind it
            scheduler.waiting_queue = list(scheduler.waiting_queue) + held
    if batch is not None:
        slo.on_admitted([str(r.rid) for r in batch.reqs], time.perf_counter())
    return batch


def _cached_prefix_len(tree, req) -> int:
    """Tokens of the prompt already on this decode server (a match takes no lock)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    if tree is None or getattr(tree, "disable", True):
        return 0
    key = RadixKey(token_ids=req.origin_input_ids, extra_key=req.extra_key)
    return int(tree.match_prefix(MatchPrefixParams(key=key)).device_prefix_len)


def around_prealloc_add(original, queue, req, is_retracted: bool = False, is_rebootstrap: bool = False):
    """A new request reaches decode: refuse it now if its predicted TTFT is over target."""
    slo = STATE.slo
    if (slo.ttft_target_s is None or is_retracted or is_rebootstrap
            or request_kind(req) is not RequestKind.NORMAL):
        return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
    sched = queue.scheduler
    num_ahead = len(queue.queue) + len(sched.disagg_decode_transfer_queue.queue) + len(sched.waiting_queue)
    uncached = len(req.origin_input_ids) - _cached_prefix_len(queue.tree_cache, req)
    decision = slo.on_entry(str(req.rid), time.perf_counter(), num_ahead, uncached)
    if decision.reject and req.finished_reason is None:
        from sglang.srt.disaggregation.utils import prepare_abort

        # Upstream's door: an aborted request that holds nothing is retired at once (no receiver, no
        # page, no lock) and its 503 streamed. Prefill never hears from this decode: the router (or
        # client) that sent the pair aborts the prefill half, as it does for any failed decode.
        logger.warning("sglang_pd: %s refused: %s", req.rid, decision.message)
        prepare_abort(req, decision.message, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
