"""Schemas of the messages decode sends prefill's rank socket (mooncake and NIXL), on bare frames.

SGLang 0.5.23's bootstrap thread parses these with no error handling, and some fields are parsed again
later by another thread (a session id split on ':' when a chunk is queued; a registration's pointers
address memory): each schema checks every frame a reader later touches. Frame layouts and counts are
the catalogue's (catalogue.py); `frames.check_message` routes a message here. Each schema fills a
`FrameReader` and raises FrameError at the first bad frame. Pure; no SGLang import.
"""

from __future__ import annotations

from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire.dcp_frames import relayout_geometry, staging_and_dcp
from sglang_pd.srt.wire.fields import MAX_STATE_LISTS, FrameError, FrameLimits
from sglang_pd.srt.wire.room_decline import DeclineError, parse_decline
from sglang_pd.srt.wire.verdict import FrameReader
from sglang_pd.srt.mem_cache import check_in_pool

MAX_INT = ff.MAX_INT
MAX_RANK = ff.MAX_RANK
MAX_DST_INFOS = 1024      # required_dst_info_num: decode ranks one prefill rank serves per room
MAX_POINTERS = 1 << 16    # per pointer frame (layers x K/V x draft)
MAX_REASON_BYTES = 4096   # a decline's message, a NIXL status's failure reason


# ---- control ----------------------------------------------------------------------------------------
def abort(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """[ABORT, room, (decode ip, decode port, (generation))]."""
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    reader.count_frames(msg)
    if len(msg) == 3:
        raise FrameError("ABORT with a decode ip but no port")
    if len(msg) >= 4:
        reader.read_endpoint(msg, 2)
    if len(msg) == 5:
        ff.ascii_int(msg[4], "generation", 0, MAX_INT)


def decline(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """A room decline: upstream's ABORT frames (generation 0) then ours, read by room_decline's own parser."""
    reader.room = ff.room(msg[1])
    reader.count_frames(msg)
    reader.read_endpoint(msg, 2)
    ff.one_of(msg[4], "decline generation", (b"0",))
    if len(msg[7]) > MAX_REASON_BYTES:
        raise FrameError(f"decline message has {len(msg[7])} bytes, more than {MAX_REASON_BYTES}")
    try:
        parse_decline(msg)
    except DeclineError as exc:
        raise FrameError(str(exc)) from None


def bootstrap(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """[BOOTSTRAP, room, decode ip, decode port] (prefill_complete allocation only)."""
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    reader.count_frames(msg)
    reader.read_endpoint(msg, 2)


# ---- registration -------------------------------------------------------------------------------------
def _registration_head(msg, reader: FrameReader, peer_at: int, peer_check) -> None:
    reader.read_endpoint(msg, 1)
    reader.peer_name = peer_check(msg[peer_at])


def mooncake_registration(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """A mooncake decode rank's registration (its pools' pointers and layout)."""
    reader.count_frames(msg)
    _registration_head(msg, reader, 3, ff.mooncake_session)
    ff.packed_u64(msg[4], "kv pointers", MAX_POINTERS)
    ff.packed_u64(msg[5], "aux pointers", MAX_POINTERS)
    ff.int_lists(msg[6], "state pointers", 8, MAX_STATE_LISTS, MAX_POINTERS)
    ff.ascii_int(msg[7], "tp rank", 0, MAX_RANK)
    ff.ascii_int(msg[8], "attn tp size", 1, MAX_RANK + 1)
    kv_item_len = ff.ascii_int(msg[9], "kv item len", 0, MAX_INT)
    optional = {10: ("state item lens", 4), 11: ("state dims", 4), 13: ("state layer ids", 4)}
    for i, (what, width) in optional.items():
        if len(msg) > i:
            ff.int_lists(msg[i], what, width, MAX_STATE_LISTS, MAX_POINTERS)
    if len(msg) > 12:
        ff.packed_u32(msg[12], "kv layer ids", MAX_POINTERS)
    if staging_and_dcp(msg, 14, 16, limits) != limits.dcp_size:
        relayout_geometry(kv_item_len, limits)
    for i, what in ((18, "staging slot layer ids"), (19, "kv item lens")):
        if len(msg) > i:
            ff.packed_u64(msg[i], what, MAX_POINTERS)


def nixl_registration(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """A NIXL decode rank's registration (after the guard frame)."""
    reader.count_frames(msg)
    _registration_head(msg, reader, 3, lambda f: ff.name(f, "agent name"))
    if not msg[4]:
        raise FrameError("empty NIXL agent metadata")
    num_ptrs = ff.packed_u64(msg[5], "kv pointers", MAX_POINTERS)
    ff.packed_u64(msg[6], "aux pointers", MAX_POINTERS)
    ff.int_lists(msg[7], "state pointers", 8, MAX_STATE_LISTS, MAX_POINTERS)
    ff.ascii_int(msg[8], "gpu id", 0, MAX_RANK)
    tp_size = ff.ascii_int(msg[9], "decode tp size", 1, MAX_RANK + 1)
    ff.ascii_int(msg[10], "decode tp rank", 0, tp_size - 1)
    ff.ascii_int(msg[11], "kv item len", 0, MAX_INT)
    for i, what in ((12, "state item lens"), (13, "state dims"), (19, "state layer ids")):
        if len(msg) > i:
            ff.int_lists(msg[i], what, 4, MAX_STATE_LISTS, MAX_POINTERS)
    staging_and_dcp(msg, 14, 21, limits)
    if len(msg) > 16:
        ff.optional_int(msg[16], "num slots", 0, MAX_INT)
    if len(msg) > 17:
        ff.mem_kinds(msg[17], num_ptrs)
    if len(msg) > 18 and msg[18] and ff.packed_u64(msg[18], "kv item lens", MAX_POINTERS) != num_ptrs:
        raise FrameError(f"kv item lens has {len(msg[18]) // 8} entries for {num_ptrs} kv pointers")
    if len(msg) > 20:
        ff.packed_u32(msg[20], "kv layer ids", MAX_POINTERS)
    if len(msg) > 23:
        ff.int_lists(msg[23], "state data lens", 8, MAX_STATE_LISTS, MAX_POINTERS)


# ---- transfer info ------------------------------------------------------------------------------------
def _transfer_info_head(msg, limits: FrameLimits, reader: FrameReader, peer_check) -> None:
    reader.room = ff.room(msg[0])
    reader.read_endpoint(msg, 1)
    reader.peer_name = peer_check(msg[3])
    indices = ff.int32_indices(msg[4], "kv page indices", limits.max_kv_pages)
    reader.max_index = int(indices.max()) if len(indices) else None


def _decode_prefix_len(frame: bytes, limits: FrameLimits) -> None:
    """A number within the pool (mem_cache/prefix_len.py: check_in_pool); the prompt rule is checked per
    request at finalize_bootstrap, where the prompt is known and the rejection is recorded with it."""
    value = ff.optional_int(frame, "decode_prefix_len", -(10**19), 10**19)  # any integer frame: the rule judges
    if value is not None:
        try:
            check_in_pool(value, limits.max_kv_pages, limits.page_size)
        except ValueError as exc:
            raise FrameError(str(exc)) from None


def mooncake_transfer_info(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """A mooncake decode rank's transfer info for one room (destination pages, aux slot, state slots)."""
    if msg:
        reader.room = ff.room(msg[0])
    reader.count_frames(msg)
    _transfer_info_head(msg, limits, reader, ff.mooncake_session)
    dummy = msg[4] == b"" and msg[5] == b""
    if not dummy:
        reader.aux_index = ff.ascii_int(msg[5], "aux index", 0, MAX_INT)
    reader.state_spans = ff.index_list_spans(msg[6], "state indices", MAX_STATE_LISTS, limits.max_kv_pages)
    ff.ascii_int(msg[7], "required_dst_info_num", 1, MAX_DST_INFOS)
    if len(msg) > 8:
        _decode_prefix_len(msg[8], limits)
    if len(msg) > 9:
        device = ff.int32_indices(msg[9], "device kv indices", limits.max_kv_pages)
        reader.max_device_index = int(device.max()) if len(device) else None


def nixl_transfer_info(msg, limits: FrameLimits, reader: FrameReader) -> None:
    """A NIXL decode rank's transfer info for one room (after the guard frame)."""
    if msg:
        reader.room = ff.room(msg[0])
    reader.count_frames(msg)
    _transfer_info_head(msg, limits, reader, lambda f: ff.name(f, "agent name"))
    reader.aux_index = ff.ascii_int(msg[5], "aux index", 0, MAX_INT)
    ff.ascii_int(msg[6], "required_dst_info_num", 1, MAX_DST_INFOS)
    if len(msg) > 7:
        reader.state_spans = ff.index_list_spans(msg[7], "state indices", MAX_STATE_LISTS, limits.max_kv_pages)
    if len(msg) > 8:
        _decode_prefix_len(msg[8], limits)
    if len(msg) > 9 and msg[9] != b"":
        ff.one_of(msg[9], "is_dummy", (b"0", b"1"))
