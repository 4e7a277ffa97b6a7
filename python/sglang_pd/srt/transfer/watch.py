"""What each prefill transfer-worker thread is doing: its room, a bound on stalled NIXL transfers,
and the injected send failure, send delay and worker error of the tests (logic).

Upstream's transfer workers (both backends) take one chunk at a time from a queue; the hook on that
queue (srt/hooks/connection/common_utils.py) tells `TransferWatch` which room the thread now serves, so pages
are counted per room where the backend is asked to move them.

A NIXL transfer that never completes would spin its worker forever (upstream's wait is unbounded
while no error is seen). `TransferWatch` bounds it: past the timeout the transfer is cancelled, and
only once NIXL confirms it stopped does it read as "ERR": upstream's own failure path then fails the
room and tells decode, and decode releases lock and pages no write can reach. Never a failure while a
write may still land.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator

from sglang_pd.srt.transfer.prefill_log import PrefillTransferLog
from sglang_pd.srt.fault_injection import Fault, FaultPlan

logger = logging.getLogger(__name__)

_FINISHED = ("DONE", "ERR")
SEND_DELAY_S = 5.0  # test fault PREFILL_SEND_DELAY: how late the room's send starts


class TransferWatch:
    """Per transfer-worker thread (both backends): the room it serves and, on NIXL, the deadline of
    the transfers it awaits.

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
        """This thread now serves `room` (an injected NIXL_STALL for it makes its transfers hang; an
        injected PREFILL_TRANSFER_FAIL makes its next send report failure)."""
        self._worker.room = int(room)
        self._worker.stalled = self.faults.take(Fault.NIXL_STALL, int(room))
        self._worker.send_fails = self.faults.take(Fault.PREFILL_TRANSFER_FAIL, int(room))

    def take_send_failure(self) -> bool:
        """True once if this thread's room was armed to fail its send (test fault; mutates)."""
        fails = getattr(self._worker, "send_fails", False)
        self._worker.send_fails = False
        return fails

    def take_send_delay(self) -> float:
        """Seconds this thread's next send waits first (test fault PREFILL_SEND_DELAY, taken where the send
        starts: the chunk is already the worker's, so the room's write is in flight while it waits)."""
        room = self.room()
        return SEND_DELAY_S if room is not None and self.faults.take(Fault.PREFILL_SEND_DELAY, room) else 0.0

    def take_worker_error(self) -> bool:
        """True once if this thread's room was armed to make the worker raise (test fault; mutates).
        Taken where the worker raises, so a fired fault is always a raised exception."""
        room = self.room()
        return room is not None and self.faults.take(Fault.PREFILL_WORKER_ERROR, room)

    def room(self) -> int | None:
        """The room this thread serves, if known (read-only)."""
        return getattr(self._worker, "room", None)

    @contextlib.contextmanager
    def armed(self, now_s: float | None = None) -> Iterator[None]:
        """While this block runs (one batch awaited), transfers past the deadline are cancelled."""
        self._worker.deadline = (time.monotonic() if now_s is None else now_s) + self.timeout_s
        self._worker.reported = self._worker.uncancellable = False
        self._worker.next_cancel_s = 0.0
        try:
            yield
        finally:
            self._worker.deadline = None

    def check(self, state: str, cancel: Callable[[], bool], now_s: float | None = None) -> str:
        """NIXL's transfer state as upstream should see it (mutates this thread's record).

        Past this thread's deadline an unfinished transfer is cancelled: `cancel()` releases it and
        returns True only when NIXL confirms it stopped; it then reads as ERR, so upstream fails the
        room and tells decode, whose pages no write can reach any more. A transfer NIXL cannot cancel
        keeps reading as running (it may still write into decode's pages, which must not be freed):
        the cancel is retried once per second and counted once.
        """
        deadline = getattr(self._worker, "deadline", None)
        if deadline is None:
            return state
        if getattr(self._worker, "stalled", False) and state == "DONE":
            state = "PROC"  # injected stall: the transfer never reports completion
        now = time.monotonic() if now_s is None else now_s
        if state in _FINISHED or now <= deadline or now < self._worker.next_cancel_s:
            return state
        if cancel():
            if not self._worker.reported:
                self._worker.reported = True
                logger.error("sglang_pd: NIXL transfer for room %s stalled for more than %.1f s; cancelled "
                             "it and failed the room", self.room(), self.timeout_s)
                self.log.record_stall()
            return "ERR"
        self._worker.next_cancel_s = now + 1.0
        if not self._worker.uncancellable:
            self._worker.uncancellable = True
            logger.error("sglang_pd: NIXL transfer for room %s stalled for more than %.1f s and NIXL cannot "
                         "cancel it; the room keeps waiting (its write may still land)", self.room(), self.timeout_s)
            self.log.counters.add("nixl_uncancellable_stalls_total")
        return state
