"""A request's clear never lands inside prefill's bootstrap thread's handling of a message.

SGLang 0.5.23's own bootstrap threads (`MooncakeKVManager.start_prefill_thread`,
`NixlKVManager._start_bootstrap_thread`, unmodified) run here on prefill managers that hold only the
state those loops read (built without their transfer engines, which need live peers), reading a real
ZMQ socket that a PUSH socket on 127.0.0.1 feeds with transfer infos. SGLang's own
`CommonKVSender.clear` is called from a second thread, as the scheduler does when a request ends.

The thread handles a transfer info in several statements: `transfer_infos[room] = {}` if missing,
parse the frames, `transfer_infos[room][peer] = info`, then `len(transfer_infos[room])`. A clear that
pops the room in between raises KeyError there and ends the thread: every later pairing with this
prefill rank then waits for its timeout. To put the clear exactly inside that window every time,
each test wraps the backend's `TransferInfo.from_zmq` (the parse step; the real parse runs) so that it
signals and waits until the test lets it go; nothing of our code is replaced.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import types
from collections import defaultdict

import pytest
import zmq

from sglang_pd.harness.hostile_peer import PeerIdentity, Templates
from sglang_pd.srt.handshake import Between, GuardedSocket, SigningSocket
from sglang_pd.srt.wire import FrameLimits, Side
from sglang_pd.srt.handshake import HandshakeGate
from sglang_pd.srt.handshake import ManagerHost
from sglang_pd.srt.auth import PeerAuth
from sglang_pd.srt.hooks.connection import common_conn

pytestmark = pytest.mark.unit

ROOM, NEXT_ROOM = 7, 8
PEER = PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001")
BACKENDS = ("mooncake", "nixl")


class PausedParse:
    """Wraps a backend's TransferInfo.from_zmq: the first parse of `room` signals `inside` and waits for
    `go` (at most 10 s), then runs the real parse."""

    def __init__(self, monkeypatch, module, room: int):
        self.inside, self.go, self.room = threading.Event(), threading.Event(), room
        real = module.TransferInfo.from_zmq.__func__
        paused = self

        def from_zmq(cls, msg):
            if not paused.inside.is_set() and int(msg[0].decode("ascii")) == paused.room:
                paused.inside.set()
                paused.go.wait(10)
            return real(cls, msg)

        monkeypatch.setattr(module.TransferInfo, "from_zmq", classmethod(from_zmq))


class Prefill:
    """A prefill manager of `backend` whose upstream bootstrap thread reads `socket` (raw or guarded)."""

    def __init__(self, backend: str, guarded: bool, before_admit=lambda: None):
        from sglang.srt.disaggregation.base.conn import KVPoll

        self.backend = backend
        module = self.module = _conn(backend)
        cls = module.MooncakeKVManager if backend == "mooncake" else module.NixlKVManager
        self.templates = Templates(backend, PEER)
        self.ctx = zmq.Context()
        raw = self.ctx.socket(zmq.PULL)
        port = raw.bind_to_random_port("tcp://127.0.0.1")
        mgr = self.mgr = cls.__new__(cls)
        mgr.deferred_bootstrap, mgr.server_args = None, types.SimpleNamespace(enable_pd_role_switch=False)
        mgr._stopped, mgr._worker_threads, mgr._staging_ctx, mgr.enable_staging = False, [], None, False
        mgr.is_mla_backend, mgr.kv_args = False, types.SimpleNamespace(engine_rank=0)  # NIXL logs its rank on death
        mgr.transfer_infos, mgr.req_to_decode_prefix_len, mgr.failure_records = {}, {}, {}
        mgr.request_status = {ROOM: KVPoll.Bootstrapping, NEXT_ROOM: KVPoll.Bootstrapping}
        mgr._deferred_ack_targets, mgr._deferred_ack_poisoned_rooms = {}, set()
        mgr._staging_outstanding = defaultdict(int)
        mgr.decode_kv_args_table = {PEER.name: types.SimpleNamespace(endpoint=PEER.ip, dst_port=PEER.port,
                                                                     dst_num_slots=64)}
        self.sock = raw
        if guarded:
            limits = FrameLimits(backend, Side.PREFILL, 1, 64, 1 << 20)
            gate = HandshakeGate(limits, ManagerHost(mgr, limits), None, None, None)
            self.sock = GuardedSocket.around(raw, gate, on_error=lambda doing: None, before_admit=before_admit,
                                             hold=True)
        mgr.server_socket = self.sock
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(f"tcp://127.0.0.1:{port}")
        if backend == "mooncake":
            mgr.start_prefill_thread()
            self.thread = mgr._worker_threads[-1]
        else:
            before = set(threading.enumerate())
            mgr._start_bootstrap_thread()
            (self.thread,) = set(threading.enumerate()) - before

    def send(self, room: int) -> None:
        self.push.send_multipart(self.templates.transfer_info(room, [1, 2]))

    def sender(self, room: int):
        """SGLang's sender object for `room` as clear() reads it (conclude_state not yet known)."""
        from sglang.srt.disaggregation.common.conn import CommonKVSender

        sender = CommonKVSender.__new__(CommonKVSender)
        sender.kv_mgr, sender.bootstrap_room, sender.conclude_state = self.mgr, room, None
        return sender

    def close(self) -> None:
        self.mgr._stopped = True
        self.push.close(linger=0)
        self.sock.close(linger=0)  # a blocked reader's recv raises: the thread ends (NIXL's never stops itself)
        self.thread.join(5)
        self.ctx.term()


def _conn(backend: str):
    if backend == "mooncake":
        from sglang.srt.disaggregation.mooncake import conn
    else:
        from sglang.srt.disaggregation.nixl import conn
    return conn


def _clear_in_thread(prefill: Prefill, room: int, hooked: bool) -> threading.Thread:
    from sglang.srt.disaggregation.common.conn import CommonKVSender

    sender = prefill.sender(room)
    if hooked:
        target = lambda: common_conn.around_sender_clear(CommonKVSender.clear, sender)  # noqa: E731
    else:
        target = lambda: CommonKVSender.clear(sender)  # noqa: E731
    thread = threading.Thread(target=target, name="scheduler-clear")
    thread.start()
    return thread


@pytest.fixture(autouse=True)
def quiet_thread_deaths(monkeypatch):
    """Upstream's dying thread prints its traceback through threading.excepthook; keep what it raised
    (also the ZMQError each reader ends with when `Prefill.close` closes its socket)."""
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_type))
    return died


@contextlib.contextmanager
def parked_in_the_window(monkeypatch, backend: str, guarded: bool):
    """(prefill, paused): a Prefill whose bootstrap thread is parked inside its handling of ROOM's transfer
    info (the room made, its info not stored yet); let go with `paused.go`, closed at exit."""
    paused = PausedParse(monkeypatch, _conn(backend), ROOM)
    prefill = Prefill(backend, guarded=guarded)
    try:
        prefill.send(ROOM)
        assert paused.inside.wait(10)
        assert ROOM in prefill.mgr.transfer_infos
        yield prefill, paused
    finally:
        paused.go.set()
        prefill.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_bootstrap_thread_dies_when_a_clear_lands_inside_its_handling(backend, monkeypatch,
                                                                               quiet_thread_deaths):
    """What our hold prevents, shown on upstream alone (raw socket, SGLang's clear unhooked)."""
    with parked_in_the_window(monkeypatch, backend, guarded=False) as (prefill, paused):
        clear = _clear_in_thread(prefill, ROOM, hooked=False)
        clear.join(5)
        assert not clear.is_alive() and ROOM not in prefill.mgr.transfer_infos  # the clear popped it
        paused.go.set()
        prefill.thread.join(5)
        assert not prefill.thread.is_alive() and quiet_thread_deaths == [KeyError]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_clear_waits_until_the_bootstrap_thread_is_between_messages(backend, monkeypatch, pd_state,
                                                                      quiet_thread_deaths):
    from sglang.srt.disaggregation.base.conn import KVPoll

    with parked_in_the_window(monkeypatch, backend, guarded=True) as (prefill, paused):
        assert prefill.sock._held  # inside the window, holding
        clear = _clear_in_thread(prefill, ROOM, hooked=True)
        clear.join(0.5)
        assert clear.is_alive() and ROOM in prefill.mgr.transfer_infos  # the clear waits outside it
        paused.go.set()
        clear.join(5)
        assert not clear.is_alive()
        assert ROOM not in prefill.mgr.transfer_infos and ROOM not in prefill.mgr.request_status  # cleared after
        assert prefill.thread.is_alive() and quiet_thread_deaths == []
        assert pd_state.counters.get("clears_waited_for_bootstrap_total") == 1
        prefill.send(NEXT_ROOM)  # the same thread pairs the next room
        for _ in range(100):
            if prefill.mgr.request_status.get(NEXT_ROOM) == KVPoll.WaitingForInput:
                break
            threading.Event().wait(0.05)
        assert prefill.mgr.request_status[NEXT_ROOM] == KVPoll.WaitingForInput
        assert list(prefill.mgr.transfer_infos[NEXT_ROOM]) == [PEER.name]
        clear = _clear_in_thread(prefill, NEXT_ROOM, hooked=True)  # the reader is idle: no wait
        clear.join(5)
        assert not clear.is_alive() and pd_state.counters.get("clears_waited_for_bootstrap_total") == 1
        assert pd_state.counters.get("prefill_sender_clears_total") == 2


def test_a_dropped_message_does_not_keep_the_hold(monkeypatch):
    """The gate refuses a transfer info naming an unregistered peer: the reader goes back to waiting
    without holding, and a clear gets its turn at once."""
    prefill = Prefill("mooncake", guarded=True)
    try:
        stranger = Templates("mooncake", PeerIdentity("127.0.0.1", 40002, "127.0.0.1:16002"))
        prefill.push.send_multipart(stranger.transfer_info(ROOM, [1]))
        for _ in range(100):
            if prefill.sock.gate.counts.rejected:
                break
            threading.Event().wait(0.05)
        assert prefill.sock.gate.counts.rejected == {"transfer_info": 1}
        turns = []
        for _ in range(100):  # the reader lets go right after the gate returns; then every turn is free
            with prefill.sock.between_messages() as turn:
                turns.append(turn)
            if turn is Between.FREE:
                break
            threading.Event().wait(0.05)
        assert turns[-1] is Between.FREE
    finally:
        prefill.close()


def test_a_reader_that_died_holding_does_not_block_a_clear(pd_state, quiet_thread_deaths):
    """A reader ending while it holds (here the test-only fault point before the gate, as an upstream
    parse error would) leaves nothing to race: the clear runs without waiting out HOLD_WAIT_S."""
    def end_the_reader():
        raise RuntimeError("reader ends holding")

    prefill = Prefill("mooncake", guarded=True, before_admit=end_the_reader)
    try:
        prefill.send(ROOM)
        prefill.thread.join(5)
        assert not prefill.thread.is_alive() and prefill.sock._held  # died holding: the state under test
        with prefill.sock.between_messages() as turn:
            assert turn is Between.READER_DEAD
        clear = _clear_in_thread(prefill, ROOM, hooked=True)
        clear.join(5)
        assert not clear.is_alive() and ROOM not in prefill.mgr.request_status
        assert pd_state.counters.get("clear_bootstrap_wait_timeouts_total") == 0
    finally:
        prefill.close()


def test_a_reader_held_past_the_wait_is_counted_and_the_clear_runs(monkeypatch, pd_state, caplog,
                                                                   quiet_thread_deaths):
    with parked_in_the_window(monkeypatch, "mooncake", guarded=True) as (prefill, paused):
        prefill.sock.hold_wait_s = 0.2
        assert prefill.sock._held
        with caplog.at_level(logging.ERROR, logger="sglang_pd.srt.hooks.connection.common_conn"):
            clear = _clear_in_thread(prefill, ROOM, hooked=True)
            clear.join(5)
        assert not clear.is_alive() and ROOM not in prefill.mgr.request_status  # ran anyway, after the wait
        assert pd_state.counters.get("clear_bootstrap_wait_timeouts_total") == 1
        assert "held one message for over" in caplog.text


def test_closing_a_guarded_socket_closes_its_owner():
    """SGLang closes `mgr.server_socket` (our shadow) at teardown; the raw socket that owns the handle must
    know, or collecting it later closes the handle again (by then possibly another live socket: seen here
    as a later test's reader dying of ENOTSOCK)."""
    ctx = zmq.Context()
    raw = ctx.socket(zmq.PULL)
    raw.bind_to_random_port("tcp://127.0.0.1")
    limits = FrameLimits("mooncake", Side.PREFILL, 1, 64, 1 << 20)
    sock = GuardedSocket.around(raw, HandshakeGate(limits, ManagerHost(object(), limits), None, None, None),
                                on_error=lambda doing: None)
    assert not raw.closed
    sock.close(linger=0)
    assert raw._closed  # the owner's own flag (pyzmq's `closed` would probe the freed handle instead)
    push = ctx.socket(zmq.PUSH)  # decode's signing PUSH sockets: SGLang closes its socket cache the same way
    signing = SigningSocket.around(push, PeerAuth([b"k" * 40]), "tcp://127.0.0.1:5000")
    assert not push.closed
    signing.close(linger=0)
    assert push._closed
    ctx.term()


# ---- a transfer worker done with a room removes it from the same table --------------------------------------
class WorkerStop(BaseException):
    """Ends an upstream transfer worker's loop (NIXL's has no sentinel): raised by `OneChunkQueue.get`."""


class OneChunkQueue:
    """What upstream's transfer worker reads: one chunk, then WorkerStop."""

    def __init__(self, chunk):
        self.items = [chunk]

    def get(self):
        if not self.items:
            raise WorkerStop()
        return self.items.pop()


def _worker_finishes_room_in_thread(prefill: Prefill, room: int) -> threading.Thread:
    """Upstream's own transfer worker (unhooked) handles `room`'s last chunk of a transfer that is done (status
    Success, nothing left to send), and removes the room from `transfer_infos` as it does after every room."""
    import numpy as np
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.common.utils import TransferKVChunk

    mgr = prefill.mgr
    mgr.request_status[room] = KVPoll.Success
    mgr.enable_trace, mgr.enable_deferred_decode_kv_release = False, False
    mgr.failure_lock, mgr.kv_args.kv_data_ptrs = threading.Lock(), []
    chunk = TransferKVChunk(room=room, prefill_kv_indices=np.zeros(0, dtype=np.int32), index_slice=slice(0, 0),
                            is_last_chunk=True, prefill_aux_index=0, state_indices=None)
    cls, extra = type(mgr), {"executor": None} if prefill.backend == "mooncake" else {}
    target = lambda: cls.transfer_worker(mgr, OneChunkQueue(chunk), **extra)  # noqa: E731
    thread = threading.Thread(target=target, name="transfer-worker")
    thread.start()
    return thread


def _held_rooms(prefill: Prefill, turns: list) -> None:
    """What sglang_pd installs on prefill's manager with the hold: removals wait for the reader's turn."""
    from sglang_pd.srt.handshake import HeldRooms

    prefill.mgr.transfer_infos = HeldRooms(prefill.mgr.transfer_infos, prefill.sock,
                                           lambda turn, room: turns.append((turn, room)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_bootstrap_thread_dies_when_a_worker_removes_the_room_inside_its_handling(backend, monkeypatch,
                                                                                          quiet_thread_deaths):
    """The same window, the other remover: a transfer info for a room arrives as its transfer worker finishes
    the room's last chunk (a peer sending it twice, or a second decode session naming it). Upstream alone."""
    with parked_in_the_window(monkeypatch, backend, guarded=False) as (prefill, paused):
        worker = _worker_finishes_room_in_thread(prefill, ROOM)
        worker.join(5)
        assert not worker.is_alive() and ROOM not in prefill.mgr.transfer_infos  # the worker removed it
        paused.go.set()
        prefill.thread.join(5)
        assert not prefill.thread.is_alive()
        assert [e for e in quiet_thread_deaths if e is not WorkerStop] == [KeyError]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_removing_a_room_waits_until_the_bootstrap_thread_is_between_messages(backend, monkeypatch,
                                                                                       quiet_thread_deaths):
    from sglang.srt.disaggregation.base.conn import KVPoll

    turns = []
    with parked_in_the_window(monkeypatch, backend, guarded=True) as (prefill, paused):
        _held_rooms(prefill, turns)
        assert prefill.sock._held  # inside the window, holding
        worker = _worker_finishes_room_in_thread(prefill, ROOM)
        worker.join(0.5)
        assert worker.is_alive() and ROOM in prefill.mgr.transfer_infos  # the removal waits outside it
        paused.go.set()
        worker.join(5)
        assert not worker.is_alive() and ROOM not in prefill.mgr.transfer_infos  # removed after
        assert turns == [(Between.WAITED, ROOM)]
        assert prefill.thread.is_alive() and [e for e in quiet_thread_deaths if e is not WorkerStop] == []
        prefill.send(NEXT_ROOM)  # the same thread pairs the next room
        for _ in range(100):
            if prefill.mgr.request_status.get(NEXT_ROOM) == KVPoll.WaitingForInput:
                break
            threading.Event().wait(0.05)
        assert list(prefill.mgr.transfer_infos[NEXT_ROOM]) == [PEER.name]
        assert prefill.mgr.transfer_infos.pop(NEXT_ROOM) and turns[-1] == (Between.FREE, NEXT_ROOM)  # idle: no wait


def test_the_installed_table_counts_a_waited_removal_and_a_timed_out_one(monkeypatch, pd_state, caplog,
                                                                         quiet_thread_deaths):
    """The hook's report (common_conn._count_room_pop_turn): a waited removal counted, one past the cap
    counted and logged, a removal inside a clear (the reentrant turn) not counted again."""
    from sglang_pd.srt.handshake import HeldRooms

    with parked_in_the_window(monkeypatch, "mooncake", guarded=True) as (prefill, paused):
        rooms = HeldRooms(prefill.mgr.transfer_infos, prefill.sock, common_conn._count_room_pop_turn)
        prefill.mgr.transfer_infos = rooms
        rooms[NEXT_ROOM] = {}
        prefill.sock.hold_wait_s = 0.2
        with caplog.at_level(logging.ERROR, logger="sglang_pd.srt.hooks.connection.common_conn"):
            worker = _worker_finishes_room_in_thread(prefill, NEXT_ROOM)
            worker.join(5)
        assert not worker.is_alive() and NEXT_ROOM not in rooms  # ran anyway, after the cap
        assert pd_state.counters.get("room_pop_bootstrap_wait_timeouts_total") == 1
        assert "past the wait's cap" in caplog.text
        prefill.sock.hold_wait_s = 5.0
        worker = _worker_finishes_room_in_thread(prefill, ROOM)
        worker.join(0.3)
        assert worker.is_alive()
        paused.go.set()
        worker.join(5)
        assert not worker.is_alive() and pd_state.counters.get("room_pops_waited_for_bootstrap_total") == 1
        clear = _clear_in_thread(prefill, NEXT_ROOM, hooked=True)  # pops inside its own turn
        clear.join(5)
        assert pd_state.counters.get("room_pops_waited_for_bootstrap_total") == 1
        assert pd_state.counters.get("room_pop_bootstrap_wait_timeouts_total") == 1


def test_a_room_removed_while_a_worker_waited_to_remove_it_is_no_error(quiet_thread_deaths):
    """Upstream's mooncake worker checks, then pops without a default (`if room in transfer_infos:
    transfer_infos.pop(room)`); the wait for the turn sits between the two. When another removal that waits
    for the same turn (a clear) has it first and pops the room, the worker's pop finds it gone: done, not a
    KeyError in the worker."""
    turns = []
    prefill = Prefill("mooncake", guarded=True)
    try:
        _held_rooms(prefill, turns)
        prefill.mgr.transfer_infos[ROOM] = {}  # the room, its transfer done (no destination left to send to)
        with prefill.sock.between_messages() as turn:  # the clear's turn, taken first
            assert turn is Between.FREE
            worker = _worker_finishes_room_in_thread(prefill, ROOM)
            worker.join(0.5)
            assert worker.is_alive() and ROOM in prefill.mgr.transfer_infos  # it saw the room; its pop waits
            prefill.mgr.transfer_infos.pop(ROOM, None)  # the clear's own pop, inside its turn
        worker.join(5)
        assert not worker.is_alive() and ROOM not in prefill.mgr.transfer_infos
        assert [t for t, _ in turns] == [Between.FREE, Between.WAITED]  # the clear's pop, then the worker's
        assert prefill.thread.is_alive()
        # the worker ran to its end (before: its pop raised KeyError, and upstream's error path took over)
        assert [e for e in quiet_thread_deaths if e is not WorkerStop] == []
    finally:
        prefill.close()
