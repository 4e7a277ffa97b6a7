"""Extend attention on CPU: only the extend's own queries, against prefix + extend.

Why: SGLang's `TorchNativeAttnBackend._run_sdpa_forward_extend` builds, per request, a query of the
whole sequence (prefix rows left uninitialised) and runs a causal SDPA of seq_len x seq_len, then
keeps the last extend_len rows. For a local extend (16-64 new tokens after a 400+ token prefix) that
is O(seq_len^2) work for O(extend_len * seq_len) worth of rows: 32.9 ms against 5.8 ms per layer call
for 8 requests of 16 new tokens after 430, one thread (docs/results/local_prefill/extend_attention_micro.json). On decode that time sits
in front of the first token and holds back every decoding request; so decode's local extends use
`offset_causal_extend` (srt/hooks/attention_backend.py), and so does every extend of a server running
the sglang_pd_shared_prefix backend (a prefill server's too). `MixedRows` splits a MIXED forward into its
one-token rows, which that backend attends as decode rows, and the others (`offset_causal_extend_rows`);
SGLang 0.5.23's eager runner hands MIXED batches to backends as EXTEND off NPU / context parallelism, so
a server's mixed local extends take the extend path whole.

Same result as upstream's path for causal self-attention without sliding window or encoder tokens
(the caller leaves the others to upstream): query i of a request attends to keys 0 .. prefix_len + i.
Pure torch, no SGLang import.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.nn.functional import scaled_dot_product_attention


def offset_causal_mask(num_queries: int, seq_len: int, device) -> torch.Tensor:
    """[num_queries, seq_len] bool, True where query i (at position seq_len - num_queries + i) may look."""
    return torch.ones(num_queries, seq_len, dtype=torch.bool, device=device).tril(diagonal=seq_len - num_queries)


def offset_causal_extend(query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
                         scaling: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """Causal extend attention of each request's new tokens; writes `output` (mutates it) and returns it.

    query / output: [num_tokens, q heads, head_dim], requests one after another (extend_seq_lens);
    k_cache / v_cache: [pool slots, kv heads, head_dim]; req_to_token[req_pool_indices[i], :seq_lens[i]]
    are request i's slots, its new tokens' K/V already stored. Raises ValueError when a request's
    prefix + extend lengths do not add up to its sequence length.
    """
    start_q = 0
    for idx in range(seq_lens.shape[0]):
        num_q, seq_len = int(extend_seq_lens[idx]), int(seq_lens[idx])
        if int(extend_prefix_lens[idx]) + num_q != seq_len:
            raise ValueError(f"request {idx}: prefix {int(extend_prefix_lens[idx])} + extend {num_q} != {seq_len}")
        if num_q == 0:
            continue
        slots = req_to_token[req_pool_indices[idx], :seq_len]
        q = query[start_q:start_q + num_q].movedim(0, 1).unsqueeze(0)  # [1, heads, num_q, dim]
        k = k_cache[slots].movedim(0, 1).unsqueeze(0)
        v = v_cache[slots].movedim(0, 1).unsqueeze(0)
        if not (q.dtype == k.dtype == v.dtype):  # as upstream: SDPA wants one dtype
            k, v = k.to(q.dtype), v.to(q.dtype)
        out = scaled_dot_product_attention(q, k, v, attn_mask=offset_causal_mask(num_q, seq_len, q.device),
                                           scale=scaling, enable_gqa=enable_gqa)
        output[start_q:start_q + num_q] = out.squeeze(0).movedim(0, 1)
        start_q += num_q
    return output


def offset_causal_extend_rows(query: torch.Tensor, output: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                              extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor, positions: list[int],
                              tokens: list[int] | None, scaling: float | None = None,
                              enable_gqa: bool = False) -> None:
    """`offset_causal_extend` of batch `positions` only, whose query (and output) rows are `tokens` in
    order (None: every request, all rows). Writes those rows of `output` (mutates it)."""
    if tokens is None:
        offset_causal_extend(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                             extend_prefix_lens, extend_seq_lens, scaling=scaling, enable_gqa=enable_gqa)
        return
    index = torch.tensor(positions, dtype=torch.int64)
    rows = torch.tensor(tokens, dtype=torch.int64, device=query.device)
    pick = lambda t: t[index.to(t.device)]  # noqa: E731
    sub_query = query.index_select(0, rows)
    sub_output = torch.empty_like(sub_query)
    offset_causal_extend(sub_query, sub_output, k_cache, v_cache, req_to_token, pick(req_pool_indices), pick(seq_lens),
                         pick(extend_prefix_lens), pick(extend_seq_lens), scaling=scaling, enable_gqa=enable_gqa)
    output.index_copy_(0, rows, sub_output.to(output.dtype))


class MixedRows(NamedTuple):
    """A mixed forward's rows: the one-token ones (decoding requests) and the others (extends)."""

    positions: list[int]     # batch positions of one-token rows
    tokens: list[int]        # their query rows
    others: list[int]        # batch positions of the other rows
    other_tokens: list[int]  # their query rows, in order

    @classmethod
    def of(cls, extend_lens: list[int]) -> "MixedRows":
        """Split a batch whose request i computes `extend_lens[i]` new tokens."""
        positions, tokens, others, other_tokens, start = [], [], [], [], 0
        for i, n in enumerate(extend_lens):
            if n == 1:
                positions.append(i)
                tokens.append(start)
            else:
                others.append(i)
                other_tokens.extend(range(start, start + n))
            start += n
        return cls(positions, tokens, others, other_tokens)
