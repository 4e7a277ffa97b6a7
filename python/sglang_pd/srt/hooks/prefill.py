"""Hook on SGLang's `PrefillBootstrapQueue` (disaggregation/prefill.py): check what decode asked for."""

from __future__ import annotations

import logging

from sglang_pd.srt.disaggregation.prefill_guard import validate_decode_prefix_len
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def around_finalize_bootstrap(original, queue, req):
    """Reject a bad decode_prefix_len through SGLang's failure path; else record it and go on."""
    state = current()
    sender = req.disagg_kv_sender
    room = int(req.bootstrap_room)
    page_size = int(queue.scheduler.token_to_kv_pool_allocator.page_size)
    asked = sender.kv_mgr.req_to_decode_prefix_len.get(room, 0)
    verdict = validate_decode_prefix_len(asked, len(req.origin_input_ids), page_size)
    if not verdict.ok:
        logger.error("%s (request %s, room %s)", verdict.reason, req.rid, room)
        state.prefill_log.record_rejection(room, str(req.rid), verdict.reason)
        # Reason recorded, room failed, decode told; the next poll aborts this request only.
        sender.kv_mgr.conclude_failure(bootstrap_room=room, failure_reason=verdict.reason)
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
