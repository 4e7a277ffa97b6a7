"""The own-part C kernel on its own: each request's attention over its own pool slots, merged into
accumulators, against plain softmax attention on the same keys (real SGLang KV pool buffers; scattered
slots, empty own parts, MHA/GQA/MQA, float32/bfloat16/float16 pools), the CSR of own slots, the
errors it raises, and the start-up refusals (fresh interpreters): no C compiler that builds it, a `$CC`
that links with -ffast-math (flush-to-zero), a kernel that computes wrong values (the self-test, also
on its own with wrong callables); and a `$CC` adding fast-math or reassociation flags still gets a
correct kernel."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_pd.srt.attention.partials import merge
from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots, own_slots

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
    code = ("from sglang_pd.srt.attention.own_decode_kernel import build_problem, OwnDecodeKernel, KernelBuildError\n"
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
    done = _in_fresh_interpreter("from sglang_pd.srt.attention import own_decode_kernel as k; k.main()")
    assert done.returncode == 0 and "'compiler'" in done.stdout, done.stderr


def _wrapper(folder, name: str, body: str) -> str:
    """A `$CC` wrapper script around gcc (what a user's CC may be)."""
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


_CHECK_IN_FRESH = (
    "import torch\n"
    "from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots, KernelBuildError\n"
    "try:\n    kernel = OwnDecodeKernel()\nexcept KernelBuildError as exc:\n    print('REFUSED', exc)\n    raise SystemExit\n"
    "print('FLAGS', kernel.describe()['flags'])\n"
    "gen = torch.Generator().manual_seed(5)\n"  # the audit's repro: one request, 40 scattered slots, GQA 4/2
    "k, v = torch.randn(2, 64, 2, 32, generator=gen)\n"
    "q = torch.randn(1, 4, 32, generator=gen) * 32 ** -0.5 * 3\n"
    "slots = torch.randperm(64, generator=gen)[:40]\n"
    "o, lse = torch.zeros(1, 4, 32), torch.full((1, 4), float('-inf'))\n"
    "kernel.merge_own(q, k, v, OwnSlots(torch.tensor([0, 40]), slots.to(torch.int32)), o, lse)\n"
    "keys, values = (b[slots].repeat_interleave(2, dim=1).transpose(0, 1) for b in (k, v))\n"
    "ref = torch.einsum('hn,hnd->hd', torch.softmax(torch.einsum('hd,hnd->hn', q[0], keys), -1), values)\n"
    "print('MAXDIFF', float((o[0] - ref).abs().max()))\n")


@pytest.mark.parametrize("command", ['exec gcc -ffast-math "$@"',
                                     'exec gcc "$@" -fassociative-math -fno-signed-zeros -fno-trapping-math'],
                         ids=["fast-math-first", "reassociation-last"])
def test_a_cc_that_adds_fast_math_still_builds_a_correct_kernel(tmp_path, command):
    """-ffast-math once folded the exp's rounding away (max |diff| 0.3 here): -fno-fast-math comes after a
    wrapper's leading flags, and the rounding is one that reassociation flags put after ours (no
    fast-math link) cannot fold either."""
    compiler = _wrapper(tmp_path, "cc-fast", command)
    done = _in_fresh_interpreter(_CHECK_IN_FRESH, CC=compiler)
    assert done.returncode == 0, done.stderr
    assert "REFUSED" not in done.stdout and "-fno-fast-math" in done.stdout, done.stdout
    assert float(done.stdout.split("MAXDIFF")[1]) <= TOLERANCE, done.stdout


def test_a_cc_that_links_with_fast_math_is_refused_at_start_up(tmp_path):
    """-ffast-math after our flags links a start-up routine that sets flush-to-zero in the loading thread
    (every later torch op changes): refused, naming the compiler and flags."""
    compiler = _wrapper(tmp_path, "cc-fast-last", 'exec gcc "$@" -ffast-math')
    done = _in_fresh_interpreter(_CHECK_IN_FRESH, CC=compiler)
    assert done.returncode == 0, done.stderr
    assert f"REFUSED {compiler} -O3" in done.stdout and "flush-to-zero" in done.stdout, done.stdout


def test_a_kernel_that_computes_wrong_values_is_refused_at_start_up(tmp_path):
    """A broken variant of the kernel (the exp's k left unrounded: what -ffast-math made of the old
    rounding) compiles and loads, and the start-up self-test refuses it by compiler and flags."""
    from sglang_pd.srt.attention.own_decode_kernel import SOURCE

    source = SOURCE.read_text()
    broken = source.replace("rintf(xc * 1.44269504088896341f)", "(xc * 1.44269504088896341f)")
    assert broken != source
    (tmp_path / "broken.c").write_text(broken)
    compiler = _wrapper(tmp_path, "cc-broken", f'for arg do\n  shift\n  case $arg in *own_decode.c) '
                                               f'arg={tmp_path}/broken.c;; esac\n  set -- "$@" "$arg"\ndone\nexec gcc "$@"')
    done = _in_fresh_interpreter(_CHECK_IN_FRESH, CC=compiler)
    assert done.returncode == 0, done.stderr
    assert f"REFUSED {compiler} -O3" in done.stdout and "computes wrong values" in done.stdout, done.stdout


def test_the_self_test_passes_the_kernel_and_names_what_a_wrong_one_gets_wrong():
    from sglang_pd.srt.attention.own_decode_kernel import self_test_problem

    kernel = OwnDecodeKernel()
    assert self_test_problem(kernel.merge_own) is None

    def does_nothing(q, k_buf, v_buf, own, acc_o, acc_lse):
        pass

    def slightly_off(q, k_buf, v_buf, own, acc_o, acc_lse):
        kernel.merge_own(q, k_buf, v_buf, own, acc_o, acc_lse)
        acc_o[0, 0, 0] += 1e-3

    def nan_lse(q, k_buf, v_buf, own, acc_o, acc_lse):
        kernel.merge_own(q, k_buf, v_buf, own, acc_o, acc_lse)
        acc_lse[1, 0] = float("nan")

    for wrong in (does_nothing, slightly_off, nan_lse):
        assert "2/2 heads: max |diff|" in self_test_problem(wrong), wrong.__name__
