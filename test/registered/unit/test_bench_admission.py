"""bench_admission on a small pool: both rows run on real objects; batched evicts once, same hit rate."""

import json

import pytest

from sglang_pd import bench_admission

pytestmark = pytest.mark.unit


def test_small_round_batched_evicts_once_and_keeps_hit_rate(tmp_path, capsys):
    out = tmp_path / "adm.json"
    rc = bench_admission.main(["--round-size", "8", "--pool-tokens", "4096", "--repeats", "1",
                               "--system-len", "128", "--num-systems", "2", "--json", str(out)])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    for tree in ("radix", "unified"):
        per, batched = results[tree]["per-request"], results[tree]["batched"]
        assert per["num_evict_calls"] == 8 and batched["num_evict_calls"] == 1
        assert per["num_evicted_tokens"] == batched["num_evicted_tokens"] == 8 * 64
        assert per["hit_rate"] == batched["hit_rate"] == pytest.approx(128 / 192)
    assert "| radix |" in capsys.readouterr().out


def test_bad_input_is_named():
    from sglang_pd.srt.mem_cache.standalone import paged_tree

    with pytest.raises(ValueError, match="tree kind 'btree' is not one of"):
        paged_tree("btree", 64, 4)
    with pytest.raises(SystemExit):
        bench_admission.main(["--repeats", "0"])
