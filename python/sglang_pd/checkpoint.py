"""Model folders built on this machine at first use: `build_once` (stamp + lock) and the seeded Llama
checkpoints of the built-in `tiny` and `capacity` models.

Why seeded weights at a trained model's scale, not SGLang's `--load-format dummy`: the dummy loader
fills every weight uniform in +-1e-3, so attention adds ~1e-5 of the residual stream and greedy tokens
ignore the context; an "identical outputs" check on such a model cannot tell right KV from wrong.
Here every matrix is normal with the config's `initializer_range` (0.02, as HF initialises Llama),
except the attention projections, drawn larger so that attention is sharp and carries the context:
q/k at 0.2 (attention logits of a few units, so a single page of wrong KV moves the output) and v/o at
0.08 (attention's share of the residual stream comparable to the token's own). Measured on both
shapes (`python -m sglang_pd.model_sensitivity`, docs/results/evidence/sensitivity.json): with the attention
output zeroed, the context shuffled, one 16-token page of KV replaced or the last tokens at shifted
positions, the greedy outputs change for most prompts.

The weights depend only on (shape, seed, scales) and torch's CPU generator: every server on every
machine with the same torch builds the same checkpoint, so outputs are comparable across servers.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Callable

SEED = 20261128
INIT_STD = 0.02       # the config's initializer_range (HF Llama's)
QK_STD = 0.2          # q_proj, k_proj: sharp attention
VO_STD = 0.08         # v_proj, o_proj: attention's output comparable to the residual stream
STAMP = "sglang_pd_built.json"


def build_once(folder: Path, recipe: dict, build: Callable[[Path], None]) -> Path:
    """`folder`, built by `build(folder)` unless its stamp already records `recipe` (idempotent and
    process-safe: a lock file beside the folder keeps two processes from building at once; the stamp is
    written last, so a build that died half-way is built again). Returns `folder`."""
    stamp = folder / STAMP
    if _stamped(stamp, recipe):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamped(stamp, recipe):
            stamp.unlink(missing_ok=True)
            build(folder)
            stamp.write_text(json.dumps(recipe, sort_keys=True))
    return folder


def _stamped(stamp: Path, recipe: dict) -> bool:
    try:
        return json.loads(stamp.read_text()) == json.loads(json.dumps(recipe, sort_keys=True))
    except (OSError, ValueError):
        return False


def _std(name: str) -> float:
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        return QK_STD
    if name.endswith(("v_proj.weight", "o_proj.weight")):
        return VO_STD
    return INIT_STD


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Llama checkpoint for `config` (HF names, the order they are drawn in)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (q_out, h),
                       p + "self_attn.k_proj.weight": (kv_out, h), p + "self_attn.v_proj.weight": (kv_out, h),
                       p + "self_attn.o_proj.weight": (h, q_out), p + "post_attention_layernorm.weight": (h,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (vocab, h)})
    return shapes


def seeded_weights(config: dict, seed: int = SEED) -> dict:
    """The checkpoint's tensors (fp32): norms all ones, every matrix normal(0, its std) from one
    generator seeded with `seed`, drawn in `weight_shapes` order."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            out[name] = torch.randn(shape, generator=gen, dtype=torch.float32) * _std(name)
    return out


def recipe(config: dict, seed: int = SEED) -> dict:
    """What a built checkpoint folder is stamped with: a different recipe builds it again."""
    return {"format": 1, "config": config, "seed": seed,
            "std": {"default": INIT_STD, "q_proj,k_proj": QK_STD, "v_proj,o_proj": VO_STD}}


def write_checkpoint(folder: Path, config: dict, seed: int = SEED) -> None:
    """config.json + model.safetensors of the seeded Llama `config` into `folder` (overwritten)."""
    from safetensors.torch import save_file

    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(seeded_weights(config, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
