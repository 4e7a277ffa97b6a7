"""Hooks on SGLang's `MooncakeKVManager` (disaggregation/mooncake/conn.py): room declines consumed
first, batches kept under the TCP transport's queue limit, transfer workers at a lower CPU priority, the
prefill-side send-failure test fault."""

from __future__ import annotations

from sglang_pd.srt.disaggregation.transfer_batches import descriptor_batches
from sglang_pd.srt.hooks.common_conn import consume_decline_first
from sglang_pd.srt.state import current


def around_handle_abort_notification(original, mgr, msg):
    """Prefill: a room decline is consumed here; anything else goes to upstream's ABORT handling.
    (Malformed messages never get here: the rank socket's HandshakeGate dropped them.)"""
    return consume_decline_first(original, mgr, msg)


def around_send_kvcache(original, mgr, mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices,
                        executor, dst_layer_ids=None, dst_device_kv_indices=None, dst_kv_item_len=None,
                        dst_attn_tp_size=None):
    """Send as upstream does; a test fault instead reports the failure code a failed transfer returns,
    so upstream's own prefill failure path runs (room failed, decode told, session probed)."""
    if current().transfer_watch.take_send_failure():
        return -1
    return original(mgr, mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices, executor,
                    dst_layer_ids, dst_device_kv_indices, dst_kv_item_len, dst_attn_tp_size)


def around_transfer_data(original, mgr, mooncake_session_id, transfer_blocks):
    """Send a batch over the TCP transport's per-peer queue limit as consecutive smaller batches."""
    batches = descriptor_batches(transfer_blocks, current().settings.mooncake_max_batch_descriptors)
    if len(batches) > 1:
        current().counters.add("mooncake_split_batches_total")
    for batch in batches:
        ret = original(mgr, mooncake_session_id, batch)
        if ret != 0:
            return ret
    return 0


def before_transfer_worker(mgr, queue, executor, staging_buffer=None, worker_index=0):
    """Prefill, at the start of each transfer worker thread: lower its CPU priority (worker_priority.py)."""
    current().transfer_worker_priority.lower_current_thread()
