"""Decode-local prefill: the decision, the queue's states and per-step budget, and the accounting of lock
and pages on every path, on real SGLang pools, trees, rows and requests (SGLang's own prealloc and
release functions), with the allocation hook the servers use; and the decline send over a real ZMQ
socket (sent: the request is queued locally; not sent: it stays on the PD path, counted)."""

from types import SimpleNamespace

import pytest

from conftest import make_req
from sglang_pd.srt.local_prefill.decision import LocalFallback, decide
from sglang_pd.srt.local_prefill.queue import LocalPrefill, LocalState, LocalTransitionError
from sglang_pd.srt.mem_cache import RequestKind
from sglang_pd.srt.mem_cache.standalone import paged_tree
from sglang_pd.srt.mem_cache import check_integrity
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


# ---- the decision ------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold,prompt,prefix,logprobs,unsupported,expected", [
    (0, 100, 96, False, None, (False, 4, None)),            # off: nothing decided, nothing counted
    (16, 100, 80, False, None, (False, 20, None)),          # too much uncached: prefill computes it
    (16, 100, 84, False, None, (True, 16, None)),           # exactly the threshold: local
    (16, 100, 99, False, None, (True, 1, None)),
    (16, 100, 100, False, None, (False, 0, LocalFallback.FULL_PREFIX_HIT)),
    (16, 100, 90, True, None, (False, 10, LocalFallback.INPUT_LOGPROBS)),
    (16, 100, 90, False, "grammar", (False, 10, LocalFallback.UNSUPPORTED_REQUEST)),
    (16, 20, 0, False, None, (False, 20, None)),           # a short prompt with no hit is still too much
    (32, 20, 0, False, None, (True, 20, None)),            # ... unless the threshold covers it
])
def test_decision(threshold, prompt, prefix, logprobs, unsupported, expected):
    req = make_req("r", list(range(1, prompt + 1)))
    req.return_logprob, req.logprob_start_len = logprobs, 0 if logprobs else -1
    req.grammar = unsupported
    got = decide(threshold, req, prefix)
    assert (got.local, got.num_uncached, got.fallback) == expected


def test_fallbacks_are_counted_by_reason_and_off_counts_nothing():
    counters = PDCounters()
    lp = LocalPrefill(16, 64, counters)
    prompt = list(range(1, 101))
    lp.decide(make_req("full", prompt), 100)
    logprobs = make_req("logprobs", prompt)
    logprobs.return_logprob, logprobs.logprob_start_len = True, 0
    lp.decide(logprobs, 90)
    lora = make_req("lora", prompt)
    lora.lora_id = "adapter-1"
    assert lp.decide(lora, 90).detail == "LoRA adapter"
    lp.enqueue(_req("live"), 90, 10)
    assert lp.decide(make_req("live", prompt), 90).fallback is LocalFallback.DUPLICATE_RID
    lp.count_fallback(LocalFallback.DECLINE_UNSENT)
    assert lp.snapshot()["fallbacks"] == {r.value: 1 for r in LocalFallback}
    off = LocalPrefill(0, 64, PDCounters())
    assert not off.enabled and off.decide(make_req("off", prompt), 99).local is False
    assert all(v == 0 for v in off.snapshot()["fallbacks"].values())


def test_settings_refuse_a_threshold_over_the_step_budget():
    from sglang_pd.config import problems

    assert problems({"SGLANG_PD_LOCAL_PREFILL_TOKENS": "64"}) == []  # default step budget 256
    msgs = problems({"SGLANG_PD_LOCAL_PREFILL_TOKENS": "64", "SGLANG_PD_LOCAL_PREFILL_STEP_TOKENS": "32"})
    assert len(msgs) == 1 and "SGLANG_PD_LOCAL_PREFILL_TOKENS=64 exceeds SGLANG_PD_LOCAL_PREFILL_STEP_TOKENS=32" in msgs[0]
    assert problems({"SGLANG_PD_LOCAL_PREFILL_TOKENS": "-1"}) == ["SGLANG_PD_LOCAL_PREFILL_TOKENS='-1' must be >= 0 tokens"]
    with pytest.raises(ValueError):
        LocalPrefill(64, 32, PDCounters())


def test_balance_rule_takes_a_longer_request_only_while_prefill_has_more_ahead():
    counters = PDCounters()
    lp = LocalPrefill(16, 64, counters, balance_tokens=48)
    prompt = list(range(1, 101))
    # 40 uncached: past the threshold 16, within the balance limit 48
    assert lp.decide(make_req("idle", prompt), 60).local is False                      # prefill has nothing ahead
    got = lp.decide(make_req("busy", prompt), 60, prefill_backlog=40)
    assert (got.local, got.balanced) == (True, True)
    assert lp.decide(make_req("long", prompt), 40, prefill_backlog=1000).local is False  # 60 > balance limit
    assert lp.decide(make_req("short", prompt), 90).balanced is False                   # within the threshold
    lp.enqueue(_req("queued"), 80, 20)                 # decode's own backlog counts against it: 20 + 40 > 50
    assert lp.decide(make_req("behind", prompt), 60, prefill_backlog=50).local is False
    assert lp.decide(make_req("ahead", prompt), 60, prefill_backlog=60).local is True
    # requests this admission round handed to prefill are not in SGLang's transfer queue yet: counted here
    lp.start_round()
    lp.note_prefill_handoff(70)
    assert lp.decide(make_req("round", prompt), 60).local is True
    lp.start_round()
    assert lp.decide(make_req("next", prompt), 60).local is False
    assert counters.get("local_prefill_balanced_total") == 3
    off = LocalPrefill(16, 64, PDCounters())
    assert off.decide(make_req("off", prompt), 60, prefill_backlog=10_000).local is False
    with pytest.raises(ValueError):
        LocalPrefill(16, 64, PDCounters(), balance_tokens=96)  # over the step budget: one extend must hold it


def test_balance_backlog_is_the_uncached_part_sglang_waits_for():
    from sglang_pd.srt.local_prefill import uncached_awaited

    plain = make_req("a", list(range(1, 101)))
    hit = make_req("b", list(range(1, 101)))
    hit.customized_info = {"decode_prefix_len": [64]}
    assert uncached_awaited([plain, hit]) == 100 + 36 and uncached_awaited([]) == 0


def test_settings_refuse_a_balance_limit_without_local_prefill_or_outside_its_bounds():
    from sglang_pd.config import problems

    base = {"SGLANG_PD_LOCAL_PREFILL_TOKENS": "64"}
    assert problems({**base, "SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS": "256"}) == []
    msgs = problems({"SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS": "256"})
    assert len(msgs) == 1 and "needs SGLANG_PD_LOCAL_PREFILL_TOKENS > 0" in msgs[0]
    for balance in ("64", "512"):  # not above the threshold; over the step budget 256
        msgs = problems({**base, "SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS": balance})
        assert len(msgs) == 1 and f"SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS={balance} must be >" in msgs[0], msgs


# ---- queue, states, budget ----------------------------------------------------------------------------
def _req(rid):
    return SimpleNamespace(rid=rid)


def test_plan_is_fifo_within_the_step_budget_and_one_extend_per_decode_step():
    counters = PDCounters()
    lp = LocalPrefill(16, 32, counters)
    reqs = [_req(f"r{i}") for i in range(4)]
    for req, uncached in zip(reqs, (10, 16, 8, 16)):
        lp.enqueue(req, 100, uncached)
    assert counters.get("local_prefill_queued") == 4
    first = lp.plan_extend(now_s=0.0, num_running=3)
    assert [r.rid for r in first] == ["r0", "r1"]  # 10 + 16 fit the 32-token step; + 8 would not
    lp.bind_extend("batch-1")
    assert lp.is_extend_batch("batch-1") and lp.num_pending() == 4
    with pytest.raises(LocalTransitionError):
        lp.plan_extend(0.0, 3)  # no second extend while one has not joined
    assert lp.join_extend() == "batch-1"
    assert lp.record("r0").state is LocalState.JOINED and counters.get("local_prefill_tokens_total") == 26
    # Requests are decoding and an extend ran since their last decode step: the decode step goes first.
    assert lp.plan_extend(0.0, num_running=5) == [] and counters.get("local_prefill_deferred_steps_total") == 1
    lp.on_decode_turn()
    assert [r.rid for r in lp.plan_extend(0.0, num_running=5, max_reqs=1)] == ["r2"]  # the SLO cap
    lp.bind_extend("batch-2")
    lp.join_extend()
    # Nothing decoding: nothing to protect, extends may follow each other.
    assert [r.rid for r in lp.plan_extend(0.0, num_running=0)] == ["r3"]
    assert counters.get("local_prefill_extends_total") == 2 and counters.get("local_prefill_requests_total") == 4


def test_held_requests_wait_and_others_pass_them():
    lp = LocalPrefill(16, 64, PDCounters())
    lp.enqueue(_req("held"), 50, 8, not_before_s=10.0)
    lp.enqueue(_req("next"), 50, 8)
    assert [r.rid for r in lp.plan_extend(now_s=5.0, num_running=0)] == ["next"]
    lp.bind_extend("b")
    lp.join_extend()
    assert lp.plan_extend(now_s=9.0, num_running=0) == []
    assert [r.rid for r in lp.plan_extend(now_s=10.0, num_running=0)] == ["held"]


def test_abort_takes_queued_requests_and_records_extending_ones():
    counters = PDCounters()
    lp = LocalPrefill(16, 64, counters)
    a, b, c = _req("conv-a"), _req("conv-b"), _req("other")
    for req in (a, b, c):
        lp.enqueue(req, 40, 8)
    lp.plan_extend(0.0, 0, max_reqs=1)  # conv-a is EXTENDING, the others QUEUED
    lp.bind_extend("b")
    taken = lp.abort(lambda rid: rid.startswith("conv"), lambda req: "held")
    assert taken == [b]
    assert lp.record("conv-a").abort_seen == {"state": "extending", "lock": "held"}
    assert lp.record("conv-b").state is LocalState.ABORTED and lp.record("other").state is LocalState.QUEUED
    assert counters.get("local_prefill_aborted_total") == 1 and lp.num_pending() == 2
    assert lp.holds(c) and not lp.holds(b)


def test_fail_and_illegal_transitions():
    lp = LocalPrefill(16, 64, PDCounters())
    r = _req("r")
    lp.enqueue(r, 10, 4)
    with pytest.raises(LocalTransitionError):
        lp.enqueue(r, 10, 4)  # already local
    lp.plan_extend(0.0, 0)
    lp.bind_extend("b")
    lp.fail([r])
    assert lp.record("r").state is LocalState.FAILED and not lp.extend_in_flight() and lp.num_pending() == 0
    with pytest.raises(LocalTransitionError):
        lp.join_extend()


# ---- accounting on real SGLang objects ---------------------------------------------------------------
POOL = 96


class DecodeWorld:
    """Real decode-side objects on CPU: paged allocator + tree + request rows; the installed state's
    admission, ledger and local-prefill queue (the ones the hooks use)."""

    def __init__(self, tree_kind: str, page_size: int, state):
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        self.page_size = page_size
        self.rows = ReqToTokenPool(size=8, max_context_len=POOL, device="cpu", enable_memory_saver=False)
        self.allocator, self.tree = paged_tree(tree_kind, POOL, page_size, req_to_token_pool=self.rows)
        self.state = state
        state.local_prefill = LocalPrefill(32, 64, state.counters)

    def cache(self, tokens):
        """A finished earlier request left `tokens` (page-aligned) in the tree."""
        from array import array

        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        slots = self.allocator.alloc(len(tokens))
        self.tree.insert(InsertParams(key=RadixKey(token_ids=array("q", tokens)), value=slots))

    def admit(self, rid, prompt):
        """Decode admission as the server runs it: match + page-align + lock (owner = rid), then SGLang's
        own preallocation of the row and the uncached pages (alloc_for_decode_prealloc)."""
        from sglang.srt.disaggregation.decode import alloc_for_decode_prealloc
        from sglang.srt.mem_cache.common import match_kv_cache

        req = make_req(rid, prompt)
        result = self.state.decode_admission.match_and_lock(req, self.tree, RequestKind.NORMAL, match_kv_cache)
        prefix_len = self.state.decode_admission.plan_for(req).decode_prefix_len
        prefix = self.tree.prefix_device_indices(req) if prefix_len else None
        self.rows.alloc([req])
        fill_len = len(prompt)
        req.kv.kv_committed_len = fill_len
        if prefix_len:
            self.rows.write((req.kv.req_pool_idx, slice(0, prefix_len)), prefix)
        loc = alloc_for_decode_prealloc(self.allocator, req=req, fill_len=fill_len, delta_len=fill_len - prefix_len,
                                        prefix_len=prefix_len, total_prefix_len=prefix_len, prefix_indices=prefix,
                                        uses_swa_tail=False, swa_tail_len=0, req_to_token_pool=self.rows)
        self.rows.write((req.kv.req_pool_idx, slice(prefix_len, prefix_len + len(loc))), loc)
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
        req.prefix_len, req.extend_end = prefix_len, fill_len
        req.kv.cache_protected_len = prefix_len
        assert result is not None
        return req, prefix_len, loc

    def match(self, tokens) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return int(self.tree.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=tokens))).device_prefix_len)

    def clean(self):
        report = check_integrity(self.tree, self.allocator, self.state.lock_ledger, idle=True)
        return report.ok and not self.state.lock_ledger.outstanding() and self.rows.available_size() == 8


@pytest.fixture(scope="module")
def sglang_context():
    """SGLang's per-process config, published from the built-in tiny model's server arguments (its
    release path reads the speculative and serving settings)."""
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    from sglang_pd.models import ensure_model_dir

    args = ServerArgs(model_path=str(ensure_model_dir("tiny")), device="cpu",
                      skip_tokenizer_init=True)
    with use_context(create_context(args, role="test")) as context:
        yield context


@pytest.fixture(params=[("radix", 1), ("unified", 4)], ids=["radix-page1", "unified-page4"])
def world(request, ledger, pd_state, sglang_context):
    return DecodeWorld(*request.param, pd_state)


def _decide_and_queue(world, req, prefix_len):
    decision = world.state.local_prefill.decide(req, prefix_len)
    assert decision.local
    world.state.local_prefill.enqueue(req, prefix_len, decision.num_uncached)
    return decision


def test_local_extend_writes_into_the_preallocated_pages_and_finishes_clean(world):
    """Success: the extend's out_cache_loc is exactly the pages admission preallocated (the allocator is
    not asked for one more slot); after the extend the prompt enters the tree, the lock is released."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    from sglang_pd.srt.hooks.scheduling.schedule_batch import around_alloc_for_extend

    shared = list(range(1, 41))  # 40 tokens: page-aligned for pages 1 and 4
    world.cache(shared)
    req, prefix_len, preallocated = world.admit("ok", shared + [90, 91, 92, 93, 94, 95])
    assert prefix_len == 40 and world.state.lock_ledger.owners() == {"ok": 1}
    _decide_and_queue(world, req, prefix_len)
    free_before = world.allocator.available_size()

    (planned,) = world.state.local_prefill.plan_extend(0.0, 0)
    batch = SimpleNamespace(reqs=[planned], req_to_token_pool=world.rows, device="cpu")
    world.state.local_prefill.bind_extend(batch)
    out_cache_loc, rows_device, rows_cpu = around_alloc_for_extend(lambda b: pytest.fail("allocated again"), batch)
    assert out_cache_loc.tolist() == preallocated[:6].tolist()
    assert rows_cpu.tolist() == [req.kv.req_pool_idx] and world.allocator.available_size() == free_before
    assert world.state.lock_ledger.owners() == {"ok": 1}, "the prefix stays locked through the extend"

    world.state.local_prefill.join_extend()
    req.output_ids.append(7)  # the first token sampled; it is also the last one
    req.finished_reason = FINISH_LENGTH(length=1)
    release_kv_cache(req, world.tree, checkpoint=True)  # SGLang's finish: publish the prompt, unlock
    assert world.clean()
    assert world.match(req.origin_input_ids) == 46 - 46 % world.page_size


def test_abort_before_the_extend_gives_back_row_pages_and_lock(world, pd_state):
    """Abort while QUEUED (the hook's path): the suffix pages are freed, never published; lock released."""
    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    world.cache(list(range(1, 41)))
    req, prefix_len, _ = world.admit("abort-q", list(range(1, 41)) + [80, 81, 82])
    _decide_and_queue(world, req, prefix_len)
    assert world.state.lock_ledger.outstanding()[0].owner == "abort-q"
    (taken,) = world.state.local_prefill.abort(lambda rid: rid == "abort-q",
                                               lambda r: world.state.lock_ledger.state_of(r.lock).value)
    assert world.state.local_prefill.record("abort-q").abort_seen == {"state": "queued", "lock": "held"}
    scheduler = SimpleNamespace(tree_cache=world.tree)
    release_local(scheduler, taken)
    assert world.clean()
    assert world.tree.evictable_size() == 40, "only the old prefix is cached; the uncomputed suffix is not"


def test_failed_extend_and_pd_fallback_leave_nothing_behind(world):
    from sglang.srt.mem_cache.common import release_kv_cache

    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    world.cache(list(range(1, 41)))
    failed, prefix_len, _ = world.admit("fails", list(range(1, 41)) + [70, 71])
    _decide_and_queue(world, failed, prefix_len)
    world.state.local_prefill.plan_extend(0.0, 0)
    world.state.local_prefill.bind_extend(SimpleNamespace(reqs=[failed]))
    world.state.local_prefill.fail([failed])
    release_local(SimpleNamespace(tree_cache=world.tree), failed)
    # Fallback: within the threshold but prompt logprobs asked for: the PD path keeps the same lock and
    # pages (nothing was done to them) and releases them as a transfer-queue exit does.
    pd, prefix_len, _ = world.admit("fallback", list(range(1, 41)) + [60, 61])
    pd.return_logprob, pd.logprob_start_len = True, 0
    decision = world.state.local_prefill.decide(pd, prefix_len)
    assert not decision.local and decision.fallback is LocalFallback.INPUT_LOGPROBS
    assert world.state.lock_ledger.owners() == {"fallback": 1}
    release_kv_cache(pd, world.tree, checkpoint=False)
    assert world.clean()
    assert world.state.local_prefill.snapshot()["num_failed"] == 1


def test_allocation_hook_leaves_other_batches_to_sglang(world):
    from sglang_pd.srt.hooks.scheduling.schedule_batch import around_alloc_for_extend

    other = SimpleNamespace(reqs=[])
    assert around_alloc_for_extend(lambda b: ("sglang's", b), other) == ("sglang's", other)


def test_allocation_hook_refuses_a_row_without_its_whole_prompt(world):
    from sglang_pd.srt.hooks.scheduling.schedule_batch import around_alloc_for_extend

    world.cache(list(range(1, 41)))
    req, prefix_len, _ = world.admit("short-row", list(range(1, 41)) + [50, 51, 52])
    _decide_and_queue(world, req, prefix_len)
    world.state.local_prefill.plan_extend(0.0, 0)
    batch = SimpleNamespace(reqs=[req], req_to_token_pool=world.rows, device="cpu")
    world.state.local_prefill.bind_extend(batch)
    req.kv.kv_allocated_len -= 1
    with pytest.raises(RuntimeError, match="row holds"):
        around_alloc_for_extend(lambda b: None, batch)


# ---- the decline send, over a real ZMQ socket ---------------------------------------------------------
class _Receiver:
    """SGLang's decode-side KV receiver as `_serve_locally` uses it: one resolved prefill rank reached
    through a real ZMQ PUSH socket (connected to a PULL this test reads, or closed: every send fails)."""

    def __init__(self, sock):
        import threading

        self.bootstrap_infos = [{"rank_ip": "127.0.0.1"}]
        self.kv_mgr = SimpleNamespace(local_ip="127.0.0.1", rank_port=47001)
        self.abort_notified = False
        self.cleared = False
        self._sock, self._lock = sock, threading.Lock()

    def _connect_to_bootstrap_server(self, info):
        return self._sock, self._lock

    def clear(self):
        self.cleared = True


@pytest.fixture
def zmq_pair():
    """A PUSH socket connected to a PULL bound on 127.0.0.1 (the PULL stands for prefill's rank socket)."""
    import zmq

    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    pull.setsockopt(zmq.RCVTIMEO, 5000)
    yield push, pull
    push.close(linger=0)
    pull.close(linger=0)
    context.term()


def _admitted_request(world, rid, room):
    """A request decode admitted (prefix matched, locked, pages preallocated) for bootstrap room `room`."""
    world.cache(list(range(1, 41)))
    req, prefix_len, _ = world.admit(rid, list(range(1, 41)) + [50, 51, 52, 53])
    req.bootstrap_room = room
    return req, prefix_len


def test_a_sent_decline_queues_the_request_locally(world, zmq_pair):
    """The decline reaches prefill's socket naming the room; the request is decode's from then on:
    queued locally with its lock, its receiver cleared and detached, marked abort-notified."""
    from sglang_pd.srt.wire import parse_decline
    from sglang_pd.srt.hooks.scheduling.decode_handoff import _serve_locally
    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    push, pull = zmq_pair
    req, prefix_len = _admitted_request(world, "sent", 7001)
    receiver = _Receiver(push)
    decode_req = SimpleNamespace(req=req, kv_receiver=receiver, is_rebootstrap=False)
    assert _serve_locally(decode_req, prefix_len) is True
    notice = parse_decline(pull.recv_multipart())
    assert notice.room == 7001 and "decode-local prefill" in notice.message
    assert receiver.abort_notified and receiver.cleared and decode_req.kv_receiver is None
    assert world.state.local_prefill.record("sent").state is LocalState.QUEUED
    assert world.state.lock_ledger.owners() == {"sent": 1}
    (taken,) = world.state.local_prefill.abort(lambda rid: rid == "sent", lambda r: "held")
    release_local(SimpleNamespace(tree_cache=world.tree), taken)
    assert world.clean()


def test_a_decline_that_cannot_be_sent_leaves_the_request_on_the_pd_path(world, zmq_pair):
    """Prefill was not told, so it will compute the request: decode keeps it on the PD path with its
    receiver, lock and pages untouched, counts the fallback and the hook error, and queues nothing."""
    from sglang.srt.mem_cache.common import release_kv_cache

    from sglang_pd.srt.hooks.scheduling.decode_handoff import _serve_locally

    push, _ = zmq_pair
    push.close(linger=0)  # every send on it now raises
    req, prefix_len = _admitted_request(world, "unsent", 7002)
    receiver = _Receiver(push)
    decode_req = SimpleNamespace(req=req, kv_receiver=receiver, is_rebootstrap=False)
    assert world.state.lock_ledger.owners() == {"unsent": 1}
    assert _serve_locally(decode_req, prefix_len) is False
    assert decode_req.kv_receiver is receiver and not receiver.abort_notified and not receiver.cleared
    assert world.state.local_prefill.record("unsent") is None
    assert world.state.local_prefill.snapshot()["fallbacks"]["decline_unsent"] == 1
    assert world.state.hook_errors == {"send_decline": 1}
    assert world.state.lock_ledger.owners() == {"unsent": 1}
    release_kv_cache(req, world.tree, checkpoint=False)  # as the PD path's exit would
    assert world.clean()


def test_the_balance_rule_through_the_hook_reads_sglangs_transfer_queue(world, zmq_pair):
    """Past the threshold, a request is local only while prefill's backlog, as the hook reads it from the
    transfer queue's requests (their uncached part), is at least its own uncached tokens."""
    from sglang_pd.srt.hooks.scheduling.decode_handoff import _prefill_backlog, _serve_locally
    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    push, _ = zmq_pair
    world.state.local_prefill = LocalPrefill(2, 64, world.state.counters, balance_tokens=8)
    req, prefix_len = _admitted_request(world, "balanced", 7003)  # 4 uncached: past 2, within 8
    waiting = make_req("waiting", list(range(1, 11)))
    waiting.customized_info = {"decode_prefix_len": [7]}  # 3 uncached tokens prefill still computes
    idle = SimpleNamespace(transfer_queue=SimpleNamespace(queue=[SimpleNamespace(req=waiting)]))
    assert _prefill_backlog(idle) == 3
    decode_req = SimpleNamespace(req=req, kv_receiver=_Receiver(push), is_rebootstrap=False)
    assert _serve_locally(decode_req, prefix_len, _prefill_backlog(idle)) is False  # 4 > 3: prefill first
    waiting.customized_info = None  # all 10 of its tokens are still ahead at prefill
    assert _serve_locally(decode_req, prefix_len, _prefill_backlog(idle)) is True
    assert world.state.local_prefill.snapshot()["num_balanced"] == 1
    (taken,) = world.state.local_prefill.abort(lambda rid: rid == "balanced", lambda r: "held")
    release_local(SimpleNamespace(tree_cache=world.tree), taken)
    assert world.clean()


def test_a_second_live_request_under_one_rid_stays_on_the_pd_path(world, zmq_pair):
    """Two live requests may share a rid (several tokenizer workers, a client's own rid). While one is local
    here, the other is not declined: prefill keeps its room, decode keeps its receiver, lock and pages on
    the PD path, counted. Before, the decline went out, the receiver was cleared and the queue then refused
    the rid: the error ended decode's scheduler and left the second request's lock and pages unowned."""
    import zmq
    from sglang.srt.mem_cache.common import release_kv_cache

    from sglang_pd.srt.wire import parse_decline
    from sglang_pd.srt.hooks.scheduling.decode_handoff import _serve_locally
    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    push, pull = zmq_pair
    first, first_prefix = _admitted_request(world, "dup", 7101)
    assert _serve_locally(SimpleNamespace(req=first, kv_receiver=_Receiver(push), is_rebootstrap=False), first_prefix)
    assert parse_decline(pull.recv_multipart()).room == 7101
    second, second_prefix, _ = world.admit("dup", list(range(1, 41)) + [60, 61, 62])  # its own question
    second.bootstrap_room = 7102
    receiver = _Receiver(push)
    decode_req = SimpleNamespace(req=second, kv_receiver=receiver, is_rebootstrap=False)
    assert world.state.local_prefill.rid_is_live("dup") and world.state.local_prefill.holds(first)
    assert world.state.lock_ledger.owners() == {"dup": 2}

    assert _serve_locally(decode_req, second_prefix) is False

    pull.setsockopt(zmq.RCVTIMEO, 200)
    with pytest.raises(zmq.Again):
        pull.recv_multipart()  # no decline for room 7102
    assert decode_req.kv_receiver is receiver and not receiver.abort_notified and not receiver.cleared
    assert not world.state.local_prefill.holds(second) and world.state.local_prefill.num_pending() == 1
    assert world.state.local_prefill.snapshot()["fallbacks"]["duplicate_rid"] == 1
    assert world.state.hook_errors == {}
    release_kv_cache(second, world.tree, checkpoint=False)  # as the PD path's exit would
    (taken,) = world.state.local_prefill.abort(lambda rid: rid == "dup", lambda r: "held")
    assert taken is first
    release_local(SimpleNamespace(tree_cache=world.tree), taken)
    assert world.clean()


def test_a_declined_request_the_local_queue_refuses_stays_whole_on_the_pd_path(world, zmq_pair, monkeypatch):
    """Fault injection: the local queue raises after the decline went out. The request keeps its receiver,
    lock and pages on the PD path (which fails it: prefill dropped the room), the error is counted, and
    the scheduler is not ended by it."""
    from sglang.srt.mem_cache.common import release_kv_cache

    from sglang_pd.srt.wire import parse_decline
    from sglang_pd.srt.hooks.scheduling.decode_handoff import _serve_locally

    push, pull = zmq_pair
    req, prefix_len = _admitted_request(world, "refused", 7201)
    receiver = _Receiver(push)
    decode_req = SimpleNamespace(req=req, kv_receiver=receiver, is_rebootstrap=False)

    def refuse(*args, **kwargs):
        raise RuntimeError("injected: the local queue refuses")

    monkeypatch.setattr(world.state.local_prefill, "enqueue", refuse)
    assert _serve_locally(decode_req, prefix_len) is False
    assert parse_decline(pull.recv_multipart()).room == 7201  # prefill was told before the queue refused
    assert decode_req.kv_receiver is receiver and not receiver.cleared
    assert world.state.local_prefill.record("refused") is None and world.state.local_prefill.num_pending() == 0
    assert world.state.hook_errors == {"local_prefill_enqueue": 1}
    assert world.state.lock_ledger.owners() == {"refused": 1}
    release_kv_cache(req, world.tree, checkpoint=False)  # as the PD path's failure exit would
    assert world.clean()


def _pause_scheduler(world, last_batch, held):
    """The scheduler fields SGLang's own `Scheduler.pause_generation` reads and writes (decode, normal loop)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    running = SimpleNamespace(reqs=[], batch_is_full=False, is_empty=lambda: True, batch_size=lambda: 0)
    return SimpleNamespace(
        enable_overlap=False, enable_overlap_mlx=False, _pause_started_at=None, _engine_paused=False,
        running_batch=running, last_batch=last_batch, chunked_req=None, disaggregation_mode=DisaggregationMode.DECODE,
        waiting_queue=[], decode_offload_manager=None, cur_batch_for_debug=None, req_to_token_pool=world.rows,
        token_to_kv_pool_allocator=world.allocator, tree_cache=world.tree, hisparse_coordinator=None,
        disagg_decode_prealloc_queue=SimpleNamespace(hold_rebootstrap=held.append),
        metrics_reporter=SimpleNamespace(last_gen_throughput=1.0, current_scheduler_metrics_enabled=False),
        kv_events_publisher=SimpleNamespace(publish_kv_events=lambda: None))


def _bound_extend(world, rid, suffix):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    req, prefix_len, _ = world.admit(rid, list(range(1, 41)) + suffix)
    _decide_and_queue(world, req, prefix_len)
    assert world.state.local_prefill.plan_extend(0.0, 0) == [req]
    batch = SimpleNamespace(reqs=[req], forward_mode=ForwardMode.EXTEND)
    world.state.local_prefill.bind_extend(batch)
    req.output_ids.append(7)  # the extend ran and its first token was processed; the join is next
    return req, batch


def test_a_retract_pause_that_takes_the_local_extend_ends_it(world):
    """/pause_generation {"mode": "retract"} between a local extend and its join: SGLang's own pause retracts
    the extend's request (row, pages and lock released, held for re-bootstrap); the extend is then over:
    RETRACTED, unbound, the scheduler idle, and a later local request is extended again. Before, the record
    stayed EXTENDING and the batch bound for good (no later extend, never idle)."""
    from sglang.srt.managers.io_struct import PauseGenerationReqInput
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_pd.srt.hooks.scheduling.scheduler import (after_collect_inflight_batches, after_is_fully_idle,
                                               around_pause_generation)

    local = world.state.local_prefill
    world.cache(list(range(1, 41)))
    req, batch = _bound_extend(world, "r-ext", [90, 91, 92])
    held = []
    sched = _pause_scheduler(world, batch, held)
    assert local.record("r-ext").state is LocalState.EXTENDING and local.extend_in_flight()
    assert world.state.lock_ledger.owners() == {"r-ext": 1}

    around_pause_generation(Scheduler.pause_generation, sched, PauseGenerationReqInput(mode="retract"))

    assert held == [req] and req.lock is None and world.state.lock_ledger.owners() == {}  # SGLang's retract
    assert local.record("r-ext").state is LocalState.RETRACTED and not local.extend_in_flight()
    assert local.num_pending() == 0 and local.snapshot()["num_retracted"] == 1
    assert after_is_fully_idle(True, sched) and after_collect_inflight_batches([], sched) == []
    after, _ = _bound_extend(world, "s-new", [50, 51])  # a later local request is extended again
    assert local.record("s-new").state is LocalState.EXTENDING
    local.fail([after])
    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local

    release_local(SimpleNamespace(tree_cache=world.tree), after)
    assert world.clean()


def test_a_retract_pause_past_the_local_extend_leaves_it_to_join(world):
    """The overlap loop may have moved last_batch past the extend: SGLang's pause does not retract its
    requests, so they keep their rows and locks and the extend stays bound to join after the pause."""
    from sglang.srt.managers.io_struct import PauseGenerationReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local
    from sglang_pd.srt.hooks.scheduling.scheduler import around_pause_generation

    local = world.state.local_prefill
    world.cache(list(range(1, 41)))
    req, batch = _bound_extend(world, "r-ext", [90, 91, 92])
    held = []
    other = SimpleNamespace(reqs=[], forward_mode=ForwardMode.DECODE)
    around_pause_generation(Scheduler.pause_generation, _pause_scheduler(world, other, held),
                            PauseGenerationReqInput(mode="retract"))
    assert held == [] and local.record("r-ext").state is LocalState.EXTENDING and local.extend_batch() is batch
    assert world.state.lock_ledger.owners() == {"r-ext": 1}
    local.fail([req])
    release_local(SimpleNamespace(tree_cache=world.tree), req)
    assert world.clean()
