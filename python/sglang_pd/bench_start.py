"""Start-up cost of a CPU PD pair: SGLang's spawn vs sglang_pd's forkserver (SGLANG_PD_CPU_FORKSERVER), side by side.

    python -m sglang_pd.bench_start [--repeats 2] [--out docs/results/start/bench_start.json]

Each round starts the same PD pair (prefill + decode, the built-in tiny model, page size 16) once per start
method, alternating which goes first, and records for each start:
- `ready_s`: from the harness starting both servers to both answering /health (SGLang's own warm-up done);
- `cpu_s`: CPU-seconds (user + system) spent by then by every process of both servers (each server's launcher,
  its forkserver when there is one, scheduler, detokenizer);
- the process tree (who is whose parent) and the output ids of one PD request, which must be equal across
  methods (the same KV and weights, whichever way the processes started).
Printed: medians per method and the ratios spawn / forkserver. A ratio above 1 means forkserver is cheaper.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from sglang_pd.config import CPU_FORKSERVER
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.server import descendants

METHODS = {"spawn": "0", "forkserver": "1"}
PROMPT = list(range(3, 83))


def _cpu_seconds(root: int) -> float:
    total = 0.0
    for pid in (root, *(e.pid for e in descendants(root))):
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue  # ended meanwhile
        total += times.user + times.system
    return total


def start_once(method: str, log_dir: Path) -> dict:
    """Start one pair with `method`, measure, serve one request, stop it. Raises if it does not start."""
    config = DeploymentConfig(page_size=16, log_dir=log_dir, env_overrides=((CPU_FORKSERVER, METHODS[method]),))
    dep = PDDeployment(config)
    t0 = time.monotonic()
    dep.start()
    try:
        ready_s = time.monotonic() - t0
        servers = (dep.prefill, dep.decodes[0])
        cpu_s = sum(_cpu_seconds(s.proc.pid) for s in servers)
        info = dep.get_json(dep.prefill.url, "/sglang_pd/info")
        tree = {s.name: sorted({e.comm for e in descendants(s.proc.pid)}) for s in servers}
        output_ids = dep.generate_pd(PROMPT, 16)[1]["output_ids"]
        dep.wait_clean()
    finally:
        dep.stop()
    return {"method": method, "ready_s": round(ready_s, 2), "cpu_s": round(cpu_s, 2),
            "process_start": info["process_start"], "processes": tree, "output_ids": output_ids}


def summarize(runs: list[dict]) -> dict:
    """Medians per method, ratios spawn / forkserver, and whether every run served the same tokens."""
    med = {m: {k: statistics.median(r[k] for r in runs if r["method"] == m) for k in ("ready_s", "cpu_s")}
           for m in METHODS}
    return {"median": med,
            "ratio_spawn_over_forkserver": {k: round(med["spawn"][k] / med["forkserver"][k], 2)
                                            for k in ("ready_s", "cpu_s")},
            "same_outputs": len({tuple(r["output_ids"]) for r in runs}) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds; each starts one pair per method")
    parser.add_argument("--out", type=Path, default=Path("bench_start.json"))
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench_start-"))
    print(f"server logs: {logs}", flush=True)
    runs = []
    for i in range(args.repeats):
        order = list(METHODS) if i % 2 == 0 else list(reversed(METHODS))
        for method in order:
            run = start_once(method, logs / f"{i}_{method}")
            print(f"round {i} {method}: ready {run['ready_s']} s, {run['cpu_s']} CPU-s, {run['process_start']}",
                  flush=True)
            runs.append(run)
    summary = summarize(runs)
    machine = f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(f"\n| method | pair ready (s, median) | CPU-s to ready (median) |\n|---|---|---|")
    for method, med in summary["median"].items():
        print(f"| {method} | {med['ready_s']:.1f} | {med['cpu_s']:.1f} |")
    ratio = summary["ratio_spawn_over_forkserver"]
    print(f"spawn / forkserver: ready {ratio['ready_s']}x, CPU {ratio['cpu_s']}x; same outputs: {summary['same_outputs']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "repeats": args.repeats, "summary": summary, "runs": runs},
                                   indent=2) + "\n")
    return 0 if summary["same_outputs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
