"""What one process holds to guard its PD peers: keys, the rank socket's gate, the thread watch.

Built by `srt/state.py` from the settings (keys, room TTL); completed by the hooks (`srt/hooks/`):
the gate and watch when SGLang builds its KV manager (scheduler process), the HTTP counts when the
bootstrap server starts (prefill's HTTP process). Read by /sglang_pd/stats and the /health check through `snapshot()`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sglang_pd.srt.auth import BootstrapAddresses, CurveKeys, PeerSources, derive_keys
from sglang_pd.srt.handshake.gate import HandshakeGate
from sglang_pd.srt.auth import PeerAuth
from sglang_pd.srt.wire import OutgoingDigests, PromptDigests, ReceivedKvDigests, SentKvDigests
from sglang_pd.srt.handshake.room_expiry import RoomTombstones
from sglang_pd.srt.threads import ThreadWatch

logger = logging.getLogger(__name__)

UNAUTHENTICATED_WARNING = (
    "SGLANG_PD_PEER_SECRET_FILE is not set: PD peers are NOT authenticated, so only this host may talk to this "
    "server's bootstrap routes and rank sockets (other sources are refused unread). For PD servers on several "
    "hosts set the same secret file on every one (docs/security.md)")
REMOTE_UNAUTHENTICATED_WARNING = (
    "SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS=1 and no SGLANG_PD_PEER_SECRET_FILE: any process on any host that "
    "can reach this server's bootstrap port or rank socket can register as a prefill rank or decode peer, claim a "
    "waiting request's KV (users' prompts), write KV into decode's pool and mark transfers done (docs/security.md)")


def load_auth(secret_file: Path | None, max_skew_s: float) -> PeerAuth | None:
    """PeerAuth from the secret file (already checked by Settings), or None when no file is configured."""
    return None if secret_file is None else PeerAuth.from_file(secret_file, max_skew_s)


def build_peer_guard(secret_file: Path | None, max_skew_s: float, curve: bool, room_ttl_s: float,
                     allow_remote: bool = False, kv_digest: bool = False,
                     bootstrap_addresses: tuple = ()) -> PeerGuard:
    """The guard of one process from its settings (Settings refused `curve` and `bootstrap_addresses` without a
    secret file, and `allow_remote` with one)."""
    auth = load_auth(secret_file, max_skew_s)
    return PeerGuard(auth=auth, curve=derive_keys(auth) if curve else None, room_ttl_s=room_ttl_s,
                     sources=PeerSources(authenticated=auth is not None, allow_remote=allow_remote),
                     kv_digest=kv_digest,
                     bootstrap_addresses=BootstrapAddresses(bootstrap_addresses))


def start_up_line(guard: "PeerGuard") -> str:
    """What the HTTP process logs at start-up about its peers."""
    if guard.auth is not None:
        return f"PD peers authenticated (HMAC-SHA256; key ids {', '.join(guard.auth.key_ids)})"
    if guard.sources.allow_remote:
        return f"WARNING: {REMOTE_UNAUTHENTICATED_WARNING}"
    return f"WARNING: {UNAUTHENTICATED_WARNING}"


@dataclass
class HttpGuardCounts:
    """Bootstrap HTTP requests refused by the server guard (prefill's HTTP process)."""

    auth_refused: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    route_moves_refused: dict[str, int] = field(default_factory=dict)
    peers_logged: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, table: str, key: str, peer: str, line: str) -> None:
        """Count one refusal; log `line` the first time `peer` is refused."""
        with self.lock:
            counts = getattr(self, table)
            counts[key] = counts.get(key, 0) + 1
            first = peer not in self.peers_logged and len(self.peers_logged) < 1024
            if first:
                self.peers_logged.add(peer)
        if first:
            logger.warning("%s (peer %s; further refusals from this peer are counted, not logged)", line, peer)

    def snapshot(self) -> dict:
        """Read-only copy."""
        with self.lock:
            return {"auth_refused": dict(self.auth_refused), "malformed": dict(self.malformed),
                    "route_moves_refused": dict(self.route_moves_refused)}


@dataclass
class PeerGuard:
    """Per-process guard objects (None until the matching SGLang object exists here)."""

    auth: PeerAuth | None = None
    curve: CurveKeys | None = None               # SGLANG_PD_PEER_CURVE=1: the rank sockets' key pair
    room_ttl_s: float = 120.0                   # SGLANG_PD_UNCLAIMED_ROOM_TTL_S
    sources: PeerSources = field(default_factory=lambda: PeerSources(authenticated=False, allow_remote=False))
    gate: HandshakeGate | None = None
    watch: ThreadWatch | None = None
    tombstones: RoomTombstones | None = None     # prefill: rooms a rejected message failed before their request
    failed_rooms: RoomTombstones | None = None   # prefill: rooms their own request failed (late transfer infos)
    digests: PromptDigests | None = None         # prefill: prompt digests of admitted transfer infos
    outgoing: OutgoingDigests = field(default_factory=OutgoingDigests)  # decode: digest of the info being sent
    endpoint: str | None = None                 # this scheduler's rank socket, tcp://ip:port
    rooms_view: Callable[[], dict] | None = None
    host: object | None = None                  # the gate's view of SGLang's manager (claimed rooms)
    pool: dict | None = None                    # this manager's KV layout (what a peer must register against)
    http: HttpGuardCounts = field(default_factory=HttpGuardCounts)
    num_gate_errors: int = 0
    bootstrap_hold: str | None = None           # prefill: clears kept out of the bootstrap thread's handling?
    declining: set[int] = field(default_factory=set)  # prefill: rooms being answered as decode declined them
    kv_digest: bool = False                     # SGLANG_PD_KV_DIGEST resolved (wire/kv_digest.py)
    sent_kv: SentKvDigests = field(default_factory=SentKvDigests)  # prefill: digests awaiting their status
    received_kv: ReceivedKvDigests = field(default_factory=ReceivedKvDigests)  # decode: digests awaiting a check
    bootstrap_addresses: BootstrapAddresses = field(default_factory=BootstrapAddresses)  # signed for (secret)

    def dead_threads(self) -> dict[str, str]:
        """Dead PD threads of this process (name -> role); empty when none or not watched."""
        return self.watch.dead() if self.watch else {}

    def transfer_infos_held(self) -> bool:
        """Whether SGLang's manager holds its transfer infos in our HeldRooms now (read from the live manager:
        a manager that replaced the table since start-up shows False)."""
        from sglang_pd.srt.handshake.sockets import HeldRooms

        mgr = getattr(self.host, "mgr", None)
        return isinstance(getattr(mgr, "transfer_infos", None), HeldRooms)

    def snapshot(self) -> dict:
        """JSON-able view for /sglang_pd/stats (`handshake`)."""
        view = {
            "auth": "hmac-sha256" if self.auth else "off",
            "key_ids": self.auth.key_ids if self.auth else [],
            "curve": "on" if self.curve else "off",
            "sources": self.sources.snapshot(),
            "endpoint": self.endpoint,
            "pool": self.pool,
            "gate": self.gate.snapshot() if self.gate else None,
            "threads": self.watch.snapshot() if self.watch else None,
            "http": self.http.snapshot(),
            "num_gate_errors": self.num_gate_errors,
            "bootstrap_hold": self.bootstrap_hold,
            "transfer_infos_held": self.transfer_infos_held(),
            "num_prompt_digests_sent": self.outgoing.num_sent,
            "bootstrap_addresses": self.bootstrap_addresses.snapshot() if self.auth else None,
            "kv_digest": {"on": self.kv_digest, "sent": self.sent_kv.snapshot(), "received": self.received_kv.snapshot()},
        }
        if self.rooms_view is not None:
            try:
                view["rooms"] = self.rooms_view()
            except RuntimeError:  # a table changed size under us; the next call will see it
                view["rooms"] = None
        return view
