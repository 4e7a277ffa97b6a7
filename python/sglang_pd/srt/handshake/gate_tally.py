"""The gate's bookkeeping: its running counts, the one log line per peer, the periodic summary, and
(test-only) the last admitted message of each kind.

One source for /sglang_pd/stats (`handshake.gate`) and the Prometheus counters the gate bumps. Written
by the rank socket's reader; `snapshot` may run on another thread (everything is copied under the lock).
"""

from __future__ import annotations

import base64
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from sglang_pd.srt.auth import AuthFailure

logger = logging.getLogger(__name__)
MAX_PEERS_LOGGED = 1024
SUMMARY_INTERVAL_S = 60.0

AUTH_TEXT = {
    AuthFailure.MISSING: "message has no auth tag (peer without SGLANG_PD_PEER_SECRET_FILE, or an impostor)",
    AuthFailure.MALFORMED: "auth tag is malformed",
    AuthFailure.UNKNOWN_KEY: "auth tag names a key this server does not hold (secret not rotated everywhere?)",
    AuthFailure.BAD_MAC: "auth tag does not match (wrong secret, the message was altered, or it was signed for another "
                         "receiver: a replay to another rank or server)",
    AuthFailure.STALE: "auth timestamp outside the accepted window (replay, or clocks out of sync)",
    AuthFailure.REPLAYED: "message replayed (nonce already seen)",
    AuthFailure.OVERLOADED: "replay memory full; message refused",
    AuthFailure.BEFORE_START: "auth timestamp before this process started (replay across a restart, or clocks out of sync)",
    AuthFailure.WRONG_RECEIVER: "signed for another server (a replay, or a peer using another address for this one)",
}


@dataclass
class GateCounts:
    """Running totals (one source for /sglang_pd/stats and the Prometheus counters)."""

    num_received: int = 0
    num_admitted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)       # MessageKind -> count
    auth_refused: dict[str, int] = field(default_factory=dict)   # AuthFailure -> count
    num_rooms_failed: int = 0
    num_unsigned_accepted: int = 0   # signed by a peer while this server has no secret (trailer stripped)
    refused_after_admit: dict[str, int] = field(default_factory=dict)  # admitted here, refused by a later check
    num_late_transfer_infos: int = 0  # prefill: transfer infos for a room its own request had failed
    num_unread: int = 0  # dropped before their frames were read: more frames than any PD message (also in rejected)
    num_out_of_pool: int = 0  # transfer infos naming an index beyond the registered pool (also in rejected)
    num_source_refused: int = 0  # dropped unread: no secret, and the source is not this host (PeerSources)


class GateTally:
    """Counts (`counts`, under `lock`), the per-peer log table (bounded, oldest peer evicted) and the
    captured messages. Mutating: `add`, `add_to`, `note_peer`, `capture`, `summary_due`."""

    def __init__(self, side: str, clock: Callable[[], float], capture: bool = False):
        self.side, self._clock = side, clock
        self.counts = GateCounts()
        self.lock = threading.Lock()
        self._peers: OrderedDict[str, dict] = OrderedDict()
        self._num_unlogged = 0
        self._last_summary = clock()
        # Test-only (fault injection on): the last admitted raw message of each kind, trailer included,
        # so a test can replay real traffic byte for byte.
        self.captured: dict[str, list[bytes]] | None = {} if capture else None

    def add(self, name: str, n: int = 1) -> None:
        """counts.<name> += n."""
        with self.lock:
            setattr(self.counts, name, getattr(self.counts, name) + n)

    def add_to(self, table: str, key: str) -> None:
        """counts.<table>[key] += 1."""
        with self.lock:
            counts = getattr(self.counts, table)
            counts[key] = counts.get(key, 0) + 1

    def capture(self, kind: str, msg: list[bytes]) -> None:
        """Keep `msg` as the last admitted one of `kind` (only when capturing)."""
        if self.captured is not None:
            with self.lock:
                self.captured[kind] = list(msg)

    def note_peer(self, peer: str, text: str, key: str) -> None:
        """Log the first event of each peer; count the rest."""
        with self.lock:
            entry = self._peers.get(peer)
            first = entry is None
            if first:
                entry = {"dropped": 0, "first": text, "by_reason": {}}
                self._peers[peer] = entry
                while len(self._peers) > MAX_PEERS_LOGGED:
                    self._peers.popitem(last=False)
            entry["dropped"] += 1
            entry["last"] = text
            entry["by_reason"][key] = entry["by_reason"].get(key, 0) + 1
            if not first:
                self._num_unlogged += 1
        if first:
            logger.warning("%s (peer %s; further messages from this peer are counted, not logged)", text, peer)

    def log_summary(self) -> None:
        """At most once per SUMMARY_INTERVAL_S, one line for the events not logged since the last one."""
        now = self._clock()
        if self._num_unlogged and now - self._last_summary >= SUMMARY_INTERVAL_S:
            logger.warning("sglang_pd: %d more handshake message(s) dropped on the %s rank socket since the last "
                           "report; per-peer counts in /sglang_pd/stats (handshake)", self._num_unlogged, self.side)
            self._num_unlogged, self._last_summary = 0, now

    def snapshot(self) -> dict:
        """Read-only copy of the counts, the peer table and the captured messages (base64)."""
        with self.lock:
            counts = self.counts
            view = {
                "num_received": counts.num_received, "num_admitted": counts.num_admitted,
                "rejected": dict(counts.rejected), "auth_refused": dict(counts.auth_refused),
                "num_rooms_failed": counts.num_rooms_failed, "num_unsigned_accepted": counts.num_unsigned_accepted,
                "refused_after_admit": dict(counts.refused_after_admit),
                "num_late_transfer_infos": counts.num_late_transfer_infos, "num_unread": counts.num_unread,
                "num_out_of_pool": counts.num_out_of_pool, "num_source_refused": counts.num_source_refused,
                "peers": {p: {**e, "by_reason": dict(e["by_reason"])} for p, e in self._peers.items()},
            }
            if self.captured is not None:
                view["captured"] = {k: [base64.b64encode(f).decode() for f in m] for k, m in self.captured.items()}
        return view
