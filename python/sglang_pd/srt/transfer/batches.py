"""Mooncake TCP batches under the transport's queue limit (logic).

Upstream hands Mooncake one batch per request (or per index batch): every page of every layer that is
not contiguous with its neighbour is one descriptor, so a fragmented pool at page size 1 with a
30-layer model makes ~24k descriptors for a 400-token prompt. Mooncake's TCP transport queues a
bounded number of transfers per peer and refuses the whole batch beyond it (measured here: 2,048
one-KiB descriptors in one batch pass, 2,500 fail with rc -1, "TCP lane queue-full"). Upstream's
index-batch knob would also split batches that are small after contiguity merging, so we split by
descriptor count instead, and only batches over the limit.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")

# Descriptors per batch: a quarter of the measured queue limit, because upstream's 4 transfer workers
# may send to the same decode peer at once.
DEFAULT_MAX_DESCRIPTORS = 512


def descriptor_batches(blocks: Sequence[T], max_per_batch: int) -> list[Sequence[T]]:
    """`blocks` in consecutive slices of at most `max_per_batch` (one slice if it already fits; pure)."""
    if max_per_batch < 1:
        raise ValueError(f"max_per_batch must be >= 1, got {max_per_batch}")
    if len(blocks) <= max_per_batch:
        return [blocks]
    return [blocks[i:i + max_per_batch] for i in range(0, len(blocks), max_per_batch)]
