"""Peer authentication of the PD control plane: HMAC-SHA256 over every handshake message.

Every PD server of a deployment reads the same secret file (SGLANG_PD_PEER_SECRET_FILE). A ZMQ
handshake message carries a 5-frame trailer after its own frames:

    [b"SGLPD-AUTH/2", key id (16 hex), timestamp (ms, ASCII), nonce (16 random bytes), mac (32 bytes)]

mac = HMAC-SHA256(key, label | key id | timestamp | nonce | receiver | each frame as 8-byte length + bytes),
so a frame cannot be moved across a boundary, added, dropped or edited. The receiver is the rank socket
the message was sent to, `host:port` as the sender knows it (the endpoint that socket's owner advertised;
`receiver_name`); it is not sent: the receiver verifies with its own, so a message replayed to another
rank or server fails its MAC. A bootstrap HTTP request carries the same fields in one header over
method, path with query, body and `to` (the bootstrap server's `host:port` in the sender's URL), which
the server checks names itself (WRONG_RECEIVER); its answer is tagged over the request's nonce, its
status and body, so a forged or replayed answer is refused.

Replay: a message is accepted within `max_skew_s` of its timestamp, once (its nonce is remembered
for twice that window); clocks of the PD servers must agree within `max_skew_s` (NTP). The nonce memory
lives in one process, so a restarted server would accept once more what it accepted in the window
before: `from_file` therefore refuses every message stamped before the receiving process started
(`not_before`), counted as `before_start`. That includes a genuine message in flight across the restart
(sent to the previous process, or signed just before this one started): it is refused, never accepted,
and its request fails as any refused handshake does. No message is accepted twice.

Key rotation: the file holds one key per line; the first signs, every line verifies. Add the new
key as a second line everywhere, then make it the first, then drop the old one (README).

The secret is held only in this object: it is never logged, never put in a message, never in
argv. Thread-safe (the replay memory has its own lock).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import threading
import time
from collections import deque
from typing import Callable, NamedTuple

from sglang_pd.secret_file import MIN_KEY_CHARS, SecretFileError, read_keys

MAGIC = b"SGLPD-AUTH/2"
TRAILER_FRAMES = 5
HTTP_HEADER = "X-SGLang-PD-Auth"
HTTP_RESPONSE_HEADER = "X-SGLang-PD-Auth-Response"
DEFAULT_MAX_SKEW_S = 30.0
_LABEL_ZMQ = b"sglang_pd/zmq/2\0"
_LABEL_HTTP_REQ = b"sglang_pd/http-request/2\0"
_LABEL_HTTP_RESP = b"sglang_pd/http-response/1\0"


class AuthFailure(str, enum.Enum):
    """Why a message was refused (the label of the refusal counter)."""

    MISSING = "missing"          # no auth trailer / header
    MALFORMED = "malformed"      # trailer present but not parseable
    UNKNOWN_KEY = "unknown_key"  # signed with a key this server does not hold
    BAD_MAC = "bad_mac"          # wrong secret, or frames changed after signing
    STALE = "stale"              # timestamp outside the accepted window
    REPLAYED = "replayed"        # nonce already seen inside the window
    OVERLOADED = "overloaded"    # replay memory full (more signed messages than it can hold)
    BEFORE_START = "before_start"  # stamped before this process started (a replay across a restart)
    WRONG_RECEIVER = "wrong_receiver"  # HTTP: signed for another server (`to` is not this one)


class AuthVerdict(NamedTuple):
    """`failure` None: authenticated. `frames`: the message without its trailer; `nonce` (HTTP)."""

    failure: AuthFailure | None
    frames: list[bytes] | None = None
    nonce: str | None = None


def receiver_name(endpoint: str) -> bytes:
    """`host:port` of a ZMQ endpoint (`tcp://host:port`, `tcp://[v6]:port`, or a `source;host:port` connect
    string), the name a signed message is bound to."""
    target = endpoint.rsplit(";", 1)[-1]
    if "://" in target:
        target = target.split("://", 1)[1]
    return target.encode()


def key_id(key: bytes) -> bytes:
    """A public 16-hex-digit name of a key (lets the verifier pick the key without trying each)."""
    return hashlib.sha256(b"sglang_pd key id\0" + key).hexdigest()[:16].encode()


class ReplayGuard:
    """Nonces seen inside the window; bounded. `admit` is the only mutator (locked)."""

    def __init__(self, capacity: int = 250_000):
        self.capacity = capacity
        self._expiry: dict[bytes, float] = {}
        self._order: deque[tuple[float, bytes]] = deque()
        self._lock = threading.Lock()

    def admit(self, nonce: bytes, expires_at: float, now: float) -> AuthFailure | None:
        """Remember `nonce` until `expires_at`; REPLAYED if already remembered, OVERLOADED when full."""
        with self._lock:
            while self._order and self._order[0][0] <= now:
                _, old = self._order.popleft()
                if self._expiry.get(old, now + 1) <= now:
                    del self._expiry[old]
            if nonce in self._expiry:
                return AuthFailure.REPLAYED
            if len(self._expiry) >= self.capacity:
                return AuthFailure.OVERLOADED
            self._expiry[nonce] = expires_at
            self._order.append((expires_at, nonce))
            return None

    def __len__(self) -> int:
        return len(self._expiry)


def process_start_time(pid: int | None = None) -> float:
    """Wall-clock start of process `pid` (this one by default), from /proc (Linux).

    The kernel counts a process's start in clock ticks since boot (CLOCK_BOOTTIME), truncated, so the
    result is up to one tick (10 ms) early: the refusal it feeds errs towards accepting. (/proc/stat's
    `btime` is whole seconds, hence the boot instant from the two clocks instead.)"""
    pid = os.getpid() if pid is None else pid
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22 (starttime), after "pid (comm) "
    booted_at = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted_at + ticks / os.sysconf("SC_CLK_TCK")


class PeerAuth:
    """Signs and verifies PD handshake messages with the deployment's shared keys."""

    def __init__(self, keys: list[bytes], max_skew_s: float = DEFAULT_MAX_SKEW_S,
                 clock: Callable[[], float] = time.time, replay: ReplayGuard | None = None,
                 not_before: float = float("-inf")):
        """`not_before`: refuse messages stamped earlier (wall-clock seconds; `from_file` passes the
        process's start)."""
        if not keys or any(len(k) < MIN_KEY_CHARS for k in keys):
            raise SecretFileError(f"every key must have at least {MIN_KEY_CHARS} characters")
        self._keys = {key_id(k): k for k in keys}
        self._signing_id = key_id(keys[0])
        self.max_skew_s = float(max_skew_s)
        self._clock = clock
        self._replay = replay or ReplayGuard()
        self.not_before = float(not_before)

    @classmethod
    def from_file(cls, path: str | os.PathLike, max_skew_s: float = DEFAULT_MAX_SKEW_S) -> "PeerAuth":
        """Load the keys of `path` (see read_keys); messages stamped before this process started are refused."""
        return cls(read_keys(path), max_skew_s, not_before=process_start_time())

    @property
    def key_ids(self) -> list[str]:
        """Public ids of the loaded keys, signing key first (safe to log)."""
        return [self._signing_id.decode()] + [k.decode() for k in self._keys if k != self._signing_id]

    def __repr__(self) -> str:  # never show the keys
        return f"PeerAuth(keys={self.key_ids}, max_skew_s={self.max_skew_s})"

    def derive(self, label: bytes) -> bytes:
        """32 bytes derived from the signing key for `label` (HMAC-SHA256; e.g. the CURVE key pair): the key
        itself never leaves this object."""
        return hmac.new(self._keys[self._signing_id], b"sglang_pd derive\0" + label, hashlib.sha256).digest()

    # ---- ZMQ ------------------------------------------------------------------------------------------
    def sign_frames(self, frames: list[bytes], receiver: bytes) -> list[bytes]:
        """The trailer to append to `frames` sent to `receiver` (`receiver_name` of the endpoint; read-only on
        `frames`)."""
        stamp = str(int(self._clock() * 1000)).encode()
        nonce = os.urandom(16)
        mac = self._mac(_LABEL_ZMQ, self._signing_id, self._keys[self._signing_id], stamp, nonce,
                        [receiver, *frames])
        return [MAGIC, self._signing_id, stamp, nonce, mac]

    def verify_frames(self, msg: list[bytes], receiver: bytes) -> AuthVerdict:
        """Check and strip the trailer of `msg` received at `receiver` (this socket's advertised `host:port`); a
        message is accepted once (mutates the replay memory). Signed for another receiver: BAD_MAC."""
        if len(msg) < TRAILER_FRAMES or msg[-TRAILER_FRAMES] != MAGIC:
            return AuthVerdict(AuthFailure.MISSING)
        body = list(msg[:-TRAILER_FRAMES])
        kid, stamp, nonce, mac = msg[-4:]
        if len(nonce) != 16 or len(mac) != 32 or not stamp.isdigit() or len(stamp) > 16:
            return AuthVerdict(AuthFailure.MALFORMED)
        failure = self._check(kid, stamp, nonce, mac, _LABEL_ZMQ, [receiver, *body])
        return AuthVerdict(failure, body if failure is None else None)

    @staticmethod
    def has_trailer(msg: list[bytes]) -> bool:
        """True when `msg` ends with an auth trailer (whoever signed it)."""
        return len(msg) >= TRAILER_FRAMES and msg[-TRAILER_FRAMES] == MAGIC

    # ---- HTTP -----------------------------------------------------------------------------------------
    def sign_http_request(self, method: str, path_qs: str, body: bytes, receiver: str) -> tuple[str, str]:
        """(header value, nonce) for one bootstrap request to `receiver` (the `host:port` of its URL)."""
        stamp = str(int(self._clock() * 1000)).encode()
        nonce = os.urandom(16)
        mac = self._mac(_LABEL_HTTP_REQ, self._signing_id, self._keys[self._signing_id], stamp, nonce,
                        _http_parts(method, path_qs, body, receiver))
        value = (f"v2 key={self._signing_id.decode()} ts={stamp.decode()} nonce={nonce.hex()} to={receiver} "
                 f"mac={mac.hex()}")
        return value, nonce.hex()

    def verify_http_request(self, method: str, path_qs: str, body: bytes, header: str | None,
                            is_me: Callable[[str], bool]) -> AuthVerdict:
        """Check a bootstrap request's header (mutates the replay memory); `nonce` set when accepted. `is_me`:
        whether the header's `to` (`host:port`) names this server; WRONG_RECEIVER when not."""
        if not header:
            return AuthVerdict(AuthFailure.MISSING)
        fields = _header_fields(header)
        try:
            kid, stamp, receiver = fields["key"].encode(), fields["ts"].encode(), fields["to"]
            nonce, mac = bytes.fromhex(fields["nonce"]), bytes.fromhex(fields["mac"])
        except (KeyError, ValueError):
            return AuthVerdict(AuthFailure.MALFORMED)
        if len(nonce) != 16 or len(mac) != 32 or not stamp.isdigit() or len(stamp) > 16 or len(receiver) > 300:
            return AuthVerdict(AuthFailure.MALFORMED)
        failure = self._check(kid, stamp, nonce, mac, _LABEL_HTTP_REQ, _http_parts(method, path_qs, body, receiver))
        if failure is None and not is_me(receiver):
            failure = AuthFailure.WRONG_RECEIVER  # genuine, but signed for another server (nonce now spent here)
        return AuthVerdict(failure, nonce=None if failure else nonce.hex())

    def sign_http_response(self, nonce_hex: str, status: int, body: bytes) -> str:
        """Header value tagging the bootstrap server's answer to the request of `nonce_hex`."""
        mac = self._mac(_LABEL_HTTP_RESP, self._signing_id, self._keys[self._signing_id], b"", b"",
                        [nonce_hex.encode(), str(status).encode(), hashlib.sha256(body).digest()])
        return f"v2 key={self._signing_id.decode()} mac={mac.hex()}"

    def verify_http_response(self, nonce_hex: str, status: int, body: bytes, header: str | None) -> AuthVerdict:
        """Check the answer to our request `nonce_hex` (read-only)."""
        if not header:
            return AuthVerdict(AuthFailure.MISSING)
        fields = _header_fields(header)
        try:
            kid, mac = fields["key"].encode(), bytes.fromhex(fields["mac"])
        except (KeyError, ValueError):
            return AuthVerdict(AuthFailure.MALFORMED)
        key = self._keys.get(kid)
        if key is None:
            return AuthVerdict(AuthFailure.UNKNOWN_KEY)
        want = self._mac(_LABEL_HTTP_RESP, kid, key, b"", b"",
                         [nonce_hex.encode(), str(status).encode(), hashlib.sha256(body).digest()])
        return AuthVerdict(None if hmac.compare_digest(want, mac) else AuthFailure.BAD_MAC)

    # ---- shared ---------------------------------------------------------------------------------------
    def _check(self, kid, stamp, nonce, mac, label, parts) -> AuthFailure | None:
        key = self._keys.get(kid)
        if key is None:
            return AuthFailure.UNKNOWN_KEY
        now = self._clock()
        sent = int(stamp) / 1000.0
        if abs(now - sent) > self.max_skew_s:  # before the MAC: a stale message costs no pass over its frames
            return AuthFailure.STALE
        if sent < self.not_before:  # inside the window but meant for this server's previous process
            return AuthFailure.BEFORE_START
        if not hmac.compare_digest(self._mac(label, kid, key, stamp, nonce, parts), mac):
            return AuthFailure.BAD_MAC
        return self._replay.admit(nonce, sent + 2 * self.max_skew_s, now)

    @staticmethod
    def _mac(label, kid, key, stamp, nonce, parts) -> bytes:
        h = hmac.new(key, digestmod=hashlib.sha256)
        h.update(label + kid + b"\0" + stamp + b"\0" + nonce)
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.digest()


def _http_parts(method: str, path_qs: str, body: bytes, receiver: str) -> list[bytes]:
    return [method.upper().encode(), path_qs.encode(), hashlib.sha256(body).digest(), receiver.encode()]


def _header_fields(header: str) -> dict[str, str]:
    parts = header.split()
    if not parts or parts[0] != "v2":
        return {}
    return dict(p.split("=", 1) for p in parts[1:] if "=" in p)
