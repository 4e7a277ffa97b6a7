"""Helper threads at SCHED_BATCH, on real threads of this process, read back from the kernel
(sched_getscheduler): the scheduler scope switches Python helpers and ZMQ's I/O threads and keeps the
calling (step) thread at SCHED_OTHER, a native thread of another library is left alone, the sweep
catches helpers started later (and runs at most once per interval), the process scope switches every
thread, 0 switches nothing, a thread an operator set stays as set, a failure is counted and logged;
the setting is validated at start-up."""

import ctypes
import os
import threading
import time

import pytest
import zmq

from sglang_pd.config import HELPER_THREADS_BATCH, Settings, problems
from sglang_pd.srt.threads.helper_threads import HelperThreadPolicy, _tasks, _thread_name
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def policy_of(tid: int) -> int:
    return os.sched_getscheduler(tid)


class Parked:
    """A Python thread that waits until released; its native id while alive."""

    def __init__(self):
        self.release, self.started = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._body, daemon=True)
        self.thread.start()
        self.started.wait(5)

    def _body(self):
        self.tid = threading.get_native_id()
        self.started.set()
        self.release.wait(30)

    def stop(self):
        self.release.set()
        self.thread.join(5)


@pytest.fixture(autouse=True)
def _restore_policies():
    """Every thread a test left at SCHED_BATCH that was SCHED_OTHER before goes back to SCHED_OTHER."""
    before = {tid: policy_of(tid) for tid in _tasks()}
    yield
    for tid in _tasks():
        if policy_of(tid) == os.SCHED_BATCH and before.get(tid, os.SCHED_OTHER) == os.SCHED_OTHER:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def on_new_thread(fn) -> dict:
    """Run `fn` on a new thread (standing in for the scheduler thread, or for a process's only caller);
    its tid, fn's result, and the thread's policy after fn."""
    out = {}

    def body():
        out["tid"] = threading.get_native_id()
        out["result"] = fn()
        out["policy"] = policy_of(out["tid"])

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    return out


def native_thread() -> tuple[int, object]:
    """A native thread unknown to `threading` (as torch's intra-op or mooncake's threads are), started with
    pthread_create through ctypes; it parks in pause() for the rest of the test process."""
    libc = ctypes.CDLL(None)
    tids = {}
    ready = threading.Event()

    @ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    def body(_arg):
        tids["tid"] = threading.get_native_id()
        ready.set()
        libc.pause()
        return None

    handle = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(handle), None, body, None) == 0
    ready.wait(5)
    return tids["tid"], body


def test_scheduler_scope_switches_python_and_zmq_helpers_and_keeps_the_step_thread():
    counters = PDCounters()
    policy = HelperThreadPolicy(True, counters)
    ctx = zmq.Context(1)
    ctx.socket(zmq.PUSH).close()  # the context starts its I/O thread on first socket
    helper = Parked()
    main_tid = threading.get_native_id()
    zmq_tids = [tid for tid in _tasks() if _thread_name(tid).startswith("ZMQbg/")]
    try:
        assert zmq_tids and policy_of(helper.tid) == os.SCHED_OTHER
        out = on_new_thread(policy.start_scheduler)
        assert out["policy"] == os.SCHED_OTHER  # the step thread is never switched
        assert policy_of(helper.tid) == os.SCHED_BATCH
        assert policy_of(main_tid) == os.SCHED_BATCH  # pytest's main thread is a Python helper here
        for tid in zmq_tids:
            assert policy_of(tid) == os.SCHED_BATCH, _thread_name(tid)
        assert out["result"] >= 2 + len(zmq_tids)
        assert counters.values["pd_helper_threads_batched_total"] == out["result"]
        snap = policy.snapshot()
        assert snap["scope"] == "scheduler" and snap["step_tid"] == out["tid"] and snap["errors"] == []
        assert snap["num_batched"] == out["result"]
    finally:
        helper.stop()
        ctx.term()


def test_a_native_thread_of_another_library_is_left_alone_and_the_sweep_catches_new_helpers():
    policy = HelperThreadPolicy(True, PDCounters(), sweep_interval_s=0.2)
    native_tid, _keep = native_thread()
    assert native_tid in _tasks() and policy_of(native_tid) == os.SCHED_OTHER
    early = Parked()
    try:
        policy.start_scheduler()  # the pytest thread is the step thread here
        step = threading.get_native_id()
        assert policy_of(step) == os.SCHED_OTHER and policy_of(early.tid) == os.SCHED_BATCH
        assert policy_of(native_tid) == os.SCHED_OTHER  # not Python, not ZMQ: torch/gloo/mooncake kind
        late = Parked()
        assert policy_of(late.tid) == os.SCHED_OTHER  # started by the step thread: inherits OTHER
        assert policy.maybe_sweep() == 0  # within the interval: no sweep
        assert policy_of(late.tid) == os.SCHED_OTHER
        time.sleep(0.25)
        assert policy.maybe_sweep() == 1
        assert policy_of(late.tid) == os.SCHED_BATCH and policy_of(step) == os.SCHED_OTHER
        late.stop()
    finally:
        early.stop()


def test_process_scope_switches_every_thread_and_new_threads_inherit_it():
    policy = HelperThreadPolicy(True, PDCounters())
    other = Parked()
    try:
        out = on_new_thread(policy.apply_to_process)
        assert out["policy"] == os.SCHED_BATCH  # the caller too: nothing here runs steps
        assert all(policy_of(tid) == os.SCHED_BATCH for tid in _tasks())
        later = Parked()  # started by a thread now at SCHED_BATCH
        assert policy_of(later.tid) == os.SCHED_BATCH
        later.stop()
        assert policy.snapshot()["scope"] == "process" and policy.maybe_sweep() == 0  # no sweep in this scope
    finally:
        other.stop()


def test_off_switches_nothing_and_an_operators_policy_is_kept():
    off = HelperThreadPolicy(False, PDCounters())
    helper = Parked()
    try:
        assert off.start_scheduler() == 0 and off.apply_to_process() == 0 and off.maybe_sweep() == 0
        assert policy_of(helper.tid) == os.SCHED_OTHER and off.snapshot()["scope"] == ""
        os.sched_setscheduler(helper.tid, os.SCHED_IDLE, os.sched_param(0))  # an operator's choice
        on = HelperThreadPolicy(True, PDCounters())
        on.start_scheduler()
        assert policy_of(helper.tid) == os.SCHED_IDLE
    finally:
        helper.stop()


def test_a_thread_that_cannot_be_switched_is_counted_and_keeps_its_policy(monkeypatch, caplog):
    counters = PDCounters()
    policy = HelperThreadPolicy(True, counters)
    helper = Parked()

    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # the OS refusing; the accounting is under test
    try:
        assert policy.start_scheduler() == 0
        snap = policy.snapshot()
        assert {"tid": helper.tid, "error": "[Errno 1] Operation not permitted"} in snap["errors"]
        assert counters.values["pd_helper_thread_policy_errors_total"] == len(snap["errors"])
        assert counters.values["pd_helper_threads_batched_total"] == 0
        assert policy_of(helper.tid) == os.SCHED_OTHER
        assert "could not put thread" in caplog.text
    finally:
        helper.stop()


def test_the_setting_is_a_flag_and_defaults_to_off():
    assert Settings.from_env({}).helper_threads_batch is False
    assert Settings.from_env({HELPER_THREADS_BATCH: "1"}).helper_threads_batch is True
    assert problems({HELPER_THREADS_BATCH: "yes"}) == [f"{HELPER_THREADS_BATCH}='yes' must be 0 or 1"]
