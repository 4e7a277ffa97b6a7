"""One child server process: started in its own process group, health-waited, stopped by PID."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time; the message carries its log tail."""


class PortTakenError(ServerStartError):
    """The server could not bind its own --port: another socket took it between `free_port()` and the
    bind (which SGLang does only after loading the model). The deployment restarts it on a new port."""


# uvicorn's line when the HTTP port is taken (SGLang's process then stays up, without an HTTP server).
_BIND_FAILURE = re.compile(r"error while attempting to bind on address \('[^']*', (\d+)\).*address already in use")
_PORT_FLOOR = 20000  # below: transfer engines' own port ranges (mooncake picks ~12000-16000 here)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems have no such file


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, chosen below the kernel's ephemeral range.

    SGLang binds its HTTP port only after loading the model (~25 s here). An ephemeral port (what
    every outgoing connection gets: health polls, clients, ZMQ, transfer engines) could be taken by a
    connection in that window and stop the server; ports below that range are never handed out so.
    Where the range starts too low to leave room, the OS picks (bind to port 0)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(100 if low - _PORT_FLOOR >= 1000 else 0):
        port = rng.randrange(_PORT_FLOOR, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def group_pids(pgid: int) -> list[int]:
    """Live processes (zombies excluded) whose process group is `pgid` (Linux /proc), ascending."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # fields after the parenthesised command: state ppid pgrp ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return sorted(pids)


def log_tail(path: Path, num_lines: int = 40) -> str:
    """The last `num_lines` lines of a log file ('' if it does not exist)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])


class ServerProcess:
    """A command run as a child in a new session (so its whole process tree is one group).

    `start()` launches, `wait_healthy()` polls `health_path`, `stop()` ends exactly this group.
    """

    def __init__(self, name: str, argv: list[str], env: dict, port: int, log_dir: Path,
                 health_path: str = "/health", cpus: frozenset[int] | None = None):
        self.name = name
        self.cpus = cpus  # CPU affinity of the process and (inherited) its children; None: the parent's
        self.argv = argv
        self.env = env
        self.port = port
        self.log_path = Path(log_dir) / f"{name}.log"
        self.health_path = health_path
        self.proc: subprocess.Popen | None = None
        self._log_start = 0

    @property
    def url(self) -> str:
        """Base URL on loopback."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Launch the process (output to its log file). Raises if already started."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started (pid {self.proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            pin = None if self.cpus is None else (lambda: os.sched_setaffinity(0, self.cpus))
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=pin)

    def is_running(self) -> bool:
        """True while the launched process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, deadline: float) -> None:
        """Block until GET health_path answers 200 or `deadline` (time.monotonic()) passes.

        Raises PortTakenError at once if the server logs that its --port is taken, ServerStartError with
        the log tail if the process exits or time runs out.
        """
        while True:
            if not self.is_running():
                raise ServerStartError(f"{self.name} exited with {self.proc.returncode if self.proc else None}"
                                       f"; log {self.log_path}:\n{log_tail(self.log_path)}")
            try:
                if requests.get(self.url + self.health_path, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.port_taken():
                raise PortTakenError(f"{self.name} could not bind its port {self.port} (taken by another "
                                     f"socket since it was chosen); log {self.log_path}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} not healthy in time; log {self.log_path}:\n"
                                       f"{log_tail(self.log_path)}")
            time.sleep(1.0)

    def port_taken(self) -> bool:
        """True if this run's log (since the last start) says its own --port could not be bound."""
        if not self.log_path.exists():
            return False
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            text = log.read().decode(errors="replace")
        return any(int(m.group(1)) == self.port for m in _BIND_FAILURE.finditer(text))

    def rebind(self, port: int) -> None:
        """Stop this server and start it again on `port` (same argv otherwise); does not wait."""
        self.stop(grace_s=0)
        self.proc = None
        at = self.argv.index("--port") + 1
        self.argv = [*self.argv[:at], str(port), *self.argv[at + 1:]]
        self.port = port
        self.start()

    def stop(self, grace_s: float = 20.0) -> bool:
        """SIGTERM this process group, SIGKILL it after `grace_s`; safe to call twice.

        Returns True when the process exited within the grace period on its own (or was not running).
        """
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)  # reap stragglers a dead leader may have left
            return True
        self._kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
            graceful = True
        except subprocess.TimeoutExpired:
            graceful = False
        self._kill_group(signal.SIGKILL)
        self.proc.wait(timeout=10)
        return graceful

    def kill(self) -> None:
        """SIGKILL this process group at once (a crash, as far as peers can tell) and reap it."""
        if self.proc is not None:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def restart(self, deadline: float) -> None:
        """Start this server again (same argv, env and port) after it stopped or died; wait for health.
        Its CPUs are kept; a deployment's scheduler move is redone by PDDeployment.restart, not here."""
        self.stop(grace_s=0)
        self.proc = None
        self.start()
        self.wait_healthy(deadline)

    def _kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group id is the child's pid (new session)
        except (ProcessLookupError, PermissionError):
            pass


def wait_healthy_rebinding(server: ServerProcess, deadline: float, attempts: int = 3) -> list[tuple[int, int]]:
    """`server.wait_healthy`; if its port was taken before it could bind it, restart it on a new port
    (at most `attempts` tries in all, each restart printed). Returns the (taken port, new port) pairs."""
    moves: list[tuple[int, int]] = []
    for attempt in range(1, attempts + 1):
        try:
            server.wait_healthy(deadline)
            return moves
        except PortTakenError as exc:
            if attempt == attempts:
                raise
            old, new = server.port, free_port()
            print(f"sglang_pd harness: {exc}; restarting {server.name} on port {new}", file=sys.stderr)
            moves.append((old, new))
            server.rebind(new)
    return moves
