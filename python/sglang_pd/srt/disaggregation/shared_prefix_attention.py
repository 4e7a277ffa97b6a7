"""Decode attention by shared physical prefix: a plan built once per forward, run once per layer.

    PrefixGrouping --build_decode_plan--> DecodePlan --shared_prefix_decode(q, K, V)--> output

Per layer, for a batch whose requests share KV segments (prefix_groups.py):
- every key the layer needs is gathered from the KV pool in one `index_select` per buffer into a
  reused workspace (each segment once, each own part once), head-major: the pool's rows are viewed
  as [slots * num_kv_heads, head_dim] and row slot * num_kv_heads + h lands in head h's block. The
  gather is the memory traffic that dominates CPU decode attention; a fresh allocation per layer
  would add page faults;
- each segment is attended by all its members' queries together (`segment_partial`), keeping the
  log-sum-exp;
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

DEFAULT_MIN_FILL = 0.8


@dataclass(frozen=True)
class OwnBucket:
    """Requests whose own parts are attended together, padded to `slots.shape[1]` keys."""

    positions: torch.Tensor     # int64 [b] batch positions
    slots: torch.Tensor         # int64 [b, L] own KV slots, padding repeats the last real slot
    bias: torch.Tensor | None   # float32 [b, 1, L]: 0 real, -inf padding; None when unpadded
    offset: int                 # where its keys start in the plan's gathered workspace (tokens)


@dataclass(frozen=True)
class SegmentPlan:
    """One shared segment: its members' batch positions and its KV slots."""

    members: torch.Tensor  # int64 [m]
    slots: torch.Tensor    # int64 [n]
    offset: int            # where its keys start in the plan's gathered workspace (tokens)


@dataclass(frozen=True)
class DecodePlan:
    """Everything a layer needs to attend one decode batch by shared prefix."""

    batch_size: int
    num_kv_heads: int
    own_buckets: tuple[OwnBucket, ...]
    segments: tuple[SegmentPlan, ...]
    gather_rows: torch.Tensor  # int64: rows of the pool viewed [slots * Hkv, D], head-major per piece
    num_gathered: int          # tokens gathered per layer (own buckets' slots, then segments')

    @property
    def num_padded_own_tokens(self) -> int:
        """Own-part keys read per layer, padding included."""
        return sum(b.slots.numel() for b in self.own_buckets)


class KVWorkspace:
    """Reused buffers the gathered keys and values of a layer land in (grown on demand).

    Not thread-safe; one per backend. A view it returns is valid until the next `views` call."""

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


def _head_rows(slots: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """Pool rows [Hkv * len(slots)] of `slots` in the [slots * Hkv, D] view, head-major."""
    heads = torch.arange(num_kv_heads, dtype=torch.int64).unsqueeze(1)
    return (slots.reshape(1, -1) * num_kv_heads + heads).reshape(-1)


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
        bias = torch.zeros(len(positions), 1, width, dtype=torch.float32)
        bias.masked_fill_((offsets >= length).view(len(positions), 1, width), float("-inf"))
    return OwnBucket(pos, slots, bias, offset)


def build_decode_plan(grouping: PrefixGrouping, rows: torch.Tensor, num_kv_heads: int,
                      min_fill: float = DEFAULT_MIN_FILL) -> DecodePlan:
    """The per-forward plan for `grouping` over `rows` (the same rows it was found on), for a KV pool
    of `num_kv_heads` heads. Read-only."""
    own_lens = grouping.own_lens()
    buckets, offset = [], 0
    for idx in bucket_by_length(own_lens, min_fill):
        bucket = _own_bucket(rows, idx, [grouping.own_starts[i] for i in idx], [own_lens[i] for i in idx], offset)
        buckets.append(bucket)
        offset += bucket.slots.numel()
    segments = []
    for seg in grouping.segments:
        segments.append(SegmentPlan(torch.tensor(seg.members, dtype=torch.int64), seg.slots, offset))
        offset += seg.num_tokens
    pieces = [_head_rows(b.slots, num_kv_heads) for b in buckets] + [_head_rows(s.slots, num_kv_heads) for s in segments]
    gather = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)
    return DecodePlan(len(own_lens), num_kv_heads, tuple(buckets), tuple(segments), gather, offset)


def _piece(rows: torch.Tensor, num_kv_heads: int, offset: int, num_tokens: int) -> torch.Tensor:
    """A piece's gathered rows as [Hkv, num_tokens, D] (a view)."""
    return rows[offset * num_kv_heads:(offset + num_tokens) * num_kv_heads].view(num_kv_heads, num_tokens, -1)


def shared_prefix_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, plan: DecodePlan,
                         scale: float, workspace: KVWorkspace | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, D] over the KV the plan names; returns [B, Hq, Dv] in q's dtype.

    k_buf / v_buf: one layer's pool buffers [pool_tokens, Hkv, D]. Equal (up to float rounding) to
    attending each request's whole row on its own. Read-only on the KV buffers; overwrites
    `workspace` (a fresh one when None).
    """
    if q.shape[0] != plan.batch_size or k_buf.shape[1] != plan.num_kv_heads:
        raise ValueError(f"plan is for {plan.batch_size} requests on {plan.num_kv_heads} kv heads, got "
                         f"{q.shape[0]} queries on {k_buf.shape[1]}")
    k_rows, v_rows = k_buf.view(-1, k_buf.shape[2]), v_buf.view(-1, v_buf.shape[2])
    keys, values = (workspace or KVWorkspace()).views(k_rows, v_rows, plan.gather_rows.numel())
    torch.index_select(k_rows, 0, plan.gather_rows, out=keys)
    torch.index_select(v_rows, 0, plan.gather_rows, out=values)
    if keys.dtype != torch.float32:
        keys, values = keys.float(), values.float()
    qs, heads = q.float() * scale, plan.num_kv_heads
    out = torch.zeros(plan.batch_size, q.shape[1], v_buf.shape[2], dtype=torch.float32, device=q.device)
    lse = torch.full((plan.batch_size, q.shape[1]), float("-inf"), dtype=torch.float32, device=q.device)
    for bucket in plan.own_buckets:
        b, width = bucket.slots.shape
        k_piece = _piece(keys, heads, bucket.offset, b * width).view(heads, b, width, -1)
        v_piece = _piece(values, heads, bucket.offset, b * width).view(heads, b, width, -1)
        o, l = padded_partial(qs.index_select(0, bucket.positions), k_piece, v_piece, bucket.bias)
        out[bucket.positions] = o
        lse[bucket.positions] = l
    for seg in plan.segments:
        n = seg.slots.numel()
        o, l = segment_partial(qs.index_select(0, seg.members), _piece(keys, heads, seg.offset, n),
                               _piece(values, heads, seg.offset, n))
        merge_into(out, lse, seg.members, o, l)
    return out if q.dtype == torch.float32 else out.to(q.dtype)
