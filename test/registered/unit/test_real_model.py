"""real_model: the packaged GGUF is found; a finished conversion (its build_once stamp) is not redone."""

import json

import pytest

from sglang_pd import real_model
from sglang_pd.checkpoint import STAMP

pytestmark = pytest.mark.unit


def test_packaged_gguf_is_found():
    path = real_model.gguf_path()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000


def test_converted_folder_is_returned_without_converting(tmp_path, monkeypatch):
    from sglang_pd.models import ensure_model_dir

    monkeypatch.setenv("SGLANG_PD_MODEL_DIR", str(tmp_path))
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    src = real_model.gguf_path()
    recipe = {"format": real_model._FORMAT, "source": src.name, "size_bytes": src.stat().st_size}
    (folder / STAMP).write_text(json.dumps(recipe))
    monkeypatch.setattr(real_model, "_convert", lambda *a: pytest.fail("must not convert again"))
    assert real_model.ensure_smollm2_dir(tmp_path) == folder
    assert ensure_model_dir("smollm2") == folder  # the models registry resolves the same folder
