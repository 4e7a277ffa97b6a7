"""Hooks on SGLang's radix trees (mem_cache/): the LockLedger on lock/unlock, evicted tokens counted.

`BasePrefixCache.lock/unlock` serve RadixCache; `UnifiedRadixCache` (the servers' default, Rust core)
overrides both and has its own `_evict` under `evict` and `evict_for_alloc`.
"""

from __future__ import annotations

import logging

from sglang_pd.srt.state import current

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


def _record_lock(lock, node) -> None:
    state = current()
    try:
        if lock is not None:
            state.lock_ledger.record_lock(lock, _path_tokens(node))
    except Exception:  # the ledger must never take the scheduler down
        state.hook_failed("lock", "ledger failed to record a lock")


def after_lock(lock, tree_cache, node):
    """Record every TreeLock BasePrefixCache hands out, with its owner."""
    _record_lock(lock, node)
    return lock


def after_unified_lock(lock, tree_cache, node_id, skip_lock_components=()):
    """Same for UnifiedRadixCache.lock (node ids are opaque ints: sizes come from the owner scope)."""
    _record_lock(lock, node_id)
    return lock


def around_unlock(original, tree_cache, lock):
    """Release through the ledger: a second release of the same lock never reaches the tree."""
    state = current()
    try:
        release = lock is None or state.lock_ledger.record_release(lock)
    except Exception:
        state.hook_failed("unlock", "ledger failed to record a release")
        release = True
    return original(tree_cache, lock) if release else None


def _count_evicted(result) -> None:
    num = getattr(result, "num_tokens_evicted", 0) or 0
    if num:
        current().counters.add("evicted_tokens_total", num)


def after_radix_evict(result, tree_cache, params):
    """Count tokens RadixCache evicted (evict_for_alloc goes through evict)."""
    _count_evicted(result)
    return result


def after_unified_evict(result, tree_cache, params, available_size_targets=None, *,
                        allocation_reclaim_satisfied=None):
    """Count tokens UnifiedRadixCache evicted (evict and evict_for_alloc both end in _evict)."""
    _count_evicted(result)
    return result
