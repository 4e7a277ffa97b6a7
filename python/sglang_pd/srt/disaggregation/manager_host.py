"""SGLang's KV manager as the `HandshakeGate`'s host: reads and fails rooms through SGLang's own methods.

Holds no patching: the hook layer (srt/hooks/common_conn.py) builds one per guarded manager and hands it
to the gate. Methods run on the rank socket's reading thread, `claimed` is also added to and removed
from on the scheduler thread (set add / discard are atomic under the GIL; `prune` copies before iterating).
"""

from __future__ import annotations

from sglang_pd.srt.disaggregation.handshake_frames import FrameLimits, Side
from sglang_pd.srt.disaggregation.handshake_gate import PeerRecord, registered_endpoint


class ManagerHost:
    """SGLang's KV manager as the gate's `GateHost` (reads and fails rooms through SGLang's own methods).

    A prefill room is *claimed* while a local request's sender exists for it (added by the sender hook,
    removed by the sender-clear hook, pruned once SGLang clears the room); SGLang itself creates a room's
    status entry as soon as a transfer info names it, so its status table alone cannot tell a waiting
    request from a foreign room, nor from a room whose request ended and a late transfer info re-created
    (hence the removal at clear: prune alone would keep that claim)."""

    def __init__(self, mgr, limits: FrameLimits):
        self.mgr, self.limits = mgr, limits
        self.claimed: set[int] = set()

    def registered_peer(self, name: str) -> PeerRecord | None:
        """What peer `name` registered (endpoint, port, NIXL pool size), or None (read-only)."""
        info = getattr(self.mgr, "decode_kv_args_table", {}).get(name)
        if info is None:
            return None
        slots = getattr(info, "dst_num_slots", None) if self.limits.backend == "nixl" else None
        return PeerRecord(str(info.endpoint), int(info.dst_port), int(slots) if slots else None)

    def num_registered(self) -> int:
        """Peers registered with this manager (read-only)."""
        return len(getattr(self.mgr, "decode_kv_args_table", {}))

    def room_claimed(self, room: int) -> bool:
        """Decode: a request waits on `room`. Prefill: a local request's sender exists for it (read-only)."""
        if self.limits.side is Side.DECODE:
            return room in self.mgr.request_status
        return room in self.claimed and room in self.mgr.request_status

    def fail_room(self, room: int, reason: str, notify) -> bool:
        """Fail `room` through SGLang if claimed; tell `notify` (decode's endpoint) if given. True if failed here."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        claimed = self.room_claimed(room)
        if claimed:
            self.mgr.record_failure(room, reason)
            self.mgr.update_status(room, KVPoll.Failed)
        if notify is not None:
            self.mgr.send_kv_status_message(targets=[notify], bootstrap_room=room, status=KVPoll.Failed,
                                            failure_reason=reason)
        return claimed

    def drop_unclaimed(self, room: int, reason: str) -> bool:
        """Forget what an unclaimed room left in SGLang's tables (not if claimed) and tell each decode that
        sent a transfer info for it, if that decode registered with this manager, that the room failed
        for `reason`: its request stops holding pages and a prefix lock until its own waiting timeout.
        True if a transfer info was held."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        if self.room_claimed(room):
            return False
        self.mgr.req_to_decode_prefix_len.pop(room, None)
        infos = self.mgr.transfer_infos.pop(room, None)
        self.mgr.request_status.pop(room, None)  # created by SGLang for the foreign room; no request uses it
        targets = registered_targets(infos or {}, self.registered_peer)
        if targets:
            self.mgr.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed,
                                            failure_reason=reason)
        return infos is not None

    def prune(self) -> None:
        """Forget claims of rooms SGLang has cleared (their requests ended)."""
        for room in [r for r in list(self.claimed) if r not in self.mgr.request_status]:
            self.claimed.discard(room)

    def rooms_view(self) -> dict:
        """Rooms by upstream status (KVPoll value) and, for prefill, held transfer infos / peers."""
        statuses = list(self.mgr.request_status.items())
        by_status: dict[int, list[int]] = {}
        for room, status in statuses:
            by_status.setdefault(int(status), []).append(int(room))
        view = {"by_status": {str(s): sorted(r)[:64] for s, r in by_status.items()}, "num_rooms": len(statuses)}
        if self.limits.side is Side.PREFILL:
            view["transfer_info_rooms"] = sorted(int(r) for r in list(self.mgr.transfer_infos))[:64]
            view["registered_peers"] = sorted(list(self.mgr.decode_kv_args_table))[:64]
        return view


def registered_targets(infos: dict, registered_peer) -> list[tuple[str, int]]:
    """The (endpoint, port) of each transfer info in `infos` (peer name -> SGLang TransferInfo) whose peer
    registered exactly that endpoint: a message cannot make prefill write to an address of its choosing."""
    targets = []
    for name, info in infos.items():
        target = (str(info.endpoint), int(info.dst_port))
        if registered_endpoint(registered_peer, str(name), target) and target not in targets:
            targets.append(target)
    return targets
