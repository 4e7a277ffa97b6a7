"""What the prefill side was told and what it sent, per bootstrap room.

This is the ground truth for "how much did decode reuse": decode's own `cached_tokens` is copied
from prefill, so tests and the demo read the decode_prefix_len that actually reached prefill, and
the number of KV pages prefill handed to its transport for that room.

Lives in the prefill scheduler process; not thread-safe by design (the scheduler loop is the only
writer; snapshots are taken from the same loop via get_internal_state).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

from sglang_pd.srt.mem_cache.common import kv_to_page_num


@dataclass
class RoomTransfer:
    """One request's transfer as seen by prefill."""

    room: int
    rid: str
    prompt_len: int
    page_size: int
    decode_prefix_len: int
    num_pages_planned: int
    num_pages_sent: int = 0
    num_pages_nixl: int = 0  # pages NIXL itself was asked to move (nixl backend only)
    num_bytes_nixl: int = 0


class PrefillTransferLog:
    """Bounded record of recent rooms (oldest dropped first) plus running totals.

    Mutating methods: `record_bootstrap`, `record_rejection`, `record_pages_sent`. Read-only: `get`, `snapshot`.
    """

    def __init__(self, max_rooms: int = 4096):
        if max_rooms < 1:
            raise ValueError(f"max_rooms must be >= 1, got {max_rooms}")
        self.max_rooms = max_rooms
        self._rooms: OrderedDict[int, RoomTransfer] = OrderedDict()
        self.num_requests = 0
        self.num_prompt_tokens = 0
        self.num_decode_prefix_tokens = 0
        self.num_pages_planned = 0
        self.num_pages_sent = 0
        self.num_pages_sent_unknown_room = 0
        self.num_rejected = 0
        self.num_pages_nixl = 0
        self.num_bytes_nixl = 0
        self.num_nixl_stalls = 0
        self._rejections: OrderedDict[int, tuple[str, str]] = OrderedDict()  # room -> (rid, reason)

    def record_bootstrap(self, room: int, rid: str, prompt_len: int, page_size: int,
                         decode_prefix_len: int) -> RoomTransfer:
        """Record the decode_prefix_len that reached prefill for `room` (replaces an older entry)."""
        planned = kv_to_page_num(prompt_len - decode_prefix_len, page_size)
        entry = RoomTransfer(room, rid, prompt_len, page_size, decode_prefix_len, planned)
        self._rooms.pop(room, None)
        self._rooms[room] = entry
        while len(self._rooms) > self.max_rooms:
            self._rooms.popitem(last=False)
        self.num_requests += 1
        self.num_prompt_tokens += prompt_len
        self.num_decode_prefix_tokens += decode_prefix_len
        self.num_pages_planned += planned
        return entry

    def record_rejection(self, room: int, rid: str, reason: str) -> None:
        """Record a request prefill refused (bad decode_prefix_len or transfer info)."""
        self.num_rejected += 1
        self._rejections[room] = (rid, reason)
        while len(self._rejections) > self.max_rooms:
            self._rejections.popitem(last=False)

    def record_pages_sent(self, room: int, num_pages: int) -> None:
        """Add `num_pages` KV pages handed to the transport for `room`."""
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages_sent += num_pages
        entry = self._rooms.get(room)
        if entry is None:
            self.num_pages_sent_unknown_room += num_pages
        else:
            entry.num_pages_sent += num_pages

    def record_nixl_pages(self, room: int | None, num_pages: int, num_bytes: int) -> None:
        """Add pages/bytes NIXL was asked to move for `room` (None: unknown room)."""
        self.num_pages_nixl += num_pages
        self.num_bytes_nixl += num_bytes
        entry = self._rooms.get(room) if room is not None else None
        if entry is not None:
            entry.num_pages_nixl += num_pages
            entry.num_bytes_nixl += num_bytes

    def record_stall(self) -> None:
        """Count a NIXL transfer declared stalled (and failed)."""
        self.num_nixl_stalls += 1

    def get(self, room: int) -> RoomTransfer | None:
        """The record for `room`, or None if unknown or already dropped."""
        return self._rooms.get(room)

    def snapshot(self, max_recent: int = 256) -> dict:
        """JSON-able totals plus the most recent `max_recent` rooms (room ids as strings)."""
        recent = list(self._rooms.values())[-max_recent:]
        return {
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_decode_prefix_tokens": self.num_decode_prefix_tokens,
            "num_pages_planned": self.num_pages_planned,
            "num_pages_sent": self.num_pages_sent,
            "num_pages_sent_unknown_room": self.num_pages_sent_unknown_room,
            "num_rejected": self.num_rejected,
            "num_pages_nixl": self.num_pages_nixl,
            "num_bytes_nixl": self.num_bytes_nixl,
            "num_nixl_stalls": self.num_nixl_stalls,
            "rejections": {str(room): {"rid": rid, "reason": reason}
                           for room, (rid, reason) in list(self._rejections.items())[-max_recent:]},
            "rooms": {str(r.room): asdict(r) for r in recent},
        }
