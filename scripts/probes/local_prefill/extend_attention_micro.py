"""Side by side: SGLang's torch_native extend attention vs sglang_pd's offset_causal_extend, one layer call.

    flock /tmp/sglang_pd-heavy.lock .venv/bin/python scripts/probes/local_prefill/extend_attention_micro.py

Shapes of the short preset's local extends (tiny model: 4 heads, head_dim 16): 1 and 8 requests of 16 new
tokens after a 430-token prefix; one torch thread. Writes
docs/results/local_prefill/extend_attention_micro.json.
"""

import json
import time
from pathlib import Path

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from sglang_pd.srt.attention import offset_causal_extend

HEADS, HEAD_DIM, PREFIX, EXTEND, POOL, REPEAT = 4, 16, 430, 16, 8192, 30


def case(num_reqs: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(POOL, HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    seq_len = PREFIX + EXTEND
    rows = torch.zeros(num_reqs, 1024, dtype=torch.int64)
    for i in range(num_reqs):
        rows[i, :seq_len] = torch.randperm(POOL, generator=gen)[:seq_len]
    query = torch.randn(num_reqs * EXTEND, HEADS, HEAD_DIM, generator=gen)
    lens = (torch.arange(num_reqs), torch.full((num_reqs,), seq_len), torch.full((num_reqs,), PREFIX),
            torch.full((num_reqs,), EXTEND))
    upstream = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    runs = {"torch_native": lambda: upstream._run_sdpa_forward_extend(
                query, torch.empty_like(query), k_cache, v_cache, rows, *lens, scaling=HEAD_DIM ** -0.5, causal=True),
            "offset_causal_extend": lambda: offset_causal_extend(
                query, torch.empty_like(query), k_cache, v_cache, rows, *lens, scaling=HEAD_DIM ** -0.5)}
    out = {"num_reqs": num_reqs, "prefix_len": PREFIX, "extend_len": EXTEND,
           "max_abs_diff": (runs["torch_native"]() - runs["offset_causal_extend"]()).abs().max().item()}
    for name, fn in runs.items():
        fn()
        start = time.perf_counter()
        for _ in range(REPEAT):
            fn()
        out[f"{name}_ms"] = 1000 * (time.perf_counter() - start) / REPEAT
    out["ratio"] = out["torch_native_ms"] / out["offset_causal_extend_ms"]
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    results = [case(n) for n in (1, 8)]
    for r in results:
        print(json.dumps(r))
    (Path(__file__).resolve().parents[3] / "docs" / "results" / "local_prefill" / "extend_attention_micro.json").write_text(json.dumps(results, indent=2))
