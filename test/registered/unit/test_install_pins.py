"""The venv scripts/ci/install.sh builds holds exactly the versions scripts/ci/constraints.txt pins.

install.sh passes the constraints to every pip call, so a fresh install cannot drift when a dependency
publishes a new release; this test catches the other direction: a distribution added to install.sh (or a
new transitive one) without a pin, or a pin edited without re-installing.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
PINS = ROOT / "scripts" / "ci" / "constraints.txt"
NOT_PINNED = {"sglang-pd"}  # this project, installed editable from the clone


def canonical(name: str) -> str:
    """PEP 503 name: case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> str:
    """A version without its local label (torch 2.13.0+cpu satisfies the pin torch==2.13.0)."""
    return version.split("+", 1)[0]


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line; raises on any other non-comment line."""
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"{path.name}:{number}: not an exact pin: {line!r}")
        name = canonical(match.group(1))
        if name in pins:
            raise ValueError(f"{path.name}:{number}: {name} pinned twice")
        pins[name] = match.group(2)
    return pins


def installed() -> dict[str, str]:
    """name -> version of every distribution in this interpreter's environment."""
    return {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def mismatches(pins: dict[str, str], present: dict[str, str]) -> list[str]:
    """What differs between the pins and an environment (empty when they agree)."""
    found = [f"{name} {version} installed, not pinned" for name, version in sorted(present.items())
             if name not in pins and name not in NOT_PINNED]
    found += [f"{name} pinned {pins[name]}, installed {present[name]}" for name in sorted(pins)
              if name in present and release(present[name]) != pins[name]]
    found += [f"{name} pinned {pins[name]}, not installed" for name in sorted(pins) if name not in present]
    return found


def test_pins_file_is_exact_pins_only():
    pins = read_pins(PINS)
    assert {"sglang", "torch", "pip"} <= set(pins), "the pins must cover the direct deps and the installer"
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.13.0"


def test_venv_matches_the_pins():
    pins, present = read_pins(PINS), installed()
    assert "sglang" in present, "run under the venv install.sh built"
    assert mismatches(pins, present) == []


def test_mismatches_names_each_kind_of_drift():
    pins = {"a": "1.0", "b": "2.0", "c": "3.0"}
    present = {"a": "1.0+cpu", "b": "2.1", "d": "0.1", "sglang-pd": "0.1.0"}
    assert mismatches(pins, present) == ["d 0.1 installed, not pinned", "b pinned 2.0, installed 2.1",
                                         "c pinned 3.0, not installed"]


def test_read_pins_refuses_a_range(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("# header\nfoo==1.0\nbar>=2\n")
    with pytest.raises(ValueError, match="constraints.txt:3: not an exact pin"):
        read_pins(path)
