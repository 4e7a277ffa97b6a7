"""One child server process: started in its own process group, health-waited, stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from sglang_pd.harness.ports import free_port, taken_flags


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time; the message carries its log tail."""


class PortTakenError(ServerStartError):
    """The server could not bind a port it was given (`flags`: which of its `ports`): another socket took
    it between `free_port()` and the bind (which SGLang does seconds after it starts). The deployment
    restarts it on fresh ports (wait_healthy_rebinding)."""

    def __init__(self, message: str, flags: list[str]):
        super().__init__(message)
        self.flags = flags


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


@dataclass(frozen=True)
class ProcessEntry:
    """One live process below a server: its pid, parent pid, kernel name (`comm`) and command line."""

    pid: int
    ppid: int
    comm: str
    cmdline: str


def descendants(root: int) -> list[ProcessEntry]:
    """Every live process below `root` (children, their children, ...), read from /proc, by pid."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue  # exited while we looked
    below, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
        below += frontier
    out = []
    for pid in sorted(below):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out.append(ProcessEntry(pid, parents[pid], comm, cmdline))
    return out


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
                 health_path: str = "/health", cpus: frozenset[int] | None = None,
                 other_ports: dict[str, int] | None = None):
        self.name = name
        self.cpus = cpus  # CPU affinity of the process and (inherited) its children; None: the parent's
        self.argv = argv
        self.env = env
        # flag -> port, every port this server is told to listen on; each flag other than --port is in
        # argv followed by its port (rebind rewrites it there).
        self.ports = {"--port": port, **(other_ports or {})}
        self.log_path = Path(log_dir) / f"{name}.log"
        self.health_path = health_path
        self.proc: subprocess.Popen | None = None
        self._log_start = 0

    @property
    def port(self) -> int:
        """The HTTP port."""
        return self.ports["--port"]

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

        Raises PortTakenError as soon as the log says one of its ports was taken (also when the server
        answers anyway: prefill stays healthy without its bootstrap server), ServerStartError with the
        log tail if the process exits or time runs out.
        """
        while True:
            running = self.is_running()
            self._raise_if_port_taken()  # read after `running`: a server that exited has written its log
            if not running:
                raise ServerStartError(f"{self.name} exited with {self.proc.returncode if self.proc else None}"
                                       f"; log {self.log_path}:\n{log_tail(self.log_path)}")
            try:
                if requests.get(self.url + self.health_path, timeout=5).status_code == 200:
                    self._raise_if_port_taken()
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"{self.name} not healthy in time; log {self.log_path}:\n"
                                       f"{log_tail(self.log_path)}")
            time.sleep(1.0)

    def _raise_if_port_taken(self) -> None:
        flags = self.taken_flags()
        if flags:
            raise PortTakenError(f"{self.name} could not bind its port(s) "
                                 f"{', '.join(f'{f} {self.ports[f]}' for f in flags)} (taken by another socket "
                                 f"since it was chosen); log {self.log_path}", flags)

    def taken_flags(self) -> list[str]:
        """Which of its `ports` this run's log (since the last start) says could not be bound (ports.taken_flags)."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            text = log.read().decode(errors="replace")
        return taken_flags(text, self.ports)

    def rebind(self, new_ports: dict[str, int]) -> None:
        """Stop this server and start it again with `new_ports` (flag -> port, flags of `ports`) in its argv,
        the rest unchanged; does not wait."""
        self.stop(grace_s=0)
        self.proc = None
        for flag, port in new_ports.items():
            if flag not in self.ports:
                raise KeyError(f"{self.name} has no port flag {flag!r} (it has {sorted(self.ports)})")
            at = self.argv.index(flag) + 1
            self.argv = [*self.argv[:at], str(port), *self.argv[at + 1:]]
            self.ports[flag] = port
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


def wait_healthy_rebinding(server: ServerProcess, deadline: float,
                           attempts: int = 3) -> list[tuple[str, int, int]]:
    """`server.wait_healthy`; if a port it was given was taken before it could bind it, restart it on
    fresh ports for the taken ones (at most `attempts` tries in all, each restart printed). Returns the
    (flag, taken port, new port) triples, in order."""
    moves: list[tuple[str, int, int]] = []
    for attempt in range(1, attempts + 1):
        try:
            server.wait_healthy(deadline)
            return moves
        except PortTakenError as exc:
            if attempt == attempts:
                raise
            new = {flag: free_port() for flag in exc.flags}
            print(f"sglang_pd harness: {exc}; restarting {server.name} with {new}", file=sys.stderr)
            moves += [(flag, server.ports[flag], port) for flag, port in new.items()]
            server.rebind(new)
    return moves
