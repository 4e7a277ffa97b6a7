"""Which CPUs each process of a deployment may run on (Linux affinity), and a check that it does.

On one small box the prefill server, the decode server(s) and the benchmark client share every core, so
each waits for the others on the run queue. Two splits stand in, as far as one box can, for the
deployments PD is for:
- `decode`: the decode server(s), every process, alone on the highest CPU; the rest on the others;
- `decode-scheduler`: only decode's scheduler process (every thread) on the highest CPU; everything
  else, decode's HTTP and detokenizer processes included, on the others;
- `decode-step`: only the main thread of decode's scheduler process, the one that runs the decode step,
  on the highest CPU; the scheduler's other threads (ZMQ I/O, gloo, torch) stay with everything else.
The harness sets the affinity when it starts a process (children inherit it) and moves decode's
scheduler (or its main thread) once the server is up. SGLang binds threads itself only on AMX / arm64 CPUs
(`SGLANG_CPU_OMP_THREADS_BIND`), so `check_group` verifies every thread of every process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sglang_pd.harness.server import group_pids

SPLITS = ("decode", "decode-scheduler", "decode-step")
SCHEDULER_TITLE = "sglang::scheduler"  # the process title SGLang's scheduler process sets for itself


@dataclass(frozen=True)
class CpuPlacement:
    """CPU sets for the prefill server, the decode server(s), and the client process with anything the
    harness starts beside it (a plain server, the router); `decode_scheduler`, when set, is where each
    decode server's scheduler process (with `main_thread_only`, its main thread) is moved once it runs.
    Raises ValueError on an empty or unknown set."""

    prefill: frozenset[int]
    decode: frozenset[int]
    client: frozenset[int]
    decode_scheduler: frozenset[int] | None = None
    main_thread_only: bool = False  # move only the scheduler's main thread to decode_scheduler

    def __post_init__(self):
        online = frozenset(range(os.cpu_count() or 1))
        for role, cpus in (("prefill", self.prefill), ("decode", self.decode), ("client", self.client),
                           ("decode_scheduler", self.decode_scheduler)):
            if cpus is not None and (not cpus or not cpus <= online):
                raise ValueError(f"cpu placement: {role} CPUs {sorted(cpus)} must be a non-empty subset of "
                                 f"this machine's CPUs {sorted(online)}")
        if self.main_thread_only and self.decode_scheduler is None:
            raise ValueError("cpu placement: main_thread_only needs decode_scheduler")

    def as_dict(self) -> dict:
        """Sorted lists, for a JSON report."""
        out = {role: sorted(cpus) for role, cpus in (("prefill", self.prefill), ("decode", self.decode),
                                                    ("client", self.client), ("decode_scheduler", self.decode_scheduler))
               if cpus is not None}
        return {**out, "main_thread_only": True} if self.main_thread_only else out


def split_placement(split: str, available: frozenset[int] | None = None) -> CpuPlacement:
    """The placement `split` (one of SPLITS) over `available` (default: this process's CPUs).

    Raises ValueError on an unknown split or fewer than 2 CPUs (nothing to split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown CPU split {split!r}; one of {SPLITS}")
    cpus = frozenset(os.sched_getaffinity(0) if available is None else available)
    if len(cpus) < 2:
        raise ValueError(f"a CPU split needs at least 2 CPUs available to this process; it has {sorted(cpus)}")
    alone, rest = frozenset({max(cpus)}), cpus - {max(cpus)}
    if split == "decode":
        return CpuPlacement(prefill=rest, decode=alone, client=rest)
    return CpuPlacement(prefill=rest, decode=rest, client=rest, decode_scheduler=alone,
                        main_thread_only=split == "decode-step")


def threads(pid: int) -> list[int]:
    """Thread ids of process `pid` ([] once it has exited)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def scheduler_pids(pgid: int) -> list[int]:
    """Processes of group `pgid` whose title is SGLang's scheduler's."""
    found = []
    for pid in group_pids(pgid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(SCHEDULER_TITLE):
            found.append(pid)
    return found


def move_process(pid: int, cpus: frozenset[int]) -> int:
    """Set the affinity of every thread of `pid` to `cpus`, again until no new thread appears (a thread
    inherits its creator's affinity). Returns the number of threads moved."""
    moved: set[int] = set()
    while todo := [t for t in threads(pid) if t not in moved]:
        for tid in todo:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass  # the thread ended
            moved.add(tid)
    return len(moved)


def check_group(pgid: int, cpus: frozenset[int], name: str, moved_processes: dict[int, frozenset[int]] | None = None,
                moved_threads: dict[int, frozenset[int]] | None = None) -> int:
    """Raise RuntimeError naming each thread of group `pgid` allowed on other CPUs than it should be: its
    entry in `moved_threads` (by thread id), else its process's in `moved_processes`, else `cpus`.
    Returns how many processes were checked (>= 1)."""
    wrong, checked = [], 0
    moved_processes, moved_threads = moved_processes or {}, moved_threads or {}
    for pid in group_pids(pgid):
        for tid in threads(pid):
            want = moved_threads.get(tid, moved_processes.get(pid, cpus))
            try:
                allowed = frozenset(os.sched_getaffinity(tid))
            except (ProcessLookupError, PermissionError):
                continue
            if allowed != want:
                wrong.append(f"pid {pid} thread {tid} on {sorted(allowed)} (want {sorted(want)})")
        checked += 1
    if wrong or not checked:
        raise RuntimeError(f"{name}: threads not on their CPUs: {', '.join(wrong) or 'no process found'}")
    return checked
