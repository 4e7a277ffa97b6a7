"""Gate: every test file lives in a registered tier and declares that tier; nothing else is a test.

A tier is a folder under test/registered/ listed in TIERS with the pytest mark its files must set as
`pytestmark = pytest.mark.<tier>`. Exit 1 (naming each offending file) on any violation.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TIERS = {
    "unit": "no server; seconds; runs everywhere",
    "integration": "real SGLang servers on 127.0.0.1, one deployment shared per session; CPU ok",
}
ROOT = Path(__file__).resolve().parents[2]
_MARK = re.compile(r"^pytestmark\s*=\s*(?:\[?\s*)pytest\.mark\.(\w+)", re.M)


def problems(root: Path = ROOT) -> list[str]:
    """Every violation of the registry rules under root/test (empty when clean)."""
    found = []
    for path in sorted((root / "test").rglob("test_*.py")):
        rel = path.relative_to(root)
        parts = rel.parts
        if len(parts) < 4 or parts[1] != "registered" or parts[2] not in TIERS:
            found.append(f"{rel}: test files must live in test/registered/<tier>/ with tier in {sorted(TIERS)}")
            continue
        marks = _MARK.findall(path.read_text())
        if marks != [parts[2]]:
            found.append(f"{rel}: must declare `pytestmark = pytest.mark.{parts[2]}` exactly once (found {marks})")
    return found


def main() -> int:
    bad = problems()
    for line in bad:
        print(f"unregistered test: {line}", file=sys.stderr)
    if not bad:
        count = len(list((ROOT / "test").rglob("test_*.py")))
        print(f"check_test_registry: {count} test files, all registered in {sorted(TIERS)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
