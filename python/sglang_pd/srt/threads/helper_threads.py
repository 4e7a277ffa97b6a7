"""A PD server's helper threads run SCHED_BATCH, so their wake-ups do not preempt the step thread.

Every decode step ends with the scheduler thread sending the step's tokens to the detokenizer over
ZMQ; that send wakes, in turn, the scheduler's ZMQ I/O thread, the detokenizer, and the HTTP process's
tokenizer manager and I/O threads (prefill's bootstrap and transfer threads wake the same way). Linux
lets a thread that wakes up preempt the one running on its core. On a box with fewer free cores than
runnable threads (this one: 2 cores for prefill, decode, their HTTP and detokenizer processes and the
client) those wake-ups land on the scheduler thread in the middle of its next step, which then waits
for its core while the step's tokens are relayed. SCHED_BATCH is Linux's normal time-sharing policy
(same nice, same share of CPU) minus wake-up preemption: a helper runs when a core is free or when the
running thread's slice ends, never by cutting a step short. Switching between SCHED_OTHER and
SCHED_BATCH needs no privilege.

Opt-in (`SGLANG_PD_HELPER_THREADS_BATCH=1`; default 0 = upstream's policies): on this 2-core box it
helped `off` (capacity ITL p50 16.8/17.5 -> 15.5/14.6 ms) but not `on+shared` (15.1/14.8 -> 17.4/15.3 ms)
nor short `on`'s TTFT (docs/results/cpu_contention/helper_threads/, `python scripts/probes/cpu_contention/helper_threads/run.py 2`).

Which threads, in a prefill or decode server (aggregated servers are left alone):
- the HTTP process (tokenizer manager, uvicorn, prefill's bootstrap server, their ZMQ threads) and the
  detokenizer process: every thread, set once SGLang has started its subprocesses; threads they
  start later inherit the policy;
- the scheduler process: the scheduler thread (the one that runs steps) keeps SCHED_OTHER; its Python
  helper threads (transfer, bootstrap, heartbeat, watchdog) and ZMQ's I/O threads run SCHED_BATCH,
  swept at start and then at most once per `sweep_interval_s` from the step hook (helpers are also
  started per peer). Native threads of other libraries (torch's intra-op pool, gloo, mooncake's
  transfer engine) are left as they are: they compute inside the step or move the KV.

Only threads at SCHED_OTHER are switched (one an operator put at another policy keeps it). A thread
that cannot be switched is counted (`pd_helper_thread_policy_errors_total`), logged, and keeps
serving at its policy. Linux only; no SGLang import.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

ZMQ_THREAD_PREFIX = "ZMQbg/"   # libzmq names its I/O and reaper threads so


def _tasks() -> list[int]:
    """Thread ids of this process (kernel's view)."""
    return [int(tid) for tid in os.listdir("/proc/self/task")]


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # the thread ended
        return ""


class HelperThreadPolicy:
    """Which threads of this process run SCHED_BATCH (module docstring). Mutating methods are called
    from one thread at a time (the process's main thread or the scheduler thread)."""

    def __init__(self, enabled: bool, counters, sweep_interval_s: float = 1.0):
        self.enabled = enabled
        self.counters = counters
        self.sweep_interval_s = sweep_interval_s
        self.scope = ""                   # "process" or "scheduler" once applied
        self.step_tid: int | None = None  # the scheduler thread, kept at SCHED_OTHER
        self._batched: set[int] = set()   # thread ids this object switched to SCHED_BATCH
        self._errors: dict[int, str] = {}
        self._next_sweep = 0.0

    def apply_to_process(self) -> int:
        """HTTP / detokenizer process of a PD server: every thread to SCHED_BATCH; returns how many
        were switched now (mutates thread policies and the counters)."""
        if not self.enabled:
            return 0
        self.scope = "process"
        return self._switch(_tasks())

    def start_scheduler(self) -> int:
        """Scheduler process of a PD server, called on the scheduler thread: it stays SCHED_OTHER and
        the helpers are switched; returns how many (mutates)."""
        if not self.enabled:
            return 0
        self.scope, self.step_tid = "scheduler", threading.get_native_id()
        self._next_sweep = time.monotonic() + self.sweep_interval_s
        return self._switch(self._scheduler_helpers())

    def maybe_sweep(self) -> int:
        """Switch helpers started since the last sweep, at most once per interval (scheduler thread;
        mutates). Returns how many were switched now."""
        if self.scope != "scheduler" or time.monotonic() < self._next_sweep:
            return 0
        self._next_sweep = time.monotonic() + self.sweep_interval_s
        return self._switch(self._scheduler_helpers())

    def _scheduler_helpers(self) -> list[int]:
        python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        zmq = {tid for tid in _tasks() if _thread_name(tid).startswith(ZMQ_THREAD_PREFIX)}
        return sorted((python | zmq) - {self.step_tid})

    def _switch(self, tids: list[int]) -> int:
        num = 0
        for tid in tids:
            if tid in self._batched or tid in self._errors:
                continue
            try:
                if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                    continue  # already batch, or an operator's choice
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            except ProcessLookupError:
                continue  # the thread ended between the listing and now
            except OSError as exc:
                self._errors[tid] = str(exc)
                self.counters.add("pd_helper_thread_policy_errors_total", 1)
                logger.error("sglang_pd: could not put thread %d (%s) at SCHED_BATCH (%s); it keeps its policy",
                             tid, _thread_name(tid), exc)
                continue
            self._batched.add(tid)
            num += 1
        if num:
            self.counters.add("pd_helper_threads_batched_total", num)
        return num

    def snapshot(self) -> dict:
        """Read-only view for /sglang_pd/stats: the setting, the step thread and its policy now, the
        threads switched that still run (by name), each failure."""
        live = set(_tasks())
        names: dict[str, int] = {}
        for tid in self._batched & live:
            name = _thread_name(tid)
            names[name] = names.get(name, 0) + 1
        step_policy = None
        if self.step_tid in live:
            step_policy = "other" if os.sched_getscheduler(self.step_tid) == os.SCHED_OTHER else "not other"
        return {"enabled": self.enabled, "scope": self.scope, "step_tid": self.step_tid, "step_policy": step_policy,
                "num_batched": len(self._batched), "batched_running": names,
                "errors": [{"tid": tid, "error": error} for tid, error in self._errors.items()]}
