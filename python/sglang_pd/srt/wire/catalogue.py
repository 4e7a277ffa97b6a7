"""The one catalogue of every message a PD rank socket accepts, per backend and side, frame by frame.

Data, not documentation: `frames.check_message` routes a message by this table (tags, markers, the
NIXL guard frame, the staging switch), refuses a message no entry of its backend and side matches,
and holds each message to its entry's frame count; the gate takes off only the appended frames its
entry lists (and sizes its unread-message cap from them). Each frame names the module that builds it
(the peer's side parses it there too): upstream SGLang's, or ours for the frames sglang_pd adds.

  every message, when SGLANG_PD_PEER_SECRET_FILE is set: + `AUTH_TRAILER` (srt/auth/peer_auth.py)
  prefill rank socket (decode -> prefill): ABORT, decline (ours), BOOTSTRAP, WATERMARK / STAGING_RSP
      (staging buffer only), registration (+ pool bounds, ours), transfer info (+ prompt digest, ours);
      NIXL: registration and transfer info after `NIXL_GUARD`
  decode rank socket (prefill -> decode): transfer status, ABORT_ACK, AUX_DATA (mooncake),
      STAGING_REQ / CHUNK_READY (staging buffer only)
Pure data and lookups; no SGLang import.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from sglang_pd.srt.wire.fields import Side
from sglang_pd.srt.wire.room_decline import DECLINE_MARKER

NIXL_GUARD = b"NixlMsgGuard"
NIXL_STATUS_TAG = b"KV_STATUS"
MAX_FRAMES = 32  # schema frames of any PD message: headroom over the longest entry (NIXL registration, 24)

_COMMON = "sglang.srt.disaggregation.common.conn"
_MOONCAKE = "sglang.srt.disaggregation.mooncake.conn"
_NIXL = "sglang.srt.disaggregation.nixl.conn"
_STAGING = "sglang.srt.disaggregation.common.staging_handler"
_DECLINE = "sglang_pd.srt.wire.room_decline"
BACKEND_NAMES = {"mooncake": "mooncake", "nixl": "NIXL"}


class MessageKind(str, enum.Enum):
    """What a message is, as far as its first frames say."""

    REGISTRATION = "registration"
    TRANSFER_INFO = "transfer_info"
    ABORT = "abort"
    DECLINE = "decline"
    BOOTSTRAP = "bootstrap"
    STATUS = "status"
    ABORT_ACK = "abort_ack"
    AUX_DATA = "aux_data"
    STAGING = "staging"
    UNKNOWN = "unknown"


class Frame(NamedTuple):
    """One frame: its field, the module that builds it, and whether a sender may leave it off (optional
    frames trail: a peer of an older SGLang stops early)."""

    name: str
    module: str
    optional: bool = False


class MessageSpec(NamedTuple):
    """One message kind on one rank socket. `name` keys its schema (`frames.SCHEMAS`)."""

    name: str
    kind: MessageKind
    frames: tuple[Frame, ...]           # what the schema reads, in order (after NIXL_GUARD when `guarded`)
    tag: bytes | None = None            # its literal first frame; None: the side's message without a tag
    marker: tuple[int, bytes] | None = None  # (index, literal): ours, under an upstream tag
    guarded: bool = False               # NIXL: sent after the NIXL_GUARD frame
    staging: bool = False               # legitimate only with SGLANG_DISAGG_STAGING_BUFFER
    appended: tuple[Frame, ...] = ()    # frames sglang_pd appends; the gate takes them off before the schema

    @property
    def min_frames(self) -> int:
        """Frames every sender sends."""
        return sum(not f.optional for f in self.frames)

    @property
    def max_frames(self) -> int:
        """Frames the newest sender sends."""
        return len(self.frames)


def _frames(module: str, names: str, optional: str = "") -> tuple[Frame, ...]:
    """Frames of `module`, named in order (comma separated); `optional` ones follow."""
    split = lambda text: [n.strip() for n in text.split(",") if n.strip()]  # noqa: E731
    return (tuple(Frame(n, module) for n in split(names))
            + tuple(Frame(n, module, optional=True) for n in split(optional)))


AUTH_TRAILER = _frames("sglang_pd.srt.auth.peer_auth", "auth magic, key id, timestamp ms, nonce, mac")
POOL_BOUNDS = Frame("pool bounds", "sglang_pd.srt.wire.pool_bounds")
PROMPT_DIGEST = Frame("prompt digest", "sglang_pd.srt.wire.prompt_binding")
KV_DIGEST = Frame("KV digest", "sglang_pd.srt.wire.kv_digest")

_ABORT = MessageSpec("ABORT", MessageKind.ABORT, _frames(_COMMON, "ABORT, room", "decode ip, decode port, generation"),
                     tag=b"ABORT")
_DECLINE_SPEC = MessageSpec(
    "decline", MessageKind.DECLINE,
    _frames(_DECLINE, "ABORT, room, decode ip, decode port, generation 0, decline marker, status, message"),
    tag=b"ABORT", marker=(5, DECLINE_MARKER))
_BOOTSTRAP = MessageSpec(
    "BOOTSTRAP", MessageKind.BOOTSTRAP, _frames(_COMMON, "BOOTSTRAP, room, decode ip, decode port"), tag=b"BOOTSTRAP")
_WATERMARK = MessageSpec("WATERMARK", MessageKind.STAGING, _frames(_STAGING, "WATERMARK, round, tail", "session"),
                         tag=b"WATERMARK", staging=True)
_STAGING_RSP = MessageSpec(
    "STAGING_RSP", MessageKind.STAGING, _frames(_STAGING, "STAGING_RSP, room, chunk, offset, round, end, session"),
    tag=b"STAGING_RSP", staging=True)
_STAGING_REQ = MessageSpec(
    "STAGING_REQ", MessageKind.STAGING,
    _frames(_STAGING, "STAGING_REQ, room, chunk, chunk pages, session", "requester pp rank"),
    tag=b"STAGING_REQ", staging=True)
_CHUNK_READY = MessageSpec(
    "CHUNK_READY", MessageKind.STAGING,
    _frames(_COMMON, "CHUNK_READY, room, chunk, page start, num pages, writer id", "prefill rank"),
    tag=b"CHUNK_READY", staging=True)
_ABORT_ACK = MessageSpec(
    "ABORT_ACK", MessageKind.ABORT_ACK, _frames(_COMMON, "ABORT_ACK, room", "prefill rank, generation"),
    tag=b"ABORT_ACK")

_MOONCAKE_PREFILL = (
    _DECLINE_SPEC, _ABORT, _BOOTSTRAP, _WATERMARK, _STAGING_RSP,
    MessageSpec("mooncake registration", MessageKind.REGISTRATION, _frames(
        _MOONCAKE, "None, decode ip, decode port, session, kv ptrs, aux ptrs, state ptrs, tp rank, attn tp size, "
                   "kv item len",
        "state item lens, state dims, kv layer ids, state layer ids, staging base, staging size, dcp size, dcp rank, "
        "staging slot layer ids, kv item lens"), tag=b"None", appended=(POOL_BOUNDS,)),
    MessageSpec("mooncake transfer info", MessageKind.TRANSFER_INFO, _frames(
        _MOONCAKE, "room, decode ip, decode port, session, kv page indices, aux index, state indices, "
                   "required_dst_info_num", "decode_prefix_len, device kv indices"), appended=(PROMPT_DIGEST,)),
)
_NIXL_PREFILL = (
    _DECLINE_SPEC, _ABORT, _BOOTSTRAP, _WATERMARK, _STAGING_RSP,
    MessageSpec("NIXL registration", MessageKind.REGISTRATION, _frames(
        _NIXL, "None, decode ip, decode port, agent name, agent metadata, kv ptrs, aux ptrs, state ptrs, gpu id, "
               "tp size, tp rank, kv item len",
        "state item lens, state dims, staging base, staging size, num slots, kv memory kinds, kv item lens, "
        "state layer ids, kv layer ids, dcp size, dcp rank, state data lens"),
        tag=b"None", guarded=True, appended=(POOL_BOUNDS,)),
    MessageSpec("NIXL transfer info", MessageKind.TRANSFER_INFO, _frames(
        _NIXL, "room, decode ip, decode port, agent name, kv page indices, aux index, required_dst_info_num",
        "state indices, decode_prefix_len, is_dummy"), guarded=True, appended=(PROMPT_DIGEST,)),
)
_MOONCAKE_DECODE = (
    _ABORT_ACK, _STAGING_REQ, _CHUNK_READY,
    MessageSpec("AUX_DATA", MessageKind.AUX_DATA,
                _frames(_MOONCAKE, "AUX_DATA, room, aux buffer index, aux index, data length, data"), tag=b"AUX_DATA"),
    MessageSpec("transfer status", MessageKind.STATUS, _frames(_MOONCAKE, "room, status, prefill rank"),
                appended=(KV_DIGEST,)),
)
_NIXL_DECODE = (
    _ABORT_ACK, _STAGING_REQ, _CHUNK_READY,
    MessageSpec("NIXL transfer status", MessageKind.STATUS,
                _frames(_NIXL, "KV_STATUS, room, status, prefill rank, failure reason"), tag=NIXL_STATUS_TAG,
                appended=(KV_DIGEST,)),
)

Catalogue = dict[tuple[str, Side], tuple[MessageSpec, ...]]
CATALOGUE: Catalogue = {
    ("mooncake", Side.PREFILL): _MOONCAKE_PREFILL,
    ("mooncake", Side.DECODE): _MOONCAKE_DECODE,
    ("nixl", Side.PREFILL): _NIXL_PREFILL,
    ("nixl", Side.DECODE): _NIXL_DECODE,
}


def side_specs(backend: str, side: Side, catalogue: Catalogue = CATALOGUE) -> tuple[MessageSpec, ...]:
    """Every message kind one rank socket accepts (empty for a backend not catalogued)."""
    return catalogue.get((backend, side), ())


def appended_frames(backend: str, side: Side, kind: MessageKind, catalogue: Catalogue = CATALOGUE) -> set[Frame]:
    """The frames sglang_pd appends to a message of `kind` on this rank socket (read-only)."""
    return {f for spec in side_specs(backend, side, catalogue) if spec.kind is kind for f in spec.appended}


def side_appends(backend: str, side: Side, frame: Frame, catalogue: Catalogue = CATALOGUE) -> bool:
    """Whether any message of this rank socket may end with `frame` (the gate then looks for it)."""
    return any(frame in spec.appended for spec in side_specs(backend, side, catalogue))


def max_appended(catalogue: Catalogue = CATALOGUE) -> int:
    """The most frames sglang_pd appends to one message (before the auth trailer)."""
    return max(len(spec.appended) for specs in catalogue.values() for spec in specs)
