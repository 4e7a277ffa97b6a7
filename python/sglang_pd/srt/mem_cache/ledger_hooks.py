"""Thin hooks putting the LockLedger on SGLang's tree lock/unlock (fail-safe: never break the tree)."""

from __future__ import annotations

import logging

from sglang_pd.process_state import STATE

logger = logging.getLogger(__name__)


def _path_tokens(node) -> int | None:
    """Tokens from the root to a Python TreeNode; None for opaque node ids (Rust-core trees)."""
    if not hasattr(node, "parent"):
        return None
    num = 0
    while node is not None and node.parent is not None:
        num += len(node.key)
        node = node.parent
    return num


def after_lock(lock, tree_cache, node, *args, **kwargs):
    """Record every TreeLock the tree hands out, with its owner."""
    try:
        if lock is not None:
            STATE.lock_ledger.record_lock(lock, _path_tokens(node))
    except Exception:  # the ledger must never take the scheduler down
        STATE.count_hook_error("lock")
        logger.exception("sglang_pd: ledger failed to record a lock")
    return lock


def around_unlock(original, tree_cache, lock):
    """Release through the ledger: a second release of the same lock never reaches the tree."""
    try:
        release = lock is None or STATE.lock_ledger.record_release(lock)
    except Exception:
        STATE.count_hook_error("unlock")
        logger.exception("sglang_pd: ledger failed to record a release")
        release = True
    return original(tree_cache, lock) if release else None
