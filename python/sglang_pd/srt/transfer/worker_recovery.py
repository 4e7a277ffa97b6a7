"""Prefill's mooncake transfer workers outlive an exception on one room (logic).

In SGLang 0.5.23 the mooncake transfer worker turns any exception raised while it handles a chunk into
the end of its thread. The process stays up, and every room queued later on that worker waits until
decode's timeout (thread_watch.py then fails /health). We met one such exception in CI: the scheduler
cleared a room that had just concluded Success between the worker's two reads of its status, and the
second read raised KeyError (docs/results/fresh_clone/ci_run_0b55ee0_failed.log). Later upstream versions
keep the worker alive (sgl-project/sglang PRs #27162, #28003); 0.5.23 does not. The NIXL worker of
0.5.23 already fails only the room.

The hook (srt/hooks/connection/mooncake_conn.py) hands upstream's worker loop a `ChunkTap` over its queue, so it
knows the chunk in hand when the loop raises. It then calls `recover_room` and runs the loop again
on the same queue. `recover_room` reads the room's state on the manager and settles it:

- CLEARED: the room is no longer in `request_status`. Its request already concluded or was aborted,
  and the scheduler cleared it. Only the worker's in-flight count for it is left, and is dropped.
- CONCLUDED: the room concluded Success and decode was told. It is left as it is; the scheduler
  clears it.
- FAILED: anything else. The room is failed with a reason naming the exception, and decode is told
  (upstream's `conclude_failure`). Decode then releases its lock and pages and its client gets an
  error; prefill's scheduler fails its half the same way.

An exception raised with no chunk in hand still ends the thread, as upstream does, because there is
no room to settle. Every recovery is counted (`transfer_worker_errors_total{outcome}`) and logged:
with its traceback the first time, then one line per error.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from sglang_pd.srt.metrics import PDCounters

logger = logging.getLogger(__name__)

COUNTER = "transfer_worker_errors_total"


class Outcome(str, enum.Enum):
    """What the failed chunk's room needed."""

    CLEARED = "cleared"
    CONCLUDED = "concluded"
    FAILED = "failed"


class ChunkTap:
    """A transfer worker's queue that remembers the chunk the worker took last (None before the first
    one and while the worker waits for the next). Owned by one worker thread; `put` and everything
    else go to the real queue unchanged."""

    def __init__(self, queue: Any):
        self._queue = queue
        self.taken: Any = None

    def get(self) -> Any:
        self.taken = None
        self.taken = self._queue.get()
        return self.taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def cause(error: BaseException) -> BaseException:
    """The exception the worker met: upstream re-raises it as RuntimeError("... is dead")."""
    return error.__context__ or error


def recover_room(mgr: Any, room: int, error: BaseException) -> Outcome:
    """Settle `room` after the transfer worker of `mgr` (a prefill KV manager) raised `error` while
    handling one of its chunks. Mutates the manager's room state; call on that worker's thread."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    status = mgr.request_status.get(room)
    if status is None:
        mgr._staging_outstanding.pop(room, None)
        return Outcome.CLEARED
    if status == KVPoll.Success:
        return Outcome.CONCLUDED
    mgr.conclude_failure(bootstrap_room=room,
                         failure_reason=f"prefill's transfer worker raised {cause(error)!r} on this room "
                                        f"(sglang_pd failed the room and kept the worker)")
    mgr._staging_outstanding.pop(room, None)
    return Outcome.FAILED


def record(counters: PDCounters, room: int, outcome: Outcome, error: BaseException) -> None:
    """Count and log one recovered worker error (with its traceback the first time in this process)."""
    first = not any(counters.labelled[COUNTER].values())
    counters.add_labelled(COUNTER, outcome.value)
    logger.error("sglang_pd: prefill's transfer worker raised on room %d; room %s, worker kept: %r", room,
                 outcome.value, cause(error), exc_info=error if first else None)
