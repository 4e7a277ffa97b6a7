"""The gate every message on a PD rank socket passes before SGLang's own code sees it.

In -> out: raw frames from one peer -> the frames SGLang may parse (auth trailer removed), or None.
Steps, in order:
  0. source (no secret configured): only this host may send (`PeerSources`); anything else is dropped unread;
  1. authentication (when a secret is configured): missing, wrong, stale or replayed tags are refused
     and counted; nothing else happens (an impostor cannot fail a room by naming it);
  2. schema (`frames.check_message`, by the catalogue's entry for the message): every frame a reader
     later touches;
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
pool_bounds.py), recorded for its peer (peer_book.py). Decode: a transfer status's trailing KV digest frame
(ours, kv_digest.py) is taken off and recorded for its room. SGLang never sees any of them; the catalogue
says which kinds may carry each (catalogue.py), any other kind ending with one is refused.
A rejection is logged once per peer (with its reason) and counted per reason (gate_tally.py); no thread ends.
Admitted transfer infos are tracked so rooms nobody claims expire (`room_expiry.UnclaimedRooms`).

Used from one thread (the rank socket's reader); `snapshot` may run on another (counts are copied
under a lock).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, NamedTuple

from sglang_pd.srt.auth import TRAILER_FRAMES, PeerAuth, PeerSources
from sglang_pd.srt.wire import (AUTH_TRAILER, KV_DIGEST, MAX_FRAMES, POOL_BOUNDS, PROMPT_DIGEST, MessageKind,
                                               ReceivedKvDigests, appended_frames, max_appended, side_appends,
                                               split_kv_digest)
from sglang_pd.srt.wire import FrameError, FrameLimits, Side
from sglang_pd.srt.wire import check_message
from sglang_pd.srt.handshake.gate_host import GateHost, registered_endpoint
from sglang_pd.srt.handshake.gate_tally import AUTH_TEXT, GateCounts, GateTally
from sglang_pd.srt.handshake.peer_book import PEER_IDLE_S, PeerBook
from sglang_pd.srt.wire import PoolBounds, split_bounds
from sglang_pd.srt.wire import PromptDigests, split_digest
from sglang_pd.srt.handshake.room_expiry import RoomTombstones, UnclaimedRooms
from sglang_pd.srt.wire import Verdict

logger = logging.getLogger(__name__)
# the longest schema, the auth trailer, the frames we append (catalogue.py)
MAX_MESSAGE_FRAMES = MAX_FRAMES + len(AUTH_TRAILER) + max_appended()


class Screened(NamedTuple):
    """A message past authentication and its schema check (`HandshakeGate.screen`), awaiting `decide`."""

    msg: list[bytes]             # as received (auth trailer included)
    body: list[bytes]            # what SGLang would parse (trailer, digest and pool-bounds frames off)
    digest: bytes | None         # prefill: the prompt digest frame of a transfer info
    frame_problem: str | None    # why our digest or pool-bounds frame is unreadable
    verdict: Verdict
    pool: PoolBounds | None = None  # prefill: the pool-bounds frame of a registration
    kv_digest: bytes | None = None  # decode: the KV digest frame of a transfer status (wire/kv_digest.py)


class HandshakeGate:
    """Admit or drop each message of one rank socket. See the module docstring for the steps."""

    def __init__(self, limits: FrameLimits, host: GateHost, auth: PeerAuth | None,
                 unclaimed: UnclaimedRooms | None, tombstones: RoomTombstones | None,
                 on_count: Callable[[str, int], None] = lambda name, n: None, max_peers: int = 1024,
                 peer_idle_s: float = PEER_IDLE_S,
                 clock: Callable[[], float] = time.monotonic, capture: bool = False,
                 digests: PromptDigests | None = None, failed_rooms: RoomTombstones | None = None,
                 sources: PeerSources | None = None, receiver: bytes = b"",
                 kv_digests: ReceivedKvDigests | None = None):
        """`sources`: who may send at all (step 0, `refuse_source`); None: every source (unit tests of the
        later steps; the hook always passes the process's). `receiver`: this socket's advertised `host:port`,
        which a signed message must have been signed for (`receiver_name`)."""
        self.limits, self.host, self.auth = limits, host, auth
        self.receiver = receiver
        self.sources = sources
        self.failed_rooms = failed_rooms  # prefill: rooms its own request failed and cleared (room_expiry.py)
        self.digests = digests  # prefill: prompt digests of admitted transfer infos (None: frame not expected)
        self.kv_digests = kv_digests  # decode: KV digests of admitted statuses (None: digests off, frame ignored)
        self.unclaimed, self.tombstones = unclaimed, tombstones
        # what decode (and a prefill half arriving later) is told about a room dropped as unclaimed
        self.unclaimed_reason = None if unclaimed is None else (
            f"sglang_pd: prefill dropped the room: no prefill request claimed it within {unclaimed.ttl_s:g} s of "
            f"decode's transfer info (SGLANG_PD_UNCLAIMED_ROOM_TTL_S) or its unclaimed-room caps were reached")
        self._on_count = on_count
        self.max_peers, self.peer_idle_s = max_peers, peer_idle_s
        self.peers = PeerBook(host, max_peers, peer_idle_s, clock, on_count)
        self.tally = GateTally(limits.side.value, clock, capture)
        # the rank socket's messages that may end with our pool-bounds frame (catalogue.py)
        self._bounds_expected = side_appends(limits.backend, limits.side, POOL_BOUNDS)
        self._kv_expected = side_appends(limits.backend, limits.side, KV_DIGEST)  # decode's statuses may end with it

    @property
    def counts(self) -> GateCounts:
        """The running totals (read under `tally.lock` for a consistent copy)."""
        return self.tally.counts

    @property
    def captured(self) -> dict[str, list[bytes]] | None:
        """Test-only: the last admitted raw message of each kind (None unless capturing)."""
        return self.tally.captured

    # ---- entry points ---------------------------------------------------------------------------------
    def admit(self, msg: list[bytes], peer: str) -> list[bytes] | None:
        """The frames SGLang may parse, or None when the message was dropped (never raises): `screen`, then
        `decide`."""
        screened = self.screen(msg, peer)
        return None if screened is None else self.decide(screened, peer)

    def screen(self, msg: list[bytes], peer: str) -> Screened | None:
        """Steps 1-2 and our appended frames: what reads no room state, and costs the most on a large message
        (the MAC over every frame, the schema). A reader may run it before taking its hold, so a stranger's
        large message does not keep SGLang's clears waiting. None: refused by authentication (counted)."""
        self.tally.add("num_received")
        body = self._authenticate(msg, peer)
        if body is None:
            return None
        digest, problem, pool = None, None, None
        if self.digests is not None:
            try:
                body, digest = split_digest(body)
            except FrameError as exc:
                body, problem = list(body[:-1]), str(exc)
        if self._bounds_expected and problem is None:
            try:
                body, pool = split_bounds(body)
            except FrameError as exc:
                body, problem = list(body[:-1]), str(exc)
        kv = None
        if self._kv_expected and problem is None:
            try:
                body, kv = split_kv_digest(body)
            except FrameError as exc:
                body, problem = list(body[:-1]), str(exc)
        return Screened(msg, body, digest, problem, check_message(body, self.limits), pool, kv)

    def decide(self, screened: Screened, peer: str) -> list[bytes] | None:
        """Steps 3-4 for a screened message: room and peer state, then admit (recorded) or reject (its room
        failed). Reads and changes SGLang's room tables: run where no clear can land (the reader's hold)."""
        msg, body, digest, frame_problem, verdict, pool, kv = screened
        reason = verdict.reason or self._appended_problem(screened) or self._state_problem(verdict)
        late = None if reason is not None else self._failed_here(verdict)
        reason = reason or late
        if reason is None and verdict.kind is MessageKind.TRANSFER_INFO and self.digests is not None:
            reason = self.digests.record(verdict.room, digest)  # refused when the room serves another prompt
        if reason is not None:
            self._reject(verdict, reason, peer, bury=late is None)
            return None
        if verdict.kind is MessageKind.TRANSFER_INFO and self.unclaimed is not None:
            self.unclaimed.note(verdict.room, sum(map(len, body)))
        if kv is not None and self.kv_digests is not None and verdict.kind is MessageKind.STATUS \
                and verdict.room is not None:
            self.kv_digests.record(verdict.room, kv)
        if verdict.kind in (MessageKind.REGISTRATION, MessageKind.TRANSFER_INFO) and verdict.peer_name is not None:
            self.peers.note_used(verdict.peer_name)
        if verdict.kind is MessageKind.REGISTRATION and verdict.peer_name is not None:
            self.peers.note_bounds(verdict.peer_name, pool)
        self.tally.add("num_admitted")
        self.tally.capture(verdict.kind.value, msg)
        return body

    def refuse_source(self, peer: str) -> bool:
        """Step 0, before a message's frames are copied out of libzmq: True (counted, logged once per source,
        dropped) when `peer` may not talk to this socket at all (`PeerSources`: no secret, not this host)."""
        if self.sources is None or self.sources.admits(peer, f"{self.limits.side.value} rank socket"):
            return False
        self.tally.add("num_received")
        self.tally.add("num_source_refused")
        self._on_count("peer_source_refused_total", 1)
        return True

    def refuse_unread(self, num_frames: int, peer: str) -> bool:
        """Before a message's frames are copied out of libzmq: True (counted, logged, dropped: no room can be
        read from it unread) when it has more frames than any PD message plus the auth trailer and digest."""
        if num_frames <= MAX_MESSAGE_FRAMES:
            return False
        self.tally.add("num_received")
        self.tally.add("num_unread")
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
        self.tally.log_summary()
        return dropped

    def count_external_rejection(self, kind: str) -> None:
        """Count a message this gate admitted that a later check refused (NIXL's metadata parse)."""
        self.tally.add_to("refused_after_admit", kind)

    # ---- steps ----------------------------------------------------------------------------------------
    def _authenticate(self, msg: list[bytes], peer: str) -> list[bytes] | None:
        if self.auth is None:
            if PeerAuth.has_trailer(msg):
                self.tally.add("num_unsigned_accepted")
                self.tally.note_peer(peer, "sglang_pd: a peer signs its messages but this server has no "
                                           "SGLANG_PD_PEER_SECRET_FILE (accepted unverified; set the same secret on "
                                           "every PD server)", "unsigned")
                return list(msg[:-TRAILER_FRAMES])
            return msg
        verdict = self.auth.verify_frames(msg, self.receiver)
        if verdict.failure is None:
            return verdict.frames
        self.tally.add_to("auth_refused", verdict.failure.value)
        self._on_count("peer_auth_refused_total", 1)
        self.tally.note_peer(peer, f"sglang_pd: {self.limits.side.value} refused a message: "
                                   f"{AUTH_TEXT[verdict.failure]}", verdict.failure.value)
        return None

    def _appended_problem(self, screened: Screened) -> str | None:
        """Why the frames taken off a message are wrong for its kind: unreadable, or one the catalogue does
        not list for that kind (a digest ends transfer infos only, pool bounds registrations only)."""
        verdict, problem = screened.verdict, screened.frame_problem
        allowed = appended_frames(self.limits.backend, self.limits.side, verdict.kind)
        for frame, found, what in ((PROMPT_DIGEST, screened.digest, "a prompt digest frame"),
                                   (POOL_BOUNDS, screened.pool, "a pool bounds frame"),
                                   (KV_DIGEST, screened.kv_digest, "a KV digest frame")):
            if problem is None and found is not None and frame not in allowed:
                problem = f"{what} ends a {verdict.kind.value} message"
        return problem and f"{verdict.kind.value} for room {verdict.room}: {problem}"

    def _state_problem(self, verdict: Verdict) -> str | None:
        kind = verdict.kind
        if kind is MessageKind.TRANSFER_INFO:
            record = self.host.registered_peer(verdict.peer_name)
            if record is None:
                return f"transfer info for room {verdict.room} names peer {verdict.peer_name!r}, which never registered"
            if (record.endpoint, record.port) != verdict.reply_to:
                return (f"transfer info for room {verdict.room} names {verdict.reply_to}, but peer "
                        f"{verdict.peer_name!r} registered {(record.endpoint, record.port)}")
            beyond = self.peers.beyond_pool(verdict, record, self.limits.state_types)
            if beyond is not None:
                self._on_count("transfer_infos_out_of_pool_total", 1)
                self.tally.add("num_out_of_pool")
                return beyond
        if kind is MessageKind.REGISTRATION:
            if (self.host.registered_peer(verdict.peer_name) is None and self.host.num_registered() >= self.max_peers
                    and not self.peers.forget_an_idle_peer()):
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
        self.tally.add("num_late_transfer_infos")
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
        self.tally.add("num_rooms_failed")
        self._on_count("handshake_rooms_failed_total", 1)

    def _count_rejection(self, kind: MessageKind, reason: str, peer: str) -> str:
        """Count a rejected message of `kind` and log it once per peer; returns the logged text."""
        self.tally.add_to("rejected", kind.value)
        self._on_count("handshake_messages_rejected_total", 1)
        text = f"sglang_pd: rejected by {self.limits.side.value}: {reason}"
        self.tally.note_peer(peer, text, kind.value)
        return text

    def _notify_target(self, verdict: Verdict) -> tuple[str, int] | None:
        """Where to tell decode: only the endpoint of a peer that registered it (never an arbitrary one)."""
        if self.limits.side is not Side.PREFILL or verdict.peer_name is None:
            return None
        if not registered_endpoint(self.host.registered_peer, verdict.peer_name, verdict.reply_to):
            return None
        return verdict.reply_to

    def snapshot(self) -> dict:
        """Read-only view for /sglang_pd/stats."""
        view = {"side": self.limits.side.value, "backend": self.limits.backend,
                "auth": "hmac-sha256" if self.auth else "off", **self.tally.snapshot(),
                "num_peers_with_pool_bounds": len(self.peers),
                "max_frame_bytes": self.limits.max_frame_bytes, "max_kv_pages": self.limits.max_kv_pages}
        if self.unclaimed is not None:
            view["unclaimed_rooms"] = self.unclaimed.snapshot()
        if self.tombstones is not None:
            view["num_tombstones"] = len(self.tombstones)
        if self.failed_rooms is not None:
            view["num_failed_rooms"] = len(self.failed_rooms)
        if self.digests is not None:
            view["prompt_digests"] = self.digests.snapshot()
        return view


# Messages prefill answers at the address they carry (upstream's ABORT_ACK, a deferred bootstrap's status).
_ANSWERED_AT_REPLY_TO = (MessageKind.ABORT, MessageKind.DECLINE, MessageKind.BOOTSTRAP)
