"""Partial attention results and their exact merge (the online-softmax identity).

A partial result over a subset of a query's keys is (o, lse): the softmax-weighted mean of those
values and the log-sum-exp of those scores. Two partials over disjoint key sets merge exactly into
the result over their union:

    lse = lse_b + softplus(lse_a - lse_b),  o = o_b + sigmoid(lse_a - lse_b) (o_a - o_b)

(the usual exp-weighted form rewritten so that the merge is a lerp). An empty key set is the partial
(o = 0, lse = -inf), which the merge leaves out.

Shapes: q [num_queries, num_q_heads, head_dim] already multiplied by the softmax scale; query head h
reads kv head h // (num_q_heads / num_kv_heads) (GQA/MQA). A shared segment's keys and values are
HEAD-major, [num_kv_heads, tokens, head_dim]: all members' queries against it. (Requests' own parts
are read in place from the pool by the C kernel, own_decode_kernel.py, which merges the same way.)

The segment partial runs torch's fused CPU attention kernel (`aten::_scaled_dot_product_flash_attention_for_cpu`,
the kernel `scaled_dot_product_attention` dispatches to on CPU, which also returns the log-sum-exp
this merge needs): one call replaces the ~10 tensor ops of a matmul + softmax + matmul and reads the
keys and values in cache-sized blocks. It is a torch-internal op: the backend refuses to start when
the installed torch lacks it (`missing_kernel`); unit tests compare every partial with plain softmax
attention.
All tensors float32. Pure torch, read-only on its inputs except `merge_into`, which updates its
accumulators in place.
"""

from __future__ import annotations

import torch

_KERNEL_NAME = "_scaled_dot_product_flash_attention_for_cpu"


def missing_kernel() -> str | None:
    """Why the fused CPU attention kernel cannot be used with this torch, or None."""
    if not hasattr(torch.ops.aten, _KERNEL_NAME):
        return f"torch {torch.__version__} has no aten::{_KERNEL_NAME} (the fused CPU attention kernel)"
    return None


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, M, D], keys/values [B, H, N, D] (mask broadcastable to [B, H, M, N], additive):
    (softmax(q k^T + mask) v [B, H, M, Dv], logsumexp [B, H, M]); q carries the scale."""
    kernel = getattr(torch.ops.aten, _KERNEL_NAME)
    out, lse = kernel(q, keys, values, attn_mask=mask, scale=1.0)
    return out, lse


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [n, Hq, D] -> [n, Hkv, G, D] (G query heads per kv head)."""
    n, num_q_heads, dim = q.shape
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads do not split over {num_kv_heads} kv heads")
    return q.view(n, num_kv_heads, num_q_heads // num_kv_heads, dim)


def segment_partial(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All queries of `q` [m, Hq, D] against the same keys [Hkv, n >= 1, D] / values [Hkv, n, Dv].

    Returns (o [m, Hq, Dv], lse [m, Hq]). The segment is read once for all m queries (per kv head,
    one [m*G, n] score block)."""
    m, num_q_heads, _ = q.shape
    num_kv_heads = keys.shape[0]
    qg = _grouped(q, num_kv_heads)
    group = qg.shape[2]
    qh = qg.permute(1, 0, 2, 3).reshape(1, num_kv_heads, m * group, -1)
    out, lse = _attend(qh, keys.unsqueeze(0), values.unsqueeze(0), None)       # [1, Hkv, m*G, Dv], [1, Hkv, m*G]
    out = out.view(num_kv_heads, m, group, -1).permute(1, 0, 2, 3).reshape(m, num_q_heads, -1)
    return out, lse.reshape(num_kv_heads, m, group).permute(1, 0, 2).reshape(m, num_q_heads)


def merge(acc_out: torch.Tensor, acc_lse: torch.Tensor, part_out: torch.Tensor,
          part_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial over both key sets, (out [k, Hq, Dv], lse [k, Hq]), from an accumulated partial
    (acc_out, acc_lse: -inf rows are empty) and a finite one (part_out, part_lse). Read-only."""
    gap = acc_lse - part_lse                              # -inf where the accumulator is empty
    out = torch.lerp(part_out, acc_out, torch.sigmoid(gap).unsqueeze(-1))
    return out, torch.nn.functional.softplus(gap).add_(part_lse)


def merge_into(out: torch.Tensor, lse: torch.Tensor, index: torch.Tensor, part_out: torch.Tensor,
               part_lse: torch.Tensor) -> None:
    """`merge` into rows `index` of the accumulators out [B, Hq, Dv] / lse [B, Hq] (mutates both)."""
    out[index], lse[index] = merge(out[index], lse[index], part_out, part_lse)
