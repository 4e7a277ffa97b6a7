"""Hooks on SGLang's `SchedulerDisaggregationDecodeMixin` (disaggregation/decode.py).

    _get_new_prebuilt_batch              -> ITL-target admission cap (SloController); transferred KV checked
                                            against prefill's digest (SGLANG_PD_KV_DIGEST, wire/kv_digest.py)
    get_next_disagg_decode_batch_to_run  -> decode-local prefill: the last local extend joins the running
                                            batch once its result (first token) is processed; a new one
                                            runs inside this step's decode (one mixed forward) when due

Without SGLANG_PD_ITL_TARGET_MS / SGLANG_PD_TTFT_TARGET_MS / SGLANG_PD_LOCAL_PREFILL_TOKENS they call
SGLang's original unchanged.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from sglang_pd.srt.mem_cache import request_kv_len as kv_len
from sglang_pd.srt.metrics import recorded_decode_prefix_len
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def around_get_new_prebuilt_batch(original, scheduler, running_batch):
    """Let only the first `admission_for(...)` waiting requests join; learn TTFT from those that do. With
    SGLANG_PD_KV_DIGEST on, each transferred request's KV is then checked against prefill's digest before
    SGLang builds the batch or caches any of it (wire/kv_digest.py). (Test fault KV_PAGE_CORRUPT: a waiting
    request's first transferred page is overwritten first.)"""
    if current().faults.enabled:
        _corrupt_arrived_pages(scheduler)
    batch = _admitted_batch(original, scheduler, running_batch)
    if batch is not None and current().peer_guard.kv_digest:
        _check_transferred_kv(scheduler, batch)
    return batch


def _admitted_batch(original, scheduler, running_batch):
    slo = current().slo
    if slo.itl_target_s is None and slo.ttft_target_s is None:
        return original(scheduler, running_batch)
    waiting = scheduler.waiting_queue
    num_admit = slo.admission_for(running_batch.batch_size(), sum(kv_len(r) for r in running_batch.reqs),
                                  [kv_len(r) for r in waiting]) if waiting else None
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


def _check_transferred_kv(scheduler, batch) -> None:
    """Each request of `batch` whose KV prefill sent (once per request) is compared with the room's digest;
    one that fails is aborted (HTTP 500 naming the room), its pages freed without entering the tree, and it
    leaves the batch (upstream's own checksum path does the same: prepare_abort, stream, release)."""
    from sglang_pd.srt.mem_cache import RequestKind, request_kind
    from sglang_pd.srt.wire import kv_digest
    from sglang_pd.srt.wire.kv_digest import pool_layers

    state = current()
    layers, failed = None, {}
    for i, req in enumerate(batch.reqs):
        if (req.bootstrap_room is None or getattr(req, "_sglang_pd_kv_checked", False)
                or request_kind(req) is not RequestKind.NORMAL or state.local_prefill.record(str(req.rid)) is not None):
            continue
        req._sglang_pd_kv_checked = True
        began = time.perf_counter()
        layers = layers or pool_layers(scheduler.token_to_kv_pool_allocator.get_kvcache())
        start, end = int(req.kv.cache_protected_len), len(req.origin_input_ids)
        slots = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end].long()
        actual = kv_digest(layers, slots)
        state.counters.add("kv_digest_seconds_total", time.perf_counter() - began)
        verdict = state.peer_guard.received_kv.check(int(req.bootstrap_room), actual, end - start)
        if verdict.problem is None:
            state.counters.add("kv_digests_checked_total")
        else:
            failed[i] = verdict
    for i, verdict in failed.items():
        _fail_unverified(scheduler, batch.reqs[i], verdict)
    if failed:
        batch.filter_batch(keep_indices=[i for i in range(len(batch.reqs)) if i not in failed])


def _fail_unverified(scheduler, req, verdict) -> None:
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.mem_cache.common import release_kv_cache

    state = current()
    state.counters.add("kv_digests_missing_total" if verdict.missing else "kv_digest_mismatches_total")
    logger.error("%s (request %s)", verdict.problem, req.rid)
    prepare_abort(req, verdict.problem, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
    scheduler.output_streamer.stream_output([req], req.return_logprob)
    release_kv_cache(req, scheduler.tree_cache, checkpoint=False)


def _corrupt_arrived_pages(scheduler) -> None:
    """Test fault: for each waiting request (its KV arrived, no forward has read it) whose room has
    KV_PAGE_CORRUPT armed, the first page prefill sent is overwritten with noise in every layer."""
    from sglang_pd.srt.fault_injection import Fault, overwrite_with_noise

    faults = current().faults
    page = scheduler.token_to_kv_pool_allocator.page_size
    for req in scheduler.waiting_queue:
        if req.bootstrap_room is None or not faults.take(Fault.KV_PAGE_CORRUPT, int(req.bootstrap_room)):
            continue
        start = recorded_decode_prefix_len(req)
        slots = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:start + page]
        overwrite_with_noise(scheduler.token_to_kv_pool_allocator.get_kvcache(), slots.long(), int(req.bootstrap_room))


# ---- decode-local prefill --------------------------------------------------------------------------
def around_get_next_disagg_decode_batch_to_run(original, scheduler, running_batch):
    """Merge the local extend that ran into the running batch (as aggregated serving merges a prefill
    batch) once its result is in; then, if a local extend is due, run it inside this step's decode (one
    MIXED forward, as SGLang's --enable-mixed-chunk does in aggregated serving) or, when it cannot be
    mixed, alone; else SGLang's decode."""
    from sglang.srt.managers.schedule_batch import NextBatchPlan, ScheduleBatch

    local = current().local_prefill
    if not local.enabled:
        return original(scheduler, running_batch)
    running_batch = _join_local_extend(running_batch)
    batch = None if local.extend_in_flight() else _build_local_extend(scheduler, running_batch)
    if batch is None:
        local.on_decode_turn()
        return original(scheduler, running_batch)
    if not mixable(batch, [*running_batch.reqs, *scheduler.waiting_queue], running_batch.is_empty()):
        return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)
    plan = original(scheduler, running_batch)  # new prebuilt requests merged, finishing ones out, decode prepared
    decode = plan.batch_to_run
    if decode is None:  # nothing decodes this step: the extend runs alone
        return NextBatchPlan(batch_to_run=batch, running_batch=plan.running_batch)
    batch.mix_with_running(decode)
    batch.decoding_reqs = decode.reqs
    local.mixed_with(decode.reqs)
    return NextBatchPlan(batch_to_run=batch, running_batch=ScheduleBatch(reqs=[], batch_is_full=decode.batch_is_full))


def mixable(extend, decode_candidates, nothing_running: bool) -> bool:
    """Whether a local extend can run inside the next decode step (read-only): something decodes, and
    neither side uses what SGLang's mixed forward does not carry (logprobs, input embeddings, beams,
    speculative decoding). `decode_candidates`: the running requests and those about to join them."""
    return (not nothing_running and not extend.return_logprob and extend.input_embeds is None
            and extend.spec_algorithm.is_none()
            and not any(r.return_logprob or getattr(r, "beam_group", None) is not None for r in decode_candidates))


def _result_processed(batch) -> bool:
    """Every request of an extend SGLang ran has its first token, or finished: its result is in. (The
    normal loop processes it in the same iteration; the overlap loop in the next, before launching.)"""
    return all(req.output_ids or req.finished() for req in batch.reqs)


def _join_local_extend(running_batch):
    """The local extend whose result is in: finished requests drop out, the rest decode from now on."""
    state = current()
    if not state.local_prefill.extend_in_flight():
        return running_batch
    batch = state.local_prefill.extend_batch()
    if not _result_processed(batch):
        return running_batch
    state.local_prefill.join_extend()
    rids = [str(r.rid) for r in batch.reqs]
    batch.filter_batch()
    if not batch.is_empty():
        if running_batch.is_empty():
            running_batch = batch
        else:
            running_batch.merge_batch(batch)
    state.slo.on_admitted(rids, time.perf_counter())
    return running_batch


def _build_local_extend(scheduler, running_batch):
    """An EXTEND batch of the queued local requests due now (None if none), prepared for the forward;
    its allocation is the requests' preallocated pages (srt/hooks/scheduling/schedule_batch.py)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.observability.req_time_stats import set_schedule_time_batch, set_time_batch

    state = current()
    queued = state.local_prefill.queued_records()
    if not queued:
        return None
    num_running = running_batch.batch_size()
    max_reqs = state.slo.admission_for(num_running, sum(kv_len(r) for r in running_batch.reqs),
                                       [kv_len(r.req) for r in queued], extend_lens=[r.num_uncached for r in queued])
    reqs = state.local_prefill.plan_extend(time.monotonic(), num_running, max_reqs)
    if not reqs:
        return None
    try:
        batch = ScheduleBatch.init_new(reqs, scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator,
                                       scheduler.tree_cache, scheduler.model_config, scheduler.enable_overlap,
                                       scheduler.spec_algorithm)
        state.local_prefill.bind_extend(batch)
        batch.prepare_for_extend()
    except Exception as exc:  # never take the scheduler down: these requests fail, loudly, holding nothing
        state.hook_failed("local_extend", "building the local extend of %s failed", [str(r.rid) for r in reqs])
        state.local_prefill.fail(reqs)
        retire_local(scheduler, reqs, f"sglang_pd: decode-local prefill failed: {type(exc).__name__}: {exc}",
                     HTTPStatus.INTERNAL_SERVER_ERROR)
        return None
    set_time_batch(reqs, "set_forward_entry_time")
    set_schedule_time_batch(batch)
    return batch


def retire_local(scheduler, reqs, message: str, status) -> None:
    """Answer (streamed abort) and release local requests that never ran their extend."""
    from sglang.srt.disaggregation.utils import prepare_abort

    for req in reqs:
        prepare_abort(req, message, status_code=status)
        scheduler.output_streamer.stream_output([req], req.return_logprob)
        release_local(scheduler, req)


def release_local(scheduler, req) -> None:
    """Give back what a local request held before its extend: its row and suffix pages are freed and its
    prefix lock released (through the ledger); nothing is published (the suffix was never computed)."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome
    from sglang.srt.mem_cache.common import release_kv_cache

    scheduler.tree_cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    release_kv_cache(req, scheduler.tree_cache, checkpoint=False)
