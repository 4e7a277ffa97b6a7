"""LockLedger: every radix-tree lock with its owner, released exactly once.

SGLang hands out `TreeLock` objects from `BasePrefixCache.lock(node)` and takes them back in
`unlock(lock)`. The ledger sits on both (see hooks.py): each lock taken is recorded with its owner
(a request id) and node; each release removes exactly that record. A second release of the same
lock, or the release of a lock the ledger never saw, is counted and logged, and a second release is
NOT passed on to the tree (it would drive lock_ref negative and make protected pages evictable).

Owner: the innermost `owner_scope(rid)` if one is active, else the `rid` of the nearest caller
frame holding a request (`req` / `decode_req.req`), else the caller's function name.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator

logger = logging.getLogger(__name__)

_OWNER: contextvars.ContextVar[tuple[str, int | None] | None] = contextvars.ContextVar(
    "sglang_pd_lock_owner", default=None)
_RELEASED_MARK = "_sglang_pd_released"
_UNKNOWN_OWNER = "<unknown>"


@contextlib.contextmanager
def owner_scope(owner: str, num_tokens: int | None = None) -> Iterator[None]:
    """Attribute every lock taken inside this block to `owner` (usually a request id).

    `num_tokens`: tokens on the locked path, when the caller knows it (trees whose nodes cannot be
    walked from Python, e.g. the Rust-core UnifiedRadixCache, do not tell the ledger otherwise).
    """
    token = _OWNER.set((owner, num_tokens))
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


class LockLedger:
    """Outstanding locks keyed by the TreeLock object; counters for misuse.

    Not thread-safe: SGLang takes and releases tree locks on the scheduler thread only.
    """

    def __init__(self):
        self._active: dict[int, tuple[Any, LockRecord]] = {}  # id(TreeLock) -> (TreeLock, record)
        self.num_locks = 0
        self.num_releases = 0
        self.num_double_releases = 0
        self.num_unknown_releases = 0

    # ---- mutating -------------------------------------------------------------------------------
    def record_lock(self, lock: Any, num_tokens: int | None) -> LockRecord | None:
        """Record a TreeLock just returned by `lock()`; None locks (disabled tree) are ignored.

        Owner and (if `num_tokens` is None) size come from the active owner_scope, else the owner
        is found on the caller's stack.
        """
        if lock is None:
            return None
        scope = _OWNER.get()
        if scope is not None:
            owner, scoped_tokens = scope
            num_tokens = num_tokens if num_tokens is not None else scoped_tokens
        else:
            owner = _owner_from_stack()
        record = LockRecord(owner, lock.node, num_tokens, time.monotonic())
        self._active[id(lock)] = (lock, record)
        self.num_locks += 1
        return record

    def record_release(self, lock: Any) -> bool:
        """Account for `unlock(lock)`. Returns True if the tree should really release it.

        False means a double release: counted, logged, and the caller must not touch the tree.
        An unknown lock (taken before the ledger existed or outside lock()) is counted, logged and
        passed through, because the tree did take it.
        """
        if lock is None:
            return False
        if getattr(lock, _RELEASED_MARK, False):
            self.num_double_releases += 1
            logger.error("sglang_pd: lock on node %s released twice (caller %s); second release ignored",
                         _node_name(lock.node), _owner_from_stack(depth=2))
            return False
        entry = self._active.pop(id(lock), None)
        object.__setattr__(lock, _RELEASED_MARK, True)
        if entry is None:
            self.num_unknown_releases += 1
            logger.error("sglang_pd: release of a lock the ledger never recorded (node %s, caller %s)",
                         _node_name(lock.node), _owner_from_stack(depth=2))
        self.num_releases += 1
        return True

    # ---- read-only ------------------------------------------------------------------------------
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

    def summary(self, max_owners: int = 32) -> dict:
        """JSON-able counters plus the oldest outstanding owners."""
        now = time.monotonic()
        oldest = self.outstanding()[:max_owners]
        return {
            "num_outstanding": len(self._active),
            "num_locks": self.num_locks,
            "num_releases": self.num_releases,
            "num_double_releases": self.num_double_releases,
            "num_unknown_releases": self.num_unknown_releases,
            "oldest": [{"owner": r.owner, "num_tokens": r.num_tokens, "age_s": round(now - r.taken_at, 3)}
                       for r in oldest],
        }
