"""HTTP side of early rejection: a `Retry-After` header on the 503 a refused request gets.

The decode scheduler refuses with a 503 abort whose message carries `retry_after_s=<n>` (see
early_rejection.py); SGLang turns it into an HTTP 503 for a non-streaming request. This ASGI
middleware copies the number into a `Retry-After` header. Streaming requests have sent their 200
before the scheduler answers, so they get the same message in their `finish_reason` instead.
Only 503 responses are buffered; everything else passes straight through.
"""

from __future__ import annotations

from sglang_pd.srt.slo import retry_after_from


class RetryAfterMiddleware:
    """ASGI middleware: add Retry-After to 503 responses whose body names retry_after_s."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        held: list[dict] = []

        async def send_with_header(message):
            if message["type"] == "http.response.start" and message.get("status") == 503:
                held.append(message)
                return
            if held and message["type"] == "http.response.body":
                start = held.pop()
                seconds = retry_after_from(message.get("body", b"").decode("utf-8", "replace"))
                if seconds is not None:
                    start = {**start, "headers": [*start.get("headers", []),
                                                  (b"retry-after", str(seconds).encode())]}
                await send(start)
            await send(message)

        return await self.app(scope, receive, send_with_header)
