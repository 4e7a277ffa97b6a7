"""A PD request's pairing fields (bootstrap room, host, port) checked in the HTTP process of a prefill
or decode server, before SGLang's scheduler uses them.

SGLang 0.5.23 checks only that a PD request has a bootstrap room. On decode, a request with a room and
no `bootstrap_host` reaches `_bootstrap_addr` in the scheduler, whose AttributeError ends the scheduler
and the server: anyone who can reach decode's HTTP port can take it down (test_pd_correctness.py -k
pairing: refused instead; scripts/probes/security/prompt_guard/http_fuzz.py). A room or port of the wrong type or range travels into handshake messages the peer
refuses. Each field is checked against the form SGLang and its peers use; a bad one is answered with
HTTP 400 naming the field and the rule. Read-only; no SGLang import.
"""

from __future__ import annotations

import re

from sglang_pd.srt.wire import MAX_ROOM  # the handshake gate's bound: one for both

MAX_HOST_LEN = 253            # a DNS name's limit; IPv4 and bracketed IPv6 fit too
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


def _whole(value) -> bool:
    return type(value) is int


def check_pairing(mode: str, room, host, port) -> None:
    """Raise ValueError naming the first bad pairing field of a request to a `mode` ("prefill"/"decode")
    server. A missing room is left to SGLang (it refuses it); a missing port means the server's default
    bootstrap port (SGLang's rule); decode needs a host (it connects to prefill there)."""
    if room is not None and not (_whole(room) and 0 <= room <= MAX_ROOM):
        raise ValueError(f"bootstrap_room {room!r} must be an integer in [0, 2**63 - 1]")
    if port is not None and not (_whole(port) and 1 <= port <= 65535):
        raise ValueError(f"bootstrap_port {port!r} must be an integer in [1, 65535]")
    if host is None:
        if mode == "decode" and room is not None:
            raise ValueError("bootstrap_host is required on a decode server: it names the prefill server to pair with")
        return
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST_LEN or not _HOST.match(host):
        shown = repr(host)[:80]
        raise ValueError(f"bootstrap_host {shown} is not a host name or IP address")
