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

from sglang_pd.harness.server import ServerProcess, group_pids

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


class PlacementKeeper:
    """What one deployment placed: the processes it started on a placement's CPUs, the decode schedulers
    (or their main threads) it moved, and the checks that every thread is where it was put. Owned by one
    PDDeployment; not thread-safe (the harness calls it from one thread)."""

    def __init__(self, placement: CpuPlacement):
        self.placement = placement
        self.checked: dict[str, int] = {}  # process name -> processes verified on its CPUs (last check)
        self._placed: list[ServerProcess] = []  # servers, router and launchers started with a placement
        self._moved: dict[str, int] = {}  # decode server name -> the scheduler pid (or main thread id) moved
        # moved scheduler: process id (or, main_thread_only, its main thread's id) -> CPUs
        self._moved_processes: dict[int, frozenset[int]] = {}
        self._moved_threads: dict[int, frozenset[int]] = {}

    def apply(self, proc: ServerProcess, is_decode: bool) -> None:
        """Take on `proc` (running, healthy, started on its role's CPUs): a decode server's scheduler
        process (main_thread_only: its main thread) moves to `decode_scheduler` when that is set. Raises
        RuntimeError unless exactly one scheduler process is found; call `check` after."""
        place = self.placement
        if is_decode and place.decode_scheduler is not None:
            pids = scheduler_pids(proc.proc.pid)
            if len(pids) != 1:
                raise RuntimeError(f"{proc.name}: expected one SGLang scheduler process to move to CPUs "
                                   f"{sorted(place.decode_scheduler)}, found {pids}")
            if place.main_thread_only:  # its id is the process id; threads it starts later follow it
                os.sched_setaffinity(pids[0], place.decode_scheduler)
                self._moved_threads[pids[0]] = place.decode_scheduler
            else:
                move_process(pids[0], place.decode_scheduler)
                self._moved_processes[pids[0]] = place.decode_scheduler
            self._moved[proc.name] = pids[0]
        self._placed.append(proc)

    def forget(self, proc: ServerProcess) -> None:
        """Drop `proc` and what was moved of it (before it restarts: its new processes are placed anew)."""
        self._placed = [p for p in self._placed if p is not proc]
        self.checked.pop(proc.name, None)
        moved = self._moved.pop(proc.name, None)
        self._moved_processes.pop(moved, None)
        self._moved_threads.pop(moved, None)

    def settle(self) -> int:
        """Move back to the decode CPUs the threads a moved main thread (split decode-step) has started
        since (they inherit its CPUs; SGLang 0.5.23 starts a ZMQ context, 2 threads, with the first
        request). Returns how many threads were moved."""
        moved = 0
        for main, cpus in self._moved_threads.items():
            for tid in threads(main):
                try:
                    if tid != main and frozenset(os.sched_getaffinity(tid)) == cpus:
                        os.sched_setaffinity(tid, self.placement.decode)
                        moved += 1
                except ProcessLookupError:
                    pass  # the thread ended
        return moved

    def check(self) -> dict[str, int]:
        """Raise RuntimeError naming any thread of a placed process still running (children included)
        allowed on other CPUs than its role's (a moved scheduler: its new ones); moves nothing. Returns,
        and records in `checked`, how many processes were checked per placed process."""
        for proc in [p for p in self._placed if p.is_running()]:
            self.checked[proc.name] = check_group(proc.proc.pid, proc.cpus, proc.name,
                                                  self._moved_processes, self._moved_threads)
        return dict(self.checked)
