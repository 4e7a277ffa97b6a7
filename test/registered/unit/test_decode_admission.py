"""DecodePrefixAdmission on real trees/allocators/requests with SGLang's own match_kv_cache."""

import pytest

from conftest import make_req
from sglang_pd.srt.admission.decode_admission import RequestKind
from sglang_pd.srt.mem_cache import kv_to_page_num

pytestmark = pytest.mark.unit


def ledger_admission():
    """The installed process state's DecodePrefixAdmission (the `ledger` fixture installs a fresh state)."""
    from sglang_pd.srt.state import current

    return current().decode_admission


def _admit(pool, req, kind=RequestKind.NORMAL):
    from sglang.srt.mem_cache.common import match_kv_cache

    ledger_admission().match_and_lock(req, pool.tree, kind, match_kv_cache)
    return ledger_admission().plan_for(req)


def test_miss_plans_every_page_and_holds_nothing(pool, ledger):
    req = make_req("miss", list(range(100, 111)))
    plan = _admit(pool, req)
    assert (plan.matched_len, plan.decode_prefix_len) == (0, 0)
    assert plan.num_new_pages == kv_to_page_num(11, pool.page_size)
    assert req.lock is None and ledger.owners() == {} and pool.protected() == 0
    assert pool.integrity(ledger).ok


def test_refused_attempt_lock_is_released_on_retry(pool, ledger):
    """SGLang's budget refusal keeps the lock of a request and re-admits it later."""
    pool.cache_tokens(list(range(8)))
    req = make_req("retry", list(range(8)) + [300, 301])
    first = _admit(pool, req)
    assert ledger.owners() == {"retry": 1} and first.decode_prefix_len == 8
    second = _admit(pool, req)  # retried without the lock ever being given back
    assert second == first and ledger.owners() == {"retry": 1}
    snap = ledger_admission().snapshot()
    assert snap["num_stale_locks_released"] == 1 and snap["num_replans"] == 1
    pool.tree.unlock(req.lock)
    assert pool.integrity(ledger).ok and ledger.num_double_releases == 0


def test_hit_is_page_aligned_and_locked_before_prealloc(pool, ledger):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    pool.cache_tokens(list(range(10)))  # the tree keeps the page-aligned part
    cached = 10 - 10 % pool.page_size
    req = make_req("hit", list(range(10)) + [500, 501])
    plan = _admit(pool, req)
    assert plan.decode_prefix_len == cached and plan.decode_prefix_len % pool.page_size == 0
    assert plan.num_new_pages == kv_to_page_num(12 - cached, pool.page_size)
    # Locked before any allocation: eviction pressure cannot take the matched prefix away.
    pool.tree.evict(EvictParams(num_tokens=10_000))
    assert pool.protected() == cached and pool.match(list(range(12))).device_prefix_len == cached
    assert pool.integrity(ledger, idle=False).ok
    pool.tree.unlock(req.lock)
    report = pool.integrity(ledger)
    assert report.ok and report.evictable_tokens == cached


def test_full_prefix_hit_moves_no_page(pool, ledger):
    prompt = list(range(16))  # a multiple of every page size under test
    pool.cache_tokens(prompt + [77, 78, 79, 80])  # an earlier turn: prompt + its output
    req = make_req("full", prompt)
    plan = _admit(pool, req)
    assert plan.decode_prefix_len == len(prompt) and plan.num_new_pages == 0
    assert ledger_admission().record_handoff(req, plan.decode_prefix_len, 0) is None
    snap = ledger_admission().snapshot()
    assert snap["num_pages_saved"] == kv_to_page_num(16, pool.page_size)
    pool.tree.unlock(req.lock)
    assert pool.integrity(ledger).ok


@pytest.mark.parametrize("kind,host", [(RequestKind.WARMUP, "2.2.2.2"), (RequestKind.HEALTH_CHECK, None)])
def test_warmup_and_health_never_use_the_tree(pool, ledger, kind, host):
    pool.cache_tokens(list(range(8)))
    req = make_req("HEALTH_CHECK_1" if kind is RequestKind.HEALTH_CHECK else "warm", list(range(8)), host)
    plan = _admit(pool, req, kind)
    assert plan.kind is kind and plan.decode_prefix_len == 0
    assert req.skip_radix_cache_insert, "their tokens must never be inserted"
    assert pool.protected() == 0 and req.lock is None
    assert pool.integrity(ledger).ok
    assert ledger_admission().snapshot()["num_skipped_tree"] == 1


def test_request_kind_classification():
    from sglang_pd.srt.mem_cache import request_kind

    assert request_kind(make_req("a", [1], "127.0.0.1")) is RequestKind.NORMAL
    assert request_kind(make_req("a", [1], "2.2.2.2")) is RequestKind.WARMUP
    assert request_kind(make_req("HEALTH_CHECK_x", [1], "127.0.0.1")) is RequestKind.HEALTH_CHECK


def test_handoff_mismatch_is_counted(pool, ledger):
    req = make_req("h", list(range(200, 209)))
    plan = _admit(pool, req)
    assert ledger_admission().record_handoff(req, 0, plan.num_new_pages) is None
    assert ledger_admission().record_handoff(req, 0, plan.num_new_pages + 1) == plan
    assert ledger_admission().snapshot()["num_handoff_mismatches"] == 1
    assert ledger.counters.get("decode_handoff_mismatches_total") == 1  # one source: stats == metric
    assert ledger_admission().record_handoff(make_req("never-planned", [1, 2, 3]), 0, 3) is None


def test_a_replanned_request_is_counted_once_at_its_hand_off(pool, ledger):
    """Counters move when the request is handed to transfer, once, whatever re-plans came before."""
    pool.cache_tokens(list(range(8)))
    req = make_req("again", list(range(8)) + [400, 401, 402])
    for _ in range(3):  # refused twice for budget, then admitted
        plan = _admit(pool, req)
    counters = ledger.counters
    assert counters.get("decode_prompt_tokens_total") == 0, "nothing counted before the hand-off"
    ledger_admission().record_handoff(req, plan.decode_prefix_len, plan.num_new_pages)
    ledger_admission().record_handoff(req, plan.decode_prefix_len, plan.num_new_pages)  # a second hand-off
    assert counters.get("decode_prompt_tokens_total") == 11
    assert counters.get("decode_prefix_hit_tokens_total") == 8
    assert counters.get("decode_replans_total") == 2 and counters.get("decode_stale_locks_released_total") == 2
    pool.tree.unlock(req.lock)
    assert pool.integrity(ledger).ok


def test_a_request_served_locally_counts_its_prompt_and_hit_once_and_no_page(pool, ledger):
    """Decode-local prefill hands nothing to transfer: the prompt and the reused tokens are counted (decode
    admitted it and reused its prefix), once, and no page counter moves."""
    pool.cache_tokens(list(range(8)))
    req = make_req("local", list(range(8)) + [500, 501])
    plan = _admit(pool, req)
    counters = ledger.counters
    ledger_admission().record_local(req)
    ledger_admission().record_local(req)
    assert counters.get("decode_prompt_tokens_total") == 10 and counters.get("decode_prefix_hit_tokens_total") == 8
    assert counters.get("decode_pages_planned_total") == 0 and counters.get("decode_pages_saved_total") == 0
    assert ledger_admission().record_handoff(req, plan.decode_prefix_len, plan.num_new_pages) is None
    assert counters.get("decode_prompt_tokens_total") == 10, "a later hand-off does not count it again"
    pool.tree.unlock(req.lock)
    assert pool.integrity(ledger).ok


def test_two_live_requests_under_one_rid_keep_their_own_plans(pool, ledger):
    """Plans are kept per request, not per rid: the first's hand-off is checked and counted against its own
    plan, not the second's (keyed by rid it was counted a mismatch, a re-plan, with the second's figures)."""
    pool.cache_tokens(list(range(8)))
    first = make_req("dup", list(range(8)) + [1, 2])        # 8 tokens cached
    second = make_req("dup", list(range(300, 305)))         # nothing cached
    first_plan, second_plan = _admit(pool, first), _admit(pool, second)
    assert (first_plan.decode_prefix_len, second_plan.decode_prefix_len) == (8, 0)
    assert ledger_admission().plan_for(first) == first_plan and ledger_admission().plan_for(second) == second_plan
    assert ledger_admission().record_handoff(first, 8, first_plan.num_new_pages) is None
    assert ledger_admission().record_handoff(second, 0, second_plan.num_new_pages) is None
    counters = ledger.counters
    assert counters.get("decode_handoff_mismatches_total") == 0 and counters.get("decode_replans_total") == 0
    assert counters.get("decode_prompt_tokens_total") == 15 and counters.get("decode_prefix_hit_tokens_total") == 8
    assert ledger_admission().snapshot()["plans"]["dup"]["prompt_len"] == 5  # by rid: the later one shown
    pool.tree.unlock(first.lock)
    assert pool.integrity(ledger).ok and ledger.num_double_releases == 0
