"""Syntax check of the per-room transfer-info frames a decode peer sends to prefill.

Upstream parses these frames inside prefill's bootstrap thread with no error handling: one malformed
frame (a non-numeric decode_prefix_len, a torn page-index buffer, foreign traffic) raises there and
kills the thread, after which that prefill rank accepts no new request until restarted. We check
the frames first; a malformed one fails only its own room (when the room id is readable), is
dropped, and the thread keeps serving everyone else.

Frame layouts (index after any leading guard frame):
  mooncake: 0 room, 1 ip, 2 port, 3 session, 4 kv page indices (int32), 5 aux index,
            6 state indices, 7 required_dst_info_num, 8 decode_prefix_len, 9 device indices
  nixl:     [GUARD] 0 room, 1 ip, 2 port, 3 agent, 4 kv page indices (int32), 5 aux index,
            6 required_dst_info_num, 7 state indices, 8 decode_prefix_len, 9 is_dummy
"""

from __future__ import annotations

from typing import NamedTuple

# Room-frame values that are control messages, not transfer infos.
_CONTROL_ROOMS = {"None", "WATERMARK", "STAGING_RSP"}


class FrameLayout(NamedTuple):
    """Where a backend keeps the fields we check."""

    backend: str
    guard: bytes | None      # leading guard frame (nixl), or None
    required_index: int      # required_dst_info_num
    num_min_frames: int      # frames a room message must have at least


MOONCAKE = FrameLayout("mooncake", None, 7, 8)
NIXL = FrameLayout("nixl", b"NixlMsgGuard", 6, 8)


class FrameVerdict(NamedTuple):
    """`reason` is None for a well-formed (or non-room) message; `room` when readable."""

    reason: str | None
    room: int | None


def _int_frame(frame: bytes, what: str, minimum: int, allow_empty: bool) -> str | None:
    if frame == b"" and allow_empty:
        return None
    try:
        value = int(frame.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return f"{what} {frame[:32]!r} is not an integer"
    return None if value >= minimum else f"{what} {value} is below {minimum}"


def check_frames(msg: list[bytes], layout: FrameLayout) -> FrameVerdict:
    """Check one bootstrap message; read-only, never raises."""
    body = list(msg)
    if layout.guard is not None:
        if not body or body[0] != layout.guard:
            return FrameVerdict(f"{layout.backend}: message without the {layout.guard!r} guard frame "
                                "(foreign traffic)", None)
        body = body[1:]
    if not body:
        return FrameVerdict(f"{layout.backend}: empty message", None)
    try:
        room_text = body[0].decode("ascii")
    except UnicodeDecodeError:
        return FrameVerdict(f"{layout.backend}: room frame {body[0][:32]!r} is not ASCII", None)
    if room_text in _CONTROL_ROOMS:
        return FrameVerdict(None, None)
    if not room_text.isdigit():
        return FrameVerdict(f"{layout.backend}: room {room_text[:32]!r} is not a number", None)
    room = int(room_text)
    if len(body) < layout.num_min_frames:
        return FrameVerdict(f"{layout.backend}: transfer info for room {room} has {len(body)} frames, "
                            f"expected at least {layout.num_min_frames}", room)
    problems = [
        None if len(body[4]) % 4 == 0 else f"kv page indices frame has {len(body[4])} bytes, not a multiple of 4",
        _int_frame(body[5], "aux index", 0, allow_empty=True),
        _int_frame(body[layout.required_index], "required_dst_info_num", 1, allow_empty=False),
        _int_frame(body[8], "decode_prefix_len", 0, allow_empty=True) if len(body) > 8 else None,
    ]
    problems = [p for p in problems if p]
    if problems:
        return FrameVerdict(f"{layout.backend}: malformed transfer info for room {room}: "
                            + "; ".join(problems), room)
    return FrameVerdict(None, room)
