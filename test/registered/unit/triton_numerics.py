"""The Triton shared-prefix kernels' numerics, case by case, printed as JSON (one object: case -> figures).

    TRITON_INTERPRET=1 python test/registered/unit/triton_numerics.py            # CPU, Triton's interpreter
    python test/registered/unit/triton_numerics.py --device cuda                 # a GPU (scripts/gpu/check.sh)

Run in its own process by test_triton_shared_prefix.py (TRITON_INTERPRET must be set before triton is
imported, which another test module of the same pytest process may already have done). Each decode case
builds a paged KV pool (pages handed out in scattered order), req_to_token-style rows that share pool
slots as the decode radix cache makes them, groups them (prefix_groups, every sharing grouped), plans
through the real SharedPrefixDecoder with TritonDecodeKernels and compares its output with a torch
reference (softmax over each whole row, float64), SGLang's own Triton decode kernel
(`decode_attention_fwd`) on the same pool and rows, and, on CPU, the CPU implementation on the same plan.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from sglang_pd.srt.attention.decode_kernels import CpuDecodeKernels
from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots
from sglang_pd.srt.attention.prefix_groups import find_prefix_groups
from sglang_pd.srt.attention.segment_kv_cache import RequestKey
from sglang_pd.srt.attention.shared_prefix import SharedPrefixDecoder
from sglang_pd.srt.attention.triton_kernels import (TritonDecodeKernels, merge_partials, own_partials,
                                                    segment_partials)


class Pool:
    """One layer's paged KV pool whose pages are handed out in a scattered order."""

    def __init__(self, page_size: int, num_pages: int, num_kv_heads: int, head_dim: int, dtype, device, gen):
        self.page_size = page_size
        self.k = torch.randn(page_size * num_pages, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
        self.v = torch.randn(page_size * num_pages, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
        self.free_pages = torch.randperm(num_pages, generator=gen).tolist()

    def alloc(self, num_tokens: int) -> torch.Tensor:
        """Slots of `num_tokens` tokens on fresh pages (a page's first slot first, as SGLang's allocator)."""
        pages = [self.free_pages.pop() for _ in range(-(-num_tokens // self.page_size))]
        slots = [p * self.page_size + i for p in pages for i in range(self.page_size)]
        return torch.tensor(slots[:num_tokens], dtype=torch.int64)


def reference(q: torch.Tensor, pool: Pool, rows: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Softmax attention of each request over its whole row, float64 on CPU."""
    group = q.shape[1] // pool.k.shape[1]
    out = []
    for b, row in enumerate(rows):
        k = pool.k.cpu().double()[row].repeat_interleave(group, 1)
        v = pool.v.cpu().double()[row].repeat_interleave(group, 1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[b].cpu().double() * scale, k), -1)
        out.append(torch.einsum("hn,nhd->hd", weights, v))
    return torch.stack(out)


def sglang_decode(q: torch.Tensor, pool: Pool, rows: list[torch.Tensor], scale: float) -> torch.Tensor:
    """SGLang's own Triton decode kernel over the same pool and whole rows."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    batch, num_q_heads, dim = q.shape
    device, splits = q.device, 2
    lens = torch.tensor([len(r) for r in rows])
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    out = torch.empty(batch, num_q_heads, dim, dtype=q.dtype, device=device)
    decode_attention_fwd(q, pool.k, pool.v, out, indptr.to(device), torch.cat(rows).to(torch.int32).to(device),
                         torch.empty(batch, num_q_heads, splits, dim, dtype=torch.float32, device=device),
                         torch.empty(batch, num_q_heads, splits, dtype=torch.float32, device=device),
                         torch.full((batch,), splits, dtype=torch.int32, device=device), splits, scale, 1.0, 1.0)
    return out


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu().double() - b.cpu().double()).abs().max())


def decode_case(rows_of, page_size: int, heads: tuple[int, int], head_dim: int, dtype, device, seed: int) -> dict:
    """One decode step of the batch `rows_of(pool)` builds, through the Triton decoder, against the references."""
    gen = torch.Generator().manual_seed(seed)
    pool = Pool(page_size, 512 // page_size, heads[1], head_dim, dtype, device, gen)
    rows = rows_of(pool)
    seq_lens = [len(r) for r in rows]
    table = torch.zeros(len(rows), max(seq_lens), dtype=torch.int64)
    for i, r in enumerate(rows):
        table[i, :len(r)] = r
    q = (torch.randn(len(rows), heads[0], head_dim, generator=gen) * 2).to(dtype).to(device)
    scale = head_dim ** -0.5
    grouping = find_prefix_groups(table, seq_lens, 1, 0)
    keys = [RequestKey(f"r{i}", i, 0) for i in range(len(rows))]
    decoder = SharedPrefixDecoder(TritonDecodeKernels())
    plan = decoder.plan(grouping, table, keys, [pool.k], [pool.v])  # host rows; the index goes to the pool
    out = decoder.attend(0, q, pool.k, pool.v, plan, scale)
    figures = {"segments": grouping.num_groups, "own_tokens": plan.num_own_tokens,
               "vs_torch": _diff(out, reference(q, pool, rows, scale))}
    if device != "cpu" or dtype == torch.float32:
        # Under the interpreter SGLang's decode kernel returned values ~1e9 off on bf16 pools (ours: 0.015
        # off the float64 reference there), so it is a reference for float32 only on CPU.
        figures["vs_sglang_decode"] = _diff(out, sglang_decode(q, pool, rows, scale))
    if device == "cpu" and dtype == torch.float32:
        cpu = SharedPrefixDecoder(CpuDecodeKernels(heads[1], head_dim, OwnDecodeKernel()))
        cpu_plan = cpu.plan(grouping, table, keys, [pool.k], [pool.v])
        figures["vs_cpu_path"] = _diff(out, cpu.attend(0, q, pool.k, pool.v, cpu_plan, scale))
    return figures


def shared_then_own(share: int, own_lens: list[int]):
    """Requests sharing `share` slots of one prefix, then own tokens each."""
    def build(pool: Pool) -> list[torch.Tensor]:
        prefix = pool.alloc(share)
        return [torch.cat([prefix, pool.alloc(n)]) for n in own_lens]
    return build


def no_sharing(pool: Pool) -> list[torch.Tensor]:
    """Every request alone (groups of one): own parts only."""
    return [pool.alloc(n) for n in (5, 18, 1)]


def nested(pool: Pool) -> list[torch.Tensor]:
    """A system prompt shared by four, a branch of it shared by two, one request in no group."""
    system, branch = pool.alloc(20), pool.alloc(12)
    rows = [torch.cat([system, branch, pool.alloc(n)]) for n in (3, 6)]
    rows += [torch.cat([system, pool.alloc(n)]) for n in (4, 9)]
    return rows + [pool.alloc(7)]


def inside_another(pool: Pool) -> list[torch.Tensor]:
    """One request's whole sequence lies inside another's row (its last slot too)."""
    long = pool.alloc(45)
    return [long, long[:19].clone(), torch.cat([long[:30], pool.alloc(2)])]


def kernel_cases(device) -> dict:
    """The levels alone: a one-member segment, an empty own part, our merge against SGLang's merge_state."""
    from sglang.kernels.ops.attention.merge_state import merge_state_triton

    gen = torch.Generator().manual_seed(7)
    pool = Pool(16, 8, 3, 64, torch.float32, device, gen)
    q = torch.randn(3, 9, 64, generator=gen).to(device)
    slots = pool.alloc(21)
    scale = 0.125
    o_seg, lse_seg = segment_partials(q, pool.k, pool.v, torch.tensor([1]), slots, scale)
    k, v = (t.cpu().double()[slots].repeat_interleave(3, 1) for t in (pool.k, pool.v))
    scores = torch.einsum("hd,nhd->hn", q[1].cpu().double() * scale, k)
    figures = {"segment_of_one": {"vs_torch": _diff(o_seg[0], torch.einsum("hn,nhd->hd", scores.softmax(-1), v)),
                                  "lse_vs_torch": _diff(lse_seg[0], scores.logsumexp(-1))}}
    own = OwnSlots(torch.tensor([0, 0, 4, 4]), pool.alloc(4).to(torch.int32))
    o_own, lse_own = own_partials(q, pool.k, pool.v, own, scale)
    empty_ok = bool(torch.isneginf(lse_own[[0, 2]].cpu()).all() and (o_own[[0, 2]].cpu() == 0).all())
    # the segment's partial for position 1 merged with an empty own part is the segment's partial
    out = torch.empty(1, 9, 64, device=device)
    out_lse = torch.empty(1, 9, device=device)
    parts_o, parts_lse = torch.cat([o_seg, o_own[:1]]), torch.cat([lse_seg, lse_own[:1]])
    merge_partials(parts_o, parts_lse, torch.tensor([0, 2], dtype=torch.int32, device=device),
                   torch.tensor([0, 1], dtype=torch.int32, device=device), out, out_lse)
    figures["empty_own"] = {"empty_is_zero_and_neg_inf": empty_ok, "merged_vs_segment": _diff(out, o_seg),
                            "lse_vs_segment": _diff(out_lse, lse_seg)}
    a_o, a_lse = torch.randn(4, 9, 64, generator=gen).to(device), (torch.randn(4, 9, generator=gen) * 5).to(device)
    b_o, b_lse = torch.randn(4, 9, 64, generator=gen).to(device), (torch.randn(4, 9, generator=gen) * 5).to(device)
    ours, ours_lse = torch.empty_like(a_o), torch.empty_like(a_lse)
    merge_partials(torch.cat([a_o, b_o]), torch.cat([a_lse, b_lse]),
                   torch.arange(0, 9, 2, dtype=torch.int32, device=device),
                   torch.tensor([0, 4, 1, 5, 2, 6, 3, 7], dtype=torch.int32, device=device), ours, ours_lse)
    theirs, theirs_lse = merge_state_triton(a_o, a_lse, b_o, b_lse)
    figures["merge_vs_sglang_merge_state"] = {"out": _diff(ours, theirs), "lse": _diff(ours_lse, theirs_lse)}
    return figures


def backend_cases() -> dict:
    """SGLang's decode forwards through the sglang_pd_shared_prefix backend built with the Triton kernels
    (what a CUDA device gets), on CPU tensors: real SGLang pools, ForwardBatch and RadixAttention layers
    (bench/attention_world.py), the unit tier's scenarios (test_shared_prefix_backend.py, a MIXED forward of
    test_shared_prefix_steps.py), against SGLang's TorchNativeAttnBackend on the same q/k/v; and the
    factory's choice for a runner that says cuda with its decode graph off."""
    import random
    from pathlib import Path
    from types import SimpleNamespace

    from sglang_pd.bench.attention_world import DecodeWorld
    from sglang_pd.config import Settings
    from sglang_pd.srt.hooks import attention_backend
    from sglang_pd.srt.state import ProcessKind, build_state, install

    sys.path.insert(0, str(Path(__file__).parent))
    import test_shared_prefix_backend as scenarios  # noqa: E402  (the unit tier's own cases)
    import test_shared_prefix_steps as steps  # noqa: E402

    install(build_state(ProcessKind.SCHEDULER, Settings()))
    world_of = lambda geometry, page: DecodeWorld(scenarios.GEOMETRIES[geometry], page, pool_tokens=4096,  # noqa: E731
                                                  max_requests=8, max_context=512, shuffle_free_pages=True,
                                                  min_reads_saved=0, kernels="triton")
    results = {}
    for name, geometry, page in (("one_group", "gqa", 16), ("several_groups", "gqa", 16), ("mid_page", "gqa", 64),
                                 ("inside_prefix", "mha", 1), ("no_sharing", "gqa", 16)):
        world = world_of(geometry, page)
        expected = scenarios.SCENARIOS[name](world, random.Random(page))
        diff = scenarios._max_diff(world, steps=1)
        results[f"backend_{name}_{geometry}_page{page}"] = {
            "kernels": world.shared.decoder.kernels.describe()["kernels"], "groups": world.stats.last_step.num_groups,
            "expected_groups": expected, "vs_torch_native": diff}
    world = steps._world(page_size=16)
    world.kernels = "triton"
    world.shared = world.shared_backend(world.stats)
    steps._group(world, random.Random(11), [10, 20, 30])
    world.advance()
    system = world.rows.req_to_token[world.row_ids[0], :64].to(torch.int64)
    newcomer = world.add_row(torch.cat([system, world.alloc(12)]))
    diff = steps._mixed_step(world, {0: 4, newcomer: 5})  # an extend first: decode rows 1, 2 are query rows 4, 5
    results["backend_mixed_forward"] = {"kernels": world.shared.decoder.kernels.describe()["kernels"],
                                        "decode_rows": world.shared.plan.batch_size,
                                        "groups": world.stats.last_step.num_groups, "vs_torch_native": diff}
    world = world_of("gqa", 16)
    expected = scenarios.one_group(world, random.Random(1))
    graphs = SimpleNamespace(decode=SimpleNamespace(backend="disabled"), prefill=SimpleNamespace(backend="breakable"))
    runner = SimpleNamespace(device="cuda", use_mla_backend=False, req_to_token_pool=world.rows,
                             token_to_kv_pool=world.kv, model_config=SimpleNamespace(
                                 num_attention_heads=9, get_total_num_kv_heads=lambda: 3),
                             server_args=SimpleNamespace(cuda_graph_config=graphs), prefill_attention_backend_str="triton")
    world.shared = attention_backend.create_backend(runner)
    world.shared.min_reads_saved = 0
    diff = scenarios._max_diff(world, steps=1)
    results["backend_created_for_cuda"] = {"kernels": world.shared.decoder.kernels.describe()["kernels"],
                                           "groups": world.shared.stats.last_step.num_groups, "expected_groups": expected,
                                           "vs_torch_native": diff}
    return results


def run(device: str) -> dict:
    """Every case (module docstring) -> its figures."""
    f32, bf16 = torch.float32, torch.bfloat16
    gqa, mha = (9, 3), (4, 4)
    results = {
        "page1_mha": decode_case(shared_then_own(20, [3, 5, 1]), 1, mha, 32, f32, device, 1),
        "page16_prefix_at_boundary_gqa": decode_case(shared_then_own(32, [2, 7, 4]), 16, gqa, 64, f32, device, 2),
        "page16_prefix_mid_page_gqa": decode_case(shared_then_own(37, [1, 6, 3]), 16, gqa, 64, f32, device, 3),
        "page64_prefix_mid_page_mha": decode_case(shared_then_own(37, [5, 2]), 64, mha, 32, f32, device, 4),
        "page64_prefix_at_boundary_gqa": decode_case(shared_then_own(64, [3, 2]), 64, gqa, 64, f32, device, 5),
        "groups_of_one": decode_case(no_sharing, 16, gqa, 64, f32, device, 6),
        "nested_page16_gqa": decode_case(nested, 16, gqa, 64, f32, device, 7),
        "inside_another_page1_gqa": decode_case(inside_another, 1, gqa, 64, f32, device, 8),
        "bf16_page16_mid_page_gqa": decode_case(shared_then_own(37, [1, 6, 3]), 16, gqa, 64, bf16, device, 9),
    }
    results.update(kernel_cases(device))
    if device == "cpu":  # DecodeWorld builds its SGLang pools on CPU
        results.update(backend_cases())
    return results


def main() -> int:
    """Print the JSON of every case on --device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    print(json.dumps(run(parser.parse_args().device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
