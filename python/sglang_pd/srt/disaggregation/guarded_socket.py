"""ZMQ sockets that check what they receive and sign what they send (shadows of SGLang's own sockets).

`GuardedSocket` shadows a bound PULL socket (same libzmq socket, so pollers and close() behave as on
the original): `recv_multipart` hands its caller only messages the `HandshakeGate` admitted, with
the auth trailer removed, and drops the rest without returning. While idle it wakes every
`housekeeping_s` so the gate can expire unclaimed rooms. A bug in the gate drops that one message
(the caller's `on_error` counts and logs it) instead of ending the reading thread.

`SigningSocket` shadows a PUSH socket: `send_multipart` appends the `PeerAuth` trailer.

Neither owns the libzmq socket: the SGLang object it shadows does (kept referenced here).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import zmq

from sglang_pd.srt.disaggregation.handshake_gate import HandshakeGate
from sglang_pd.srt.disaggregation.peer_auth import PeerAuth


class GuardedSocket(zmq.Socket):
    """A PULL socket whose recv_multipart returns admitted messages only. Used by one reading thread."""

    # Class-level names: pyzmq treats unknown instance attributes as socket options.
    gate: HandshakeGate = None
    on_error: Callable[[str], None] = None
    before_admit: Callable[[], None] = None   # test-only fault point; may raise (ends the reading thread)
    reader: threading.Thread | None = None
    _raw: zmq.Socket = None
    _housekeeping_s: float = 1.0
    _next_housekeeping: float = 0.0

    @classmethod
    def around(cls, raw: zmq.Socket, gate: HandshakeGate, on_error: Callable[[str], None],
               housekeeping_s: float = 1.0, before_admit: Callable[[], None] = lambda: None) -> "GuardedSocket":
        """Shadow `raw` (which keeps owning the libzmq socket) behind `gate`."""
        sock = cls.shadow(raw.underlying)
        sock._raw, sock.gate, sock.on_error, sock._housekeeping_s = raw, gate, on_error, housekeeping_s
        sock.before_admit = before_admit
        return sock

    def recv_multipart(self, flags: int = 0, copy: bool = True, track: bool = False):
        """Next admitted message (list of bytes); zmq.Again with NOBLOCK when none is ready."""
        if self.reader is None:
            self.reader = threading.current_thread()
        while True:
            if not flags & zmq.NOBLOCK and not self.poll(int(self._housekeeping_s * 1000), zmq.POLLIN):
                self._housekeeping()
                continue
            frames = super().recv_multipart(flags, copy=False)
            self.before_admit()
            admitted = self._admit(frames)
            if time.monotonic() >= self._next_housekeeping:
                self._housekeeping()
            if admitted is not None:
                return admitted
            if flags & zmq.NOBLOCK:
                raise zmq.Again()

    def _admit(self, frames) -> list[bytes] | None:
        try:
            peer = frames[0].get("Peer-Address") or "unknown"
        except zmq.ZMQError:
            peer = "unknown"
        try:
            return self.gate.admit([f.bytes for f in frames], peer)
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


class SigningSocket(zmq.Socket):
    """A PUSH socket whose send_multipart appends this deployment's auth trailer."""

    auth: PeerAuth = None
    _raw: zmq.Socket = None

    @classmethod
    def around(cls, raw: zmq.Socket, auth: PeerAuth) -> "SigningSocket":
        """Shadow `raw` (which keeps owning the libzmq socket); sign with `auth`."""
        sock = cls.shadow(raw.underlying)
        sock._raw, sock.auth = raw, auth
        return sock

    def send_multipart(self, msg_parts, flags: int = 0, copy: bool = True, track: bool = False, **kwargs):
        """Send `msg_parts` followed by their auth trailer."""
        parts = [bytes(p) for p in msg_parts]
        return super().send_multipart(parts + self.auth.sign_frames(parts), flags, copy, track, **kwargs)
