"""The transports a process pair can run, by CLI name, and the rows (labels) each one produces.

Every endpoint class has the same narrow interface (`Endpoint`); endpoint modules import their
transport package only inside `__init__`, so this registry imports nothing heavy.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sglang_pd.harness.endpoints.mooncake_endpoint import MooncakeEndpoint
from sglang_pd.harness.endpoints.nixl_endpoint import NixlEndpoint


class Endpoint(Protocol):
    """One process's side of a transport; built as `cls(agent_name, buffers)`, which registers them."""

    def info(self) -> dict:
        """Picklable connection info for the peer."""

    def connect(self, info: dict) -> None:
        """Initiator side: connect to the target from its `info()`."""

    def progress(self) -> None:
        """Target side: make progress between command polls (may do nothing)."""

    def wait_notif(self, tag: bytes, timeout_s: float) -> None:
        """Target side: return once the write tagged `tag` has landed; TimeoutError otherwise."""

    def write(self, local: np.ndarray, remote: np.ndarray, tag: bytes, timeout_s: float) -> float:
        """Initiator side: WRITE every (addr, len, dev) row to the peer, return the setup seconds."""

    def close(self) -> None:
        """Release the peer and the registered buffers."""


ENDPOINTS: dict[str, type[Endpoint]] = {"nixl": NixlEndpoint, "mooncake": MooncakeEndpoint}
# kind -> ((row label, coalesce page runs?), ...); the first label names the kind's Skip
MODES = {"nixl": (("nixl", False), ("nixl+coalesce", True)), "mooncake": (("mooncake_tcp", False),)}
