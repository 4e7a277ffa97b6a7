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

from sglang_pd.srt.mem_cache import kv_to_page_num
from sglang_pd.srt.metrics import PDCounters


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
    """Bounded record of recent rooms (oldest dropped first); totals counted into PDCounters.

    Mutating: `record_bootstrap`, `record_rejection`, `record_pages_sent`, `record_nixl_pages`,
    `record_stall`, `record_computed`, `record_decline`. Read-only: `get`, `computed_tokens`, `snapshot`.
    """

    def __init__(self, counters: PDCounters, max_rooms: int = 4096):
        if max_rooms < 1:
            raise ValueError(f"max_rooms must be >= 1, got {max_rooms}")
        self.counters = counters
        self.max_rooms = max_rooms
        self._rooms: OrderedDict[int, RoomTransfer] = OrderedDict()
        self._rejections: OrderedDict[int, tuple[str, str]] = OrderedDict()  # room -> (rid, reason)
        self._computed: OrderedDict[int, int] = OrderedDict()  # room -> prompt tokens prefill's model ran
        self._declines: OrderedDict[int, dict] = OrderedDict()  # room -> what the declined half answered

    def record_bootstrap(self, room: int, rid: str, prompt_len: int, page_size: int,
                         decode_prefix_len: int) -> RoomTransfer:
        """Record the decode_prefix_len that reached prefill for `room` (replaces an older entry)."""
        planned = kv_to_page_num(prompt_len - decode_prefix_len, page_size)
        entry = RoomTransfer(room, rid, prompt_len, page_size, decode_prefix_len, planned)
        self._rooms.pop(room, None)
        self._rooms[room] = entry
        while len(self._rooms) > self.max_rooms:
            self._rooms.popitem(last=False)
        self.counters.add("prefill_requests_total")
        self.counters.add("prefill_prompt_tokens_total", prompt_len)
        self.counters.add("prefill_decode_prefix_tokens_total", decode_prefix_len)
        self.counters.add("prefill_pages_planned_total", planned)
        return entry

    def record_rejection(self, room: int | None, rid: str, reason: str) -> None:
        """Count a request prefill refused (bad decode_prefix_len or transfer info); kept by room if known."""
        self.counters.add("prefill_rejected_requests_total")
        if room is None:
            return
        self._rejections[room] = (rid, reason)
        while len(self._rejections) > self.max_rooms:
            self._rejections.popitem(last=False)

    def record_pages_sent(self, room: int, num_pages: int, num_bytes: int) -> None:
        """Add `num_pages` KV pages (`num_bytes`) handed to the transport for `room`."""
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.counters.add("kv_pages_transferred_total", num_pages)
        self.counters.add("kv_bytes_transferred_total", num_bytes)
        entry = self._rooms.get(room)
        if entry is None:
            self.counters.add("prefill_pages_sent_unknown_room_total", num_pages)
        else:
            entry.num_pages_sent += num_pages

    def record_nixl_pages(self, room: int | None, num_pages: int, num_bytes: int) -> None:
        """Add pages/bytes NIXL was asked to move for `room` (None: unknown room)."""
        self.counters.add("nixl_pages_total", num_pages)
        self.counters.add("nixl_bytes_total", num_bytes)
        entry = self._rooms.get(room) if room is not None else None
        if entry is not None:
            entry.num_pages_nixl += num_pages
            entry.num_bytes_nixl += num_bytes

    def record_stall(self) -> None:
        """Count a NIXL transfer declared stalled (and failed)."""
        self.counters.add("nixl_stalls_total")

    def record_computed(self, room: int, num_tokens: int) -> None:
        """Prefill's model just ran `num_tokens` prompt tokens of `room` (one extend forward)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self.counters.add("prefill_computed_tokens_total", num_tokens)
        self._computed[room] = self._computed.pop(room, 0) + num_tokens
        _trim(self._computed, self.max_rooms)

    def record_decline(self, room: int, rid: str, status: int | None, message: str) -> None:
        """Prefill answered `room`'s half as declined by decode; counts the tokens it had computed anyway."""
        computed = self.computed_tokens(room)
        self.counters.add("prefill_declined_requests_total")
        self.counters.add("prefill_declined_computed_tokens_total", computed)
        self._declines[room] = {"rid": rid, "status": status, "message": message, "computed_tokens": computed}
        _trim(self._declines, self.max_rooms)

    def computed_tokens(self, room: int) -> int:
        """Prompt tokens prefill's model ran for `room` (0 if none, or forgotten)."""
        return self._computed.get(room, 0)

    def get(self, room: int) -> RoomTransfer | None:
        """The record for `room`, or None if unknown or already dropped."""
        return self._rooms.get(room)

    def snapshot(self, max_recent: int = 256) -> dict:
        """JSON-able totals (from PDCounters) plus the most recent `max_recent` rooms (ids as strings)."""
        count = lambda name: int(self.counters.get(name))  # noqa: E731
        recent = list(self._rooms.values())[-max_recent:]
        return {
            "num_requests": count("prefill_requests_total"),
            "num_prompt_tokens": count("prefill_prompt_tokens_total"),
            "num_decode_prefix_tokens": count("prefill_decode_prefix_tokens_total"),
            "num_pages_planned": count("prefill_pages_planned_total"),
            "num_pages_sent": count("kv_pages_transferred_total"),
            "num_pages_sent_unknown_room": count("prefill_pages_sent_unknown_room_total"),
            "num_rejected": count("prefill_rejected_requests_total"),
            "num_pages_nixl": count("nixl_pages_total"),
            "num_bytes_nixl": count("nixl_bytes_total"),
            "num_nixl_stalls": count("nixl_stalls_total"),
            "rejections": {str(room): {"rid": rid, "reason": reason}
                           for room, (rid, reason) in list(self._rejections.items())[-max_recent:]},
            "rooms": {str(r.room): asdict(r) for r in recent},
            "num_computed_tokens": count("prefill_computed_tokens_total"),
            "computed_tokens": {str(room): n for room, n in list(self._computed.items())[-max_recent:]},
            "num_declined": count("prefill_declined_requests_total"),
            "num_declined_computed_tokens": count("prefill_declined_computed_tokens_total"),
            "declines": {str(room): d for room, d in list(self._declines.items())[-max_recent:]},
        }


def _trim(table: OrderedDict, max_len: int) -> None:
    while len(table) > max_len:
        table.popitem(last=False)
