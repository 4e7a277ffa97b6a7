"""Metrics true at scrape time: recompute on-demand values before /metrics answers.

Some values are computed by a check rather than counted as things happen (the tree integrity check
that feeds `sglang_pd:integrity_failures_total`). `RefreshBeforeScrape` awaits a refresh (the HTTP
hook passes one that asks every scheduler for its state, which runs the check) before the wrapped
app serves a request under `path`, so a scrape reads values computed for it. A refresh that fails
answers 500 naming the error instead of serving stale figures.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)


class RefreshBeforeScrape:
    """ASGI middleware: `await refresh()` before serving any HTTP request whose path starts with `path`."""

    def __init__(self, app, refresh: Callable[[], Awaitable[None]], path: str = "/metrics"):
        self.app = app
        self.refresh = refresh
        self.path = path

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or not scope.get("path", "").startswith(self.path):
            return await self.app(scope, receive, send)
        try:
            await self.refresh()
        except Exception as exc:  # a scrape must not look healthy when its figures could not be computed
            logger.exception("sglang_pd: refreshing metrics before a scrape failed")
            body = f"sglang_pd: metrics refresh failed: {type(exc).__name__}: {exc}\n".encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        return await self.app(scope, receive, send)
