"""The own-part C kernel on its own: each request's attention over its own pool slots, merged into
accumulators, against plain softmax attention on the same keys (real SGLang KV pool buffers; scattered
slots, empty own parts, MHA/GQA/MQA, float32/bfloat16/float16 pools), the CSR of own slots, the
errors it raises, and the start-up refusal when no C compiler can build it (fresh interpreters)."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_pd.srt.disaggregation.attention_partials import merge
from sglang_pd.srt.disaggregation.own_decode_kernel import OwnDecodeKernel, OwnSlots, own_slots

pytestmark = pytest.mark.unit

TOLERANCE = 1e-5


def _pool(num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=num_slots, page_size=1, dtype=dtype, head_num=num_kv_heads, head_dim=head_dim,
                            layer_num=1, device="cpu", enable_memory_saver=False)
    for buf in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    return pool.get_key_buffer(0), pool.get_value_buffer(0)


def _reference(q, k_buf, v_buf, slots):
    """Plain softmax attention of q [Hq, D] over pool rows `slots` (float32 math): (out, lse)."""
    keys, values = k_buf[slots].float(), v_buf[slots].float()     # [n, Hkv, D]
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q, keys)
    return torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), values), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (8, 1)], ids=["mha", "gqa", "mqa"])
def test_own_parts_merged_into_accumulators_equal_plain_attention(heads, dtype):
    gen = torch.Generator().manual_seed(1)
    num_q, num_kv = heads
    k_buf, v_buf = _pool(600, num_kv, 64, dtype, gen)
    lens = [37, 0, 1, 130, 64]  # request 1 has no own slot: its accumulator stays as it was
    slots = torch.randperm(600, generator=gen)[:sum(lens)].to(torch.int32)  # scattered, as a used pool's are
    own = OwnSlots(torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]), slots)
    q = torch.randn(len(lens), num_q, 64, generator=gen) * 0.125
    acc_o = torch.randn(len(lens), num_q, 64, generator=gen)
    acc_lse = torch.randn(len(lens), num_q, generator=gen) * 3
    acc_lse[2] = float("-inf")  # request 2: nothing accumulated before its own part
    expected_o, expected_lse = acc_o.clone(), acc_lse.clone()
    for b in range(len(lens)):
        if lens[b]:
            o, lse = _reference(q[b], k_buf, v_buf, slots[own.indptr[b]:own.indptr[b + 1]].long())
            expected_o[b], expected_lse[b] = merge(acc_o[b:b + 1], acc_lse[b:b + 1], o[None], lse[None])
    OwnDecodeKernel().merge_own(q, k_buf, v_buf, own, acc_o, acc_lse)
    assert float((acc_o - expected_o).abs().max()) <= TOLERANCE
    assert float((acc_lse - expected_lse).abs().max()) <= TOLERANCE
    assert torch.isfinite(acc_o).all()


def test_own_slots_are_each_rows_own_columns_request_after_request():
    rows = torch.arange(40, dtype=torch.int32).view(4, 10) + 100
    own = own_slots(rows, own_starts=[3, 0, 10, 7], seq_lens=[6, 2, 10, 10])
    assert own.indptr.tolist() == [0, 3, 5, 5, 8]
    assert own.slots.dtype == torch.int32 and own.num_tokens == 8
    assert own.slots.tolist() == [103, 104, 105, 110, 111, 137, 138, 139]


def test_a_slot_outside_the_pool_is_refused_and_nothing_is_written():
    gen = torch.Generator().manual_seed(2)
    k_buf, v_buf = _pool(50, 2, 16, torch.float32, gen)
    q = torch.randn(2, 2, 16, generator=gen)
    acc_o, acc_lse = torch.zeros(2, 2, 16), torch.full((2, 2), float("-inf"))
    bad = OwnSlots(torch.tensor([0, 2, 4]), torch.tensor([3, 4, 5, k_buf.shape[0]], dtype=torch.int32))
    with pytest.raises(ValueError, match="a slot outside the KV pool"):
        OwnDecodeKernel().merge_own(q, k_buf, v_buf, bad, acc_o, acc_lse)
    assert not acc_o.any() and torch.isinf(acc_lse).all()


def test_tensors_it_cannot_read_are_refused_with_their_shapes():
    gen = torch.Generator().manual_seed(3)
    k_buf, v_buf = _pool(50, 2, 16, torch.float32, gen)
    own = OwnSlots(torch.tensor([0, 1]), torch.tensor([7], dtype=torch.int32))
    kernel = OwnDecodeKernel()
    with pytest.raises(ValueError, match="shapes the kernel does not take"):  # 3 query heads on 2 kv heads
        kernel.merge_own(torch.randn(1, 3, 16), k_buf, v_buf, own, torch.zeros(1, 3, 16), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="cannot read"):  # a non-contiguous query
        kernel.merge_own(torch.randn(1, 16, 2).transpose(1, 2), k_buf, v_buf, own, torch.zeros(1, 2, 16),
                         torch.zeros(1, 2))


def _in_fresh_interpreter(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


@pytest.mark.parametrize("compiler, problem", [("/nonexistent/cc", "could not compile"), ("false", "failed")])
def test_without_a_working_compiler_the_backend_refuses_to_start(compiler, problem):
    code = ("from sglang_pd.srt.disaggregation.own_decode_kernel import build_problem, OwnDecodeKernel, KernelBuildError\n"
            "print('PROBLEM', build_problem())\n"
            "try:\n    OwnDecodeKernel()\nexcept KernelBuildError as exc:\n    print('RAISED', type(exc).__name__)\n")
    done = _in_fresh_interpreter(code, CC=compiler)
    assert done.returncode == 0, done.stderr
    assert f"PROBLEM {compiler}" in done.stdout and problem in done.stdout
    assert "RAISED KernelBuildError" in done.stdout


def test_the_kernel_builds_here_with_the_native_flag():
    info = OwnDecodeKernel().describe()
    assert info["source"] == "own_decode.c" and "-O3" in info["flags"]
    assert "-march=native" in info["flags"] and info["native_refused"] == ""
    done = _in_fresh_interpreter("from sglang_pd.srt.disaggregation import own_decode_kernel as k; k.main()")
    assert done.returncode == 0 and "'compiler'" in done.stdout, done.stderr
