"""Thin hooks running SGLang's decode prealloc loop as one AdmissionRound (batched eviction).

`pop_preallocated` opens the round and closes it whatever happens (unused locks released). The
first `_match_prefix_and_lock` of the call plans the round from that request on, in queue order;
each later call hands SGLang the planned, locked match. Sizes come from SGLang's own budget
functions (`QueueSizer`), so the round admits what SGLang's loop would.
"""

from __future__ import annotations

from typing import Any

from sglang_pd import config
from sglang_pd.process_state import STATE
from sglang_pd.srt.disaggregation.retraction_hooks import plain_radix_decode

SETTING = f"{config.PREFIX}BATCHED_EVICTION"


class QueueSizer:
    """RoundSizer over a live DecodePreallocQueue (reads SGLang's budget; `evict` mutates the tree)."""

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


class _RoundCall:
    """The pop_preallocated call in progress (at most one: the scheduler thread is single)."""

    queue: Any = None
    planned: bool = False


_CALL = _RoundCall()


def _round_applies(queue, rids_to_check) -> bool:
    from sglang.srt.runtime_context import get_disagg

    return (rids_to_check is None and queue.pp_size == 1 and config.enabled(SETTING)
            and get_disagg().disaggregation_decode_host_receive_threshold >= 1
            and plain_radix_decode(queue))


def around_pop_preallocated(original, queue, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None):
    """Run SGLang's loop as one admission round; release what the loop did not take."""
    if not _round_applies(queue, rids_to_check):
        return original(queue, rids_to_check, pp_good_rids, pp_bad_rids)
    _CALL.queue, _CALL.planned = queue, False
    try:
        return original(queue, rids_to_check, pp_good_rids, pp_bad_rids)
    finally:
        _CALL.queue = None
        STATE.admission_round.close()


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


def planned_match(queue, req):
    """The round's locked match for `req` (planning the round on the first call); None if unplanned."""
    if _CALL.queue is not queue:
        return None
    if not _CALL.planned:
        from sglang.srt.mem_cache.common import match_kv_cache

        _CALL.planned = True
        STATE.admission_round.plan(_candidates(queue, req), queue.tree_cache, QueueSizer(queue), match_kv_cache)
    return STATE.admission_round.take(req)
