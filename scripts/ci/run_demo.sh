#!/usr/bin/env bash
# The main job (README): fresh-machine install, then the multi-turn benchmark's short preset on the built-in
# model, one PD pair per configuration: `off` (no decode radix cache), `on-upstream` (upstream SGLang's
# --disaggregation-decode-enable-radix-cache, sglang_pd not loaded) and `on+shared` (sglang_pd's recommended
# configuration: the flag plus its shared-prefix attention backend); prints the side-by-side table.
# usage: scripts/ci/run_demo.sh [python -m sglang_pd.bench_multiturn args, e.g. --preset capacity]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
bash "$ROOT/scripts/ci/install.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m sglang_pd.bench_multiturn --preset short --configs off,on-upstream,on+shared "$@"
