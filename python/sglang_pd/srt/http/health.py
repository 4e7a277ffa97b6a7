"""SGLang's /health and /health_generate answer 503 while a PD thread of this server is dead.

Upstream's health check runs one token through the scheduler, which still works when the PD threads
beside it (bootstrap, status listener, transfer workers) have died, so a server that can no longer
pair a single request reported healthy. This ASGI middleware turns a 200 into a 503 naming the dead
threads, which the callable it is given reports (srt/hooks/frontend/http_server.py: the schedulers' thread
watches over SGLang's get_internal_state channel, and prefill's bootstrap HTTP thread), asked at most
once a second, concurrent callers sharing one question.
"""

from __future__ import annotations

import json
from typing import Awaitable, Callable

from sglang_pd.srt.metrics import SingleFlight

HEALTH_PATHS = ("/health", "/health_generate")
CACHE_S = 1.0


class HealthGuardMiddleware:
    """ASGI middleware: a 200 from /health becomes 503 while a PD thread is dead."""

    def __init__(self, app, dead_threads: Callable[[], Awaitable[dict[str, str]]]):
        self.app = app
        # name -> role of every dead PD thread of this server; a round trip to every scheduler, and /health
        # is open without the API key (200 concurrent calls asked 200 times before it was shared)
        self._dead_threads = SingleFlight(dead_threads, min_interval_s=CACHE_S)

    @property
    def num_asked(self) -> int:
        """Questions asked (read by tests)."""
        return self._dead_threads.num_asked

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("path") not in HEALTH_PATHS:
            return await self.app(scope, receive, send)
        held: list[dict] = []

        async def hold(message):
            held.append(message)

        await self.app(scope, receive, hold)
        status = next((m.get("status") for m in held if m["type"] == "http.response.start"), None)
        dead = await self._dead_threads.result() if status == 200 else {}
        if not dead:
            for message in held:
                await send(message)
            return
        body = json.dumps({"error": "sglang_pd: PD thread(s) dead", "dead_threads": dead}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
