"""ZMQ CURVE on the PD rank sockets: a stranger cannot send a single frame (SGLANG_PD_PEER_CURVE=1).

The HMAC trailer (peer_auth.py) is checked once a message is complete, but libzmq buffers an unfinished
multipart message without bound before that (scripts/probes/security/peer_fuzz/unfinished_multipart.py: +400 MiB for
400 x 1 MiB frames that never end): ZMQ_MAXMSGSIZE caps each frame, not their number. With CURVE, libzmq
accepts no message frame from a connection whose handshake failed, and the handshake needs the server's
public key.

Keys: one Curve25519 key pair for the whole deployment, derived from the signing key of the secret file
(`PeerAuth.derive`), so nothing new is distributed. Every rank socket is a CURVE server with that secret
key; every PUSH socket towards a rank is a client that knows the server's public key and presents the
same pair. CURVE never sends the server's public key on the wire, and a client must box its HELLO to it:
without the secret file a peer cannot complete the handshake. (libzmq's CURVE server without a ZAP
handler accepts any client key that completes it; there is no other key to accept.) The control
messages are encrypted as a side effect; the KV payload (mooncake / NIXL) is not.

Every socket this applies to is checked after it is made (`check_socket`): pyzmq applies a context's
default options and skips silently any it cannot set, which would leave a socket in the clear.
"""

from __future__ import annotations

from typing import NamedTuple

_DERIVATION_LABEL = b"sglang_pd/zmq-curve25519/1"


class CurveKeys(NamedTuple):
    """Z85 text of the deployment's Curve25519 key pair (the secret never in a repr)."""

    public: bytes
    secret: bytes

    def __repr__(self) -> str:
        return f"CurveKeys(public={self.public.decode()[:8]}..., secret=<hidden>)"


class CurveUnavailable(RuntimeError):
    """This pyzmq's libzmq was built without CURVE (libsodium)."""


def derive_keys(auth) -> CurveKeys:
    """The pair every PD server of the deployment derives from its signing key (`auth`: PeerAuth)."""
    import zmq
    from zmq.utils import z85

    if not zmq.has("curve"):
        raise CurveUnavailable(f"libzmq {zmq.zmq_version()} of pyzmq {zmq.pyzmq_version()} has no CURVE support "
                               "(built without libsodium)")
    secret = z85.encode(auth.derive(_DERIVATION_LABEL))  # Curve25519 clamps any 32 bytes into a secret key
    return CurveKeys(zmq.curve_public(secret), secret)


def server_options(keys: CurveKeys) -> dict[int, object]:
    """Options that make a socket a CURVE server (set before it binds)."""
    import zmq

    return {zmq.CURVE_SERVER: 1, zmq.CURVE_SECRETKEY: keys.secret}


def client_options(keys: CurveKeys) -> dict[int, object]:
    """Options that make a socket a CURVE client of any rank socket of the deployment (set before it connects)."""
    import zmq

    return {zmq.CURVE_SERVERKEY: keys.public, zmq.CURVE_PUBLICKEY: keys.public, zmq.CURVE_SECRETKEY: keys.secret}


def set_context_defaults(context, options: dict[int, object]) -> None:
    """Make `options` the defaults of every socket `context` creates from now on (pyzmq context options)."""
    for option, value in options.items():
        context.setsockopt(option, value)


def drop_context_defaults(context, options: dict[int, object]) -> None:
    """Undo `set_context_defaults` for these options (sockets already made keep theirs)."""
    for option in options:
        context.sockopts.pop(option, None)


def check_socket(sock, server: bool, what: str) -> None:
    """Raise RuntimeError naming `what` unless `sock` speaks CURVE in the expected role."""
    import zmq

    mechanism, as_server = sock.getsockopt(zmq.MECHANISM), sock.getsockopt(zmq.CURVE_SERVER)
    if mechanism != zmq.CURVE or bool(as_server) != server:
        raise RuntimeError(f"sglang_pd: SGLANG_PD_PEER_CURVE=1 but {what} is not a CURVE "
                           f"{'server' if server else 'client'} (mechanism {mechanism}, curve_server {as_server}); "
                           "refusing to use it in the clear")
