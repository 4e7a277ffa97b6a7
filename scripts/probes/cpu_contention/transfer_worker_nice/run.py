"""Prefill's mooncake transfer workers at upstream's priority (SGLANG_PD_TRANSFER_WORKER_NICE=0) vs nice 19
(the default), capacity preset, `off` and `on+shared`, alternating, each run on a fresh PD pair: ITL, TTFT,
throughput, and from Linux schedstat over the workload the CPU of prefill's scheduler process (main
thread / other threads: the transfer workers are among the latter) and the decode scheduler's main-thread
run-queue wait (time it was ready but had no core: inside every decode step).

    .venv/bin/python scripts/probes/cpu_contention/transfer_worker_nice/run.py [repeats]
    # writes docs/results/cpu_contention/transfer_worker_nice/ab.json
"""

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
OUT = ROOT / "docs" / "results" / "cpu_contention" / "transfer_worker_nice"
sys.path.insert(0, str(ROOT / "scripts" / "probes" / "shared_prefix" / "contention"))

from run import _descendants, capacity_pair, run_capacity_workload, schedstat  # noqa: E402  (the contention script's)


def one(name: str, nice: int) -> dict:
    dep = capacity_pair(name, {"SGLANG_PD_TRANSFER_WORKER_NICE": str(nice)})
    with dep, tempfile.TemporaryDirectory() as out:
        servers = {"prefill": _descendants(dep.prefill.proc.pid), "decode": _descendants(dep.decodes[0].proc.pid)}
        before = {role: schedstat(pids) for role, pids in servers.items()}
        r = run_capacity_workload(dep, name, out)
        after = {role: schedstat(pids) for role, pids in servers.items()}
        prio = dep.scheduler_state(dep.prefill)["transfer_worker_priority"]

    def delta(role: str, thread: str) -> tuple[float, float]:
        a, b = after[role].get(thread, (0, 0)), before[role].get(thread, (0, 0))
        return round(a[0] - b[0], 2), round(a[1] - b[1], 2)

    sched = "sglang::schedul"
    row = {"config": name, "nice": nice, "itl_p50_ms": round(r["itl_p50_ms"], 1), "ttft_p50_s": round(r["ttft_p50_s"], 3),
           "request_throughput": round(r["request_throughput"], 2), "workload_s": round(r["duration_s"], 1),
           "prefill_main_ran_waited_s": delta("prefill", f"{sched} (main thread)"),
           "prefill_other_threads_ran_waited_s": delta("prefill", f"{sched} (other threads)"),
           "decode_main_ran_waited_s": delta("decode", f"{sched} (main thread)"),
           "transfer_workers_lowered": [t["nice"] for t in prio["threads"]]}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    start = time.perf_counter()
    rows = [one(name, nice) for _ in range(repeats) for name in ("off", "on+shared") for nice in (0, 19)]
    summary = {}
    for name in ("off", "on+shared"):
        for nice in (0, 19):
            mine = [r for r in rows if r["config"] == name and r["nice"] == nice]
            summary[f"{name} nice {nice}"] = {
                "itl_p50_ms": [r["itl_p50_ms"] for r in mine],
                "itl_p50_ms_median": statistics.median(r["itl_p50_ms"] for r in mine),
                "decode_main_waited_s": [r["decode_main_ran_waited_s"][1] for r in mine],
                "prefill_other_threads_ran_s": [r["prefill_other_threads_ran_waited_s"][0] for r in mine]}
    report = {"command": "python scripts/probes/cpu_contention/transfer_worker_nice/run.py " + str(repeats),
              "wall_s": round(time.perf_counter() - start, 1), "runs": rows, "summary": summary}
    (OUT / "ab.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
