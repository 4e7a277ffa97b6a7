"""Smoke tests of the multi-turn benchmark (tiny preset): attached to the session's PD pair, and on a pair
it starts itself with a CPU split."""

import json
import os
import subprocess
import sys

import pytest

from sglang_pd.harness import PDDeployment

pytestmark = pytest.mark.integration


def test_bench_multiturn_tiny_attached(pd_page16: PDDeployment, tmp_path):
    dep = pd_page16
    cmd = [sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", "tiny", "--no-progress",
           "--prefill-url", dep.prefill.url, "--decode-url", dep.decodes[0].url,
           "--bootstrap-port", str(dep.bootstrap_port), "--label", "on", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| TTFT p50 (s) |" in proc.stdout and "| decode hit rate |" in proc.stdout
    report = json.loads((tmp_path / "bench_multiturn_tiny.json").read_text())
    on = report["results"]["on"]
    assert on["requests"] == 3 * 2 and on["failed"] == 0
    assert on["decode_hit_rate"] > 0.3, "round 2 reuses round 1 and the primed system prompt"
    assert on["kv_pages_transferred"] > 0 and on["ttft_p50_s"] > 0
    stages = on["sglang_stage_latency"]  # SGLang's own per-stage histograms, as deltas over the workload
    for role, stage in (("prefill", "prefill_bootstrap"), ("prefill", "prefill_forward"),
                        ("decode", "decode_bootstrap"), ("decode", "decode_transferred")):
        assert stages[role][stage]["count"] == on["requests"], (role, stage, stages)  # the primer excluded
        assert stages[role][stage]["mean_ms"] > 0
    assert "| prefill: forward | " in proc.stdout
    clears = on["sglang_pd_prefill_counters"]  # prefill's request ends, each run by our clear hook
    assert clears["prefill_sender_clears_total"] == on["requests"], clears
    assert clears["clear_bootstrap_wait_timeouts_total"] == 0, clears
    assert (tmp_path / "bench_multiturn_tiny.png").stat().st_size > 1000
    dep.wait_clean()


def test_bench_multiturn_cpu_split_puts_the_decode_step_alone(tmp_path):
    """`--cpu-split decode-step` on a pair the benchmark starts: the main thread of decode's scheduler
    (the one that runs the decode step) on the highest CPU; every other thread of both servers on the
    others, including the threads that main thread starts with the first request (moved back after the
    priming request); verified thread by thread at start and again after the run."""
    cmd = [sys.executable, "-m", "sglang_pd.bench_multiturn", "--preset", "tiny", "--no-progress",
           "--configs", "on", "--cpu-split", "decode-step", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "bench_multiturn_tiny.json").read_text())
    cpus = sorted(os.sched_getaffinity(0))
    rest = cpus[:-1]
    assert report["cpu_placement"] == {"prefill": rest, "decode": rest, "client": rest, "decode_scheduler": cpus[-1:],
                                       "main_thread_only": True}
    on = report["results"]["on"]
    # launch_server + scheduler + detokenizer at least, on each server
    assert on["placement_checked"]["prefill"] >= 3 and on["placement_checked"]["decode0"] >= 3, on["placement_checked"]
    assert on["placement_threads_settled"] >= 1, "SGLang 0.5.23 starts a ZMQ context (2 threads) with the first request"
    assert on["placement_checked_after_run"] == on["placement_checked"]  # checked again: nothing drifted
    assert on["requests"] == 3 * 2 and on["failed"] == 0 and on["clean_after_run"]["clean"]
    assert f"CPU placement: {report['cpu_placement']}" in proc.stdout
    assert "WARNING" not in proc.stdout
