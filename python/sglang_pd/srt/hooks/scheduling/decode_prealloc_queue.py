"""Hooks on SGLang's `DecodePreallocQueue` (disaggregation/decode.py): admission into the prealloc queue.

    add                     -> early rejection (SloController) and duplicate rooms refused before any
                               page or lock; a locally served request's rebootstrap gets a new room
    pop_preallocated        -> one AdmissionRound per call (opened here, closed whatever happens);
                               requests served by decode-local prefill leave with it, not to transfer
    _match_prefix_and_lock  -> the round's planned match, else DecodePrefixAdmission per request
    _pre_alloc              -> a resumed retracted request re-matches the tree (RadixResume)
    _active_req_count       -> local-prefill requests reserve their decode headroom like any other, and so
                               do running requests folded into a mixed local extend (until its join)
    _need_space_for_single_req, _required_admission_tokens
                            -> those folded running requests count as running (admission/headroom.py)

`QueueSizer` reads SGLang's own budget functions for the round planner. The hand-off of an admitted
request (`_send_kv_metadata`: to prefill, or to decode-local prefill) is decode_handoff.py's.
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus

from sglang_pd.srt.admission import headroom
from sglang_pd.srt.admission import round_candidates
from sglang_pd.srt.admission import AdmissionError
from sglang_pd.srt.admission import needs_new_room, renew_room
from sglang_pd.srt.wire import DeclineNotice
from sglang_pd.srt.handshake import send_decline
from sglang_pd.srt.hooks.scheduling.takeover import owns_decode_queue
from sglang_pd.srt.mem_cache import RequestKind, request_kind
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


# ---- admission rounds (batched eviction) -----------------------------------------------------------
class QueueSizer:
    """RoundSizer over a live DecodePreallocQueue (reads SGLang's budget; `evict` mutates the tree).

    `retractable_tokens` is the running batch's, as SGLang's pop_preallocated computes it; the budget
    hooks below add the running requests a mixed local extend holds (admission/headroom.py)."""

    def __init__(self, queue):
        self.queue = queue
        self.retractable_tokens = headroom.retractable_tokens(queue.scheduler.running_batch.reqs)

    def alloc_tokens(self, req, decode_prefix_len: int) -> int:
        return self.queue._required_alloc_tokens(fill_len=self.queue._pre_alloc_fill_len(req),
                                                 prefix_len=decode_prefix_len)

    def admission_tokens(self, req, alloc_tokens: int, decode_prefix_len: int) -> int:
        return self.queue._required_admission_tokens(req, alloc_tokens, decode_prefix_len, self.retractable_tokens)

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
    current().local_prefill.start_round()
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
    for the running requests a mixed local extend holds until its join (admission/headroom.py)."""
    local = current().local_prefill
    return result + local.num_pending() + len(local.mixed_decoding_reqs())


# ---- the running requests a mixed local extend holds (admission/headroom.py) ------------------------
def around_need_space_for_single_req(original, queue, retractable_tokens=None):
    """SGLang's figure with the mixed extend's running requests counted as running; else SGLang's."""
    from sglang.srt.disaggregation.decode import CLIP_MAX_NEW_TOKEN

    mixed = current().local_prefill.mixed_decoding_reqs()
    if retractable_tokens is None or not mixed:
        return original(queue, retractable_tokens)
    return headroom.need_space_for_single_req([*queue.scheduler.running_batch.reqs, *mixed],
                                              retractable_tokens + headroom.retractable_tokens(mixed),
                                              CLIP_MAX_NEW_TOKEN)


def around_required_admission_tokens(original, queue, req, allocated_tokens, prefix_len, retractable_tokens):
    """SGLang's per-request admission need, with the mixed extend's running requests retractable too
    (`retractable_tokens` is running_batch's, as its callers compute it)."""
    mixed = current().local_prefill.mixed_decoding_reqs()
    return original(queue, req, allocated_tokens, prefix_len, retractable_tokens + headroom.retractable_tokens(mixed))


def _candidates(queue, first_req) -> list:
    """The requests SGLang's loop may reach from `first_req` on (admission/candidates.py)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    num_free_rows = min(queue.req_to_metadata_buffer_idx_allocator.available_size(),
                        queue.req_to_token_pool.available_size())
    return round_candidates(queue.queue, first_req, num_free_rows,
                            lambda req: isinstance(req.finished_reason, FINISH_ABORT))


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


# ---- entry: early rejection, duplicate rooms, renewed rooms --------------------------------------
def _cached_prefix_len(tree, req) -> int:
    """Tokens of the prompt already on this decode server (a match takes no lock)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    if tree is None or getattr(tree, "disable", True):
        return 0
    key = RadixKey(token_ids=req.origin_input_ids, extra_key=req.extra_key)
    return int(tree.match_prefix(MatchPrefixParams(key=key)).device_prefix_len)


def around_add(original, queue, req, is_retracted: bool = False, is_rebootstrap: bool = False):
    """A new request reaches decode: refuse it (HTTP 400) if another request on this decode already holds
    its bootstrap room; refuse it now if its predicted TTFT is over target, and tell prefill to answer
    its half at once (a router waits for both halves). A rebootstrap of a request served locally moves
    to a new room first (admission/room_renewal.py)."""
    from sglang.srt.disaggregation.utils import prepare_abort

    state = current()
    new = not (is_retracted or is_rebootstrap) and request_kind(req) is RequestKind.NORMAL
    if needs_new_room(req, is_rebootstrap):
        old = renew_room(req, queue.kv_manager.request_status, state.counters)
        logger.info("sglang_pd: %s (served locally, room %s declined) is rebootstrapped in room %s",
                    req.rid, old, req.bootstrap_room)
    room = req.bootstrap_room
    if new and room is not None and req.finished_reason is None and int(room) in queue.kv_manager.request_status:
        # Upstream keys a decode's transfer state by room: a second request in the same room shares the
        # first one's status and pages, and when the room fails the first one's cleanup pops the state
        # the second one's poll then reads (KeyError: the decode scheduler dies). Refused at the door,
        # holding nothing; prefill is not told (the room is the other request's).
        message = (f"sglang_pd: bootstrap_room {int(room)} is already in use by another request on this decode "
                   "server; every request needs its own room")
        logger.warning("%s (request %s)", message, req.rid)
        state.counters.add("decode_duplicate_rooms_refused_total")
        prepare_abort(req, message, status_code=HTTPStatus.BAD_REQUEST)
        return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
    if state.slo.ttft_target_s is None or not new:
        return original(queue, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)
    sched = queue.scheduler
    num_ahead = len(queue.queue) + len(sched.disagg_decode_transfer_queue.queue) + len(sched.waiting_queue)
    num_uncached = len(req.origin_input_ids) - _cached_prefix_len(queue.tree_cache, req)
    prefill_dp_rank = queue._resolve_prefill_dp_rank(req)  # cache lookup only; None: prefill not met yet
    decision = state.slo.on_entry(str(req.rid), time.perf_counter(), num_ahead, num_uncached,
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
