"""The target process of a pair: owns the destination buffers, clears and verifies them on command."""

from __future__ import annotations

import os
import traceback

from sglang_pd.bench.transfer.buffers import VerificationError, clear_pages, make_buffers, verify_pages
from sglang_pd.bench.transfer.layout import Geometry
from sglang_pd.harness.endpoints.loopback import apply_env
from sglang_pd.bench.transfer.pipe import recv_within
from sglang_pd.bench.transfer.transports import ENDPOINTS


def target_main(kind: str, conn, geom: Geometry, timeout_s: float) -> None:
    """Target process: owns the destination buffers; clears/verifies pages on request until 'stop'.

    First sends ("ready", info + buffer addresses) or ("error", traceback); then answers every
    command on `conn` (see `pipe`). Closes its endpoint on the way out."""
    apply_env()
    try:
        bufs = make_buffers(geom, pattern=False)
        ep = ENDPOINTS[kind](f"bench-target-{os.getpid()}", bufs)
        conn.send(("ready", {**ep.info(), "addrs": [b.ctypes.data for b in bufs]}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            op, *args = recv_within(conn, timeout_s, "command", ep.progress)
            if op == "stop":
                break
            try:
                if op == "clear":
                    clear_pages(bufs, geom, *args)
                elif op == "verify":
                    ep.wait_notif(args[0], timeout_s)
                    verify_pages(bufs, geom, args[1])
                conn.send(("ok",))
            except VerificationError as exc:
                conn.send(("verify_failed", str(exc)))
            except Exception as exc:  # reported to the initiator, which fails the backend
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        ep.close()
