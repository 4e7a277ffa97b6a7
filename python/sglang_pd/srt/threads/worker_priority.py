"""Prefill's mooncake KV transfer workers run at a lower CPU priority than the schedulers.

A mooncake transfer worker of SGLang 0.5.23 waits for its transfer inside mooncake's
`batch_transfer_sync`, which polls the batch status in a loop without sleeping, while mooncake's own
threads move the bytes: the worker only watches. On a box whose cores the PD servers share (this
one: 2 cores for prefill, decode, their HTTP processes and the client) that spinning thread takes CPU
the decode scheduler was ready to use: in on+shared capacity runs prefill's threads other than its
scheduler thread ran 3.56 and 2.87 s of 7.4 s workloads at upstream's priority, 1.70 and 2.41 s at nice
19 (docs/results/cpu_contention/transfer_worker_nice/; ITL unchanged within noise). mooncake's Python binding has
no non-blocking status read for a batch of several descriptors, so the spin cannot be replaced by a
wait from outside; lowering the worker thread's priority (Linux per-thread nice) leaves it the CPU
nobody else wants and none that a scheduler wants. The transfer itself is untouched (mooncake's
threads keep their priority); the worker notices completion at most one scheduling slice later when
the cores are contended. NIXL is left alone: on a host-memory pool its worker drives the transfer's
progress itself (no progress thread), so lowering it would slow the transfer.

`TransferWorkerPriority.lower_current_thread()` runs at the start of each transfer worker thread.
A thread that cannot be lowered is counted (`pd_transfer_worker_nice_errors_total`) and logged, and
keeps serving at its old priority. `nice` 0 leaves the threads as upstream starts them. Raising a
nice value needs no privilege; a thread already at or above `nice` is left as it is. Linux only
(per-thread nice through setpriority on the thread id). No SGLang import.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

MAX_NICE = 19


class TransferWorkerPriority:
    """The nice value prefill's transfer worker threads run at, and what each thread got (module docstring)."""

    def __init__(self, nice: int, counters):
        """`nice` in [0, 19]; 0: leave the threads alone. Raises ValueError outside."""
        if not 0 <= nice <= MAX_NICE:
            raise ValueError(f"transfer worker nice must be in [0, {MAX_NICE}], got {nice}")
        self.nice = nice
        self.counters = counters
        self._lock = threading.Lock()
        self._threads: dict[int, int] = {}   # native thread id -> nice it runs at
        self._errors: dict[int, str] = {}    # native thread id -> why it could not be lowered

    @property
    def enabled(self) -> bool:
        """True when transfer workers are lowered (read-only)."""
        return self.nice > 0

    def lower_current_thread(self) -> None:
        """Set the calling thread's nice to `nice` unless it already runs at or above it; records the
        outcome (mutates this object and the counters; thread-safe)."""
        if not self.enabled:
            return
        tid = threading.get_native_id()
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < self.nice:
                os.setpriority(os.PRIO_PROCESS, tid, self.nice)
            now = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError as exc:
            with self._lock:
                self._errors[tid] = str(exc)
            self.counters.add("pd_transfer_worker_nice_errors_total", 1)
            logger.error("sglang_pd: could not lower transfer worker thread %d to nice %d (%s); it keeps its "
                         "priority", tid, self.nice, exc)
            return
        with self._lock:
            self._threads[tid] = now
        self.counters.add("pd_transfer_workers_lowered_total", 1)

    def snapshot(self) -> dict:
        """Read-only view for /sglang_pd/stats: the setting, each thread's nice, each failure."""
        with self._lock:
            return {"nice": self.nice, "threads": [{"tid": tid, "nice": nice} for tid, nice in self._threads.items()],
                    "errors": [{"tid": tid, "error": error} for tid, error in self._errors.items()]}
