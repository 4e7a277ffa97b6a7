"""Built-in models that need no download: Llama configs served with `--load-format dummy`.

SGLang's dummy loader seeds its weights, so every server built from the same config produces the
same outputs: PD output can be compared token for token with a plain server. No tokenizer: clients
send `input_ids` and servers run with `--skip-tokenizer-init`.
"""

from __future__ import annotations

import json
from pathlib import Path

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
REAL_MODELS = ("smollm2",)  # real weights + tokenizer (see real_model.py); the others are dummy-weight configs
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
    """True for built-in models with real weights and a tokenizer (served without dummy flags)."""
    return name in REAL_MODELS


def ensure_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The folder of built-in model `name`: a written config (dummy weights) or a converted real model."""
    if is_real_model(name):
        return ensure_smollm2_dir(models_root())
    config = model_config(name)
    folder = models_root() / f"llama-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    text = json.dumps(config, indent=2, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return folder
