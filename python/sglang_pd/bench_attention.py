"""Decode attention per step: SGLang's torch_native backend vs sglang_pd_shared_prefix, side by side.

    python -m sglang_pd.bench_attention [--geometry capacity|smollm2] [--batch 64] [--group-sizes 1,4,16,64]
                                        [--prefix-lens 128,1024,4096] [--own-len 128] [--page-size 1]
                                        [--repeats 5] [--threads 1] [--scatter] [--churn 0] [--json PATH]
                                        [--min-reads-saved N] [--versus-group-all]

No server: real SGLang objects only (MHATokenToKVPool with random K/V, ReqToTokenPool, paged allocator,
RadixCache; RadixAttention layers), the real TorchNativeAttnBackend ("plain") and our
SharedPrefixAttnBackend around another TorchNativeAttnBackend ("shared"). The allocator hands out
pages in pool order, as a fresh server does; --scatter shuffles its free pages first (a long-running
server's free list), which scatters every request's slots for both backends.

Workload per cell (group size g, prefix P): --batch running requests in batch/g groups; each group's
prompt prefix of P tokens is cached in the radix tree and every member's row starts with the slots
the tree matched (what decode admission gives it); each request then has its own part of
--own-len x [0.5, 1.5) tokens (seeded) plus this step's token. g = 1: no two requests share anything.

One step = init_forward_metadata + every layer's forward (stores this step's K/V, attends), as the
model runs it. The cell runs --repeats + 1 consecutive decode steps (every request gains one token per
step, as in a server; with --churn N each request finishes after N steps and a new request of its
group, with a new own part, joins at the end of the batch, initial ages staggered so that about
batch / N requests leave and join per step, as in a multi-turn server); in each step both backends
run on the same q/k/v, in alternating order (neither always finds the other's data in cache).
Medians over the steps after the first; "1st step" is shared's first step (its segments gathered).
"ratio" = plain / shared, measured side by side in this run. Outputs are compared with plain on every
step (max abs diff). KV read per layer: plain reads every request's whole row; shared reads each
group's prefix once plus the own parts.

Grouping threshold: "shared" groups a shared run only when it saves the backend's `min_reads_saved`
token reads per layer (its default for the geometry's query heads; --min-reads-saved N sets another).
--versus-group-all adds a third backend, timed in the same alternation, that groups every shared run
of >= 16 tokens (min_reads_saved 0, the rule before the threshold): columns "all ms" and "all grp".
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sglang_pd.bench.attention_world import GEOMETRIES, DecodeWorld, random_tokens
from sglang_pd.srt.attention import SharedAttentionStats
from sglang_pd.srt.hooks.attention_backend import min_reads_saved_for
from sglang_pd.srt.metrics import PDCounters


@dataclass(frozen=True)
class Cell:
    """One (group size, prefix) measurement."""

    group_size: int
    prefix_len: int
    batch: int
    plain_ms: float
    shared_ms: float
    ratio: float          # plain / shared
    first_step_ms: float  # the shared backend's first step (gathers its segments)
    num_groups: int
    plain_kv_tokens: int
    shared_kv_tokens: int
    max_abs_diff: float
    group_all_ms: float | None = None   # --versus-group-all: the backend grouping every shared run
    group_all_groups: int | None = None


def _own_len(args, rng: random.Random) -> int:
    return max(1, int(args.own_len * (0.5 + rng.random())))


class Churn:
    """--churn N: which request of the batch finishes when, and the newcomer of its group that joins."""

    def __init__(self, args, group_prefixes: list[torch.Tensor], group_size: int):
        self.args, self.prefixes = args, group_prefixes
        self.rng = random.Random(args.seed + 1)
        self.groups = [i // group_size for i in range(args.batch)]           # per batch position
        self.ages = [i * args.churn // args.batch for i in range(args.batch)]  # staggered

    def step(self, world: DecodeWorld) -> None:
        """After world.advance(): every request one step older; those N steps old leave, each replaced
        by a newcomer of its group (appended to the batch, as SGLang merges new requests)."""
        self.ages = [a + 1 for a in self.ages]
        for position in [i for i, a in enumerate(self.ages) if a >= self.args.churn][::-1]:
            group = self.groups.pop(position)
            self.ages.pop(position)
            world.retire(position)
            world.add_request(self.prefixes[group], _own_len(self.args, self.rng))
            self.groups.append(group)
            self.ages.append(0)


def build_world(args, group_size: int, prefix_len: int) -> tuple[DecodeWorld, Churn | None]:
    """Pools sized for the cell (and the steps it runs, newcomers included); groups cached in the
    tree, members' rows written; the cell's Churn (None without --churn)."""
    rng = random.Random(args.seed)
    own_lens = [_own_len(args, rng) for _ in range(args.batch)]
    pages = lambda n: -(-n // args.page_size) * args.page_size  # noqa: E731
    steps = args.repeats + 1
    newcomers = steps * -(-args.batch // args.churn) if args.churn else 0
    pool = (sum(pages(n + 1) for n in own_lens) + steps * args.batch * args.page_size
            + newcomers * pages(args.own_len * 3 // 2 + 2)
            + (args.batch // group_size) * pages(prefix_len) + args.page_size)
    world = DecodeWorld(GEOMETRIES[args.geometry], args.page_size, pool, args.batch,
                        pages(prefix_len) + 2 * args.own_len + steps + 2, seed=args.seed,
                        shuffle_free_pages=args.scatter, min_reads_saved=args.min_reads_saved)
    prefixes = []
    for group in range(args.batch // group_size):
        prefix = random_tokens(pages(prefix_len), rng)
        world.cache_prefix(prefix)
        prefixes.append(world.matched_slots(prefix + random_tokens(4, rng))[:prefix_len])
        for member in range(group_size):
            world.add_request(prefixes[-1], own_lens[group * group_size + member])
    return world, (Churn(args, prefixes, group_size) if args.churn else None)


def _timed(world: DecodeWorld, backend, batch, inputs) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    out = world.run_step(backend, batch, inputs)
    return time.perf_counter() - start, out


def measure(args, group_size: int, prefix_len: int) -> Cell:
    """Consecutive decode steps (every request gains a token per step, as in a server); in each step
    plain and shared run on the same q/k/v, in alternating order. Medians after the first step and the
    largest output difference to plain over all steps."""
    world, churn = build_world(args, group_size, prefix_len)
    backends = {"plain": world.plain, "shared": world.shared}
    if args.versus_group_all:
        all_stats = SharedAttentionStats(PDCounters())
        backends["all"] = world.shared_backend(all_stats, min_reads_saved=0)
    times: dict[str, list[float]] = {name: [] for name in backends}
    diff = 0.0
    for rep in range(args.repeats + 1):
        batch, inputs = world.decode_batch(), world.step_inputs()
        outs = {}
        order = list(backends) if rep % 2 else list(backends)[::-1]
        for name in order:
            seconds, outs[name] = _timed(world, backends[name], batch, inputs)
            if rep == 0 and name == "shared":
                first_ms = seconds * 1000
            elif rep:
                times[name].append(seconds)
        diff = max(diff, *(float((a - b).abs().max()) for name in backends if name != "plain"
                           for a, b in zip(outs["plain"], outs[name])))
        if rep < args.repeats:
            world.advance()
            if churn is not None:
                churn.step(world)
    step = world.stats.last_step
    ms = {name: statistics.median(t) * 1000 for name, t in times.items()}
    return Cell(group_size, prefix_len, args.batch, round(ms["plain"], 3), round(ms["shared"], 3),
                round(ms["plain"] / ms["shared"], 2), round(first_ms, 3), step.num_groups, sum(world.seq_lens),
                step.num_shared_tokens + step.num_own_tokens, diff,
                *((round(ms["all"], 3), all_stats.last_step.num_groups) if args.versus_group_all else ()))


def format_table(cells: list[Cell]) -> str:
    """The side-by-side table printed by main()."""
    versus = any(c.group_all_ms is not None for c in cells)
    head = (f"{'group':>5} {'prefix':>6} {'plain ms':>9} {'shared ms':>9} {'ratio':>6}"
            f" {'1st step':>8} {'groups':>6} {'plain KV/layer':>14} {'shared KV/layer':>15} {'max|diff|':>9}"
            + (f" {'all ms':>8} {'all grp':>7}" if versus else ""))
    rows = [f"{c.group_size:>5} {c.prefix_len:>6} {c.plain_ms:>9.2f} {c.shared_ms:>9.2f}"
            f" {c.ratio:>6.2f} {c.first_step_ms:>8.2f} {c.num_groups:>6} {c.plain_kv_tokens:>14}"
            f" {c.shared_kv_tokens:>15} {c.max_abs_diff:>9.1e}"
            + (f" {c.group_all_ms:>8.2f} {c.group_all_groups:>7}" if versus else "")
            for c in cells]
    return "\n".join([head, "-" * len(head), *rows])


def plot(cells: list[Cell], path: str) -> None:
    """PNG: plain / shared step-time ratio against the shared prefix length, one line per group size."""
    from sglang_pd.bench.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for group_size in sorted({c.group_size for c in cells}):
        row = sorted((c.prefix_len, c.ratio) for c in cells if c.group_size == group_size)
        ax.plot([p for p, _ in row], [r for _, r in row], marker="o", label=f"{group_size} per group")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    prefixes = sorted({c.prefix_len for c in cells})
    ax.set(xscale="log", xlabel="shared prefix (tokens)", ylabel="plain / shared step time",
           title="decode attention per step: torch_native / shared-prefix")
    ax.set_xticks(prefixes, [str(p) for p in prefixes])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def replot(json_path: str) -> None:
    """Redraw the PNG beside a JSON this module wrote (no measurement)."""
    cells = [Cell(**c) for c in json.loads(Path(json_path).read_text())["cells"]]
    plot(cells, str(Path(json_path).with_suffix(".png")))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="capacity")
    p.add_argument("--batch", type=int, default=64, help="running requests per step")
    p.add_argument("--group-sizes", default="1,4,16,64", help="requests sharing one prefix (divide --batch)")
    p.add_argument("--prefix-lens", default="128,1024,4096", help="shared prefix lengths (tokens)")
    p.add_argument("--own-len", type=int, default=128, help="mean own tokens per request (x 0.5-1.5, seeded)")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (servers here run with 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scatter", action="store_true", help="shuffle the allocator's free pages (scattered slots)")
    p.add_argument("--churn", type=int, default=0,
                   help="steps a request runs before a newcomer of its group replaces it (0: nobody leaves)")
    p.add_argument("--json", help="write the cells and settings here (and a PNG of the ratios beside it)")
    p.add_argument("--min-reads-saved", type=int, default=None,
                   help="the shared backend's grouping threshold (default: its own for the geometry)")
    p.add_argument("--versus-group-all", action="store_true",
                   help="also time a shared backend that groups every shared run (threshold 0), side by side")
    args = p.parse_args(argv)
    args.group_sizes = [int(g) for g in args.group_sizes.split(",")]
    args.prefix_lens = [int(n) for n in args.prefix_lens.split(",")]
    bad = [g for g in args.group_sizes if g < 1 or args.batch % g]
    if (bad or args.repeats < 1 or args.own_len < 1 or args.page_size < 1 or args.churn < 0
            or (args.min_reads_saved is not None and args.min_reads_saved < 0)):
        p.error(f"group sizes must divide --batch {args.batch} (bad: {bad}); --repeats, --own-len,"
                " --page-size must be >= 1, --churn and --min-reads-saved >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cells = []
    for prefix_len in args.prefix_lens:
        for group_size in args.group_sizes:
            cells.append(measure(args, group_size, prefix_len))
            print(format_table(cells[-1:]).splitlines()[-1], flush=True)
    geometry = GEOMETRIES[args.geometry]
    threshold = min_reads_saved_for(geometry.num_q_heads) if args.min_reads_saved is None else args.min_reads_saved
    print(f"\nbench_attention geometry={args.geometry} {asdict(geometry)} page_size={args.page_size} "
          f"min_reads_saved={threshold} "
          f"batch={args.batch} own_len~{args.own_len} threads={args.threads} repeats={args.repeats} churn={args.churn} "
          f"free pages {'scattered' if args.scatter else 'in pool order'} "
          f"({platform.machine()}, {torch.get_num_threads()} torch thread(s))\n")
    print(format_table(cells))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        settings = {**{k: v for k, v in vars(args).items() if k != "json"}, "min_reads_saved": threshold}
        Path(args.json).write_text(json.dumps({"settings": settings, "geometry": asdict(geometry),
                                               "cells": [asdict(c) for c in cells]}, indent=2))
        plot(cells, str(Path(args.json).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
