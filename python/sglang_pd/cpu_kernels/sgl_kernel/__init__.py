"""Pure-PyTorch stand-in for the two `sgl_kernel` CPU ops a torch_native Llama calls.

Both ops are vectorised (one gather + one scatter) rather than per-token loops: the KV copy runs on
every retraction/prefix move, and a Python loop over tokens x layers is the slow part on CPU.
"""

import ctypes

import torch

__version__ = "0.0.0+sglang_pd.cpu"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """Write `out_cache_loc` into `req_to_token[req, start:end]` for each request, in order.

    Mutates `req_to_token`. `out_cache_loc` holds the concatenation of every request's new slots.
    `pool_len` (the row width) is accepted for signature parity and checked.
    """
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    if req_to_token.shape[1] != pool_len:
        raise ValueError(f"pool_len {pool_len} != req_to_token row width {req_to_token.shape[1]}")
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + n].to(req_to_token.dtype)
            offset += n


def _byte_view(ptr: int, num_slots: int, stride: int) -> torch.Tensor:
    """A (num_slots, stride) uint8 view of raw memory at `ptr` (no copy)."""
    buf = (ctypes.c_uint8 * (num_slots * stride)).from_address(ptr)
    return torch.frombuffer(buf, dtype=torch.uint8).view(num_slots, stride)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer i, copy slot `src_loc[j]` to slot `tgt_loc[j]` (slot size `strides[i]` bytes).

    Mutates the buffers behind `data_ptrs`. All sources are read before any target is written, so
    overlapping source/target sets behave as a parallel copy.
    """
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(f"tgt_loc has {tgt_loc.numel()} slots, src_loc has {src_loc.numel()}")
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    num_slots = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        view = _byte_view(int(ptr), num_slots, int(stride))
        view[tgt] = view[src]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _unsupported(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the sglang_pd CPU stand-in "
            "(only assign_req_to_token_pool_cpu and copy_all_layer_kv_cache_cpu are)")

    _unsupported.__name__ = name
    return _unsupported
