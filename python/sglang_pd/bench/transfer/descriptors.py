"""Transfer descriptor lists: (addr, len, dev) rows for every page run of a case in every buffer."""

from __future__ import annotations

import numpy as np

from sglang_pd.bench.transfer.layout import Case, Geometry
from sglang_pd.bench.transfer.page_runs import coalesce_runs_array, per_page_runs


def descriptor_arrays(runs: np.ndarray, src_addrs: list[int], dst_addrs: list[int],
                      page_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3) uint64 (addr, len, dev 0) local and remote lists: every run in every buffer.

    Rows are buffer-major: all runs of buffer 0, then of buffer 1, ..."""
    n = len(runs)
    local = np.zeros((n * len(src_addrs), 3), dtype=np.uint64)
    remote = np.zeros_like(local)
    lens = (runs[:, 2] * page_bytes).astype(np.uint64)
    for b, (sa, da) in enumerate(zip(src_addrs, dst_addrs)):
        rows = slice(b * n, (b + 1) * n)
        local[rows, 0] = np.uint64(sa) + (runs[:, 0] * page_bytes).astype(np.uint64)
        remote[rows, 0] = np.uint64(da) + (runs[:, 1] * page_bytes).astype(np.uint64)
        local[rows, 1] = lens
        remote[rows, 1] = lens
    return local, remote


def case_descriptors(geom: Geometry, case: Case, coalesce: bool,
                     addrs: tuple[list[int], list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Local and remote descriptor lists for `case`: one per page, or one per run when `coalesce`.

    addrs is (source buffer addresses, destination buffer addresses), one per buffer."""
    if coalesce:
        runs = coalesce_runs_array(case.src_pages, case.dst_pages)
    else:
        runs = per_page_runs(case.src_pages, case.dst_pages)
    return descriptor_arrays(runs, addrs[0], addrs[1], geom.page_bytes(case.page_size))
