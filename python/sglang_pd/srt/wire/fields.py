"""Checks of single handshake frames (bytes) before anything upstream decodes them, and the limits
(`FrameLimits`, per rank socket `Side`) they are checked against: the lowest module of srt/handshake.

Each function reads one frame, returns the typed value and raises `FrameError` (whose message names
the field and the offending bytes, cut to 32) when the frame is not what a well-behaved peer sends.
All functions are pure and never raise anything else, whatever the bytes.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

MAX_ROOM = 2**63 - 1
MAX_INT = 2**63 - 1  # any other non-negative integer field (sizes, generations)
MAX_RANK = 4095  # prefill ranks, TP/DP/DCP sizes
MAX_STATE_LISTS = 64  # state types one message may list (state pointers, state indices, pool bounds)
_DIGITS = re.compile(rb"[0-9]{1,19}")
_SIGNED = re.compile(rb"-?[0-9]{1,19}")
# Host names, IPv4 and IPv6 literals (with or without brackets, with a zone id).
_HOST = re.compile(rb"[A-Za-z0-9._:%\[\]-]{1,255}")
# NIXL agent names (SGLang uses a uuid4) and other identifiers a thread later looks up by name.
_NAME = re.compile(rb"[A-Za-z0-9._:@-]{1,128}")
KV_MEM_KINDS = (b"VRAM", b"DRAM")


class Side(str, enum.Enum):
    """Which rank socket: prefill's (decode writes to it) or decode's (prefill writes to it)."""

    PREFILL = "prefill"
    DECODE = "decode"


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


class FrameError(ValueError):
    """A frame that a well-behaved peer never sends; the message says which field and why."""


def split_marked_frame(frames: list[bytes], marker: bytes, num_bytes: int,
                       what: str) -> tuple[list[bytes], bytes | None]:
    """(frames without a trailing `marker` + `num_bytes` frame of ours, its payload or None when the last frame
    is not ours). Raises FrameError naming `what` when the last frame starts with `marker` but has another
    length. Read-only."""
    if not frames or bytes(frames[-1][:len(marker)]) != marker:
        return frames, None
    last = bytes(frames[-1])
    if len(last) != len(marker) + num_bytes:
        raise FrameError(f"{what} frame has {len(last) - len(marker)} digest bytes, not {num_bytes}")
    return list(frames[:-1]), last[len(marker):]


class IndexSpan(NamedTuple):
    """The first and the largest index of one non-empty index list."""

    first: int
    largest: int


def shown(frame: bytes) -> str:
    """The first 32 bytes of a frame, printable (for log lines and reasons)."""
    return repr(bytes(frame[:32])) + ("..." if len(frame) > 32 else "")


def ascii_int(frame: bytes, what: str, lo: int, hi: int) -> int:
    """A base-10 ASCII integer in [lo, hi]."""
    if not _SIGNED.fullmatch(frame):
        raise FrameError(f"{what} {shown(frame)} is not an integer")
    value = int(frame)
    if not lo <= value <= hi:
        raise FrameError(f"{what} {value} is outside [{lo}, {hi}]")
    return value


def optional_int(frame: bytes, what: str, lo: int, hi: int) -> int | None:
    """Empty frame -> None, else ascii_int."""
    return None if frame == b"" else ascii_int(frame, what, lo, hi)


def room(frame: bytes) -> int:
    """A bootstrap room: 0 <= room <= 2**63 - 1, plain digits."""
    if not _DIGITS.fullmatch(frame):
        raise FrameError(f"room {shown(frame)} is not a non-negative integer")
    value = int(frame)
    if value > MAX_ROOM:
        raise FrameError(f"room {value} exceeds 2**63 - 1")
    return value


def host(frame: bytes, what: str = "endpoint") -> str:
    """An IPv4/IPv6 literal or host name (ASCII, <= 255 bytes)."""
    if not _HOST.fullmatch(frame):
        raise FrameError(f"{what} {shown(frame)} is not a host name or IP address")
    return frame.decode("ascii")


def port(frame: bytes, what: str = "port") -> int:
    """A TCP port, 1..65535."""
    return ascii_int(frame, what, 1, 65535)


def mooncake_session(frame: bytes) -> str:
    """A mooncake session id: '<host>:<port>' (prefill's scheduler later splits it on the last ':')."""
    head, sep, tail = frame.rpartition(b":")
    if not sep:
        raise FrameError(f"session id {shown(frame)} has no ':<port>'")
    host(head, "session host")
    port(tail, "session port")
    return frame.decode("ascii")


def name(frame: bytes, what: str) -> str:
    """An identifier another thread later looks up by name (NIXL agent name, ...)."""
    if not _NAME.fullmatch(frame):
        raise FrameError(f"{what} {shown(frame)} is not a plain identifier (<= 128 of [A-Za-z0-9._:@-])")
    return frame.decode("ascii")


def int32_indices(frame: bytes, what: str, max_count: int, limit: int | None = None) -> np.ndarray:
    """Native-endian int32 page indices, as numpy tobytes() writes them: 0 <= index < limit, <= max_count."""
    if len(frame) % 4:
        raise FrameError(f"{what} frame has {len(frame)} bytes, not a multiple of 4")
    count = len(frame) // 4
    if count > max_count:
        raise FrameError(f"{what} has {count} entries, more than the {max_count} this pool can address")
    values = np.frombuffer(frame, dtype=np.int32)
    if count and int(values.min()) < 0:
        raise FrameError(f"{what} contains a negative index ({int(values.min())})")
    if count and limit is not None and int(values.max()) >= limit:
        raise FrameError(f"{what} contains index {int(values.max())}, beyond the peer's {limit} slots")
    return values


def packed_u64(frame: bytes, what: str, max_count: int) -> int:
    """A run of native uint64 values (pointers, item lengths); returns the count."""
    if len(frame) % 8:
        raise FrameError(f"{what} frame has {len(frame)} bytes, not a multiple of 8")
    if len(frame) // 8 > max_count:
        raise FrameError(f"{what} has {len(frame) // 8} entries, more than {max_count}")
    return len(frame) // 8


def packed_u32(frame: bytes, what: str, max_count: int) -> int:
    """A run of native uint32 values (layer ids); returns the count."""
    if len(frame) % 4:
        raise FrameError(f"{what} frame has {len(frame)} bytes, not a multiple of 4")
    if len(frame) // 4 > max_count:
        raise FrameError(f"{what} has {len(frame) // 4} entries, more than {max_count}")
    return len(frame) // 4


def int_lists(frame: bytes, what: str, width: int, max_lists: int, max_items: int) -> int:
    """SGLang's packed list of int lists: u32 n, n u32 byte lengths, then the lists; exact size.

    Returns the number of lists. `width` is the item size in bytes (4 for 'i'/'I', 8 for 'Q')."""
    if frame == b"":
        return 0
    if len(frame) < 4:
        raise FrameError(f"{what} frame has {len(frame)} bytes, shorter than its count header")
    (num,) = struct.unpack_from("<I", frame)
    if num > max_lists:
        raise FrameError(f"{what} declares {num} lists, more than {max_lists}")
    header = 4 + 4 * num
    if len(frame) < header:
        raise FrameError(f"{what} frame ends inside its length header ({len(frame)} < {header} bytes)")
    lengths = struct.unpack_from(f"<{num}I", frame, 4)
    if any(n % width or n // width > max_items for n in lengths):
        raise FrameError(f"{what} has a list whose byte length is not a multiple of {width} or too long")
    if header + sum(lengths) != len(frame):
        raise FrameError(f"{what} declares {header + sum(lengths)} bytes but the frame has {len(frame)}")
    return num


def index_list_spans(frame: bytes, what: str, max_lists: int, max_items: int) -> tuple[IndexSpan | None, ...]:
    """SGLang's packed list of int32 index lists (`int_lists` layout, little-endian 'i'), every index >= 0:
    per list its `IndexSpan`, None for an empty list."""
    num = int_lists(frame, what, 4, max_lists, max_items)
    lengths = struct.unpack_from(f"<{num}I", frame, 4) if num else ()
    offset, spans = 4 + 4 * num, []
    for length in lengths:
        values = np.frombuffer(frame, dtype="<i4", count=length // 4, offset=offset)
        offset += length
        if len(values) and int(values.min()) < 0:
            raise FrameError(f"{what} contains a negative index ({int(values.min())})")
        spans.append(IndexSpan(int(values[0]), int(values.max())) if len(values) else None)
    return tuple(spans)


def mem_kinds(frame: bytes, count: int) -> None:
    """NIXL's comma list of KV memory kinds: empty (all VRAM) or exactly `count` of VRAM/DRAM."""
    if frame == b"":
        return
    kinds = frame.split(b",")
    if len(kinds) != count or any(k not in KV_MEM_KINDS for k in kinds):
        raise FrameError(f"KV memory kinds {shown(frame)} are not {count} of VRAM/DRAM")


def one_of(frame: bytes, what: str, allowed: tuple[bytes, ...]) -> bytes:
    """A frame that must be one of a few literal values."""
    if frame not in allowed:
        raise FrameError(f"{what} {shown(frame)} is not one of {[a.decode() for a in allowed]}")
    return frame
