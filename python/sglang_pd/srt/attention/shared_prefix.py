"""Decode attention by shared physical prefix: a plan built once per forward, run once per layer.

    SharedPrefixDecoder.plan(grouping, rows, keys) --DecodePlan--> SharedPrefixDecoder.attend(layer, q) per layer

For a batch whose requests share KV segments (prefix_groups.py), per layer:
- each segment is attended by all its members' queries together (`segment_partial`, torch's fused
  CPU attention kernel), its KV read from SegmentKVCache (gathered once, reused while the segment
  lasts), keeping the log-sum-exp; the partials accumulate per request (exact merge);
- each request's own part (what no segment covers) is read in place from the pool by one C call for
  the whole batch (own_decode_kernel.py), which merges it into those accumulators.
A request in no segment takes only the own-part path.

`SharedPrefixDecoder` keeps what lives across forwards: which request (rid, row, row generation) was in
the previous decode forward with which seq_len (the segment cache reuses a segment only through a
continuing member) and the segment cache. Nothing else is kept between steps: own parts are read from the pool every layer.
No SGLang import; the plan is immutable and serves every layer of its forward. Scheduler thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from sglang_pd.srt.attention.partials import merge, merge_into, segment_partial
from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots, own_slots
from sglang_pd.srt.attention.prefix_groups import PrefixGrouping
from sglang_pd.srt.attention.segment_kv_cache import RequestKey, SegmentKVCache, SegmentStep


@dataclass(frozen=True)
class DecodePlan:
    """Everything a layer needs to attend one decode batch by shared prefix."""

    batch_size: int
    segments: tuple[SegmentStep, ...]
    own: OwnSlots

    @property
    def num_own_tokens(self) -> int:
        """Own-part keys a layer reads from the pool (no padding)."""
        return self.own.num_tokens

    @property
    def num_gathered_segment_tokens(self) -> int:
        """Segment tokens gathered from the pool for this forward (not reused)."""
        return sum(s.num_tokens for s in self.segments if s.gathered)


class SharedPrefixDecoder:
    """Plans and runs shared-prefix decode attention over one KV pool's layers (module docstring)."""

    def __init__(self, num_kv_heads: int, head_dim: int, kernel: OwnDecodeKernel):
        """A decoder for pool buffers of [slots, num_kv_heads, head_dim] (the decoder's layer index is the
        position in the lists `plan` takes)."""
        self.head_dim = head_dim
        self.kernel = kernel
        self.segments = SegmentKVCache(num_kv_heads, head_dim)
        self._previous: dict[RequestKey, int] = {}  # the previous decode forward: key -> seq_len
        self.average_merge = False  # test fault (shared_merge_average): partials averaged, not LSE-merged

    def plan(self, grouping: PrefixGrouping, rows: torch.Tensor, keys: Sequence[RequestKey],
             pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> DecodePlan:
        """The plan of one decode forward: `grouping` found on `rows` (rows[i, :seq_len] = batch
        position i's slots, this step's token last), `keys` naming each position's request, pool_k /
        pool_v each layer's pool buffers. Mutates the segment cache and the record of the previous forward."""
        if len(keys) != len(grouping.seq_lens):
            raise ValueError(f"{len(keys)} request keys for a batch of {len(grouping.seq_lens)}")
        continuing = [self._previous.get(key) == seq_len - 1 for key, seq_len in zip(keys, grouping.seq_lens)]
        self._previous = dict(zip(keys, grouping.seq_lens))
        segments = self.segments.plan(grouping.segments, keys, continuing, pool_k, pool_v)
        return DecodePlan(len(keys), segments, own_slots(rows, grouping.own_starts, grouping.seq_lens))

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
               scale: float) -> torch.Tensor:
        """Decode attention of q [B, Hq, D] for decoder layer `layer` whose pool buffers are k_buf /
        v_buf, after SGLang stored this step's K/V there; returns [B, Hq, Dv] in q's dtype. Equal (up
        to float rounding) to attending each request's whole row on its own. Read-only on the pool."""
        if q.shape[0] != plan.batch_size:
            raise ValueError(f"plan is for {plan.batch_size} requests, got {q.shape[0]} queries")
        qs = (q.float() * scale).contiguous()
        out, lse = self._segment_partials(layer, qs, plan)
        if self.average_merge and plan.segments:
            out = self._averaged(qs, k_buf, v_buf, plan, out, lse)
        else:
            self.kernel.merge_own(qs, k_buf, v_buf, plan.own, out, lse)
        return out if q.dtype == torch.float32 else out.to(q.dtype)

    def _averaged(self, qs, k_buf, v_buf, plan: DecodePlan, seg_out, seg_lse) -> torch.Tensor:
        """The WRONG merge a power check needs: segment and own partials averaged where both exist,
        weights ignored (read-only on the pool)."""
        own_out, own_lse = torch.zeros_like(seg_out), torch.full_like(seg_lse, float("-inf"))
        self.kernel.merge_own(qs, k_buf, v_buf, plan.own, own_out, own_lse)
        both = (torch.isfinite(seg_lse) & torch.isfinite(own_lse)).unsqueeze(-1)
        return torch.where(both, (seg_out + own_out) / 2, seg_out + own_out)

    def _segment_partials(self, layer: int, qs: torch.Tensor, plan: DecodePlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous accumulators (out [B, Hq, Dv], lse [B, Hq]) holding every request's partial over
        its segments (o = 0, lse = -inf for a request in none)."""
        out = lse = None
        for seg in plan.segments:
            whole = seg.members.numel() == plan.batch_size  # members are ascending: the whole batch in order
            o, l = segment_partial(qs if whole else qs.index_select(0, seg.members), seg.k[layer], seg.v[layer])
            if out is None and whole:
                out, lse = o.contiguous(), l.contiguous()
                continue
            if out is None:
                out = qs.new_zeros(qs.shape[0], qs.shape[1], self.head_dim)
                lse = qs.new_full(qs.shape[:2], float("-inf"))
            if whole:
                out, lse = (t.contiguous() for t in merge(out, lse, o, l))
            else:
                merge_into(out, lse, seg.members, o, l)
        if out is None:
            return qs.new_zeros(qs.shape[0], qs.shape[1], self.head_dim), qs.new_full(qs.shape[:2], float("-inf"))
        return out, lse
