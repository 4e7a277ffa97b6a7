"""Hooks on SGLang's `MooncakeKVManager` (disaggregation/mooncake/conn.py): room declines consumed
first, batches kept under the TCP transport's queue limit, transfer workers at a lower CPU priority that
outlive an exception on one room, the prefill-side send-failure, send-delay and worker-error test faults."""

from __future__ import annotations

import time

from sglang_pd.srt.transfer import descriptor_batches
from sglang_pd.srt.transfer import ChunkTap, record, recover_room
from sglang_pd.srt.hooks.connection.common_conn import consume_decline_first
from sglang_pd.srt.state import current


def around_handle_abort_notification(original, mgr, msg):
    """Prefill: a room decline is consumed here; anything else goes to upstream's ABORT handling.
    (Malformed messages never get here: the rank socket's HandshakeGate dropped them.)"""
    return consume_decline_first(original, mgr, msg)


def around_send_kvcache(original, mgr, mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices,
                        executor, dst_layer_ids=None, dst_device_kv_indices=None, dst_kv_item_len=None,
                        dst_attn_tp_size=None):
    """Send as upstream does. Test faults: report the failure code a failed transfer returns, so
    upstream's own prefill failure path runs (room failed, decode told, session probed); or raise, as
    a bug in the worker would, for the worker guard (around_transfer_worker); or start the send late,
    so the room's write is still to land when the test aborts it."""
    watch = current().transfer_watch
    delay = watch.take_send_delay()
    if delay:
        time.sleep(delay)
    if watch.take_send_failure():
        return -1
    if watch.take_worker_error():
        raise KeyError(watch.room())  # what 0.5.23's worker raised for a cleared room (transfer/worker_recovery.py)
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


def around_transfer_worker(original, mgr, queue, executor, staging_buffer=None, worker_index=0):
    """Prefill, one per transfer worker thread: lower its CPU priority (worker_priority.py), then run
    upstream's worker loop. When the loop raises for a chunk, settle that chunk's room (fail it and tell
    decode, unless it was already cleared or concluded), count it and run the loop again on the same
    queue (transfer/worker_recovery.py). An exception with no chunk in hand still ends the thread."""
    state = current()
    state.transfer_worker_priority.lower_current_thread()
    tap = ChunkTap(queue)
    while True:
        try:
            return original(mgr, tap, executor, staging_buffer, worker_index)
        except Exception as exc:
            chunk = tap.taken
            if chunk is None:
                raise
            room = int(chunk.room)
            record(state.counters, room, recover_room(mgr, room, exc), exc)
