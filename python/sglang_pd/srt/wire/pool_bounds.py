"""How many KV pages, aux slots and state slots a decode's pools have, sent with its registration (ours).

Prefill computes every destination address of a room as a registered base pointer + index * item length
(mooncake: `dst_kv_ptrs[i] + page * item_len`, `dst_aux_ptrs[i] + aux_index * aux_item_len`, and for the
state pools of hybrid models (mamba, SWA, DSA, ...) `dst_state_ptr + index * item_len` per state type;
NIXL the same for aux and state). SGLang 0.5.23's mooncake registration carries the base pointers and the
per-item lengths but not the buffers' lengths, so prefill cannot tell an index beyond decode's pool from
one inside it, and writes outside the pool (anywhere in the decode process the transfer engine reaches).
NIXL's registration carries the KV page count (`dst_num_slots`) and, from decodes that send it, the state
buffers' lengths, but no aux buffer length.

  decode: its registration ends with one frame of ours, BOUNDS_MARKER + b"<kv pages>,<aux slots>;<state slots>"
          (ASCII; <state slots> one count per state type, in decode's state order, comma separated, empty
          when it has no state pools), from its own kv_args (the lengths it registers with its transfer
          engine); each count is the shortest non-empty buffer's data_len // item_len;
  prefill: the handshake gate takes the frame off (SGLang's parser never sees it), remembers the bounds
          for the registering peer, and refuses a transfer info whose largest page index (KV or device
          KV), aux index or state index of type i is not below them, or that lists indices for more state
          types than decode has pools; the room fails like any malformed transfer info's.

The frame of the previous version, BOUNDS_MARKER + b"<kv pages>,<aux slots>", still reads: its state bounds are
unknown and state indices are checked only for count and sign. A bound of 0 (a pool reporting no
lengths) is not checked. Prefill reads each state type's list the way it computes addresses from it, by
its own state type at that position (both sides list their state types in one order): a DSA tail list
is (row, offset, count, offset, count, ring size), and only its row indexes the pool (upstream checks
the rest against the ring size); every other list holds slot indices.

A registration without the frame (a decode without this plugin) clears the peer's bounds: its
transfer infos are served as upstream would (NIXL's own page count and state lengths still apply). The
bounds are only as trustworthy as the registration they come with (it also carries the pointers): with a
peer secret only peers that hold it can register; without one, anyone reaching the rank socket can.
Pure Python; no SGLang import.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence

from sglang_pd.srt.wire.fields import MAX_STATE_LISTS, FrameError, IndexSpan, shown

BOUNDS_MARKER = b"sglang_pd:pool-bounds:"
MAX_STATE_TYPES = MAX_STATE_LISTS  # as many as a transfer info may list state indices for
_BODY = re.compile(rb"([0-9]{1,12}),([0-9]{1,12})(?:;((?:[0-9]{1,12}(?:,[0-9]{1,12}){0,%d})?))?"
                   % (MAX_STATE_TYPES - 1))
# State types whose index list is a descriptor whose first entry alone indexes the pool (see above).
ROW_FIRST_STATE_TYPES = frozenset({"dsa_tail"})


class PoolBounds(NamedTuple):
    """Indices a peer's pools take: page < kv_pages, aux index < aux_slots, an index of state type i <
    state_slots[i] (0: that pool reports no lengths, not checked; state_slots None: not sent)."""

    kv_pages: int
    aux_slots: int
    state_slots: tuple[int, ...] | None = None


def slots(data_lens: Sequence[int], item_lens: Sequence[int]) -> int:
    """Indices every buffer can take: the shortest buffer's data_len // item_len, skipping buffers that
    hold nothing (a zero length or item length: an elided entry moves no bytes)."""
    counts = [int(d) // int(i) for d, i in zip(data_lens or [], item_lens or []) if int(d) > 0 and int(i) > 0]
    return min(counts, default=0)


def state_slots(data_lens: Sequence[Sequence[int]], item_lens: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Per state type (SGLang's lists of per-buffer lengths, one list per type), the indices its pool takes."""
    return tuple(slots(d, i) for d, i in zip(data_lens or [], item_lens or []))


def bounds_of(kv_args) -> PoolBounds:
    """Decode: its own pools' bounds, from SGLang's KVArgs."""
    return PoolBounds(slots(kv_args.kv_data_lens, kv_args.kv_item_lens),
                      slots(kv_args.aux_data_lens, kv_args.aux_item_lens),
                      state_slots(kv_args.state_data_lens, kv_args.state_item_lens))


def bounds_frame(bounds: PoolBounds) -> bytes:
    """The frame decode appends to its registration (state_slots None: the previous, two-number frame)."""
    body = f"{int(bounds.kv_pages)},{int(bounds.aux_slots)}"
    if bounds.state_slots is not None:
        body += ";" + ",".join(str(int(n)) for n in bounds.state_slots)
    return BOUNDS_MARKER + body.encode("ascii")


def split_bounds(frames: list[bytes]) -> tuple[list[bytes], PoolBounds | None]:
    """(frames without a trailing bounds frame, its bounds or None). Raises FrameError when the last frame
    is ours but not BOUNDS_MARKER + b"<pages>,<slots>" with an optional b";<state slots>" (at most
    MAX_STATE_TYPES counts)."""
    if not frames or bytes(frames[-1][:len(BOUNDS_MARKER)]) != BOUNDS_MARKER:
        return frames, None
    body = bytes(frames[-1][len(BOUNDS_MARKER):])
    match = _BODY.fullmatch(body)
    if match is None:
        raise FrameError(f"pool bounds frame {shown(body)} is not '<kv pages>,<aux slots>' with an optional "
                         f"';<state slots>' (at most {MAX_STATE_TYPES}, comma separated)")
    states = match[3]
    state = None if states is None else tuple(int(n) for n in states.split(b",") if n)
    return list(frames[:-1]), PoolBounds(int(match[1]), int(match[2]), state)


def beyond_state_pools(spans: Sequence[IndexSpan | None], known: Sequence[tuple[int, ...]],
                       state_types: Sequence[str]) -> str | None:
    """Why a transfer info's state indices reach past a peer's state pools, or None (read-only).

    `spans`: per state type the transfer info lists, its first and largest index (None: an empty list).
    `known`: every bound list known for the peer (our frame's, NIXL's registration's), each per state type
    in decode's order: the fewest types and, per type, the smallest non-zero count apply; none: unchecked.
    `state_types`: prefill's own state types, which say how it reads each list (ROW_FIRST_STATE_TYPES)."""
    if not known:
        return None
    num_pools = min(map(len, known))
    if len(spans) > num_pools:
        return f"state indices name {len(spans)} state types, more than the {num_pools} state pools"
    for i, span in enumerate(spans):
        bound = min((b[i] for b in known if b[i]), default=None)
        if span is None or bound is None:
            continue
        kind = state_types[i] if i < len(state_types) else "unknown to prefill"
        index = span.first if kind in ROW_FIRST_STATE_TYPES else span.largest
        if index >= bound:
            return f"state type {i} ({kind}) index names {index}, outside the {bound} slots of that state pool"
    return None
