"""What a guarded rank socket is built from: the `FrameLimits` of a KV manager's pools, the libzmq frame
cap, prefill's DCP place, whether its reader may hold SGLang's clears, and the PD threads its manager runs.

The hook on `CommonKVManager.__init__` (srt/hooks/connection/common_conn.py) asks these questions and wires the
answers; nothing here patches SGLang or imports it (managers and KVArgs are read by attribute).
"""

from __future__ import annotations

import dataclasses
import logging

from sglang_pd.config import PEER_SECRET_FILE
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.threads import ThreadRole

logger = logging.getLogger(__name__)
_MIB = 1 << 20
GUARDED_BACKENDS = ("mooncake", "nixl")


def frame_limits(args, module: str, mode: str, staging: bool) -> FrameLimits | None:
    """What a manager's pools (SGLang's KVArgs `args`) let a peer name; None for a manager of `module` we do
    not guard or a `mode` other than prefill / decode. `staging`: SGLANG_DISAGG_STAGING_BUFFER (read-only)."""
    backend = next((b for b in GUARDED_BACKENDS if f".{b}." in f".{module}."), None)
    if backend is None or mode not in ("prefill", "decode"):
        return None
    lens, items = list(args.kv_data_lens or []), list(args.kv_item_lens or [])
    max_pages = lens[0] // items[0] if lens and items and items[0] else 1 << 20
    aux_items = tuple(int(n) for n in args.aux_item_lens or [])
    aux_slots = tuple(int(d) // int(i) if i else 0 for d, i in zip(args.aux_data_lens or [], aux_items))
    side = Side(mode)
    # Prefill's largest legitimate frames: page-index lists and NIXL agent metadata (KBs per agent).
    if side is Side.PREFILL:
        max_frame = max(4 * _MIB, 4 * (max_pages + 64))
    else:
        max_frame = max(_MIB, max(aux_items, default=0) + 64)
    state_types = tuple(str(getattr(t, "value", t)) for t in getattr(args, "state_types", None) or [])
    return FrameLimits(backend, side, int(args.page_size), max_pages + 8, max_frame, staging=staging,
                       aux_item_lens=aux_items, aux_slots=aux_slots, state_types=state_types)


def zmq_frame_cap(limits: FrameLimits) -> int:
    """libzmq's hard cap: well above any field's own limit, so most oversize frames reach the gate (logged)."""
    return max(16 * _MIB, 2 * limits.max_frame_bytes)


def unguarded_with_secret(manager_cls) -> str:
    """Why a server with a peer secret refuses a KV manager whose rank socket sglang_pd cannot guard."""
    return (f"sglang_pd: {PEER_SECRET_FILE} is set, but the rank socket of {manager_cls.__name__} "
            f"({manager_cls.__module__}) cannot be authenticated (sglang_pd guards mooncake and nixl only): "
            "refusing to serve unauthenticated peers; use --disaggregation-transfer-backend mooncake or nixl, "
            f"or unset {PEER_SECRET_FILE}")


def with_dcp_place(limits: FrameLimits, mgr) -> FrameLimits:
    """Prefill: `limits` with the manager's DCP size and rank (known once SGLang built it) and, when it
    relays KV out to a larger decode DCP (MLA, DCP 1), its non-draft entries' bytes per token."""
    if limits.side is not Side.PREFILL:
        return limits
    size, rank = int(mgr.dcp_size), int(mgr.dcp_rank)
    relayout = None
    if size == 1 and (mgr.is_mla_backend or mgr.is_hybrid_mla_backend):  # upstream's requires_dcp_relayout
        items = list(mgr.kv_args.kv_item_lens)
        relayout = tuple(n // limits.page_size for n in items[:len(items) - int(mgr.kv_args.num_draft_entries)])
    return dataclasses.replace(limits, dcp_size=size, dcp_rank=rank, dcp_relayout_token_bytes=relayout)


def reader_comes_straight_back(mgr, limits: FrameLimits) -> bool:
    """Whether prefill's bootstrap thread calls the socket's recv_multipart again right after handling a
    message (the hold is released there). Not with mooncake under --enable-pd-role-switch: SGLang then
    polls the raw socket for up to 500 ms first, and every clear would wait for that poll; the hold is
    off there (logged; `bootstrap_hold` in /sglang_pd/stats) and upstream's race stays."""
    if limits.backend != "mooncake" or mgr.deferred_bootstrap is not None:
        return True
    if not getattr(mgr.server_args, "enable_pd_role_switch", False):
        return True
    logger.warning("sglang_pd: --enable-pd-role-switch: prefill's bootstrap thread polls before each recv, so a "
                   "request's clear is not kept out of its handling of a message (SGLang 0.5.23's race on a "
                   "cleared room stays: the thread can die of a KeyError, /health then answers 503)")
    return False


def expected_threads(mgr, side: Side) -> dict[ThreadRole, int] | None:
    """The PD threads SGLang's manager runs once built (None while prefill's queues do not exist yet)."""
    if side is Side.DECODE:
        return {ThreadRole.STATUS_LISTENER: 1, ThreadRole.HEARTBEAT: 1}
    queues = getattr(mgr, "transfer_queues", None)
    return None if queues is None else {ThreadRole.BOOTSTRAP: 1, ThreadRole.TRANSFER_WORKER: len(queues)}
