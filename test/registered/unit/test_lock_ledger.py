"""LockLedger + check_integrity on real trees (RadixCache and the Rust-core UnifiedRadixCache) and a
real paged allocator, with the real lock/unlock hooks applied through SGLang's HookRegistry."""

import pytest

from sglang_pd.srt.mem_cache import owner_scope

pytestmark = pytest.mark.unit


def test_balanced_lock_unlock_is_clean(pool, ledger):
    pool.cache_tokens(list(range(12)))
    node = pool.match(list(range(12))).last_device_node
    with owner_scope("req-a", num_tokens=12):
        lock = pool.tree.lock(node)
    assert ledger.owners() == {"req-a": 1}
    busy = pool.integrity(ledger, idle=False)
    assert busy.ok, busy.problems
    assert busy.protected_tokens == 12 and busy.num_outstanding_locks == 1
    assert not pool.integrity(ledger, idle=True).ok  # idle with a lock held is a leak
    pool.tree.unlock(lock)
    report = pool.integrity(ledger)
    assert report.ok, report.problems
    assert (report.evictable_tokens, report.protected_tokens, report.in_flight_tokens) == (12, 0, 0)
    assert ledger.summary()["num_releases"] == 1


def test_double_release_is_counted_and_never_reaches_the_tree(pool, ledger):
    pool.cache_tokens(list(range(8)))
    node = pool.match(list(range(8))).last_device_node
    with owner_scope("a", 8):
        first = pool.tree.lock(node)
    with owner_scope("b", 8):
        second = pool.tree.lock(node)
    pool.tree.unlock(first)
    pool.tree.unlock(first)  # the bug being guarded against
    assert ledger.num_double_releases == 1
    assert pool.protected() == 8, "the double release must not drop b's lock"
    assert pool.integrity(ledger, idle=False).ok
    pool.tree.unlock(second)
    report = pool.integrity(ledger)
    assert report.ok and report.protected_tokens == 0


def test_unknown_release_is_counted_and_passed_through(pool, ledger):
    from sglang.srt.mem_cache.base_prefix_cache import TreeLock

    pool.cache_tokens(list(range(8)))
    node = pool.match(list(range(8))).last_device_node
    stray = TreeLock(node, pool.tree.inc_lock_ref(node).to_dec_params())  # taken around lock()
    assert not pool.integrity(ledger, idle=False).ok  # protected tokens no lock explains
    pool.tree.unlock(stray)
    assert ledger.num_unknown_releases == 1 and pool.protected() == 0
    assert pool.integrity(ledger).ok


def test_owner_from_calling_request(pool, ledger):
    """Without an owner_scope, the owner is the rid of the request in the calling frame."""
    pool.cache_tokens(list(range(8)))
    node = pool.match(list(range(8))).last_device_node

    class _Req:
        rid = "rid-from-frame"

    def upstream_like_caller(req):
        return pool.tree.lock(node)

    lock = upstream_like_caller(_Req())
    assert ledger.owners() == {"rid-from-frame": 1}
    pool.tree.unlock(lock)
    assert ledger.owners() == {}


def test_integrity_detects_a_leaked_allocation(pool, ledger):
    pool.cache_tokens(list(range(8)))
    leaked = pool.allocator.alloc(pool.page_size)  # held by no request, not in the tree
    report = pool.integrity(ledger)
    assert not report.ok and report.in_flight_tokens == pool.page_size
    assert any("leak" in p for p in report.problems)
    pool.allocator.free(leaked)
    assert pool.integrity(ledger).ok


def test_integrity_detects_node_lock_ref_drift():
    """Python-node trees also get the per-node check (lock_ref vs ledger)."""
    from sglang_pd.srt.mem_cache import LockLedger
    from sglang_pd.srt.mem_cache import check_integrity
    from conftest import Pool

    pool, ledger = Pool("radix", 1), LockLedger()
    pool.cache_tokens(list(range(8)))
    node = pool.match(list(range(8))).last_device_node
    node.lock_ref += 1  # a lock nobody recorded, tree size counters untouched
    problems = check_integrity(pool.tree, pool.allocator, ledger, idle=False).problems
    assert any("lock_ref 1 but the ledger holds 0" in p for p in problems)
    assert any("its nodes hold" in p for p in problems)
    node.lock_ref -= 1
    assert check_integrity(pool.tree, pool.allocator, ledger, idle=True).ok


def test_lock_lifecycle_follows_the_one_transition_table(pool, ledger):
    """PLANNED -> HELD -> RELEASED is allowed; anything else is refused and counted, and a refused
    release (the second one) never reaches the tree."""
    from sglang_pd.srt.mem_cache.lock_ledger import TRANSITIONS, LockState, LockTransitionError

    assert TRANSITIONS[LockState.RELEASED] == frozenset()
    pool.cache_tokens(list(range(8)))
    node = pool.match(list(range(8))).last_device_node
    with owner_scope("planned-req", 8, state=LockState.PLANNED):
        lock = pool.tree.lock(node)
    assert ledger.state_of(lock) is LockState.PLANNED
    assert ledger.summary()["oldest"][0]["state"] == "planned"
    ledger.transition(lock, LockState.HELD)
    with pytest.raises(LockTransitionError, match="held -> planned not allowed"):
        ledger.transition(lock, LockState.PLANNED)
    with pytest.raises(LockTransitionError, match="held -> released not allowed"):
        ledger.transition(lock, LockState.RELEASED)  # releases go through unlock (record_release) only
    pool.tree.unlock(lock)
    assert ledger.state_of(lock) is LockState.RELEASED
    with pytest.raises(LockTransitionError, match="released -> held not allowed"):
        ledger.transition(lock, LockState.HELD)
    pool.tree.unlock(lock)  # RELEASED -> RELEASED: refused, never reaches the tree
    assert ledger.summary()["num_refused_transitions"] == 4 and ledger.num_double_releases == 1
    assert ledger.counters.get("tree_locks_outstanding") == 0  # the gauge follows every lock and release
    assert pool.integrity(ledger).ok
    with pytest.raises(LockTransitionError, match="cannot start in state released"):
        with owner_scope("x", state=LockState.RELEASED):
            pass
