"""Ports the harness hands to the servers it starts, and reading a lost port race from a server's log.

Every TCP port an SGLang server of ours listens on is chosen here and passed on its command line: the
HTTP `--port`, prefill's `--disaggregation-bootstrap-port`, and `--nccl-port`, the torch.distributed
rendezvous port its scheduler binds (a TCPStore, even with one rank). Left unset, SGLang 0.5.23 picks
that last one itself (`PortArgs.init_new`: `get_free_port_below_ephemeral`, a random free port in
22000-29999 probed then released by the launcher; the scheduler child binds it seconds later), in the
same band as ours, so two servers starting together on one box could draw the same one, or lose it to
any socket in between; one of five held-out deployment starts failed so (EADDRINUSE on 23876).
What SGLang still binds itself is bound atomically (ZMQ `bind_to_random_port`; mooncake's transfer
engine retries its own 12000-17000 ports), so no race is left open there.

A choice is still only free when made: a port can be taken before the server binds it (another
process on the box). `taken_flags` reads the server's log for the lines that say so, and the server
is restarted on fresh ports (server.wait_healthy_rebinding), counted in the deployment's `port_rebinds`.
"""

from __future__ import annotations

import random
import re
import socket
import threading
from collections import deque
from pathlib import Path

_PORT_FLOOR = 20000  # below: transfer engines' own port ranges (mooncake picks ~12000-17000 here)
_RECENT = 4096       # ports remembered as handed out by this process (never handed out twice meanwhile)

# asyncio's create_server failing to bind (uvicorn's HTTP port, aiohttp's bootstrap server): the port named.
_ASYNCIO_BIND = re.compile(r"error while attempting to bind on address \('[^']*', (\d+)\).*address already in use")
# torch.distributed's TCPStore (the scheduler's rendezvous on --nccl-port): the port named.
_TORCH_STORE = re.compile(r"failed to listen on any local network address\. port: (\d+),.*EADDRINUSE")
# sglang-router (Rust) on its HTTP or Prometheus port: no port named.
_ANONYMOUS = re.compile(r"Address already in use \(os error 98\)")

_lock = threading.Lock()
_recent: deque[int] = deque(maxlen=_RECENT)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems have no such file


def _bindable(port: int) -> bool:
    # Both sides: SGLang's TCPStore binds 0.0.0.0, its HTTP and bootstrap servers 127.0.0.1.
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A TCP port that was free a moment ago, chosen below the kernel's ephemeral range, and not one this
    process handed out among its last _RECENT choices (a deployment takes all its ports before any
    server binds one; two of them must never be equal).

    SGLang binds its ports only after loading the model (~25 s here). An ephemeral port (what every
    outgoing connection gets: health polls, clients, ZMQ, transfer engines) could be taken by a
    connection in that window and stop the server; ports below that range are never handed out so.
    Where the range starts too low to leave room, the OS picks (bind to port 0)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    with _lock:
        for _ in range(200 if low - _PORT_FLOOR >= 1000 else 0):
            port = rng.randrange(_PORT_FLOOR, low)
            if port not in _recent and _bindable(port):
                _recent.append(port)
                return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        _recent.append(port)
        return port


def taken_flags(log_text: str, ports: dict[str, int]) -> list[str]:
    """The flags of `ports` (flag -> port a server was told to bind) that `log_text` says could not be
    bound because another socket holds them; every flag when the log says so without naming a port
    (sglang-router). Empty when the log reports no lost race. Pure."""
    named = {int(m.group(1)) for pattern in (_ASYNCIO_BIND, _TORCH_STORE) for m in pattern.finditer(log_text)}
    if not named and _ANONYMOUS.search(log_text):
        return list(ports)
    return [flag for flag, port in ports.items() if port in named]
