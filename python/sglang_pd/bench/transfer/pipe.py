"""The command pipe between initiator and target: deadline-bounded receive and request/reply.

Commands are tuples (op, *args): ("clear", page_size, dst_pages), ("verify", tag, case), ("stop",).
Replies are ("ok",), ("verify_failed", message) or ("error", message).
"""

from __future__ import annotations

import time
from typing import Callable

from sglang_pd.bench.transfer.buffers import VerificationError


def recv_within(conn, timeout_s: float, what: str, idle: Callable[[], None] | None = None):
    """conn.recv() with a deadline; `idle` runs between short polls (target-side progress).

    Raises TimeoutError naming `what` when nothing arrives within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.002 if idle else 0.2):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
        if idle:
            idle()
    return conn.recv()


def call_target(conn, timeout_s: float, *msg):
    """Send a command to the target and wait for its answer; target-side failures re-raised here.

    Raises VerificationError for a failed verify, RuntimeError for any other target error."""
    conn.send(msg)
    reply = recv_within(conn, timeout_s, f"target reply to {msg[0]!r}")
    if reply[0] == "verify_failed":
        raise VerificationError(reply[1])
    if reply[0] != "ok":
        raise RuntimeError(f"target failed on {msg[0]!r}: {reply[1]}")
    return reply
