"""Keeping every transport on 127.0.0.1: the host to bind and the environment that pins UCX/Mooncake."""

from __future__ import annotations

import os

HOST = "127.0.0.1"
LOOPBACK_ENV = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib", "MC_FORCE_TCP": "1"}


def apply_env() -> None:
    """Loopback-only UCX without the InfiniBand module (it segfaults at exit here), Mooncake on TCP.

    Mutates os.environ; must run before anything loads UCX (in the parent and in every child)."""
    os.environ.update(LOOPBACK_ENV)
