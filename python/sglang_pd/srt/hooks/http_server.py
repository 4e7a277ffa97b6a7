"""SGLang's /health and /health_generate answer 503 when a PD thread of this server is dead.

Upstream's health check runs one token through the scheduler, which still works when the PD threads
beside it (bootstrap, status listener, transfer workers) have died, so a server that can no longer
pair a single request reported healthy. This ASGI middleware (mounted by sglang_pd.http_routes on
SGLang's own app) turns a 200 into a 503 naming the dead threads: those the schedulers' thread
watches report (fetched over SGLang's get_internal_state channel, at most once a second) and, on
prefill, the bootstrap HTTP server's thread in this process.
"""

from __future__ import annotations

import json
import time

HEALTH_PATHS = ("/health", "/health_generate")
CACHE_S = 1.0


async def dead_pd_threads() -> dict[str, str]:
    """name -> role of every dead PD thread of this server (HTTP process and its schedulers)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    from sglang_pd.http_routes import scheduler_states

    dead: dict[str, str] = {}
    bootstrap = getattr(get_global_state().tokenizer_manager, "bootstrap_server", None)
    thread = getattr(bootstrap, "thread", None)
    if thread is not None and not thread.is_alive():
        dead[thread.name] = "bootstrap_http_server"
    for state in await scheduler_states():
        threads = (state.get("handshake") or {}).get("threads") or {}
        dead.update(threads.get("dead") or {})
    return dead


class HealthGuardMiddleware:
    """ASGI middleware: a 200 from /health becomes 503 while a PD thread is dead."""

    def __init__(self, app):
        self.app = app
        self._checked_at = 0.0
        self._dead: dict[str, str] = {}

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("path") not in HEALTH_PATHS:
            return await self.app(scope, receive, send)
        held: list[dict] = []

        async def hold(message):
            held.append(message)

        await self.app(scope, receive, hold)
        status = next((m.get("status") for m in held if m["type"] == "http.response.start"), None)
        dead = await self._current_dead() if status == 200 else {}
        if not dead:
            for message in held:
                await send(message)
            return
        body = json.dumps({"error": "sglang_pd: PD thread(s) dead", "dead_threads": dead}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _current_dead(self) -> dict[str, str]:
        if time.monotonic() - self._checked_at >= CACHE_S:
            self._dead = await dead_pd_threads()
            self._checked_at = time.monotonic()
        return self._dead


def mount_health_guard(app) -> None:
    """Mount the middleware once, before the app starts serving."""
    if not any(getattr(m, "cls", None) is HealthGuardMiddleware for m in app.user_middleware):
        app.add_middleware(HealthGuardMiddleware)
