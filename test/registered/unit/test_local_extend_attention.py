"""Decode-local prefill's extend attention (only the new tokens' queries) equals SGLang's torch_native
extend (a full-length causal query per request) on a real MHATokenToKVPool, rows from SGLang's paged
allocator: GQA and plain heads, page sizes 1 and 4, prefixes ending mid-page, a request with no prefix;
and the hook hands everything it does not serve to upstream's path."""

import pytest
import torch

from sglang_pd.srt.attention.local_extend import MixedRows, offset_causal_extend, offset_causal_mask

pytestmark = pytest.mark.unit

# (prefix_len, extend_len) per request: no prefix, one new token, mid-page ends, a long prefix
REQUESTS = [(0, 7), (5, 1), (37, 16), (430, 20), (62, 3)]


def _world(page_size: int, q_heads: int, kv_heads: int, head_dim: int = 16, seed: int = 0):
    """Real pool + rows: each request's slots come from SGLang's paged allocator (scattered, page-aligned
    starts), their K/V filled with random values; the query holds every request's new tokens."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    gen = torch.Generator().manual_seed(seed)
    size = 1024
    pool = MHATokenToKVPool(size=size, page_size=page_size, dtype=torch.float32, head_num=kv_heads,
                            head_dim=head_dim, layer_num=1, device="cpu", enable_memory_saver=False)
    allocator = PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", pool, need_sort=False)
    rows = ReqToTokenPool(size=len(REQUESTS), max_context_len=512, device="cpu", enable_memory_saver=False)
    seq_lens = torch.tensor([p + e for p, e in REQUESTS])
    allocator.alloc(3 * page_size)  # the requests' slots do not start at slot 0
    for idx, seq_len in enumerate(seq_lens.tolist()):
        slots = allocator.alloc(-(-seq_len // page_size) * page_size)
        rows.req_to_token[idx, :seq_len] = slots[torch.randperm(len(slots), generator=gen)[:seq_len]]
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape, generator=gen))
    pool.v_buffer[0].copy_(torch.randn(pool.v_buffer[0].shape, generator=gen))
    query = torch.randn(sum(e for _, e in REQUESTS), q_heads, head_dim, generator=gen)
    lens = dict(req_pool_indices=torch.arange(len(REQUESTS)), seq_lens=seq_lens,
                extend_prefix_lens=torch.tensor([p for p, _ in REQUESTS]),
                extend_seq_lens=torch.tensor([e for _, e in REQUESTS]))
    return pool, rows, query, lens


def _upstream(pool, rows, query, lens, gqa: bool) -> torch.Tensor:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)  # the method reads no backend state
    return backend._run_sdpa_forward_extend(query, torch.zeros_like(query), pool.k_buffer[0], pool.v_buffer[0],
                                            rows.req_to_token, lens["req_pool_indices"], lens["seq_lens"],
                                            lens["extend_prefix_lens"], lens["extend_seq_lens"], scaling=0.25,
                                            enable_gqa=gqa, causal=True)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("q_heads,kv_heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_equals_torch_native_extend(page_size, q_heads, kv_heads):
    pool, rows, query, lens = _world(page_size, q_heads, kv_heads)
    gqa = q_heads != kv_heads
    expected = _upstream(pool, rows, query, lens, gqa)
    out = offset_causal_extend(query, torch.zeros_like(query), pool.k_buffer[0], pool.v_buffer[0], rows.req_to_token,
                               scaling=0.25, enable_gqa=gqa, **lens)
    max_abs_diff = (out - expected).abs().max().item()
    assert max_abs_diff < 1e-5, max_abs_diff  # measured: ~5e-7 (float32)
    assert torch.isfinite(out).all()


def test_mask_lets_query_i_see_the_prefix_and_new_tokens_up_to_itself():
    mask = offset_causal_mask(3, 5, "cpu")
    assert mask.tolist() == [[True, True, True, False, False],
                             [True, True, True, True, False],
                             [True, True, True, True, True]]


def test_lengths_that_do_not_add_up_are_refused():
    pool, rows, query, lens = _world(1, 4, 4)
    lens["extend_prefix_lens"] = lens["extend_prefix_lens"] + 1
    with pytest.raises(ValueError, match="request 0: prefix 1 \\+ extend 7 != 7"):
        offset_causal_extend(query, torch.zeros_like(query), pool.k_buffer[0], pool.v_buffer[0], rows.req_to_token,
                             **lens)


@pytest.mark.parametrize("role,threshold,kwargs,ours", [
    ("decode", 64, dict(causal=True), True),
    ("prefill", 64, dict(causal=True), False),                          # prefill keeps upstream's path
    ("decode", 0, dict(causal=True), False),                            # local prefill off
    ("decode", 64, dict(causal=True, sliding_window_size=8), False),    # sliding window: upstream
    ("decode", 64, dict(causal=False), False),                          # encoder-only attention: upstream
])
def test_hook_serves_only_decode_local_causal_extends(pd_state, role, threshold, kwargs, ours):
    from sglang_pd.srt.local_prefill import LocalPrefill
    from sglang_pd.srt.hooks.attention_backend import around_run_sdpa_forward_extend

    pd_state.local_prefill = LocalPrefill(threshold, 256, pd_state.counters)
    pd_state.counters.role = role
    pool, rows, query, lens = _world(1, 4, 4)
    calls = []

    def upstream(backend, *args, **kw):
        calls.append(kw)
        return _upstream(pool, rows, query, lens, False)

    out = around_run_sdpa_forward_extend(upstream, None, query, torch.zeros_like(query), pool.k_buffer[0],
                                         pool.v_buffer[0], rows.req_to_token, lens["req_pool_indices"],
                                         lens["seq_lens"], lens["extend_prefix_lens"], lens["extend_seq_lens"],
                                         scaling=0.25, **kwargs)
    assert (not calls) is ours
    if ours:
        assert (out - _upstream(pool, rows, query, lens, False)).abs().max().item() < 1e-5


def test_a_mixed_forward_splits_into_one_token_rows_and_the_others():
    rows = MixedRows.of([3, 1, 2, 1])
    assert rows == MixedRows(positions=[1, 3], tokens=[3, 6], others=[0, 2], other_tokens=[0, 1, 2, 4, 5])
    assert MixedRows.of([1, 1]).others == [] and MixedRows.of([4]).positions == []
