"""What one decode step's output send costs the decode scheduler, `off` vs `on+shared` (capacity preset).

Each step ends with SGLang's scheduler sending the batch's new tokens to its detokenizer
(`SenderWrapper.send_output`: pickle, then a ZMQ send that wakes the socket's I/O thread). This script
runs the capacity workload once per configuration (`python -m sglang_pd.bench_multiturn --preset capacity
--configs <one>`, each on a fresh PD pair) with a probe on PYTHONPATH: a `sitecustomize` that, in the
decode server's scheduler process only, wraps `send_output` and records per call its wall time, the
calling thread's CPU time and the thread's voluntary / involuntary context switches
(getrusage(RUSAGE_THREAD)). Wall time beyond CPU time with involuntary switches is time the scheduler
was ready to run but preempted: on a box short of cores the thread the send wakes takes the core.
Measurement only: the probe is not part of the package and is active only under this script.

    .venv/bin/python scripts/probes/shared_prefix/send_preemption/run.py
    # writes docs/results/shared_prefix/send_preemption/send_preemption.json
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[4] / "docs" / "results" / "shared_prefix" / "send_preemption"
CONFIGS = ("off", "on+shared")
PROBE = r'''
import json, os, resource, sys, time
def _decode_scheduler():
    # the scheduler is a child of launch_server, whose command line names the mode
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().split(b"\0")
    except OSError:
        return False
    return b"sglang.launch_server" in parent and b"--disaggregation-mode" in parent and \
        parent[parent.index(b"--disaggregation-mode") + 1] == b"decode"
def _install():
    if not _decode_scheduler():
        return
    from sglang.srt.managers.scheduler_components import output_sender
    original = output_sender.SenderWrapper.send_output
    stats = {"num_sends": 0, "wall_s": 0.0, "cpu_s": 0.0, "voluntary_switches": 0, "involuntary_switches": 0,
             "sends_over_2ms": 0}
    def send_output(self, output, recv_obj=None):
        r0, w0, c0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter(), time.thread_time()
        original(self, output, recv_obj)
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        stats["num_sends"] += 1; stats["wall_s"] += wall; stats["cpu_s"] += cpu
        stats["voluntary_switches"] += r1.ru_nvcsw - r0.ru_nvcsw
        stats["involuntary_switches"] += r1.ru_nivcsw - r0.ru_nivcsw
        stats["sends_over_2ms"] += wall > 0.002
        if stats["num_sends"] % 25 == 0:
            path = os.path.join(os.environ["SEND_PROBE_DIR"], f"decode_{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(stats, f)
            os.replace(path + ".tmp", path)
    output_sender.SenderWrapper.send_output = send_output
if os.environ.get("SEND_PROBE_DIR"):
    _install()
'''


def run(config: str) -> dict:
    """One capacity run of `config` with the probe; the decode scheduler's send stats and the run's ITL."""
    with tempfile.TemporaryDirectory(prefix="send-probe-") as probe, tempfile.TemporaryDirectory() as out:
        Path(probe, "sitecustomize.py").write_text(PROBE)
        env = dict(os.environ, SEND_PROBE_DIR=probe,
                   PYTHONPATH=os.pathsep.join(p for p in (probe, os.environ.get("PYTHONPATH")) if p))
        cmd = [sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", "capacity", "--configs", config,
               "--out-dir", out, "--no-progress"]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        files = glob.glob(os.path.join(probe, "decode_*.json"))
        if len(files) != 1:
            raise SystemExit(f"{config}: expected the decode scheduler's probe file, found {files}")
        stats = json.loads(Path(files[0]).read_text())
        result = json.loads(Path(out, "bench_multiturn_capacity.json").read_text())["results"][config]
    n = stats["num_sends"]
    return {**stats, "wall_ms_per_send": 1e3 * stats["wall_s"] / n, "cpu_ms_per_send": 1e3 * stats["cpu_s"] / n,
            "involuntary_switches_per_send": stats["involuntary_switches"] / n,
            "itl_p50_ms": result["itl_p50_ms"], "command": " ".join(cmd[1:])}


def main() -> None:
    runs = {config: run(config) for config in CONFIGS}
    (OUT / "send_preemption.json").write_text(json.dumps(runs, indent=1) + "\n")
    print("| config | sends recorded | wall ms / send | thread CPU ms / send | involuntary / voluntary switches "
          "per send | sends over 2 ms | ITL p50 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for config, r in runs.items():
        n = r["num_sends"]
        print(f"| {config} | {n} | {r['wall_ms_per_send']:.2f} | {r['cpu_ms_per_send']:.2f} | "
              f"{r['involuntary_switches_per_send']:.2f} / {r['voluntary_switches'] / n:.2f} | "
              f"{r['sends_over_2ms']} | {r['itl_p50_ms']:.1f} |")


if __name__ == "__main__":
    main()
