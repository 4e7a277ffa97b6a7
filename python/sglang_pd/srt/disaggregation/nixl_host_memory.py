"""NIXL with the KV pool in host memory: the manager's scope, and a bound on stalled transfers (logic).

Upstream registers every KV buffer with NIXL as "VRAM"; with a CPU KV pool UCX refuses it and the
server dies at start-up. On a CPU device the hooks (srt/hooks/nixl_conn.py, nixl_api.py) declare the
buffers "DRAM" and build the manager's agent inside a `HostMemoryScope`, where its busy-polling
progress thread is turned off; prefill's transfer worker then drives progress itself.

A transfer that never completes would spin that worker forever (upstream's wait is unbounded while no
error is seen). `StallWatch` bounds it: past the timeout the transfer reads as "ERR", upstream's own
failure path fails the room and tells decode, and decode releases lock and pages. It also remembers
which room each transfer-worker thread serves, so pages are counted per room where NIXL is asked to
move them.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from typing import Iterator

from sglang_pd.srt.disaggregation.prefill_transfer_log import PrefillTransferLog
from sglang_pd.srt.fault_injection import Fault, FaultPlan

logger = logging.getLogger(__name__)

HOST_MEMORY_KIND = "DRAM"
_FINISHED = ("DONE", "ERR")


class HostMemoryScope:
    """Marks the code that builds a host-memory NixlKVManager (its agent must not busy-poll)."""

    def __init__(self):
        self._active = contextvars.ContextVar("sglang_pd_nixl_host_memory", default=False)

    @contextlib.contextmanager
    def entered(self, on_host: bool) -> Iterator[None]:
        """Within this block `active()` is `on_host`."""
        token = self._active.set(on_host)
        try:
            yield
        finally:
            self._active.reset(token)

    def active(self) -> bool:
        """True inside the construction of a host-memory manager (read-only)."""
        return self._active.get()


class StallWatch:
    """Per transfer-worker thread: the room it serves and the deadline of the transfers it awaits.

    Mutating: `on_chunk`, `armed`, `check`. Each worker thread sees only its own room and deadline.
    """

    def __init__(self, timeout_s: float, log: PrefillTransferLog, faults: FaultPlan):
        if not timeout_s > 0:
            raise ValueError(f"stall timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.log = log
        self.faults = faults
        self._worker = threading.local()

    def on_chunk(self, room: int) -> None:
        """This thread now serves `room` (an injected NIXL_STALL for it makes its transfers hang)."""
        self._worker.room = int(room)
        self._worker.stalled = self.faults.take(Fault.NIXL_STALL, int(room))

    def room(self) -> int | None:
        """The room this thread serves, if known (read-only)."""
        return getattr(self._worker, "room", None)

    @contextlib.contextmanager
    def armed(self, now_s: float | None = None) -> Iterator[None]:
        """While this block runs (one batch awaited), transfers past the deadline read as ERR."""
        self._worker.deadline = (time.monotonic() if now_s is None else now_s) + self.timeout_s
        self._worker.reported = False
        try:
            yield
        finally:
            self._worker.deadline = None

    def check(self, state: str, now_s: float | None = None) -> str:
        """NIXL's transfer state as upstream should see it: ERR once past this thread's deadline."""
        deadline = getattr(self._worker, "deadline", None)
        if deadline is None:
            return state
        if getattr(self._worker, "stalled", False) and state == "DONE":
            state = "PROC"  # injected stall: the transfer never reports completion
        if state not in _FINISHED and (time.monotonic() if now_s is None else now_s) > deadline:
            if not self._worker.reported:
                self._worker.reported = True
                logger.error("sglang_pd: NIXL transfer for room %s stalled for more than %.0f s; failing it",
                             self.room(), self.timeout_s)
                self.log.record_stall()
            return "ERR"
        return state
