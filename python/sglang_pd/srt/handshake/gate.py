"""The gate every message on a PD rank socket passes before SGLang's own code sees it.

In -> out: raw frames from one peer -> the frames SGLang may parse (auth trailer removed), or None.
Steps, in order:
  1. authentication (when a secret is configured): missing, wrong, stale or replayed tags are refused
     and counted; nothing else happens (an impostor cannot fail a room by naming it);
  2. schema (`handshake_frames.check_message`): every frame a reader later touches;
  3. state: a transfer info must name a registered peer at the endpoint it registered (prefill's
     transfer worker looks it up), and its destination indices must lie inside the pools that peer
     registered (KV pages: NIXL's own page count, or our pool-bounds frame; aux slots: our frame; state
     slots per state type: NIXL's own state lengths, or our frame), so
     must the reply address of an ABORT / decline / BOOTSTRAP (prefill answers there), the registration
     table is bounded (when full, the peer unused longest, for at least `peer_idle_s`, gives its place:
     a restarted decode rank registers under a new name), AUX_DATA must name a room decode is waiting on;
     prefill: a transfer info for a room whose own request already failed here (and was cleared) is too
     late;
  4. a rejected message with a readable room fails that room (prefill: decode told when it names a
     registered peer; a room not created yet is remembered and failed when it appears).
Prefill: a transfer info's trailing prompt-digest frame (ours, prompt_binding.py) is taken off before
step 2 and recorded for its room once admitted; so is a registration's trailing pool-bounds frame (ours,
pool_bounds.py), recorded for its peer. SGLang never sees either.
A rejection is logged once per peer (with its reason) and counted per reason; no thread ends.
Admitted transfer infos are tracked so rooms nobody claims expire (`room_expiry.UnclaimedRooms`).

Used from one thread (the rank socket's reader); `snapshot` may run on another (counts are copied
under a lock).
"""

from __future__ import annotations

import base64
import enum
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from sglang_pd.srt.handshake.frames import (MAX_FRAMES, FrameLimits, MessageKind, Side, Verdict,
                                                           check_message)
from sglang_pd.srt.handshake.fields import FrameError
from sglang_pd.srt.auth.peer_auth import TRAILER_FRAMES, AuthFailure, PeerAuth
from sglang_pd.srt.handshake.pool_bounds import PoolBounds, beyond_state_pools, split_bounds
from sglang_pd.srt.handshake.prompt_binding import PromptDigests, split_digest
from sglang_pd.srt.handshake.room_expiry import RoomTombstones, UnclaimedRooms

logger = logging.getLogger(__name__)
MAX_PEERS_LOGGED = 1024
PEER_IDLE_S = 600.0  # a registration no message used for this long may give its place to a new peer
MAX_MESSAGE_FRAMES = MAX_FRAMES + TRAILER_FRAMES + 1  # the longest schema, our auth trailer, the prompt digest
SUMMARY_INTERVAL_S = 60.0


class PeerRecord(NamedTuple):
    """What a registration told this server about a peer."""

    endpoint: str
    port: int
    num_slots: int | None = None  # NIXL: pages the peer's pool has (index bound); None if unknown
    state_slots: tuple[int, ...] | None = None  # NIXL: slots per state pool (pool_bounds.state_slots); None if unknown


class Screened(NamedTuple):
    """A message past authentication and its schema check (`HandshakeGate.screen`), awaiting `decide`."""

    msg: list[bytes]             # as received (auth trailer included)
    body: list[bytes]            # what SGLang would parse (trailer, digest and pool-bounds frames off)
    digest: bytes | None         # prefill: the prompt digest frame of a transfer info
    frame_problem: str | None    # why our digest or pool-bounds frame is unreadable
    verdict: Verdict
    pool: PoolBounds | None = None  # prefill: the pool-bounds frame of a registration


class PeerRemoval(enum.Enum):
    """What `GateHost.forget_peer` did."""

    FORGOTTEN = "forgotten"   # removed from SGLang's registration table (and NIXL's remote agents)
    IN_USE = "in_use"         # a room's transfer info still names it: kept
    UNKNOWN = "unknown"       # not registered (SGLang did not store it, or it was forgotten before)


class GateHost(Protocol):
    """The KV manager as the gate sees it (implemented over SGLang's manager by the hook layer)."""

    def registered_peer(self, name: str) -> PeerRecord | None: ...
    def num_registered(self) -> int: ...
    def endpoint_registered(self, target: tuple[str, int]) -> bool: ...
    def room_claimed(self, room: int) -> bool: ...
    def fail_room(self, room: int, reason: str, notify: tuple[str, int] | None) -> bool: ...
    def drop_unclaimed(self, room: int, reason: str) -> bool: ...
    def forget_peer(self, name: str) -> PeerRemoval: ...
    def prune(self) -> None: ...
    def send_drained_tells(self) -> tuple[list[int], list[int]]: ...


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


def registered_endpoint(registered_peer: Callable[[str], PeerRecord | None], name: str,
                        target: tuple[str, int]) -> bool:
    """True when peer `name` registered exactly `target` (endpoint, port): the only kind of address prefill
    sends a room's status to, so no message can make it write where the message says (read-only)."""
    record = registered_peer(name)
    return record is not None and (record.endpoint, record.port) == target


class HandshakeGate:
    """Admit or drop each message of one rank socket. See the module docstring for the steps."""

    def __init__(self, limits: FrameLimits, host: GateHost, auth: PeerAuth | None,
                 unclaimed: UnclaimedRooms | None, tombstones: RoomTombstones | None,
                 on_count: Callable[[str, int], None] = lambda name, n: None, max_peers: int = 1024,
                 peer_idle_s: float = PEER_IDLE_S,
                 clock: Callable[[], float] = time.monotonic, capture: bool = False,
                 digests: PromptDigests | None = None, failed_rooms: RoomTombstones | None = None):
        self.limits, self.host, self.auth = limits, host, auth
        self.failed_rooms = failed_rooms  # prefill: rooms its own request failed and cleared (room_expiry.py)
        self.digests = digests  # prefill: prompt digests of admitted transfer infos (None: frame not expected)
        self.unclaimed, self.tombstones = unclaimed, tombstones
        # what decode (and a prefill half arriving later) is told about a room dropped as unclaimed
        self.unclaimed_reason = None if unclaimed is None else (
            f"sglang_pd: prefill dropped the room: no prefill request claimed it within {unclaimed.ttl_s:g} s of "
            f"decode's transfer info (SGLANG_PD_UNCLAIMED_ROOM_TTL_S) or its unclaimed-room caps were reached")
        self._on_count = on_count
        self.max_peers, self.peer_idle_s = max_peers, peer_idle_s
        # peer name -> when an admitted registration or transfer info last named it, oldest first: a full
        # registration table gives the longest-idle peer's place to a new one (a decode rank that restarted
        # registers under a new name, and SGLang never forgets the old one)
        self._peer_used: OrderedDict[str, float] = OrderedDict()
        self._clock = clock
        self.counts = GateCounts()
        self._peers: OrderedDict[str, dict] = OrderedDict()
        # peer name -> pool bounds its latest admitted registration carried (pool_bounds.py); bounded like
        # `_peer_used`
        self._pool_bounds: OrderedDict[str, PoolBounds] = OrderedDict()
        self._lock = threading.Lock()
        self._num_unlogged = 0
        self._last_summary = clock()
        # Test-only (fault injection on): the last admitted raw message of each kind, trailer included,
        # so a test can replay real traffic byte for byte.
        self.captured: dict[str, list[bytes]] | None = {} if capture else None

    # ---- entry points ---------------------------------------------------------------------------------
    def admit(self, msg: list[bytes], peer: str) -> list[bytes] | None:
        """The frames SGLang may parse, or None when the message was dropped (never raises): `screen`, then
        `decide`."""
        screened = self.screen(msg, peer)
        return None if screened is None else self.decide(screened, peer)

    def screen(self, msg: list[bytes], peer: str) -> Screened | None:
        """Steps 1-2 and the digest frame: what reads no room state, and costs the most on a large message
        (the MAC over every frame, the schema). A reader may run it before taking its hold, so a stranger's
        large message does not keep SGLang's clears waiting. None: refused by authentication (counted)."""
        with self._lock:
            self.counts.num_received += 1
        body = self._authenticate(msg, peer)
        if body is None:
            return None
        digest, problem, pool = None, None, None
        if self.digests is not None:
            try:
                body, digest = split_digest(body)
            except FrameError as exc:
                body, problem = list(body[:-1]), str(exc)
        if self.limits.side is Side.PREFILL and problem is None:
            try:
                body, pool = split_bounds(body)
            except FrameError as exc:
                body, problem = list(body[:-1]), str(exc)
        return Screened(msg, body, digest, problem, check_message(body, self.limits), pool)

    def decide(self, screened: Screened, peer: str) -> list[bytes] | None:
        """Steps 3-4 for a screened message: room and peer state, then admit (recorded) or reject (its room
        failed). Reads and changes SGLang's room tables: run where no clear can land (the reader's hold)."""
        msg, body, digest, frame_problem, verdict, pool = screened
        if frame_problem is None and digest is not None and verdict.kind is not MessageKind.TRANSFER_INFO:
            frame_problem = f"a prompt digest frame ends a {verdict.kind.value} message"
        if frame_problem is None and pool is not None and verdict.kind is not MessageKind.REGISTRATION:
            frame_problem = f"a pool bounds frame ends a {verdict.kind.value} message"
        reason = verdict.reason or (frame_problem and f"{verdict.kind.value} for room {verdict.room}: "
                                    f"{frame_problem}") or self._state_problem(verdict)
        late = None if reason is not None else self._failed_here(verdict)
        reason = reason or late
        if reason is None and verdict.kind is MessageKind.TRANSFER_INFO and self.digests is not None:
            reason = self.digests.record(verdict.room, digest)  # refused when the room serves another prompt
        if reason is not None:
            self._reject(verdict, reason, peer, bury=late is None)
            return None
        if verdict.kind is MessageKind.TRANSFER_INFO and self.unclaimed is not None:
            self.unclaimed.note(verdict.room, sum(map(len, body)))
        if verdict.kind in (MessageKind.REGISTRATION, MessageKind.TRANSFER_INFO) and verdict.peer_name is not None:
            self._note_used(verdict.peer_name)
        if verdict.kind is MessageKind.REGISTRATION and verdict.peer_name is not None:
            self._note_bounds(verdict.peer_name, pool)
        with self._lock:
            self.counts.num_admitted += 1
            if self.captured is not None:
                self.captured[verdict.kind.value] = list(msg)
        return body

    def refuse_unread(self, num_frames: int, peer: str) -> bool:
        """Before a message's frames are copied out of libzmq: True (counted, logged, dropped: no room can be
        read from it unread) when it has more frames than any PD message plus the auth trailer and digest."""
        if num_frames <= MAX_MESSAGE_FRAMES:
            return False
        with self._lock:
            self.counts.num_received += 1
            self.counts.num_unread += 1
        self._count_rejection(MessageKind.UNKNOWN, f"{num_frames} frames, more than any PD message has "
                                                   f"({MAX_MESSAGE_FRAMES} with the auth trailer and digest)", peer)
        return True

    def housekeeping(self) -> list[int]:
        """Expire unclaimed rooms (the host tells their decodes; each is tombstoned for a late prefill half),
        send the failure statuses the host held while their rooms' writes were in flight, and emit the
        periodic summary; returns rooms dropped."""
        dropped = []
        self.host.prune()
        _told, given_up = self.host.send_drained_tells()  # the host counts what it sent
        if given_up:
            self._on_count("prefill_failure_tells_dropped_total", len(given_up))
            logger.warning("sglang_pd: %d held failure status(es) dropped: the room's transfer never settled, so "
                           "its decode is left to its own waiting timeout (e.g. room %s)", len(given_up), given_up[0])
        if self.unclaimed is not None:
            reason = self.unclaimed_reason
            dropped = self.unclaimed.sweep(self.host.room_claimed, lambda room: self.host.drop_unclaimed(room, reason))
            if self.tombstones is not None:  # decode was told; a prefill half arriving now fails at once
                for room in dropped:
                    self.tombstones.bury(room, reason)
            if dropped:
                self._on_count("unclaimed_rooms_expired_total", len(dropped))
                logger.warning("sglang_pd: dropped transfer infos of %d room(s) no request claimed within %.0f s "
                               "(e.g. room %s)", len(dropped), self.unclaimed.ttl_s, dropped[0])
        now = self._clock()
        if self._num_unlogged and now - self._last_summary >= SUMMARY_INTERVAL_S:
            logger.warning("sglang_pd: %d more handshake message(s) dropped on the %s rank socket since the last "
                           "report; per-peer counts in /sglang_pd/stats (handshake)", self._num_unlogged,
                           self.limits.side.value)
            self._num_unlogged, self._last_summary = 0, now
        return dropped

    def count_external_rejection(self, kind: str) -> None:
        """Count a message this gate admitted that a later check refused (NIXL's metadata parse)."""
        with self._lock:
            table = self.counts.refused_after_admit
            table[kind] = table.get(kind, 0) + 1

    # ---- steps ----------------------------------------------------------------------------------------
    def _authenticate(self, msg: list[bytes], peer: str) -> list[bytes] | None:
        if self.auth is None:
            if PeerAuth.has_trailer(msg):
                with self._lock:
                    self.counts.num_unsigned_accepted += 1
                self._note_peer(peer, "sglang_pd: a peer signs its messages but this server has no "
                                      "SGLANG_PD_PEER_SECRET_FILE (accepted unverified; set the same secret on every "
                                      "PD server)", "unsigned")
                return list(msg[:-TRAILER_FRAMES])
            return msg
        verdict = self.auth.verify_frames(msg)
        if verdict.failure is None:
            return verdict.frames
        with self._lock:
            key = verdict.failure.value
            self.counts.auth_refused[key] = self.counts.auth_refused.get(key, 0) + 1
        self._on_count("peer_auth_refused_total", 1)
        self._note_peer(peer, f"sglang_pd: {self.limits.side.value} refused a message: {_AUTH_TEXT[verdict.failure]}",
                        verdict.failure.value)
        return None

    def _state_problem(self, verdict: Verdict) -> str | None:
        kind = verdict.kind
        if kind is MessageKind.TRANSFER_INFO:
            record = self.host.registered_peer(verdict.peer_name)
            if record is None:
                return f"transfer info for room {verdict.room} names peer {verdict.peer_name!r}, which never registered"
            if (record.endpoint, record.port) != verdict.reply_to:
                return (f"transfer info for room {verdict.room} names {verdict.reply_to}, but peer "
                        f"{verdict.peer_name!r} registered {(record.endpoint, record.port)}")
            beyond = self._beyond_pool(verdict, record)
            if beyond is not None:
                self._on_count("transfer_infos_out_of_pool_total", 1)
                with self._lock:
                    self.counts.num_out_of_pool += 1
                return beyond
        if kind is MessageKind.REGISTRATION:
            if (self.host.registered_peer(verdict.peer_name) is None and self.host.num_registered() >= self.max_peers
                    and not self._forget_an_idle_peer()):
                return (f"registration of {verdict.peer_name!r} refused: {self.max_peers} peers already registered, "
                        f"none idle for {self.peer_idle_s:g} s")
        if (kind in _ANSWERED_AT_REPLY_TO and self.limits.side is Side.PREFILL and verdict.reply_to is not None
                and not self.host.endpoint_registered(verdict.reply_to)):
            # upstream answers it there (ABORT_ACK; a deferred bootstrap's status), through a socket it opens
            # and caches per address: an address no peer registered would make prefill connect where a
            # stranger says, one cached socket per address named
            return (f"{kind.value} for room {verdict.room} asks for an answer at {verdict.reply_to}, an endpoint no "
                    f"registered peer has")
        if kind is MessageKind.AUX_DATA and not self.host.room_claimed(verdict.room):
            return f"AUX_DATA for room {verdict.room}, which this decode is not waiting on"
        return None

    def _beyond_pool(self, verdict: Verdict, record: PeerRecord) -> str | None:
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
        beyond = beyond_state_pools(verdict.state_spans, state_known, self.limits.state_types)
        if beyond is None:
            return None
        return f"transfer info for room {verdict.room}: {beyond} peer {verdict.peer_name!r} registered"

    def _note_bounds(self, name: str, pool: PoolBounds | None) -> None:
        """An admitted registration of `name`: its pool bounds replace the old ones (none: forgotten)."""
        self._pool_bounds.pop(name, None)
        if pool is None:
            return
        self._pool_bounds[name] = pool
        if len(self._pool_bounds) > 2 * self.max_peers:  # names SGLang did not store first, else the oldest
            stale = next((n for n in self._pool_bounds if self.host.registered_peer(n) is None), None)
            self._pool_bounds.pop(stale if stale is not None else next(iter(self._pool_bounds)))

    def _note_used(self, name: str) -> None:
        self._peer_used[name] = self._clock()
        self._peer_used.move_to_end(name)
        if len(self._peer_used) > 2 * self.max_peers:  # names SGLang did not store: the oldest such one out
            stale = next((n for n in self._peer_used if self.host.registered_peer(n) is None), None)
            self._peer_used.pop(stale if stale is not None else next(iter(self._peer_used)))

    def _forget_an_idle_peer(self) -> bool:
        """Free one place in the full registration table: the longest-idle registered peer that no room's
        transfer info names, idle for at least `peer_idle_s` (counted, logged). False if none is."""
        now = self._clock()
        for name, used in list(self._peer_used.items()):
            if now - used < self.peer_idle_s:
                return False  # ordered: every later one was used more recently
            removal = self.host.forget_peer(name)
            if removal is PeerRemoval.IN_USE:
                self._note_used(name)  # a room still names it: idle only from now
                continue
            del self._peer_used[name]
            self._pool_bounds.pop(name, None)
            if removal is PeerRemoval.FORGOTTEN:
                self._on_count("handshake_peers_forgotten_total", 1)
                logger.warning("sglang_pd: registration table full (%d peers): forgot peer %r, unused for %.0f s, "
                               "for a new registration", self.max_peers, name, now - used)
                return True
        return False

    def _failed_here(self, verdict: Verdict) -> str | None:
        """Prefill: why a transfer info is too late, when its room's own request failed here and was cleared
        (no request claims the room now). SGLang would re-create the room and decode would hold its lock
        and pages until the room expires as unclaimed; refused, decode is told at once."""
        if verdict.kind is not MessageKind.TRANSFER_INFO or self.failed_rooms is None:
            return None
        why = self.failed_rooms.reason(verdict.room)
        if why is None or self.host.room_claimed(verdict.room):
            return None
        self._on_count("late_transfer_infos_refused_total", 1)
        with self._lock:
            self.counts.num_late_transfer_infos += 1
        return f"transfer info for room {verdict.room} arrived after prefill's request for it had failed: {why}"

    def _reject(self, verdict: Verdict, reason: str, peer: str, bury: bool = True) -> None:
        """Count and log a refused message; fail its room (telling a registered decode). `bury`: remember a
        room that did not exist yet, so its request fails when it appears (not for a room already ended)."""
        text = self._count_rejection(verdict.kind, reason, peer)
        if verdict.room is None:
            return
        notify = self._notify_target(verdict)
        existed = self.host.fail_room(verdict.room, text, notify)
        if bury and not existed and self.tombstones is not None and self.limits.side is Side.PREFILL:
            self.tombstones.bury(verdict.room, text)
        with self._lock:
            self.counts.num_rooms_failed += 1
        self._on_count("handshake_rooms_failed_total", 1)

    def _count_rejection(self, kind: MessageKind, reason: str, peer: str) -> str:
        """Count a rejected message of `kind` and log it once per peer; returns the logged text."""
        with self._lock:
            self.counts.rejected[kind.value] = self.counts.rejected.get(kind.value, 0) + 1
        self._on_count("handshake_messages_rejected_total", 1)
        text = f"sglang_pd: rejected by {self.limits.side.value}: {reason}"
        self._note_peer(peer, text, kind.value)
        return text

    def _notify_target(self, verdict: Verdict) -> tuple[str, int] | None:
        """Where to tell decode: only the endpoint of a peer that registered it (never an arbitrary one)."""
        if self.limits.side is not Side.PREFILL or verdict.peer_name is None:
            return None
        if not registered_endpoint(self.host.registered_peer, verdict.peer_name, verdict.reply_to):
            return None
        return verdict.reply_to

    def _note_peer(self, peer: str, text: str, key: str) -> None:
        """Log the first event of each peer; count the rest (bounded table, oldest peer evicted)."""
        with self._lock:
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

    def snapshot(self) -> dict:
        """Read-only view for /sglang_pd/stats."""
        with self._lock:
            counts = self.counts
            view = {
                "side": self.limits.side.value, "backend": self.limits.backend,
                "auth": "hmac-sha256" if self.auth else "off",
                "num_received": counts.num_received, "num_admitted": counts.num_admitted,
                "rejected": dict(counts.rejected), "auth_refused": dict(counts.auth_refused),
                "num_rooms_failed": counts.num_rooms_failed, "num_unsigned_accepted": counts.num_unsigned_accepted,
                "refused_after_admit": dict(counts.refused_after_admit),
                "num_late_transfer_infos": counts.num_late_transfer_infos, "num_unread": counts.num_unread,
                "num_out_of_pool": counts.num_out_of_pool, "num_peers_with_pool_bounds": len(self._pool_bounds),
                "peers": {p: {**e, "by_reason": dict(e["by_reason"])} for p, e in self._peers.items()},
                "max_frame_bytes": self.limits.max_frame_bytes, "max_kv_pages": self.limits.max_kv_pages,
            }
        if self.unclaimed is not None:
            view["unclaimed_rooms"] = self.unclaimed.snapshot()
        if self.tombstones is not None:
            view["num_tombstones"] = len(self.tombstones)
        if self.failed_rooms is not None:
            view["num_failed_rooms"] = len(self.failed_rooms)
        if self.digests is not None:
            view["prompt_digests"] = self.digests.snapshot()
        if self.captured is not None:
            with self._lock:
                view["captured"] = {k: [base64.b64encode(f).decode() for f in m] for k, m in self.captured.items()}
        return view


# Messages prefill answers at the address they carry (upstream's ABORT_ACK, a deferred bootstrap's status).
_ANSWERED_AT_REPLY_TO = (MessageKind.ABORT, MessageKind.DECLINE, MessageKind.BOOTSTRAP)

_AUTH_TEXT = {
    AuthFailure.MISSING: "message has no auth tag (peer without SGLANG_PD_PEER_SECRET_FILE, or an impostor)",
    AuthFailure.MALFORMED: "auth tag is malformed",
    AuthFailure.UNKNOWN_KEY: "auth tag names a key this server does not hold (secret not rotated everywhere?)",
    AuthFailure.BAD_MAC: "auth tag does not match (wrong secret, or the message was altered)",
    AuthFailure.STALE: "auth timestamp outside the accepted window (replay, or clocks out of sync)",
    AuthFailure.REPLAYED: "message replayed (nonce already seen)",
    AuthFailure.OVERLOADED: "replay memory full; message refused",
    AuthFailure.BEFORE_START: "auth timestamp before this process started (replay across a restart, or clocks out of sync)",
}
