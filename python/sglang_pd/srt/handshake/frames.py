"""Schemas of every message a PD rank socket accepts, per backend and side, checked on bare frames.

SGLang 0.5.23 parses these messages in the receiving thread with no error handling: one malformed
frame raises there and ends the thread (prefill then pairs no new request until restarted), and
some fields are parsed again later by another thread or the scheduler (a session id is split on
':' when a chunk is queued, a registration's pointers and an AUX_DATA index address memory).
`check_message` checks every frame a reader later touches, before any upstream code sees the
message, and names the room when it is readable so that only that room fails.

Who sends what (frame index after the NIXL guard frame where there is one):

  prefill rank socket (decode -> prefill), both backends:
    ABORT      [b"ABORT", room, (decode ip, decode port, (generation))]
    decline    [b"ABORT", room, decode ip, decode port, b"0", b"sglang_pd:decline", status, message]
               (ours: srt/handshake/room_decline.py; read by upstream as an ABORT of the room)
    BOOTSTRAP  [b"BOOTSTRAP", room, decode ip, decode port]     (prefill_complete allocation only)
    WATERMARK / STAGING_RSP                                      (staging buffer only)
  mooncake:
    registration  [b"None", ip, port, session "host:port", kv ptrs u64*, aux ptrs u64*, state ptrs
                   (int lists), tp rank, attn tp size, kv item len, state item lens, state dims,
                   kv layer ids u32*, state layer ids, staging base (8 bytes), staging size,
                   dcp size, dcp rank, staging slot layer ids u64*, kv item lens u64*]
    transfer info [room, ip, port, session, kv page indices i32*, aux index, state indices,
                   required_dst_info_num, decode_prefix_len, device kv indices i32*]
  nixl (each after b"NixlMsgGuard"):
    registration  [b"None", ip, port, agent name, agent metadata, kv ptrs, aux ptrs, state ptrs,
                   gpu id, tp size, tp rank, kv item len, state item lens, state dims, staging base,
                   staging size, num slots, kv memory kinds, kv item lens, state layer ids,
                   kv layer ids, dcp size, dcp rank, state data lens]
    transfer info [room, ip, port, agent name, kv page indices, aux index, required_dst_info_num,
                   state indices, decode_prefix_len, is_dummy]
  decode rank socket (prefill -> decode):
    status     mooncake [room, KVPoll value, prefill rank]; NIXL [b"KV_STATUS", room, value, rank, reason]
    ABORT_ACK  [b"ABORT_ACK", room, (prefill rank, (generation))]
    AUX_DATA   [b"AUX_DATA", room, buffer index, aux index, u32 length, data]   (mooncake)
    CHUNK_READY / STAGING_REQ                                    (staging buffer only)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, NamedTuple

from sglang_pd.srt.handshake import fields as ff
from sglang_pd.srt.handshake.dcp_frames import relayout_geometry, staging_and_dcp
from sglang_pd.srt.handshake.fields import FrameError, IndexSpan
from sglang_pd.srt.handshake.room_decline import MARKER as DECLINE_MARKER
from sglang_pd.srt.handshake.room_decline import DeclineError, parse_decline
from sglang_pd.srt.mem_cache.prefix_len import check_in_pool

NIXL_GUARD = b"NixlMsgGuard"
MAX_FRAMES = 32
MAX_INT = ff.MAX_INT
MAX_RANK = ff.MAX_RANK
MAX_DST_INFOS = 1024      # required_dst_info_num: decode ranks one prefill rank serves per room
MAX_STATE_LISTS = 64
MAX_POINTERS = 1 << 16    # per pointer frame (layers x K/V x draft)
KV_POLL_VALUES = (b"0", b"1", b"2", b"3", b"4")  # Failed .. Success
NIXL_STATUS_TAG = b"KV_STATUS"
MAX_REASON_BYTES = 4096


class Side(str, enum.Enum):
    """Which rank socket: prefill's (decode writes to it) or decode's (prefill writes to it)."""

    PREFILL = "prefill"
    DECODE = "decode"


class MessageKind(str, enum.Enum):
    """What a message is, as far as its first frames say."""

    REGISTRATION = "registration"
    TRANSFER_INFO = "transfer_info"
    ABORT = "abort"
    DECLINE = "decline"
    BOOTSTRAP = "bootstrap"
    STATUS = "status"
    ABORT_ACK = "abort_ack"
    AUX_DATA = "aux_data"
    STAGING = "staging"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class FrameLimits:
    """What this server's own pools allow a peer to name (built once from SGLang's KVArgs)."""

    backend: str                  # "mooncake" or "nixl"
    side: Side
    page_size: int
    max_kv_pages: int             # pages one request can occupy: this server's whole KV pool
    max_frame_bytes: int          # no legitimate frame is longer (NIXL agent metadata is the largest)
    staging: bool = False         # SGLANG_DISAGG_STAGING_BUFFER: staging messages are legitimate
    aux_item_lens: tuple[int, ...] = ()   # decode: bytes per aux slot, per aux buffer
    aux_slots: tuple[int, ...] = ()       # decode: aux slots per aux buffer
    # Prefill: this rank's decode-context-parallel place. Upstream's registration reader raises (and its
    # thread ends) for a peer DCP it cannot pair with: same size but another rank, or another size
    # unless it relays out (MLA prefill of DCP 1 to a larger decode DCP), then only with equal
    # per-token KV bytes (mooncake checks them at registration).
    dcp_size: int = 1
    dcp_rank: int = 0
    dcp_relayout_token_bytes: tuple[int, ...] | None = None  # relayout possible: non-draft entries' bytes/token
    state_types: tuple[str, ...] = ()  # prefill: its own state types, in order (how it reads each state index list)


class Verdict(NamedTuple):
    """`reason` None: well formed. `room`, `peer_name`, `reply_to` when the frames name them."""

    kind: MessageKind
    reason: str | None
    room: int | None = None
    peer_name: str | None = None          # mooncake session id / NIXL agent the message speaks for
    reply_to: tuple[str, int] | None = None
    max_index: int | None = None          # largest destination page index named (transfer info)
    aux_index: int | None = None          # destination aux slot named (transfer info; None: dummy)
    max_device_index: int | None = None   # largest destination device page index named (mooncake transfer info)
    state_spans: tuple[IndexSpan | None, ...] = ()  # per state type listed: first and largest index (transfer info)


class _Reader:
    """Collects what was readable before the first bad frame, so a rejection can name its room."""

    def __init__(self, kind: MessageKind):
        self.kind, self.room, self.peer_name, self.reply_to, self.max_index = kind, None, None, None, None
        self.aux_index, self.max_device_index, self.state_spans = None, None, ()

    def verdict(self, reason: str | None = None) -> Verdict:
        return Verdict(self.kind, reason, self.room, self.peer_name, self.reply_to, self.max_index, self.aux_index,
                       self.max_device_index, self.state_spans)


def check_message(msg: list[bytes], limits: FrameLimits) -> Verdict:
    """Check one message (auth trailer already removed) against its schema. Pure; never raises."""
    if not msg:
        return Verdict(MessageKind.UNKNOWN, "empty message")
    if len(msg) > MAX_FRAMES:
        return Verdict(MessageKind.UNKNOWN, f"{len(msg)} frames, more than any PD message has ({MAX_FRAMES})")
    schema, kind, body = _route(msg, limits)
    reader = _Reader(kind)
    long = max(range(len(msg)), key=lambda i: len(msg[i]))
    if len(msg[long]) > limits.max_frame_bytes:
        return reader.verdict(f"{kind.value}: frame {long} has {len(msg[long])} bytes, more than the "
                              f"{limits.max_frame_bytes} any field of this pool needs")
    if schema is None:
        return reader.verdict(body)  # body carries the reason when no schema applies
    try:
        schema(body, limits, reader)
    except FrameError as exc:
        what = f"room {reader.room}" if reader.room is not None else "unknown room"
        return reader.verdict(f"malformed {kind.value} ({what}): {exc}")
    return reader.verdict()


def _route(msg: list[bytes], limits: FrameLimits):
    """(schema, kind, frames) for the message, or (None, kind, reason)."""
    head = msg[0]
    if limits.side is Side.PREFILL:
        if head == b"ABORT" and len(msg) > 5 and msg[5] == DECLINE_MARKER:
            return _decline, MessageKind.DECLINE, msg
        if head == b"ABORT":
            return _abort, MessageKind.ABORT, msg
        if head == b"BOOTSTRAP":
            return _bootstrap, MessageKind.BOOTSTRAP, msg
        if head in (b"WATERMARK", b"STAGING_RSP"):
            return _staging(head, limits)
        if limits.backend == "nixl":
            if head != NIXL_GUARD:
                return None, MessageKind.UNKNOWN, f"no {NIXL_GUARD!r} guard frame and no known tag (foreign traffic)"
            msg = msg[1:]
            if not msg:
                return None, MessageKind.UNKNOWN, "guard frame alone"
        if msg[0] == b"None":
            schema = _nixl_registration if limits.backend == "nixl" else _mooncake_registration
            return schema, MessageKind.REGISTRATION, msg
        schema = _nixl_transfer_info if limits.backend == "nixl" else _mooncake_transfer_info
        return schema, MessageKind.TRANSFER_INFO, msg
    if head == b"ABORT_ACK":
        return _abort_ack, MessageKind.ABORT_ACK, msg
    if head == b"AUX_DATA":
        if limits.backend != "mooncake":
            return None, MessageKind.AUX_DATA, "AUX_DATA is a mooncake message"
        return _aux_data, MessageKind.AUX_DATA, msg
    if head in (b"CHUNK_READY", b"STAGING_REQ"):
        return _staging(head, limits)
    if limits.backend == "nixl":
        if head != NIXL_STATUS_TAG:
            return None, MessageKind.UNKNOWN, f"no known tag ({ff.shown(head)}): not a NIXL decode message"
        return _nixl_status, MessageKind.STATUS, msg
    return _status, MessageKind.STATUS, msg


def _frames(msg: list[bytes], lo: int, hi: int, what: str) -> None:
    if not lo <= len(msg) <= hi:
        raise FrameError(f"{len(msg)} frames, a {what} has {lo}" + (f"..{hi}" if hi != lo else ""))


def _endpoint(msg: list[bytes], ip_at: int, reader: _Reader) -> None:
    reader.reply_to = (ff.host(msg[ip_at]), ff.port(msg[ip_at + 1]))


# ---- prefill side: control ------------------------------------------------------------------------
def _abort(msg, limits, reader):
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    _frames(msg, 2, 5, "ABORT")
    if len(msg) == 3:
        raise FrameError("ABORT with a decode ip but no port")
    if len(msg) >= 4:
        _endpoint(msg, 2, reader)
    if len(msg) == 5:
        ff.ascii_int(msg[4], "generation", 0, MAX_INT)


def _decline(msg, limits, reader):
    """A room decline: upstream's ABORT frames (generation 0) then ours, read by room_decline's own parser."""
    reader.room = ff.room(msg[1])
    _frames(msg, 8, 8, "decline")
    _endpoint(msg, 2, reader)
    ff.one_of(msg[4], "decline generation", (b"0",))
    if len(msg[7]) > MAX_REASON_BYTES:
        raise FrameError(f"decline message has {len(msg[7])} bytes, more than {MAX_REASON_BYTES}")
    try:
        parse_decline(msg)
    except DeclineError as exc:
        raise FrameError(str(exc)) from None


def _bootstrap(msg, limits, reader):
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    _frames(msg, 4, 4, "BOOTSTRAP")
    _endpoint(msg, 2, reader)


def _staging(head: bytes, limits: FrameLimits):
    if not limits.staging:
        return None, MessageKind.STAGING, f"{head.decode()} but this server's staging buffer is off"
    return _STAGING_SCHEMAS[head], MessageKind.STAGING, None


def _ints_then_name(num_ints: int, with_room: bool, tail_ints: int = 0) -> Callable:
    """A staging message: [tag, (room), num_ints ints, name, tail_ints optional ints]."""
    def schema(msg, limits, reader):
        if with_room and len(msg) > 1:
            reader.room = ff.room(msg[1])
        first = 2 if with_room else 1
        _frames(msg, first + num_ints + 1, first + num_ints + 1 + tail_ints, msg[0].decode())
        for i in range(first, first + num_ints):
            ff.ascii_int(msg[i], f"frame {i}", -1, MAX_INT)
        ff.name(msg[first + num_ints], "session")
        for i in range(first + num_ints + 1, len(msg)):
            ff.ascii_int(msg[i], f"frame {i}", 0, MAX_INT)
    return schema


def _watermark(msg, limits, reader):
    _frames(msg, 3, 4, "WATERMARK")
    ff.ascii_int(msg[1], "round", 0, MAX_INT)
    ff.ascii_int(msg[2], "tail", 0, MAX_INT)
    if len(msg) == 4:
        ff.name(msg[3], "session")


_STAGING_SCHEMAS = {
    b"WATERMARK": _watermark,
    b"STAGING_RSP": _ints_then_name(4, with_room=True),
    b"STAGING_REQ": _ints_then_name(2, with_room=True, tail_ints=1),
    b"CHUNK_READY": _ints_then_name(3, with_room=True, tail_ints=1),
}


# ---- prefill side: registration ---------------------------------------------------------------------
def _registration_head(msg, reader, peer_at: int, peer_check) -> None:
    _endpoint(msg, 1, reader)
    reader.peer_name = peer_check(msg[peer_at])


def _mooncake_registration(msg, limits, reader):
    _frames(msg, 10, 20, "mooncake registration")
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


def _nixl_registration(msg, limits, reader):
    _frames(msg, 12, 24, "NIXL registration")
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


# ---- prefill side: transfer info ---------------------------------------------------------------------
def _transfer_info_head(msg, limits, reader, peer_check) -> None:
    reader.room = ff.room(msg[0])
    _endpoint(msg, 1, reader)
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


def _mooncake_transfer_info(msg, limits, reader):
    if msg:
        reader.room = ff.room(msg[0])
    _frames(msg, 8, 10, "mooncake transfer info")
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


def _nixl_transfer_info(msg, limits, reader):
    if msg:
        reader.room = ff.room(msg[0])
    _frames(msg, 7, 10, "NIXL transfer info")
    _transfer_info_head(msg, limits, reader, lambda f: ff.name(f, "agent name"))
    reader.aux_index = ff.ascii_int(msg[5], "aux index", 0, MAX_INT)
    ff.ascii_int(msg[6], "required_dst_info_num", 1, MAX_DST_INFOS)
    if len(msg) > 7:
        reader.state_spans = ff.index_list_spans(msg[7], "state indices", MAX_STATE_LISTS, limits.max_kv_pages)
    if len(msg) > 8:
        _decode_prefix_len(msg[8], limits)
    if len(msg) > 9 and msg[9] != b"":
        ff.one_of(msg[9], "is_dummy", (b"0", b"1"))


# ---- decode side ----------------------------------------------------------------------------------------
def _status(msg, limits, reader):
    reader.room = ff.room(msg[0])
    _frames(msg, 3, 3, "transfer status")
    ff.one_of(msg[1], "status", KV_POLL_VALUES)
    ff.ascii_int(msg[2], "prefill rank", 0, MAX_RANK)


def _nixl_status(msg, limits, reader):
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    _frames(msg, 5, 5, "NIXL transfer status")
    _status(msg[1:4], limits, reader)
    if len(msg[4]) > MAX_REASON_BYTES:
        raise FrameError(f"failure reason has {len(msg[4])} bytes, more than {MAX_REASON_BYTES}")


def _abort_ack(msg, limits, reader):
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    _frames(msg, 2, 4, "ABORT_ACK")
    if len(msg) > 2:
        ff.ascii_int(msg[2], "prefill rank", 0, MAX_RANK)
    if len(msg) > 3:
        ff.ascii_int(msg[3], "generation", 0, MAX_INT)


def _aux_data(msg, limits, reader):
    reader.room = ff.room(msg[1]) if len(msg) > 1 else None
    _frames(msg, 6, 6, "AUX_DATA")
    buffer = ff.ascii_int(msg[2], "aux buffer index", 0, len(limits.aux_slots) - 1)
    ff.ascii_int(msg[3], "aux index", 0, limits.aux_slots[buffer] - 1)
    if len(msg[4]) != 4 or int.from_bytes(msg[4], "big") != len(msg[5]):
        raise FrameError(f"declared length {ff.shown(msg[4])} does not match the {len(msg[5])} data bytes")
    if len(msg[5]) > limits.aux_item_lens[buffer]:
        raise FrameError(f"{len(msg[5])} data bytes overflow the {limits.aux_item_lens[buffer]}-byte aux slot")
