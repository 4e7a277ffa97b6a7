"""A PD scheduler with transfers or handshakes in flight but nothing to compute waits instead of spinning.

Upstream 0.5.23's `Scheduler.on_idle` returns at once with `time.sleep(0)` whenever a prefill or decode
scheduler is not fully idle (bootstrap, prealloc or transfer queues hold requests; the transfer threads
need the GIL): the event loop then spins a core until the transfer or the peer's answer arrives. On a
box whose cores the PD servers share with their HTTP processes, that spin delays every other process
on the request path: on this 2-core box the time a decode-local request spent outside decode's
scheduler (HTTP, tokenizer manager, detokenizer, client) was 28 ms p50 with the spin and 10 ms with
a 500 us wait (short preset, one run each; docs/local_prefill.md has the repeated runs).
`IdleWait.wait` sleeps `wait_s` instead: a completed transfer or a new request is seen at most that
much later; a scheduler with a batch to run never calls it.

Counted: waits and seconds waited (`pd_idle_waits_total`, `pd_idle_wait_seconds_total`). 0 keeps
upstream's spin. Scheduler thread only; no SGLang import.
"""

from __future__ import annotations

import time


class IdleWait:
    """How a not-fully-idle PD scheduler with nothing to run waits (module docstring)."""

    def __init__(self, wait_s: float, counters):
        """`wait_s` >= 0 seconds per wait (0: do not wait: upstream's spin); raises ValueError below 0."""
        if wait_s < 0:
            raise ValueError(f"idle wait must be >= 0 s, got {wait_s}")
        self.wait_s = wait_s
        self.counters = counters

    @property
    def enabled(self) -> bool:
        """True when waits sleep (read-only)."""
        return self.wait_s > 0

    def wait(self) -> None:
        """Sleep `wait_s` (the caller checked there is nothing to run); counted (mutates the counters)."""
        start = time.perf_counter()
        time.sleep(self.wait_s)
        self.counters.add("pd_idle_waits_total", 1)
        self.counters.add("pd_idle_wait_seconds_total", time.perf_counter() - start)
