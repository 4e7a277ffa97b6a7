"""Decode-local prefill between a local extend and its join, where SGLang's own bookkeeping does not see the
extend batch: in the overlap loop last_batch has moved past it, and a MIXED extend holds the running
requests while running_batch is empty. Driven through upstream's real functions with our hooks in front
(as SGLang's HookRegistry wrapper calls them), on real requests, rows, pages, tree and locks:

- a client abort (and SGLANG_REQ_RUNNING_TIMEOUT) reaches the extend's requests, local and mixed-in
  alike; they finish through upstream's path after the join, row, pages and lock released once;
- admission's budget during the window equals the budget with the same requests in running_batch."""

from array import array
from types import SimpleNamespace

import pytest

from conftest import make_req
from sglang_pd.srt.local_prefill.queue import LocalPrefill, LocalState
from test_local_prefill import _decide_and_queue, sglang_context, world  # noqa: F401 (fixtures)

pytestmark = pytest.mark.unit


# ---- aborts: the extend batch is in flight until its join --------------------------------------------
def _decode_scheduler(running_batch, last_batch, hooked: bool):
    """The decode scheduler's fields upstream's abort_request and timeout scan read (nothing queued or
    chunked); its real in-flight collection, behind our AFTER hook when `hooked`."""
    from sglang.srt.constrained.grammar_manager import GrammarManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_pd.srt.hooks.scheduling.scheduler import after_collect_inflight_batches

    grammar = object.__new__(GrammarManager)  # its abort reads only its (empty) queue
    grammar.grammar_queue = []
    sched = SimpleNamespace(
        running_batch=running_batch, last_batch=last_batch, enable_continuous_input_polling=False,
        result_queue=[], chunked_req=None, mm_receiver=None, waiting_queue=[], dllm_config=None,
        grammar_manager=grammar, disaggregation_mode=DisaggregationMode.DECODE,
        disagg_decode_prealloc_queue=SimpleNamespace(queue=[], retracted_queue=[]),
        disagg_decode_transfer_queue=SimpleNamespace(queue=[]))
    collect = Scheduler._collect_inflight_batches
    sched._collect_inflight_batches = ((lambda: after_collect_inflight_batches(collect(sched), sched)) if hooked
                                       else (lambda: collect(sched)))
    sched.collect_inflight_reqs = lambda: Scheduler.collect_inflight_reqs(sched)
    return sched


def _abort(sched, rid: str, abort_message: str | None = None) -> None:
    """A client abort as the scheduler runs it: upstream's abort_request, then our AFTER hook."""
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_pd.srt.hooks.scheduling.scheduler import after_abort_request

    recv = AbortReq(rid=rid, abort_message=abort_message)
    after_abort_request(Scheduler.abort_request(sched, recv), sched, recv)


def _mixed_extend_after_its_result(world):
    """Overlap loop, two iterations after a MIXED local extend launched: its result is processed (every
    request has its first / next token), the next launch moved last_batch past it (nothing else to run),
    running_batch is empty until the join. Returns (local req, running req, extend batch)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    world.cache(list(range(1, 41)))
    running, _, _ = world.admit("run-1", list(range(1, 41)) + [50, 51])
    running.output_ids.append(9)  # it was decoding before the extend folded it in
    local, prefix_len, _ = world.admit("local-1", list(range(1, 41)) + [60, 61, 62])
    _decide_and_queue(world, local, prefix_len)
    lp = world.state.local_prefill
    assert lp.plan_extend(0.0, num_running=1) == [local]
    extend = ScheduleBatch(reqs=[local, running], forward_mode=ForwardMode.MIXED, decoding_reqs=[running])
    lp.bind_extend(extend)
    lp.mixed_with([running])
    local.output_ids.append(7)
    running.output_ids.append(8)
    for req in (local, running):
        req.sampling_params.normalize(None)  # as the tokenizer manager sends them (stop lists set)
    return local, running, extend


def _finish_next_step(world, running_batch):
    """The decode step after the join, as upstream's result processing ends it for each request: the
    finish state updated (to_finish -> finished_reason), a finished request's KV released."""
    from sglang.srt.mem_cache.common import release_kv_cache

    for req in running_batch.reqs:
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, world.tree, checkpoint=True)


@pytest.mark.parametrize("aborted", ["local-1", "run-1"])
def test_an_abort_after_the_extend_ran_reaches_its_requests_and_releases_once(world, aborted):
    """The audit's window: upstream alone finds neither request in flight and the abort is lost (the
    request joined and decoded to max_new_tokens). With the hook SGLang's own abort sets to_finish; after
    the join the request finishes at the next step and its row, pages and lock are released once."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch

    from sglang_pd.srt.hooks.scheduling.decode_scheduler import _join_local_extend

    local, running, extend = _mixed_extend_after_its_result(world)
    sched = _decode_scheduler(ScheduleBatch(reqs=[]), None, hooked=True)
    assert not {local, running} & _decode_scheduler(sched.running_batch, None, hooked=False).collect_inflight_reqs()
    assert world.state.lock_ledger.owners() == {"run-1": 1, "local-1": 1}

    _abort(sched, aborted)
    target, other = (local, running) if aborted == "local-1" else (running, local)
    assert isinstance(target.to_finish, FINISH_ABORT) and other.to_finish is None
    if aborted == "local-1":
        assert world.state.local_prefill.record("local-1").abort_seen == {"state": "extending", "lock": "held"}

    joined = _join_local_extend(sched.running_batch)
    assert joined is extend and world.state.local_prefill.record("local-1").state is LocalState.JOINED
    _finish_next_step(world, joined)
    assert isinstance(target.finished_reason, FINISH_ABORT) and not other.finished()
    assert world.state.lock_ledger.owners() == {other.rid: 1}, "the aborted request's lock released"
    other.to_finish = FINISH_ABORT()  # end the survivor too: the world must then be clean
    _finish_next_step(world, ScheduleBatch(reqs=[other]))  # the running batch, filtered
    assert world.clean() and world.state.local_prefill.num_pending() == 0


def test_an_abort_message_answers_503_as_upstreams_running_abort_does(world):
    """A timeout-style abort (abort_message set) carries upstream's message and 503 to the extend's request."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import ScheduleBatch

    local, running, _ = _mixed_extend_after_its_result(world)
    sched = _decode_scheduler(ScheduleBatch(reqs=[]), None, hooked=True)
    _abort(sched, "local-1", "Request running timeout reached.")
    assert local.to_finish.to_json() == {"type": "abort", "message": "Request running timeout reached.",
                                         "status_code": HTTPStatus.SERVICE_UNAVAILABLE, "err_type": None}
    assert running.to_finish is None


def test_the_running_timeout_scan_sees_the_extends_requests(world, monkeypatch):
    """SGLANG_REQ_RUNNING_TIMEOUT: upstream's scan polls the in-flight batches; the local and the mixed-in
    running request, in the extend batch only, are found (upstream alone: none)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setenv("SGLANG_REQ_RUNNING_TIMEOUT", "0.001")
    local, running, _ = _mixed_extend_after_its_result(world)
    for req in (local, running):
        req.time_stats.forward_entry_time = 1.0  # entered its forward long ago (perf_counter clock)
    sched = _decode_scheduler(ScheduleBatch(reqs=[]), None, hooked=True)
    sched.waiting_queue = []
    unhooked = _decode_scheduler(sched.running_batch, None, hooked=False)
    assert Scheduler._poll_timeout_aborts(unhooked) == []
    assert sorted(a.rid for a in Scheduler._poll_timeout_aborts(sched)) == ["local-1", "run-1"]


# ---- admission's budget: the mixed extend's running requests still count --------------------------------
def _prealloc_queue(allocator, tree, running_batch, last_batch, reserved_per_req: int, hooked: bool):
    """A DecodePreallocQueue with the fields SGLang's budget functions read (its constructor starts a KV
    manager: sockets and threads), our three budget hooks in front of upstream's methods when `hooked`."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue as Queue

    from sglang_pd.srt.hooks.scheduling.decode_prealloc_queue import (after_active_req_count,
                                                           around_need_space_for_single_req,
                                                           around_required_admission_tokens)

    queue = object.__new__(Queue)
    queue.scheduler = SimpleNamespace(running_batch=running_batch, last_batch=last_batch, enable_hisparse=False,
                                      waiting_queue=[], tp_worker=SimpleNamespace(is_hybrid_swa=False))
    queue.token_to_kv_pool_allocator, queue.token_to_kv_pool = allocator, allocator.get_kvcache()
    queue.tree_cache, queue.transfer_queue, queue.retracted_queue = tree, SimpleNamespace(queue=[]), []
    queue.num_reserved_decode_tokens = reserved_per_req
    if hooked:
        queue._active_req_count = lambda extra_reserved_reqs=0: after_active_req_count(
            Queue._active_req_count(queue, extra_reserved_reqs), queue, extra_reserved_reqs)
        queue._need_space_for_single_req = lambda retractable_tokens=None: around_need_space_for_single_req(
            Queue._need_space_for_single_req, queue, retractable_tokens)
        queue._required_admission_tokens = lambda *args: around_required_admission_tokens(
            Queue._required_admission_tokens, queue, *args)
    return queue


def _figures(queue, candidate) -> dict:
    """What pop_preallocated computes, with retractable_tokens from running_batch as it does."""
    retractable = sum(len(r.origin_input_ids) + len(r.output_ids) for r in queue.scheduler.running_batch.reqs)
    return {"active": queue._active_req_count(),
            "need_space": queue._need_space_for_single_req(retractable),
            "budget": queue._allocatable_token_budgets(retractable_tokens=retractable, count_retracted=True),
            "admission": queue._required_admission_tokens(candidate, 50, 0, retractable)}


def _req(rid, prompt_len, num_output, max_new_tokens):
    req = make_req(rid, list(range(1, prompt_len + 1)))
    req.output_ids.extend([5] * num_output)
    req.sampling_params.max_new_tokens = max_new_tokens
    return req


def _local_prefill(pd_state, local, extend_batch, mixed_decoders) -> LocalPrefill:
    """A local-prefill queue whose one request is in `extend_batch` (mixed with `mixed_decoders` if any)."""
    lp = LocalPrefill(32, 64, pd_state.counters)
    lp.enqueue(local, 40, 6)
    lp.plan_extend(0.0, num_running=len(mixed_decoders))
    lp.bind_extend(extend_batch)
    if mixed_decoders:
        lp.mixed_with(mixed_decoders)
    return lp


@pytest.mark.parametrize("decoders_spec,pool_tokens,reserved_per_req,budget", [
    # the largest request's room to finish dominates: 8,192 - (2,000 + 200 - 660)
    ([(100, 10, 500), (200, 20, 2000), (300, 30, 100)], 8192, 16, 6652),
    # the per-request decode headroom dominates: 8,192 - 16 x (6 + 1 local)
    ([(400, 300, 40)] * 6, 8192, 16, 8080),
    # the audit's repro: 20 x (2,000 prompt + 100 output, max_new_tokens 4,000), 512 reserved each;
    # 89,760 there (no local request), 512 less here for the local one; upstream alone: 100,000
    ([(2000, 100, 4000)] * 20, 100_000, 512, 89_248),
], ids=["need-space", "headroom", "audit-repro"])
def test_the_budget_during_a_mixed_extend_equals_the_budget_with_them_running(
        pd_state, sglang_context, decoders_spec, pool_tokens, reserved_per_req, budget):
    """Upstream's real budget functions, our hooks in front: with the running requests folded into a mixed
    local extend (running_batch empty until the join) every figure admission uses equals the one with the
    same requests in running_batch beside an unmixed extend. Upstream alone gives more room (no headroom,
    nothing retractable, no room for the largest to finish)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_pd.srt.mem_cache.standalone import paged_tree

    allocator, tree = paged_tree("radix", pool_tokens, 1)
    decoders = [_req(f"run-{i}", *spec) for i, spec in enumerate(decoders_spec)]
    local = make_req("local-1", list(range(1, 47)))
    candidate = _req("new-1", 50, 0, 3000)

    pd_state.local_prefill = _local_prefill(pd_state, local, ScheduleBatch(reqs=[local]), [])
    running = _prealloc_queue(allocator, tree, ScheduleBatch(reqs=decoders), None, reserved_per_req, hooked=True)
    expected = _figures(running, candidate)
    assert expected["budget"] == budget

    mixed_batch = ScheduleBatch(reqs=[local, *decoders], forward_mode=ForwardMode.MIXED, decoding_reqs=decoders)
    pd_state.local_prefill = _local_prefill(pd_state, local, mixed_batch, decoders)
    window = _prealloc_queue(allocator, tree, ScheduleBatch(reqs=[]), mixed_batch, reserved_per_req, hooked=True)
    assert window.scheduler.running_batch.is_empty() and pd_state.local_prefill.mixed_decoding_reqs() == decoders
    assert _figures(window, candidate) == expected
    upstream_alone = _prealloc_queue(allocator, tree, ScheduleBatch(reqs=[]), mixed_batch, reserved_per_req,
                                     hooked=False)
    assert _figures(upstream_alone, candidate)["budget"] == pool_tokens

    pd_state.local_prefill.join_extend()  # after the join nothing is counted twice
    assert pd_state.local_prefill.mixed_decoding_reqs() == []
    joined = _prealloc_queue(allocator, tree, ScheduleBatch(reqs=[local, *decoders]), mixed_batch, reserved_per_req,
                             hooked=True)
    assert _figures(joined, candidate)["active"] == len(decoders) + 1
