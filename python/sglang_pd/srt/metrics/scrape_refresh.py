"""Metrics true at scrape time (or at most a second before): on-demand values recomputed before /metrics answers.

Some values are computed by a check rather than counted as things happen (the tree integrity check
that feeds `sglang_pd:integrity_failures_total`). `RefreshBeforeScrape` awaits a refresh (the HTTP
hook passes one that asks every scheduler for its state, which runs the check) before the wrapped
app serves a request under `path`, so a scrape reads values computed for it, or at most
`min_interval_s` before it: /metrics is open to anyone who reaches the HTTP port (SGLang serves it
without the API key), and each refresh is work on every scheduler, so a flood of scrapes must not turn
into a flood of integrity checks. Refreshes are single-flight (scrapes arriving during one share it)
and at most one starts per `min_interval_s`. A refresh that fails answers 500 naming the error (to
every scrape sharing it) instead of serving stale figures.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

from sglang_pd.srt.metrics.single_flight import SingleFlight

logger = logging.getLogger(__name__)
MIN_INTERVAL_S = 1.0


class RefreshBeforeScrape:
    """ASGI middleware: `await refresh()` before serving any HTTP request whose path starts with `path`
    (shared with scrapes that arrive while it runs; skipped when one completed under `min_interval_s` ago)."""

    def __init__(self, app, refresh: Callable[[], Awaitable[None]], path: str = "/metrics",
                 min_interval_s: float = MIN_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.app = app
        self.path = path
        self._refresh = SingleFlight(refresh, min_interval_s, clock)

    @property
    def num_refreshes(self) -> int:
        """Refreshes started (read by tests)."""
        return self._refresh.num_asked

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or not scope.get("path", "").startswith(self.path):
            return await self.app(scope, receive, send)
        try:
            await self._refresh.result()
        except Exception as exc:  # a scrape must not look healthy when its figures could not be computed
            logger.exception("sglang_pd: refreshing metrics before a scrape failed")
            body = f"sglang_pd: metrics refresh failed: {type(exc).__name__}: {exc}\n".encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        return await self.app(scope, receive, send)
