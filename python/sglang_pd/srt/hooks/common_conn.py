"""Hooks on SGLang's common KV transfer classes (disaggregation/common/conn.py), and the bootstrap-message
guard the mooncake and NIXL managers (subclasses of CommonKVManager) share."""

from __future__ import annotations

import logging

from sglang_pd.srt.disaggregation.transfer_info_guard import FrameLayout, check_frames
from sglang_pd.srt.mem_cache.common import bytes_per_page
from sglang_pd.srt.state import current, mode_name

logger = logging.getLogger(__name__)


def after_prepare_send_indices(result, sender, kv_indices, state_indices=None):
    """Count the KV pages the sender really hands to its transport (after CP/shard filtering)."""
    page_indices, _index_slice, _is_last, should_skip = result
    if not should_skip:
        state = current()
        try:
            state.prefill_log.record_pages_sent(int(sender.bootstrap_room), len(page_indices),
                                                len(page_indices) * bytes_per_page(sender.kv_mgr.kv_args))
        except Exception:
            state.hook_failed("prepare_send_indices", "failed to count sent pages")
    return result


def guard_bootstrap_message(original, mgr, msg, layout: FrameLayout) -> bool:
    """Prefill: drop (and fail the room of) a malformed transfer-info message before upstream parses it.

    `original` is the manager's `_handle_abort_notification`, which upstream calls on every message of
    its bootstrap thread first. Returns True when the message was consumed (upstream skips it).
    """
    if original(mgr, msg):
        return True  # an abort notification, handled by SGLang
    if mode_name(mgr.disaggregation_mode) != "prefill":
        return False
    verdict = check_frames(msg, layout)
    if verdict.reason is None:
        return False
    reason = f"sglang_pd: rejected by prefill: {verdict.reason}"
    logger.error(reason)
    current().prefill_log.record_rejection(verdict.room, "", reason)
    if verdict.room is not None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        mgr.record_failure(verdict.room, reason)
        mgr.update_status(verdict.room, KVPoll.Failed)
    return True  # consumed: upstream's parser never sees it, its thread lives on
