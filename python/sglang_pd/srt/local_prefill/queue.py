"""The decode-local prefill queue: requests decided local (decision.py) wait here for their extend.

Lifecycle of a local request (one table, `TRANSITIONS`):

    QUEUED --plan_extend--> EXTENDING --joined--> JOINED   (SGLang's running batch owns it from here)
    QUEUED --abort--> ABORTED        QUEUED | EXTENDING --extend could not be built--> FAILED
    EXTENDING --a retract-mode pause took the extend batch before its join--> RETRACTED

The request keeps admission's prefix lock (HELD, owner = rid) and its preallocated row and pages the
whole time: the extend writes the uncached tokens into exactly those pages; JOINED hands them to the
running batch (SGLang's finish path releases them); ABORTED / FAILED release them through SGLang's
release path without publishing the never-computed suffix; RETRACTED ones SGLang's pause released itself
(and holds for re-bootstrap), so nothing is released here. An abort that finds the request
EXTENDING is SGLang's running-batch abort (the request is in the extend batch, which the scheduler hook
lists among SGLang's in-flight batches until the join); it is recorded here.

Budget per scheduler step: one extend carries at most `step_tokens` uncached tokens. When requests are
decoding, the extend runs inside their decode step (one MIXED forward: the extend's tokens and one
token per decoding request, `mixed_with`), so a decode step costs its extend's tokens and no second
forward; when it cannot be mixed (logprobs asked, nothing decoding), at most one extend runs between two
decode steps. With an ITL target the caller also passes the SLO admission's count (local requests join
the running batch right after their extend; the step model sees the extend's tokens).
No SGLang import: requests are opaque objects with `rid`; tested on bare objects.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from sglang_pd.srt.local_prefill.decision import LocalFallback, LocalDecision, decide
from sglang_pd.srt.mem_cache import RequestKind
from sglang_pd.srt.metrics import PDCounters


class LocalState(str, enum.Enum):
    """Where a local request is in its life (see the module docstring)."""

    QUEUED = "queued"
    EXTENDING = "extending"
    JOINED = "joined"
    ABORTED = "aborted"
    FAILED = "failed"
    RETRACTED = "retracted"


TRANSITIONS: dict[LocalState, frozenset[LocalState]] = {
    LocalState.QUEUED: frozenset({LocalState.EXTENDING, LocalState.ABORTED, LocalState.FAILED}),
    LocalState.EXTENDING: frozenset({LocalState.JOINED, LocalState.FAILED, LocalState.RETRACTED}),
    LocalState.JOINED: frozenset(),
    LocalState.ABORTED: frozenset(),
    LocalState.FAILED: frozenset(),
    LocalState.RETRACTED: frozenset(),
}


class LocalTransitionError(RuntimeError):
    """A state change TRANSITIONS does not allow (a bug in whoever asked for it)."""


@dataclass
class LocalRecord:
    """One local request, as the stats show it."""

    rid: str
    decode_prefix_len: int
    num_uncached: int
    state: LocalState = LocalState.QUEUED
    not_before_s: float = 0.0                 # test faults may hold a request back until then
    abort_seen: dict | None = None            # state (and lock state) an abort found it in
    admitted_ms: float | None = None          # scheduler receipt -> decided local (bootstrap, admission)
    queued_at_s: float = 0.0                  # clock times: decided local, extend planned, joined
    extend_at_s: float | None = None
    joined_at_s: float | None = None
    req: Any = field(default=None, repr=False)


class LocalPrefill:
    """The decode scheduler's local-prefill queue, its one in-flight extend, and their records.

    Mutating: `decide`, `count_fallback`, `start_round`, `note_prefill_handoff`, `enqueue`, `plan_extend`, `bind_extend`, `join_extend`, `abort`,
    `fail`, `retract_extend`, `on_decode_turn`, `mixed_with`. Read-only: `enabled`, `holds`, `is_extend_batch`,
    `extend_in_flight`, `mixed_decoding_reqs`, `num_extend_tokens`, `num_pending`, `queued_records`, `record`,
    `rid_is_live`, `snapshot`. Scheduler thread only. Counts into `counters`.
    """

    def __init__(self, threshold: int, step_tokens: int, counters: PDCounters, max_records: int = 4096,
                 clock: Callable[[], float] = time.monotonic, balance_tokens: int = 0):
        if threshold < 0 or step_tokens < 1 or threshold > step_tokens:
            raise ValueError(f"need 0 <= threshold <= step_tokens, step_tokens >= 1; got {threshold}, {step_tokens}")
        if balance_tokens and not threshold < balance_tokens <= step_tokens:
            raise ValueError(f"need threshold < balance_tokens <= step_tokens (or balance_tokens 0); got "
                             f"{threshold}, {balance_tokens}, {step_tokens}")
        self.threshold = threshold
        self.step_tokens = step_tokens
        self.balance_tokens = balance_tokens
        self.counters = counters
        self.max_records = max_records
        self._clock = clock
        self._records: OrderedDict[str, LocalRecord] = OrderedDict()
        self._queue: list[LocalRecord] = []
        self._extend_batch: Any = None
        self._extending: list[LocalRecord] = []
        self._mixed_reqs: list[Any] = []
        self._extended_since_decode = False
        self._round_prefill_tokens = 0  # uncached tokens handed to prefill in this admission round (balance rule)

    @property
    def enabled(self) -> bool:
        """False when the threshold is 0: every hook passes straight through."""
        return self.threshold > 0

    # ---- decision --------------------------------------------------------------------------------
    def decide(self, req: Any, decode_prefix_len: int, kind: RequestKind = RequestKind.NORMAL,
               is_rebootstrap: bool = False, prefill_backlog: int = 0) -> LocalDecision:
        """decision.decide with this queue's threshold, balance limit and backlog (tokens queued or
        extending here) and whether `req.rid` is live here; counts a fallback by its reason, and a request
        taken through the balance rule (`local_prefill_balanced_total`). `prefill_backlog`: the uncached
        tokens decode waits for from prefill (the caller reads them from SGLang's transfer queue)."""
        decision = decide(self.threshold, req, decode_prefix_len, kind=kind, is_rebootstrap=is_rebootstrap,
                          rid_is_live=self.rid_is_live(req.rid), balance_tokens=self.balance_tokens,
                          prefill_backlog=prefill_backlog + self._round_prefill_tokens,
                          local_backlog=self.local_backlog())
        if decision.fallback is not None:
            self.counters.add(f"local_prefill_fallback_{decision.fallback.value}_total")
        if decision.local and decision.balanced:
            self.counters.add("local_prefill_balanced_total")
        return decision

    def start_round(self) -> None:
        """An admission round begins: requests it hands to prefill are not in SGLang's transfer queue until it
        ends, so the balance rule counts them here (`note_prefill_handoff`) from zero."""
        self._round_prefill_tokens = 0

    def note_prefill_handoff(self, num_uncached: int) -> None:
        """A request of this round went to prefill with `num_uncached` tokens to compute."""
        self._round_prefill_tokens += max(0, num_uncached)

    def local_backlog(self) -> int:
        """Uncached tokens of the requests queued here or in the extend under way."""
        return sum(r.num_uncached for r in self._queue) + sum(r.num_uncached for r in self._extending)

    def count_fallback(self, reason: LocalFallback) -> None:
        """A request decided local goes to prefill after all (e.g. the decline could not be sent)."""
        self.counters.add(f"local_prefill_fallback_{reason.value}_total")

    def enqueue(self, req: Any, decode_prefix_len: int, num_uncached: int, not_before_s: float = 0.0,
                admitted_ms: float | None = None) -> LocalRecord:
        """`req` (admitted, locked, preallocated; prefill declined) waits for its extend (QUEUED).
        `admitted_ms`: how long it took from the scheduler's receipt to this decision (for the stats)."""
        rid = str(req.rid)
        if self.rid_is_live(rid):
            raise LocalTransitionError(f"{rid} is already a local request in state {self._records[rid].state.value}")
        record = LocalRecord(rid, decode_prefix_len, num_uncached, not_before_s=not_before_s, req=req,
                             admitted_ms=admitted_ms, queued_at_s=self._clock())
        self._records.pop(rid, None)
        self._records[rid] = record
        self._queue.append(record)
        self.counters.add("local_prefill_requests_total")
        self._trim()
        self._publish_queued()
        return record

    # ---- scheduling ------------------------------------------------------------------------------
    def plan_extend(self, now_s: float, num_running: int, max_reqs: int | None = None) -> list[Any]:
        """Requests for the next extend (FIFO, within `step_tokens`, at most `max_reqs`), now EXTENDING.

        Returns [] when nothing is ready, when requests are decoding and an extend already ran since
        their last decode step, or when `max_reqs` is 0 (counted as a deferred step when work waits).
        """
        if self._extend_batch is not None:
            raise LocalTransitionError("an extend is planned while the previous one has not joined")
        ready = [r for r in self._queue if r.not_before_s <= now_s]
        if not ready:
            return []
        if (num_running > 0 and self._extended_since_decode) or max_reqs == 0:
            self.counters.add("local_prefill_deferred_steps_total")
            return []
        chosen, tokens = [], 0
        for record in ready:
            if tokens + record.num_uncached > self.step_tokens or (max_reqs is not None and len(chosen) >= max_reqs):
                break
            chosen.append(record)
            tokens += record.num_uncached
        for record in chosen:
            self._move(record, LocalState.EXTENDING)
            self._queue.remove(record)
            record.extend_at_s = self._clock()
        self._extending = chosen
        self._extended_since_decode = True
        self._publish_queued()
        return [r.req for r in chosen]

    def bind_extend(self, batch: Any) -> None:
        """`batch` is the extend built from the last `plan_extend` (the allocation hook recognises it)."""
        if not self._extending:
            raise LocalTransitionError("no planned extend to bind a batch to")
        self._extend_batch = batch

    def is_extend_batch(self, batch: Any) -> bool:
        """True for the local extend batch currently bound (read-only)."""
        return batch is not None and batch is self._extend_batch

    def extend_batch(self) -> Any:
        """The bound extend batch (None if none)."""
        return self._extend_batch

    def extend_in_flight(self) -> bool:
        """True from `bind_extend` until `join_extend` (no second extend is planned meanwhile)."""
        return self._extend_batch is not None

    def join_extend(self) -> Any:
        """The extend ran: its requests are JOINED (the caller merges the batch); returns the batch."""
        batch, records = self._extend_batch, self._extending
        if batch is None:
            raise LocalTransitionError("no extend in flight")
        for record in records:
            self._move(record, LocalState.JOINED)
            record.req = None
            record.joined_at_s = self._clock()
        self.counters.add("local_prefill_extends_total")
        self.counters.add("local_prefill_tokens_total", sum(r.num_uncached for r in records))
        self._extend_batch, self._extending, self._mixed_reqs = None, [], []
        return batch

    def on_decode_turn(self) -> None:
        """A decode step was scheduled: the next extend may run before the one after it."""
        self._extended_since_decode = False

    def mixed_with(self, decoding_reqs: list[Any]) -> None:
        """The bound extend runs inside this decode step with these running requests (counted; it is this
        step's decode turn). Until the join they sit in the extend batch only (SGLang's running batch is
        empty meanwhile): `mixed_decoding_reqs` lists them so admission still reserves for them."""
        if self._extend_batch is None or not decoding_reqs:
            raise LocalTransitionError(f"no extend to mix with {len(decoding_reqs)} decoding requests")
        self._mixed_reqs = list(decoding_reqs)
        self.counters.add("local_prefill_mixed_extends_total")
        self.on_decode_turn()

    def mixed_decoding_reqs(self) -> list[Any]:
        """The running requests folded into the bound extend by `mixed_with`, until it joins ([] when none;
        read-only copy). Finished ones stay listed until the join, as they stay in a running batch until
        its next filter."""
        return list(self._mixed_reqs)

    def num_extend_tokens(self) -> int:
        """Uncached tokens of the bound extend's requests (0 when none is in flight)."""
        return sum(r.num_uncached for r in self._extending)

    # ---- exits -----------------------------------------------------------------------------------
    def abort(self, matches, lock_state_of) -> list[Any]:
        """Client abort: QUEUED requests whose rid `matches(rid)` become ABORTED and are returned (the
        caller releases and answers them); EXTENDING ones stay (SGLang's running-batch abort finishes
        them: the bound extend batch is listed among its in-flight batches) and the abort is recorded.
        `lock_state_of(req)` names the lock's state for the record."""
        aborted = []
        for record in [*self._queue, *self._extending]:
            if not matches(record.rid):
                continue
            record.abort_seen = {"state": record.state.value, "lock": lock_state_of(record.req)}
            if record.state is LocalState.QUEUED:
                self._queue.remove(record)
                self._move(record, LocalState.ABORTED)
                aborted.append(record.req)
                record.req = None
        if aborted:
            self.counters.add("local_prefill_aborted_total", len(aborted))
            self._publish_queued()
        return aborted

    def fail(self, reqs: Iterable[Any]) -> None:
        """These QUEUED / EXTENDING requests could not be extended (the caller releases and answers them)."""
        rids = {str(r.rid) for r in reqs}
        for record in [r for r in [*self._queue, *self._extending] if r.rid in rids]:
            if record in self._queue:
                self._queue.remove(record)
            else:
                self._extending.remove(record)
            self._move(record, LocalState.FAILED)
            record.req = None
            self.counters.add("local_prefill_failed_total")
        if not self._extending:
            self._extend_batch, self._mixed_reqs = None, []
        self._publish_queued()

    def retract_extend(self) -> list[Any]:
        """A retract-mode pause took the bound extend batch (SGLang retracted its unfinished requests and
        released their rows, pages and locks itself): its requests are RETRACTED, the batch unbound (no join
        follows). Returns the requests. Without it the records stayed EXTENDING and the batch bound for good:
        no later extend was planned, and the scheduler never counted as idle."""
        if self._extend_batch is None:
            raise LocalTransitionError("no extend in flight to retract")
        reqs = [r.req for r in self._extending]
        for record in self._extending:
            self._move(record, LocalState.RETRACTED)
            record.req = None
        self.counters.add("local_prefill_retracted_total", len(reqs))
        self._extend_batch, self._extending, self._mixed_reqs = None, [], []
        return reqs

    # ---- read-only -------------------------------------------------------------------------------
    def rid_is_live(self, rid: str) -> bool:
        """True while a request under `rid` is QUEUED or EXTENDING here: `enqueue` refuses a second one, so a
        caller asks before it declines the room to prefill (after the decline the request is decode's alone)."""
        record = self._records.get(str(rid))
        return record is not None and record.state in (LocalState.QUEUED, LocalState.EXTENDING)

    def holds(self, req: Any) -> bool:
        """True while `req` is QUEUED here (admitted for a local extend, not yet run)."""
        record = self._records.get(str(req.rid))
        return record is not None and record.state is LocalState.QUEUED and record.req is req

    def num_pending(self) -> int:
        """Requests holding pages here: QUEUED plus those in the extend not yet joined."""
        return len(self._queue) + len(self._extending)

    def queued_records(self) -> list[LocalRecord]:
        """QUEUED records in FIFO order (read-only view)."""
        return list(self._queue)

    def record(self, rid: str) -> LocalRecord | None:
        """The record of `rid`, if still kept."""
        return self._records.get(rid)

    def snapshot(self, max_recent: int = 256) -> dict:
        """JSON-able view: settings, counters (from PDCounters), the most recent records."""
        count = lambda name: int(self.counters.get(name))  # noqa: E731
        recent = list(self._records.values())[-max_recent:]
        return {
            "threshold": self.threshold, "step_tokens": self.step_tokens, "balance_tokens": self.balance_tokens,
            "num_requests": count("local_prefill_requests_total"), "num_tokens": count("local_prefill_tokens_total"),
            "num_balanced": count("local_prefill_balanced_total"),
            "num_extends": count("local_prefill_extends_total"),
            "num_mixed_extends": count("local_prefill_mixed_extends_total"),
            "num_aborted": count("local_prefill_aborted_total"),
            "num_failed": count("local_prefill_failed_total"),
            "num_retracted": count("local_prefill_retracted_total"),
            "num_deferred_steps": count("local_prefill_deferred_steps_total"),
            "fallbacks": {r.value: count(f"local_prefill_fallback_{r.value}_total") for r in LocalFallback},
            "num_queued": len(self._queue), "num_extending": len(self._extending),
            "requests": {r.rid: {"state": r.state.value, "decode_prefix_len": r.decode_prefix_len,
                                 "num_uncached": r.num_uncached, "abort_seen": r.abort_seen,
                                 "admitted_ms": r.admitted_ms,
                                 "queued_ms": _ms(r.queued_at_s, r.extend_at_s),
                                 "extend_to_join_ms": _ms(r.extend_at_s, r.joined_at_s)} for r in recent},
        }

    # ---- internals -------------------------------------------------------------------------------
    def _move(self, record: LocalRecord, new_state: LocalState) -> None:
        if new_state not in TRANSITIONS[record.state]:
            raise LocalTransitionError(f"{record.rid}: {record.state.value} -> {new_state.value} not allowed")
        record.state = new_state

    def _publish_queued(self) -> None:
        self.counters.set("local_prefill_queued", len(self._queue))

    def _trim(self) -> None:
        done = (LocalState.JOINED, LocalState.ABORTED, LocalState.FAILED)
        while len(self._records) > self.max_records:
            oldest = next(iter(self._records))
            if self._records[oldest].state not in done:
                break  # never forget a live request
            del self._records[oldest]


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(1000 * (end - start), 3)
