"""Hook on requests.sessions.Session.request: SGLang's bootstrap HTTP calls signed, answers verified.

SGLang's PD code talks to prefill's bootstrap server with plain `requests` calls spread over several
functions (prefill ranks PUT /route and POST /register_dp_rank; decode GETs /route and POSTs
/query_dp_ranks). Every request of this scheduler process to one of those paths gets the auth header
(body sent as the exact bytes signed), and the answer must carry the server's tag over our nonce,
its status and body; an answer without it (a fake bootstrap server, a replay) is replaced by a 401
before SGLang reads it, so decode never trusts an unauthenticated prefill rank. A bootstrap request to an
address this process does not sign for (srt/auth/bootstrap_addresses.py) is not sent at all: a 403 takes
its place. Any other request of the process passes untouched, and so does everything when no secret is
configured.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from sglang_pd.srt.state import current
from sglang_pd.srt.http import bootstrap_checks as bootstrap_http
from sglang_pd.srt.auth import HTTP_HEADER, HTTP_RESPONSE_HEADER

logger = logging.getLogger(__name__)


def around_session_request(original, session, method, url, params=None, data=None, headers=None, cookies=None,
                           files=None, auth=None, timeout=None, allow_redirects=True, proxies=None, hooks=None,
                           stream=None, verify=None, cert=None, json=None):
    """Sign a bootstrap request and verify its answer; pass anything else through unchanged."""
    options = {"params": params, "data": data, "headers": headers, "cookies": cookies, "files": files, "auth": auth,
               "timeout": timeout, "allow_redirects": allow_redirects, "proxies": proxies, "hooks": hooks,
               "stream": stream, "verify": verify, "cert": cert, "json": json}
    guard = current().peer_guard
    if guard.auth is None or urlsplit(url).path not in bootstrap_http.GUARDED_PATHS:
        return original(session, method, url, **options)
    if not guard.bootstrap_addresses.allows_url(url):
        return _not_sent(url)
    return _signed_request(original, session, method, url, options, guard.auth)


def _signed_request(original, session, method, url, options: dict, peer_auth):
    """Send with the auth header over method, path + query and the exact body bytes; verify the answer."""
    import requests

    if options["json"] is not None:
        options["data"] = bootstrap_http.encode_json_body(options["json"])
        options["json"] = None
        options["headers"] = {**(options["headers"] or {}), "Content-Type": "application/json"}
    body = options["data"] or b""
    body = body.encode() if isinstance(body, str) else bytes(body)
    path_qs = requests.Request(method, url, params=options["params"]).prepare().path_url
    header, nonce = peer_auth.sign_http_request(method, path_qs, body, urlsplit(url).netloc)
    options["headers"] = {**(options["headers"] or {}), HTTP_HEADER: header}
    response = original(session, method, url, **options)
    verdict = peer_auth.verify_http_response(nonce, response.status_code, response.content,
                                             response.headers.get(HTTP_RESPONSE_HEADER))
    if verdict.failure is None:
        return response
    return _refused(response, url, verdict.failure.value)


def _not_sent(url: str):
    """A 403 in place of a bootstrap request to an address outside the list (counted; logged once per address)."""
    parts = urlsplit(url)
    addresses = current().peer_guard.bootstrap_addresses
    current().counters.add("bootstrap_addresses_refused_total", 1)
    message = addresses.refusal(parts.hostname or "", parts.port or 80)
    if addresses.refuse(parts.netloc):
        logger.warning("sglang_pd: %s %s not sent: %s (further ones to this address are counted, not logged)",
                       parts.path, parts.netloc, message)
    return _stand_in(403, f"sglang_pd: {message}", url)


def _refused(response, url: str, failure: str):
    """A 401 in place of an unauthenticated bootstrap answer (counted; logged once per host)."""
    host = urlsplit(url).netloc
    state = current()
    state.counters.add("peer_auth_refused_total", 1)
    state.peer_guard.http.add("auth_refused", f"response_{failure}", host,
                              f"sglang_pd: answer of bootstrap server {host} to {urlsplit(url).path} refused: "
                              f"auth {failure} (status {response.status_code})")
    return _stand_in(401, f"sglang_pd: unauthenticated bootstrap answer from {host} ({failure})", response.url,
                     response.request)


def _stand_in(status: int, text: str, url: str, request=None):
    """The response SGLang reads in place of one it must not see (or of a request never sent)."""
    import requests

    response = requests.Response()
    response.status_code, response._content = status, text.encode()
    response.url, response.request = url, request
    return response
