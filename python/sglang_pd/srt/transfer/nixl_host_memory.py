"""NIXL with the KV pool in host memory: the scope in which a host-memory manager is built (logic).

Upstream registers every KV buffer with NIXL as "VRAM"; with a CPU KV pool UCX refuses it and the
server dies at start-up. On a CPU device the hooks (srt/hooks/connection/nixl_conn.py, nixl_api.py) declare the
buffers "DRAM" and build the manager's agent inside a `HostMemoryScope`, where its busy-polling
progress thread is turned off; prefill's transfer worker then drives progress itself.

The bound on stalled transfers lives in `transfer/watch.py`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

HOST_MEMORY_KIND = "DRAM"


class HostMemoryScope:
    """Marks the code that builds a host-memory NixlKVManager (its agent must not busy-poll)."""

    def __init__(self):
        self._active = contextvars.ContextVar("sglang_pd_nixl_host_memory", default=False)

    @contextlib.contextmanager
    def entered(self, on_host: bool) -> Iterator[None]:
        """Within this block `active()` is `on_host`."""
        token = self._active.set(on_host)
        try:
            yield
        finally:
            self._active.reset(token)

    def active(self) -> bool:
        """True inside the construction of a host-memory manager (read-only)."""
        return self._active.get()
