"""Presenting results: the printed table and the JSON document (geometry, settings, env, rows, skips)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict

from sglang_pd.bench.transfer.layout import ELEM_BYTES, Geometry
from sglang_pd.harness.endpoints.loopback import LOOPBACK_ENV
from sglang_pd.bench.transfer.results import Row, Skip

_BACKEND_ORDER = {"copy": 0, "nixl": 1, "nixl+coalesce": 2, "mooncake_tcp": 3}
_SETTINGS = ("page_sizes", "tokens", "repeats", "max_run", "pool_factor", "seed", "backends", "quick")


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table, grouped by (page_size, tokens), copy row first."""
    head = (f"{'backend':<14}{'page_size':>10}{'tokens':>8}{'descs':>8}{'bytes':>11}"
            f"{'seconds':>10}{'GB/s':>8}{'x copy':>8}{'setup_ms':>10}")
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r.page_size, r.tokens, _BACKEND_ORDER.get(r.backend, 9))):
        ratio = "-" if r.ratio_to_copy is None else f"{r.ratio_to_copy:.2f}"
        lines.append(f"{r.backend:<14}{r.page_size:>10}{r.tokens:>8}{r.descriptors:>8}{r.bytes_moved:>11}"
                     f"{r.seconds:>10.4f}{r.gbps:>8.2f}{ratio:>8}{r.setup_seconds * 1e3:>10.2f}")
    return "\n".join(lines)


def write_json(path: str, args: argparse.Namespace, geom: Geometry, rows: list[Row],
               skipped: list[Skip]) -> None:
    """Write geometry, CLI settings, loopback env, rows and skips to `path` (overwrites it)."""
    doc = {
        "geometry": {**asdict(geom), "num_buffers": geom.num_buffers,
                     "token_bytes_all_buffers": geom.token_elems * ELEM_BYTES * geom.num_buffers},
        "settings": {k: getattr(args, k) for k in _SETTINGS},
        "env": {k: os.environ.get(k) for k in LOOPBACK_ENV},
        "rows": [asdict(r) for r in rows],
        "skipped": [asdict(s) for s in skipped],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
