"""Smoke test of the multi-turn benchmark (tiny preset) attached to the session's PD pair."""

import json
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
    assert (tmp_path / "bench_multiturn_tiny.png").stat().st_size > 1000
    dep.wait_clean()
