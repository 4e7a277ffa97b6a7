"""bench_attention on a small grid (real SGLang pools, both backends), with churn, and the `+shared` benchmark
configuration down to both PD servers' command lines."""

import json

import pytest

from sglang_pd import bench_attention
from sglang_pd.bench.slo import SHARED_BACKEND, parse_configs
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

pytestmark = pytest.mark.unit


def test_small_grid_measures_both_backends_side_by_side(tmp_path, capsys):
    out = tmp_path / "bench_attention.json"
    assert bench_attention.main(["--batch", "8", "--group-sizes", "1,4,8", "--prefix-lens", "32", "--own-len", "8",
                                 "--page-size", "16", "--repeats", "1", "--min-reads-saved", "0",
                                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cells = report["cells"]
    assert report["settings"]["min_reads_saved"] == 0
    assert [(c["group_size"], c["num_groups"]) for c in cells] == [(1, 0), (4, 2), (8, 1)]
    for cell in cells:
        assert cell["max_abs_diff"] <= 1e-5
        assert cell["plain_ms"] > 0 and cell["shared_ms"] > 0
        assert cell["ratio"] == pytest.approx(cell["plain_ms"] / cell["shared_ms"], abs=0.01)  # rounded to 0.01
    # one group of 8 reads its 32-token prefix once instead of 8 times
    assert cells[2]["plain_kv_tokens"] - cells[2]["shared_kv_tokens"] >= 7 * 32 - 8 * 8
    assert "ratio" in capsys.readouterr().out and out.with_suffix(".png").exists()


def test_churn_replaces_finished_requests_with_newcomers_of_their_group(tmp_path):
    args = bench_attention.parse_args(["--batch", "8", "--group-sizes", "4", "--prefix-lens", "32", "--own-len", "8",
                                       "--repeats", "6", "--churn", "4"])
    world, churn = bench_attention.build_world(args, 4, 32)
    first_rids = list(world.rids)
    for _ in range(4):
        world.advance()
        churn.step(world)
    assert len(world.rids) == 8 and not set(world.rids) & set(first_rids)  # every request ran 4 steps, then left
    assert sorted(churn.groups) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(set(world.row_ids)) == 8  # finished requests' req_to_token rows were reused, none shared
    out = tmp_path / "churn.json"
    assert bench_attention.main(["--batch", "8", "--group-sizes", "4", "--prefix-lens", "32", "--own-len", "8",
                                 "--repeats", "6", "--churn", "4", "--min-reads-saved", "0", "--json", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["num_groups"] == 2 and cell["max_abs_diff"] <= 1e-5


def test_the_default_threshold_leaves_small_groups_to_the_own_part_kernel(tmp_path, capsys):
    """With the backend's own threshold (2,048 saved reads per layer for 4 query heads) a 32-token prefix
    shared by 4 or 8 (96 / 224 saved reads) is not grouped; the backend that groups everything, timed
    beside it, forms the groups; both equal torch_native."""
    from sglang_pd.srt.hooks.attention_backend import min_reads_saved_for

    out = tmp_path / "threshold.json"
    assert bench_attention.main(["--batch", "8", "--group-sizes", "1,4,8", "--prefix-lens", "32", "--own-len", "8",
                                 "--page-size", "16", "--repeats", "1", "--versus-group-all", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["min_reads_saved"] == min_reads_saved_for(4) == 2048
    cells = report["cells"]
    assert [(c["num_groups"], c["group_all_groups"]) for c in cells] == [(0, 0), (0, 2), (0, 1)]
    for cell in cells:
        assert cell["max_abs_diff"] <= 1e-5 and cell["group_all_ms"] > 0
        assert cell["shared_kv_tokens"] == cell["plain_kv_tokens"]  # nothing grouped: every row read in place
    assert "all grp" in capsys.readouterr().out


def test_bad_grid_is_refused():
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--batch", "8", "--group-sizes", "3"])


def test_shared_config_selects_the_backend_on_both_pd_servers():
    assert SHARED_BACKEND == BACKEND_NAME
    configs = {c.name: c for c in parse_configs("off,on,off+shared,on+shared", None, None)}
    assert {n: (c.decode_radix, c.decode_attention_backend, c.prefill_attention_backend)
            for n, c in configs.items()} == {
        "off": (False, "torch_native", "torch_native"), "on": (True, "torch_native", "torch_native"),
        "off+shared": (False, BACKEND_NAME, BACKEND_NAME), "on+shared": (True, BACKEND_NAME, BACKEND_NAME)}
    dep = PDDeployment(DeploymentConfig(decode_attention_backend=BACKEND_NAME, prefill_attention_backend=BACKEND_NAME,
                                        with_plain=True))
    backend_of = {s.name: s.argv[s.argv.index("--attention-backend") + 1] for s in dep.servers}
    assert backend_of == {"prefill": BACKEND_NAME, "decode0": BACKEND_NAME, "plain": "torch_native"}
    with pytest.raises(ValueError, match="prefill_attention_backend"):
        DeploymentConfig(plugin=False, prefill_attention_backend=BACKEND_NAME)


def test_identical_outputs_are_counted_against_off_or_the_first_configuration():
    from sglang_pd.bench.report import identical_outputs

    outputs = {"on": {(0, 0): [1, 2], (0, 1): [3]}, "on+shared": {(0, 0): [1, 2], (0, 1): [4]}}
    assert identical_outputs(outputs) == {"reference": "on", "num_outputs": 2, "counts": {"on+shared": 1}}
    outputs["off"] = {(0, 0): [1, 2], (0, 1): [3]}
    assert identical_outputs(outputs)["counts"] == {"on": 2, "on+shared": 1}
