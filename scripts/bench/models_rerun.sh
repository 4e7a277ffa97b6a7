#!/usr/bin/env bash
# Issue 41's re-runs on the seeded checkpoints (run alone on the box):
#  1. speed: the capacity preset off,on on the previous code (dummy weights) and on this code, alternating,
#     twice each: weight values must not change the CPU cost;
#  2. every configuration the README compares, with its identical-output counts, on the new models.
# usage: scripts/bench/models_rerun.sh OLD_CHECKOUT [OUT_DIR]   (OLD_CHECKOUT: a worktree of the code before
#        the checkpoints, e.g. `git worktree add /tmp/old 6157fea`; OUT_DIR default docs/results/evidence;
#        the speed_* runs are folded into speed_summary.json there by scripts/docs/fold_series.py)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OLD=$(cd "$1" && pwd)
OUT=${2:-$ROOT/docs/results/evidence}
PY="$ROOT/.venv/bin/python"
cd "$ROOT"
run() {  # run NAME PYTHONPATH ARGS...
  local name=$1 path=$2; shift 2
  mkdir -p "$OUT/$name"
  echo "== $name: $*"
  PYTHONPATH="$path" "$PY" -m sglang_pd.bench_multiturn --no-progress --out-dir "$OUT/$name" "$@" \
    > "$OUT/$name/console.log" 2>&1 || echo "== $name exited $?"
  grep -E "TTFT p50|ITL p50|request throughput|identical" "$OUT/$name/console.log" || true
}
for i in 1 2; do
  run "speed_old_$i" "$OLD/python" --preset capacity --configs off,on
  run "speed_new_$i" "$ROOT/python" --preset capacity --configs off,on
done
run rerun_short "$ROOT/python" --preset short --configs off,on-upstream,on,on+local
run rerun_capacity "$ROOT/python" --preset capacity --configs off,on-upstream,on,on+shared
