"""Hooks on SGLang's prefill side (disaggregation/prefill.py): check what decode asked for, carry out declines.

    PrefillBootstrapQueue.finalize_bootstrap   -> decode_prefix_len checked and recorded
    PrefillBootstrapQueue.add                  -> a room a decline already waits for fails at once
    ...PrefillMixin.handle_bootstrap_failure   -> a declined room is answered as decode asked (not a failure)
"""

from __future__ import annotations

import logging

from sglang_pd.srt.disaggregation.prefill_guard import validate_decode_prefix_len
from sglang_pd.srt.hooks.common_conn import fail_declined_room
from sglang_pd.srt.mem_cache.common import RequestKind, request_kind
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def around_finalize_bootstrap(original, queue, req):
    """Reject a transfer info sent for another prompt (prompt_binding.py) or a bad decode_prefix_len
    through SGLang's failure path, before any page is sent; else record the bootstrap and go on."""
    state = current()
    sender = req.disagg_kv_sender
    room = int(req.bootstrap_room)
    page_size = int(queue.scheduler.token_to_kv_pool_allocator.page_size)
    asked = sender.kv_mgr.req_to_decode_prefix_len.get(room, 0)
    digests = state.peer_guard.digests
    real = request_kind(req) is RequestKind.NORMAL  # health checks / warmup: fake transfer, no transfer info
    reason = digests.check(room, req.origin_input_ids, sender) if digests is not None and real else None
    if reason is not None:
        state.counters.add("prompt_digest_mismatches_total")
    else:
        reason = validate_decode_prefix_len(asked, len(req.origin_input_ids), page_size).reason
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
    _answer_declined(scheduler, req, notice.status, notice.message)
    state.prefill_log.record_decline(int(req.bootstrap_room), str(req.rid), notice.status, notice.message)
    return None


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
