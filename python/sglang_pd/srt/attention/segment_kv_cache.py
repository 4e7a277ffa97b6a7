"""Each shared segment's KV, gathered head-major once and reused while the segment lasts.

    SegmentKVCache.plan(segments, keys, continuing, pool) --one SegmentStep per segment--> each layer's keys/values

A shared segment (prefix_groups.py: a system prompt, an earlier turn, a branch) is read by all its
members in every layer of every decode step. Its KV is gathered from the pool once into a float32
[kv heads, tokens, head_dim] tensor per layer (the layout the fused attention kernel reads for all
members' queries at once); a later forward reuses it when the segment spans the same columns and slots
and at least one member of it then is a member now and continuing. Why that proves the KV unchanged:
a continuing request (in the previous decode forward with seq_len one less, same rid, req_to_token
row and row generation) never left SGLang's running batch in between (finishing, aborting and
retraction all leave it out of the next forward; SGLang retracts only while it keeps at least one
request running), so it held those slots all along, and SGLang never rewrites a held slot's KV. The
row generation (ReqToTokenPool.req_generation, bumped by SGLang on every allocation of a row) covers
what the rest cannot: every request retracted at once (a pause or weight update), its KV recomputed,
and readmitted under its rid into the row it had, with no decode forward in between. An entry no
forward used is dropped, so the cache holds at most the KV of the latest forward's segments.

Pure torch, no SGLang import. Not thread-safe: the scheduler thread owns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from sglang_pd.srt.attention.prefix_groups import SharedSegment


class RequestKey(NamedTuple):
    """Who a batch position is: SGLang's request id, its req_to_token row and that row's allocation
    count (ReqToTokenPool.req_generation: a readmitted request in the same row is another key)."""

    rid: str
    req_pool_index: int
    row_generation: int


@dataclass(frozen=True)
class SegmentStep:
    """One segment in one decode forward."""

    members: torch.Tensor         # int64 [m]: batch positions
    k: tuple[torch.Tensor, ...]   # per layer float32 [kv heads, tokens, head_dim]
    v: tuple[torch.Tensor, ...]
    gathered: bool                # gathered from the pool for this forward (not reused)
    slots: torch.Tensor           # int64 [tokens]: the segment's pool slots (what a kernel reading in place reads)

    @property
    def num_tokens(self) -> int:
        """Tokens of KV the segment holds."""
        return self.slots.numel()


class _Entry(NamedTuple):
    slots: torch.Tensor
    members: frozenset[RequestKey]
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]


class SegmentKVCache:
    """Gathered segment KV of the latest decode forward (module docstring)."""

    def __init__(self, num_kv_heads: int, head_dim: int):
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self._entries: dict[tuple[int, int, int, int], _Entry] = {}  # (start, end, first slot, last slot)

    def plan(self, segments: Sequence[SharedSegment], keys: Sequence[RequestKey], continuing: Sequence[bool],
             pool_k: Sequence[torch.Tensor], pool_v: Sequence[torch.Tensor]) -> tuple[SegmentStep, ...]:
        """The KV of each of this forward's `segments` (of the batch whose positions `keys` name;
        `continuing[i]`: position i was in the previous decode forward with one token fewer), reused or
        gathered from the pool buffers of every layer ([slots, kv heads, head_dim]). Mutates the cache:
        it then holds exactly these segments."""
        entries: dict[tuple[int, int, int, int], _Entry] = {}
        steps = []
        for seg in segments:
            key = (seg.start, seg.end, int(seg.slots[0]), int(seg.slots[-1]))
            members = frozenset(keys[m] for m in seg.members)
            entry = entries.get(key)  # the same slots twice in one forward: same KV, gathered once
            if entry is not None and torch.equal(entry.slots, seg.slots):
                steps.append(SegmentStep(torch.tensor(seg.members, dtype=torch.int64), entry.k, entry.v, False,
                                         seg.slots))
                continue
            entry = self._entries.get(key)
            reuse = entry is not None and torch.equal(entry.slots, seg.slots) and any(
                continuing[m] and keys[m] in entry.members for m in seg.members)
            if reuse:
                entry = entry._replace(members=members)
            else:
                entry = _Entry(seg.slots, members, *self._gather(seg.slots, pool_k, pool_v))
            entries[key] = entry
            steps.append(SegmentStep(torch.tensor(seg.members, dtype=torch.int64), entry.k, entry.v, not reuse,
                                     seg.slots))
        self._entries = entries
        return tuple(steps)

    def _gather(self, slots: torch.Tensor, pool_k: Sequence[torch.Tensor],
                pool_v: Sequence[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        heads = torch.arange(self.num_kv_heads, dtype=torch.int64).view(-1, 1)
        rows = (slots.to(torch.int64).view(1, -1) * self.num_kv_heads + heads).reshape(-1)
        shape = (self.num_kv_heads, slots.numel(), self.head_dim)
        take = lambda pool: pool.view(-1, self.head_dim).index_select(0, rows).view(shape).float()  # noqa: E731
        return tuple(take(p) for p in pool_k), tuple(take(p) for p in pool_v)
