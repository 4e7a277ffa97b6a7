"""Helper threads at upstream's policy (SGLANG_PD_HELPER_THREADS_BATCH=0) vs SCHED_BATCH (1, the default),
alternating on fresh PD pairs: capacity preset `off` and `on+shared`, short preset `on` and `on+local`
(threshold 64). Per run: ITL p50, TTFT p50, request throughput, and from Linux schedstat over the workload
the decode scheduler thread's CPU and run-queue wait (time it was ready to run but had no core: inside its
steps), plus how many threads each server switched.

    .venv/bin/python scripts/probes/cpu_contention/helper_threads/run.py [repeats]
    # writes docs/results/cpu_contention/helper_threads/ab.json
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
OUT = ROOT / "docs" / "results" / "cpu_contention" / "helper_threads"
sys.path.insert(0, str(ROOT / "scripts" / "probes" / "shared_prefix" / "contention"))

from run import _descendants, schedstat  # noqa: E402  (the contention script's)
from sglang_pd.bench.slo import parse_configs  # noqa: E402
from sglang_pd.bench_multiturn import PRESETS  # noqa: E402
from sglang_pd.harness import DeploymentConfig, PDDeployment  # noqa: E402

SETTING = "SGLANG_PD_HELPER_THREADS_BATCH"
PLAN = (("capacity", ("off", "on+shared")), ("short", ("on", "on+local")))


def pair(preset: str, config_name: str, batch: int) -> PDDeployment:
    (config,) = parse_configs(config_name, None, None, local_prefill_tokens=64)
    deploy = dict(PRESETS[preset][1], transfer_backend="mooncake_tcp",
                  env_overrides=(*config.env, (SETTING, str(batch))))
    return PDDeployment(DeploymentConfig(decode_radix=config.decode_radix,
                                         decode_attention_backend=config.decode_attention_backend,
                                         prefill_attention_backend=config.prefill_attention_backend, **deploy))


def one(preset: str, name: str, batch: int) -> dict:
    dep = pair(preset, name, batch)
    with dep, tempfile.TemporaryDirectory() as out:
        decode = _descendants(dep.decodes[0].proc.pid)
        before = schedstat(decode)
        subprocess.run([sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", preset,
                        "--prefill-url", dep.prefill.url, "--decode-url", dep.decodes[0].url,
                        "--bootstrap-port", str(dep.bootstrap_port), "--label", name, "--no-progress",
                        "--out-dir", out], check=True, capture_output=True)
        after = schedstat(decode)
        r = json.loads((Path(out) / f"bench_multiturn_{preset}.json").read_text())["results"][name]
        switched = {s.name: dep.scheduler_state(s)["helper_threads"]["num_batched"] for s in dep.servers}
    main = "sglang::schedul (main thread)"
    local = r.get("decode_local_prefill") or {}
    row = {"preset": preset, "config": name, "batch": batch, "itl_p50_ms": round(r["itl_p50_ms"], 2),
           "ttft_p50_s": round(r["ttft_p50_s"], 4), "request_throughput": round(r["request_throughput"], 2),
           "served_locally": local.get("num_joined"), "scheduler_threads_switched": switched,
           "decode_main_ran_s": round(after[main][0] - before[main][0], 2),
           "decode_main_waited_s": round(after[main][1] - before[main][1], 2)}
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    start = time.perf_counter()
    rows = [one(preset, name, batch) for _ in range(repeats) for preset, names in PLAN for name in names
            for batch in (0, 1)]
    summary = {}
    for preset, names in PLAN:
        for name in names:
            for batch in (0, 1):
                mine = [r for r in rows if (r["preset"], r["config"], r["batch"]) == (preset, name, batch)]
                summary[f"{preset} {name} batch={batch}"] = {
                    key: {"runs": [r[key] for r in mine], "median": statistics.median(r[key] for r in mine)}
                    for key in ("itl_p50_ms", "ttft_p50_s", "request_throughput", "decode_main_waited_s")}
    report = {"command": "python scripts/probes/cpu_contention/helper_threads/run.py " + str(repeats),
              "wall_s": round(time.perf_counter() - start, 1), "runs": rows, "summary": summary}
    (OUT / "ab.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
