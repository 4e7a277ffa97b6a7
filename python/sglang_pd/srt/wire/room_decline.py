"""Room decline: decode tells prefill to drop one bootstrap room before computing it, and how to answer.

Who uses it: decode-local prefill (decode served the request itself: prefill answers its half with
HTTP 200 so a router passes decode's response through) and any decode-side refusal that must free
prefill at once (e.g. early rejection: prefill answers with the refusal's status). The sender picks
the answer; prefill only carries it out.

Wire (decode -> prefill, the same per-rank bootstrap socket as upstream's ABORT):

    [b"ABORT", room, decode_ip, decode_port, b"0", DECLINE_MARKER, status, message]

Upstream's own parser (`AbortNotification.from_zmq`) reads the first five frames (generation 0 is
never a real one) and ignores the rest, so a prefill without this plugin still aborts the room (and
answers 500); no new message tag is invented (NIXL asserts on foreign tags, mooncake would parse one
as transfer info). With the plugin, prefill's bootstrap-thread hook consumes a decline before
upstream's parser sees it.

The race this table closes: a router sends both halves at once, so decode may decline a room before
prefill has created it. Upstream drops an ABORT for an unknown room, and that request would then wait
for SGLang's bootstrap timeout (300 s). `RoomDeclineTable` keeps a tombstone for such a room; prefill's
hook on room creation fails the room as soon as it exists. Tombstones of halves that never arrive
expire after `ttl_s`.

Thread-safety: `receive` runs on prefill's bootstrap thread, the rest on its scheduler thread; every
method takes the table's lock, and the callback `fail_room` runs under it, so "room exists?" and
"leave a tombstone" are one step against the scheduler's "room created, tombstone?".
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from sglang_pd.srt.metrics import PDCounters

ABORT_TAG = b"ABORT"          # upstream's tag (disaggregation/common/conn.py); no new tag is invented
DECLINE_MARKER = b"sglang_pd:decline"
_NO_GENERATION = b"0"         # upstream generations start at 1: 0 arms no drain-ack anywhere
_OK = b"200"                  # status frame for "answer HTTP 200" (an abort with status_code None)


class DeclineError(ValueError):
    """A message carries the decline marker but not a readable decline (counted and dropped)."""


@dataclass(frozen=True)
class DeclineNotice:
    """What prefill must do with one room: drop it and answer its half with `status` and `message`.

    `status` None: answer HTTP 200 with finish_reason abort and `message` (the request was served
    elsewhere); otherwise the HTTP status (400-599) the prefill half answers with.
    """

    room: int
    status: int | None
    message: str

    def __post_init__(self):
        if self.status is not None and not 400 <= self.status < 600:
            raise ValueError(f"decline status must be None (200) or 400-599, got {self.status}")


def decline_frames(notice: DeclineNotice, decode_ip: str, decode_port: int) -> list[bytes]:
    """The multipart message decode sends to each prefill rank of the room (pure)."""
    status = _OK if notice.status is None else str(notice.status).encode("ascii")
    return [ABORT_TAG, str(notice.room).encode("ascii"), decode_ip.encode("ascii"),
            str(decode_port).encode("ascii"), _NO_GENERATION, DECLINE_MARKER, status, notice.message.encode("utf-8")]


def parse_decline(frames: list[bytes]) -> DeclineNotice | None:
    """The notice in `frames`, or None for any other message (upstream's ABORT included).

    Raises DeclineError when the marker is there but the rest is unreadable.
    """
    if len(frames) < 6 or frames[0] != ABORT_TAG or frames[5] != DECLINE_MARKER:
        return None
    if len(frames) != 8:
        raise DeclineError(f"decline has {len(frames)} frames, expected 8")
    try:
        room = int(frames[1].decode("ascii"))
        status = int(frames[6].decode("ascii"))
        message = frames[7].decode("utf-8")
        return DeclineNotice(room, None if status == 200 else status, message)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DeclineError(f"unreadable decline: {exc}") from exc


@dataclass
class _Entry:
    notice: DeclineNotice
    received_at: float
    tombstone: bool  # True while prefill has no room for it yet


class RoomDeclineTable:
    """Prefill: declines received, per room, until the room's half is answered (or the decline expires).

    Mutating: `receive` (bootstrap thread), `on_room_created`, `take`, `expire` (scheduler thread).
    Read-only: `pending`, `snapshot`. Counts into `counters`.
    """

    def __init__(self, counters: PDCounters, ttl_s: float = 600.0, max_entries: int = 65536,
                 clock: Callable[[], float] = time.monotonic):
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError(f"ttl_s must be > 0 and max_entries >= 1, got {ttl_s}, {max_entries}")
        self.counters = counters
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def receive(self, notice: DeclineNotice, fail_room: Callable[[int, str], bool]) -> bool:
        """A decline arrived. `fail_room(room, message)` fails the room if prefill has it (returns True
        then); else a tombstone waits for the room. Returns True if the room was failed now."""
        with self._lock:
            failed = bool(fail_room(notice.room, notice.message))
            self._entries.pop(notice.room, None)
            self._entries[notice.room] = _Entry(notice, self._clock(), tombstone=not failed)
            if not failed:
                self.counters.add("prefill_decline_tombstones_total")
            self._drop_oldest_locked()
            return failed

    def on_room_created(self, room: int, fail_room: Callable[[int, str], bool]) -> bool:
        """Prefill just created `room`: fail it at once if a tombstone waits for it. True if failed."""
        with self._lock:
            entry = self._entries.get(room)
            if entry is None or not entry.tombstone:
                return False
            entry.tombstone = False
            return bool(fail_room(room, entry.notice.message))

    def take(self, room: int) -> DeclineNotice | None:
        """The notice to answer `room`'s half with (removed), or None if `room` was not declined."""
        with self._lock:
            entry = self._entries.pop(room, None)
        return None if entry is None else entry.notice

    def expire(self) -> int:
        """Drop declines older than the TTL (their prefill half never came); returns how many."""
        deadline = self._clock() - self.ttl_s
        with self._lock:
            old = [room for room, e in self._entries.items() if e.received_at < deadline]
            for room in old:
                del self._entries[room]
        if old:
            self.counters.add("prefill_declines_expired_total", len(old))
        return len(old)

    def _drop_oldest_locked(self) -> None:
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.counters.add("prefill_declines_expired_total")

    def pending(self) -> int:
        """Declines not answered yet (tombstones included)."""
        with self._lock:
            return len(self._entries)

    def snapshot(self) -> dict:
        """JSON-able counts and the pending rooms (ids as strings)."""
        with self._lock:
            entries = list(self._entries.items())
        return {"num_pending": len(entries),
                "num_tombstones": sum(e.tombstone for _, e in entries),
                "num_tombstones_total": int(self.counters.get("prefill_decline_tombstones_total")),
                "num_expired": int(self.counters.get("prefill_declines_expired_total")),
                "pending": {str(room): {"tombstone": e.tombstone, "status": e.notice.status}
                            for room, e in entries[-64:]}}
