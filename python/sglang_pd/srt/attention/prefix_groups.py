"""Which requests of a decode batch read the same physical KV, found from their req_to_token rows.

With the decode radix cache, requests that matched the same cached prefix have rows that start with
the same KV-pool slots (the tree handed each of them the same pages). `find_prefix_groups` finds
those runs once per forward and returns them as a tree of `SharedSegment`s: a segment is a column
range [start, end) whose slots are identical, slot for slot, in the rows of all its members (>= 2
requests). Segments nest (a system prompt shared by all, then a conversation branch shared by a
few); what is left of each request, [own_start, seq_len), is its own part.

Correctness never depends on the grouping being good: a segment is emitted only over columns that
were compared equal for every member, so a wrong grouping cannot be produced; a missed sharing only
costs speed. Token-level comparison is exact where a shared run ends mid-page (a partially filled
page is not shared past the slots that really match).

A row's last column (seq_len - 1, the slot `out_cache_loc` names) is never in a segment: it takes
this forward's token, whose K/V each layer stores just before it attends, while a segment's KV is
gathered once per forward before the first layer runs. That column is always in the own part, read
in place after the store.

Pure torch on bare tensors, no SGLang import. Read-only: never mutates its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class SharedSegment:
    """Columns [start, end) hold the same KV slots (`slots`) in the rows of every member."""

    start: int
    end: int
    members: tuple[int, ...]  # batch positions, ascending; at least two (find_prefix_groups)
    slots: torch.Tensor       # int64 [end - start]: the shared KV-pool indices

    @property
    def num_tokens(self) -> int:
        """Tokens of KV this segment holds (read once for all members)."""
        return self.end - self.start

    @property
    def num_reads_saved(self) -> int:
        """Token reads saved against reading the segment once per member."""
        return (len(self.members) - 1) * self.num_tokens


@dataclass(frozen=True)
class PrefixGrouping:
    """Shared segments of one decode batch and where each request's own part begins."""

    segments: tuple[SharedSegment, ...]
    own_starts: tuple[int, ...]  # per batch position: own part is [own_starts[i], seq_lens[i])
    seq_lens: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        """Segments (prefix groups, nested ones included)."""
        return len(self.segments)

    @property
    def num_grouped_requests(self) -> int:
        """Requests that read at least one shared segment."""
        return len({m for seg in self.segments for m in seg.members})

    @property
    def num_shared_tokens(self) -> int:
        """KV tokens read once for a group (sum over segments)."""
        return sum(seg.num_tokens for seg in self.segments)

    @property
    def num_reads_saved(self) -> int:
        """KV token reads saved per layer against reading every request's whole row."""
        return sum(seg.num_reads_saved for seg in self.segments)

    def own_lens(self) -> list[int]:
        """Length of each request's own part (at least its last column when seq_len >= 1)."""
        return [end - start for start, end in zip(self.own_starts, self.seq_lens)]

    def coverage_problems(self) -> list[str]:
        """Every way the segments + own parts fail to cover each row exactly once ([] when sound)."""
        problems = []
        for i, (own_start, seq_len) in enumerate(zip(self.own_starts, self.seq_lens)):
            spans = sorted((s.start, s.end) for s in self.segments if i in s.members)
            cursor = 0
            for start, end in spans:
                if start != cursor:
                    problems.append(f"request {i}: segment starts at {start}, expected {cursor}")
                cursor = end
            if cursor != own_start or own_start > seq_len:
                problems.append(f"request {i}: own part starts at {own_start}, segments end at {cursor},"
                                f" seq_len {seq_len}")
        return problems


def common_run(rows: torch.Tensor, members: Sequence[int], start: int, limit: int) -> int:
    """How many columns from `start` (at most up to `limit`) hold identical slots in all `members`."""
    if limit <= start:
        return 0
    block = rows[list(members), start:limit]
    differs = (block != block[0]).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else limit - start


def find_prefix_groups(rows: torch.Tensor, seq_lens: Sequence[int], min_shared_len: int = 1,
                       min_reads_saved: int = 0) -> PrefixGrouping:
    """Group the batch by the KV slots its rows share, as a tree of segments.

    `rows[i, :seq_lens[i]]` are request i's KV slots (e.g. req_to_token[req_pool_indices]); columns
    past seq_lens[i] are never read, and column seq_lens[i] - 1 (this forward's token) is never
    shared (module docstring). A run shared by m >= 2 requests becomes a segment when it is at
    least `min_shared_len` tokens long and saves at least `min_reads_saved` token reads ((m - 1) x its
    length: a segment costs a kernel call of its own per layer, which a few saved reads do not pay
    for); other runs stay in the requests' own parts (or in a longer nested segment below them).
    Raises ValueError on a non-positive `min_shared_len`, a negative `min_reads_saved` or a row
    shorter than its seq_len.
    """
    if min_shared_len < 1 or min_reads_saved < 0:
        raise ValueError(f"min_shared_len must be >= 1 and min_reads_saved >= 0, got {min_shared_len}, "
                         f"{min_reads_saved}")
    seq_lens = tuple(int(n) for n in seq_lens)
    if len(seq_lens) != rows.shape[0] or (seq_lens and max(seq_lens) > rows.shape[1]):
        raise ValueError(f"rows {tuple(rows.shape)} do not hold seq_lens {seq_lens}")
    own_starts = [0] * len(seq_lens)
    shareable_lens = tuple(max(n - 1, 0) for n in seq_lens)  # the last column stays in the own part
    segments: list[SharedSegment] = []
    # (members, compared: columns [0, compared) are known equal in all members, pending: first column
    # not yet in an emitted segment)
    stack = [(tuple(range(len(seq_lens))), 0, 0)] if seq_lens else []
    while stack:
        members, compared, pending = stack.pop()
        if len(members) == 1:
            own_starts[members[0]] = pending
            continue
        end = compared + common_run(rows, members, compared, min(shareable_lens[m] for m in members))
        if end - pending >= min_shared_len and (len(members) - 1) * (end - pending) >= min_reads_saved:
            segments.append(SharedSegment(pending, end, members, rows[members[0], pending:end].to(torch.int64)))
            pending = end
        stack.extend((bucket, end + 1, pending) for bucket in _split_at(rows, members, shareable_lens, end,
                                                                          own_starts, pending))
    return PrefixGrouping(tuple(segments), tuple(own_starts), seq_lens)


def _split_at(rows: torch.Tensor, members: tuple[int, ...], shareable_lens: tuple[int, ...], column: int,
              own_starts: list[int], pending: int) -> list[tuple[int, ...]]:
    """Members whose shareable columns end at `column` get own_start `pending` (mutates own_starts); the
    others are bucketed by their slot at `column` (members of a bucket share it)."""
    alive = []
    for m in members:
        if shareable_lens[m] > column:
            alive.append(m)
        else:
            own_starts[m] = pending
    if not alive:
        return []
    buckets: dict[int, list[int]] = {}
    for m, slot in zip(alive, rows[alive, column].tolist()):
        buckets.setdefault(slot, []).append(m)
    return [tuple(b) for b in buckets.values()]
