"""RadixResume on a real MHATokenToKVPool + paged allocator + ReqToTokenPool + tree, SGLang's match_kv_cache.

The scenario is the server's: a request's KV lives in its row, its prompt prefix is in the tree; it is
retracted (backup to CPU, row freed, lock released); resume re-matches, locks, allocates only the rest,
and restores only the rest. The row must then hold exactly the KV it held before retraction.
"""

from array import array

import pytest
import torch

from conftest import make_req
from sglang_pd.srt.state import current
from sglang_pd.srt.admission.radix_resume import RadixResume, ResumeError, slice_cpu_backup
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.mem_cache import check_integrity

pytestmark = pytest.mark.unit

POOL = 128


class KVWorld:
    """Real SGLang KV objects on CPU: KV pool with values, paged allocator, request rows, tree."""

    def __init__(self, tree_kind: str, page_size: int):
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        self.page_size = page_size
        self.kv = MHATokenToKVPool(size=POOL, page_size=page_size, dtype=torch.float32, head_num=2, head_dim=4,
                                   layer_num=2, device="cpu", enable_memory_saver=False)
        self.kv.cpu_offloading_chunk_size = 5  # several chunks per backup, one of them ragged
        self.rows = ReqToTokenPool(size=4, max_context_len=POOL, device="cpu", enable_memory_saver=False)
        self.allocator, self.tree = paged_tree(tree_kind, POOL, page_size, kvcache=self.kv,
                                               req_to_token_pool=self.rows)

    def token_value(self, token: int, position: int) -> float:
        return float(token * 1000 + position)  # stands for "the KV this token has at this position"

    def write_kv(self, slots, tokens, start: int) -> None:
        for layer in range(2):
            for i, (slot, tok) in enumerate(zip(slots.tolist(), tokens)):
                self.kv.k_buffer[layer][slot] = self.token_value(tok, start + i) + layer
                self.kv.v_buffer[layer][slot] = -self.token_value(tok, start + i) - layer

    def row_kv(self, req, length: int) -> list[float]:
        slots = self.rows.req_to_token[req.kv.req_pool_idx, :length]
        return self.kv.k_buffer[1][slots][:, 0, 0].tolist()

    def cache_prefix(self, tokens: list[int]) -> None:
        """A finished earlier request left `tokens` (page-aligned) with their KV in the tree."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        slots = self.allocator.alloc(len(tokens))
        self.write_kv(slots, tokens, 0)
        self.tree.insert(InsertParams(key=RadixKey(token_ids=array("q", tokens)), value=slots))

    def retracted_request(self, rid: str, prompt: list[int], outputs: list[int]):
        """A request that ran (its whole KV in a fresh row), then was retracted: backed up and freed."""
        from sglang.srt.managers.schedule_batch import RetractionBackup

        req = make_req(rid, prompt)
        req.output_ids = array("q", outputs)
        fill_len = len(prompt) + len(outputs) - 1
        self.rows.alloc([req])
        slots = self.allocator.alloc(-(-fill_len // self.page_size) * self.page_size)[:fill_len]
        self.write_kv(slots, (prompt + outputs)[:fill_len], 0)
        req.kv.retraction_backup = RetractionBackup(cpu_tensors=self.allocator.get_cpu_copy(slots))
        self.allocator.free(slots)
        self.rows.free(req)
        return req, fill_len

    def preallocate(self, req, fill_len: int, prefix_len: int) -> None:
        """What SGLang's _pre_alloc does for the plan: prefix slots from the tree, the rest fresh."""
        self.rows.alloc([req])
        row = self.rows.req_to_token[req.kv.req_pool_idx]
        if prefix_len:
            row[:prefix_len] = self.tree.prefix_device_indices(req)
        need = fill_len - prefix_len
        fresh = self.allocator.alloc(-(-need // self.page_size) * self.page_size)
        row[prefix_len:fill_len] = fresh[:need]
        self._fresh = fresh

    def match_len(self, tokens: list[int]) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return int(self.tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=array("q", tokens)))).device_prefix_len)

    def release(self, req, fill_len: int, prefix_len: int) -> None:
        self.allocator.free(self._fresh)
        if req.lock is not None:
            self.tree.unlock(req.lock)
            req.lock = None
        self.rows.free(req)


@pytest.fixture(params=[("radix", 1), ("radix", 4), ("unified", 4)], ids=["radix-page1", "radix-page4", "unified-page4"])
def world(request, ledger):
    return KVWorld(*request.param)


def _resume(world, resume, req, fill_len):
    from sglang.srt.mem_cache.common import match_kv_cache

    plan = resume.match_and_lock(req, world.tree, fill_len, match_kv_cache)
    world.preallocate(req, fill_len, plan.prefix_len)
    loaded_all = []
    assert resume.restore(req, world.rows, world.allocator, lambda: loaded_all.append(req.load_kv_cache(
        world.rows, world.allocator)))
    return plan, bool(loaded_all)


def test_slice_cpu_backup_keeps_layout_and_values():
    layer = [[torch.arange(5.0), -torch.arange(5.0)], [torch.arange(5.0, 7.0), -torch.arange(5.0, 7.0)]]
    out = slice_cpu_backup([layer, layer], 3, 2)
    assert len(out) == 2 and [len(c[0]) for c in out[0]] == [2, 2]
    assert torch.cat([c[0] for c in out[1]]).tolist() == [3.0, 4.0, 5.0, 6.0]
    assert torch.cat([c[1] for c in out[0]]).tolist() == [-3.0, -4.0, -5.0, -6.0]
    with pytest.raises(ResumeError):
        slice_cpu_backup([layer], -1, 2)


def test_resume_reuses_cached_prefix_and_restores_only_the_rest(world, ledger):
    shared = list(range(1, 17))  # 16 tokens: page-aligned for pages 1 and 4
    world.cache_prefix(shared)
    prompt, outputs = shared + [50, 51, 52], [60, 61, 62, 63, 64]
    req, fill_len = world.retracted_request("r1", prompt, outputs)
    expected = [world.token_value(t, i) + 1 for i, t in enumerate((prompt + outputs)[:fill_len])]

    resume = RadixResume(ledger.counters)
    plan, loaded_all = _resume(world, resume, req, fill_len)

    assert plan.prefix_len == 16 and plan.fill_len == fill_len == 23 and not loaded_all
    assert ledger.owners() == {"r1": 1}  # the new lock, owned by the request
    assert world.row_kv(req, fill_len) == expected  # prefix from the tree + restored rest
    assert req.kv.retraction_backup is None
    snap = resume.snapshot()
    assert (snap["num_backup_tokens"], snap["num_restored_tokens"], snap["num_reused_tokens"]) == (23, 7, 16)
    world.release(req, fill_len, plan.prefix_len)
    assert check_integrity(world.tree, world.allocator, ledger, idle=True).ok


def test_resume_without_cached_prefix_falls_back_to_full_restore(world, ledger):
    req, fill_len = world.retracted_request("r2", [70, 71, 72, 73, 74, 75], [80, 81, 82])
    resume = RadixResume(ledger.counters)
    plan, loaded_all = _resume(world, resume, req, fill_len)
    assert plan.prefix_len == 0 and loaded_all and req.lock is None and ledger.owners() == {}
    assert world.row_kv(req, fill_len) == [world.token_value(t, i) + 1
                                           for i, t in enumerate([70, 71, 72, 73, 74, 75, 80, 81])]
    assert resume.snapshot()["num_restored_tokens"] == fill_len
    world.release(req, fill_len, 0)
    assert check_integrity(world.tree, world.allocator, ledger, idle=True).ok


def test_fully_cached_sequence_still_restores_at_least_one_token(world, ledger):
    seq = list(range(200, 216))
    world.cache_prefix(seq)
    req, fill_len = world.retracted_request("r3", seq[:12], seq[12:] + [999])  # fill_len == 16, all cached
    resume = RadixResume(ledger.counters)
    plan, _ = _resume(world, resume, req, fill_len)
    assert 0 < plan.num_restored_tokens <= world.page_size and plan.prefix_len % world.page_size == 0
    assert world.row_kv(req, fill_len) == [world.token_value(t, i) + 1 for i, t in enumerate(seq)]
    world.release(req, fill_len, plan.prefix_len)
    assert check_integrity(world.tree, world.allocator, ledger, idle=True).ok


def test_resume_refuses_a_request_still_holding_a_lock(world, ledger):
    from sglang.srt.mem_cache.common import match_kv_cache

    world.cache_prefix(list(range(1, 17)))
    req, fill_len = world.retracted_request("r4", list(range(1, 17)) + [5], [6, 7])
    resume = RadixResume(ledger.counters)
    resume.match_and_lock(req, world.tree, fill_len, match_kv_cache)
    with pytest.raises(ResumeError, match="still holding"):
        resume.match_and_lock(req, world.tree, fill_len, match_kv_cache)
    world.tree.unlock(req.lock)
    req.lock = None
    assert ledger.owners() == {} and current().lock_ledger is ledger


def test_two_requests_under_one_rid_each_restore_their_own_plan(world, ledger):
    """Plans are kept per request object: with one rid for two retracted requests (several tokenizers, a
    direct scheduler call), the second's match must not replace the first's plan (before: the first was
    restored with the second's plan, and the second found none)."""
    from sglang.srt.mem_cache.common import match_kv_cache

    shared = list(range(1, 17))
    world.cache_prefix(shared)
    first, first_fill = world.retracted_request("dup", shared + [50, 51, 52], [60, 61])
    second, second_fill = world.retracted_request("dup", shared + [90], [91, 92, 93, 94, 95, 96])
    resume = RadixResume(ledger.counters)
    plans, fresh = [], []
    for req, fill_len in ((first, first_fill), (second, second_fill)):
        plans.append(resume.match_and_lock(req, world.tree, fill_len, match_kv_cache))
        world.preallocate(req, fill_len, plans[-1].prefix_len)
        fresh.append(world._fresh)
    assert [resume.plan_for(r).fill_len for r in (first, second)] == [first_fill, second_fill] == [20, 22]
    assert ledger.owners() == {"dup": 2} and len(resume.snapshot()["pending"]) == 2
    for req in (first, second):
        assert resume.restore(req, world.rows, world.allocator, lambda: pytest.fail("no full restore expected"))
    for req, fill_len, seq in ((first, first_fill, shared + [50, 51, 52, 60]),
                               (second, second_fill, shared + [90, 91, 92, 93, 94, 95])):
        assert world.row_kv(req, fill_len) == [world.token_value(t, i) + 1 for i, t in enumerate(seq)]
    assert resume.snapshot()["pending"] == [] and resume_counts(resume) == (42, 4 + 6)
    for req, slots in ((first, fresh[0]), (second, fresh[1])):
        world._fresh = slots
        world.release(req, 0, 0)
    assert ledger.owners() == {} and check_integrity(world.tree, world.allocator, ledger, idle=True).ok


# ---- a failed partial restore: the full-restore fallback must not write the tree's pages -------------
class _FirstLoadFails:
    """The real paged allocator, except that its first `load_cpu_copy` raises (the partial restore's
    copy fails); everything else, the later copies included, is the allocator's own."""

    def __init__(self, allocator):
        self._allocator, self.num_failed = allocator, 0

    def load_cpu_copy(self, *args, **kwargs):
        if self.num_failed == 0:
            self.num_failed = 1
            raise RuntimeError("injected: copy of the restored suffix failed")
        return self._allocator.load_cpu_copy(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._allocator, name)


def _pages_kv(world, slots) -> list:
    return [buf[layer][slots].clone() for buf in (world.kv.k_buffer, world.kv.v_buffer) for layer in range(2)]


def _resume_with_failing_copy(world, rid: str):
    """A retracted request whose 16-token prefix is in the tree, resumed through the real load_kv_cache
    hook with a failing first copy. The tree's prefix pages are marked first (+0.5: the KV another
    request computed for the same tokens, numerically a little different from this one's backup)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.common import match_kv_cache
    from sglang_pd.srt.hooks.scheduling.schedule_batch import around_load_kv_cache

    shared = list(range(1, 17))
    world.cache_prefix(shared)
    prompt, outputs = shared + [50, 51, 52], [60, 61, 62, 63, 64]
    req, fill_len = world.retracted_request(rid, prompt, outputs)
    plan = current().radix_resume.match_and_lock(req, world.tree, fill_len, match_kv_cache)
    world.preallocate(req, fill_len, plan.prefix_len)
    tree_slots = world.tree.prefix_device_indices(req).clone()
    for buf, sign in ((world.kv.k_buffer, 1), (world.kv.v_buffer, -1)):
        for layer in range(2):
            buf[layer][tree_slots] += sign * 0.5
    tree_kv = _pages_kv(world, tree_slots)
    expected = [world.token_value(t, i) + 1 for i, t in enumerate((prompt + outputs)[:fill_len])]
    return req, fill_len, plan, tree_slots, tree_kv, expected, lambda alloc: around_load_kv_cache(
        Req.load_kv_cache, req, world.rows, alloc)


def test_failed_partial_restore_restores_in_full_into_own_pages_not_the_trees(world, ledger):
    req, fill_len, plan, tree_slots, tree_kv, expected, load = _resume_with_failing_copy(world, "f1")
    allocator = _FirstLoadFails(world.allocator)

    load(allocator)

    assert allocator.num_failed == 1 and current().hook_errors == {"radix_resume_restore": 1}
    assert all(torch.equal(a, b) for a, b in zip(_pages_kv(world, tree_slots), tree_kv))  # tree pages untouched
    row = world.rows.req_to_token[req.kv.req_pool_idx]
    own_prefix = row[:plan.prefix_len].clone()
    assert not set(own_prefix.tolist()) & set(tree_slots.tolist())  # the row no longer aliases the tree
    assert world.row_kv(req, fill_len) == expected  # the whole backup, in the request's own pages
    assert req.lock is None and req.kv.cache_protected_len == 0 and req.prefix_len == 0
    assert ledger.owners() == {} and req.kv.retraction_backup is None
    assert resume_counts(current().radix_resume) == (fill_len, fill_len)  # a full copy, counted as one
    world.allocator.free(own_prefix)  # what SGLang's release frees: the whole row is the request's
    world.release(req, fill_len, 0)
    assert world.match_len(list(range(1, 17))) == 16  # the tree kept its prefix
    assert check_integrity(world.tree, world.allocator, ledger, idle=True).ok


def test_failed_partial_restore_without_free_pages_aborts_and_writes_nothing(world, ledger):
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req, fill_len, plan, tree_slots, tree_kv, _expected, load = _resume_with_failing_copy(world, "f2")
    others = world.allocator.alloc(world.allocator.available_size())  # other requests hold every free page

    load(_FirstLoadFails(world.allocator))

    assert all(torch.equal(a, b) for a, b in zip(_pages_kv(world, tree_slots), tree_kv))  # tree pages untouched
    assert isinstance(req.to_finish, FINISH_ABORT) and req.skip_radix_cache_insert
    assert req.kv.retraction_backup is None and current().hook_errors == {"radix_resume_restore": 2}
    row = world.rows.req_to_token[req.kv.req_pool_idx]
    assert row[:plan.prefix_len].tolist() == tree_slots.tolist() and ledger.owners() == {"f2": 1}
    world.allocator.free(others)
    world.release(req, fill_len, plan.prefix_len)  # SGLang's release: own pages freed, the lock given back
    assert ledger.owners() == {} and check_integrity(world.tree, world.allocator, ledger, idle=True).ok


def resume_counts(resume) -> tuple[int, int]:
    snap = resume.snapshot()
    return snap["num_backup_tokens"], snap["num_restored_tokens"]
