"""The project's sgl_kernel stand-in, each op against a plain loop reference on real tensors."""

import ctypes

import pytest
import torch

import sgl_kernel

pytestmark = pytest.mark.unit


def test_stand_in_is_ours():
    assert sgl_kernel.__version__.endswith("sglang_pd.cpu")


def _assign_reference(req_pool_indices, req_to_token, starts, ends, out_cache_loc):
    off = 0
    for r, s, e in zip(req_pool_indices.tolist(), starts.tolist(), ends.tolist()):
        for pos in range(s, e):
            req_to_token[r, pos] = out_cache_loc[off]
            off += 1


def test_assign_req_to_token_pool_matches_reference():
    gen = torch.Generator().manual_seed(0)
    pool = torch.zeros(6, 32, dtype=torch.int32)
    rows = torch.tensor([4, 0, 2])
    starts = torch.tensor([0, 5, 31])
    ends = torch.tensor([7, 5, 32])  # includes an empty range and a last-column write
    out = torch.randint(0, 1000, (8,), generator=gen, dtype=torch.int64)
    expected = pool.clone()
    _assign_reference(rows, expected, starts, ends, out)
    sgl_kernel.assign_req_to_token_pool_cpu(rows, pool, starts, ends, out, 32)
    assert torch.equal(pool, expected)


def test_assign_rejects_wrong_pool_len():
    with pytest.raises(ValueError, match="pool_len"):
        sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([0]), torch.zeros(1, 8, dtype=torch.int32),
                                                torch.tensor([0]), torch.tensor([1]),
                                                torch.tensor([5]), 16)


def _copy_reference(buffers, tgt, src):
    for buf in buffers:
        for t, s in zip(tgt.tolist(), src.tolist()):
            buf[t] = buf[s].clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_all_layer_kv_cache_matches_reference(dtype):
    gen = torch.Generator().manual_seed(1)
    # Three "layers" of a KV pool: 20 slots x (2 heads x 8 dims).
    layers = [torch.randn(20, 2, 8, generator=gen).to(dtype) for _ in range(3)]
    expected = [t.clone() for t in layers]
    tgt = torch.tensor([15, 16, 17, 19])
    src = torch.tensor([0, 3, 4, 7])
    _copy_reference(expected, tgt, src)
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64)
    strides = torch.tensor([t[0].numel() * t.element_size() for t in layers], dtype=torch.int64)
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for got, want in zip(layers, expected):
        assert torch.equal(got, want)


def test_copy_empty_is_noop_and_length_mismatch_raises():
    buf = torch.arange(8, dtype=torch.float32)
    ptrs = torch.tensor([buf.data_ptr()])
    strides = torch.tensor([ctypes.sizeof(ctypes.c_float)])
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([], dtype=torch.int64),
                                           torch.tensor([], dtype=torch.int64))
    assert torch.equal(buf, torch.arange(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="tgt_loc has 2 slots, src_loc has 1"):
        sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2]), torch.tensor([0]))


def test_unimplemented_op_raises_naming_it():
    with pytest.raises(NotImplementedError, match="sgl_kernel.fused_moe_cpu"):
        sgl_kernel.fused_moe_cpu()
