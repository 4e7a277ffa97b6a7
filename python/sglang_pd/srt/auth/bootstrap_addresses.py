"""Which bootstrap servers a process signs its bootstrap requests for, when a peer secret is set.

A decode server takes the prefill bootstrap address of each request from the request itself (its
`bootstrap_host` / `bootstrap_port`, chosen by the router or the client). Signing for whatever address a
request names would let any client make decode send a validly signed bootstrap request to a host of the
client's choosing. Such a signature names the address it was made for (`peer_auth`), so it cannot be
replayed to another server; this module keeps it from being made at all.

With a secret, a process signs only for:
- the addresses its operator listed in SGLANG_PD_BOOTSTRAP_ADDRESSES: `host` (any port of that host) or
  `host:port`, comma-separated;
- on prefill, its own bootstrap server: this host's own names at its bootstrap port, and the host of its
  --dist-init-addr (node 0 of a multi-node prefill) at any port (taken from its server arguments before
  SGLang's KV manager registers its ranks).

A request for any other address is not sent: the scheduler's hook answers 403 in its place, counts it
(`bootstrap_addresses_refused_total`) and logs it once per address. A decode's HTTP process refuses a
request naming such an address with HTTP 400 before the request is queued. A decode with a secret and an
empty list could pair with no prefill: it refuses to start, naming the setting.

Without a secret nothing is signed and the list is not consulted (upstream's behaviour; `peer_sources`
keeps other hosts off the sockets).

Thread-safe: the scheduler's transfer threads share one instance; the own-address set and the counts each have a lock.
"""

from __future__ import annotations

import threading
from typing import Iterable
from urllib.parse import urlsplit

from sglang_pd.config import BOOTSTRAP_ADDRESSES
from sglang_pd.srt.auth.peer_sources import CappedCounts, normalize_address, this_host_names

# SGLang's warm-up request to a decode names this host (disaggregation/utils.py FAKE_BOOTSTRAP_HOST): decode
# then uses its fake receiver and contacts no bootstrap server, so there is nothing to sign.
SGLANG_FAKE_BOOTSTRAP_HOST = "2.2.2.2"
MAX_ADDRESSES = 256  # refusals counted (and logged once) per address; later addresses share one row
OTHER_ADDRESSES = "other"


def _host(host: str) -> str:
    return normalize_address(host.strip("[]")).lower()


class BootstrapAddresses:
    """Decides whether a bootstrap request to (host, port) may be signed (see the module docstring)."""

    def __init__(self, configured: Iterable[tuple[str, int | None]] = ()):
        """`configured`: (host, port or None for any port) pairs, as `config` parsed them. Callers consult it
        only when a secret is set (without one nothing is signed)."""
        self.configured = frozenset((_host(h), p) for h, p in configured)
        self._own: set[tuple[str, int | None]] = set()
        self._refused = CappedCounts(MAX_ADDRESSES, OTHER_ADDRESSES)
        self._lock = threading.Lock()

    def add_own(self, hosts: Iterable[str], port: int | None) -> None:
        """Prefill: its own bootstrap server listens at `port` (None: any) under each of `hosts`."""
        with self._lock:
            self._own.update((_host(h), port) for h in hosts if h)

    def add_prefill_own(self, host: str | None, bootstrap_port: int, dist_init_addr: str | None) -> None:
        """Prefill: its bootstrap server under any name of this host (`host`: the address it was told to bind)
        at its port, and the host of its --dist-init-addr (node 0 of a multi-node prefill, whose port SGLang
        syncs between nodes) at any port."""
        self.add_own(this_host_names(str(host or "")), int(bootstrap_port))
        if dist_init_addr:
            self.add_own([str(dist_init_addr).rsplit(":", 1)[0]], None)

    def allows(self, host: str, port: int | None) -> bool:
        """Whether a request to host:port may be signed."""
        keys = {(_host(host), None), (_host(host), port)}
        if keys & self.configured:
            return True
        with self._lock:
            return bool(keys & self._own)

    def allows_url(self, url: str) -> bool:
        """`allows` for the host and port a URL names (port 80 when it names none: what requests uses)."""
        parts = urlsplit(url)
        return self.allows(parts.hostname or "", parts.port or 80)

    def start_up_problem(self, mode: str, authenticated: bool) -> str | None:
        """Why a server in `mode` ("prefill"/"decode"/...), with a secret or not, must not start with this list."""
        if authenticated and mode == "decode" and not self.configured:
            return (f"a decode server with SGLANG_PD_PEER_SECRET_FILE signs its bootstrap requests only for the "
                    f"prefill bootstrap addresses listed in {BOOTSTRAP_ADDRESSES}, and it is empty: list every "
                    f"prefill's bootstrap host (any port) or host:port, comma-separated, e.g. "
                    f"{BOOTSTRAP_ADDRESSES}=10.0.0.5:8998,10.0.0.6")
        return None

    def request_problem(self, mode: str, authenticated: bool, host, port, default_port: int) -> str | None:
        """Why a request to a `mode` server naming bootstrap `host` / `port` (None: the server's `default_port`,
        SGLang's rule) must be refused, or None: on a decode with a secret, an address it does not sign for
        (SGLang's own warm-up host, which no bootstrap request follows, passes).
        A host that is not a string was refused by the pairing check already."""
        if mode != "decode" or not authenticated or not isinstance(host, str) or host == SGLANG_FAKE_BOOTSTRAP_HOST:
            return None
        port = default_port if port is None else port
        return None if self.allows(host, port) else self.refusal(host, port)

    def refusal(self, host: str, port: int | None) -> str:
        """The error a client or SGLang reads for a request naming an address outside the list."""
        shown = f"{host}:{port}" if port is not None else host
        return (f"bootstrap address {shown} is not one this server signs for: with SGLANG_PD_PEER_SECRET_FILE, "
                f"bootstrap requests go only to the addresses in {BOOTSTRAP_ADDRESSES} "
                f"({self.listed()}) and, on prefill, its own bootstrap server")

    def refuse(self, netloc: str) -> bool:
        """Count one request not sent to `netloc`; True the first time it is refused (log it then)."""
        row, new = self._refused.add(netloc)
        return new and row != OTHER_ADDRESSES

    def listed(self) -> str:
        """The configured list as written back (`host` or `host:port`), or "empty"."""
        return ", ".join(sorted(h if p is None else f"{h}:{p}" for h, p in self.configured)) or "empty"

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats."""
        with self._lock:
            own = sorted(h if p is None else f"{h}:{p}" for h, p in self._own)
        return {"configured": self.listed(), "own": own, "refused": self._refused.snapshot()}
