"""Decode admission of one round of requests: per-request eviction (SGLang's loop) vs one batched eviction.

    python -m sglang_pd.bench_admission [--round-size 64] [--trees radix,unified] [--page-size 16]
                                        [--repeats 7] [--json PATH]

No server: real SGLang objects only (a paged KV allocator on CPU and a RadixCache or the servers'
default UnifiedRadixCache), and our real admission code (DecodePrefixAdmission with SGLang's
match_kv_cache; AdmissionRound for the batched row).

Workload (same for both rows; rebuilt untimed before every timed round)
    The pool (--pool-tokens) is full: older conversations (--filler-len tokens each, distinct, least
    recently used) fill it, then --num-systems system prompts of --system-len tokens are cached last.
    A round is --round-size requests, request i = system prompt (i mod num_systems) + --suffix-len
    unique tokens, so each needs suffix-len new slots and the round must evict about
    round_size x suffix_len tokens of old conversations.

Rows
    per-request  for each request in order: match + lock, evict the tree for its own shortfall if the
                 free slots do not cover it (SGLang's _pre_alloc), allocate.
    batched      AdmissionRound: match + lock every request, evict once for the round's shortfall,
                 then allocate each.

Reported: median seconds per round over --repeats, evict calls, tokens evicted, and the hit rate
(prefix tokens reused / prompt tokens). "speedup" is per-request seconds / batched seconds, measured
side by side in this run; it grows with the number of evictable leaves (each eviction pass builds a
heap over all of them). The machine is shared and noisy: read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from array import array
from dataclasses import asdict, dataclass

from sglang_pd.config import Settings
from sglang_pd.srt.admission import AdmissionRound, PoolSizer
from sglang_pd.srt.hooks.ledger_hooks import apply_ledger_hooks
from sglang_pd.srt.mem_cache import RequestKind
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.state import ProcessKind, build_state, install


@dataclass(frozen=True)
class RoundResult:
    """One timed admission round."""

    seconds: float
    num_evict_calls: int
    num_evicted_tokens: int
    num_prompt_tokens: int
    num_hit_tokens: int


class World:
    """A full pool, its tree, and a round of requests; built fresh (untimed) for every round."""

    def __init__(self, args, tree_kind: str):
        self.allocator, self.tree = paged_tree(tree_kind, args.pool_tokens, args.page_size)
        systems = [[1_000_000 + s * 10_000 + t for t in range(args.system_len)] for s in range(args.num_systems)]
        reserved = args.num_systems * args.system_len
        num_fillers = 0
        while self.allocator.available_size() - reserved >= args.filler_len:
            self._cache([5_000_000 + num_fillers * args.filler_len + t for t in range(args.filler_len)])
            num_fillers += 1
        for system in systems:
            self._cache(system)
        self.num_fillers = num_fillers
        self.reqs = [self._req(f"r{i}", systems[i % args.num_systems]
                               + [9_000_000 + i * args.suffix_len + t for t in range(args.suffix_len)])
                     for i in range(args.round_size)]
        self.state = build_state(ProcessKind.SCHEDULER, Settings())  # as a decode scheduler builds it
        install(self.state)  # the lock hooks record into this world's ledger
        self.admission = self.state.decode_admission
        self.sizer = PoolSizer(self.tree, self.allocator)  # one sizing rule for both rows

    def _cache(self, tokens: list[int]) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        slots = self.allocator.alloc(len(tokens))
        self.tree.insert(InsertParams(key=RadixKey(token_ids=array("q", tokens)), value=slots))

    @staticmethod
    def _req(rid: str, tokens: list[int]):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = Req(rid, None, array("q", tokens), SamplingParams(max_new_tokens=8))
        req.bootstrap_host = "127.0.0.1"
        return req

    def result(self, seconds: float, calls: int, evicted: int) -> RoundResult:
        prompt = sum(len(r.origin_input_ids) for r in self.reqs)
        hits = sum(self.admission.plan_for(r).decode_prefix_len for r in self.reqs)
        return RoundResult(seconds, calls, evicted, prompt, hits)


def run_per_request(world: World) -> RoundResult:
    """SGLang's order: match + lock, evict for this request's own shortfall, allocate; per request."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.common import match_kv_cache

    calls = evicted = 0
    start = time.perf_counter()
    for req in world.reqs:
        world.admission.match_and_lock(req, world.tree, RequestKind.NORMAL, match_kv_cache)
        need = world.sizer.alloc_tokens(req, world.admission.plan_for(req).decode_prefix_len)
        if world.allocator.available_size() < need:
            calls += 1
            evicted += world.tree.evict_for_alloc(
                EvictParams(num_tokens=need - world.allocator.available_size())).num_tokens_evicted
        if world.allocator.alloc(need) is None:
            raise RuntimeError(f"per-request: no room for {req.rid} after eviction")
    return world.result(time.perf_counter() - start, calls, evicted)


def run_batched(world: World) -> RoundResult:
    """AdmissionRound: match + lock all, evict once for the round, allocate each."""
    from sglang.srt.mem_cache.common import match_kv_cache

    rnd = AdmissionRound(world.admission)
    start = time.perf_counter()
    plan = rnd.plan(world.reqs, world.tree, world.sizer, match_kv_cache)
    for req in world.reqs:
        rnd.take(req)
        need = world.sizer.alloc_tokens(req, world.admission.plan_for(req).decode_prefix_len)
        if world.allocator.alloc(need) is None:
            raise RuntimeError(f"batched: no room for {req.rid} after the round's eviction")
    seconds = time.perf_counter() - start
    if len(plan.rids) != len(world.reqs):
        raise RuntimeError(f"batched: only {len(plan.rids)} of {len(world.reqs)} fit the round")
    return world.result(seconds, rnd.snapshot()["num_evictions"], plan.num_evicted_tokens)


def measure(args, tree_kind: str) -> dict:
    """Alternate the two rows --repeats times on fresh worlds; medians and ratios."""
    rows: dict[str, list[RoundResult]] = {"per-request": [], "batched": []}
    for _ in range(args.repeats):
        for name, fn in (("per-request", run_per_request), ("batched", run_batched)):
            world = World(args, tree_kind)
            rows[name].append(fn(world))
    out = {}
    for name, results in rows.items():
        last = results[-1]
        out[name] = dict(asdict(last), seconds=statistics.median(r.seconds for r in results),
                         hit_rate=last.num_hit_tokens / last.num_prompt_tokens)
    out["speedup"] = out["per-request"]["seconds"] / out["batched"]["seconds"]
    out["num_fillers"] = world.num_fillers  # the same for every world of this workload
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--round-size", type=int, default=64)
    p.add_argument("--trees", default="radix,unified", help="radix (Python RadixCache), unified (Rust core)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--pool-tokens", type=int, default=131_072)
    p.add_argument("--filler-len", type=int, default=64)
    p.add_argument("--num-systems", type=int, default=4)
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    apply_ledger_hooks()  # every lock goes through the LockLedger, as in a server
    previous = install(None)
    try:
        results = {tree: measure(args, tree) for tree in args.trees.split(",")}
    finally:
        install(previous)
    print(f"round of {args.round_size} requests, page {args.page_size}, pool {args.pool_tokens} tokens, "
          f"median of {args.repeats}")
    print("| tree | old leaves | per-request ms | batched ms | speedup | evict calls (per-req / batched) "
          "| tokens evicted (per-req / batched) | hit rate (per-req / batched) |")
    print("|---|---|---|---|---|---|---|---|")
    for tree, r in results.items():
        a, b = r["per-request"], r["batched"]
        print(f"| {tree} | {r['num_fillers']} | {a['seconds'] * 1e3:.1f} | {b['seconds'] * 1e3:.1f} "
              f"| {r['speedup']:.2f}x | {a['num_evict_calls']} / {b['num_evict_calls']} "
              f"| {a['num_evicted_tokens']} / {b['num_evicted_tokens']} "
              f"| {a['hit_rate']:.3f} / {b['hit_rate']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
