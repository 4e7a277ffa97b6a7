"""How a CPU server's scheduler and detokenizer processes start: from a forkserver that has imported them.

SGLang 0.5.23 starts every subprocess with multiprocessing's `spawn` (`_set_envs_and_config`): each one is a
fresh interpreter that imports SGLang again, and on a CPU box that import is most of a server's start (the
scheduler and the detokenizer each spend about 15-20 CPU-seconds importing torch, transformers and SGLang,
while loading the tiny test model takes well under one). With `forkserver`, one server process imports those
modules once and forks each child from that state: the children start with the modules in memory, and like
`spawn` children (unlike `fork` ones) they inherit nothing of the launching process: not its threads, not
its plugin state, not its hooks; SGLang's `load_plugins()` runs in each of them as before.

Only on `--device cpu` (a CUDA process must never fork after CUDA is up, and no GPU runs our tests), and never
with the two SGLang features that wrap a child's interpreter at exec time (`--enable-memory-saver` preloads a
library, `--numa-node` runs it under numactl): with a forkserver there is no exec, so those would be lost, and
the policy keeps `spawn` and says why. `SGLANG_PD_CPU_FORKSERVER=0` keeps upstream's `spawn`.

The forkserver is started here, at the end of `_set_envs_and_config`, so it holds the environment SGLang has
just set, as a spawned child would see it. A forkserver that cannot start raises: the server does not start
(no silent fallback to a different process model).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from dataclasses import dataclass

# The modules of SGLang's subprocess entry functions (run_scheduler_process, run_detokenizer_process): what
# each child would otherwise import for itself.
SGLANG_CHILD_MODULES = ("sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager")
FORKSERVER, SPAWN = "forkserver", "spawn"


@dataclass(frozen=True)
class StartMethodChoice:
    """The start method chosen for this server's subprocesses and why (shown in /sglang_pd/info)."""

    method: str  # "forkserver" or "spawn"
    reason: str

    def snapshot(self) -> dict:
        return {"method": self.method, "reason": self.reason}


class StartMethodPolicy:
    """Decides and applies the start method. `enabled`: SGLANG_PD_CPU_FORKSERVER; `preload`: the modules the
    forkserver imports before it forks anything."""

    def __init__(self, enabled: bool, preload: tuple[str, ...] = SGLANG_CHILD_MODULES):
        self.enabled = enabled
        self.preload = preload
        self.choice: StartMethodChoice | None = None  # set by apply()

    def decide(self, device: str, memory_saver: bool, numa_node_set: bool) -> StartMethodChoice:
        """Read-only: the method for a server on `device` with those SGLang features on or off."""
        if not self.enabled:
            return StartMethodChoice(SPAWN, "SGLANG_PD_CPU_FORKSERVER=0: upstream's spawn")
        if device != "cpu":
            return StartMethodChoice(SPAWN, f"device {device!r}: upstream's spawn (forkserver only on cpu)")
        if memory_saver:
            return StartMethodChoice(SPAWN, "--enable-memory-saver preloads a library into each child at exec: "
                                            "upstream's spawn")
        if numa_node_set:
            return StartMethodChoice(SPAWN, "--numa-node runs each child under numactl at exec: upstream's spawn")
        return StartMethodChoice(FORKSERVER, "device 'cpu': children fork from a server that imported "
                                             + ", ".join(self.preload))

    def apply(self, device: str, memory_saver: bool, numa_node_set: bool) -> StartMethodChoice:
        """Mutates this process's multiprocessing start method (after SGLang set `spawn`) and, for forkserver,
        starts the forkserver now. Raises whatever starting it raises."""
        choice = self.decide(device, memory_saver, numa_node_set)
        if choice.method == FORKSERVER:
            multiprocessing.set_start_method(FORKSERVER, force=True)
            multiprocessing.set_forkserver_preload(list(self.preload))
            multiprocessing.forkserver.ensure_running()
        self.choice = choice
        return choice

    def snapshot(self) -> dict | None:
        return None if self.choice is None else self.choice.snapshot()
