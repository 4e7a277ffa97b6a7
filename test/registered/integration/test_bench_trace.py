"""The trace benchmark end to end: a generated 20-request trace (5 conversations x 4 turns over a shared
system prompt) replayed open loop through a stock sglang-router on a fresh PD pair it starts itself,
with a two-probe SLA search on the same pair."""

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_trace_replays_a_generated_trace_through_the_router(tmp_path):
    trace = tmp_path / "trace.jsonl"
    subprocess.run([sys.executable, "-m", "sglang_pd.bench.trace_gen", "--out", str(trace), "--conversations", "5",
                    "--turns", "4", "--output-max", "64", "--seed", "1"], check=True, timeout=60)
    cmd = [sys.executable, "-m", "sglang_pd.bench_trace", "--trace", str(trace), "--configs", "on", "--model", "tiny",
           "--speedup", "4", "--ttft-target-ms", "5000", "--sla-search", "--sla-ttft-p95-ms", "5000",
           "--sla-probes", "2", "--no-progress", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "bench_trace.json").read_text())
    assert report["trace"]["stats"]["requests"] == 20 and report["trace"]["stats"]["block_hit_rate"] > 0.5
    (on,) = report["runs"]["on"]
    assert on["requests"] == 20 and on["failed"] == 0 and on["refused"] == 0, on["errors"]
    assert len(on["ttft_samples_s"]) == 20 and on["ttft_p50_s"] > 0 and on["itl_p50_ms"] > 0
    assert on["decode_hit_rate"] > 0, "later turns extend earlier ones: decode must reuse their prefixes"
    assert on["kv_pages_transferred"] > 0 and on["slo_attainment"] is not None
    assert on["clean_after_run"]["clean"], on["clean_after_run"]  # after the replay and the SLA probes
    assert on["send_lag_max_ms"] < 1000, "the client must send on schedule (open loop)"
    sla = report["sla_search"]["by_config"]["on"]
    assert len(sla["probes"]) == 2 and [p["speedup"] for p in sla["probes"]][0] == 4
    assert all(p["ttft_p95_s"] is not None and math.isfinite(p["ttft_p95_s"]) for p in sla["probes"]), sla
    assert (tmp_path / "bench_trace_cdf.png").stat().st_size > 1000
    assert "| on | 1 |" in proc.stdout and "trace slice all: 20 requests" in proc.stdout
