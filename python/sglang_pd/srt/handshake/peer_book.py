"""The gate's table of registered peers: when each was last used, the pool bounds its registration
carried (pool_bounds.py), the longest-idle one forgotten when SGLang's registration table is full, and
the check of a transfer info's destination indices against the pools its peer registered.

Used by the gate from the rank socket's reader only (no lock). Pure; the host is a `GateHost`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable

from sglang_pd.srt.handshake.gate_host import GateHost, PeerRecord, PeerRemoval
from sglang_pd.srt.wire import PoolBounds, beyond_state_pools
from sglang_pd.srt.wire import Verdict

logger = logging.getLogger(__name__)
PEER_IDLE_S = 600.0  # a registration no message used for this long may give its place to a new peer


class PeerBook:
    """Per peer name: last use and pool bounds, each bounded to 2 x `max_peers` names (names SGLang did not
    store go first). Mutating: `note_used`, `note_bounds`, `forget_an_idle_peer`; read-only: `beyond_pool`."""

    def __init__(self, host: GateHost, max_peers: int = 1024, peer_idle_s: float = PEER_IDLE_S,
                 clock: Callable[[], float] = None, on_count: Callable[[str, int], None] = lambda name, n: None):
        self.host, self.max_peers, self.peer_idle_s = host, max_peers, peer_idle_s
        self._clock, self._on_count = clock, on_count
        # peer name -> when an admitted registration or transfer info last named it, oldest first: a full
        # registration table gives the longest-idle peer's place to a new one (a decode rank that restarted
        # registers under a new name, and SGLang never forgets the old one)
        self._peer_used: OrderedDict[str, float] = OrderedDict()
        # peer name -> pool bounds its latest admitted registration carried
        self._pool_bounds: OrderedDict[str, PoolBounds] = OrderedDict()

    def __len__(self) -> int:
        """Peers whose pool bounds are known."""
        return len(self._pool_bounds)

    def beyond_pool(self, verdict: Verdict, record: PeerRecord, state_types: tuple[str, ...]) -> str | None:
        """Why a transfer info of registered peer `record` names an index outside the pools it registered
        (prefill computes base + index * item length from it), or None. KV pages: the smaller of NIXL's
        own page count and our pool-bounds frame's; aux slots: the frame's; state slots: the smaller of NIXL's
        own and the frame's, per state type (`pool_bounds.beyond_state_pools`). Unknown bounds are not checked."""
        bounds = self._pool_bounds.get(verdict.peer_name)
        known = [n for n in (record.num_slots, bounds and bounds.kv_pages) if n]
        pages, aux_slots = min(known, default=None), (bounds.aux_slots if bounds else 0) or None
        named = (("kv page indices", verdict.max_index, pages, "pages of its KV pool"),
                 ("device kv indices", verdict.max_device_index, pages, "pages of its KV pool"),
                 ("aux index", verdict.aux_index, aux_slots, "slots of its aux buffers"))
        for what, index, bound, of in named:
            if index is not None and bound is not None and index >= bound:
                return (f"transfer info for room {verdict.room}: {what} names {index}, outside the {bound} {of} "
                        f"peer {verdict.peer_name!r} registered")
        state_known = [s for s in (record.state_slots, bounds.state_slots if bounds else None) if s is not None]
        beyond = beyond_state_pools(verdict.state_spans, state_known, state_types)
        if beyond is None:
            return None
        return f"transfer info for room {verdict.room}: {beyond} peer {verdict.peer_name!r} registered"

    def note_bounds(self, name: str, pool: PoolBounds | None) -> None:
        """An admitted registration of `name`: its pool bounds replace the old ones (none: forgotten)."""
        self._pool_bounds.pop(name, None)
        if pool is None:
            return
        self._pool_bounds[name] = pool
        if len(self._pool_bounds) > 2 * self.max_peers:  # names SGLang did not store first, else the oldest
            stale = next((n for n in self._pool_bounds if self.host.registered_peer(n) is None), None)
            self._pool_bounds.pop(stale if stale is not None else next(iter(self._pool_bounds)))

    def note_used(self, name: str) -> None:
        """An admitted registration or transfer info named `name` now."""
        self._peer_used[name] = self._clock()
        self._peer_used.move_to_end(name)
        if len(self._peer_used) > 2 * self.max_peers:  # names SGLang did not store: the oldest such one out
            stale = next((n for n in self._peer_used if self.host.registered_peer(n) is None), None)
            self._peer_used.pop(stale if stale is not None else next(iter(self._peer_used)))

    def forget_an_idle_peer(self) -> bool:
        """Free one place in the full registration table: the longest-idle registered peer that no room's
        transfer info names, idle for at least `peer_idle_s` (counted, logged). False if none is."""
        now = self._clock()
        for name, used in list(self._peer_used.items()):
            if now - used < self.peer_idle_s:
                return False  # ordered: every later one was used more recently
            removal = self.host.forget_peer(name)
            if removal is PeerRemoval.IN_USE:
                self.note_used(name)  # a room still names it: idle only from now
                continue
            del self._peer_used[name]
            self._pool_bounds.pop(name, None)
            if removal is PeerRemoval.FORGOTTEN:
                self._on_count("handshake_peers_forgotten_total", 1)
                logger.warning("sglang_pd: registration table full (%d peers): forgot peer %r, unused for %.0f s, "
                               "for a new registration", self.max_peers, name, now - used)
                return True
        return False
