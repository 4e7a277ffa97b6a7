"""The guard in front of prefill's bootstrap HTTP server: source, authentication, checks, then SGLang's handler.

In -> out: an aiohttp request to /route, /register_dp_rank or /query_dp_ranks ->
- 403 when no secret is configured and the request comes from another host (`PeerSources`; nothing read);
- 401 when authentication refuses it;
- 400 when it is malformed (`bootstrap_checks.request_problem`);
- 409 for a PUT /route that would move an already registered rank without a secret (`route_move_problem`);
- else SGLang's own answer, tagged over the request's nonce when a secret is configured.
Other paths pass untouched. Refusals are counted through `count` (metric name) and in `guard.http` (per
reason; logged once per peer). Built by the hook on `CommonKVBootstrapServer._setup_routes`
(srt/hooks/connection/bootstrap_server.py).
"""

from __future__ import annotations

from typing import Callable

from sglang_pd.srt.http import bootstrap_checks as bootstrap_http
from sglang_pd.srt.auth import HTTP_HEADER, HTTP_RESPONSE_HEADER
from sglang_pd.srt.handshake import PeerGuard

RegisteredAt = Callable[[tuple[int, int, int, int]], "tuple[str, int] | None"]


def bootstrap_middleware(guard: PeerGuard, registered_sizes: Callable[[], dict], count: Callable[[str], None],
                         registered_at: RegisteredAt, is_me: Callable[[str], bool]):
    """An aiohttp middleware guarding the bootstrap routes (see module docstring). `registered_at`: a rank
    slot -> the (rank_ip, rank_port) registered there, or None. `is_me`: whether a signed request's
    `host:port` names this bootstrap server (`bootstrap_checks.names_this_server`)."""
    from aiohttp import web

    @web.middleware
    async def sglang_pd_bootstrap_guard(request, handler):
        if request.path not in bootstrap_http.GUARDED_PATHS:
            return await handler(request)
        peer = request.remote or "unknown"
        if not guard.sources.admits(peer, f"bootstrap {request.method} {request.path}"):
            count("peer_source_refused_total")
            return web.Response(status=403, text="sglang_pd: refused: this server has no peer secret and accepts "
                                                 "bootstrap calls from its own host only (docs/security.md)")
        body = await request.read()
        nonce = None
        if guard.auth is not None:
            verdict = guard.auth.verify_http_request(request.method, request.raw_path, body,
                                                     request.headers.get(HTTP_HEADER), is_me)
            if verdict.failure is not None:
                guard.http.add("auth_refused", verdict.failure.value, peer,
                               f"sglang_pd: bootstrap {request.method} {request.path} refused: auth "
                               f"{verdict.failure.value}")
                count("peer_auth_refused_total")
                return web.Response(status=401, text=f"sglang_pd: unauthenticated ({verdict.failure.value})")
            nonce = verdict.nonce
        problem = bootstrap_http.request_problem(request.method, request.path, request.query, body,
                                                 registered_sizes())
        moved = None
        if problem is None and guard.auth is None and request.method == "PUT" and request.path == bootstrap_http.ROUTE:
            moved = bootstrap_http.route_move_problem(body, registered_at)
        if problem is not None:
            guard.http.add("malformed", request.path, peer, f"sglang_pd: bootstrap {problem}")
            count("handshake_messages_rejected_total")
            response = web.Response(status=400, text=f"sglang_pd: {problem}")
        elif moved is not None:
            guard.http.add("route_moves_refused", request.path, peer, f"sglang_pd: bootstrap {moved}")
            count("bootstrap_route_moves_refused_total")
            response = web.Response(status=409, text=f"sglang_pd: {moved}")
        else:
            response = await handler(request)
        if nonce is not None:
            response.headers[HTTP_RESPONSE_HEADER] = guard.auth.sign_http_response(
                nonce, response.status, bytes(response.body or b""))
        return response

    return sglang_pd_bootstrap_guard
