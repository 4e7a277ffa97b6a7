"""Benchmark results: one Row per (backend, case), a Skip per backend that produced none."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from sglang_pd.bench.transfer.layout import Case, Geometry


@dataclass
class Row:
    """One table row: a backend's median over repeats for one case (all repeats verified)."""

    backend: str
    page_size: int
    tokens: int
    page_bytes: int
    descriptors: int
    bytes_moved: int
    seconds: float
    gbps: float
    setup_seconds: float
    verified: bool
    repeats: int
    all_seconds: list[float] = field(default_factory=list)
    ratio_to_copy: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Skip:
    """A backend that produced no rows, and why."""

    backend: str
    reason: str
    failed: bool      # True: it broke (non-zero exit); False: not installed here


def make_row(backend: str, geom: Geometry, case: Case, descriptors: int,
             totals: list[float], setups: list[float], note: str = "") -> Row:
    """The row for `case` from its verified repeats' total and setup seconds (medians reported)."""
    seconds = statistics.median(totals)
    moved = case.bytes_moved(geom)
    return Row(backend, case.page_size, case.tokens, geom.page_bytes(case.page_size), descriptors, moved,
               seconds, moved / seconds / 1e9, statistics.median(setups), True, len(totals),
               [round(t, 6) for t in totals], note=note)


def add_ratios(rows: list[Row]) -> None:
    """Set each row's ratio_to_copy from the copy row of the same (page_size, tokens); mutates rows."""
    ceiling = {(r.page_size, r.tokens): r.gbps for r in rows if r.backend == "copy"}
    for row in rows:
        if (row.page_size, row.tokens) in ceiling:
            row.ratio_to_copy = row.gbps / ceiling[(row.page_size, row.tokens)]
