"""real_model: the packaged GGUF is found; a finished conversion is recognised by its stamp format."""

import json

import pytest

from sglang_pd import real_model

pytestmark = pytest.mark.unit


def test_packaged_gguf_is_found():
    path = real_model.gguf_path()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000


def test_stamp_format_decides_reconversion(tmp_path):
    stamp = tmp_path / "stamp.json"
    assert not real_model._done(stamp)                      # never converted
    stamp.write_text("{not json")
    assert not real_model._done(stamp)                      # torn write
    stamp.write_text(json.dumps({"format": real_model._FORMAT - 1}))
    assert not real_model._done(stamp)                      # older conversion: redo
    stamp.write_text(json.dumps({"format": real_model._FORMAT}))
    assert real_model._done(stamp)


def test_converted_folder_is_returned_without_converting(tmp_path, monkeypatch):
    from sglang_pd.models import ensure_model_dir

    monkeypatch.setenv("SGLANG_PD_MODEL_DIR", str(tmp_path))
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    (folder / real_model._STAMP).write_text(json.dumps({"format": real_model._FORMAT}))
    monkeypatch.setattr(real_model, "_convert", lambda *a: pytest.fail("must not convert again"))
    assert real_model.ensure_smollm2_dir(tmp_path) == folder
    assert ensure_model_dir("smollm2") == folder  # the models registry resolves the same folder
