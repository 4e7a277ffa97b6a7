"""Where the box's 2 cores go during a capacity run: CPU time and run-queue wait of every thread of both
PD servers (Linux /proc/<pid>/task/<tid>/schedstat), the benchmark client's own CPU, beside the run's
ITL, for `off` and `on+shared` (each on a fresh PD pair, the capacity preset). A thread's run-queue
wait is time it was ready to run but another process held the core: the decode scheduler's wait is
added to its steps, hence to ITL.

    .venv/bin/python scripts/probes/shared_prefix/contention/run.py    # writes contention.json into OUT
    .venv/bin/python scripts/probes/shared_prefix/contention/run.py --cpu-split decode-scheduler   # contention_decode-scheduler.json
    .venv/bin/python scripts/probes/shared_prefix/contention/run.py --cpu-split decode-step        # contention_decode-step.json

OUT is docs/results/shared_prefix/contention/.

With `--cpu-split` the pairs run with that CPU placement (harness/cpu_placement.py), and this process and
the workload client on the client CPUs.
"""

import argparse

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_pd.bench.slo import parse_configs
from sglang_pd.bench_multiturn import PRESETS
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.cpu_placement import SPLITS, CpuPlacement, split_placement

OUT = Path(__file__).resolve().parents[4] / "docs" / "results" / "shared_prefix" / "contention"


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [d for child in out for d in _descendants(int(child))]


def schedstat(pids: list[int]) -> dict[str, tuple[float, float]]:
    """(run s, run-queue wait s) per process name / thread name, summed over `pids` and their threads."""
    totals: dict[str, list[float]] = {}
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                run, wait, _ = map(int, Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
                name = f"{comm} ({'main thread' if int(tid) == pid else 'other threads'})"
                entry = totals.setdefault(name, [0.0, 0.0])
                entry[0] += run / 1e9
                entry[1] += wait / 1e9
        except (FileNotFoundError, ProcessLookupError):
            continue
    return {name: (run, wait) for name, (run, wait) in totals.items()}


def capacity_pair(config_name: str, extra_env: dict[str, str] | None = None,
                  placement: CpuPlacement | None = None) -> PDDeployment:
    """A PD pair (not started) for one bench_multiturn configuration of the capacity preset, mooncake_tcp."""
    (config,) = parse_configs(config_name, None, None)
    deploy = dict(PRESETS["capacity"][1], transfer_backend="mooncake_tcp",
                  env_overrides=(*config.env, *(extra_env or {}).items()), cpu_placement=placement)
    return PDDeployment(DeploymentConfig(decode_radix=config.decode_radix,
                                         decode_attention_backend=config.decode_attention_backend,
                                         prefill_attention_backend=config.prefill_attention_backend, **deploy))


def run_capacity_workload(dep: PDDeployment, config_name: str, out: str) -> dict:
    """The capacity workload against a running pair from another process; its result for `config_name`."""
    subprocess.run([sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", "capacity",
                    "--prefill-url", dep.prefill.url, "--decode-url", dep.decodes[0].url,
                    "--bootstrap-port", str(dep.bootstrap_port), "--label", config_name, "--no-progress",
                    "--out-dir", out], check=True, capture_output=True)
    return json.loads((Path(out) / "bench_multiturn_capacity.json").read_text())["results"][config_name]


def measure(config_name: str, placement: CpuPlacement | None = None) -> dict:
    """One configuration on a fresh capacity pair: per-server thread CPU and waits, client CPU, ITL."""
    dep = capacity_pair(config_name, placement=placement)
    with dep, tempfile.TemporaryDirectory() as out:
        if placement is not None and placement.main_thread_only:  # a first request starts the moved step
            # thread's ZMQ threads (on its CPU); put them with the rest
            dep.generate_pd(list(range(3, 35)), max_new_tokens=1)
            dep.settle_placement()
        servers = {"prefill": _descendants(dep.prefill.proc.pid), "decode": _descendants(dep.decodes[0].proc.pid)}
        before = {role: schedstat(pids) for role, pids in servers.items()}
        start = time.perf_counter()
        result = run_capacity_workload(dep, config_name, out)
        wall = time.perf_counter() - start
        after = {role: schedstat(pids) for role, pids in servers.items()}
    threads = {role: {name: {"run_s": round(run - before[role].get(name, (0, 0))[0], 3),
                             "run_queue_wait_s": round(wait - before[role].get(name, (0, 0))[1], 3)}
                      for name, (run, wait) in after[role].items()} for role in after}
    return {"wall_s_with_priming": round(wall, 2), "workload_s": result["duration_s"],
            "client_cpu_s": result["client_cpu_s"], "itl_p50_ms": result["itl_p50_ms"],
            "ttft_p50_s": result["ttft_p50_s"], "request_throughput": result["request_throughput"],
            "servers": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-split", choices=SPLITS)
    split = parser.parse_args().cpu_split
    placement = split_placement(split) if split else None
    if placement is not None:
        os.sched_setaffinity(0, placement.client)  # inherited by the workload client
    report = {name: measure(name, placement) for name in ("off", "on+shared")}
    if placement is not None:
        report = {"cpu_placement": placement.as_dict(), **report}
    (OUT / (f"contention_{split}.json" if split else "contention.json")).write_text(json.dumps(report, indent=2))
    for name, r in report.items():
        if name == "cpu_placement":
            print(f"CPU placement: {r}")
            continue
        print(f"\n{name}: ITL p50 {r['itl_p50_ms']:.1f} ms, workload {r['workload_s']:.1f} s, "
              f"client CPU {r['client_cpu_s']:.2f} s")
        for role, threads in r["servers"].items():
            for thread, t in sorted(threads.items(), key=lambda kv: -kv[1]["run_s"]):
                if t["run_s"] >= 0.05:
                    print(f"  {role:8s} {thread:40s} ran {t['run_s']:6.2f} s  waited {t['run_queue_wait_s']:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
