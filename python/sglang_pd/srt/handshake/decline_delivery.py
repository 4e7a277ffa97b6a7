"""Both ends of a room decline on SGLang's KV objects (the notice and its wire frames: room_decline.py).

    decode:  send_decline(receiver, notice)  -> every prefill rank of the receiver's room (signed by
             the receiver's sockets when a secret is set)
    prefill: consume_decline(mgr, msg, ...)  -> RoomDeclineTable (fail the room now, or tombstone it)

SGLang's receiver and manager are read by attribute; KVPoll is imported where a room is failed.
"""

from __future__ import annotations

import logging

from sglang_pd.srt.wire import (DeclineError, DeclineNotice, RoomDeclineTable, decline_frames,
                                                  parse_decline)
from sglang_pd.srt.metrics import PDCounters

logger = logging.getLogger(__name__)


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


def fail_room_if_known(mgr, room: int, message: str) -> bool:
    """Fail `room` in prefill's manager if it exists and is not done (the bootstrap poll then answers)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    status = mgr.request_status.get(room)
    if status is None or status == KVPoll.Success:
        return False
    mgr.record_failure(room, message)
    mgr.update_status(room, KVPoll.Failed)
    return True


def consume_decline(mgr, msg: list[bytes], declines: RoomDeclineTable, counters: PDCounters) -> bool:
    """Prefill's bootstrap thread: True when `msg` was a decline (handed to `declines`: the room failed now,
    or a tombstone waits for it; a malformed one counted and dropped), False for any other message."""
    try:
        notice = parse_decline(msg)
    except DeclineError as exc:
        counters.add("prefill_declines_malformed_total")
        logger.error("sglang_pd: dropped a malformed room decline: %s", exc)
        return True
    if notice is None:
        return False
    declines.receive(notice, lambda room, message: fail_room_if_known(mgr, room, message))
    return True
