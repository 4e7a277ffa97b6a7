"""Schemas of the staging buffer's messages (SGLANG_DISAGG_STAGING_BUFFER), both rank sockets:
WATERMARK and STAGING_RSP (decode -> prefill), STAGING_REQ and CHUNK_READY (prefill -> decode).
Frame counts are the catalogue's (catalogue.py); `frames.check_message` refuses these messages on a
server whose staging buffer is off before any schema runs. Pure.
"""

from __future__ import annotations

from typing import Callable

from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire.fields import FrameLimits
from sglang_pd.srt.wire.verdict import FrameReader


def _ints_then_name(num_ints: int, tail_ints: int = 0) -> Callable:
    """A staging message: [tag, room, num_ints ints, name, tail_ints optional ints]."""
    def schema(msg, limits: FrameLimits, reader: FrameReader) -> None:
        if len(msg) > 1:
            reader.room = ff.room(msg[1])
        reader.count_frames(msg)
        for i in range(2, 2 + num_ints):
            ff.ascii_int(msg[i], f"frame {i}", -1, ff.MAX_INT)
        ff.name(msg[2 + num_ints], "session")
        for i in range(2 + num_ints + 1, len(msg)):
            ff.ascii_int(msg[i], f"frame {i}", 0, ff.MAX_INT)
    return schema


def watermark(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """[WATERMARK, round, tail, (session)]."""
    reader.count_frames(msg)
    ff.ascii_int(msg[1], "round", 0, ff.MAX_INT)
    ff.ascii_int(msg[2], "tail", 0, ff.MAX_INT)
    if len(msg) == 4:
        ff.name(msg[3], "session")


staging_rsp = _ints_then_name(4)
staging_req = _ints_then_name(2, tail_ints=1)
chunk_ready = _ints_then_name(3, tail_ints=1)
