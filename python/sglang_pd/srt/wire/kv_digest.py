"""KV integrity before the tree: prefill digests the KV it sends for a room, decode checks it before use.

  prefill: when a room's last chunk is sent, BLAKE2b-128 over the K then V rows of every layer for the
           token slots past the prefix decode holds (`[decode_prefix_len, prompt_len)` of the request's
           row), in layer order; the room's Success status message then ends with one frame of ours,
           DIGEST_MARKER + those 16 bytes, before the auth trailer (so the MAC covers it);
  decode:  the handshake gate takes that frame off (SGLang's parser never sees it) and records it for the
           room; when the room's request leaves the transfer queue, before SGLang builds its first decode
           batch or caches any of its KV, decode digests the same rows of its own row and compares. A
           mismatch, or a missing digest while digests are on, fails the request (HTTP 500 naming the
           room), frees its pages without inserting them into the radix tree, and is counted and logged.

What this catches: any change to those KV bytes between prefill's pool and decode's first read (the
transport, a page written over on decode's side before use, a wrong page index on either side). Why not
SGLang's own `disaggregation_enable_kv_checksum`: its adler32 needs CUDA tensors (`KvChecksumComputer`
asserts `is_cuda`), is not collision resistant, and its value rides in the aux metadata buffers that the
transfer engine writes unauthenticated. The digest here is computed on any device and travels in the
status message that peer authentication signs (with SGLANG_PD_PEER_SECRET_FILE; without a secret it
still catches accidental corruption, not a forger). The digest range matches upstream's checksum range
(prefill from the decode_prefix_len it was told, decode from its protected prefix length).

Pure Python + torch/hashlib; no SGLang import. Thread-safety: `SentKvDigests.put` runs on prefill's
scheduler thread and `frame_for` on whichever thread sends the status; `ReceivedKvDigests.record` on
decode's rank-socket reader, `check` on its scheduler thread; each table has one lock.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Iterable, NamedTuple

from sglang_pd.srt.wire.fields import split_marked_frame

DIGEST_MARKER = b"sglang_pd:kv-blake2b/16:"
DIGEST_BYTES = 16
MAX_ROOMS = 65536  # digests kept per table (oldest dropped first)


def pool_layers(pool) -> list[tuple]:
    """(key buffer, value buffer) of every layer of an MHA KV pool, in layer order (SGLang's MHATokenToKVPool
    API: start_layer, layer_num, get_key_buffer, get_value_buffer)."""
    layers = range(pool.start_layer, pool.start_layer + pool.layer_num)
    return [(pool.get_key_buffer(i), pool.get_value_buffer(i)) for i in layers]


def kv_digest(layers: Iterable[tuple], slots) -> bytes:
    """BLAKE2b-128 over K then V of `slots` (1-D slot indices) in every layer of `layers`, the
    (key buffer, value buffer) pairs of a KV pool in layer order. Read-only."""
    import torch

    hasher = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for keys, values in layers:
        for buf in (keys, values):
            rows = buf.index_select(0, slots.to(buf.device)).contiguous().cpu()
            hasher.update(rows.view(-1).view(torch.uint8).numpy().tobytes())
    return hasher.digest()


def digest_frame(digest: bytes) -> bytes:
    """The frame prefill appends to a room's Success status."""
    return DIGEST_MARKER + digest


def split_kv_digest(frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """(frames without a trailing KV digest frame, its digest or None). Raises FrameError when the last
    frame is ours but not DIGEST_MARKER + 16 bytes."""
    return split_marked_frame(frames, DIGEST_MARKER, DIGEST_BYTES, "KV digest")


class _RoomTable:
    """room -> digest, bounded (the oldest room dropped first), one lock."""

    def __init__(self, max_rooms: int):
        self.max_rooms = max_rooms
        self._rooms: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def _put(self, room: int, digest: bytes) -> None:
        with self._lock:
            self._rooms.pop(room, None)
            self._rooms[room] = digest
            while len(self._rooms) > self.max_rooms:
                self._rooms.popitem(last=False)

    def _pop(self, room: int) -> bytes | None:
        with self._lock:
            return self._rooms.pop(room, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)


class SentKvDigests(_RoomTable):
    """Prefill: the digest of each room whose last chunk was handed to the transfer engine, until its
    Success status is sent (or the room ends without one: `drop`)."""

    def __init__(self, max_rooms: int = MAX_ROOMS):
        super().__init__(max_rooms)
        self.num_computed = self.num_sent = 0

    def put(self, room: int, digest: bytes) -> None:
        self._put(room, digest)
        self.num_computed += 1

    def frame_for(self, room: int) -> bytes | None:
        """The frame to append to `room`'s Success status (consumed), or None when none was computed."""
        digest = self._pop(room)
        if digest is None:
            return None
        self.num_sent += 1
        return digest_frame(digest)

    def drop(self, room: int) -> None:
        self._pop(room)

    def snapshot(self) -> dict:
        return {"num_computed": self.num_computed, "num_sent": self.num_sent, "num_held": len(self)}


class KvCheck(NamedTuple):
    """Decode's verdict on one request's transferred KV: `problem` None when it may be used."""

    room: int
    problem: str | None
    missing: bool = False  # no digest arrived (else a mismatch, when `problem` is set)


class ReceivedKvDigests(_RoomTable):
    """Decode: the digest each room's Success status carried, until the room's request is checked."""

    def __init__(self, max_rooms: int = MAX_ROOMS):
        super().__init__(max_rooms)
        self.num_recorded = self.num_matched = self.num_mismatched = self.num_missing = 0

    def record(self, room: int, digest: bytes) -> None:
        self._put(room, digest)
        self.num_recorded += 1

    def check(self, room: int, actual: bytes, num_tokens: int) -> KvCheck:
        """Compare `actual` (decode's digest of the room's `num_tokens` transferred rows) with the recorded
        one, consuming it. Missing counts as a failure: digests are on, so prefill must have sent one."""
        expected = self._pop(room)
        if expected is None:
            self.num_missing += 1
            return KvCheck(room, f"sglang_pd: no KV digest arrived for room {room} (SGLANG_PD_KV_DIGEST is on here; "
                                 f"is it on at prefill?): its {num_tokens} transferred KV rows are not used", True)
        if expected != actual:
            self.num_mismatched += 1
            return KvCheck(room, f"sglang_pd: KV digest mismatch for room {room}: the {num_tokens} KV rows decode "
                                 f"holds are not the ones prefill sent (expected {expected.hex()}, got {actual.hex()})")
        self.num_matched += 1
        return KvCheck(room, None)

    def snapshot(self) -> dict:
        return {"num_recorded": self.num_recorded, "num_matched": self.num_matched,
                "num_mismatched": self.num_mismatched, "num_missing": self.num_missing, "num_held": len(self)}
