#!/usr/bin/env bash
# The main job (README): fresh-machine install, then the PD pair + router demo on the default model.
# usage: scripts/ci/run_demo.sh [python -m sglang_pd.demo args]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
bash "$ROOT/scripts/ci/install.sh"
exec "$ROOT/.venv/bin/python" -m sglang_pd.demo "$@"
