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

Ownership: a planned match belongs to the request OBJECT it was taken for (keyed by `id(req)`, the
request kept in the entry), never to its rid. SGLang's tokenizer refuses a duplicate rid in flight,
but several tokenizer workers (DP) or a direct scheduler call can still queue two requests under one
rid; keyed by rid, the second match overwrote the first's entry and the first's PLANNED lock had no
owner `close()` would release. The ledger keys its records by the TreeLock object (the rid is only
its owner label), so two live locks under one rid are unambiguous there. A round seeing a duplicate
rid plans both, and counts (`admission_round_duplicate_rids_total`) and logs it: rid-keyed records
elsewhere (the admission plan and hand-off record) cannot tell the two apart.

Sizing is behind `RoundSizer`, so the same planner runs inside the server (sizes from SGLang's own
budget functions) and in `bench_admission` / unit tests (sizes from a bare allocator and tree).
Mutating: `open`, `plan`, `take`, `close`. Scheduler thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from sglang_pd.srt.admission.decode_admission import DecodePrefixAdmission
from sglang_pd.srt.mem_cache import kv_to_page_num, request_kind
from sglang_pd.srt.mem_cache import LockState

logger = logging.getLogger(__name__)


class RoundSizer(Protocol):
    """Token sizes of one admission round (read-only except `evict`)."""

    def alloc_tokens(self, req: Any, decode_prefix_len: int) -> int:
        """Token slots preallocation will take for `req` past its `decode_prefix_len` (page-rounded)."""

    def admission_tokens(self, req: Any, alloc_tokens: int, decode_prefix_len: int) -> int:
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
    """One round at a time: `open` -> `plan` (first request) -> `take` per request by SGLang's loop -> `close`.

    Planned locks are PLANNED in the ledger until `take` hands them to SGLang's loop (HELD);
    `close` releases the ones nobody took. Entries are keyed by request identity (see the module
    docstring: two requests may share a rid). Counts into the admission's PDCounters.
    """

    def __init__(self, admission: DecodePrefixAdmission):
        self.admission = admission
        self.ledger = admission.ledger
        self.counters = admission.counters
        # id(req) -> (req, MatchResult): locked, not taken. The entry keeps `req` alive, so its id
        # cannot be reused by another object while the entry exists.
        self._matches: dict[int, tuple[Any, Any]] = {}
        self._tree = None
        self._scope: Any = None   # the SGLang prealloc queue whose pop_preallocated call is in progress
        self._planned = False

    def open(self, scope: Any) -> None:
        """Start a round for `scope` (one pop_preallocated call); it is planned on its first request."""
        self._scope, self._planned = scope, False

    def needs_plan(self, scope: Any) -> bool:
        """True when a round is open for `scope` and has not been planned yet (read-only)."""
        return self._scope is scope and not self._planned

    def is_open_for(self, scope: Any) -> bool:
        """True while a round is open for `scope` (read-only)."""
        return scope is not None and self._scope is scope

    def plan(self, reqs: Sequence[Any], tree_cache: Any, sizer: RoundSizer, match_fn: Callable) -> RoundPlan:
        """Match and lock (PLANNED) `reqs` in order while they fit, then evict once for the round's shortfall.

        `match_fn` is SGLang's `match_kv_cache`. Raises RuntimeError if a round still holds locks.
        """
        if self._matches:
            raise RuntimeError("admission round planned while the previous one still holds locks")
        self._tree, self._planned = tree_cache, True
        rids: list[str] = []
        seen_rids: set[str] = set()
        num_alloc = refused = 0
        for req in reqs:
            self._note_duplicate_rid(req, seen_rids)
            result = self.admission.match_and_lock(req, tree_cache, request_kind(req), match_fn,
                                                   state=LockState.PLANNED)
            self._matches[id(req)] = (req, result)  # from here on close() releases it
            decode_prefix_len = self.admission.plan_for(req).decode_prefix_len
            alloc = sizer.alloc_tokens(req, decode_prefix_len)
            if sizer.admission_tokens(req, alloc, decode_prefix_len) > sizer.budget(len(rids)) - num_alloc:
                del self._matches[id(req)]
                self._unlock(req)
                refused = 1
                break
            rids.append(str(req.rid))
            num_alloc += alloc
        shortfall = num_alloc - sizer.available()
        evicted = sizer.evict(shortfall) if shortfall > 0 else 0
        self.counters.add("admission_rounds_total")
        if shortfall > 0:
            self.counters.add("admission_round_evictions_total")
        self.counters.add("admission_round_planned_requests_total", len(rids))
        if len(rids) > self.counters.get("admission_round_max_size"):
            self.counters.set("admission_round_max_size", len(rids))
        return RoundPlan(tuple(rids), refused, num_alloc, evicted)

    def take(self, req: Any) -> Any | None:
        """The planned, locked match of `req` (handed over once: its lock becomes HELD), or None."""
        entry = self._matches.pop(id(req), None)
        if entry is None:
            return None
        if req.lock is not None:
            self.ledger.transition(req.lock, LockState.HELD)
        return entry[1]

    def close(self) -> int:
        """Release the locks of planned matches nobody took; returns how many. Ends the round."""
        unused = list(self._matches.values())
        self._matches.clear()
        self._scope, self._planned = None, False
        for req, _result in unused:
            self._unlock(req)
        self.counters.add("admission_round_released_unused_total", len(unused))
        return len(unused)

    def _note_duplicate_rid(self, req: Any, seen_rids: set[str]) -> None:
        """Count and log a candidate whose rid an earlier candidate of this round had; adds it to
        `seen_rids`. Both stay planned, each under its own entry and lock."""
        rid = str(req.rid)
        if rid in seen_rids:
            self.counters.add("admission_round_duplicate_rids_total")
            logger.warning("sglang_pd: two queued requests share rid %r in one admission round; each keeps "
                           "its own lock, but rid-keyed records (admission plan, hand-off) conflate them", rid)
        seen_rids.add(rid)

    def _unlock(self, req: Any) -> None:
        if req.lock is not None:
            self._tree.unlock(req.lock)
            req.lock = None

    def snapshot(self) -> dict:
        """JSON-able counters (read-only, from PDCounters)."""
        count = lambda name: int(self.counters.get(name))  # noqa: E731
        return {"num_rounds": count("admission_rounds_total"),
                "num_evictions": count("admission_round_evictions_total"),
                "num_planned": count("admission_round_planned_requests_total"),
                "max_round_size": count("admission_round_max_size"),
                "num_released_unused": count("admission_round_released_unused_total"),
                "num_duplicate_rids": count("admission_round_duplicate_rids_total")}


class PoolSizer:
    """RoundSizer over a bare paged allocator and tree (bench_admission, unit tests).

    A request needs its prompt past the prefix, page-rounded, plus `reserve_per_req` decode tokens.
    """

    def __init__(self, tree_cache: Any, allocator: Any, reserve_per_req: int = 0):
        self.tree = tree_cache
        self.allocator = allocator
        self.reserve_per_req = reserve_per_req

    def alloc_tokens(self, req: Any, decode_prefix_len: int) -> int:
        page_size = self.allocator.page_size
        return kv_to_page_num(len(req.origin_input_ids) - decode_prefix_len, page_size) * page_size

    def admission_tokens(self, req: Any, alloc_tokens: int, decode_prefix_len: int) -> int:
        return alloc_tokens + self.reserve_per_req

    def budget(self, num_planned: int) -> int:
        return self.allocator.available_size() + self.tree.evictable_size() - self.reserve_per_req * num_planned

    def available(self) -> int:
        return self.allocator.available_size()

    def evict(self, num_tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return self.tree.evict_for_alloc(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
