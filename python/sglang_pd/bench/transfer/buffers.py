"""The KV buffers every process allocates, and the check that a transfer put the right bytes in them.

Source buffers hold a unique value per element, (buffer << _TAG_SHIFT) + flat index + 1, so a page
copied from the wrong place, the wrong buffer, or not at all is always caught by `verify_pages`.
"""

from __future__ import annotations

import numpy as np

from sglang_pd.bench.transfer.layout import Case, Geometry

_TAG_SHIFT = 26                     # element value = (buffer << 26) + flat index + 1


class VerificationError(RuntimeError):
    """Destination bytes differ from the source pages: the benchmark's numbers are meaningless."""


def make_buffers(geom: Geometry, pattern: bool) -> list[np.ndarray]:
    """2 * layers int32 buffers, touched (no lazy zero pages); `pattern` fills unique source values.

    Raises ValueError when the pool is too large for the unique-value pattern."""
    if geom.num_buffers > 32 or geom.buffer_elems >= 1 << _TAG_SHIFT:
        raise ValueError("pool too large for the verification pattern (<= 16 layers, < 256 MiB/buffer)")
    bufs = []
    for b in range(geom.num_buffers):
        if pattern:
            bufs.append(np.arange(1, geom.buffer_elems + 1, dtype=np.int32) + np.int32(b << _TAG_SHIFT))
        else:
            buf = np.empty(geom.buffer_elems, dtype=np.int32)
            buf.fill(0)
            bufs.append(buf)
    return bufs


def page_view(buf: np.ndarray, geom: Geometry, page_size: int) -> np.ndarray:
    """A (pages, page elements) view of one buffer; writes through it change the buffer."""
    return buf.reshape(-1, page_size * geom.token_elems)


def clear_pages(bufs: list[np.ndarray], geom: Geometry, page_size: int, pages: np.ndarray) -> None:
    """Zero the given pages in every buffer (mutates bufs)."""
    for buf in bufs:
        page_view(buf, geom, page_size)[pages] = 0


def verify_pages(bufs: list[np.ndarray], geom: Geometry, case: Case) -> None:
    """Raise VerificationError unless every dst page holds its source page's unique values."""
    page_elems = case.page_size * geom.token_elems
    within = np.arange(page_elems, dtype=np.int64)
    for b, buf in enumerate(bufs):
        got = page_view(buf, geom, case.page_size)[case.dst_pages]
        want = (b << _TAG_SHIFT) + 1 + case.src_pages[:, None] * page_elems + within[None, :]
        if not np.array_equal(got, want):
            bad = np.flatnonzero((got != want).any(axis=1))
            raise VerificationError(
                f"buffer {b}, page_size {case.page_size}, tokens {case.tokens}: {len(bad)} of "
                f"{len(got)} destination pages wrong (first: dst page {case.dst_pages[bad[0]]} "
                f"from src page {case.src_pages[bad[0]]})")
