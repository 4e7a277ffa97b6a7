"""Prefill's mooncake transfer workers at a lower CPU priority, on real threads: the kernel's view of each
thread's nice (/proc/self/task/<tid>/stat) after `lower_current_thread`, other threads untouched, 0 is
off, a thread already lower stays so, a failure is counted and the thread keeps serving; the setting
is validated at start-up."""

import os
import threading
from pathlib import Path

import pytest

from sglang_pd.config import TRANSFER_WORKER_NICE, Settings, problems
from sglang_pd.srt.threads import TransferWorkerPriority
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def kernel_nice(tid: int) -> int:
    """The thread's nice as the kernel reports it (field 19 of its stat line)."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def in_thread(fn) -> tuple[int, int, int]:
    """Run `fn` in a new thread; (its tid, its kernel nice before, after), read while it is alive."""
    out = {}

    def body():
        tid = threading.get_native_id()
        out["tid"], out["before"] = tid, kernel_nice(tid)
        fn()
        out["after"] = kernel_nice(tid)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return out["tid"], out["before"], out["after"]


def test_a_worker_thread_runs_at_the_set_nice_and_no_other_thread_does():
    counters = PDCounters()
    priority = TransferWorkerPriority(12, counters)
    main_before = kernel_nice(threading.get_native_id())
    assert main_before < 12
    tid, before, after = in_thread(priority.lower_current_thread)
    assert before == main_before and after == 12
    assert kernel_nice(threading.get_native_id()) == main_before  # the caller's thread only
    assert priority.snapshot() == {"nice": 12, "threads": [{"tid": tid, "nice": 12}], "errors": []}
    assert counters.values["pd_transfer_workers_lowered_total"] == 1
    assert counters.values["pd_transfer_worker_nice_errors_total"] == 0


def test_zero_leaves_the_thread_alone_and_a_thread_already_lower_stays_lower():
    off = TransferWorkerPriority(0, PDCounters())
    assert not off.enabled
    _, before, after = in_thread(off.lower_current_thread)
    assert after == before
    assert off.snapshot()["threads"] == []

    priority = TransferWorkerPriority(5, PDCounters())

    def already_lower():
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)
        priority.lower_current_thread()

    tid, _, after = in_thread(already_lower)
    assert after == 15  # never raised back (that would need privilege)
    assert priority.snapshot()["threads"] == [{"tid": tid, "nice": 15}]


def test_a_thread_that_cannot_be_lowered_is_counted_and_keeps_running(monkeypatch):
    counters = PDCounters()
    priority = TransferWorkerPriority(19, counters)

    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)  # the OS refusing; the accounting is under test
    tid, before, after = in_thread(priority.lower_current_thread)
    assert after == before
    snap = priority.snapshot()
    assert snap["threads"] == [] and snap["errors"] == [{"tid": tid, "error": "[Errno 1] Operation not permitted"}]
    assert counters.values["pd_transfer_worker_nice_errors_total"] == 1
    assert counters.values["pd_transfer_workers_lowered_total"] == 0


def test_out_of_range_is_refused():
    for bad in (-1, 20):
        with pytest.raises(ValueError, match=r"\[0, 19\]"):
            TransferWorkerPriority(bad, PDCounters())


def test_the_setting_defaults_to_19_and_refuses_bad_values():
    assert Settings.from_env({}).transfer_worker_nice == 19
    assert Settings.from_env({TRANSFER_WORKER_NICE: "0"}).transfer_worker_nice == 0
    for bad in ("-1", "20", "abc", "2.5"):
        (problem,) = problems({TRANSFER_WORKER_NICE: bad})
        assert problem.startswith(f"{TRANSFER_WORKER_NICE}={bad!r}") and "nice levels" in problem
