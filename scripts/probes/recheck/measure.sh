#!/usr/bin/env bash
# Re-check of the two open goals on the final main of 2026-11-27 (issues 17 and 20), alone on the box (~15 min):
# two capacity runs (off vs on+shared) and two short runs (on vs on+local), alternating. Each log starts with its command.
# Runs into docs/results/recheck/; folded into recheck_summary.json by scripts/docs/fold_series.py.
#   bash scripts/probes/recheck/measure.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=docs/results/recheck
PY=.venv/bin/python
run() { bash scripts/run_logged.sh "$@"; }
for i in 1 2; do
  run $D/capacity_$i/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs off,on+shared --out-dir $D/capacity_$i --no-progress
  run $D/short_$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/short_$i --no-progress
done
