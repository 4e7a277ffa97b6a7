"""GPU sweep (not in CI; never run on the machine that wrote it, which has no GPU): the Triton shared-prefix
decode kernels (sglang_pd/srt/attention/triton_kernels.py) against SGLang's own Triton decode kernel
(`decode_attention_fwd`, what `--attention-backend triton` runs for decode) on the same CUDA pool.

    python scripts/gpu/sweep_attention.py --out docs/gpu/sweep_attention.json

One group: R requests (8/32/128) share a P-token prefix (1k/4k/16k) and own 128 tokens each; SmolLM2-135M
shape (9 query / 3 KV heads, head_dim 64), bf16 pool, page 16, pages scattered. Per cell: one layer's
attention time (median of CUDA-event timings; ours with its plan built once, as per forward), the
ratio, and max |diff| between the two outputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test" / "registered" / "unit"))
from triton_numerics import Pool  # noqa: E402

from sglang_pd.srt.attention.prefix_groups import find_prefix_groups  # noqa: E402
from sglang_pd.srt.attention.segment_kv_cache import RequestKey  # noqa: E402
from sglang_pd.srt.attention.shared_prefix import SharedPrefixDecoder  # noqa: E402
from sglang_pd.srt.attention.triton_kernels import TritonDecodeKernels  # noqa: E402

OWN_LEN, PAGE, HEADS, DIM = 128, 16, (9, 3), 64


def timed(fn, repeats: int) -> float:
    """Median milliseconds of fn() over `repeats` CUDA-event timings (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def sglang_decode_call(q, pool: Pool, rows: list[torch.Tensor], scale: float, splits: int = 8):
    """SGLang's decode kernel over whole rows with its buffers built once (as its backend does per forward):
    (the call, its output tensor)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    batch, num_q_heads, dim = q.shape
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([len(r) for r in rows]), 0)
    indptr, indices = indptr.cuda(), torch.cat(rows).to(torch.int32).cuda()
    out = torch.empty(batch, num_q_heads, dim, dtype=q.dtype, device="cuda")
    logits = torch.empty(batch, num_q_heads, splits, dim, dtype=torch.float32, device="cuda")
    lse = torch.empty(batch, num_q_heads, splits, dtype=torch.float32, device="cuda")
    num_splits = torch.full((batch,), splits, dtype=torch.int32, device="cuda")
    call = lambda: decode_attention_fwd(q, pool.k, pool.v, out, indptr, indices, logits, lse, num_splits,  # noqa: E731
                                        splits, scale, 1.0, 1.0)
    call()
    return call, out


def cell(num_requests: int, prefix_len: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    tokens = prefix_len + num_requests * OWN_LEN
    pool = Pool(PAGE, -(-tokens // PAGE) + num_requests + 1, HEADS[1], DIM, torch.bfloat16, "cuda", gen)
    prefix = pool.alloc(prefix_len)
    rows = [torch.cat([prefix, pool.alloc(OWN_LEN)]) for _ in range(num_requests)]
    table = torch.stack(rows)
    q = torch.randn(num_requests, HEADS[0], DIM, generator=gen).to(torch.bfloat16).cuda()
    grouping = find_prefix_groups(table, [len(r) for r in rows], 1, 0)
    decoder = SharedPrefixDecoder(TritonDecodeKernels())
    plan = decoder.plan(grouping, table, [RequestKey(f"r{i}", i, 0) for i in range(num_requests)], [pool.k], [pool.v])
    scale = DIM ** -0.5
    sglang_call, sglang_out = sglang_decode_call(q, pool, rows, scale)
    ours = timed(lambda: decoder.attend(0, q, pool.k, pool.v, plan, scale), repeats)
    theirs = timed(sglang_call, repeats)
    diff = float((decoder.attend(0, q, pool.k, pool.v, plan, scale).float() - sglang_out.float()).abs().max())
    return {"requests": num_requests, "prefix_len": prefix_len, "own_len": OWN_LEN, "ours_ms": ours,
            "sglang_triton_decode_ms": theirs, "speedup": theirs / ours, "max_abs_diff": diff}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    cells = [cell(r, p, args.repeats) for r in (8, 32, 128) for p in (1024, 4096, 16384)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    settings = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": HEADS, "head_dim": DIM,
                "page_size": PAGE}
    Path(args.out).write_text(json.dumps({**settings, "cells": cells}, indent=1))
    for c in cells:
        print(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
