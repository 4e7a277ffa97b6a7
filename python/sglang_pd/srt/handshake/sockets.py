"""ZMQ sockets that check what they receive and sign what they send (shadows of SGLang's own sockets).

`GuardedSocket` shadows a bound PULL socket (same libzmq socket, so pollers and close() behave as on
the original): `recv_multipart` hands its caller only messages the `HandshakeGate` admitted, with
the auth trailer removed, and drops the rest without returning. While idle it wakes every
`housekeeping_s` so the gate can expire unclaimed rooms. A bug in the gate drops that one message
(the caller's `on_error` counts and logs it) instead of ending the reading thread.

With `hold` (prefill's bootstrap socket), the reader holds a lock from the moment a message passed the
gate's screen (authentication and schema: the costly part, no room state read; a message with more frames
than any PD message is dropped before its frames are even copied), through the gate's room checks and
SGLang's handling of it, until it comes back for the next one. (Screening under the hold let a stranger's
large message keep every clear waiting up to the cap.) Whoever changes
the rooms that handling reads (SGLang's `CommonKVSender.clear`, through our hook) does it inside
`between_messages()`, so it never lands in the middle: SGLang 0.5.23's bootstrap threads read
`transfer_infos[room]` several times per message, and a clear popping the room in between raised
KeyError and ended the thread (every later pairing with it). The wait is bounded (`HOLD_WAIT_S`); it
also ends at once when the reader is dead (nothing left to race).

`HeldRooms` is the same rule for SGLang's `transfer_infos` table itself: a room leaves it (`pop`, `del`)
only between two messages. Besides the clear, prefill's transfer workers pop a room when its last chunk
is done; a transfer info for that room arriving at that moment (a peer sending it twice, or a second
decode session naming it) met the same KeyError in the bootstrap thread.

`SigningSocket` shadows a PUSH socket: `send_multipart` appends the `PeerAuth` trailer.

Neither owns the libzmq socket: the SGLang object it shadows does (kept referenced here), so
`close()` closes that owner. (Closing only the shadow left the owner thinking its socket open; when
the owner was collected later it closed the handle again, by then possibly another live socket.)
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from typing import Callable, Iterator

import zmq

from sglang_pd.srt.handshake.gate import HandshakeGate, Screened
from sglang_pd.srt.auth import PeerAuth, receiver_name

HOLD_WAIT_S = 2.0  # longest a `between_messages` caller waits for the reader to finish one message


class Between(enum.Enum):
    """How `between_messages` got its turn."""

    FREE = "free"            # the reader was waiting for a message (or the socket has no hold)
    WAITED = "waited"        # the reader was handling one: waited until it came back for the next
    READER_DEAD = "reader_dead"  # the reader ended while holding: nothing can race any more
    TIMED_OUT = "timed_out"  # the reader held it past HOLD_WAIT_S: the body ran anyway (counted, logged)


class GuardedSocket(zmq.Socket):
    """A PULL socket whose recv_multipart returns admitted messages only. Used by one reading thread."""

    # Class-level names: pyzmq treats unknown instance attributes as socket options.
    gate: HandshakeGate = None
    on_error: Callable[[str], None] = None
    before_admit: Callable[[], None] = None   # test-only fault point; may raise (ends the reading thread)
    reader: threading.Thread | None = None
    hold: threading.RLock | None = None   # see the module docstring; None: no hold (decode, tests)
    hold_wait_s: float = HOLD_WAIT_S
    _held: bool = False                   # the reader holds `hold` for the message it returned last
    _raw: zmq.Socket = None
    _housekeeping_s: float = 1.0
    _next_housekeeping: float = 0.0

    @classmethod
    def around(cls, raw: zmq.Socket, gate: HandshakeGate, on_error: Callable[[str], None],
               housekeeping_s: float = 1.0, before_admit: Callable[[], None] = lambda: None,
               hold: bool = False) -> "GuardedSocket":
        """Shadow `raw` (which keeps owning the libzmq socket) behind `gate`; `hold`: see the module docstring
        (only for a reader that comes straight back to recv_multipart after each message)."""
        sock = cls.shadow(raw.underlying)
        sock._raw, sock.gate, sock.on_error, sock._housekeeping_s = raw, gate, on_error, housekeeping_s
        sock.before_admit = before_admit
        sock.hold = threading.RLock() if hold else None
        return sock

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False):
        """Next admitted message (list of bytes); zmq.Again with NOBLOCK when none is ready."""
        if self.reader is None:
            self.reader = threading.current_thread()
        self._release()  # back for the next message: the last one is handled
        while True:
            if not flags & zmq.NOBLOCK and not self.poll(int(self._housekeeping_s * 1000), zmq.POLLIN):
                self._housekeeping()
                continue
            frames = super().recv_multipart(flags, copy=False)
            screened = self._screen(frames)  # auth and schema, the costly part: outside the hold
            admitted = None
            if screened is not None:
                self._take()  # from here until the next call: the room checks and SGLang's handling, in one piece
                self.before_admit()
                admitted = self._decide(screened, frames)
                if admitted is None:
                    self._release()  # dropped: nothing of SGLang's runs for it
            if time.monotonic() >= self._next_housekeeping:
                self._housekeeping()
            if admitted is not None:
                return admitted
            if flags & zmq.NOBLOCK:
                raise zmq.Again()

    def close(self, linger: int | None = None) -> None:
        """Close the libzmq socket through its owner (see the module docstring)."""
        self._raw.close(linger=linger)

    @contextlib.contextmanager
    def between_messages(self) -> Iterator[Between]:
        """Run the body while the reader is not handling a message (see the module docstring)."""
        turn = self._wait_for_turn()
        try:
            yield turn
        finally:
            if self.hold is not None and turn in (Between.FREE, Between.WAITED):
                self.hold.release()

    def _wait_for_turn(self) -> Between:
        """Take `hold` (FREE / WAITED), or say why the body runs without it."""
        if self.hold is None or self.hold.acquire(blocking=False):
            return Between.FREE
        deadline = time.monotonic() + self.hold_wait_s
        while not self.hold.acquire(timeout=0.02):
            reader = self.reader
            if reader is not None and not reader.is_alive():
                return Between.READER_DEAD
            if time.monotonic() >= deadline:
                return Between.TIMED_OUT
        return Between.WAITED

    def _take(self) -> None:
        if self.hold is not None and not self._held:
            self.hold.acquire()
            self._held = True

    def _release(self) -> None:
        if self._held:
            self._held = False
            self.hold.release()

    def _screen(self, frames) -> Screened | None:
        """The gate's checks that read no room state; a message with too many frames is dropped uncopied."""
        peer = _peer_address(frames)
        try:
            if self.gate.refuse_source(peer) or self.gate.refuse_unread(len(frames), peer):
                return None
            return self.gate.screen([f.bytes for f in frames], peer)
        except Exception:
            self._gate_error("admitting a message")
            return None

    def _decide(self, screened: Screened, frames) -> list[bytes] | None:
        try:
            return self.gate.decide(screened, _peer_address(frames))
        except Exception:
            self._gate_error("admitting a message")
            return None

    def _housekeeping(self) -> None:
        self._next_housekeeping = time.monotonic() + self._housekeeping_s
        try:
            self.gate.housekeeping()
        except Exception:
            self._gate_error("housekeeping")

    def _gate_error(self, doing: str) -> None:
        self.on_error(doing)  # inside the except block: counts and logs (with traceback) what failed


def _peer_address(frames) -> str:
    try:
        return frames[0].get("Peer-Address") or "unknown"
    except zmq.ZMQError:
        return "unknown"


class HeldRooms(dict):
    """SGLang's `transfer_infos` (room -> {peer: info}) whose removals wait for `sock.between_messages()`.
    Reads and inserts are plain dict operations (the bootstrap thread inserts while it holds). `on_turn`
    is told how each removal got its turn (counting, logging); a removal already inside a turn (the
    clear hook, or the reader itself) takes the reentrant lock at once."""

    def __init__(self, rooms: dict, sock: GuardedSocket, on_turn: Callable[[Between, object], None]):
        super().__init__(rooms)
        self._sock, self._on_turn = sock, on_turn

    @contextlib.contextmanager
    def _removal(self, room) -> Iterator[None]:
        with self._sock.between_messages() as turn:
            self._on_turn(turn, room)
            yield

    def pop(self, room, *default):
        """dict.pop, except that a room present when called and removed by another turn while this one
        waited (a clear) counts as removed: None, not KeyError. Upstream's workers check, then pop without
        a default (`if room in infos: infos.pop(room)`); the wait sits between the two."""
        present = room in self
        with self._removal(room):
            if present and not default and room not in self:
                return None
            return super().pop(room, *default)

    def __delitem__(self, room) -> None:
        """del, with the same rule as `pop` for a room removed while this waited its turn."""
        present = room in self
        with self._removal(room):
            if present and room not in self:
                return
            super().__delitem__(room)

    def popitem(self):
        with self._removal(None):
            return super().popitem()

    def clear(self) -> None:
        with self._removal(None):
            super().clear()


class SigningSocket(zmq.Socket):
    """A PUSH socket whose send_multipart appends this deployment's auth trailer."""

    auth: PeerAuth = None
    receiver: bytes = b""
    _raw: zmq.Socket = None

    @classmethod
    def around(cls, raw: zmq.Socket, auth: PeerAuth, endpoint: str) -> "SigningSocket":
        """Shadow `raw` (which keeps owning the libzmq socket), connected to `endpoint`; sign with `auth` for
        that receiver."""
        sock = cls.shadow(raw.underlying)
        sock._raw, sock.auth, sock.receiver = raw, auth, receiver_name(endpoint)
        return sock

    def close(self, linger: int | None = None) -> None:
        """Close the libzmq socket through its owner (see the module docstring)."""
        self._raw.close(linger=linger)

    def send_multipart(self, msg_parts, flags: int = 0, copy: bool = True, track: bool = False, **kwargs):
        """Send `msg_parts` followed by their auth trailer."""
        parts = [bytes(p) for p in msg_parts]
        return super().send_multipart(parts + self.auth.sign_frames(parts, self.receiver), flags, copy, track,
                                      **kwargs)
