"""checkpoint: the seeded Llama checkpoints (deterministic, at their stated scales, loadable by SGLang's
weight names) and build_once (built once, again when the recipe changes or the stamp is torn)."""

import json

import pytest
import torch

from sglang_pd import checkpoint
from sglang_pd.models import model_config

pytestmark = pytest.mark.unit


def test_weights_are_deterministic_and_drawn_at_their_scales():
    config = model_config("capacity")
    first, second = checkpoint.seeded_weights(config), checkpoint.seeded_weights(config)
    assert first.keys() == second.keys() == checkpoint.weight_shapes(config).keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    std = {k: float(v.std()) for k, v in first.items() if v.dim() == 2}
    assert std["model.layers.0.self_attn.q_proj.weight"] == pytest.approx(checkpoint.QK_STD, rel=0.02)
    assert std["model.layers.3.self_attn.k_proj.weight"] == pytest.approx(checkpoint.QK_STD, rel=0.02)
    assert std["model.layers.1.self_attn.o_proj.weight"] == pytest.approx(checkpoint.VO_STD, rel=0.02)
    assert std["model.layers.2.mlp.down_proj.weight"] == pytest.approx(checkpoint.INIT_STD, rel=0.02)
    assert std["lm_head.weight"] == pytest.approx(checkpoint.INIT_STD, rel=0.02)
    assert torch.equal(first["model.norm.weight"], torch.ones(config["hidden_size"]))
    other = checkpoint.seeded_weights(config, seed=checkpoint.SEED + 1)
    assert not torch.equal(first["lm_head.weight"], other["lm_head.weight"])


def test_shapes_follow_the_config_gqa_included():
    config = dict(model_config("tiny"), num_key_value_heads=2)
    shapes = checkpoint.weight_shapes(config)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * config["head_dim"], config["hidden_size"])
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * config["head_dim"], config["hidden_size"])
    assert len([k for k in shapes if k.startswith("model.layers.")]) == 9 * config["num_hidden_layers"]


def test_build_once_builds_again_only_for_a_new_recipe_or_a_torn_stamp(tmp_path):
    builds = []
    build = lambda folder: builds.append(folder)  # noqa: E731
    folder = tmp_path / "m"
    assert checkpoint.build_once(folder, {"v": 1}, build) == folder and builds == [folder]
    checkpoint.build_once(folder, {"v": 1}, build)
    assert len(builds) == 1                                   # stamped: not again
    checkpoint.build_once(folder, {"v": 2}, build)
    assert len(builds) == 2                                   # another recipe
    (folder / checkpoint.STAMP).write_text("{torn")
    checkpoint.build_once(folder, {"v": 2}, build)
    assert len(builds) == 3                                   # a build that died before its stamp
    assert json.loads((folder / checkpoint.STAMP).read_text()) == {"v": 2}


def test_a_build_that_raises_leaves_no_stamp(tmp_path):
    def broken(folder):
        raise OSError("disk full")

    folder = tmp_path / "m"
    with pytest.raises(OSError):
        checkpoint.build_once(folder, {"v": 1}, broken)
    assert not (folder / checkpoint.STAMP).exists()


def test_the_written_checkpoint_reads_back_as_drawn(tmp_path):
    from safetensors.torch import load_file

    config = model_config("tiny")
    checkpoint.write_checkpoint(tmp_path, config)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    loaded = load_file(str(tmp_path / "model.safetensors"))
    expected = checkpoint.seeded_weights(config)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in loaded)
