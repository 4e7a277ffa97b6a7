"""The test-registry gate refuses misplaced or unmarked test files."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_GATE = Path(__file__).resolve().parents[3] / "scripts" / "ci" / "check_test_registry.py"
_spec = importlib.util.spec_from_file_location("check_test_registry", _GATE)
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_repo_is_clean():
    assert gate.problems() == []


def test_refuses_unregistered_files(tmp_path):
    _write(tmp_path, "test/registered/unit/test_ok.py", "import pytest\npytestmark = pytest.mark.unit\n")
    _write(tmp_path, "test/registered/unit/test_nomark.py", "def test_x(): pass\n")
    _write(tmp_path, "test/registered/integration/test_wrong.py", "import pytest\npytestmark = pytest.mark.unit\n")
    _write(tmp_path, "test/test_stray.py", "def test_x(): pass\n")
    _write(tmp_path, "test/registered/gpu/test_newtier.py", "import pytest\npytestmark = pytest.mark.gpu\n")
    found = "\n".join(gate.problems(tmp_path))
    assert "test_ok.py" not in found
    for name in ("test_nomark.py", "test_wrong.py", "test_stray.py", "test_newtier.py"):
        assert name in found
