"""SGLang's KV manager as the `HandshakeGate`'s host: reads and fails rooms through SGLang's own methods.

Holds no patching: the hook layer (srt/hooks/connection/common_conn.py) builds one per guarded manager and hands it
to the gate. Methods run on the rank socket's reading thread, `claimed` is also added to and removed
from on the scheduler thread (set add / discard are atomic under the GIL; `prune` copies before iterating).

A decode is never told that a room failed while a write into its pages may still land: it would free
the pages, another request would get them, and the late write would overwrite that request's KV.
`tell_failed` asks upstream's own predicate first (`_staging_outstanding[room] > 0`: a transfer worker
has taken one of the room's chunks and its writes have not settled; the count upstream's deferred abort
ACK waits on) and holds the message until the count drains (`send_drained_tells`, on the reading
thread's housekeeping); a room whose writes never settle is never told (dropped after `held_ttl_s`,
counted: decode's own waiting timeout ends it, as upstream would).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.handshake.gate_host import PeerRecord, PeerRemoval, registered_endpoint
from sglang_pd.srt.wire import state_slots


@dataclass
class HeldTell:
    """A Failed status for decode endpoints, waiting for the room's in-flight writes to settle."""

    targets: list[tuple[str, int]]
    reason: str
    since: float
    counter: str | None  # counted under this name when sent (None: the caller counted the failure already)


class ManagerHost:
    """SGLang's KV manager as the gate's `GateHost` (reads and fails rooms through SGLang's own methods).

    A prefill room is *claimed* while a local request's sender exists for it (added by the sender hook,
    removed by the sender-clear hook, pruned once SGLang clears the room); SGLang itself creates a room's
    status entry as soon as a transfer info names it, so its status table alone cannot tell a waiting
    request from a foreign room, nor from a room whose request ended and a late transfer info re-created
    (hence the removal at clear: prune alone would keep that claim)."""

    def __init__(self, mgr, limits: FrameLimits, held_ttl_s: float = 120.0, max_held: int = 4096,
                 clock: Callable[[], float] = time.monotonic,
                 on_count: Callable[[str, int], None] = lambda name, n: None):
        self.mgr, self.limits = mgr, limits
        self.claimed: set[int] = set()
        self.held_tells: dict[int, HeldTell] = {}  # room -> tell (scheduler thread adds, reading thread sends)
        # room -> decode endpoints any thread of this manager already sent a Failed status (SGLang's workers
        # tell decode of a failed transfer themselves): our tell at the clear skips them
        self.told_failed: OrderedDict[int, set[tuple[str, int]]] = OrderedDict()
        self.held_ttl_s, self.max_held, self._clock, self._on_count = held_ttl_s, max_held, clock, on_count
        self._held_lock = threading.Lock()

    def transfer_in_flight(self, room: int) -> bool:
        """Whether a transfer worker holds one of `room`'s chunks whose writes have not settled (upstream's
        count, kept whether or not staging is on; read-only)."""
        return self.mgr._staging_outstanding.get(room, 0) > 0

    def note_failed_sent(self, room: int, targets) -> None:
        """A Failed status for `room` went to `targets` (any sender in this manager); kept until the room's
        clear (`not_yet_told_failed` pops it), at most `max_held` rooms (the oldest forgotten first)."""
        with self._held_lock:
            self.told_failed.setdefault(room, set()).update((str(e), int(p)) for e, p in targets)
            self.told_failed.move_to_end(room)
            while len(self.told_failed) > self.max_held:
                self.told_failed.popitem(last=False)

    def not_yet_told_failed(self, room: int, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """`targets` minus those already sent a Failed status for `room`; forgets the room's record (called
        once, at its clear)."""
        with self._held_lock:
            told = self.told_failed.pop(room, set())
        return [t for t in targets if t not in told]

    def forget_told(self, room: int) -> None:
        """Forget what was sent `room` (no clear will come for it any more to pop the note)."""
        with self._held_lock:
            self.told_failed.pop(room, None)

    def tell_failed(self, room: int, targets: list[tuple[str, int]], reason: str, counter: str | None = None) -> bool:
        """Send decode `targets` a Failed status for `room` now (True), or hold it while a write into their
        pages may still land (False, counted as held; sent by `send_drained_tells` once none can, then
        counted under `counter`)."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        with self._held_lock:
            if self.transfer_in_flight(room):
                if len(self.held_tells) >= self.max_held and room not in self.held_tells:
                    self.held_tells.pop(next(iter(self.held_tells)))  # the oldest: its decode times out
                    self._on_count("prefill_failure_tells_dropped_total", 1)
                self.held_tells[room] = HeldTell(list(targets), reason, self._clock(), counter)
                self._on_count("prefill_failure_tells_held_total", 1)
                return False
        self.mgr.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed,
                                        failure_reason=reason)
        return True

    def send_drained_tells(self) -> tuple[list[int], list[int]]:
        """Send every held tell whose room's writes settled (each counted under its `counter`), except to a
        decode SGLang's worker told meanwhile; drop those held past `held_ttl_s`. Returns (rooms told,
        rooms dropped)."""
        from sglang.srt.disaggregation.base.conn import KVPoll

        drained, dropped, now = [], [], self._clock()
        with self._held_lock:
            for room, tell in list(self.held_tells.items()):
                if not self.transfer_in_flight(room):
                    self.held_tells.pop(room)
                    # the worker that held the room may have told decode itself while settling (a failed
                    # transfer's own status, noted after the clear): not twice
                    already = self.told_failed.pop(room, set())
                    targets = [t for t in tell.targets if t not in already]
                    if targets:
                        drained.append((room, targets, tell))
                elif now - tell.since > self.held_ttl_s:
                    self.held_tells.pop(room)
                    dropped.append(room)
        for room, targets, tell in drained:
            self.mgr.send_kv_status_message(targets=targets, bootstrap_room=room, status=KVPoll.Failed,
                                            failure_reason=tell.reason)
            if room not in self.claimed:  # its clear came before: nothing else will forget this send
                self.forget_told(room)
            # else (the gate failed a room whose request still runs): the note stays for the room's clear,
            # which then skips the decode told here
            if tell.counter is not None:
                self._on_count(tell.counter, 1)
        return [room for room, _, _ in drained], dropped

    def forget_held_tell(self, room: int) -> bool:
        """A new request on `room`: its chunks would count in the same predicate, so the old tell is
        dropped (its decode times out, as upstream's would). True if one was held."""
        with self._held_lock:
            return self.held_tells.pop(room, None) is not None

    def registered_peer(self, name: str) -> PeerRecord | None:
        """What peer `name` registered (endpoint, port; NIXL: its page count and, when it sent its state
        buffers' lengths, each state pool's slots), or None (read-only)."""
        info = getattr(self.mgr, "decode_kv_args_table", {}).get(name)
        if info is None:
            return None
        if self.limits.backend != "nixl":
            return PeerRecord(str(info.endpoint), int(info.dst_port))
        slots = getattr(info, "dst_num_slots", None)
        state_lens = getattr(info, "dst_state_data_lens", None)  # empty: a decode that predates the frame
        state = state_slots(state_lens, info.dst_state_item_lens) if state_lens else None
        return PeerRecord(str(info.endpoint), int(info.dst_port), int(slots) if slots else None, state)

    def endpoint_registered(self, target: tuple[str, int]) -> bool:
        """Whether some registered peer registered exactly `target` (endpoint, port) (read-only)."""
        infos = list(getattr(self.mgr, "decode_kv_args_table", {}).values())
        return any((str(info.endpoint), int(info.dst_port)) == tuple(target) for info in infos)

    def forget_peer(self, name: str) -> PeerRemoval:
        """Remove peer `name`'s registration unless a room's transfer info names it (mutates; reading thread,
        which is where SGLang adds registrations). NIXL: also the state SGLang keeps per remote agent, as
        its own reload of an invalidated peer drops it, and the agent's metadata."""
        mgr = self.mgr
        if name not in mgr.decode_kv_args_table:
            return PeerRemoval.UNKNOWN
        if any(name in (infos or {}) for infos in list(mgr.transfer_infos.values())):
            return PeerRemoval.IN_USE
        mgr.decode_kv_args_table.pop(name, None)
        for table in _PER_PEER_TABLES[self.limits.backend]:
            getattr(mgr, table, {}).pop(name, None)
        if self.limits.backend == "nixl":
            mgr.agent.remove_remote_agent(name)
        return PeerRemoval.FORGOTTEN

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
        if notify is not None and self.limits.side is Side.PREFILL:  # a transfer may be writing to it
            self.tell_failed(room, [notify], reason)
        elif notify is not None:
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
        self.forget_told(room)  # no request's clear will come for this room to forget what was sent
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


# What SGLang 0.5.23's managers keep per registered peer besides decode_kv_args_table (NIXL: the entries its
# own reload of an invalidated agent drops, and the state-layout verdict)
_PER_PEER_TABLES = {
    "mooncake": ("state_layout_rejections",),
    "nixl": ("prep_handles", "prep_handles_slice_dst", "_prepared_state_plans", "_state_layout_rejections",
             "_peer_reload_times"),
}


def registered_targets(infos: dict, registered_peer) -> list[tuple[str, int]]:
    """The (endpoint, port) of each transfer info in `infos` (peer name -> SGLang TransferInfo) whose peer
    registered exactly that endpoint: a message cannot make prefill write to an address of its choosing."""
    targets = []
    for name, info in infos.items():
        target = (str(info.endpoint), int(info.dst_port))
        if registered_endpoint(registered_peer, str(name), target) and target not in targets:
            targets.append(target)
    return targets
