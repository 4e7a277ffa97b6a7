"""Decode attention by shared physical prefix: a plan built once per forward, run once per layer.

    SharedPrefixDecoder.plan(grouping, rows, keys) --DecodePlan--> SharedPrefixDecoder.attend(layer, q) per layer

For a batch whose requests share KV segments (prefix_groups.py), per layer:
- each segment is attended by all its members' queries together (`segment_partial`), its KV read
  from SegmentKVCache (gathered once, reused while the segment lasts), keeping the log-sum-exp;
- each request's own part (what no segment covers) is attended from OwnKVArena in place: the rows of
  one band are one fused attention call (`rows_partial`); this step's token is first copied into the
  arena from the pool. An own part the arena's budget cannot hold is gathered from the pool into a reused
  workspace every layer, in length buckets (padded to at most 1 / `min_fill` of its length);
- partials are merged exactly (`merge`). A request in no segment takes only the own-part path.

`SharedPrefixDecoder` keeps what lives across forwards (which request was in the previous decode
forward with which seq_len, the arena, the segment cache, the workspace). Pure torch, no SGLang
import; the plan is immutable and serves every layer of its forward. Scheduler thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from sglang_pd.srt.disaggregation.attention_partials import merge, merge_into, rows_partial, segment_partial
from sglang_pd.srt.disaggregation.own_kv_arena import ArenaStep, OwnKVArena, OwnPart, RequestKey
from sglang_pd.srt.disaggregation.prefix_groups import PrefixGrouping
from sglang_pd.srt.disaggregation.segment_kv_cache import SegmentKVCache, SegmentStep

DEFAULT_MIN_FILL = 0.8


@dataclass(frozen=True)
class OwnBucket:
    """Own parts gathered from the pool and attended together, padded to `slots.shape[1]` keys."""

    positions: torch.Tensor     # int64 [b] batch positions
    slots: torch.Tensor         # int64 [b, L] own KV slots, padding repeats the last real slot
    bias: torch.Tensor | None   # float32 [b, 1, 1, L]: 0 real, -inf padding; None when unpadded
    offset: int                 # where its rows start in the gathered workspace (rows of [*, D])


@dataclass(frozen=True)
class DecodePlan:
    """Everything a layer needs to attend one decode batch by shared prefix."""

    batch_size: int
    arena: ArenaStep
    gathered: tuple[OwnBucket, ...]  # own parts the arena does not hold
    gather_rows: torch.Tensor        # int64: pool rows ([slots * Hkv, D] view) of `gathered`, request-major
    segments: tuple[SegmentStep, ...]
    own_positions: torch.Tensor      # int64: batch positions of the own-part partials, arena bands then `gathered`
    own_inverse: torch.Tensor | None  # where each batch position is in own_positions; None: not every one is

    @property
    def num_own_tokens(self) -> int:
        """Own-part keys a layer reads, padding included."""
        return self.arena.num_read_tokens + self.num_gathered_own_tokens

    @property
    def num_gathered_own_tokens(self) -> int:
        """Own-part keys a layer gathers from the pool (arena budget full), padding included."""
        return sum(b.slots.numel() for b in self.gathered)

    @property
    def num_gathered_segment_tokens(self) -> int:
        """Segment tokens gathered from the pool for this forward (not reused)."""
        return sum(s.num_tokens for s in self.segments if s.gathered)


class KVWorkspace:
    """Reused buffers the gathered keys and values of a layer land in (grown on demand).

    Not thread-safe; one per decoder. A view it returns is valid until the next `views` call."""

    def __init__(self):
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def views(self, k_rows: torch.Tensor, v_rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uninitialised [num_rows, dim] views typed like the pool's head rows `k_rows` / `v_rows`."""
        self._k = self._fit(self._k, k_rows, num_rows)
        self._v = self._fit(self._v, v_rows, num_rows)
        return self._k[:num_rows], self._v[:num_rows]

    @staticmethod
    def _fit(ws: torch.Tensor | None, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
        if ws is not None and ws.shape[0] >= num_rows and ws.shape[1:] == rows.shape[1:] and ws.dtype == rows.dtype:
            return ws
        return torch.empty((max(num_rows, 2 * (0 if ws is None else ws.shape[0])), *rows.shape[1:]),
                           dtype=rows.dtype, device=rows.device)


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


def _own_bucket(rows: torch.Tensor, positions: list[int], starts: list[int], lens: list[int],
                offset: int) -> OwnBucket:
    width = max(lens)
    pos = torch.tensor(positions, dtype=torch.int64)
    start = torch.tensor(starts, dtype=torch.int64).unsqueeze(1)
    length = torch.tensor(lens, dtype=torch.int64).unsqueeze(1)
    offsets = torch.arange(width, dtype=torch.int64).unsqueeze(0)
    columns = start + torch.minimum(offsets, length - 1)
    slots = rows[pos].gather(1, columns.to(rows.device)).to(torch.int64)
    bias = None
    if min(lens) < width:
        bias = torch.zeros(len(positions), width, dtype=torch.float32)
        bias = bias.masked_fill_(offsets >= length, float("-inf")).view(len(positions), 1, 1, width)
    return OwnBucket(pos, slots, bias, offset)


def gathered_buckets(grouping: PrefixGrouping, rows: torch.Tensor, positions: Sequence[int], num_kv_heads: int,
                     min_fill: float = DEFAULT_MIN_FILL) -> tuple[tuple[OwnBucket, ...], torch.Tensor]:
    """Length buckets of the own parts of batch `positions` and the pool rows ([slots * Hkv, D]
    view) to gather for them, request-major (request, kv head, token). Read-only."""
    own_lens, wanted = grouping.own_lens(), set(positions)
    lengths = [n if i in wanted else 0 for i, n in enumerate(own_lens)]
    buckets, pieces, offset = [], [], 0
    heads = torch.arange(num_kv_heads, dtype=torch.int64).view(1, -1, 1)
    for idx in bucket_by_length(lengths, min_fill):
        bucket = _own_bucket(rows, idx, [grouping.own_starts[i] for i in idx], [own_lens[i] for i in idx], offset)
        b, width = bucket.slots.shape
        pieces.append((bucket.slots.view(b, 1, width) * num_kv_heads + heads).reshape(-1))
        buckets.append(bucket)
        offset += pieces[-1].numel()
    gather = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)
    return tuple(buckets), gather


class SharedPrefixDecoder:
    """Plans and runs shared-prefix decode attention over one KV pool's layers (module docstring)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, arena_budget_tokens: int,
                 min_fill: float = DEFAULT_MIN_FILL):
        """A decoder for a KV pool of `num_layers` layers of [slots, num_kv_heads, head_dim] buffers (the
        decoder's layer index is the position in the lists `plan` takes)."""
        self.num_kv_heads, self.head_dim, self.min_fill = num_kv_heads, head_dim, min_fill
        self.arena = OwnKVArena(num_layers, num_kv_heads, head_dim, arena_budget_tokens)
        self.segments = SegmentKVCache(num_kv_heads, head_dim)
        self.workspace = KVWorkspace()
        self._previous: dict[RequestKey, int] = {}  # the previous decode forward: key -> seq_len

    def plan(self, grouping: PrefixGrouping, rows: torch.Tensor, keys: Sequence[RequestKey],
             pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> DecodePlan:
        """The plan of one decode forward: `grouping` found on `rows` (rows[i, :seq_len] = batch
        position i's slots, this step's token last), `keys` naming each position's request, pool_k /
        pool_v each layer's pool buffers. Mutates the arena, the segment cache and the record of the
        previous forward."""
        if len(keys) != len(grouping.seq_lens):
            raise ValueError(f"{len(keys)} request keys for a batch of {len(grouping.seq_lens)}")
        parts = [OwnPart(key, start, seq_len, self._previous.get(key) == seq_len - 1)
                 for key, start, seq_len in zip(keys, grouping.own_starts, grouping.seq_lens)]
        self._previous = {key: seq_len for key, seq_len in zip(keys, grouping.seq_lens)}
        arena = self.arena.plan(parts, rows, pool_k, pool_v)
        gathered, gather_rows = gathered_buckets(grouping, rows, arena.overflow, self.num_kv_heads, self.min_fill)
        segments = self.segments.plan(grouping.segments, parts, pool_k, pool_v)
        own_positions = torch.cat([arena.positions, *(b.positions for b in gathered)])
        inverse = None
        if own_positions.numel() == len(keys):  # each position at most once: a permutation of the batch
            inverse = torch.empty_like(own_positions)
            inverse[own_positions] = torch.arange(len(keys), dtype=torch.int64)
        return DecodePlan(len(keys), arena, gathered, gather_rows, segments, own_positions, inverse)

    def attend(self, layer: int, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
               scale: float) -> torch.Tensor:
        """Decode attention of q [B, Hq, D] for decoder layer `layer` whose pool buffers are k_buf /
        v_buf, after SGLang stored this step's K/V there; returns [B, Hq, Dv] in q's dtype. Equal (up
        to float rounding) to attending each request's whole row on its own. Writes this step's token
        into the arena (mutates it)."""
        if q.shape[0] != plan.batch_size:
            raise ValueError(f"plan is for {plan.batch_size} requests, got {q.shape[0]} queries")
        self.arena.write_step_kv(layer, plan.arena, k_buf, v_buf)
        qs = q.float() * scale
        out, lse = self._own_parts(layer, qs, k_buf, v_buf, plan)
        for seg in plan.segments:
            whole = seg.members.numel() == plan.batch_size  # members are ascending: the whole batch in order
            o, l = segment_partial(qs if whole else qs.index_select(0, seg.members), seg.k[layer], seg.v[layer])
            if whole:
                out, lse = merge(out, lse, o, l)
            else:
                merge_into(out, lse, seg.members, o, l)
        return out if q.dtype == torch.float32 else out.to(q.dtype)

    def _own_parts(self, layer: int, qs: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                   plan: DecodePlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Accumulators (out [B, Hq, Dv], lse [B, Hq]) holding every request's own-part partial
        (o = 0, lse = -inf for a request with no own part)."""
        outs, lses = [], []
        if plan.arena.bands:
            q_rows = qs.index_select(0, plan.arena.positions)
            for band in plan.arena.bands:
                keys, values = self.arena.band_kv(layer, band)
                o, l = rows_partial(q_rows[band.offset:band.offset + band.positions.numel()], keys, values, band.bias)
                outs.append(o)
                lses.append(l)
        if plan.gathered:
            self._attend_gathered(k_buf, v_buf, qs, plan, outs, lses)
        if not outs:
            return (qs.new_zeros(qs.shape[0], qs.shape[1], self.head_dim),
                    qs.new_full((qs.shape[0], qs.shape[1]), float("-inf")))
        o, l = (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs), torch.cat(lses))
        if plan.own_inverse is not None:  # every request has an own part: a permutation
            return o.index_select(0, plan.own_inverse), l.index_select(0, plan.own_inverse)
        out = qs.new_zeros(qs.shape[0], qs.shape[1], self.head_dim).index_copy_(0, plan.own_positions, o)
        return out, qs.new_full((qs.shape[0], qs.shape[1]), float("-inf")).index_copy_(0, plan.own_positions, l)

    def _attend_gathered(self, k_buf: torch.Tensor, v_buf: torch.Tensor, qs: torch.Tensor, plan: DecodePlan,
                         outs: list[torch.Tensor], lses: list[torch.Tensor]) -> None:
        """Own parts the arena does not hold, gathered from the pool: their partials appended to outs /
        lses, bucket after bucket (the order of DecodePlan.own_positions)."""
        k_rows, v_rows = k_buf.view(-1, self.head_dim), v_buf.view(-1, self.head_dim)
        keys, values = self.workspace.views(k_rows, v_rows, plan.gather_rows.numel())
        torch.index_select(k_rows, 0, plan.gather_rows, out=keys)
        torch.index_select(v_rows, 0, plan.gather_rows, out=values)
        keys, values = keys.float(), values.float()
        for bucket in plan.gathered:
            b, width = bucket.slots.shape
            num_rows = b * self.num_kv_heads * width
            piece = lambda t: t[bucket.offset:bucket.offset + num_rows].view(b, self.num_kv_heads, width, -1)  # noqa: E731
            o, l = rows_partial(qs.index_select(0, bucket.positions), piece(keys), piece(values), bucket.bias)
            outs.append(o)
            lses.append(l)
