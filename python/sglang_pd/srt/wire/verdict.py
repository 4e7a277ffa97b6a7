"""What a schema check says about one message (`Verdict`), and the reader the schemas fill in as they go.

A schema (prefill_schemas, decode_schemas, staging_schemas) reads frames left to right into a
`FrameReader`, so a message rejected at its fifth frame still names the room its first one gave; the
frame count it checks is its catalogue entry's (catalogue.py). Pure; no SGLang import.
"""

from __future__ import annotations

from typing import NamedTuple

from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire.catalogue import MessageKind, MessageSpec
from sglang_pd.srt.wire.fields import FrameError, IndexSpan


class Verdict(NamedTuple):
    """`reason` None: well formed. `room`, `peer_name`, `reply_to` when the frames name them."""

    kind: MessageKind
    reason: str | None
    room: int | None = None
    peer_name: str | None = None          # mooncake session id / NIXL agent the message speaks for
    reply_to: tuple[str, int] | None = None
    max_index: int | None = None          # largest destination page index named (transfer info)
    aux_index: int | None = None          # destination aux slot named (transfer info; None: dummy)
    max_device_index: int | None = None   # largest destination device page index named (mooncake transfer info)
    state_spans: tuple[IndexSpan | None, ...] = ()  # per state type listed: first and largest index (transfer info)


class FrameReader:
    """Collects what was readable before the first bad frame, so a rejection can name its room.
    Mutated by one schema call; `spec` is the catalogue entry the message was routed to."""

    def __init__(self, kind: MessageKind, spec: MessageSpec | None = None):
        self.kind, self.spec, self.room, self.peer_name, self.reply_to = kind, spec, None, None, None
        self.max_index, self.aux_index, self.max_device_index, self.state_spans = None, None, None, ()

    def verdict(self, reason: str | None = None) -> Verdict:
        """The verdict so far: well formed when `reason` is None."""
        return Verdict(self.kind, reason, self.room, self.peer_name, self.reply_to, self.max_index, self.aux_index,
                       self.max_device_index, self.state_spans)

    def count_frames(self, msg: list[bytes]) -> None:
        """Raise FrameError unless `msg` has as many frames as its catalogue entry allows."""
        lo, hi = self.spec.min_frames, self.spec.max_frames
        if not lo <= len(msg) <= hi:
            raise FrameError(f"{len(msg)} frames, a {self.spec.name} has {lo}" + (f"..{hi}" if hi != lo else ""))

    def read_endpoint(self, msg: list[bytes], ip_at: int) -> None:
        """The (host, port) at `ip_at`, `ip_at + 1`: where the sender asks to be answered."""
        self.reply_to = (ff.host(msg[ip_at]), ff.port(msg[ip_at + 1]))
