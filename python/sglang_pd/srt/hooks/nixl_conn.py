"""Hooks on SGLang's `NixlKVManager` (disaggregation/nixl/conn.py): host-memory KV, stall bound, pages
counted at NIXL, bootstrap messages checked first. The logic is in srt/disaggregation/nixl_host_memory.py."""

from __future__ import annotations

from sglang_pd.srt.disaggregation.nixl_host_memory import HOST_MEMORY_KIND
from sglang_pd.srt.disaggregation.transfer_info_guard import NIXL
from sglang_pd.srt.hooks.common_conn import guard_bootstrap_message
from sglang_pd.srt.mem_cache.common import bytes_per_page
from sglang_pd.srt.state import current


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
    """Same check as mooncake's, for NIXL (whose parser also asserts on foreign traffic)."""
    return guard_bootstrap_message(original, mgr, msg, NIXL)
