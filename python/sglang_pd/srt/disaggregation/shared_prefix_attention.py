"""Decode attention by shared physical prefix: a plan built once per forward, run once per layer.

    PrefixGrouping --build_decode_plan--> DecodePlan --shared_prefix_decode(q, K, V)--> output

Per layer, for a batch whose requests share KV segments (prefix_groups.py):
- each segment's K/V is gathered once and attended by all its members' queries together
  (`segment_partial`), keeping the log-sum-exp;
- each request's own part (what no segment covers) is attended in length buckets: own parts of
  similar length are padded to a common length and run as one batched matmul (`padded_partial`);
  a bucket never pads a row to more than 1 / `min_fill` of its length;
- partials are merged exactly (`merge_into`). A request in no segment takes only the own-part path.

Pure torch, no SGLang import; the plan is immutable and reused by every layer of the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_pd.srt.disaggregation.attention_partials import merge_into, padded_partial, segment_partial
from sglang_pd.srt.disaggregation.prefix_groups import PrefixGrouping

DEFAULT_MIN_FILL = 0.5


@dataclass(frozen=True)
class OwnBucket:
    """Requests whose own parts are attended together, padded to `slots.shape[1]` keys."""

    positions: torch.Tensor     # int64 [b] batch positions
    slots: torch.Tensor         # int64 [b, L] own KV slots, padding repeats the last real slot
    bias: torch.Tensor | None   # float32 [b, 1, 1, L]: 0 real, -inf padding; None when unpadded


@dataclass(frozen=True)
class SegmentPlan:
    """One shared segment: its members' batch positions and its KV slots."""

    members: torch.Tensor  # int64 [m]
    slots: torch.Tensor    # int64 [n]


@dataclass(frozen=True)
class DecodePlan:
    """Everything a layer needs to attend one decode batch by shared prefix."""

    batch_size: int
    own_buckets: tuple[OwnBucket, ...]
    empty_own: torch.Tensor  # int64 batch positions whose own part is empty (inside a segment)
    segments: tuple[SegmentPlan, ...]

    @property
    def num_padded_own_tokens(self) -> int:
        """Own-part keys read per layer, padding included."""
        return sum(b.slots.numel() for b in self.own_buckets)


def bucket_by_length(lengths: list[int], min_fill: float = DEFAULT_MIN_FILL) -> list[list[int]]:
    """Indices of non-zero `lengths`, longest first, cut into buckets whose shortest member is at
    least `min_fill` x the bucket's longest (0 < min_fill <= 1)."""
    if not 0 < min_fill <= 1:
        raise ValueError(f"min_fill must be in (0, 1], got {min_fill}")
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] >= min_fill * lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _own_bucket(rows: torch.Tensor, positions: list[int], starts: list[int], lens: list[int]) -> OwnBucket:
    width = max(lens)
    pos = torch.tensor(positions, dtype=torch.int64)
    start = torch.tensor(starts, dtype=torch.int64).unsqueeze(1)
    length = torch.tensor(lens, dtype=torch.int64).unsqueeze(1)
    offsets = torch.arange(width, dtype=torch.int64).unsqueeze(0)
    columns = start + torch.minimum(offsets, length - 1)
    slots = rows[pos].gather(1, columns.to(rows.device)).to(torch.int64)
    bias = None
    if min(lens) < width:
        bias = torch.zeros(len(positions), 1, 1, width, dtype=torch.float32)
        bias.masked_fill_((offsets >= length).view(len(positions), 1, 1, width), float("-inf"))
    return OwnBucket(pos, slots, bias)


def build_decode_plan(grouping: PrefixGrouping, rows: torch.Tensor, min_fill: float = DEFAULT_MIN_FILL) -> DecodePlan:
    """The per-forward plan for `grouping` over `rows` (the same rows it was found on). Read-only."""
    own_lens = grouping.own_lens()
    buckets = tuple(
        _own_bucket(rows, idx, [grouping.own_starts[i] for i in idx], [own_lens[i] for i in idx])
        for idx in bucket_by_length(own_lens, min_fill))
    empty = torch.tensor([i for i, n in enumerate(own_lens) if n == 0], dtype=torch.int64)
    segments = tuple(SegmentPlan(torch.tensor(s.members, dtype=torch.int64), s.slots) for s in grouping.segments)
    return DecodePlan(len(own_lens), buckets, empty, segments)


def shared_prefix_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
                         scale: float) -> torch.Tensor:
    """Decode attention of q [B, Hq, D] over the KV the plan names; returns [B, Hq, Dv] in q's dtype.

    Equal (up to float rounding) to attending each request's whole row on its own. Read-only on the
    KV buffers.
    """
    if q.shape[0] != plan.batch_size:
        raise ValueError(f"plan is for {plan.batch_size} requests, got {q.shape[0]} queries")
    qs = q.float() * scale
    num_q_heads, v_dim = q.shape[1], v_buf.shape[2]
    out = torch.zeros(plan.batch_size, num_q_heads, v_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((plan.batch_size, num_q_heads), float("-inf"), dtype=torch.float32, device=q.device)
    for bucket in plan.own_buckets:
        o, l = padded_partial(qs.index_select(0, bucket.positions), k_buf, v_buf, bucket.slots, bucket.bias)
        out[bucket.positions] = o
        lse[bucket.positions] = l
    for seg in plan.segments:
        o, l = segment_partial(qs.index_select(0, seg.members), k_buf, v_buf, seg.slots)
        merge_into(out, lse, seg.members, o, l)
    return out if q.dtype == torch.float32 else out.to(q.dtype)
