"""Batched eviction: plan one decode admission round at once, evict once for its whole shortfall.

SGLang's decode prealloc loop matches, locks, budgets and preallocates one request at a time, and
evicts the radix tree inside each preallocation that finds too few free pages: with a full pool,
one eviction pass (a heap over every evictable leaf) per admitted request. A round instead:

    match + lock every candidate (FIFO, the queue's own order) while it fits the round's budget
      -> a candidate that does not fit releases its lock; the round ends there
      -> shortfall = sum of the admitted candidates' new tokens - free tokens
      -> evict once for the shortfall (locked prefixes cannot be evicted)
      -> SGLang's loop then consumes the planned matches and preallocates without evicting.

Planned matches SGLang's loop does not consume (it stopped early for a reason of its own) are
released by `close()`, so every lock the round took is released exactly once.

Sizing is behind `RoundSizer`, so the same planner runs inside the server (sizes from SGLang's own
budget functions) and in `bench_admission` / unit tests (sizes from a bare allocator and tree).
Mutating: `plan`, `take`, `close`. Scheduler thread only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from sglang_pd.srt.disaggregation.decode_admission import DecodePrefixAdmission
from sglang_pd.srt.mem_cache.common import kv_to_page_num, request_kind


class RoundSizer(Protocol):
    """Token sizes of one admission round (read-only except `evict`)."""

    def alloc_tokens(self, req: Any, prefix_len: int) -> int:
        """Token slots preallocation will take for `req` past its `prefix_len` (page-rounded)."""

    def admission_tokens(self, req: Any, alloc_tokens: int, prefix_len: int) -> int:
        """Tokens `req` must find in the budget to be admitted (alloc plus decode headroom)."""

    def budget(self, num_planned: int) -> int:
        """Allocatable tokens now (free + evictable - reserves) with `num_planned` more requests."""

    def available(self) -> int:
        """Free token slots now."""

    def evict(self, num_tokens: int) -> int:
        """Evict at least `num_tokens` from the tree if it can; returns tokens evicted (mutates)."""


@dataclass(frozen=True)
class RoundPlan:
    """What one round decided."""

    rids: tuple[str, ...]   # admitted candidates, in order (their prefixes are locked)
    num_refused: int        # 1 if a matched candidate did not fit (its lock was released), else 0
    num_alloc_tokens: int   # new token slots the admitted candidates need
    num_evicted_tokens: int


class AdmissionRound:
    """One round at a time: `plan` -> `take` per request by SGLang's loop -> `close`."""

    def __init__(self, admission: DecodePrefixAdmission, counters=None):
        self.admission = admission
        self.counters = counters  # PDCounters, optional
        self._matches: dict[str, tuple[Any, Any]] = {}  # rid -> (req, MatchResult): locked, not taken
        self._tree = None
        self.num_rounds = 0
        self.num_evictions = 0
        self.num_planned = 0
        self.max_round_size = 0
        self.num_released_unused = 0

    def plan(self, reqs: Sequence[Any], tree_cache: Any, sizer: RoundSizer, match_fn: Callable) -> RoundPlan:
        """Match and lock `reqs` in order while they fit, then evict once for the round's shortfall.

        `match_fn` is SGLang's `match_kv_cache`. Raises RuntimeError if a round is still open.
        """
        if self._matches:
            raise RuntimeError("admission round planned while the previous one still holds locks")
        self._tree = tree_cache
        rids: list[str] = []
        num_alloc = refused = 0
        for req in reqs:
            result = self.admission.match_and_lock(req, tree_cache, request_kind(req), match_fn)
            self._matches[str(req.rid)] = (req, result)  # from here on close() releases it
            prefix_len = self.admission.plan_for(str(req.rid)).decode_prefix_len
            alloc = sizer.alloc_tokens(req, prefix_len)
            if sizer.admission_tokens(req, alloc, prefix_len) > sizer.budget(len(rids)) - num_alloc:
                del self._matches[str(req.rid)]
                self._unlock(req)
                refused = 1
                break
            rids.append(str(req.rid))
            num_alloc += alloc
        shortfall = num_alloc - sizer.available()
        evicted = sizer.evict(shortfall) if shortfall > 0 else 0
        self.num_rounds += 1
        self.num_evictions += shortfall > 0
        if shortfall > 0 and self.counters is not None:
            self.counters.add("admission_round_evictions_total", 1)
        self.num_planned += len(rids)
        self.max_round_size = max(self.max_round_size, len(rids))
        return RoundPlan(tuple(rids), refused, num_alloc, evicted)

    def take(self, req: Any) -> Any | None:
        """The planned, locked match of `req` (handed over once), or None if it was not planned."""
        entry = self._matches.pop(str(req.rid), None)
        return None if entry is None else entry[1]

    def close(self) -> int:
        """Release the locks of planned matches nobody took; returns how many. Ends the round."""
        unused = list(self._matches.values())
        self._matches.clear()
        for req, _result in unused:
            self._unlock(req)
        self.num_released_unused += len(unused)
        return len(unused)

    def _unlock(self, req: Any) -> None:
        if req.lock is not None:
            self._tree.unlock(req.lock)
            req.lock = None

    def snapshot(self) -> dict:
        """JSON-able counters (read-only)."""
        return {"num_rounds": self.num_rounds, "num_evictions": self.num_evictions,
                "num_planned": self.num_planned, "max_round_size": self.max_round_size,
                "num_released_unused": self.num_released_unused}


class PoolSizer:
    """RoundSizer over a bare paged allocator and tree (bench_admission, unit tests).

    A request needs its prompt past the prefix, page-rounded, plus `reserve_per_req` decode tokens.
    """

    def __init__(self, tree_cache: Any, allocator: Any, reserve_per_req: int = 0):
        self.tree = tree_cache
        self.allocator = allocator
        self.reserve_per_req = reserve_per_req

    def alloc_tokens(self, req: Any, prefix_len: int) -> int:
        page_size = self.allocator.page_size
        return kv_to_page_num(len(req.origin_input_ids) - prefix_len, page_size) * page_size

    def admission_tokens(self, req: Any, alloc_tokens: int, prefix_len: int) -> int:
        return alloc_tokens + self.reserve_per_req

    def budget(self, num_planned: int) -> int:
        return self.allocator.available_size() + self.tree.evictable_size() - self.reserve_per_req * num_planned

    def available(self) -> int:
        return self.allocator.available_size()

    def evict(self, num_tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return self.tree.evict_for_alloc(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
