"""The kernels interface `SharedPrefixDecoder` calls, and its CPU implementation.

    DecodeKernels.segment_steps + .index (once per forward) --DecodePlan--> DecodeKernels.attend (per layer)

The plan is device-agnostic (prefix_groups.py finds the segments, own_decode_kernel.own_slots the own
parts' CSR); what a device does with it sits behind `DecodeKernels`:
- `CpuDecodeKernels` (here): segments gathered head-major once and reused between forwards
  (segment_kv_cache.py), attended by torch's fused CPU kernel (partials.py); own parts read in place by
  the C kernel (own_decode_kernel.py), which merges into the segments' accumulators.
- `TritonDecodeKernels` (triton_kernels.py): segments and own parts read in place by slot, merged by
  a Triton kernel; nothing kept between forwards.
Scheduler thread only.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from sglang_pd.srt.attention.own_decode_kernel import OwnDecodeKernel, OwnSlots
from sglang_pd.srt.attention.partials import merge, merge_into, segment_partial
from sglang_pd.srt.attention.prefix_groups import SharedSegment
from sglang_pd.srt.attention.segment_kv_cache import RequestKey, SegmentKVCache, SegmentStep


class DecodeKernels(Protocol):
    """What a device implements for SharedPrefixDecoder."""

    def segment_steps(self, segments: Sequence[SharedSegment], keys: Sequence[RequestKey], continuing: Sequence[bool],
                      pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> tuple[SegmentStep, ...]:
        """This forward's segments as the implementation reads them (may mutate its own cache)."""

    def index(self, segments: Sequence[SegmentStep], own: OwnSlots, batch_size: int, device) -> object:
        """Index tensors every layer of this forward reads (None when the implementation needs none)."""

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan, scale: float,
               average_merge: bool = False) -> torch.Tensor:
        """q [B, Hq, D] (unscaled) of decoder layer `layer` against the plan; new [B, Hq, Dv] in q's dtype.
        Read-only on the pool. `average_merge`: the test fault shared_merge_average (a wrong merge)."""

    def describe(self) -> dict:
        """JSON-able description for /sglang_pd/stats."""


class CpuDecodeKernels:
    """The CPU implementation (module docstring). Holds the segment cache: mutated by segment_steps."""

    def __init__(self, num_kv_heads: int, head_dim: int, own_kernel: OwnDecodeKernel):
        self.head_dim = head_dim
        self.own_kernel = own_kernel
        self.segments = SegmentKVCache(num_kv_heads, head_dim)

    def segment_steps(self, segments, keys, continuing, pool_k, pool_v) -> tuple[SegmentStep, ...]:
        """Segments' KV reused or gathered (SegmentKVCache.plan; mutates the cache)."""
        return self.segments.plan(segments, keys, continuing, pool_k, pool_v)

    def index(self, segments, own, batch_size, device) -> None:
        """The CPU path reads the plan's tensors directly."""
        return None

    def describe(self) -> dict:
        """Which kernels, and the own-part C kernel's build (OwnDecodeKernel.describe)."""
        return {"kernels": "cpu", **self.own_kernel.describe()}

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan, scale: float,
               average_merge: bool = False) -> torch.Tensor:
        """DecodeKernels.attend: segment partials (fused CPU kernel), then the own parts merged in place by
        the C kernel."""
        qs = (q.float() * scale).contiguous()
        out, lse = self._segment_partials(layer, qs, plan)
        if average_merge and plan.segments:
            out = self._averaged(qs, k_buf, v_buf, plan, out, lse)
        else:
            self.own_kernel.merge_own(qs, k_buf, v_buf, plan.own, out, lse)
        return out if q.dtype == torch.float32 else out.to(q.dtype)

    def _averaged(self, qs, k_buf, v_buf, plan, seg_out, seg_lse) -> torch.Tensor:
        """The WRONG merge a power check needs: segment and own partials averaged where both exist,
        weights ignored (read-only on the pool)."""
        own_out, own_lse = torch.zeros_like(seg_out), torch.full_like(seg_lse, float("-inf"))
        self.own_kernel.merge_own(qs, k_buf, v_buf, plan.own, own_out, own_lse)
        both = (torch.isfinite(seg_lse) & torch.isfinite(own_lse)).unsqueeze(-1)
        return torch.where(both, (seg_out + own_out) / 2, seg_out + own_out)

    def _segment_partials(self, layer: int, qs: torch.Tensor, plan) -> tuple[torch.Tensor, torch.Tensor]:
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
