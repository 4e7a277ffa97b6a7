"""Which source addresses may talk to a PD server's handshake sockets and bootstrap routes.

The safe default: with no peer secret configured, only this host may talk to them. A message on a rank
socket (its ZMQ `Peer-Address`) or a bootstrap HTTP request (its remote address) from any other source is
refused before a byte of it is parsed, counted per source, and logged once per source with what to do.

"This host" is exactly the addresses its own interfaces carry (127.0.0.1, ::1 and each NIC's address,
read once at start-up), not the whole 127.0.0.0/8 block: a process can only send from an address of its
own host, and the narrower set lets a test on one box play a stranger from 127.0.0.2. An address that is
unknown (a transport without a peer address) is refused too.

With a secret every source may talk: the MAC decides (`peer_auth`). Without one, a deployment across
hosts opts out explicitly with SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS=1 (a warning at start-up and
in /sglang_pd/info).

Thread-safe: the refusal table (`CappedCounts`) has its own lock.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from typing import Iterable

from sglang_pd.secret_file import MAKE_ONE

logger = logging.getLogger(__name__)

MAX_SOURCES = 1024  # refusal counts kept per source; further sources share one row
OTHER_SOURCES = "other"
ADVICE = (f"set the same SGLANG_PD_PEER_SECRET_FILE on every PD server ({MAKE_ONE}), or run every PD server on "
          "this host, or opt out with SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS=1 (docs/security.md)")


def normalize_address(address: str) -> str:
    """`address` as one spelling: an IPv4-mapped IPv6 address as IPv4, no zone id; anything else as given."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def host_addresses() -> frozenset[str]:
    """127.0.0.1, ::1 and every address this host's interfaces carry now."""
    import psutil

    found = {"127.0.0.1", "::1"}
    for addresses in psutil.net_if_addrs().values():
        found.update(normalize_address(a.address) for a in addresses if a.family.name in ("AF_INET", "AF_INET6"))
    return frozenset(found)


def this_host_names(*extra: str) -> frozenset[str]:
    """Every name a peer may use for a server on this host: its addresses (`host_addresses`), `localhost`, the
    host name, and `extra` (e.g. the address the server was told to bind), lower-cased and normalized."""
    import socket

    names = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    names.update(normalize_address(n).lower() for n in extra if n)
    return frozenset(names) | host_addresses()


class CappedCounts:
    """Counts per key in bounded memory: at most `cap` keys get a row of their own; later keys share the row
    `other`. Thread-safe (its own lock)."""

    def __init__(self, cap: int, other: str):
        self.cap, self.other = cap, other
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, key: str) -> tuple[str, bool]:
        """Count one for `key`: (the row counted, True when that row is new)."""
        with self._lock:
            row = key if key in self._counts or len(self._counts) < self.cap else self.other
            new = row not in self._counts
            self._counts[row] = self._counts.get(row, 0) + 1
        return row, new

    def snapshot(self) -> dict[str, int]:
        """Read-only copy."""
        with self._lock:
            return dict(self._counts)


class PeerSources:
    """Decides, per source address, whether a message may be read at all (see the module docstring)."""

    def __init__(self, authenticated: bool, allow_remote: bool, local: Iterable[str] | None = None):
        """`local`: this host's addresses (default: read from its interfaces when the check is on)."""
        self.authenticated, self.allow_remote = authenticated, allow_remote
        self.checking = not authenticated and not allow_remote
        self.local = frozenset(normalize_address(a) for a in local) if local is not None else (
            host_addresses() if self.checking else frozenset())
        self._refused = CappedCounts(MAX_SOURCES, OTHER_SOURCES)

    @property
    def mode(self) -> str:
        """'authenticated' (a secret: every source, the MAC decides), 'unauthenticated-remote' (the opt-out),
        or 'this-host' (the default)."""
        if self.authenticated:
            return "authenticated"
        return "unauthenticated-remote" if self.allow_remote else "this-host"

    def admits(self, source: str, what: str) -> bool:
        """True when `source` may talk; otherwise counts the refusal and logs it the first time for `source`
        (`what` names the socket or route, e.g. 'prefill rank socket')."""
        if not self.checking or normalize_address(source) in self.local:
            return True
        if self._refused.add(source)[1]:
            logger.warning("sglang_pd: %s refused a message from %s: no peer secret is configured, so only this host "
                           "may talk to it; %s. Further refusals from this source are counted, not logged.",
                           what, source, ADVICE)
        return False

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats and /sglang_pd/info."""
        refused = self._refused.snapshot()
        return {"mode": self.mode, "refused_by_source": refused, "num_refused": sum(refused.values())}
