"""What the `HandshakeGate` asks of the KV manager it guards (`GateHost`), and what a registration told it.

The gate holds no SGLang object: the hook layer hands it a host (manager_host.ManagerHost over
SGLang's manager; tests pass a small fake). Pure; no SGLang import.
"""

from __future__ import annotations

import enum
from typing import Callable, NamedTuple, Protocol


class PeerRecord(NamedTuple):
    """What a registration told this server about a peer."""

    endpoint: str
    port: int
    num_slots: int | None = None  # NIXL: pages the peer's pool has (index bound); None if unknown
    state_slots: tuple[int, ...] | None = None  # NIXL: slots per state pool (pool_bounds.state_slots); None if unknown


class PeerRemoval(enum.Enum):
    """What `GateHost.forget_peer` did."""

    FORGOTTEN = "forgotten"   # removed from SGLang's registration table (and NIXL's remote agents)
    IN_USE = "in_use"         # a room's transfer info still names it: kept
    UNKNOWN = "unknown"       # not registered (SGLang did not store it, or it was forgotten before)


class GateHost(Protocol):
    """The KV manager as the gate sees it (implemented over SGLang's manager by manager_host.py)."""

    def registered_peer(self, name: str) -> PeerRecord | None: ...
    def num_registered(self) -> int: ...
    def endpoint_registered(self, target: tuple[str, int]) -> bool: ...
    def room_claimed(self, room: int) -> bool: ...
    def fail_room(self, room: int, reason: str, notify: tuple[str, int] | None) -> bool: ...
    def drop_unclaimed(self, room: int, reason: str) -> bool: ...
    def forget_peer(self, name: str) -> PeerRemoval: ...
    def prune(self) -> None: ...
    def send_drained_tells(self) -> tuple[list[int], list[int]]: ...


def registered_endpoint(registered_peer: Callable[[str], PeerRecord | None], name: str,
                        target: tuple[str, int]) -> bool:
    """True when peer `name` registered exactly `target` (endpoint, port): the only kind of address prefill
    sends a room's status to, so no message can make it write where the message says (read-only)."""
    record = registered_peer(name)
    return record is not None and (record.endpoint, record.port) == target
