"""Hooks on SGLang's `NixlKVManager` (disaggregation/nixl/conn.py): host-memory KV, stall bound, pages
counted at NIXL, room declines consumed first, a registration NIXL cannot load dropped (not the
bootstrap thread). The logic is in srt/transfer/nixl_host_memory.py."""

from __future__ import annotations

import logging

from sglang_pd.srt.transfer import HOST_MEMORY_KIND
from sglang_pd.srt.hooks.connection.common_conn import consume_decline_first
from sglang_pd.srt.mem_cache import bytes_per_page
from sglang_pd.srt.state import current

logger = logging.getLogger(__name__)


def _kv_on_host() -> bool:
    from sglang.srt.runtime_context import get_device

    return str(get_device().device) == "cpu"


def around_init(original, mgr, args, disaggregation_mode, server_args, is_mla_backend=False):
    """On a CPU device: KV buffers are DRAM, and the agent created inside runs without progress thread."""
    on_host = _kv_on_host()
    if on_host:
        args.kv_data_mem_kinds = [HOST_MEMORY_KIND] * len(args.kv_data_ptrs)
    with current().nixl_host_memory.entered(on_host):
        return original(mgr, args, disaggregation_mode, server_args, is_mla_backend)


def around_send_kvcache(original, mgr, peer_name, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices, dst_gpu_id,
                        dst_mem_kind="VRAM"):
    """Count the KV pages (and bytes) NIXL is asked to move for the current room; a test fault makes
    the send raise instead, so upstream's own worker failure path runs."""
    state = current()
    if state.transfer_watch.take_send_failure():
        raise RuntimeError(f"sglang_pd: injected prefill transfer failure (room {state.transfer_watch.room()})")
    handle = original(mgr, peer_name, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices, dst_gpu_id, dst_mem_kind)
    pages = len(prefill_kv_indices)
    state.prefill_log.record_nixl_pages(state.transfer_watch.room(), pages, pages * bytes_per_page(mgr.kv_args))
    return handle


def around_await_handles(original, mgr, handles, *, failure_seen):
    """Arm this thread's stall deadline for the batch being awaited."""
    with current().transfer_watch.armed():
        return original(mgr, handles, failure_seen=failure_seen)


def around_handle_abort_notification(original, mgr, msg):
    """Same as mooncake's: a room decline is consumed here, anything else goes to upstream."""
    return consume_decline_first(original, mgr, msg)


def around_add_remote_peer(original, mgr, decode_kv_args):
    """Register a NIXL peer; on failure forget it (counted) instead of ending the bootstrap thread.

    The gate checked the registration's frames, but the agent metadata blob is NIXL's to parse:
    `add_remote_agent` raises on a bad blob (upstream has stored the peer by then), and a blob naming
    another agent than the frame leaves a peer no transfer can reach.
    """
    name = decode_kv_args.agent_name
    known = name in mgr.decode_kv_args_table
    try:
        original(mgr, decode_kv_args)
        if known or mgr.agent.check_remote_metadata(name):
            return None
        problem = "its agent metadata names another agent"
    except Exception as exc:  # NIXL's own parse of a peer-supplied blob
        problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    if not known:
        mgr.decode_kv_args_table.pop(name, None)
    state = current()
    state.counters.add("handshake_messages_rejected_total", 1)
    if state.peer_guard.gate is not None:
        state.peer_guard.gate.count_external_rejection("registration")
    logger.warning("sglang_pd: NIXL registration of agent %r (%s:%s) refused: %s", name,
                   decode_kv_args.endpoint, decode_kv_args.dst_port, problem)
    return None
