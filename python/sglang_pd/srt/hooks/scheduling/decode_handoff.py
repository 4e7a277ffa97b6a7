"""Hooks on SGLang's `DecodePreallocQueue._send_kv_metadata` (disaggregation/decode.py): the hand-off.

An admitted request (matched, locked, preallocated) is handed either to prefill or to decode itself:

    decode-local prefill decides (local_prefill/decision.py) -> local: the room declined to prefill, the
        request queued for a local extend (local_prefill/queue.py), its receiver given up; nothing sent
    else -> the hand-off (decode_prefix_len, pages) recorded and checked against the admission plan,
        counted, sent; tests only: faults bend it (FaultPlan.bend_handoff) or fail the transfer after.

The admission of the request (match, rounds, budget) is decode_prealloc_queue.py's.
"""

from __future__ import annotations

import logging
import time

from sglang_pd.srt.admission import mark_declined
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.wire import DeclineNotice
from sglang_pd.srt.handshake import send_decline
from sglang_pd.srt.local_prefill import LocalFallback, LocalDecision, uncached_awaited
from sglang_pd.srt.mem_cache import RequestKind, bytes_per_page, kv_to_page_num, request_kind
from sglang_pd.srt.metrics import PATH_DECODE_LOCAL, attach_request_fields
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


# ---- transfer hand-off ---------------------------------------------------------------------------
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
    decode_prefix_len = int(metadata_kwargs.get("decode_prefix_len") or 0)
    if state.local_prefill.enabled and _serve_locally(decode_req, decode_prefix_len, _prefill_backlog(queue)):
        return None
    num_pages = kv_to_page_num(len(kv_indices), page_size)
    try:
        # A rebootstrap (SGLang's recompute after a retract pause) hands off the prompt and the output so
        # far with no prefix: not the admission plan's hand-off, nothing to check it against.
        mismatch = None if decode_req.is_rebootstrap else state.decode_admission.record_handoff(
            req, decode_prefix_len, num_pages)
        if request_kind(req) is RequestKind.NORMAL:  # warmup / health checks move no real KV
            num_bytes = num_pages * bytes_per_page(decode_req.kv_receiver.kv_mgr.kv_args)
            state.counters.add("kv_pages_transferred_total", num_pages)
            state.counters.add("kv_bytes_transferred_total", num_bytes)
            attach_request_fields(req, decode_prefix_len, num_pages, num_bytes)
        if mismatch is not None:
            logger.error("sglang_pd: %s handed decode_prefix_len=%s, %s pages to transfer; plan was %s",
                         req.rid, decode_prefix_len, num_pages, mismatch)
    except Exception:
        state.hook_failed("send_kv_metadata", "failed to record the transfer hand-off")
    if state.faults.enabled:  # tests only: bend what prefill is told (FaultPlan.bend_handoff)
        bend = state.faults.bend_handoff(int(req.bootstrap_room), decode_prefix_len, len(req.origin_input_ids),
                                         len(kv_indices), page_size)
        if bend.decode_prefix_len is not None:
            metadata_kwargs["decode_prefix_len"] = bend.decode_prefix_len
        kv_indices = kv_indices[bend.num_slots_skipped:]
    # The prompt prefill's half of this room computes: a rebootstrap (SGLang's recompute after a retract
    # pause) sends prefill the prompt plus the tokens generated so far, built by SGLang's own payload.
    prompt = req.build_rebootstrap_payload()["input_ids"] if decode_req.is_rebootstrap else req.origin_input_ids
    with state.peer_guard.outgoing.sending(int(req.bootstrap_room), prompt):
        result = original(queue, decode_req, kv_indices, page_size, state_indices, **metadata_kwargs)
    state.local_prefill.note_prefill_handoff(len(prompt) - decode_prefix_len)
    if state.faults.take(Fault.TRANSFER_FAIL, int(req.bootstrap_room)):
        _fail_transfer(decode_req)
    return result


# ---- decode-local prefill (decided by local_prefill/decision.py) ------------------------------------
def _prefill_backlog(queue) -> int:
    """The balance rule's view of prefill's backlog: SGLang's transfer queue (0 when the rule is off)."""
    state = current()
    if not state.local_prefill.balance_tokens:
        return 0
    try:
        return uncached_awaited(r.req for r in queue.transfer_queue.queue)
    except Exception:  # counted and logged; the threshold alone then decides
        state.hook_failed("local_prefill_backlog", "reading prefill's backlog from the transfer queue failed")
        return 0


def _serve_locally(decode_req, decode_prefix_len: int, prefill_backlog: int = 0) -> bool:
    """Decide local vs PD for an admitted, locked, preallocated request; if local, decline it to prefill
    and queue it for a local extend. True when the request is now decode's (the caller sends nothing).

    Until the decline is sent, any problem leaves the request on the PD path (counted). With several
    prefill ranks a send that fails half-way has told some of them: the PD path then fails that request
    through SGLang's failure path (the ranks told dropped the room), releasing it as any failure does."""
    state = current()
    req = decode_req.req
    try:
        decision = state.local_prefill.decide(req, decode_prefix_len, request_kind(req), decode_req.is_rebootstrap,
                                              prefill_backlog=prefill_backlog)
    except Exception:
        state.hook_failed("local_prefill_decide", "deciding decode-local prefill for %s failed; it goes to prefill",
                          req.rid)
        return False
    if decision.fallback is not None:
        log = logger.warning if decision.fallback is LocalFallback.DUPLICATE_RID else logger.info
        log("sglang_pd: %s goes to prefill: %s %s", req.rid, decision.fallback.value, decision.detail)
    if not decision.local:
        return False
    room = int(req.bootstrap_room)
    notice = DeclineNotice(room, None, f"sglang_pd: declined by decode, which computed the "
                                       f"{decision.num_uncached} uncached prompt tokens itself (decode-local prefill)")
    try:
        send_decline(decode_req.kv_receiver, notice)
    except Exception:  # prefill was not told: it must compute the request, so the PD path serves it
        state.hook_failed("send_decline", "could not decline room %s to prefill; %s goes to prefill", room, req.rid)
        state.local_prefill.count_fallback(LocalFallback.DECLINE_UNSENT)
        return False
    try:
        _enqueue_local(decode_req, decode_prefix_len, decision)
    except Exception:  # declined but not queued: the PD path keeps it, and fails it as prefill dropped the room
        state.hook_failed("local_prefill_enqueue", "room %s was declined to prefill but %s could not be queued "
                          "locally; it stays on the PD path, which fails it", room, req.rid)
        return False
    mark_declined(req, room)  # a rebootstrap of it needs another room (admission/room_renewal.py)
    state.decode_admission.record_local(req)
    # Only once queued here is the receiver given up: a refused enqueue left the request whole on the PD path.
    decode_req.kv_receiver.clear()  # abort-notified by the decline: clearing sends nothing more
    decode_req.kv_receiver = None
    attach_request_fields(req, decode_prefix_len, 0, 0, path=PATH_DECODE_LOCAL, num_local_tokens=decision.num_uncached)
    return True


_FAULT_HOLD_S = 5.0  # Fault.LOCAL_QUEUE_HOLD: how long a targeted request waits in the local queue


def _enqueue_local(decode_req, decode_prefix_len: int, decision: LocalDecision) -> None:
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
    state.local_prefill.enqueue(req, decode_prefix_len, decision.num_uncached, not_before_s=time.monotonic() + hold,
                                admitted_ms=round(admitted_ms, 3))
