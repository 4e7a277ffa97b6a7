"""`check_message`: every message a PD rank socket accepts, checked on bare frames against its schema.

SGLang 0.5.23 parses these messages in the receiving thread with no error handling: one malformed
frame raises there and ends the thread (prefill then pairs no new request until restarted), and
some fields are parsed again later by another thread or the scheduler. `check_message` routes a
message by the catalogue (catalogue.py: which kinds this backend and side accept, their tags, the
NIXL guard frame, the staging switch), refuses a kind the catalogue does not list, and runs the
kind's schema (prefill_schemas, decode_schemas, staging_schemas) before any upstream code sees the
message, naming the room when it is readable so that only that room fails. Pure; never raises.
"""

from __future__ import annotations

from typing import Callable

from sglang_pd.srt.wire import decode_schemas as decode
from sglang_pd.srt.wire import fields as ff
from sglang_pd.srt.wire import prefill_schemas as prefill
from sglang_pd.srt.wire import staging_schemas as staging
from sglang_pd.srt.wire.catalogue import (BACKEND_NAMES, CATALOGUE, MAX_FRAMES, NIXL_GUARD, Catalogue,
                                               MessageKind, MessageSpec, side_specs)
from sglang_pd.srt.wire.fields import FrameError, FrameLimits
from sglang_pd.srt.wire.verdict import FrameReader, Verdict

Schema = Callable[[list[bytes], FrameLimits, FrameReader], None]

# The schema of each catalogue entry, by its name (a test holds the two to the same names).
SCHEMAS: dict[str, Schema] = {
    "ABORT": prefill.abort,
    "decline": prefill.decline,
    "BOOTSTRAP": prefill.bootstrap,
    "mooncake registration": prefill.mooncake_registration,
    "NIXL registration": prefill.nixl_registration,
    "mooncake transfer info": prefill.mooncake_transfer_info,
    "NIXL transfer info": prefill.nixl_transfer_info,
    "transfer status": decode.status,
    "NIXL transfer status": decode.nixl_status,
    "ABORT_ACK": decode.abort_ack,
    "AUX_DATA": decode.aux_data,
    "WATERMARK": staging.watermark,
    "STAGING_RSP": staging.staging_rsp,
    "STAGING_REQ": staging.staging_req,
    "CHUNK_READY": staging.chunk_ready,
}


def check_message(msg: list[bytes], limits: FrameLimits, catalogue: Catalogue = CATALOGUE) -> Verdict:
    """Check one message (auth trailer and our appended frames already removed) against its catalogue
    entry and schema. Pure; never raises."""
    if not msg:
        return Verdict(MessageKind.UNKNOWN, "empty message")
    if len(msg) > MAX_FRAMES:
        return Verdict(MessageKind.UNKNOWN, f"{len(msg)} frames, more than any PD message has ({MAX_FRAMES})")
    spec, kind, body = route(msg, limits, catalogue)
    reader = FrameReader(kind, spec)
    long = max(range(len(msg)), key=lambda i: len(msg[i]))
    if len(msg[long]) > limits.max_frame_bytes:
        return reader.verdict(f"{kind.value}: frame {long} has {len(msg[long])} bytes, more than the "
                              f"{limits.max_frame_bytes} any field of this pool needs")
    if spec is None:
        return reader.verdict(body)  # body carries the reason when no entry applies
    schema = SCHEMAS.get(spec.name)
    if schema is None:
        return reader.verdict(f"{spec.name}: catalogued, but no schema checks it")
    try:
        schema(body, limits, reader)
    except FrameError as exc:
        what = f"room {reader.room}" if reader.room is not None else "unknown room"
        return reader.verdict(f"malformed {kind.value} ({what}): {exc}")
    return reader.verdict()


def route(msg: list[bytes], limits: FrameLimits, catalogue: Catalogue = CATALOGUE):
    """(entry, kind, frames its schema reads) for the message, or (None, kind, reason) when no catalogue
    entry of this backend and side takes it (read-only)."""
    specs = side_specs(limits.backend, limits.side, catalogue)
    spec = _tagged(specs, msg, guarded=False)
    if spec is None and any(s.guarded for s in specs):
        if msg[0] != NIXL_GUARD:
            return None, MessageKind.UNKNOWN, f"no {NIXL_GUARD!r} guard frame and no known tag (foreign traffic)"
        msg = msg[1:]
        if not msg:
            return None, MessageKind.UNKNOWN, "guard frame alone"
        spec = _tagged(specs, msg, guarded=True) or _untagged(specs, guarded=True)
    elif spec is None:
        spec = _untagged(specs, guarded=False)
    if spec is None:
        return _not_this_sides(msg[0], limits, catalogue)
    if spec.staging and not limits.staging:
        return None, spec.kind, f"{spec.tag.decode()} but this server's staging buffer is off"
    return spec, spec.kind, msg


def _tagged(specs: tuple[MessageSpec, ...], msg: list[bytes], guarded: bool) -> MessageSpec | None:
    """The entry whose tag (and marker, ours under an upstream tag: checked first) `msg` starts with."""
    found = None
    for spec in specs:
        if spec.guarded is not guarded or spec.tag is None or msg[0] != spec.tag:
            continue
        if spec.marker is None:
            found = found or spec
        elif len(msg) > spec.marker[0] and msg[spec.marker[0]] == spec.marker[1]:
            return spec
    return found


def _untagged(specs: tuple[MessageSpec, ...], guarded: bool) -> MessageSpec | None:
    """The side's message without a tag (a transfer info, mooncake's status), if it has one."""
    return next((s for s in specs if s.guarded is guarded and s.tag is None), None)


def _not_this_sides(head: bytes, limits: FrameLimits, catalogue: Catalogue):
    """(None, kind, reason) for a message no entry of this side takes: another backend's tag is named."""
    for (backend, side), specs in catalogue.items():
        other = next((s for s in specs if s.tag == head), None) if side is limits.side else None
        if other is not None and backend != limits.backend:
            return None, other.kind, f"{head.decode()} is a {BACKEND_NAMES[backend]} message"
    return (None, MessageKind.UNKNOWN, f"no known tag ({ff.shown(head)}): not a "
            f"{BACKEND_NAMES.get(limits.backend, limits.backend)} {limits.side.value} message")
