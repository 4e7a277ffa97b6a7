"""Page-index runs: coalescing (src, dst) page pairs into runs, and the scattered run allocator.

A *runs array* is an (R, 3) int64 array of (src_start, dst_start, length) rows; it is what the
descriptor builder consumes, whether one row per page (`per_page_runs`) or maximal runs
(`coalesce_runs_array`). Every function here is pure: inputs are never modified.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def coalesce_runs_array(src_pages, dst_pages) -> np.ndarray:
    """`coalesce_page_runs` as an (R, 3) int64 array of (src_start, dst_start, length) rows.

    The single implementation of coalescing (the contract is on `coalesce_page_runs`); this array form
    is the one used on the benchmark's timed path. Raises ValueError on invalid input."""
    src = np.asarray(src_pages)
    dst = np.asarray(dst_pages)
    if src.ndim != 1 or dst.ndim != 1:
        raise ValueError(f"page lists must be 1-D (got shapes {src.shape} and {dst.shape})")
    if len(src) != len(dst):
        raise ValueError(f"src_pages and dst_pages differ in length ({len(src)} != {len(dst)})")
    if len(src) == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError("page indices must be integers")
    src = src.astype(np.int64, copy=False)
    dst = dst.astype(np.int64, copy=False)
    if src.min() < 0 or dst.min() < 0:
        raise ValueError("page indices must be >= 0")
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(src)])))
    return np.stack((src[starts], dst[starts], lengths), axis=1)


def coalesce_page_runs(src_pages: Sequence[int], dst_pages: Sequence[int]) -> list[tuple[int, int, int]]:
    """Merge (src_page, dst_page) pairs into maximal runs that advance by +1 on BOTH sides.

    Contract:
      * src_pages[i] -> dst_pages[i] is the i-th page copy; both are equal-length 1-D sequences of
        non-negative ints (lists, tuples, or integer numpy arrays). Otherwise ValueError.
      * Returns [(src_start, dst_start, length), ...], every length >= 1, in input order. Expanding
        each run to (src_start + k, dst_start + k) for k in range(length), run after run, gives back
        exactly the input pairs (nothing reordered, dropped, or de-duplicated).
      * Runs are maximal: a run ends exactly where the next pair is not (src + 1, dst + 1) of the
        previous one, so repeated, descending, or one-sided-consecutive pages are never merged.
      * Empty input -> []. Pure: inputs are not modified.

    A list-of-tuples view of `coalesce_runs_array`, which does the work.

    >>> coalesce_page_runs([4, 5, 6, 9], [10, 11, 12, 3])
    [(4, 10, 3), (9, 3, 1)]
    >>> coalesce_page_runs([1, 2, 3], [7, 9, 10])
    [(1, 7, 1), (2, 9, 2)]
    >>> coalesce_page_runs([], [])
    []
    """
    return [(int(s), int(d), int(n)) for s, d, n in coalesce_runs_array(src_pages, dst_pages)]


def per_page_runs(src_pages: np.ndarray, dst_pages: np.ndarray) -> np.ndarray:
    """One (src, dst, 1) row per page: the uncoalesced descriptor layout."""
    return np.stack((src_pages, dst_pages, np.ones_like(src_pages)), axis=1).astype(np.int64)


def expand_runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Page indices of runs [starts[i], starts[i] + lengths[i]) concatenated in order."""
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def random_run_lengths(n_pages: int, max_run: int, rng: np.random.Generator) -> np.ndarray:
    """Run lengths uniform in 1..max_run, summing to exactly n_pages (the last one trimmed).

    Advances rng."""
    lengths = rng.integers(1, max_run + 1, size=n_pages)
    cut = int(np.searchsorted(np.cumsum(lengths), n_pages)) + 1
    lengths = lengths[:cut].copy()
    lengths[-1] -= int(lengths.sum()) - n_pages
    return lengths.astype(np.int64)


def place_runs(lengths: np.ndarray, pool_pages: int, rng: np.random.Generator) -> np.ndarray:
    """Disjoint runs of the given lengths at random places (random order, random gaps) in a pool.

    Returns the pages of run 0, then run 1, ... (request order). Advances rng; raises ValueError
    when the runs do not fit in pool_pages."""
    total, count = int(lengths.sum()), len(lengths)
    free = pool_pages - total
    if free < 0:
        raise ValueError(f"{total} pages do not fit in a pool of {pool_pages}")
    slot = rng.permutation(count)                         # pool-order position of request run i
    pool_lengths = np.empty(count, dtype=np.int64)
    pool_lengths[slot] = lengths
    gaps = np.diff(np.concatenate(([0], np.sort(rng.integers(0, free + 1, size=count)))))
    pool_starts = np.cumsum(gaps) + np.cumsum(pool_lengths) - pool_lengths
    return expand_runs(pool_starts[slot], lengths)
