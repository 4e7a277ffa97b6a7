"""Thin hooks on SGLang's prefill side: validate what decode sent and asked for, record what was sent."""

from __future__ import annotations

import logging

from sglang_pd.process_state import STATE
from sglang_pd.srt.disaggregation.prefill_guard import validate_decode_prefix_len
from sglang_pd.srt.mem_cache.common import bytes_per_page

logger = logging.getLogger(__name__)


def around_finalize_bootstrap(original, queue, req):
    """Reject a bad decode_prefix_len through SGLang's failure path; else record it and go on."""
    sender = req.disagg_kv_sender
    room = int(req.bootstrap_room)
    page_size = int(queue.scheduler.token_to_kv_pool_allocator.page_size)
    asked = sender.kv_mgr.req_to_decode_prefix_len.get(room, 0)
    verdict = validate_decode_prefix_len(asked, len(req.origin_input_ids), page_size)
    if not verdict.ok:
        logger.error("%s (request %s, room %s)", verdict.reason, req.rid, room)
        STATE.prefill_log.record_rejection(room, str(req.rid), verdict.reason)
        STATE.counters.add("prefill_rejected_requests_total", 1)
        # Reason recorded, room failed, decode told; the next poll aborts this request only.
        sender.kv_mgr.conclude_failure(bootstrap_room=room, failure_reason=verdict.reason)
        return False
    finished = original(queue, req)
    if finished:
        try:
            STATE.prefill_log.record_bootstrap(room=room, rid=str(req.rid), prompt_len=len(req.origin_input_ids),
                                               page_size=page_size,
                                               decode_prefix_len=int(req.disagg_decode_prefix_len))
        except Exception:
            STATE.count_hook_error("finalize_bootstrap")
            logger.exception("sglang_pd: failed to record a prefill bootstrap")
    return finished


def after_prepare_send_indices(result, sender, kv_indices, state_indices=None):
    """Count the KV pages the sender really hands to its transport (after CP/shard filtering)."""
    page_indices, _index_slice, _is_last, should_skip = result
    if not should_skip:
        try:
            STATE.prefill_log.record_pages_sent(int(sender.bootstrap_room), len(page_indices))
            STATE.counters.add("kv_pages_transferred_total", len(page_indices))
            STATE.counters.add("kv_bytes_transferred_total",
                               len(page_indices) * bytes_per_page(sender.kv_mgr.kv_args))
        except Exception:
            STATE.count_hook_error("prepare_send_indices")
            logger.exception("sglang_pd: failed to count sent pages")
    return result
