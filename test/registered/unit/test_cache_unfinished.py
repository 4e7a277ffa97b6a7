"""maybe_cache_unfinished_req on a real ReqToTokenPool + allocator + tree with real requests."""

from array import array

import pytest

from conftest import POOL_TOKENS, make_req
from sglang_pd.srt.mem_cache.page_math import is_tree_exempt, maybe_cache_unfinished_req
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.mem_cache import check_integrity

pytestmark = pytest.mark.unit


@pytest.fixture(params=["radix", "unified"])
def stack(request):
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    rows = ReqToTokenPool(size=4, max_context_len=POOL_TOKENS, device="cpu", enable_memory_saver=False)
    alloc, tree = paged_tree(request.param, POOL_TOKENS, 1, req_to_token_pool=rows)
    return rows, alloc, tree


def _running(rows, alloc, rid, ids, host="127.0.0.1"):
    """A request whose prompt KV is computed and sits in its row, as after a decode prebuilt step."""
    req = make_req(rid, ids, host)
    rows.alloc([req])
    slots = alloc.alloc(len(ids))
    rows.write((req.kv.req_pool_idx, slice(0, len(ids))), slots)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = len(ids)
    req.full_untruncated_fill_ids = array("q", ids)
    req.extend_end = len(ids)
    return req, slots


def test_normal_request_is_published(stack, ledger):
    rows, alloc, tree = stack
    req, _ = _running(rows, alloc, "r", list(range(10)))
    assert maybe_cache_unfinished_req(req, tree)
    assert req.prefix_len == 10
    # The running request now holds a ledgered lock on its published prefix.
    report = check_integrity(tree, alloc, ledger, idle=False)
    assert report.ok and report.protected_tokens == 10 and report.in_flight_tokens == 0, report
    assert ledger.owners() == {"r": 1}
    tree.unlock(req.lock)
    report = check_integrity(tree, alloc, ledger, idle=True)
    assert report.ok and report.evictable_tokens == 10, report


@pytest.mark.parametrize("rid,host,marked", [("w", "2.2.2.2", False), ("HEALTH_CHECK_1", "127.0.0.1", False),
                                             ("m", "127.0.0.1", True)])
def test_exempt_requests_never_enter_the_tree(stack, ledger, rid, host, marked):
    rows, alloc, tree = stack
    req, slots = _running(rows, alloc, rid, list(range(10)), host)
    req.skip_radix_cache_insert = marked
    assert is_tree_exempt(req)
    assert not maybe_cache_unfinished_req(req, tree)
    assert req.skip_radix_cache_insert and req.prefix_len == 10
    report = check_integrity(tree, alloc, ledger, idle=False)
    assert report.evictable_tokens + report.protected_tokens == 0 and report.in_flight_tokens == 10
    alloc.free(slots)
    assert check_integrity(tree, alloc, ledger, idle=True).ok


def test_finished_request_is_refused(stack):
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    rows, alloc, tree = stack
    req, _ = _running(rows, alloc, "done", list(range(4)))
    req.finished_reason = FINISH_LENGTH(length=4)
    with pytest.raises(ValueError, match="is finished"):
        maybe_cache_unfinished_req(req, tree)
