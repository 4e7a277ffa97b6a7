"""Partial attention results and their exact merge (the online-softmax identity).

A partial result over a subset of a query's keys is (o, lse): the softmax-weighted mean of those
values and the log-sum-exp of those scores. Two partials over disjoint key sets merge exactly into
the result over their union:

    lse = log(exp(lse_a) + exp(lse_b)),  o = (exp(lse_a - lse) o_a + exp(lse_b - lse) o_b)

An empty key set is the partial (o = 0, lse = -inf), which the merge leaves out.

Shapes: q [num_queries, num_q_heads, head_dim] already multiplied by the softmax scale; the KV pool
buffers [pool_tokens, num_kv_heads, head_dim] as SGLang's MHATokenToKVPool holds them; query head h
reads kv head h // (num_q_heads / num_kv_heads) (GQA/MQA). Math in float32. Pure torch, read-only on
its inputs except `merge_into`, which updates its accumulators in place.
"""

from __future__ import annotations

import torch


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [n, Hq, D] -> [n, Hkv, G, D] (G query heads per kv head)."""
    n, num_q_heads, dim = q.shape
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not split over {num_kv_heads} kv heads")
    return q.view(n, num_kv_heads, num_q_heads // num_kv_heads, dim)


def _gather(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows `slots` of a KV buffer as float32 (one copy; index_select is the fast gather on CPU)."""
    rows = buf.index_select(0, slots)
    return rows if rows.dtype == torch.float32 else rows.float()


def segment_partial(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                    slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All queries of `q` [m, Hq, D] against the same keys `slots` [n >= 1]: (o [m, Hq, Dv], lse [m, Hq]).

    The segment's K and V are read once for all m queries: one [Hkv, m*G, n] score matrix.
    """
    m, num_q_heads, _ = q.shape
    num_kv_heads = k_buf.shape[1]
    qg = _grouped(q, num_kv_heads)
    group = qg.shape[2]
    qh = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, m * group, -1)
    keys = _gather(k_buf, slots).permute(1, 2, 0)      # [Hkv, D, n]
    values = _gather(v_buf, slots).permute(1, 0, 2)    # [Hkv, n, Dv]
    scores = torch.matmul(qh, keys)                    # [Hkv, m*G, n]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), values)
    out = out.view(num_kv_heads, m, group, -1).permute(1, 0, 2, 3).reshape(m, num_q_heads, -1)
    return out, lse.view(num_kv_heads, m, group).permute(1, 0, 2).reshape(m, num_q_heads)


def padded_partial(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                   bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query against its own keys: q [b, Hq, D], slots [b, L] (padding masked by `bias`).

    `bias` [b, 1, 1, L] is 0 on real keys and -inf on padding (None: no padding); every row needs at
    least one real key. Returns (o [b, Hq, Dv], lse [b, Hq]).
    """
    b, num_q_heads, _ = q.shape
    num_kv_heads = k_buf.shape[1]
    length = slots.shape[1]
    qg = _grouped(q, num_kv_heads)                                          # [b, Hkv, G, D]
    keys = _gather(k_buf, slots.reshape(-1)).view(b, length, num_kv_heads, -1).permute(0, 2, 3, 1)
    values = _gather(v_buf, slots.reshape(-1)).view(b, length, num_kv_heads, -1).permute(0, 2, 1, 3)
    scores = torch.matmul(qg, keys)                                         # [b, Hkv, G, L]
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), values)      # [b, Hkv, G, Dv]
    return out.reshape(b, num_q_heads, -1), lse.reshape(b, num_q_heads)


def merge_into(out: torch.Tensor, lse: torch.Tensor, index: torch.Tensor, part_out: torch.Tensor,
               part_lse: torch.Tensor) -> None:
    """Merge a partial (part_out [k, Hq, Dv], part_lse [k, Hq], finite) into rows `index` of the
    accumulators out [B, Hq, Dv] / lse [B, Hq] (mutates both; -inf accumulator rows are empty)."""
    acc_out, acc_lse = out[index], lse[index]
    top = torch.maximum(acc_lse, part_lse)
    w_acc = torch.exp(acc_lse - top)
    w_part = torch.exp(part_lse - top)
    total = w_acc + w_part
    out[index] = (acc_out * w_acc.unsqueeze(-1) + part_out * w_part.unsqueeze(-1)) / total.unsqueeze(-1)
    lse[index] = top + torch.log(total)
