"""The guard in front of prefill's bootstrap HTTP server: authenticate, check, then let SGLang's handler run.

In -> out: an aiohttp request to /route, /register_dp_rank or /query_dp_ranks -> 401 (auth refused),
400 (malformed, `bootstrap_http.request_problem`) or SGLang's own answer, tagged over the request's
nonce when a secret is configured. Other paths pass untouched. Refusals are counted through `count`
(metric name) and in `guard.http` (per reason; logged once per peer). Built by the hook on
`CommonKVBootstrapServer._setup_routes` (srt/hooks/connection/bootstrap_server.py).
"""

from __future__ import annotations

from typing import Callable

from sglang_pd.srt.http import bootstrap_checks as bootstrap_http
from sglang_pd.srt.auth import HTTP_HEADER, HTTP_RESPONSE_HEADER
from sglang_pd.srt.handshake import PeerGuard


def bootstrap_middleware(guard: PeerGuard, registered_sizes: Callable[[], dict], count: Callable[[str], None]):
    """An aiohttp middleware guarding the bootstrap routes (see module docstring)."""
    from aiohttp import web

    @web.middleware
    async def sglang_pd_bootstrap_guard(request, handler):
        if request.path not in bootstrap_http.GUARDED_PATHS:
            return await handler(request)
        body = await request.read()
        peer = request.remote or "unknown"
        nonce = None
        if guard.auth is not None:
            verdict = guard.auth.verify_http_request(request.method, request.raw_path, body,
                                                     request.headers.get(HTTP_HEADER))
            if verdict.failure is not None:
                guard.http.add("auth_refused", verdict.failure.value, peer,
                               f"sglang_pd: bootstrap {request.method} {request.path} refused: auth "
                               f"{verdict.failure.value}")
                count("peer_auth_refused_total")
                return web.Response(status=401, text=f"sglang_pd: unauthenticated ({verdict.failure.value})")
            nonce = verdict.nonce
        problem = bootstrap_http.request_problem(request.method, request.path, request.query, body,
                                                 registered_sizes())
        if problem is not None:
            guard.http.add("malformed", request.path, peer, f"sglang_pd: bootstrap {problem}")
            count("handshake_messages_rejected_total")
            response = web.Response(status=400, text=f"sglang_pd: {problem}")
        else:
            response = await handler(request)
        if nonce is not None:
            response.headers[HTTP_RESPONSE_HEADER] = guard.auth.sign_http_response(
                nonce, response.status, bytes(response.body or b""))
        return response

    return sglang_pd_bootstrap_guard
