"""A prefill room's life around its local request (SGLang's sender): claimed when the sender is built,
its waiting decodes told when a failed request is cleared, its claim and prompt binding ended, and a
failure remembered for late transfer infos.

    sender built  -> claim(room): claimed; an old held tell dropped; no longer "failed here"; a tombstone
                     (a rejected message failed the room before its request existed) -> fail it now
    sender clear  -> decodes_waiting(room, ...) before SGLang pops the room, then, after the clear,
                     tell_failure(...) (once no write into their pages can still land: ManagerHost) and
                     end_claim(...) (unclaimed, unbound from its prompt; a failure buried in failed_rooms)

Called by the sender hooks in srt/hooks/connection/common_conn.py with plain values (room, failed, why); the
collaborators are those the KV-manager hook installed (any may be None: that part is skipped).
Scheduler thread; each collaborator has its own lock where the rank socket's reader shares it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sglang_pd.srt.handshake.manager_host import ManagerHost, registered_targets
from sglang_pd.srt.wire import PromptDigests
from sglang_pd.srt.handshake.room_expiry import RoomTombstones

NO_REASON = "failed (no reason recorded)"


@dataclass(frozen=True)
class PrefillRooms:
    """The room-side bookkeeping of prefill's senders (see the module docstring)."""

    host: ManagerHost | None
    tombstones: RoomTombstones | None      # rooms a rejected message failed before their request
    failed_rooms: RoomTombstones | None    # rooms their own request failed (late transfer infos refused)
    digests: PromptDigests | None
    declining: set[int]                    # rooms being answered as decode declined them (never told)
    on_count: Callable[[str, int], None] = lambda name, n: None

    def claim(self, room: int) -> str | None:
        """A local request's sender now exists for `room` (mutates). Returns the reason to fail it at once
        (a tombstone left by a rejected message), else None."""
        if self.host is not None:
            self.host.claimed.add(room)
            if self.host.forget_held_tell(room):  # the old request's decode is left to its timeout
                self.on_count("prefill_failure_tells_dropped_total", 1)
        if self.failed_rooms is not None:  # a new request on the room: later transfer infos are for it
            self.failed_rooms.discard(room)
        return self.tombstones.take(room) if self.tombstones is not None else None

    def decodes_waiting(self, room: int, transfer_infos: Callable[[], dict | None]) -> list[tuple[str, int]]:
        """Registered decode endpoints whose transfer info for `room` SGLang holds (`transfer_infos()`: the
        room's entry, read only when needed, before the clear pops it); empty for a room decode declined
        (it asked for the failure) or without a host (read-only)."""
        if self.host is None or room in self.declining:
            return []
        return registered_targets(dict(transfer_infos() or {}), self.host.registered_peer)

    def tell_failure(self, room: int, targets: list[tuple[str, int]], failed: bool, why: str | None) -> None:
        """After the clear: tell `targets` (minus those SGLang's worker told already) that the request failed,
        when it did; held by the host while a write into their pages may still land (counted when sent)."""
        if self.host is None:
            return
        targets = self.host.not_yet_told_failed(room, targets)  # e.g. a failed transfer: SGLang's worker told them
        if not targets or not failed:
            return
        reason = f"prefill's request failed: {why or NO_REASON}"
        if self.host.tell_failed(room, targets, reason, counter="prefill_failures_told_total"):
            self.host.forget_told(room)  # sent after the room's clear: nothing later would forget the note of it
            self.on_count("prefill_failures_told_total", 1)

    def end_claim(self, room: int, owner: object, failed: bool, why: str | None) -> None:
        """After the clear: SGLang popped the room (a transfer info arriving now is nobody's: TTL expiry);
        `owner`'s prompt binding ends; a failed request's room is remembered with `why` (mutates)."""
        if self.host is not None:
            self.host.claimed.discard(room)
        if self.digests is not None:
            self.digests.unbind(room, owner)
        if self.failed_rooms is not None and failed:
            self.failed_rooms.bury(room, why or NO_REASON)
