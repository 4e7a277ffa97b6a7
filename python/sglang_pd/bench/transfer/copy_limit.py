"""The `copy` row: a single-process page copy, the practical ceiling for moving scattered pages here.

dst[dst_pages] = src[src_pages] per buffer, timed with a numpy fancy-index copy and (when torch is
installed) torch index_select + index_copy_; the faster median is reported. No transport at all.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from sglang_pd.bench.transfer.buffers import clear_pages, make_buffers, page_view, verify_pages
from sglang_pd.bench.transfer.layout import Case, Geometry
from sglang_pd.bench.transfer.results import Row, make_row

COPY_MIN_REPEATS = 5                # the copy is cheap: more repeats make the ceiling less noisy

CopyFn = Callable[[list[np.ndarray], list[np.ndarray], Geometry, Case], None]


def _copy_numpy(src: list[np.ndarray], dst: list[np.ndarray], geom: Geometry, case: Case) -> None:
    for s, d in zip(src, dst):
        page_view(d, geom, case.page_size)[case.dst_pages] = page_view(s, geom, case.page_size)[case.src_pages]


def _copy_torch(src: list[np.ndarray], dst: list[np.ndarray], geom: Geometry, case: Case) -> None:
    import torch

    si, di = torch.from_numpy(case.src_pages), torch.from_numpy(case.dst_pages)
    for s, d in zip(src, dst):
        sv = torch.from_numpy(page_view(s, geom, case.page_size))
        torch.from_numpy(page_view(d, geom, case.page_size)).index_copy_(0, di, sv.index_select(0, si))


def _copy_methods() -> dict[str, CopyFn]:
    """Every copy implementation available here, by the name reported in the row's note."""
    methods: dict[str, CopyFn] = {"numpy fancy index": _copy_numpy}
    try:
        import torch  # noqa: F401

        methods["torch index_select+index_copy_"] = _copy_torch
    except ImportError:
        pass
    return methods


def _time_copy(fn: CopyFn, src, dst, geom: Geometry, case: Case, repeats: int) -> list[float]:
    times = []
    for i in range(repeats + 1):                 # the first one is the untimed warm-up
        clear_pages(dst, geom, case.page_size, case.dst_pages)
        t0 = time.perf_counter()
        fn(src, dst, geom, case)
        elapsed = time.perf_counter() - t0
        verify_pages(dst, geom, case)
        if i:
            times.append(elapsed)
    return times


def run_copy(geom: Geometry, cases: list[Case], repeats: int) -> list[Row]:
    """The copy row per case: the faster (median) of the numpy and torch fancy-index copies.

    Runs at least COPY_MIN_REPEATS repeats; raises VerificationError if any copy is wrong."""
    methods = _copy_methods()
    src, dst = make_buffers(geom, pattern=True), make_buffers(geom, pattern=False)
    repeats = max(repeats, COPY_MIN_REPEATS)
    rows = []
    for case in cases:
        timed = {name: _time_copy(fn, src, dst, geom, case, repeats) for name, fn in methods.items()}
        best = min(timed, key=lambda name: statistics.median(timed[name]))
        descs = len(case.src_pages) * geom.num_buffers
        rows.append(make_row("copy", geom, case, descs, timed[best], [0.0], note=best))
    return rows
