"""Thin hooks on SGLang's prefill side; the logic lives in PrefillTransferLog."""

from __future__ import annotations

from sglang_pd.process_state import STATE


def around_finalize_bootstrap(original, queue, req):
    """Record the decode_prefix_len that reached prefill for this room, then defer to SGLang."""
    finished = original(queue, req)
    if finished:
        STATE.prefill_log.record_bootstrap(
            room=int(req.bootstrap_room),
            rid=str(req.rid),
            prompt_len=len(req.origin_input_ids),
            page_size=int(queue.scheduler.token_to_kv_pool_allocator.page_size),
            decode_prefix_len=int(req.disagg_decode_prefix_len),
        )
    return finished


def after_prepare_send_indices(result, sender, kv_indices, state_indices=None):
    """Count the KV pages the sender really hands to its transport (after CP/shard filtering)."""
    page_indices, _index_slice, _is_last, should_skip = result
    if not should_skip:
        STATE.prefill_log.record_pages_sent(int(sender.bootstrap_room), len(page_indices))
    return result
