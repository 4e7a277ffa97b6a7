"""LockLedger: every radix-tree lock with its owner and lifecycle state, released exactly once.

SGLang hands out `TreeLock` objects from `BasePrefixCache.lock(node)` and takes them back in
`unlock(lock)`. The ledger sits on both (srt/hooks/scheduling/prefix_cache.py): each lock taken is recorded with
its owner (a request id), node and `LockState`; every state change goes through `transition()`,
which refuses what `TRANSITIONS` does not allow. A second release of the same lock is such a refused
change: counted, logged, and NOT passed on to the tree (it would drive lock_ref negative and make
protected pages evictable). The release of a lock the ledger never saw is counted and passed through.

Lifecycle of a decode request's prefix lock (one table, `TRANSITIONS`):

    lock() --round plan--> PLANNED --SGLang's prealloc loop takes it--> HELD --release--> RELEASED
    lock() --per-request admission, resume, SGLang's own lock swaps----> HELD
    PLANNED --refused in the round / not taken when the round closes--> RELEASED

Owner: the innermost `owner_scope(rid)` if one is active, else the `rid` of the nearest caller
frame holding a request (`req` / `decode_req.req`), else `<unknown>`.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Iterator

from sglang_pd.srt.metrics import PDCounters

logger = logging.getLogger(__name__)

_UNKNOWN_OWNER = "<unknown>"
_RELEASED_MARK = "_sglang_pd_released"  # set on a TreeLock once released: a second release is refused


class LockState(str, enum.Enum):
    """Where a recorded tree lock is in its life."""

    PLANNED = "planned"    # taken by an admission round; SGLang's prealloc loop has not taken it over
    HELD = "held"          # owned by the request's row; SGLang's release path gives it back
    RELEASED = "released"  # given back to the tree: terminal


TRANSITIONS: dict[LockState, frozenset[LockState]] = {
    LockState.PLANNED: frozenset({LockState.HELD, LockState.RELEASED}),
    LockState.HELD: frozenset({LockState.RELEASED}),
    LockState.RELEASED: frozenset(),  # a second release is refused before it reaches the tree
}
INITIAL_STATES = frozenset({LockState.PLANNED, LockState.HELD})


class LockTransitionError(RuntimeError):
    """A state change TRANSITIONS does not allow (a bug in whoever asked for it)."""


@dataclass(frozen=True)
class _Scope:
    owner: str
    num_tokens: int | None
    state: LockState


_OWNER: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("sglang_pd_lock_owner", default=None)


@contextlib.contextmanager
def owner_scope(owner: str, num_tokens: int | None = None, state: LockState = LockState.HELD) -> Iterator[None]:
    """Attribute every lock taken inside this block to `owner` (usually a request id), in `state`.

    `num_tokens`: tokens on the locked path, when the caller knows it (trees whose nodes cannot be
    walked from Python, e.g. the Rust-core UnifiedRadixCache, do not tell the ledger otherwise).
    """
    if state not in INITIAL_STATES:
        raise LockTransitionError(f"a lock cannot start in state {state.value}")
    token = _OWNER.set(_Scope(owner, num_tokens, state))
    try:
        yield
    finally:
        _OWNER.reset(token)


def _owner_from_stack(depth: int = 3, max_frames: int = 6) -> str:
    frame = sys._getframe(depth)
    for _ in range(max_frames):
        if frame is None:
            break
        local = frame.f_locals
        req = local.get("req")
        if req is None and local.get("decode_req") is not None:
            req = getattr(local["decode_req"], "req", None)
        rid = getattr(req, "rid", None)
        if rid is not None:
            return str(rid)
        frame = frame.f_back
    return _UNKNOWN_OWNER


def _node_name(node: Any) -> str:
    return str(node) if isinstance(node, int) else f"0x{id(node):x}"


@dataclass(frozen=True)
class LockRecord:
    """One outstanding lock."""

    owner: str
    node: Any
    num_tokens: int | None  # tokens on the locked path (root excluded); None = unknown
    taken_at: float
    state: LockState


class LockLedger:
    """Outstanding locks keyed by the TreeLock object, with their lifecycle state.

    Mutating: `record_lock`, `transition`, `record_release`. Counts into `counters` (PDCounters).
    Not thread-safe: SGLang takes and releases tree locks on the scheduler thread only.
    """

    def __init__(self, counters: PDCounters | None = None, max_recent: int = 256):
        self.counters = counters if counters is not None else PDCounters()
        self._active: dict[int, tuple[Any, LockRecord]] = {}  # id(TreeLock) -> (TreeLock, record)
        # the latest releases (owner, tokens, state it was released from, seconds held): what tests
        # assert an exit path really released
        self._recent: deque[dict] = deque(maxlen=max_recent)

    # ---- mutating -------------------------------------------------------------------------------
    def record_lock(self, lock: Any, num_tokens: int | None) -> LockRecord | None:
        """Record a TreeLock just returned by `lock()`; None locks (disabled tree) are ignored.

        Owner, state and (if `num_tokens` is None) size come from the active owner_scope (state HELD
        without one); else the owner is found on the caller's stack.
        """
        if lock is None:
            return None
        scope = _OWNER.get()
        if scope is not None:
            owner, state = scope.owner, scope.state
            num_tokens = num_tokens if num_tokens is not None else scope.num_tokens
        else:
            owner, state = _owner_from_stack(), LockState.HELD
        record = LockRecord(owner, lock.node, num_tokens, time.monotonic(), state)
        self._active[id(lock)] = (lock, record)
        self.counters.add("tree_locks_total")
        self._publish_outstanding()
        return record

    def transition(self, lock: Any, new_state: LockState) -> LockRecord:
        """Move an outstanding `lock` to `new_state`; raises LockTransitionError if not allowed.

        RELEASED goes through `record_release` (it also decides whether the tree may see it).
        """
        entry = self._active.get(id(lock))
        state = self.state_of(lock)
        if new_state is LockState.RELEASED or state is None or new_state not in TRANSITIONS[state]:
            self.counters.add("tree_lock_refused_transitions_total")
            raise LockTransitionError(f"lock on node {_node_name(lock.node)}: "
                                      f"{state.value if state else 'unrecorded'} -> {new_state.value} not allowed")
        record = replace(entry[1], state=new_state)
        self._active[id(lock)] = (lock, record)
        return record

    def record_release(self, lock: Any) -> bool:
        """Account for `unlock(lock)`. Returns True if the tree should really release it.

        False means a double release (RELEASED -> RELEASED is not in the table): counted, logged,
        and the caller must not touch the tree. An unknown lock (taken before the ledger existed or
        outside lock()) is counted, logged and passed through, because the tree did take it.
        """
        if lock is None:
            return False
        if getattr(lock, _RELEASED_MARK, False):
            self.counters.add("tree_lock_double_releases_total")
            self.counters.add("tree_lock_refused_transitions_total")
            logger.error("sglang_pd: lock on node %s released twice (caller %s); second release ignored",
                         _node_name(lock.node), _owner_from_stack(depth=2))
            return False
        entry = self._active.pop(id(lock), None)
        object.__setattr__(lock, _RELEASED_MARK, True)  # TreeLock may be a frozen dataclass
        if entry is not None:
            rec = entry[1]
            self._recent.append({"owner": rec.owner, "num_tokens": rec.num_tokens, "from_state": rec.state.value,
                                 "held_s": round(time.monotonic() - rec.taken_at, 3)})
        if entry is None:
            self.counters.add("tree_lock_unknown_releases_total")
            logger.error("sglang_pd: release of a lock the ledger never recorded (node %s, caller %s)",
                         _node_name(lock.node), _owner_from_stack(depth=2))
        self.counters.add("tree_lock_releases_total")
        self._publish_outstanding()
        return True

    def _publish_outstanding(self) -> None:
        self.counters.set("tree_locks_outstanding", len(self._active))

    # ---- read-only ------------------------------------------------------------------------------
    def state_of(self, lock: Any) -> LockState | None:
        """The recorded state of `lock` (RELEASED once released; None if never recorded)."""
        entry = self._active.get(id(lock))
        if entry is not None:
            return entry[1].state
        return LockState.RELEASED if getattr(lock, _RELEASED_MARK, False) else None

    def outstanding(self) -> list[LockRecord]:
        """Records of locks taken and not yet released, oldest first."""
        return sorted((rec for _, rec in self._active.values()), key=lambda r: r.taken_at)

    def locked_nodes(self) -> list[Any]:
        """The node of every outstanding lock (one entry per lock)."""
        return [lock.node for lock, _ in self._active.values()]

    def owners(self) -> dict[str, int]:
        """Outstanding lock count per owner."""
        counts: dict[str, int] = {}
        for rec in self.outstanding():
            counts[rec.owner] = counts.get(rec.owner, 0) + 1
        return counts

    def _count(self, name: str) -> int:
        return int(self.counters.get(name))

    @property
    def num_locks(self) -> int:
        return self._count("tree_locks_total")

    @property
    def num_releases(self) -> int:
        return self._count("tree_lock_releases_total")

    @property
    def num_double_releases(self) -> int:
        return self._count("tree_lock_double_releases_total")

    @property
    def num_unknown_releases(self) -> int:
        return self._count("tree_lock_unknown_releases_total")

    def summary(self, max_owners: int = 32) -> dict:
        """JSON-able counters, outstanding locks per owner, the oldest ones with their states, and the
        latest releases."""
        now = time.monotonic()
        oldest = self.outstanding()[:max_owners]
        return {
            "num_outstanding": len(self._active),
            "owners": self.owners(),
            "num_locks": self.num_locks,
            "num_releases": self.num_releases,
            "num_double_releases": self.num_double_releases,
            "num_unknown_releases": self.num_unknown_releases,
            "num_refused_transitions": self._count("tree_lock_refused_transitions_total"),
            "oldest": [{"owner": r.owner, "state": r.state.value, "num_tokens": r.num_tokens,
                        "age_s": round(now - r.taken_at, 3)} for r in oldest],
            "recent_releases": list(self._recent),
        }
