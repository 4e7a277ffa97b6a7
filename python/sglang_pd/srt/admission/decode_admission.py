"""Decode prefix admission: match the decode radix tree, lock the hit, plan the pages to receive.

Order (the contract): match (read-only) -> check decode_prefix_len (mem_cache/prefix_len.py's rule:
page-aligned, within the prompt) -> lock with the request as owner -> SGLang preallocates only
`num_new_pages` pages -> the transfer layer is handed exactly those pages and `decode_prefix_len`.
Every lock goes through the LockLedger, so each one is released exactly once on every exit path
(SGLang's release paths call `unlock`, which the ledger checks).

Warmup (fake bootstrap) and health-check requests never touch the tree: they match nothing, hold
no lock, and are marked `skip_radix_cache_insert` so their tokens are never inserted.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Callable

from sglang_pd.srt.mem_cache import LockLedger, LockState, owner_scope
from sglang_pd.srt.mem_cache import RequestKind, kv_to_page_num
from sglang_pd.srt.mem_cache import check_for_prompt


# The attribute holding a request's admission key: plans are kept per request object, not per rid, because
# two live requests can share a rid (several tokenizer workers / DP, a direct scheduler call); keyed by rid,
# the second's plan replaced the first's, and the first's hand-off was then counted as a mismatch and a
# re-plan, with the second's figures. A sequence number, not id(req): an id is reused after collection.
ADMISSION_KEY_ATTR = "_sglang_pd_admission_key"


class AdmissionError(RuntimeError):
    """The tree or SGLang produced a plan that breaks the admission contract (a bug, not input)."""


@dataclass(frozen=True)
class AdmissionPlan:
    """What decode admission decided for one request."""

    rid: str
    kind: RequestKind
    prompt_len: int
    page_size: int
    matched_len: int          # tokens the tree matched on device (== decode_prefix_len; kept in /stats)
    decode_prefix_len: int    # page-aligned tokens reused; told to prefill
    num_new_pages: int        # pages to receive: ceil((prompt_len - decode_prefix_len) / page_size)


@dataclass(frozen=True)
class HandoffRecord:
    """What was actually handed to the transfer layer for a planned request."""

    decode_prefix_len: int
    num_pages: int


class DecodePrefixAdmission:
    """Owns match+lock for decode requests and the record of plans and hand-offs.

    Mutating: `match_and_lock`, `record_handoff`. Read-only: `plan_for`, `snapshot`.
    Counts into `ledger.counters`. Must be called on the scheduler thread (the only thread
    touching the tree).
    """

    def __init__(self, ledger: LockLedger, max_plans: int = 4096):
        self.ledger = ledger
        self.counters = ledger.counters
        self.max_plans = max_plans
        # request key (ADMISSION_KEY_ATTR) -> (plan, hand-off or None), oldest first; bounded by max_plans
        self._records: OrderedDict[int, tuple[AdmissionPlan, HandoffRecord | None]] = OrderedDict()
        self._next_key = itertools.count()

    def match_and_lock(self, req: Any, tree_cache: Any, kind: RequestKind, match_fn: Callable,
                       max_prefix_len: int | None = None, state: LockState = LockState.HELD) -> Any:
        """Match `req.origin_input_ids`, lock the matched node as `req.lock` in `state`, record the plan.

        A zero-length match takes no lock (`req.lock` is None). A lock still held from an earlier,
        refused attempt of the same request is released first. `state` is HELD when SGLang's loop
        owns the lock at once, PLANNED when an admission round holds it until the loop takes it.

        `match_fn` is SGLang's `match_kv_cache(req, tree, token_ids, max_prefix_len=...)`, which adopts
        the hit as the request's prefix. Returns its MatchResult. Raises AdmissionError if the hit breaks
        prefix_len.check_for_prompt (not page-aligned, longer than the prompt): the lock is then not taken.
        """
        self._release_stale_lock(req, tree_cache)
        skip = kind is not RequestKind.NORMAL
        if skip:
            req.skip_radix_cache_insert = True
        result = match_fn(req, tree_cache, req.origin_input_ids, max_prefix_len=0 if skip else max_prefix_len)
        page_size = int(tree_cache.page_size)
        prompt_len = len(req.origin_input_ids)
        # The whole device match is reused: locked, and told to prefill. The rule needs it page-aligned.
        decode_prefix_len = int(result.device_prefix_len)
        try:
            check_for_prompt(decode_prefix_len, prompt_len, page_size)
        except ValueError as exc:
            raise AdmissionError(f"decode admission of {req.rid}: the tree's match breaks the rule: {exc}") from exc
        if decode_prefix_len == 0:
            req.lock = None  # nothing to protect; a root lock would only be one more to lose
        else:
            with owner_scope(str(req.rid), num_tokens=decode_prefix_len, state=state):
                req.lock = tree_cache.lock(result.last_device_node)
        self._record_plan(self._key(req), AdmissionPlan(
            str(req.rid), kind, prompt_len, page_size, decode_prefix_len, decode_prefix_len,
            kv_to_page_num(prompt_len - decode_prefix_len, page_size)))
        return result

    def _release_stale_lock(self, req: Any, tree_cache: Any) -> None:
        """Give back the lock of an earlier, refused admission attempt of this same request.

        SGLang's budget refusal after the lock unlocks only non-empty matches and then overwrites
        `req.lock` on the retry; the lock object left over must still be released exactly once.
        """
        stale = getattr(req, "lock", None)
        if stale is not None:
            tree_cache.unlock(stale)
            req.lock = None
            self.counters.add("decode_stale_locks_released_total")

    def _key(self, req: Any) -> int:
        """`req`'s admission key, given at its first admission (mutates `req` then)."""
        key = getattr(req, ADMISSION_KEY_ATTR, None)
        if key is None:
            key = next(self._next_key)
            setattr(req, ADMISSION_KEY_ATTR, key)
        return key

    def _record_plan(self, key: int, plan: AdmissionPlan) -> None:
        old = self._records.pop(key, None)
        if old is not None and old[1] is None:
            self.counters.add("decode_replans_total")
        self._records[key] = (plan, None)
        while len(self._records) > self.max_plans:
            self._records.popitem(last=False)
        self.counters.add("decode_admitted_requests_total")
        if plan.kind is not RequestKind.NORMAL:
            self.counters.add("decode_tree_skipped_requests_total")

    def record_handoff(self, req: Any, decode_prefix_len: int, num_pages: int) -> AdmissionPlan | None:
        """Record what SGLang handed to the transfer layer; count (and return) a mismatching plan.

        The request's prompt, hit and page counters are added here, at its first hand-off: a request
        re-planned after a refusal is counted once, with the plan it was admitted with. Returns the
        plan if the hand-off disagrees with it, else None. Requests admitted outside this class
        (e.g. rebootstrap after retraction) have no plan and are not counted.
        """
        record = self._record_of(req)
        if record is None:
            return None
        plan, earlier = record
        self._records[getattr(req, ADMISSION_KEY_ATTR)] = (plan, HandoffRecord(decode_prefix_len, num_pages))
        if plan.kind is not RequestKind.NORMAL:
            return None
        if earlier is None:
            self._count_admitted(plan)
        if (plan.decode_prefix_len, plan.num_new_pages) != (decode_prefix_len, num_pages):
            self.counters.add("decode_handoff_mismatches_total")
            return plan
        return None

    def record_local(self, req: Any) -> None:
        """`req` is served by decode-local prefill (nothing handed to transfer): count its prompt and the
        tokens it reused from the tree, once, as a hand-off of 0 pages. No page counter moves (no page is
        asked of prefill). Requests admitted outside this class are not counted."""
        record = self._record_of(req)
        if record is None or record[1] is not None:
            return
        plan = record[0]
        self._records[getattr(req, ADMISSION_KEY_ATTR)] = (plan, HandoffRecord(plan.decode_prefix_len, 0))
        if plan.kind is RequestKind.NORMAL:
            self.counters.add("decode_prompt_tokens_total", plan.prompt_len)
            self.counters.add("decode_prefix_hit_tokens_total", plan.decode_prefix_len)

    def _count_admitted(self, plan: AdmissionPlan) -> None:
        self.counters.add("decode_prompt_tokens_total", plan.prompt_len)
        self.counters.add("decode_prefix_hit_tokens_total", plan.decode_prefix_len)
        self.counters.add("decode_pages_planned_total", plan.num_new_pages)
        self.counters.add("decode_pages_saved_total",
                          kv_to_page_num(plan.prompt_len, plan.page_size) - plan.num_new_pages)

    def plan_for(self, req: Any) -> AdmissionPlan | None:
        """The plan recorded for request `req` (None if never admitted here, or dropped)."""
        record = self._record_of(req)
        return None if record is None else record[0]

    def _record_of(self, req: Any) -> tuple[AdmissionPlan, HandoffRecord | None] | None:
        """`req`'s (plan, hand-off) if it was admitted here and its record is still kept (read-only)."""
        key = getattr(req, ADMISSION_KEY_ATTR, None)
        return None if key is None else self._records.get(key)

    def snapshot(self, max_recent: int = 256) -> dict:
        """JSON-able counters (from PDCounters) plus the most recent plans with their hand-offs, by rid (of
        two live requests under one rid, the later admitted one's)."""
        count = lambda name: int(self.counters.get(name))  # noqa: E731
        recent = list(self._records.values())[-max_recent:]
        return {
            "num_requests": count("decode_admitted_requests_total"),
            "num_skipped_tree": count("decode_tree_skipped_requests_total"),
            "num_prompt_tokens": count("decode_prompt_tokens_total"),
            "num_prefix_hit_tokens": count("decode_prefix_hit_tokens_total"),
            "num_pages_planned": count("decode_pages_planned_total"),
            "num_pages_saved": count("decode_pages_saved_total"),
            "num_handoff_mismatches": count("decode_handoff_mismatches_total"),
            "num_replans": count("decode_replans_total"),
            "num_stale_locks_released": count("decode_stale_locks_released_total"),
            "plans": {p.rid: dict(asdict(p), kind=p.kind.value, handoff=asdict(h) if h else None)
                      for p, h in recent},
        }
