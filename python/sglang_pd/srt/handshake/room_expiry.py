"""Bounded memory for rooms: transfer infos nobody claims expire, rejected rooms are remembered briefly.

Prefill keeps each decode transfer info in `transfer_infos[room]` until the room's request finishes.
A room that no local request ever claims (a peer named a room that does not exist here) would be
kept forever: three well-formed 32 MiB messages grew prefill by 96 MB. `UnclaimedRooms` tracks
every room that received a transfer info and, once it has been unclaimed for `ttl_s` (or the
unclaimed total passes `max_rooms` / `max_bytes`, oldest first), tells the caller to drop it.

`RoomTombstones` remembers rooms that failed, in two directions (one instance each):
- failed by a rejected message before their request existed here, so the request fails as soon as it
  appears instead of waiting for the bootstrap timeout (written by the rank socket's reader, taken by
  the scheduler);
- failed by their own prefill request (bootstrap timeout, abort, a failed transfer) and cleared, so a
  decode transfer info that arrives after that is refused and its decode told at once, instead of
  SGLang re-creating the room and decode holding its prefix lock and pages until the room expires as
  unclaimed (written by the scheduler at the sender's clear, read by the rank socket's reader).

`UnclaimedRooms` is used by one thread (the rank socket's reader) plus read-only snapshots; the
tombstones are shared by two threads, so they have a lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, NamedTuple


class _Seen(NamedTuple):
    first_seen: float
    num_bytes: int


class UnclaimedRooms:
    """Rooms with a transfer info and (maybe) no claiming request; oldest first."""

    def __init__(self, ttl_s: float, max_rooms: int = 4096, max_bytes: int = 64 << 20,
                 clock: Callable[[], float] = time.monotonic):
        if ttl_s <= 0 or max_rooms < 1 or max_bytes < 1:
            raise ValueError(f"ttl_s ({ttl_s}), max_rooms ({max_rooms}), max_bytes ({max_bytes}) must be > 0")
        self.ttl_s, self.max_rooms, self.max_bytes = float(ttl_s), max_rooms, max_bytes
        self._clock = clock
        self._rooms: OrderedDict[int, _Seen] = OrderedDict()
        self._num_bytes = 0
        self.num_expired = 0

    def note(self, room: int, num_bytes: int) -> None:
        """A transfer info of `num_bytes` arrived for `room` (mutates).

        A room's bytes add up over its transfer infos (one per decode rank, or a resend), and the
        total moves by exactly what the room's entry moves: invariant total == sum of entries."""
        seen = self._rooms.get(room)
        first = seen.first_seen if seen else self._clock()
        self._num_bytes += num_bytes
        self._rooms[room] = _Seen(first, (seen.num_bytes if seen else 0) + num_bytes)

    def sweep(self, is_claimed: Callable[[int], bool], drop: Callable[[int], bool]) -> list[int]:
        """Forget claimed rooms; `drop` unclaimed ones past the TTL or over the caps. Returns dropped rooms.

        `drop(room)` removes the room's held messages and returns True if anything was held."""
        now = self._clock()
        for room in [r for r in self._rooms if is_claimed(r)]:
            self._forget(room)
        dropped = []
        while self._rooms:
            room, seen = next(iter(self._rooms.items()))
            over = len(self._rooms) > self.max_rooms or self._num_bytes > self.max_bytes
            if not over and now - seen.first_seen < self.ttl_s:
                break
            self._forget(room)
            if drop(room):
                dropped.append(room)
        self.num_expired += len(dropped)
        return dropped

    def _forget(self, room: int) -> None:
        self._num_bytes -= self._rooms.pop(room).num_bytes

    def snapshot(self) -> dict:
        """Read-only view: tracked rooms, their bytes, rooms expired so far."""
        return {"num_tracked": len(self._rooms), "num_bytes": self._num_bytes, "num_expired": self.num_expired,
                "ttl_s": self.ttl_s}


class RoomTombstones:
    """room -> reason for rooms failed before their request existed; bounded, expiring."""

    def __init__(self, ttl_s: float, max_rooms: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_rooms, self._clock = float(ttl_s), max_rooms, clock
        self._rooms: OrderedDict[int, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def bury(self, room: int, reason: str) -> None:
        """Remember that `room` failed for `reason` (mutates; drops the oldest past max_rooms)."""
        with self._lock:
            self._rooms[room] = (self._clock(), reason)
            self._rooms.move_to_end(room)
            while len(self._rooms) > self.max_rooms:
                self._rooms.popitem(last=False)

    def reason(self, room: int) -> str | None:
        """The reason `room` failed, if remembered and not expired (read-only: every decode rank's transfer
        info for the room gets the same answer)."""
        with self._lock:
            entry = self._rooms.get(room)
        if entry is None or self._clock() - entry[0] > self.ttl_s:
            return None
        return entry[1]

    def discard(self, room: int) -> None:
        """Forget `room` (mutates): a new request claimed it, so a later message for it is that request's."""
        with self._lock:
            self._rooms.pop(room, None)

    def take(self, room: int) -> str | None:
        """The reason `room` failed, if remembered and not expired (forgets it)."""
        with self._lock:
            entry = self._rooms.pop(room, None)
        if entry is None or self._clock() - entry[0] > self.ttl_s:
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._rooms)
