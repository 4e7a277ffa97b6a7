"""The staging and DCP (decode context parallel) frames of a registration, and the DCP pairings a rank
can serve. SGLang 0.5.23 checks the pairing in the bootstrap thread (`requires_dcp_relayout`) and raises
on any other, which ends that thread; `staging_and_dcp` refuses those pairings first. Used by
`prefill_schemas` for mooncake and NIXL registrations."""

from __future__ import annotations

from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire.fields import FrameError, FrameLimits


def staging_and_dcp(msg, staging_at: int, dcp_at: int, limits: FrameLimits) -> int:
    """Check the staging and DCP frames; the peer's DCP size as upstream reads it."""
    if len(msg) > staging_at and len(msg[staging_at]) not in (0, 8):
        raise FrameError(f"staging base pointer frame has {len(msg[staging_at])} bytes, not 0 or 8")
    if len(msg) > staging_at + 1:
        ff.optional_int(msg[staging_at + 1], "staging size", 0, ff.MAX_INT)
    size = ff.optional_int(msg[dcp_at], "dcp size", 1, ff.MAX_RANK + 1) if len(msg) > dcp_at else None
    rank = ff.optional_int(msg[dcp_at + 1], "dcp rank", 0, ff.MAX_RANK) if len(msg) > dcp_at + 1 else None
    size, rank = 1 if size is None else size, 0 if rank is None else rank  # upstream's defaults
    dcp_pairing(size, rank, limits)
    return size


def dcp_pairing(size: int, rank: int, limits: FrameLimits) -> None:
    """The pairings upstream's `requires_dcp_relayout` accepts; any other raises in its reading thread."""
    if size == limits.dcp_size:
        if rank != limits.dcp_rank:
            raise FrameError(f"peer DCP rank {rank} does not match this rank's {limits.dcp_rank} "
                             f"(DCP size {size})")
        return
    if limits.dcp_relayout_token_bytes is None or limits.dcp_size != 1:
        raise FrameError(f"peer DCP size {size} cannot pair with this rank's DCP size {limits.dcp_size}")


def relayout_geometry(kv_item_len: int, limits: FrameLimits) -> None:
    """Mooncake's DCP relayout: upstream requires the peer's bytes per token to equal each entry's."""
    token_bytes = kv_item_len // limits.page_size
    if any(token_bytes != own for own in limits.dcp_relayout_token_bytes):
        raise FrameError(f"peer KV of {token_bytes} bytes per token cannot be relaid out from this rank's "
                         f"{list(limits.dcp_relayout_token_bytes)}")
