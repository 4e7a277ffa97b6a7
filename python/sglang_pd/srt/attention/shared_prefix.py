"""Decode attention by shared physical prefix: a plan built once per forward, run once per layer.

    SharedPrefixDecoder.plan(grouping, rows, keys) --DecodePlan--> SharedPrefixDecoder.attend(layer, q) per layer

For a batch whose requests share KV segments (prefix_groups.py), per layer: each segment is attended
by all its members' queries together, keeping the log-sum-exp; each request's own part (what no segment
covers) is read in place from the pool; the partials merge exactly per request. A request in no segment
takes only the own-part path. How a device does this is a `DecodeKernels` implementation
(decode_kernels.py): `CpuDecodeKernels` (torch's fused CPU kernel on gathered segments + the C own-part
kernel) or `TritonDecodeKernels` (triton_kernels.py, segments and own parts read in place). The plan
(grouping, segments, own-part CSR, the implementation's index tensors) is built once per forward and is
the same for both.

`SharedPrefixDecoder` keeps what lives across forwards: which request (rid, row, row generation) was in
the previous decode forward with which seq_len (the CPU segment cache reuses a segment only through a
continuing member). No SGLang import; the plan is immutable and serves every layer of its forward.
Scheduler thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from sglang_pd.srt.attention.decode_kernels import DecodeKernels
from sglang_pd.srt.attention.own_decode_kernel import OwnSlots, own_slots
from sglang_pd.srt.attention.prefix_groups import PrefixGrouping
from sglang_pd.srt.attention.segment_kv_cache import RequestKey, SegmentStep


@dataclass(frozen=True)
class DecodePlan:
    """Everything a layer needs to attend one decode batch by shared prefix."""

    batch_size: int
    segments: tuple[SegmentStep, ...]
    own: OwnSlots
    index: object = None  # the kernels' index tensors of this forward (DecodeKernels.index)

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

    def __init__(self, kernels: DecodeKernels):
        """A decoder whose layers are attended by `kernels` (the decoder's layer index is the position in
        the lists `plan` takes)."""
        self.kernels = kernels
        self._previous: dict[RequestKey, int] = {}  # the previous decode forward: key -> seq_len
        self.average_merge = False  # test fault (shared_merge_average): partials averaged, not LSE-merged

    def plan(self, grouping: PrefixGrouping, rows: torch.Tensor, keys: Sequence[RequestKey],
             pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> DecodePlan:
        """The plan of one decode forward: `grouping` found on `rows` (rows[i, :seq_len] = batch
        position i's slots, this step's token last), `keys` naming each position's request, pool_k /
        pool_v each layer's pool buffers. Mutates the kernels' segment cache (CPU) and the record of the
        previous forward."""
        if len(keys) != len(grouping.seq_lens):
            raise ValueError(f"{len(keys)} request keys for a batch of {len(grouping.seq_lens)}")
        continuing = [self._previous.get(key) == seq_len - 1 for key, seq_len in zip(keys, grouping.seq_lens)]
        self._previous = dict(zip(keys, grouping.seq_lens))
        segments = self.kernels.segment_steps(grouping.segments, keys, continuing, pool_k, pool_v)
        own = own_slots(rows, grouping.own_starts, grouping.seq_lens)
        device = pool_k[0].device if pool_k else rows.device
        return DecodePlan(len(keys), segments, own, self.kernels.index(segments, own, len(keys), device))

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
               scale: float) -> torch.Tensor:
        """Decode attention of q [B, Hq, D] for decoder layer `layer` whose pool buffers are k_buf /
        v_buf, after SGLang stored this step's K/V there; returns [B, Hq, Dv] in q's dtype. Equal (up
        to float rounding) to attending each request's whole row on its own. Read-only on the pool."""
        if q.shape[0] != plan.batch_size:
            raise ValueError(f"plan is for {plan.batch_size} requests, got {q.shape[0]} queries")
        return self.kernels.attend(layer, q, k_buf, v_buf, plan, scale, self.average_merge)
