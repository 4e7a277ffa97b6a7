"""One question to the schedulers shared by every HTTP caller that asks while it is out.

Several routes of a server's HTTP process answer from a round trip to every scheduler (SGLang's
get_internal_state channel): /sglang_pd/stats and /sglang_pd/info, the refresh before a /metrics scrape
(each runs the tree integrity check on every scheduler), and the dead-thread question behind /health.
/metrics and /health are open without the API key, and so are our routes on a server run without one,
so a flood of calls must not become a flood of scheduler work. `SingleFlight` runs the question once for
every caller that arrives while it is out, and, with `min_interval_s`, reuses a completed answer that is
younger than that instead of asking again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """`await result()`: the answer of `ask()`, asked once for all concurrent callers.

    Mutates only itself; runs on one asyncio loop (the HTTP process's). A failed question raises its
    error to every caller that shared it and stores nothing, so the next caller asks again. Callers
    share the returned object: they must not mutate it.
    """

    def __init__(self, ask: Callable[[], Awaitable[T]], min_interval_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self._ask = ask
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._running: asyncio.Future | None = None
        self._answer: T | None = None
        self._answered_at = float("-inf")
        self.num_asked = 0  # questions started (read by tests and views)

    async def result(self) -> T:
        """The answer: the question out now, a new one, or one answered under `min_interval_s` ago."""
        if self._running is None:
            if self._clock() - self._answered_at < self.min_interval_s:
                return self._answer
            self._running = asyncio.ensure_future(self._ask_once())
        return await asyncio.shield(self._running)

    async def _ask_once(self) -> T:
        self.num_asked += 1
        try:
            answer = await self._ask()
            self._answer, self._answered_at = answer, self._clock()
            return answer
        finally:
            self._running = None
