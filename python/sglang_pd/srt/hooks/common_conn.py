"""Hooks on SGLang's common KV transfer classes (disaggregation/common/conn.py), the bootstrap-message
guard the mooncake and NIXL managers (subclasses of CommonKVManager) share, and the room decline
both ends of it (srt/disaggregation/room_decline.py):

    decode:  send_decline(receiver, notice)       -> every prefill rank of the receiver's room
    prefill: guard_bootstrap_message consumes it  -> RoomDeclineTable (fail the room now, or tombstone)
"""

from __future__ import annotations

import logging

from sglang_pd.srt.disaggregation.room_decline import DeclineError, DeclineNotice, decline_frames, parse_decline
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
    """Prefill: consume a room decline; drop (and fail the room of) a malformed transfer-info message
    before upstream parses it.

    `original` is the manager's `_handle_abort_notification`, which upstream calls on every message of
    its bootstrap thread first. Returns True when the message was consumed (upstream skips it).
    """
    if mode_name(mgr.disaggregation_mode) == "prefill" and _consume_decline(mgr, msg):
        return True
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


# ---- room decline ----------------------------------------------------------------------------------
def send_decline(receiver, notice: DeclineNotice) -> int:
    """Decode: tell every prefill rank of `receiver`'s room to drop it and answer with `notice`.

    The receiver must be initialised (its prefill ranks resolved). Marks it abort-notified, so its
    cleanup sends no second (upstream) ABORT. Returns the ranks told; raises RuntimeError when there
    is no rank to tell, zmq errors when a send fails (nothing is marked then).
    """
    infos = getattr(receiver, "bootstrap_infos", None)
    if not infos:
        raise RuntimeError(f"room {notice.room}: no prefill rank resolved to decline to")
    frames = decline_frames(notice, receiver.kv_mgr.local_ip, receiver.kv_mgr.rank_port)
    for info in infos:
        sock, lock = receiver._connect_to_bootstrap_server(info)
        with lock:
            sock.send_multipart(frames)
    receiver.abort_notified = True
    return len(infos)


def _fail_room_if_known(mgr, room: int, message: str) -> bool:
    """Fail `room` in prefill's manager if it exists and is not done (the bootstrap poll then answers)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    status = mgr.request_status.get(room)
    if status is None or status == KVPoll.Success:
        return False
    mgr.record_failure(room, message)
    mgr.update_status(room, KVPoll.Failed)
    return True


def _consume_decline(mgr, msg) -> bool:
    """Prefill's bootstrap thread: True when `msg` was a decline (handled here, never parsed upstream)."""
    state = current()
    try:
        notice = parse_decline(msg)
    except DeclineError as exc:
        state.counters.add("prefill_declines_malformed_total")
        logger.error("sglang_pd: dropped a malformed room decline: %s", exc)
        return True
    if notice is None:
        return False
    state.room_declines.receive(notice, lambda room, message: _fail_room_if_known(mgr, room, message))
    return True


def fail_declined_room(mgr, room: int) -> bool:
    """Prefill's scheduler: `room` was just created; fail it at once if a decline already waits for it."""
    return current().room_declines.on_room_created(room, lambda r, message: _fail_room_if_known(mgr, r, message))
