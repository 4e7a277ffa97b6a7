#!/usr/bin/env bash
# The test command (README, .ci/run): fresh-machine install, registry gate, unit tier, integration tier.
# usage: scripts/ci/run_tests.sh [pytest args for both tiers]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
T0=$SECONDS
bash scripts/ci/install.sh
PY="$ROOT/.venv/bin/python"
echo "== install: $((SECONDS - T0))s"
"$PY" scripts/ci/check_test_registry.py
T1=$SECONDS
# two workers, a file each at a time (module fixtures once per file): 199 s against 337 s serial here
"$PY" -m pytest -p no:cacheprovider -q -m unit test/registered/unit --timeout 600 -n 2 --dist loadfile "$@"
echo "== unit tier: $((SECONDS - T1))s"
T2=$SECONDS
"$PY" -m pytest -p no:cacheprovider -q -m integration test/registered/integration --timeout 1200 --durations=40 "$@"
echo "== integration tier: $((SECONDS - T2))s"
echo "== total: $((SECONDS - T0))s"
