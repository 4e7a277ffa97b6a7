"""Schemas of the messages prefill sends decode's rank socket (transfer status, ABORT_ACK, AUX_DATA).

SGLang 0.5.23's decode status thread parses these with no error handling, and an AUX_DATA index
addresses decode's aux buffers: each schema checks every frame the reader later touches, and the
data against the slot it is written to. Frame counts are the catalogue's (catalogue.py). Pure.
"""

from __future__ import annotations

from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire.fields import FrameError, FrameLimits
from sglang_pd.srt.wire.prefill_schemas import MAX_INT, MAX_RANK, MAX_REASON_BYTES
from sglang_pd.srt.wire.verdict import FrameReader

KV_POLL_VALUES = (b"0", b"1", b"2", b"3", b"4")  # Failed .. Success


def _status_fields(msg, reader: FrameReader) -> None:
    """[room, KVPoll value, prefill rank]."""
    reader.room = ff.room(msg[0])
    ff.one_of(msg[1], "status", KV_POLL_VALUES)
    ff.ascii_int(msg[2], "prefill rank", 0, MAX_RANK)


def status(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """Mooncake: [room, KVPoll value, prefill rank]."""
    reader.room = ff.room(msg[0])
    reader.count_frames(msg)
    _status_fields(msg, reader)


def nixl_status(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """NIXL: [KV_STATUS, room, KVPoll value, prefill rank, failure reason]."""
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    reader.count_frames(msg)
    _status_fields(msg[1:4], reader)
    if len(msg[4]) > MAX_REASON_BYTES:
        raise FrameError(f"failure reason has {len(msg[4])} bytes, more than {MAX_REASON_BYTES}")


def abort_ack(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """[ABORT_ACK, room, (prefill rank, (generation))]."""
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    reader.count_frames(msg)
    if len(msg) > 2:
        ff.ascii_int(msg[2], "prefill rank", 0, MAX_RANK)
    if len(msg) > 3:
        ff.ascii_int(msg[3], "generation", 0, MAX_INT)


def aux_data(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """Mooncake: [AUX_DATA, room, buffer index, aux index, u32 length, data], written into decode's aux slot."""
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    reader.count_frames(msg)
    buffer = ff.ascii_int(msg[2], "aux buffer index", 0, len(limits.aux_slots) - 1)
    ff.ascii_int(msg[3], "aux index", 0, limits.aux_slots[buffer] - 1)
    if len(msg[4]) != 4 or int.from_bytes(msg[4], "big") != len(msg[5]):
        raise FrameError(f"declared length {ff.shown(msg[4])} does not match the {len(msg[5])} data bytes")
    if len(msg[5]) > limits.aux_item_lens[buffer]:
        raise FrameError(f"{len(msg[5])} data bytes overflow the {limits.aux_item_lens[buffer]}-byte aux slot")
