"""The NIXL side of a process pair: a UCX agent over host memory ("DRAM"), polled by its owner.

No progress or listener thread: the initiator polls its transfer to DONE, the target polls for
notifications between commands. `nixl` is imported only when an endpoint is built.
"""

from __future__ import annotations

import time

import numpy as np


class NixlEndpoint:
    """A NIXL agent with the UCX backend, no progress/listener threads, buffers registered as DRAM."""

    def __init__(self, name: str, bufs: list[np.ndarray]):
        from nixl._api import nixl_agent, nixl_agent_config

        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=[])
        self.agent = nixl_agent(name, config)
        self.agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
        self.reg = self.agent.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in bufs], "DRAM")
        self.remote = None
        self.notifs: list[bytes] = []

    def info(self) -> dict:
        """What the peer needs to connect: this agent's metadata."""
        return {"metadata": self.agent.get_agent_metadata()}

    def connect(self, info: dict) -> None:
        """Add the peer agent from its `info()` and connect to it (initiator side)."""
        self.remote = self.agent.add_remote_agent(info["metadata"])
        self.agent.make_connection(self.remote)

    def progress(self) -> None:
        """Collect arrived notifications (target side; called between polls)."""
        for msgs in self.agent.get_new_notifs().values():
            self.notifs.extend(msgs)

    def wait_notif(self, tag: bytes, timeout_s: float) -> None:
        """Block until the notification `tag` arrives, consuming it; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while tag not in self.notifs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"NIXL notification {tag!r} did not arrive in {timeout_s:.0f} s")
            self.progress()
        self.notifs.remove(tag)

    def write(self, local: np.ndarray, remote: np.ndarray, tag: bytes, timeout_s: float) -> float:
        """Post one WRITE of the whole descriptor list, poll to DONE; returns the setup seconds."""
        t0 = time.perf_counter()
        handle = self.agent.initialize_xfer("WRITE", self.agent.get_xfer_descs(local, "DRAM"),
                                            self.agent.get_xfer_descs(remote, "DRAM"), self.remote, tag)
        setup = time.perf_counter() - t0
        state = self.agent.transfer(handle)
        deadline = time.monotonic() + timeout_s
        while state == "PROC":
            if time.monotonic() > deadline:
                raise TimeoutError(f"NIXL transfer still in progress after {timeout_s:.0f} s")
            state = self.agent.check_xfer_state(handle)
        self.agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        return setup

    def close(self) -> None:
        """Drop the peer and deregister the buffers."""
        if self.remote is not None:
            self.agent.remove_remote_agent(self.remote)
        self.agent.deregister_memory(self.reg)
