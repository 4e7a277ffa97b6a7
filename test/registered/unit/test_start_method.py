"""StartMethodPolicy (srt/processes/start_method.py): which start method a server's subprocesses get, and that
applying forkserver really starts children from a forkserver holding the preloaded modules (in a fresh
interpreter, so this test process's own start method is never touched)."""

import json
import subprocess
import sys

import pytest

from sglang_pd.srt.processes import StartMethodPolicy

pytestmark = pytest.mark.unit

# A module no fresh interpreter imports on its own: present in a child only if the forkserver preloaded it.
MARKER = "wave"


@pytest.mark.parametrize("enabled, device, memory_saver, numa, method, why", [
    (True, "cpu", False, False, "forkserver", "device 'cpu'"),
    (True, "cuda", False, False, "spawn", "device 'cuda'"),
    (True, "cpu", True, False, "spawn", "--enable-memory-saver"),
    (True, "cpu", False, True, "spawn", "--numa-node"),
    (False, "cpu", False, False, "spawn", "SGLANG_PD_CPU_FORKSERVER=0"),
])
def test_forkserver_only_on_cpu_without_exec_time_wrappers_and_only_when_enabled(enabled, device, memory_saver,
                                                                                 numa, method, why):
    choice = StartMethodPolicy(enabled, preload=(MARKER,)).decide(device, memory_saver, numa)
    assert choice.method == method and why in choice.reason, choice


_CHILD_PROBE = """
import json, multiprocessing, os, sys
from sglang_pd.srt.processes import StartMethodPolicy

def probe(queue):
    queue.put({"marker_loaded": %(marker)r in sys.modules, "ppid": os.getppid()})

if __name__ == "__main__":
    multiprocessing.set_start_method("spawn", force=True)  # as SGLang does before our hook
    policy = StartMethodPolicy(%(enabled)r, preload=(%(marker)r,))
    policy.apply(%(device)r, False, False)
    queue = multiprocessing.get_context().Queue()
    child = multiprocessing.Process(target=probe, args=(queue,))
    child.start()
    seen = queue.get(timeout=60)
    child.join(60)
    print(json.dumps({**seen, "me": os.getpid(), "method": multiprocessing.get_start_method(),
                      "snapshot": policy.snapshot(), "exitcode": child.exitcode}))
"""


def _run_probe(tmp_path, enabled: bool, device: str) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(_CHILD_PROBE % {"marker": MARKER, "enabled": enabled, "device": device})
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_applied_forkserver_forks_children_from_a_server_that_preloaded_the_modules(tmp_path):
    seen = _run_probe(tmp_path, enabled=True, device="cpu")
    assert seen["method"] == "forkserver" and seen["snapshot"]["method"] == "forkserver", seen
    assert seen["marker_loaded"], "the child starts with the preloaded module already imported"
    assert seen["ppid"] != seen["me"], "the child's parent is the forkserver, not the launching process"
    assert seen["exitcode"] == 0


def test_when_spawn_is_kept_children_are_fresh_interpreters_of_the_launching_process(tmp_path):
    seen = _run_probe(tmp_path, enabled=True, device="cuda")
    assert seen["method"] == "spawn" and seen["snapshot"]["method"] == "spawn", seen
    assert not seen["marker_loaded"] and seen["ppid"] == seen["me"], seen
