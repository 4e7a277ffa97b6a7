"""How many KV pages and aux slots a decode's pools have, sent with its registration (ours).

Prefill computes every destination address of a room as a registered base pointer + index * item length
(mooncake: `dst_kv_ptrs[i] + page * item_len`, `dst_aux_ptrs[i] + aux_index * aux_item_len`; NIXL the
same for aux). SGLang 0.5.23's mooncake registration carries the base pointers and the per-page item
lengths but not the buffers' lengths, so prefill cannot tell an index beyond decode's pool from one
inside it, and writes outside the pool (anywhere in the decode process the transfer engine reaches).
NIXL's registration carries the KV page count (`dst_num_slots`) but no aux buffer length.

  decode: its registration ends with one frame of ours, MARKER + b"<kv pages>,<aux slots>" (ASCII),
          from its own kv_args (the lengths it registers with its transfer engine);
  prefill: the handshake gate takes the frame off (SGLang's parser never sees it), remembers the bounds
          for the registering peer, and refuses a transfer info whose largest page index (KV or device
          KV) or aux index is not below them; the room fails like any malformed transfer info's.

A registration without the frame (a decode without this plugin) clears the peer's bounds: its
transfer infos are served as upstream would (NIXL's own page count still applies). The bounds are only
as trustworthy as the registration they come with (it also carries the pointers): with a peer secret
only peers that hold it can register; without one, anyone reaching the rank socket can.
Pure Python; no SGLang import.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence

from sglang_pd.srt.disaggregation.frame_fields import FrameError, shown

MARKER = b"sglang_pd:pool-bounds:"
_BODY = re.compile(rb"([0-9]{1,12}),([0-9]{1,12})")


class PoolBounds(NamedTuple):
    """Indices a peer's pools take: page < kv_pages, aux index < aux_slots (0: that pool is empty)."""

    kv_pages: int
    aux_slots: int


def slots(data_lens: Sequence[int], item_lens: Sequence[int]) -> int:
    """Indices every buffer can take: the shortest buffer's data_len // item_len, skipping buffers that
    hold nothing (a zero length or item length: an elided entry moves no bytes)."""
    counts = [int(d) // int(i) for d, i in zip(data_lens or [], item_lens or []) if int(d) > 0 and int(i) > 0]
    return min(counts, default=0)


def bounds_of(kv_args) -> PoolBounds:
    """Decode: its own pools' bounds, from SGLang's KVArgs."""
    return PoolBounds(slots(kv_args.kv_data_lens, kv_args.kv_item_lens),
                      slots(kv_args.aux_data_lens, kv_args.aux_item_lens))


def bounds_frame(bounds: PoolBounds) -> bytes:
    """The frame decode appends to its registration."""
    return MARKER + f"{int(bounds.kv_pages)},{int(bounds.aux_slots)}".encode("ascii")


def split_bounds(frames: list[bytes]) -> tuple[list[bytes], PoolBounds | None]:
    """(frames without a trailing bounds frame, its bounds or None). Raises FrameError when the last frame
    is ours but not MARKER + b"<pages>,<slots>"."""
    if not frames or bytes(frames[-1][:len(MARKER)]) != MARKER:
        return frames, None
    body = bytes(frames[-1][len(MARKER):])
    match = _BODY.fullmatch(body)
    if match is None:
        raise FrameError(f"pool bounds frame {shown(body)} is not '<kv pages>,<aux slots>'")
    return list(frames[:-1]), PoolBounds(int(match[1]), int(match[2]))
