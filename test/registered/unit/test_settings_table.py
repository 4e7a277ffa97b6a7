"""README's settings table is `python -m sglang_pd.config` output, row for row (as test_pd_metrics does for
the metrics table): a setting added, renamed or re-worded in config.SETTINGS without the README pasted
again fails here."""

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pd.config import PREFIX, SETTINGS, markdown_table

pytestmark = pytest.mark.unit

README = Path(__file__).parents[3] / "README.md"


def test_readme_holds_the_settings_table_as_generated():
    table = markdown_table()
    assert table in README.read_text(), "paste `python -m sglang_pd.config` into README.md's settings section"
    assert all(f"| `{s.name}` |" in table for s in SETTINGS) and all(s.name.startswith(PREFIX) for s in SETTINGS)
    assert len(table.splitlines()) == len(SETTINGS) + 2, "one row per setting under the header"


def test_the_module_prints_the_table():
    root = Path(__file__).parents[3]
    proc = subprocess.run([sys.executable, "-m", "sglang_pd.config"], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(root / "python"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout == markdown_table() + "\n", proc.stderr
