"""AdmissionRound (batched eviction) on real trees/allocators with SGLang's match_kv_cache.

Every test ends with the ledger empty and check_integrity() passing: each lock the round took was
released exactly once, whether SGLang's loop took the planned match or not.
"""

import pytest

from conftest import POOL_TOKENS, make_req
from sglang_pd.srt.state import current
from sglang_pd.srt.admission import AdmissionRound, PoolSizer
from sglang_pd.srt.mem_cache import kv_to_page_num
from sglang_pd.srt.mem_cache import LockState

pytestmark = pytest.mark.unit


def _fill_with_cache(pool, first_token: int, seq_len: int) -> int:
    """Cache distinct sequences until the pool is full; returns how many."""
    num = 0
    while pool.allocator.available_size() >= seq_len:
        pool.cache_tokens(list(range(first_token + num * 1000, first_token + num * 1000 + seq_len)))
        num += 1
    return num


def _plan(pool, reqs, reserve=0):
    from sglang.srt.mem_cache.common import match_kv_cache

    rnd = AdmissionRound(current().decode_admission)
    return rnd, rnd.plan(reqs, pool.tree, PoolSizer(pool.tree, pool.allocator, reserve), match_kv_cache)


def _preallocate(pool, rnd, req):
    """What SGLang's loop does per request after admission: take the match, allocate the rest."""
    assert rnd.take(req) is not None
    need = len(req.origin_input_ids) - current().decode_admission.plan_for(req).decode_prefix_len
    slots = pool.allocator.alloc(kv_to_page_num(need, pool.page_size) * pool.page_size)
    assert slots is not None, "the round's single eviction left too little free memory"
    return slots


def _finish(pool, reqs, slots):
    for s in slots:
        pool.allocator.free(s)
    for req in reqs:
        if req.lock is not None:
            pool.tree.unlock(req.lock)
            req.lock = None


def test_round_locks_all_evicts_once_and_every_allocation_fits(pool, ledger):
    shared = list(range(8))
    pool.cache_tokens(shared)
    _fill_with_cache(pool, 10_000, 8)
    reqs = [make_req(f"r{i}", shared + [500 + i] * 8) for i in range(3)]

    rnd, plan = _plan(pool, reqs)

    assert plan.rids == ("r0", "r1", "r2") and plan.num_refused == 0
    assert plan.num_alloc_tokens == 24 and plan.num_evicted_tokens >= 24 - (POOL_TOKENS % 8)
    assert rnd.snapshot()["num_evictions"] == 1 and ledger.owners() == {"r0": 1, "r1": 1, "r2": 1}
    assert [ledger.state_of(r.lock) for r in reqs] == [LockState.PLANNED] * 3  # the round holds them
    slots = [_preallocate(pool, rnd, r) for r in reqs]  # no further eviction needed
    assert [ledger.state_of(r.lock) for r in reqs] == [LockState.HELD] * 3  # SGLang's rows own them now
    assert rnd.close() == 0
    assert pool.match(shared).device_prefix_len == 8  # the locked shared prefix survived the eviction
    _finish(pool, reqs, slots)
    assert ledger.owners() == {} and pool.integrity(ledger).ok


def test_candidate_that_does_not_fit_releases_its_lock_and_ends_the_round(pool, ledger):
    shared = list(range(8))
    pool.cache_tokens(shared)
    reqs = [make_req(f"big{i}", shared + [700 + i] * 24) for i in range(3)]  # 24 new tokens each

    rnd, plan = _plan(pool, reqs)

    assert plan.rids == ("big0", "big1") and plan.num_refused == 1  # 8 + 24 + 24 <= 64 < 8 + 72
    assert reqs[2].lock is None and set(ledger.owners()) == {"big0", "big1"}
    assert rnd.close() == 2  # SGLang's loop took none: both planned locks come back
    assert ledger.owners() == {} and ledger.num_double_releases == 0 and pool.integrity(ledger).ok


def test_untaken_matches_are_released_once_taken_ones_stay_with_their_request(pool, ledger):
    shared = list(range(8))
    pool.cache_tokens(shared)
    reqs = [make_req(f"t{i}", shared + [900 + i] * 4) for i in range(3)]
    rnd, plan = _plan(pool, reqs)
    slots = [_preallocate(pool, rnd, reqs[0])]
    assert rnd.take(reqs[0]) is None  # handed over once
    untaken = [reqs[1].lock, reqs[2].lock]
    assert rnd.close() == 2 and set(ledger.owners()) == {"t0"}
    assert [ledger.state_of(lock) for lock in untaken] == [LockState.RELEASED] * 2
    _finish(pool, reqs, slots)
    assert ledger.owners() == {} and ledger.num_double_releases == 0 and pool.integrity(ledger).ok


def test_second_plan_while_round_open_is_refused(pool, ledger):
    pool.cache_tokens(list(range(8)))
    rnd, _ = _plan(pool, [make_req("o1", list(range(8)) + [1])])
    from sglang.srt.mem_cache.common import match_kv_cache

    with pytest.raises(RuntimeError, match="still holds locks"):
        rnd.plan([make_req("o2", [5])], pool.tree, PoolSizer(pool.tree, pool.allocator), match_kv_cache)
    rnd.close()
    assert ledger.owners() == {} and pool.integrity(ledger).ok


# ---- two queued requests under one rid (several tokenizer workers / DP, or a direct scheduler call) ----
def test_duplicate_rid_both_planned_each_takes_its_own_match(pool, ledger):
    """Each request keeps its own entry and lock: take() hands each its own match, nothing leaks."""
    pool.cache_tokens(list(range(8)))
    pool.cache_tokens(list(range(100, 104)))
    first = make_req("dup", list(range(8)) + [1, 2])         # 8-token prefix in the tree
    second = make_req("dup", list(range(100, 104)) + [3, 4])  # 4-token prefix in the tree

    rnd, plan = _plan(pool, [first, second])

    assert plan.rids == ("dup", "dup") and plan.num_refused == 0
    assert first.lock is not second.lock and ledger.owners() == {"dup": 2}
    assert [ledger.state_of(r.lock) for r in (first, second)] == [LockState.PLANNED] * 2
    assert rnd.take(first).device_prefix_len == 8 and rnd.take(second).device_prefix_len == 4
    assert [ledger.state_of(r.lock) for r in (first, second)] == [LockState.HELD] * 2
    assert rnd.close() == 0
    _finish(pool, [first, second], [])
    assert ledger.owners() == {} and ledger.num_double_releases == 0 and pool.integrity(ledger).ok
    assert rnd.snapshot()["num_duplicate_rids"] == 1  # counted (and logged) once


def test_duplicate_rid_untaken_matches_are_both_released_at_close(pool, ledger):
    pool.cache_tokens(list(range(8)))
    reqs = [make_req("dup", list(range(8)) + [10 + i] * 4) for i in range(2)]
    rnd, plan = _plan(pool, reqs)
    locks = [r.lock for r in reqs]
    assert plan.rids == ("dup", "dup") and ledger.owners() == {"dup": 2}
    assert rnd.close() == 2  # SGLang's loop took neither
    assert [ledger.state_of(lock) for lock in locks] == [LockState.RELEASED] * 2
    assert ledger.owners() == {} and ledger.num_double_releases == 0 and pool.integrity(ledger).ok


def test_duplicate_rid_refused_second_releases_only_its_own_lock(pool, ledger):
    """The candidate that does not fit gives back its own lock; the first one's stays planned, then closes."""
    pool.cache_tokens(list(range(8)))
    small = make_req("dup", list(range(8)) + [20] * 4)
    big = make_req("dup", list(range(8)) + [30] * 60)  # 60 new tokens: more than the 64-token pool holds
    rnd, plan = _plan(pool, [small, big])
    assert plan.rids == ("dup",) and plan.num_refused == 1 and big.lock is None
    assert ledger.state_of(small.lock) is LockState.PLANNED
    assert rnd.close() == 1
    assert ledger.owners() == {} and ledger.num_double_releases == 0 and pool.integrity(ledger).ok
