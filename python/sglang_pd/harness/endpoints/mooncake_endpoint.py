"""The Mooncake side of a process pair: a TransferEngine over TCP with P2PHANDSHAKE metadata.

Writes are synchronous (batch_transfer_sync_write), so the target needs neither progress nor
notifications. `mooncake` is imported only when an endpoint is built.
"""

from __future__ import annotations

import time

import numpy as np

from sglang_pd.harness.endpoints.loopback import HOST

MOONCAKE_CHUNK = 1024               # larger batches of small (1 KiB) slices overflow its TCP lane queue (rc=-1)


class MooncakeEndpoint:
    """A Mooncake TransferEngine over TCP (P2PHANDSHAKE metadata), buffers registered one by one."""

    def __init__(self, name: str, bufs: list[np.ndarray]):
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        rc = self.engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake initialize failed (rc={rc})")
        self.addrs = [b.ctypes.data for b in bufs]
        for buf in bufs:
            if self.engine.register_memory(buf.ctypes.data, buf.nbytes) != 0:
                raise RuntimeError("Mooncake register_memory failed")
        self.session = ""

    def info(self) -> dict:
        """What the peer needs to connect: this engine's RPC session address."""
        return {"session": f"{HOST}:{self.engine.get_rpc_port()}"}

    def connect(self, info: dict) -> None:
        """Remember the peer's session (initiator side); every write names it."""
        self.session = info["session"]

    def progress(self) -> None:
        """The engine's own threads serve the target side."""

    def wait_notif(self, tag: bytes, timeout_s: float) -> None:
        """batch_transfer_sync_write returns only after the target holds the data."""

    def write(self, local: np.ndarray, remote: np.ndarray, tag: bytes, timeout_s: float) -> float:
        """Write every descriptor in chunks of <= MOONCAKE_CHUNK; returns the setup seconds."""
        t0 = time.perf_counter()
        src, dst, lens = local[:, 0].tolist(), remote[:, 0].tolist(), local[:, 1].tolist()
        setup = time.perf_counter() - t0
        for i in range(0, len(src), MOONCAKE_CHUNK):
            part = slice(i, i + MOONCAKE_CHUNK)
            rc = self.engine.batch_transfer_sync_write(self.session, src[part], dst[part], lens[part])
            if rc != 0:
                raise RuntimeError(f"Mooncake batch_transfer_sync_write failed (rc={rc})")
        return setup

    def close(self) -> None:
        """Unregister the buffers."""
        for addr in self.addrs:
            self.engine.unregister_memory(addr)
