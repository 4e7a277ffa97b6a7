"""Test-only fault injection, armed per process through SGLang's set_internal_state channel.

Disabled unless the server runs with SGLANG_PD_ENABLE_FAULT_INJECTION=1 (`Settings.fault_injection`,
handed to FaultPlan): a production server neither mounts the route nor accepts the keys. Each fault
fires for the next N requests that reach its injection point, then disarms; `<fault>_room` keys instead target one bootstrap room
(so concurrent traffic cannot consume a fault meant for a given request).

Power checks (tests that break a path on purpose and see the output change) use the faults that
corrupt KV: `kv_page_corrupt`, `prefix_page_ahead`, `shared_merge_average`, `local_extend_kv_shift`.
`kv_probe` breaks nothing: it copies the room's prompt KV when its request releases its row, for a test
to compare page by page (`kv_probes` in the snapshot).
"""

from __future__ import annotations

import base64
import enum
import time
from collections import OrderedDict
from typing import NamedTuple

from sglang_pd.config import ENABLE_FAULT_INJECTION

KEY_PREFIX = "sglang_pd_fault_"
ROOM_SUFFIX = "_room"


class Fault(str, enum.Enum):
    """Where and how a fault bends the flow."""

    PREFIX_UNALIGNED = "prefix_unaligned"   # tell prefill decode_prefix_len + 1
    PREFIX_EXCEEDS = "prefix_exceeds"       # tell prefill prompt_len + page_size
    TRANSFER_FAIL = "transfer_fail"         # decode marks the room failed right after prealloc
    NIXL_STALL = "nixl_stall"               # prefill: the room's NIXL transfer never reports done
    LOCAL_QUEUE_HOLD = "local_queue_hold"   # decode: a local-prefill request waits 5 s before its extend
    LOCAL_EXTEND_DELAY = "local_extend_delay"  # decode: the local extend carrying the room starts 3 s late
    PREFILL_TRANSFER_FAIL = "prefill_transfer_fail"  # prefill: the transport reports the room's send failed
    PREFILL_WORKER_ERROR = "prefill_worker_error"    # prefill: the mooncake transfer worker raises on the room
    RANK_READER_EXIT = "rank_reader_exit"   # the rank socket's reading thread raises on its next message
    PREFILL_BOOTSTRAP_HOLD = "prefill_bootstrap_hold"  # prefill: a bootstrapped room waits 10 s before its forward
    PREFILL_SEND_DELAY = "prefill_send_delay"  # prefill: the mooncake send of the room's KV starts 5 s late
    PREFILL_WAITING_HOLD = "prefill_waiting_hold"  # prefill: a bootstrapped room waits 10 s in the waiting queue
    KV_PAGE_CORRUPT = "kv_page_corrupt"     # decode: the room's first transferred page is overwritten on arrival
    PREFIX_PAGE_AHEAD = "prefix_page_ahead"  # decode: tell prefill one page more prefix than held, skip its slots
    SHARED_MERGE_AVERAGE = "shared_merge_average"  # decode: the next N shared-prefix forwards average partials
    LOCAL_EXTEND_KV_SHIFT = "local_extend_kv_shift"  # decode: the room's local extend writes each KV one slot off
    KV_PROBE = "kv_probe"                   # any server: copy the room's prompt KV when it releases its row


class HandoffBend(NamedTuple):
    """What a fault changes in decode's hand-off to prefill: the decode_prefix_len told (None: unchanged)
    and how many of the leading slots are not handed over."""

    decode_prefix_len: int | None
    num_slots_skipped: int


class FaultPlan:
    """Armed faults and how often each fired. Mutated on the scheduler thread only."""

    def __init__(self, enabled: bool):
        self.enabled = enabled  # False: every arm_from_keys with a fault key is refused
        self.armed: dict[Fault, int] = {}
        self.rooms: dict[int, set[Fault]] = {}
        self.fired: dict[Fault, int] = {}
        self.hold_until: dict[Fault, dict[int, float]] = {}  # a holding fault -> room -> monotonic time let go
        self.kv_probes: OrderedDict[int, dict] = OrderedDict()  # room -> its prompt KV (kv_probe), newest last

    def arm(self, fault: Fault, count: int) -> None:
        """Fire `fault` for the next `count` requests (count 0 disarms)."""
        if count < 0:
            raise ValueError(f"fault count must be >= 0, got {count}")
        self.armed[fault] = int(count)

    def arm_room(self, fault: Fault, room: int) -> None:
        """Fire `fault` once, for the request of bootstrap room `room` only."""
        self.rooms.setdefault(int(room), set()).add(fault)

    def take(self, fault: Fault, room: int | None = None) -> bool:
        """Consume one firing of `fault` for a request of `room`; True if it should fire now."""
        targeted = self.rooms.get(room) if room is not None else None
        if targeted and fault in targeted:
            targeted.discard(fault)
            if not targeted:
                del self.rooms[room]
        elif self.armed.get(fault, 0) > 0:
            self.armed[fault] -= 1
        else:
            return False
        self.fired[fault] = self.fired.get(fault, 0) + 1
        return True

    def holding(self, fault: Fault, room: int, seconds: float, may_start: bool = True) -> bool:
        """Whether `room` is held by the holding `fault` now: the first call that finds it armed for the room
        (and `may_start`) takes it and starts a hold of `seconds`; once over, the hold is forgotten."""
        holds = self.hold_until.setdefault(fault, {})
        if room not in holds:
            if not may_start or not self.take(fault, room):
                return False
            holds[room] = time.monotonic() + seconds
        if time.monotonic() < holds[room]:
            return True
        holds.pop(room)
        return False

    def bend_handoff(self, room: int, decode_prefix_len: int, prompt_len: int, num_slots: int,
                     page_size: int) -> HandoffBend:
        """Consume the first of PREFIX_UNALIGNED (one token more), PREFIX_EXCEEDS (past the prompt) and
        PREFIX_PAGE_AHEAD armed for `room`. PREFIX_PAGE_AHEAD tells prefill one page more prefix than decode
        holds and hands over no slots for that page: the page keeps whatever the pool had there, as a decode
        reusing a page it does not hold would (only with more than a page of slots)."""
        if self.take(Fault.PREFIX_UNALIGNED, room):
            return HandoffBend(decode_prefix_len + 1, 0)
        if self.take(Fault.PREFIX_EXCEEDS, room):
            return HandoffBend(prompt_len + page_size, 0)
        if num_slots > page_size and self.take(Fault.PREFIX_PAGE_AHEAD, room):
            return HandoffBend(decode_prefix_len + page_size, page_size)
        return HandoffBend(None, 0)

    def arm_from_keys(self, server_args: dict) -> dict:
        """Arm every `sglang_pd_fault_<name>` key; return the remaining (SGLang's own) keys.

        Raises ValueError naming an unknown fault or when injection is not enabled.
        """
        ours = {k: v for k, v in server_args.items() if k.startswith(KEY_PREFIX)}
        if ours and not self.enabled:
            raise ValueError(f"fault injection is disabled (set {ENABLE_FAULT_INJECTION}=1 on the server)")
        for key, value in ours.items():
            name = key[len(KEY_PREFIX):]
            by_room = name.endswith(ROOM_SUFFIX)
            name = name[: -len(ROOM_SUFFIX)] if by_room else name
            try:
                fault = Fault(name)
            except ValueError:
                raise ValueError(f"unknown fault {name!r}; known: {[f.value for f in Fault]}") from None
            if by_room:
                self.arm_room(fault, int(value))
            else:
                self.arm(fault, int(value))
        return {k: v for k, v in server_args.items() if not k.startswith(KEY_PREFIX)}

    def keep_probe(self, room: int, probe: dict) -> None:
        """Keep `probe` (read_kv's) for `room`; the MAX_PROBES newest are kept."""
        self.kv_probes[int(room)] = probe
        while len(self.kv_probes) > MAX_PROBES:
            self.kv_probes.popitem(last=False)

    def snapshot(self) -> dict:
        """JSON-able armed/fired counts, and the KV probes taken."""
        return {"armed": {f.value: n for f, n in self.armed.items()},
                "armed_rooms": len(self.rooms),
                "fired": {f.value: n for f, n in self.fired.items()},
                "kv_probes": {str(room): probe for room, probe in self.kv_probes.items()}}


MAX_PROBES = 8


def _kv_buffers(pool) -> list[tuple]:
    """(key buffer, value buffer) of every layer of an MHA KV pool (SGLang's MHATokenToKVPool API)."""
    layers = range(pool.start_layer, pool.start_layer + pool.layer_num)
    return [(pool.get_key_buffer(i), pool.get_value_buffer(i)) for i in layers]


def overwrite_with_noise(pool, slots, seed: int) -> None:
    """Fault: the K and V of pool `slots` (token slot indices) in every layer become Gaussian noise of
    the layer's own scale (mutates the pool)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for keys, values in _kv_buffers(pool):
        for buf in (keys, values):
            scale = float(buf[slots].float().std()) or 1.0
            noise = torch.randn(buf[slots].shape, generator=gen) * scale
            buf[slots] = noise.to(buf.dtype).to(buf.device)


def read_kv(pool, slots) -> dict:
    """A copy of the K and V of `slots` in every layer, JSON-able: shape [layers, 2, tokens, heads, dim]
    and the float32 bytes, base64 (`decode_kv` turns it back into a tensor)."""
    import torch

    kv = torch.stack([torch.stack([k[slots], v[slots]]) for k, v in _kv_buffers(pool)]).float().cpu().contiguous()
    return {"shape": list(kv.shape), "float32_b64": base64.b64encode(kv.numpy().tobytes()).decode("ascii")}


def decode_kv(probe: dict):
    """The tensor `read_kv` encoded (float32, its shape)."""
    import numpy as np
    import torch

    data = np.frombuffer(base64.b64decode(probe["float32_b64"]), dtype=np.float32)
    return torch.from_numpy(data.copy()).view(*probe["shape"])
