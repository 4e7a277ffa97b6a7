"""Built-in models that need no download: `tiny` and `capacity`, seeded Llama checkpoints built on this
machine at first use (checkpoint.py: safetensors at a trained model's weight scale, loaded by SGLang's
normal loader), and `smollm2` (real weights, real_model.py).

Every server built from the same name loads the same weights, so PD output can be compared token for
token (and logprob for logprob) with a plain server, and on these weights the output depends on the
KV. No tokenizer for tiny/capacity: clients send `input_ids` and servers run with `--skip-tokenizer-init`.
"""

from __future__ import annotations

from pathlib import Path

from sglang_pd.checkpoint import build_once, recipe, write_checkpoint
from sglang_pd.config import Settings
from sglang_pd.real_model import ensure_smollm2_dir

_BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "initializer_range": 0.02,  # checkpoint.INIT_STD: the weights are drawn at this scale (attention larger)
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

# name -> (hidden, intermediate, layers, heads, kv_heads, head_dim)
_SHAPES = {
    "tiny": (64, 128, 2, 4, 4, 16),       # mechanics: fastest forward on 2 CPU cores
    "capacity": (256, 1024, 4, 4, 4, 64),  # benchmark preset: decode step cost comparable to FINDINGS §5
}

DEFAULT_MODEL = "tiny"
REAL_MODELS = ("smollm2",)  # real weights + tokenizer (see real_model.py); the others are seeded checkpoints
VOCAB_SIZE = _BASE["vocab_size"]


def model_config(name: str) -> dict:
    """The HF config dict of built-in model `name`; raises ValueError naming the known ones."""
    if name not in _SHAPES:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(sorted([*_SHAPES, *REAL_MODELS]))}")
    hidden, inter, layers, heads, kv_heads, head_dim = _SHAPES[name]
    return dict(_BASE, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)


def models_root() -> Path:
    """Where model folders are written ($SGLANG_PD_MODEL_DIR or ~/.cache/sglang_pd/models)."""
    return Settings.from_env().models_root


def is_real_model(name: str) -> bool:
    """True for built-in models with real weights and a tokenizer (the others run with --skip-tokenizer-init)."""
    return name in REAL_MODELS


def ensure_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The folder of built-in model `name`, built on first use: a seeded checkpoint (config.json +
    model.safetensors, a few seconds) or the converted real model."""
    if is_real_model(name):
        return ensure_smollm2_dir(models_root())
    config = model_config(name)
    return build_once(models_root() / f"llama-{name}-seeded", recipe(config),
                      lambda folder: write_checkpoint(folder, config))
