"""Prefill's mooncake transfer worker outlives an exception on one room (transfer_worker_guard.py).

SGLang 0.5.23's own `MooncakeKVManager.transfer_worker` runs, unmodified, on a prefill manager that
holds only the state that loop reads (built without its transfer engine, which needs a live peer).
A real ZMQ socket stands for decode's status listener. One room names a decode session the manager
never registered, so upstream's loop raises KeyError on it, a genuine exception inside the worker.
Alone, upstream's worker dies on it and the next room is never served. Behind our hook, the room
is failed with a reason naming the exception, decode gets the Failed status, and the next room is
served by the same worker.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np
import pytest
import zmq

from sglang_pd.srt.transfer.worker_recovery import COUNTER, ChunkTap, Outcome, recover_room
from sglang_pd.srt.hooks.connection.mooncake_conn import around_transfer_worker

pytestmark = pytest.mark.unit

BROKEN, SERVED, CLEARED = 101, 202, 303


@pytest.fixture
def decode_listener():
    """A ZMQ PULL socket on 127.0.0.1 standing for decode's status listener: (socket, port)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    sock.close(linger=0)
    ctx.term()


def prefill_manager(port: int):
    """A prefill MooncakeKVManager with the state its transfer worker reads: room BROKEN names a decode
    session that never registered; room SERVED is a dummy destination (nothing to write); both are
    Transferring."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, TransferInfo

    mgr = MooncakeKVManager.__new__(MooncakeKVManager)
    mgr.enable_trace = False
    mgr.bootstrap_port = 0
    mgr.enable_staging = False
    mgr.enable_deferred_decode_kv_release = False
    mgr.deferred_bootstrap = None
    mgr.kv_status_msg_tag = MooncakeKVManager.kv_status_msg_tag
    mgr.kv_status_msg_carries_reason = MooncakeKVManager.kv_status_msg_carries_reason
    mgr.attn_tp_rank, mgr.pp_rank, mgr.attn_cp_rank = 0, 0, 0
    mgr.pp_size, mgr.attn_cp_size = 1, 1
    mgr._zmq_ctx = zmq.Context()
    mgr._socket_cache, mgr._monitor_cache, mgr._socket_send_locks = {}, {}, {}
    mgr._socket_lock = threading.Lock()
    mgr.defer_decode_allocation = False
    mgr.session_lock, mgr.failure_lock = threading.Lock(), threading.Lock()
    mgr.state_layout_rejections, mgr.failed_sessions, mgr.failed_session_probes = {}, set(), {}
    mgr.decode_kv_args_table = {}
    mgr.failure_records = {}
    mgr._staging_outstanding = defaultdict(int)
    mgr._deferred_ack_targets, mgr._deferred_ack_poisoned_rooms = {}, set()
    mgr.req_to_decode_prefix_len = {}
    mgr.request_status = {BROKEN: KVPoll.Transferring, SERVED: KVPoll.Transferring}
    common = dict(dst_kv_indices=np.arange(4, dtype=np.int32), dst_aux_index=0, dst_state_indices=[],
                  required_dst_info_num=1)
    mgr.transfer_infos = {
        BROKEN: {"never-registered": TransferInfo(room=BROKEN, endpoint="127.0.0.1", dst_port=port,
                                                  mooncake_session_id="never-registered", is_dummy=False,
                                                  **common)},
        SERVED: {"dummy": TransferInfo(room=SERVED, endpoint="127.0.0.1", dst_port=port,
                                       mooncake_session_id="dummy", is_dummy=True, **common)},
    }
    return mgr


def last_chunk(room: int):
    from sglang.srt.disaggregation.common.utils import TransferKVChunk

    return TransferKVChunk(room=room, prefill_kv_indices=np.arange(4, dtype=np.int32), index_slice=slice(0, 4),
                           is_last_chunk=True, prefill_aux_index=0, state_indices=None)


def queue_of(*items):
    """A real FastQueue holding `items`, then None (upstream's stop sentinel)."""
    from sglang.srt.disaggregation.common.utils import FastQueue

    queue = FastQueue()
    for item in [*items, None]:
        queue.put(item)
    return queue


def run_worker(worker, mgr, queue) -> dict:
    """Run `worker(mgr, queue, None)` on its own thread (the hook lowers its thread's CPU priority for
    good) until it ends; the exception it ended with, if any."""
    out: dict = {"error": None}

    def body():
        try:
            worker(mgr, queue, None)
        except BaseException as exc:  # noqa: BLE001 - the test reports what ended the thread
            out["error"] = exc

    thread = threading.Thread(target=body, name="Thread-test (transfer_worker)")
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the worker did not end"
    return out


def hooked_worker(mgr, queue, executor):
    """Upstream's worker behind our AROUND hook, called as SGLang's HookRegistry wrapper calls it."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    return around_transfer_worker(MooncakeKVManager.transfer_worker, mgr, queue, executor)


def test_upstream_alone_the_worker_dies_and_the_next_room_is_never_served(decode_listener):
    """What the hook is for: SGLang 0.5.23's loop, unhooked, on the same queue."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    mgr = prefill_manager(decode_listener[1])
    out = run_worker(MooncakeKVManager.transfer_worker, mgr, queue_of(last_chunk(BROKEN), last_chunk(SERVED)))
    assert isinstance(out["error"], RuntimeError) and "is dead" in str(out["error"])
    assert isinstance(out["error"].__context__, KeyError)
    assert mgr.request_status == {BROKEN: KVPoll.Transferring, SERVED: KVPoll.Transferring}


def test_behind_the_hook_the_room_fails_decode_is_told_and_the_worker_serves_the_next(decode_listener, pd_state):
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    sock, port = decode_listener
    mgr = prefill_manager(port)
    assert mgr.request_status[BROKEN] == KVPoll.Transferring and BROKEN not in mgr.failure_records

    out = run_worker(hooked_worker, mgr, queue_of(last_chunk(BROKEN), last_chunk(SERVED)))
    assert out["error"] is None
    assert mgr.request_status[BROKEN] == KVPoll.Failed
    assert mgr.request_status[SERVED] == KVPoll.Success
    reason = mgr.failure_records[BROKEN]
    assert "KeyError('never-registered')" in reason and "transfer worker" in reason
    assert sock.poll(5000), "decode was not told"
    room, status, _rank, *rest = [part.decode() for part in sock.recv_multipart()]
    assert (int(room), int(status)) == (BROKEN, KVPoll.Failed)
    assert rest == ([reason] if MooncakeKVManager.kv_status_msg_carries_reason else [])  # mooncake: no reason
    assert BROKEN not in mgr._staging_outstanding
    assert pd_state.counters.labelled[COUNTER] == {"failed": 1}
    mgr._zmq_ctx.destroy(linger=0)


def test_a_cleared_room_keeps_nothing_and_a_concluded_room_is_left_as_it_is(decode_listener, pd_state):
    """The race CI met: the scheduler cleared the room between the worker's two reads of its status."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    mgr = prefill_manager(decode_listener[1])
    mgr._staging_outstanding[CLEARED] = 1
    assert CLEARED not in mgr.request_status
    assert recover_room(mgr, CLEARED, KeyError(CLEARED)) is Outcome.CLEARED
    assert CLEARED not in mgr._staging_outstanding and CLEARED not in mgr.request_status

    mgr.request_status[SERVED] = KVPoll.Success
    assert recover_room(mgr, SERVED, KeyError(SERVED)) is Outcome.CONCLUDED
    assert mgr.request_status[SERVED] == KVPoll.Success and SERVED not in mgr.failure_records
    assert not decode_listener[0].poll(200), "decode must not be told anything for these rooms"
    mgr._zmq_ctx.destroy(linger=0)


def test_an_exception_with_no_chunk_in_hand_still_ends_the_thread(decode_listener, pd_state):
    """No room to settle: the hook re-raises upstream's error, and thread_watch.py reports the death."""

    class QueueThatFails:
        def get(self):
            raise OSError("queue broke")

    mgr = prefill_manager(decode_listener[1])
    out = run_worker(hooked_worker, mgr, QueueThatFails())
    assert isinstance(out["error"], RuntimeError)
    assert "queue broke" in str(out["error"]) and "is dead" in str(out["error"])
    assert isinstance(out["error"].__context__, OSError)
    assert pd_state.counters.labelled[COUNTER] == {}
    mgr._zmq_ctx.destroy(linger=0)


def test_the_tap_remembers_the_chunk_in_hand_and_forgets_it_while_waiting():
    from sglang.srt.disaggregation.common.utils import FastQueue

    queue = FastQueue()
    tap = ChunkTap(queue)
    tap.put("chunk")  # upstream re-enqueues deferred chunks through the same object
    assert tap.taken is None
    assert tap.get() == "chunk" and tap.taken == "chunk"


def test_the_worker_error_fault_fires_only_where_the_worker_raises():
    """Armed for a room, it fires at the room's send (not when its chunk is taken), once."""
    from sglang_pd.srt.transfer import PrefillTransferLog
    from sglang_pd.srt.transfer import TransferWatch
    from sglang_pd.srt.fault_injection import Fault, FaultPlan
    from sglang_pd.srt.metrics import PDCounters

    faults = FaultPlan(enabled=True)
    watch = TransferWatch(60, PrefillTransferLog(PDCounters()), faults)
    faults.arm_room(Fault.PREFILL_WORKER_ERROR, BROKEN)
    assert not watch.take_worker_error()  # no room in hand yet
    watch.on_chunk(SERVED)
    assert not watch.take_worker_error()
    watch.on_chunk(BROKEN)
    assert faults.fired == {}
    assert watch.take_worker_error() and not watch.take_worker_error()
    assert faults.fired == {Fault.PREFILL_WORKER_ERROR: 1} and faults.rooms == {}
