"""A new bootstrap room for a request decode served locally and SGLang then sends back to prefill.

Decode-local prefill declines the request's room to prefill (srt/wire/room_decline.py); prefill
then fails every later transfer info for that room (a declined half is a failed one). When SGLang
rebootstraps the request (its recompute on prefill after a retract pause), the rebootstrap must go out
under another room, one no request on this decode holds.

`mark_declined` (mutates the request), `needs_new_room` (read-only), `renew_room` (mutates the
request's `bootstrap_room`, counts `local_prefill_rebootstrap_rooms_total`). Scheduler thread only.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Container

from sglang_pd.srt.metrics import PDCounters

# The room a request was declined in, kept on the request (it outlives our records: SGLang holds it).
DECLINED_ROOM_ATTR = "_sglang_pd_declined_room"


def mark_declined(req: Any, room: int) -> None:
    """`req`'s room `room` was declined to prefill (decode serves it locally)."""
    setattr(req, DECLINED_ROOM_ATTR, room)


def needs_new_room(req: Any, is_rebootstrap: bool) -> bool:
    """True for a rebootstrap still in the room it was declined in (read-only)."""
    declined_room = getattr(req, DECLINED_ROOM_ATTR, None)
    return is_rebootstrap and declined_room is not None and declined_room == req.bootstrap_room


def renew_room(req: Any, rooms_in_use: Container[int], counters: PDCounters,
               randbits: Callable[[int], int] = secrets.randbits) -> int:
    """Move `req` to a fresh random 63-bit room, neither its old one nor any in `rooms_in_use` (the
    decode's transfer states, keyed by room). Returns the old room."""
    old = int(req.bootstrap_room)
    room = randbits(63)
    while room == old or room in rooms_in_use:
        room = randbits(63)
    req.bootstrap_room = room
    counters.add("local_prefill_rebootstrap_rooms_total")
    return old
