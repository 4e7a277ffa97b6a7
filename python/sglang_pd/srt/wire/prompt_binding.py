"""A bootstrap room bound to one prompt: prefill sends a room's KV only to the decode half of the same prompt.

SGLang pairs prefill's half of a request with decode's half by the bootstrap room alone. Two requests
with different prompts under one room (a client bug, or a client that learned another's room) pair
whichever halves meet first: measured (docs/results/security/room_pairing/probe.json) a decode request answered with
exactly another prompt's continuation, computed from that prompt's KV. The halves are bound here by
their prompt:

  decode: the transfer info it sends for a room ends with one frame of ours,
          DIGEST_MARKER + the first 16 bytes of SHA-256 over the prompt's token ids (int64, little-endian);
  prefill: the handshake gate takes that frame off (SGLang's parser never sees it) and records the
          digest for the room; when the room's request finishes its bootstrap (before any page is
          sent), the digest of ITS prompt must equal the recorded one, else the request is failed
          through SGLang's failure path (reason recorded, room failed, decode told). A match binds the
          room to that prompt until the request's sender is cleared: a later transfer info for the room
          (SGLang would send the KV to the pages it names) must carry the same digest, else the gate
          rejects it and fails the room.

A transfer info without the frame (a decode without this plugin, or a raw peer) clears the room's
record and is served as upstream would; such bootstraps are counted (`num_absent`). The digest is no
secret and no MAC: peer authentication (SGLANG_PD_PEER_SECRET_FILE) keeps forged transfer infos out;
this binds the halves honest peers pair. Pure Python + hashlib/numpy; no SGLang import.
Thread-safety: `record` runs on prefill's rank-socket reader, `check` and `unbind` on its scheduler
thread, decode's `sending` and `frame_for` on its scheduler thread; each table has one lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from sglang_pd.srt.wire.fields import split_marked_frame

DIGEST_MARKER = b"sglang_pd:prompt-sha256/16:"
DIGEST_BYTES = 16
MAX_ROOMS = 65536  # recorded rooms kept (oldest dropped first); a room's own transfer info always rewrites it


def prompt_digest(input_ids: Sequence[int]) -> bytes:
    """The first 16 bytes of SHA-256 over the token ids as little-endian int64."""
    return hashlib.sha256(np.asarray(input_ids, dtype="<i8").tobytes()).digest()[:DIGEST_BYTES]


def digest_frame(digest: bytes) -> bytes:
    """The frame decode appends to a transfer info."""
    return DIGEST_MARKER + digest


def split_digest(frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """(frames without a trailing digest frame, its digest or None). Raises FrameError when the last
    frame is ours but not DIGEST_MARKER + 16 bytes."""
    return split_marked_frame(frames, DIGEST_MARKER, DIGEST_BYTES, "prompt digest")


class PromptDigests:
    """Prefill: the prompt digest of the latest transfer info per room, checked at bootstrap; and the
    rooms bound to the prompt of a request that passed the check (until its sender is cleared)."""

    def __init__(self, max_rooms: int = MAX_ROOMS):
        self.max_rooms = max_rooms
        self._rooms: OrderedDict[int, bytes] = OrderedDict()
        self._bound: OrderedDict[int, tuple[bytes, int]] = OrderedDict()  # room -> (digest, id(owner))
        self._lock = threading.Lock()
        self.num_recorded = self.num_matched = self.num_mismatched = self.num_absent = 0
        self.num_refused_after_bind = 0

    def record(self, room: int, digest: bytes | None) -> str | None:
        """A transfer info for `room` passed the frame checks; `digest` None (no frame) clears the room's
        record. Returns the rejection reason when the room is bound to another prompt (nothing recorded)."""
        with self._lock:
            bound = self._bound.get(room)
            if bound is not None and digest != bound[0]:
                self.num_refused_after_bind += 1
                return (f"transfer info for room {room} was sent for a different prompt than the request this "
                        "prefill is already serving in that room: two requests share one bootstrap room")
            self._rooms.pop(room, None)
            if digest is None:
                return None
            self._rooms[room] = digest
            self.num_recorded += 1
            while len(self._rooms) > self.max_rooms:
                self._rooms.popitem(last=False)
        return None

    def check(self, room: int, input_ids: Sequence[int], owner: object = None) -> str | None:
        """At bootstrap of `room`'s request (`owner`: its sender) with prompt `input_ids`: None when the
        decode half was computed for this prompt (the room is then bound to it) or sent no digest, else
        the rejection reason. Consumes the room's record."""
        with self._lock:
            recorded = self._rooms.pop(room, None)
            if recorded is None:
                self.num_absent += 1
                return None
        digest = prompt_digest(input_ids)
        with self._lock:
            if recorded != digest:
                self.num_mismatched += 1
                return (f"sglang_pd: rejected by prefill: room {room}'s transfer info was sent for a different "
                        f"prompt than this request's ({len(input_ids)} tokens): two requests share one "
                        "bootstrap room")
            self.num_matched += 1
            self._bound.pop(room, None)
            self._bound[room] = (digest, id(owner))
            while len(self._bound) > self.max_rooms:
                self._bound.popitem(last=False)
        return None

    def unbind(self, room: int, owner: object) -> None:
        """`owner` (the sender that bound `room`) is cleared: the room may serve another prompt again."""
        with self._lock:
            bound = self._bound.get(room)
            if bound is not None and bound[1] == id(owner):
                del self._bound[room]

    def snapshot(self) -> dict:
        """Read-only counts for /sglang_pd/stats."""
        with self._lock:
            return {"num_rooms_held": len(self._rooms), "num_rooms_bound": len(self._bound),
                    "num_recorded": self.num_recorded, "num_matched": self.num_matched,
                    "num_mismatched": self.num_mismatched, "num_absent": self.num_absent,
                    "num_refused_after_bind": self.num_refused_after_bind}


class OutgoingDigests:
    """Decode: the prompt digest of each room whose transfer info is being built right now."""

    def __init__(self):
        self._rooms: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.num_sent = 0

    @contextmanager
    def sending(self, room: int, input_ids: Sequence[int]) -> Iterator[None]:
        """While SGLang sends `room`'s transfer info, `frame_for(room)` is the digest frame of `input_ids`."""
        with self._lock:
            self._rooms[room] = prompt_digest(input_ids)
        try:
            yield
        finally:
            with self._lock:
                self._rooms.pop(room, None)

    def frame_for(self, room: int) -> bytes | None:
        """The frame to append to a transfer info for `room`, or None outside `sending`."""
        with self._lock:
            digest = self._rooms.get(room)
            if digest is not None:
                self.num_sent += 1
        return None if digest is None else digest_frame(digest)
