"""Hooks on SGLang's prefill side (disaggregation/prefill.py): check what decode asked for, carry out declines.

    PrefillBootstrapQueue.finalize_bootstrap   -> decode_prefix_len checked and recorded
    PrefillBootstrapQueue.add                  -> a room a decline already waits for fails at once
    ...PrefillMixin.handle_bootstrap_failure   -> a declined room is answered as decode asked (not a failure)
    ...PrefillMixin.release_aborted_prefill_waiting_req -> the aborted request's sender is cleared (decode told)
    ...PrefillMixin.get_next_disagg_prefill_batch_to_run -> tests only: a room held in the waiting queue
"""

from __future__ import annotations

import logging
import time

from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.hooks.connection.common_conn import fail_declined_room
from sglang_pd.srt.mem_cache import RequestKind, request_kind
from sglang_pd.srt.mem_cache import check_for_prompt
from sglang_pd.srt.state import current
from sglang_pd.srt.wire import kv_digest
from sglang_pd.srt.wire.kv_digest import pool_layers

logger = logging.getLogger(__name__)


def around_finalize_bootstrap(original, queue, req):
    """Reject a transfer info sent for another prompt (prompt_binding.py) or a decode_prefix_len that breaks
    prefix_len.check_for_prompt through SGLang's failure path, before any page is sent; else record the
    bootstrap and go on."""
    state = current()
    sender = req.disagg_kv_sender
    room = int(req.bootstrap_room)
    if _held_by_fault(state, queue, req, room):
        return False  # SGLang's own "not yet": the request stays in the bootstrap queue, bootstrapped
    page_size = int(queue.scheduler.token_to_kv_pool_allocator.page_size)
    decode_prefix_len = sender.kv_mgr.req_to_decode_prefix_len.get(room, 0)
    digests = state.peer_guard.digests
    real = request_kind(req) is RequestKind.NORMAL  # health checks / warmup: fake transfer, no transfer info
    reason = digests.check(room, req.origin_input_ids, sender) if digests is not None and real else None
    if reason is not None:
        state.counters.add("prompt_digest_mismatches_total")
    else:
        try:
            check_for_prompt(decode_prefix_len, len(req.origin_input_ids), page_size)
        except ValueError as exc:  # only a broken or hostile decode sends it: this request fails, no other
            reason = f"sglang_pd: rejected by prefill: {exc}"
    if reason is not None:
        logger.error("%s (request %s, room %s)", reason, req.rid, room)
        state.prefill_log.record_rejection(room, str(req.rid), reason)
        # Reason recorded, room failed, decode told; the next poll aborts this request only.
        sender.kv_mgr.conclude_failure(bootstrap_room=room, failure_reason=reason)
        return False
    finished = original(queue, req)
    if finished:
        try:
            state.prefill_log.record_bootstrap(room=room, rid=str(req.rid), prompt_len=len(req.origin_input_ids),
                                               page_size=page_size,
                                               decode_prefix_len=int(req.disagg_decode_prefix_len))
        except Exception:
            state.hook_failed("finalize_bootstrap", "failed to record a prefill bootstrap")
    return finished


_FAULT_HOLD_S = 10.0  # Fault.PREFILL_BOOTSTRAP_HOLD / PREFILL_WAITING_HOLD: how long a targeted room waits, bootstrapped


def _held_by_fault(state, queue, req, room: int) -> bool:
    """Test-only: a room targeted by PREFILL_BOOTSTRAP_HOLD stays in the bootstrap queue with decode's
    transfer info held, uncomputed, for _FAULT_HOLD_S (not a request already in the waiting queue)."""
    faults = state.faults
    if not faults.enabled:
        return False
    return faults.holding(Fault.PREFILL_BOOTSTRAP_HOLD, room, _FAULT_HOLD_S,
                          may_start=any(queued is req for queued in queue.queue))


def around_next_prefill_batch(original, scheduler, running_batch, last_batch, should_retry_storage_prefetch=True):
    """Test-only (SGLANG_PD_ENABLE_FAULT_INJECTION): a request whose room PREFILL_WAITING_HOLD targets stays in
    prefill's waiting queue, bootstrapped and uncomputed, for _FAULT_HOLD_S: SGLang picks the batch while it
    is out of the queue, and it goes back in front after (an abort still finds it there)."""
    state = current()
    held = _waiting_held_by_fault(state, scheduler.waiting_queue) if state.faults.enabled else []
    if not held:
        return original(scheduler, running_batch, last_batch, should_retry_storage_prefetch)
    for req in held:
        scheduler.waiting_queue.remove(req)
    try:
        return original(scheduler, running_batch, last_batch, should_retry_storage_prefetch)
    finally:
        scheduler.waiting_queue[0:0] = held


def _waiting_held_by_fault(state, waiting_queue) -> list:
    """The waiting requests PREFILL_WAITING_HOLD keeps out of the next batch (armed per room, once)."""
    return [req for req in list(waiting_queue) if getattr(req, "bootstrap_room", None) is not None
            and state.faults.holding(Fault.PREFILL_WAITING_HOLD, int(req.bootstrap_room), _FAULT_HOLD_S)]


def after_add(result, queue, req, num_kv_heads):
    """The request's room now exists on prefill: if decode already declined it (the decline won the race
    against this half), fail the room now so this loop's bootstrap poll answers it."""
    state = current()
    sender = getattr(req, "disagg_kv_sender", None)
    if sender is None or req.bootstrap_room is None:
        return result  # refused at intake (no room was created)
    try:
        state.room_declines.expire()
        fail_declined_room(sender.kv_mgr, int(req.bootstrap_room))
    except Exception:
        state.hook_failed("prefill_add", "checking room %s for a decline failed", req.bootstrap_room)
    return result


def around_handle_bootstrap_failure(original, scheduler, req):
    """A room decode declined is answered with the decline's status and message, without the failure
    log and metric (it is no failure); any other failure goes to SGLang."""
    state = current()
    notice = state.room_declines.take(int(req.bootstrap_room)) if req.bootstrap_room is not None else None
    if notice is None:
        return original(scheduler, req)
    declining = state.peer_guard.declining  # the clear inside does not tell decode: it asked for this
    declining.add(int(req.bootstrap_room))
    try:
        _answer_declined(scheduler, req, notice.status, notice.message)
    finally:
        declining.discard(int(req.bootstrap_room))
    state.prefill_log.record_decline(int(req.bootstrap_room), str(req.rid), notice.status, notice.message)
    return None


def after_release_aborted_waiting_req(result, scheduler, req):
    """An abort of a bootstrapped request still in prefill's waiting queue: SGLang marks its room Failed
    and drops the request without clearing its sender, so decode (whose transfer info is held here) was
    never told and the room's tables stayed. Clear it now, as SGLang's failure path does: the clear hook
    tells decode with the reason and remembers the failed room; the failure record goes with it."""
    sender = getattr(req, "disagg_kv_sender", None)
    if sender is None or req.bootstrap_room is None:
        return result
    try:
        sender.clear()
        with sender.kv_mgr.failure_lock:
            sender.kv_mgr.failure_records.pop(int(req.bootstrap_room), None)
        current().counters.add("prefill_waiting_aborts_cleared_total")
    except Exception:
        current().hook_failed("release_aborted_waiting_req", "clearing aborted room %s failed", req.bootstrap_room)
    return result


def _answer_declined(scheduler, req, status: int | None, message: str) -> None:
    """Retire a declined prefill request: free what it holds (sender, metadata slot, any KV) and answer
    its half (status None: HTTP 200, finish_reason abort with `message`)."""
    from sglang.srt.disaggregation.common.conn import KVTransferError
    from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome
    from sglang.srt.mem_cache.common import release_kv_cache

    scheduler.clear_pending_chunk_send(req)
    try:
        req.disagg_kv_sender.failure_exception()  # clears the sender and its failure record, then raises
    except KVTransferError:
        pass
    if req.kv.holds_kv or req.kv.holds_mamba:
        release_kv_cache(req, scheduler.tree_cache, checkpoint=False)
    maybe_release_metadata_buffer(req, scheduler.req_to_metadata_buffer_idx_allocator)
    req.pending_bootstrap = False
    prepare_abort(req, message, status_code=status)
    scheduler.output_streamer.stream_output([req], req.return_logprob)
    scheduler.tree_cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)


def before_send_kv_chunk(scheduler, req, last_chunk=False, end_idx=None):
    """SGLANG_PD_KV_DIGEST on: at a room's last chunk, digest the KV rows prefill sends (past the
    decode_prefix_len decode holds) for the room's Success status (wire/kv_digest.py). A digest that cannot
    be computed is counted; decode then fails the request for a missing digest (never served unchecked)."""
    state = current()
    if (not state.peer_guard.kv_digest or not last_chunk or req.bootstrap_room is None
            or request_kind(req) is not RequestKind.NORMAL):
        return None
    try:
        end = end_idx if end_idx is not None else min(req.extend_end, len(req.origin_input_ids))
        start = int(req.disagg_decode_prefix_len or 0)
        began = time.perf_counter()
        slots = scheduler.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end].long()
        digest = kv_digest(pool_layers(scheduler.token_to_kv_pool_allocator.get_kvcache()), slots)
        state.counters.add("kv_digest_seconds_total", time.perf_counter() - began)
        state.peer_guard.sent_kv.put(int(req.bootstrap_room), digest)
    except Exception:
        state.hook_failed("send_kv_chunk", "KV digest of room %s not computed", req.bootstrap_room)
    return None
