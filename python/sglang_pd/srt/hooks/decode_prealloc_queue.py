"""Hooks on SGLang's `DecodePreallocQueue` (disaggregation/decode.py): admission, rounds, resume, entry.

    add                     -> early rejection (SloController) before any page or lock
    pop_preallocated        -> one AdmissionRound per call (opened here, closed whatever happens);
                               requests served by decode-local prefill leave with it, not to transfer
    _match_prefix_and_lock  -> the round's planned match, else DecodePrefixAdmission per request
    _pre_alloc              -> a resumed retracted request re-matches the tree (RadixResume)
    _send_kv_metadata       -> decode-local prefill decided here (prefill declined, request queued
                               locally); else the hand-off checked against the plan; test faults
    _active_req_count       -> local-prefill requests reserve their decode headroom like any other, and so
                               do running requests folded into a mixed local extend (until its join)
    _need_space_for_single_req, _required_admission_tokens
                            -> those folded running requests count as running (retractable, largest need)

`QueueSizer` reads SGLang's own budget functions for the round planner.
"""

from __future__ import annotations

import logging
import secrets
import time
from http import HTTPStatus

from sglang_pd.srt.admission.decode_admission import AdmissionError
from sglang_pd.srt.local_prefill.queue import FallbackReason, LocalDecision
from sglang_pd.srt.metrics.request_fields import PATH_DECODE_LOCAL, attach_request_fields
from sglang_pd.srt.handshake.room_decline import DeclineNotice
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.handshake.decline_delivery import send_decline
from sglang_pd.srt.hooks.takeover import owns_decode_queue
from sglang_pd.srt.mem_cache.page_math import RequestKind, bytes_per_page, kv_to_page_num, request_kind
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


# ---- admission rounds (batched eviction) -----------------------------------------------------------
class QueueSizer:
    """RoundSizer over a live DecodePreallocQueue (reads SGLang's budget; `evict` mutates the tree).

    `retractable_tokens` is the running batch's, as SGLang's pop_preallocated computes it; the budget
    hooks below add the running requests a mixed local extend holds (`_mixed_decoders`)."""

    def __init__(self, queue):
        self.queue = queue
        self.retractable_tokens = sum(len(r.origin_input_ids) + len(r.output_ids)
                                      for r in queue.scheduler.running_batch.reqs)

    def alloc_tokens(self, req, prefix_len: int) -> int:
        return self.queue._required_alloc_tokens(fill_len=self.queue._pre_alloc_fill_len(req),
                                                 prefix_len=prefix_len)

    def admission_tokens(self, req, alloc_tokens: int, prefix_len: int) -> int:
        return self.queue._required_admission_tokens(req, alloc_tokens, prefix_len, self.retractable_tokens)

    def budget(self, num_planned: int) -> int:
        return self.queue._allocatable_token_budgets(retractable_tokens=self.retractable_tokens,
                                                     count_retracted=True, extra_reserved_reqs=num_planned)

    def available(self) -> int:
        return self.queue._radix_full_available()

    def evict(self, num_tokens: int) -> int:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return self.queue.tree_cache.evict_for_alloc(EvictParams(num_tokens=num_tokens)).num_tokens_evicted


def _round_applies(queue, rids_to_check) -> bool:
    from sglang.srt.runtime_context import get_disagg

    return (rids_to_check is None and queue.pp_size == 1 and current().settings.batched_eviction
            and get_disagg().disaggregation_decode_host_receive_threshold >= 1 and owns_decode_queue(queue))


def around_pop_preallocated(original, queue, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None):
    """Run SGLang's loop as one admission round; release what the loop did not take. Requests the
    loop handed to decode-local prefill are not returned (they must not reach the transfer queue)."""
    if not _round_applies(queue, rids_to_check):
        preallocated, failed = original(queue, rids_to_check, pp_good_rids, pp_bad_rids)
    else:
        admission_round = current().admission_round
        admission_round.open(queue)
        try:
            preallocated, failed = original(queue, rids_to_check, pp_good_rids, pp_bad_rids)
        finally:
            admission_round.close()
    local = current().local_prefill
    if local.enabled:
        preallocated = [d for d in preallocated if not local.holds(d.req)]
    return preallocated, failed


def after_active_req_count(result, queue, extra_reserved_reqs=0):
    """Local-prefill requests hold their row and pages outside SGLang's queues: reserve for them too; and
    for the running requests a mixed local extend holds until its join (`_mixed_decoders`)."""
    local = current().local_prefill
    return result + local.num_pending() + len(local.mixed_decoding_reqs())


# ---- the running requests a mixed local extend holds -----------------------------------------------
def _mixed_decoders() -> tuple[list, int]:
    """The running requests folded into the bound local extend (mixed forward) and their retractable
    tokens, counted as SGLang's pop_preallocated counts running_batch's (prompt + output).

    From the mixed step until the join (one scheduler iteration in the normal loop, two in the overlap
    loop) SGLang's running_batch is empty, and its admission runs in between: without these the budget
    reserved no decode headroom for them and no room for the largest one to finish. Read-only."""
    reqs = current().local_prefill.mixed_decoding_reqs()
    return reqs, sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs)


def around_need_space_for_single_req(original, queue, retractable_tokens=None):
    """SGLang's figure (the largest running request's prompt + capped max_new_tokens, less what can be
    retracted) with the mixed extend's running requests counted as running; else SGLang's."""
    from sglang.srt.disaggregation.decode import CLIP_MAX_NEW_TOKEN

    mixed, mixed_tokens = _mixed_decoders()
    if retractable_tokens is None or not mixed:
        return original(queue, retractable_tokens)
    running = [*queue.scheduler.running_batch.reqs, *mixed]
    return max(min(r.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKEN) + len(r.origin_input_ids)
               for r in running) - (retractable_tokens + mixed_tokens)


def around_required_admission_tokens(original, queue, req, allocated_tokens, prefix_len, retractable_tokens):
    """SGLang's per-request admission need, with the mixed extend's running requests retractable too
    (`retractable_tokens` is running_batch's, as its callers compute it)."""
    return original(queue, req, allocated_tokens, prefix_len, retractable_tokens + _mixed_decoders()[1])


def _candidates(queue, first_req) -> list:
    """Requests SGLang's loop may reach from `first_req` on, in its order, capped by free rows."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    limit = min(queue.req_to_metadata_buffer_idx_allocator.available_size(),
                queue.req_to_token_pool.available_size())
    reqs, started = [], False
    for decode_req in queue.queue:
        req = decode_req.req
        started = started or req is first_req
        if not started or not decode_req.waiting_for_input or decode_req.is_rebootstrap:
            continue
        if isinstance(req.finished_reason, FINISH_ABORT):
            continue
        reqs.append(req)
        if len(reqs) >= limit:
            break
    return reqs


def _planned_match(queue, req):
    """The round's locked match for `req` (planning the round on the first call); None if unplanned."""
    admission_round = current().admission_round
    if admission_round.needs_plan(queue):
        from sglang.srt.mem_cache.common import match_kv_cache

        admission_round.plan(_candidates(queue, req), queue.tree_cache, QueueSizer(queue), match_kv_cache)
    return admission_round.take(req) if admission_round.is_open_for(queue) else None


def around_match_prefix_and_lock(original, queue, req):
    """Owned queues go through our admission (a planned round match, else per request)."""
    from sglang.srt.mem_cache.common import match_kv_cache

    if not owns_decode_queue(queue):
        return original(queue, req)
    state = current()
    try:
        planned = _planned_match(queue, req)
    except Exception:  # never take the scheduler down: admit this call per request, as SGLang does
        state.hook_failed("admission_round", "planning the admission round failed; admitting per request")
        state.admission_round.close()
        planned = None
    if planned is not None:  # matched and locked when the admission round was planned
        return queue._build_decode_prefix_match(req, planned)
    try:
        result = state.decode_admission.match_and_lock(req, queue.tree_cache, request_kind(req), match_kv_cache)
    except AdmissionError:
        # The tree broke the contract before any lock was taken: serve via upstream's path.
        state.hook_failed("decode_admission", "decode admission refused the tree's match; using upstream's")
        return original(queue, req)
    return queue._build_decode_prefix_match(req, result)


# ---- radix-aware resume --------------------------------------------------------------------------
def _cpu_backup_of_plain_kv(allocator) -> bool:
    """Retraction backs KV up as CPU tensors of a plain MHA pool (the layout RadixResume slices)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.runtime_context import get_disagg

    return (get_disagg().disaggregation_decode_retraction_backup == "cpu_tensor"
            and type(allocator.get_kvcache()).get_cpu_copy is MHATokenToKVPool.get_cpu_copy)


def _is_resume(queue, req) -> bool:
    """`_pre_alloc` called by resume_retracted_reqs for a request backed up to CPU tensors."""
    return (req.kv.retraction_backup is not None and _cpu_backup_of_plain_kv(queue.token_to_kv_pool_allocator)
            and any(r is req for r in queue.retracted_queue))


def around_pre_alloc(original, queue, req, prefix_indices=None, prefix_len=None, total_prefix_len=None):
    """A resumed request gets its re-matched prefix (locked) and only the rest preallocated."""
    state = current()
    if (prefix_indices is not None or not state.settings.radix_resume or not owns_decode_queue(queue)
            or not _is_resume(queue, req)):
        return original(queue, req, prefix_indices, prefix_len, total_prefix_len)
    from sglang.srt.mem_cache.common import match_kv_cache

    tree = queue.tree_cache
    try:
        plan = state.radix_resume.match_and_lock(req, tree, queue._pre_alloc_fill_len(req), match_kv_cache)
        indices = tree.prefix_device_indices(req) if plan.prefix_len else None
    except Exception:  # never take the scheduler down: resume the upstream way, holding nothing
        state.hook_failed("radix_resume", "radix-aware resume of %s failed; restoring it in full", req.rid)
        state.radix_resume.abandon(req, tree)
        return original(queue, req, None, None, None)
    if plan.prefix_len == 0:
        return original(queue, req, None, None, None)
    out = original(queue, req, indices, plan.prefix_len, plan.prefix_len)
    req.kv.cache_protected_len = plan.prefix_len  # the tree owns [0, prefix_len) of the row
    return out


# ---- transfer hand-off ---------------------------------------------------------------------------
def _apply_faults(decode_req, kv_indices, page_size: int, metadata_kwargs: dict):
    """Test faults on the hand-off (mutates `metadata_kwargs`); returns the slots to hand off. With
    PREFIX_PAGE_AHEAD prefill is told one page more prefix than decode holds and is not given that page's
    slots: the page keeps whatever the pool had there, as a decode reusing a page it does not hold would."""
    faults, req = current().faults, decode_req.req
    room = int(req.bootstrap_room)
    prefix_len = int(metadata_kwargs.get("decode_prefix_len") or 0)
    if faults.take(Fault.PREFIX_UNALIGNED, room):
        metadata_kwargs["decode_prefix_len"] = prefix_len + 1
    elif faults.take(Fault.PREFIX_EXCEEDS, room):
        metadata_kwargs["decode_prefix_len"] = len(req.origin_input_ids) + page_size
    elif len(kv_indices) > page_size and faults.take(Fault.PREFIX_PAGE_AHEAD, room):
        metadata_kwargs["decode_prefix_len"] = prefix_len + page_size
        return kv_indices[page_size:]
    return kv_indices


def _fail_transfer(decode_req) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    receiver = decode_req.kv_receiver
    room = int(decode_req.req.bootstrap_room)
    receiver.kv_mgr.record_failure(room, "sglang_pd: injected transfer failure")
    receiver.kv_mgr.update_status(room, KVPoll.Failed)


def around_send_kv_metadata(original, queue, decode_req, kv_indices, page_size, state_indices=None,
                            **metadata_kwargs):
    """Serve the request locally (prefill declined) if decode-local prefill says so; else check the
    hand-off to the transfer layer against the admission plan, then send."""
    state = current()
    req = decode_req.req
    prefix_len = int(metadata_kwargs.get("decode_prefix_len") or 0)
    if state.local_prefill.enabled and _serve_locally(decode_req, prefix_len):
        return None
    num_pages = kv_to_page_num(len(kv_indices), page_size)
    try:
        # A rebootstrap (SGLang's recompute after a retract pause) hands off the prompt and the output so
        # far with no prefix: not the admission plan's hand-off, nothing to check it against.
        mismatch = None if decode_req.is_rebootstrap else state.decode_admission.record_handoff(req, prefix_len,
                                                                                                  num_pages)
        if request_kind(req) is RequestKind.NORMAL:  # warmup / health checks move no real KV
            num_bytes = num_pages * bytes_per_page(decode_req.kv_receiver.kv_mgr.kv_args)
            state.counters.add("kv_pages_transferred_total", num_pages)
            state.counters.add("kv_bytes_transferred_total", num_bytes)
            attach_request_fields(req, prefix_len, num_pages, num_bytes)
        if mismatch is not None:
            logger.error("sglang_pd: %s handed decode_prefix_len=%s, %s pages to transfer; plan was %s",
                         req.rid, prefix_len, num_pages, mismatch)
    except Exception:
        state.hook_failed("send_kv_metadata", "failed to record the transfer hand-off")
    if state.faults.enabled:
        kv_indices = _apply_faults(decode_req, kv_indices, page_size, metadata_kwargs)
    # The prompt prefill's half of this room computes: a rebootstrap (SGLang's recompute after a retract
    # pause) sends prefill the prompt plus the tokens generated so far, built by SGLang's own payload.
    prompt = req.build_rebootstrap_payload()["input_ids"] if decode_req.is_rebootstrap else req.origin_input_ids
    with state.peer_guard.outgoing.sending(int(req.bootstrap_room), prompt):
        result = original(queue, decode_req, kv_indices, page_size, state_indices, **metadata_kwargs)
    if state.faults.take(Fault.TRANSFER_FAIL, int(req.bootstrap_room)):
        _fail_transfer(decode_req)
    return result


# ---- decode-local prefill -------------------------------------------------------------------------
def _wants_input_logprobs(req) -> bool:
    """Prompt logprobs asked for: only prefill's half returns them (decode holds the prefix, not its logits)."""
    return bool(req.return_logprob) and 0 <= req.logprob_start_len < len(req.origin_input_ids)


_UNSUPPORTED = (  # request attribute set (truthy) -> the feature the local extend does not run
    ("grammar", "structured output (grammar)"), ("multimodal_inputs", "multimodal input"),
    ("input_embeds", "input embeddings"), ("positional_embed_overrides", "positional embedding overrides"),
    ("lora_id", "LoRA adapter"), ("return_hidden_states", "hidden states"),
    ("return_sampling_mask", "sampling mask"), ("session", "session"),
)


def _unsupported_feature(req) -> str | None:
    return next((what for attr, what in _UNSUPPORTED if getattr(req, attr, None)), None)


def _serve_locally(decode_req, prefix_len: int) -> bool:
    """Decide local vs PD for an admitted, locked, preallocated request; if local, decline it to prefill
    and queue it for a local extend. True when the request is now decode's (the caller sends nothing).

    Until the decline is sent, any problem leaves the request on the PD path (counted). With several
    prefill ranks a send that fails half-way has told some of them: the PD path then fails that request
    through SGLang's failure path (the ranks told dropped the room), releasing it as any failure does."""
    state = current()
    req = decode_req.req
    if request_kind(req) is not RequestKind.NORMAL or decode_req.is_rebootstrap:
        return False
    try:
        decision = state.local_prefill.decide(len(req.origin_input_ids), prefix_len, _wants_input_logprobs(req),
                                              _unsupported_feature(req))
    except Exception:
        state.hook_failed("local_prefill_decide", "deciding decode-local prefill for %s failed; it goes to prefill",
                          req.rid)
        return False
    if decision.fallback is not None:
        logger.info("sglang_pd: %s goes to prefill: %s %s", req.rid, decision.fallback.value, decision.detail)
    if not decision.local:
        return False
    if state.local_prefill.rid_is_live(req.rid):  # enqueue would refuse it after the decline: ask first
        logger.warning("sglang_pd: %s goes to prefill: another request under this rid is local here", req.rid)
        state.local_prefill.count_fallback(FallbackReason.DUPLICATE_RID)
        return False
    room = int(req.bootstrap_room)
    notice = DeclineNotice(room, None, f"sglang_pd: declined by decode, which computed the "
                                       f"{decision.num_uncached} uncached prompt tokens itself (decode-local prefill)")
    try:
        send_decline(decode_req.kv_receiver, notice)
    except Exception:  # prefill was not told: it must compute the request, so the PD path serves it
        state.hook_failed("send_decline", "could not decline room %s to prefill; %s goes to prefill", room, req.rid)
        state.local_prefill.count_fallback(FallbackReason.DECLINE_UNSENT)
        return False
    try:
        _enqueue_local(decode_req, prefix_len, decision)
    except Exception:  # declined but not queued: the PD path keeps it, and fails it as prefill dropped the room
        state.hook_failed("local_prefill_enqueue", "room %s was declined to prefill but %s could not be queued "
                          "locally; it stays on the PD path, which fails it", room, req.rid)
        return False
    setattr(req, DECLINED_ROOM_ATTR, room)
    state.decode_admission.record_local(req)
    # Only once queued here is the receiver given up: a refused enqueue left the request whole on the PD path.
    decode_req.kv_receiver.clear()  # abort-notified by the decline: clearing sends nothing more
    decode_req.kv_receiver = None
    attach_request_fields(req, prefix_len, 0, 0, path=PATH_DECODE_LOCAL, num_local_tokens=decision.num_uncached)
    return True


# The room a request was declined in, on the request: prefill fails every later transfer info of a room
# its own request failed (a declined half is one), so a rebootstrap of the request needs a new room.
DECLINED_ROOM_ATTR = "_sglang_pd_declined_room"

_FAULT_HOLD_S = 5.0  # Fault.LOCAL_QUEUE_HOLD: how long a targeted request waits in the local queue


def _enqueue_local(decode_req, prefix_len: int, decision: LocalDecision) -> None:
    """Queue the declined request for a local extend (its receiver untouched: the caller gives it up after)."""
    state = current()
    req = decode_req.req
    hold = _FAULT_HOLD_S if state.faults.take(Fault.LOCAL_QUEUE_HOLD, int(req.bootstrap_room)) else 0.0
    now = time.perf_counter()  # SGLang's time_stats clock
    admitted_ms = 1000 * (now - req.time_stats.scheduler_recv_time)
    # A local request never passes SGLang's transfer -> waiting queue step, which stamps the wait-queue
    # entry; without it SGLang's queue time (meta_info, queue_time_seconds, the decode_waiting stage)
    # would be the clock reading itself at the first forward. Stamped directly: the setter would also
    # observe a transfer stage this request never had.
    req.time_stats.wait_queue_entry_time = now
    state.local_prefill.enqueue(req, prefix_len, decision.num_uncached, not_before_s=time.monotonic() + hold,
                                admitted_ms=round(admitted_ms, 3))


# ---- entry: early rejection ----------------------------------------------------------------------
def _cached_prefix_len(tree, req) -> int:
    """Tokens of the prompt already on this decode server (a match takes no lock)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    if tree is None or getattr(tree, "disable", True):
        return 0
    key = RadixKey(token_ids=req.origin_input_ids, extra_key=req.extra_key)
    return int(tree.match_prefix(MatchPrefixParams(key=key)).device_prefix_len)


def _renew_room(queue, req) -> None:
    """A request served locally is rebootstrapped (SGLang's recompute on prefill after a retract pause)
    under a new room: prefill refuses every transfer info for the room it declined. Mutates `req.bootstrap_room`."""
    old = int(req.bootstrap_room)
    room = secrets.randbits(63)
    while room == old or room in queue.kv_manager.request_status:
        room = secrets.randbits(63)
    req.bootstrap_room = room
    current().counters.add("local_prefill_rebootstrap_rooms_total")
    logger.info("sglang_pd: %s (served locally, room %s declined) is rebootstrapped in room %s", req.rid, old, room)


def around_add(original, queue, req, is_retracted: bool = False, is_rebootstrap: bool = False):
    """A new request reaches decode: refuse it (HTTP 400) if another request on this decode already holds
    its bootstrap room; refuse it now if its predicted TTFT is over target, and tell prefill to answer
    its half at once (a router waits for both halves)."""
    from sglang.srt.disaggregation.utils import prepare_abort

    slo = current().slo
    new = not (is_retracted or is_rebootstrap) and request_kind(req) is RequestKind.NORMAL
    declined_room = getattr(req, DECLINED_ROOM_ATTR, None)
    if is_rebootstrap and declined_room is not None and declined_room == req.bootstrap_room:
        _renew_room(queue, req)
    room = req.bootstrap_room
    if new and room is not None and req.finished_reason is None and int(room) in queue.kv_manager.request_status:
        # Upstream keys a decode's transfer state by room: a second request in the same room shares the
        # first one's status and pages, and when the room fails the first one's cleanup pops the state
        # the second one's poll then reads (KeyError: the decode scheduler dies). Refused at the door,
        # holding nothing; prefill is not told (the room is the other request's).
        message = (f"sglang_pd: bootstrap_room {int(room)} is already in use by another request on this decode "
                   "server; every request needs its own room")
        logger.warning("%s (request %s)", message, req.rid)
        current().counters.add("decode_duplicate_rooms_refused_total")
        prepare_abort(req, message, status_code=HTTPStatus.BAD_REQUEST)
        return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
    if slo.ttft_target_s is None or not new:
        return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
    sched = queue.scheduler
    num_ahead = len(queue.queue) + len(sched.disagg_decode_transfer_queue.queue) + len(sched.waiting_queue)
    uncached = len(req.origin_input_ids) - _cached_prefix_len(queue.tree_cache, req)
    prefill_dp_rank = queue._resolve_prefill_dp_rank(req)  # cache lookup only; None: prefill not met yet
    decision = slo.on_entry(str(req.rid), time.perf_counter(), num_ahead, uncached,
                            refusable=prefill_dp_rank is not None)
    if decision.reject and req.finished_reason is None:
        # Upstream's door: an aborted request that holds nothing is retired at once (no receiver, no
        # page, no lock) and its 503 streamed. Prefill is declined first: its half answers 200 at once
        # (a router then passes decode's 503 through) instead of waiting for this decode until timeout.
        logger.warning("sglang_pd: %s refused: %s", req.rid, decision.message)
        _decline_refused(queue, req, prefill_dp_rank, decision.message)
        prepare_abort(req, decision.message, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
    return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)


def _decline_refused(queue, req, prefill_dp_rank: int, message: str) -> None:
    """Tell prefill to drop a request decode refused at the door, through a receiver made for that
    alone (initialised, declined, cleared: it holds nothing afterwards). A failure is counted and logged;
    prefill's half then waits for SGLang's bootstrap timeout, as without sglang_pd."""
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.decode import _bootstrap_addr
    from sglang.srt.disaggregation.utils import KVClassType, get_kv_class

    state, room = current(), int(req.bootstrap_room)
    receiver = get_kv_class(queue.transfer_backend, KVClassType.RECEIVER)(
        mgr=queue.kv_manager, bootstrap_addr=_bootstrap_addr(req), bootstrap_room=req.bootstrap_room)
    try:
        receiver.init(prefill_dp_rank)
        if receiver.conclude_state == KVPoll.Failed:
            raise RuntimeError(f"receiver for room {room} failed to initialise")
        send_decline(receiver, DeclineNotice(room, None, message))
        state.counters.add("early_rejection_declines_total")
    except Exception:
        state.hook_failed("early_rejection_decline", "could not decline refused room %s to prefill", room)
    finally:
        receiver.clear()
        with queue.kv_manager.failure_lock:
            queue.kv_manager.failure_records.pop(room, None)
