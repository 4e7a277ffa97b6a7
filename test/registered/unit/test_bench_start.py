"""bench_start's summary: medians per start method, the spawn / forkserver ratios, and whether every run
served the same tokens (the benchmark exits 1 when not)."""

import pytest

from sglang_pd.bench_start import summarize

pytestmark = pytest.mark.unit


def _run(method, ready, cpu, ids=(1, 2, 3)):
    return {"method": method, "ready_s": ready, "cpu_s": cpu, "output_ids": list(ids)}


def test_medians_ratios_and_output_equality():
    runs = [_run("spawn", 60, 110), _run("forkserver", 40, 80), _run("forkserver", 44, 76), _run("spawn", 56, 108)]
    summary = summarize(runs)
    assert summary["median"] == {"spawn": {"ready_s": 58, "cpu_s": 109}, "forkserver": {"ready_s": 42, "cpu_s": 78}}
    assert summary["ratio_spawn_over_forkserver"] == {"ready_s": 1.38, "cpu_s": 1.4}
    assert summary["same_outputs"]
    assert not summarize(runs + [_run("spawn", 58, 109, ids=(1, 2, 4))])["same_outputs"]
