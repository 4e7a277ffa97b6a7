"""Thin hooks on SGLang's decode prealloc queue; the logic lives in DecodePrefixAdmission."""

from __future__ import annotations

import logging

from sglang_pd.process_state import STATE
from sglang_pd.srt.disaggregation import round_hooks
from sglang_pd.srt.disaggregation.decode_admission import AdmissionError
from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.disaggregation.request_fields import attach_request_fields
from sglang_pd.srt.mem_cache.common import RequestKind, bytes_per_page, kv_to_page_num, request_kind

logger = logging.getLogger(__name__)


def around_match_prefix_and_lock(original, queue, req):
    """Plain radix trees go through our admission; hybrid (SWA tail / mamba) trees stay upstream's."""
    from sglang.srt.mem_cache.common import match_kv_cache

    tree = queue.tree_cache
    if queue._uses_swa_tail_prealloc() or tree.supports_mamba():
        return original(queue, req)
    try:
        planned = round_hooks.planned_match(queue, req)
    except Exception:  # never take the scheduler down: admit this call per request, as SGLang does
        STATE.count_hook_error("admission_round")
        logger.exception("sglang_pd: planning the admission round failed; admitting per request")
        STATE.admission_round.close()
        planned = None
    if planned is not None:  # matched and locked when the admission round was planned
        return queue._build_decode_prefix_match(req, planned)
    try:
        result = STATE.decode_admission.match_and_lock(req, tree, request_kind(req), match_kv_cache)
    except AdmissionError:
        # The tree broke the contract before any lock was taken: serve via upstream's path.
        STATE.count_hook_error("decode_admission")
        logger.exception("sglang_pd: decode admission refused the tree's match; using upstream's")
        return original(queue, req)
    return queue._build_decode_prefix_match(req, result)


def _apply_faults(decode_req, page_size: int, metadata_kwargs: dict) -> None:
    faults, req = STATE.faults, decode_req.req
    room = int(req.bootstrap_room)
    if faults.take(Fault.PREFIX_UNALIGNED, room):
        metadata_kwargs["decode_prefix_len"] = int(metadata_kwargs.get("decode_prefix_len") or 0) + 1
    elif faults.take(Fault.PREFIX_EXCEEDS, room):
        metadata_kwargs["decode_prefix_len"] = len(req.origin_input_ids) + page_size


def _fail_transfer(decode_req) -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    receiver = decode_req.kv_receiver
    room = int(decode_req.req.bootstrap_room)
    receiver.kv_mgr.record_failure(room, "sglang_pd: injected transfer failure")
    receiver.kv_mgr.update_status(room, KVPoll.Failed)


def around_send_kv_metadata(original, queue, decode_req, kv_indices, page_size, state_indices=None,
                            **metadata_kwargs):
    """Check the hand-off to the transfer layer against the admission plan, then send."""
    req = decode_req.req
    prefix_len = int(metadata_kwargs.get("decode_prefix_len") or 0)
    num_pages = kv_to_page_num(len(kv_indices), page_size)
    try:
        mismatch = STATE.decode_admission.record_handoff(str(req.rid), prefix_len, num_pages)
        if request_kind(req) is RequestKind.NORMAL:  # warmup / health checks move no real KV
            num_bytes = num_pages * bytes_per_page(decode_req.kv_receiver.kv_mgr.kv_args)
            STATE.counters.add("kv_pages_transferred_total", num_pages)
            STATE.counters.add("kv_bytes_transferred_total", num_bytes)
            attach_request_fields(req, prefix_len, num_pages, num_bytes)
        if mismatch is not None:
            logger.error("sglang_pd: %s handed decode_prefix_len=%s, %s pages to transfer; plan was %s",
                         req.rid, prefix_len, num_pages, mismatch)
    except Exception:
        STATE.count_hook_error("send_kv_metadata")
        logger.exception("sglang_pd: failed to record the transfer hand-off")
    _apply_faults(decode_req, page_size, metadata_kwargs)
    result = original(queue, decode_req, kv_indices, page_size, state_indices, **metadata_kwargs)
    if STATE.faults.take(Fault.TRANSFER_FAIL, int(req.bootstrap_room)):
        _fail_transfer(decode_req)
    return result
