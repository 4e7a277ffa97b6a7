"""KV *page* transfer throughput between two processes on this host: NIXL vs Mooncake vs a local copy.

    python -m sglang_pd.bench_transfer [--quick] [--json PATH] [--page-sizes 1,16,64] [--tokens 256,2048,8192]

What is moved
    A paged KV pool laid out as SGLang lays it out: one buffer per layer for K and one for V
    (2 * --layers separate, separately registered buffers). A page of one buffer holds
    page_size * kv_heads * head_dim 4-byte elements (fp32-sized), so one request of T tokens moves
    ceil(T / page_size) pages from every buffer. Source and destination page indices are scattered
    over a pool --pool-factor times larger than the request, like a real allocator's: the request's
    pages come in runs of 1..--max-run consecutive pages (same run lengths on both sides), the runs
    placed at random, in random order, on each side.

Rows (all in one run, same page indices for every row of a (page_size, tokens) case)
    copy           one process: dst[dst_pages] = src[src_pages] per buffer (the faster of a numpy
                   fancy-index copy and torch index_select + index_copy_). No transport at all: the
                   practical ceiling for moving these scattered pages on this box.
    nixl           NIXL UCX backend, host memory ("DRAM"), target process owns the destination, the
                   initiator process WRITEs one descriptor per page per buffer, no progress thread
                   (the initiator polls). Timed: descriptor build + initialize_xfer + transfer + wait.
    nixl+coalesce  as nixl, but runs of pages consecutive on both sides go as one descriptor
                   (`coalesce_page_runs`, its cost is inside the timed region).
    mooncake_tcp   Mooncake transfer engine, TCP protocol, P2PHANDSHAKE, one descriptor per page per
                   buffer, batch_transfer_sync_write in chunks of <= 1024 descriptors
                   (bigger batches of 1 KiB slices overflow its TCP lane queue and fail).

Reading the table
    seconds is the median over --repeats timed transfers, each after an untimed warm-up (the copy
    row uses at least 5 repeats); GB/s is bytes / seconds / 1e9; "x copy" is GB/s divided by the
    copy row's GB/s for the same (page_size, tokens). A ratio near 1 means the transport costs about
    what touching the bytes costs anyway; well below 1 means per-descriptor / protocol overhead
    dominates (compare nixl with nixl+coalesce: same bytes, fewer descriptors). descs is the number of
    descriptors (pages x buffers, or runs x buffers when coalesced); setup_ms is the part of seconds
    spent building descriptor lists and the transfer request before posting it. Small cases (2 MiB)
    are latency-bound and cache-resident. The copy is itself imperfect (a fancy-index copy goes
    through a temporary), and all processes share this host's cores with whatever else runs, so
    ratios above 1 or swings of +-30% between runs are noise, not a faster-than-memory transport.

Every timed transfer is verified: the destination pages must hold exactly the source pages' bytes
(each source element has a unique value), else the run fails with a non-zero exit. A backend whose
Python package is missing is skipped with a printed reason. Everything binds/connects to 127.0.0.1
(UCX_NET_DEVICES=lo); note Mooncake's own listeners may bind every interface.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from sglang_pd.bench.transfer.copy_limit import run_copy
from sglang_pd.bench.transfer.layout import ELEM_BYTES, Case, Geometry, make_case
from sglang_pd.harness.endpoints.loopback import apply_env
from sglang_pd.bench.transfer.process_pair import run_backend
from sglang_pd.bench.transfer.report import format_table, write_json
from sglang_pd.bench.transfer.results import Row, Skip, add_ratios
from sglang_pd.bench.transfer.transports import ENDPOINTS

PRESETS = {
    "default": {"page_sizes": (1, 16, 64), "tokens": (256, 2048, 8192), "repeats": 3},
    "quick": {"page_sizes": (16,), "tokens": (2048,), "repeats": 1},
}


def _int_list(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints, got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    """The CLI settings, preset-filled; exits with a usage error on bad values."""
    parser = argparse.ArgumentParser(prog="python -m sglang_pd.bench_transfer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny preset (page size 16, 2048 tokens, 1 repeat): seconds, for tests")
    parser.add_argument("--page-sizes", type=_int_list, help="tokens per page (default 1,16,64)")
    parser.add_argument("--tokens", type=_int_list, help="request lengths in tokens (default 256,2048,8192)")
    parser.add_argument("--repeats", type=int, help="timed repeats per row, median reported (default 3)")
    parser.add_argument("--layers", type=int, default=4, help="model layers (2 buffers each: K and V)")
    parser.add_argument("--kv-heads", type=int, default=4, help="KV heads")
    parser.add_argument("--head-dim", type=int, default=64, help="head dim (4-byte elements)")
    parser.add_argument("--max-run", type=int, default=8,
                        help="pages come in runs of 1..MAX_RUN adjacent pages (1 = fully scattered)")
    parser.add_argument("--pool-factor", type=int, default=2, help="pool size / largest request")
    parser.add_argument("--backends", default="copy,nixl,mooncake",
                        help="comma-separated subset of copy,nixl,mooncake")
    parser.add_argument("--seed", type=int, default=0, help="page-index RNG seed")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds for any single wait")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds allowed per transport")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    preset = PRESETS["quick" if args.quick else "default"]
    for key in ("page_sizes", "tokens", "repeats"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    args.backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    unknown = set(args.backends) - {"copy", *ENDPOINTS}
    if unknown or args.repeats < 1 or args.max_run < 1 or args.pool_factor < 1:
        parser.error(f"bad --backends {sorted(unknown)} or --repeats/--max-run/--pool-factor < 1")
    return args


def build_cases(args: argparse.Namespace) -> tuple[Geometry, list[Case]]:
    """The pool (pool_factor x the largest request, a multiple of every page size) and every case."""
    step = math.lcm(*args.page_sizes)
    pool_tokens = math.ceil(args.pool_factor * max(args.tokens) / step) * step
    geom = Geometry(args.layers, args.kv_heads, args.head_dim, pool_tokens)
    cases = [make_case(geom, ps, tokens, args.max_run, args.seed)
             for ps in args.page_sizes for tokens in args.tokens]
    return geom, cases


def _run_transports(args: argparse.Namespace, geom: Geometry, cases: list[Case]) -> tuple[list[Row], list[Skip]]:
    """Rows of every selected transport (registry order), and a Skip for each that produced none."""
    rows: list[Row] = []
    skipped: list[Skip] = []
    for kind in ENDPOINTS:
        if kind in args.backends:
            t0 = time.monotonic()
            got = run_backend(kind, geom, cases, args.repeats, args.timeout, args.budget)
            if isinstance(got, Skip):
                skipped.append(got)
                print(f"[{kind}] {'FAILED' if got.failed else 'skipped'}: {got.reason}", file=sys.stderr)
            else:
                rows += got
                print(f"[{kind}] {len(got)} rows in {time.monotonic() - t0:.1f} s", flush=True)
    return rows, skipped


def main(argv=None) -> int:
    """Run every selected backend, print the table; 1 if a backend failed, 0 otherwise.

    Raises VerificationError (non-zero exit) when any transfer delivered wrong bytes."""
    apply_env()                                  # before anything can load UCX
    args = parse_args(argv)
    geom, cases = build_cases(args)
    print(f"KV geometry: {geom.layers} layers x (K,V) = {geom.num_buffers} buffers, {geom.kv_heads} kv heads "
          f"x head_dim {geom.head_dim} x {ELEM_BYTES} B = {geom.token_elems * ELEM_BYTES} B/token/buffer; "
          f"pool {geom.pool_tokens} tokens; runs of 1..{args.max_run} pages; {args.repeats} repeat(s)",
          flush=True)
    rows = run_copy(geom, cases, args.repeats) if "copy" in args.backends else []
    transport_rows, skipped = _run_transports(args, geom, cases)
    rows += transport_rows
    add_ratios(rows)
    print(format_table(rows))
    for skip in skipped:
        print(f"{skip.backend}: {'FAILED' if skip.failed else 'skipped'} - {skip.reason.splitlines()[-1]}")
    if args.json:
        write_json(args.json, args, geom, rows, skipped)
    return 1 if any(s.failed for s in skipped) else 0


if __name__ == "__main__":
    sys.exit(main())
