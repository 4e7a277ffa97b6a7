"""A benchmark configuration whose PD pair did not start: which server failed, and the log lines that
say why (e.g. upstream's NIXL path on a CPU box, without sglang_pd: FINDINGS §1)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_pd.harness import ServerProcess

# Lines that name a failure in an SGLang server log: Python exceptions, NIXL status codes, and the
# glog-style error lines NIXL/UCX write ("E1123 17:50:14.839467 ... VRAM registration cannot proceed.").
ERROR_LINE = re.compile(r"NIXL_ERR|Error\b|Exception\b|Traceback|^E\d{4} \d\d:")
TAIL_LINES = 60


@dataclass(frozen=True)
class ServerLog:
    """What one server of the failed pair left in its log."""

    name: str
    exit_code: int | None   # after the harness stopped the pair (negative: ended by our signal)
    error_lines: list[str]  # lines matching ERROR_LINE, in order (at most the last 12; not the '$ argv' line)
    tail: list[str]


@dataclass(frozen=True)
class StartFailure:
    """A configuration that produced no figures because its servers did not start."""

    config: str
    error: str              # first line of the harness's ServerStartError
    servers: list[ServerLog]
    log_dir: str

    @classmethod
    def from_servers(cls, config: str, servers: list[ServerProcess], log_dir: Path,
                     exc: Exception) -> "StartFailure":
        """Read the logs of a deployment's servers (already stopped) after `exc` ended its start."""
        logs = []
        for server in servers:
            path = Path(server.log_path)
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            code = server.proc.returncode if server.proc is not None else None
            logs.append(ServerLog(server.name, code, [ln for ln in lines if ERROR_LINE.search(ln) and not ln.startswith("$ ")][-12:],
                                  lines[-TAIL_LINES:]))
        return cls(config, str(exc).splitlines()[0], logs, str(log_dir))

    def as_dict(self) -> dict:
        """JSON form (the report's `start_failures`)."""
        return asdict(self)

    def describe(self) -> str:
        """Lines for the console: the harness's error, then each server's last error line."""
        lines = [f"[{self.config}] PD pair did not start: {self.error}"]
        for log in self.servers:
            last = log.error_lines[-1] if log.error_lines else "(no error line in its log)"
            lines.append(f"  {log.name} (exit code {log.exit_code}): {last.strip()[:300]}")
        return "\n".join(lines)

    def write_log(self, path: Path) -> None:
        """The same, with each server's error lines and log tail, to `path`."""
        parts = [self.describe(), f"logs: {self.log_dir}"]
        for log in self.servers:
            parts += [f"\n==== {log.name}: error lines ====", *log.error_lines,
                      f"==== {log.name}: last {TAIL_LINES} log lines ====", *log.tail]
        Path(path).write_text("\n".join(parts) + "\n")
