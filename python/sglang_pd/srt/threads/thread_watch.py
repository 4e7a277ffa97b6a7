"""Liveness of the PD threads a KV manager starts: a thread that dies is reported, never silent.

SGLang 0.5.23 starts, per KV manager, a receiving thread on the rank socket (prefill: the bootstrap
thread; decode: the status listener), prefill's transfer workers and decode's heartbeat checker,
without keeping them all (NIXL keeps none). When one dies the process stays up and every later
request fails after a timeout. `ThreadWatch` finds the manager's threads by the names Python gives
an unnamed thread ("Thread-7 (bootstrap_thread)") among those started after the manager's
construction began, then checks `is_alive()`: each death is reported once (callback + log line),
and `dead()` feeds /sglang_pd/stats and the /health check. A role still missing after
`discover_timeout_s` counts as dead ("never seen").

Mutated by the watchdog thread only (`tick`); `snapshot`/`dead` are read-only copies.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from typing import Callable, Iterable

logger = logging.getLogger(__name__)


class ThreadRole(str, enum.Enum):
    """What a PD thread does."""

    BOOTSTRAP = "bootstrap"                # prefill: reads registrations and transfer infos
    STATUS_LISTENER = "status_listener"    # decode: reads transfer status from prefill
    TRANSFER_WORKER = "transfer_worker"    # prefill: moves KV pages
    HEARTBEAT = "heartbeat"                # decode: probes prefill bootstrap servers


_ROLE_BY_TARGET = {
    "bootstrap_thread": ThreadRole.BOOTSTRAP,
    "bootstrap_thread_guarded": ThreadRole.BOOTSTRAP,
    "decode_thread": ThreadRole.STATUS_LISTENER,
    "decode_listener_thread": ThreadRole.STATUS_LISTENER,
    "transfer_worker": ThreadRole.TRANSFER_WORKER,
}
_TARGET = re.compile(r"\((\w+)\)$")


def role_of(thread_name: str) -> ThreadRole | None:
    """The PD role of a thread from its name, or None for any other thread."""
    if thread_name == "HeartbeatChecker":
        return ThreadRole.HEARTBEAT
    match = _TARGET.search(thread_name)
    return _ROLE_BY_TARGET.get(match.group(1)) if match else None


class ThreadWatch:
    """The threads of one KV manager and which of them died.

    `expected()` returns how many threads of each role the manager runs once constructed (None while
    that is not known yet); `on_death(name, role)` is called once per dead thread."""

    def __init__(self, before: Iterable[threading.Thread], expected: Callable[[], dict[ThreadRole, int] | None],
                 on_death: Callable[[str, ThreadRole], None], discover_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self._before = set(before)  # the objects, not ids: an id can be reused by a later thread
        self._expected = expected
        self._on_death = on_death
        self._deadline = clock() + discover_timeout_s
        self._clock = clock
        self._threads: dict[int, tuple[threading.Thread, ThreadRole]] = {}
        self._dead: dict[str, str] = {}   # thread name -> role
        self.discovered = False

    def tick(self, running: Iterable[threading.Thread]) -> list[str]:
        """Discover new PD threads among `running`, then report deaths; returns names newly dead."""
        running = list(running)
        newly = []
        if not self.discovered:
            for thread in running:
                role = role_of(thread.name)
                if role is not None and thread not in self._before:
                    self._threads.setdefault(id(thread), (thread, role))
            want = self._expected()
            have = self._counts()
            if want is not None and all(have.get(r, 0) >= n for r, n in want.items()):
                self.discovered = True
            elif self._clock() > self._deadline:
                self.discovered = True
                for role, n in (want or {}).items():
                    for i in range(have.get(role, 0), n):
                        newly.append(self._report(f"{role.value}#{i} (never seen)", role))
        for thread, role in list(self._threads.values()):
            if not thread.is_alive() and thread.name not in self._dead:
                newly.append(self._report(thread.name, role))
        return newly

    def _report(self, name: str, role: ThreadRole) -> str:
        self._dead[name] = role.value
        self._on_death(name, role)
        return name

    def _counts(self) -> dict[ThreadRole, int]:
        counts: dict[ThreadRole, int] = {}
        for _, role in self._threads.values():
            counts[role] = counts.get(role, 0) + 1
        return counts

    def dead(self) -> dict[str, str]:
        """Dead (or never seen) threads: name -> role (copy)."""
        return dict(self._dead)

    def snapshot(self) -> dict:
        """Read-only view for /sglang_pd/stats."""
        return {
            "discovered": self.discovered,
            "alive": sorted(t.name for t, _ in list(self._threads.values()) if t.is_alive()),
            "by_role": {r.value: n for r, n in self._counts().items()},
            "dead": self.dead(),
        }


class Watchdog:
    """A daemon thread calling `ThreadWatch.tick` every `interval_s` (one per process)."""

    def __init__(self, watch: ThreadWatch, interval_s: float = 1.0):
        self.watch = watch
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, name="sglang_pd-thread-watch", daemon=True)

    def start(self) -> "Watchdog":
        """Start watching (returns self)."""
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.watch.tick(threading.enumerate())
            except Exception:  # the watch must outlive anything it watches
                logger.exception("sglang_pd: thread watch failed once; still watching")
            time.sleep(self._interval_s)
