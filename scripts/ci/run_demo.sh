#!/usr/bin/env bash
# The main job (README): fresh-machine install, then the multi-turn benchmark's short preset: a PD pair
# with decode radix cache OFF, then ON, on the built-in model; prints the side-by-side table.
# usage: scripts/ci/run_demo.sh [python -m sglang_pd.bench_multiturn args, e.g. --preset capacity]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
bash "$ROOT/scripts/ci/install.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m sglang_pd.bench_multiturn --preset short "$@"
