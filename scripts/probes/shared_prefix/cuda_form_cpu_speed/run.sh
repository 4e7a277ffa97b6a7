#!/usr/bin/env bash
# The CPU path's speed before and after the CUDA-form wiring (issue 45: "the CPU path is unchanged in speed"):
# the capacity preset's on+shared on the code of BEFORE (a commit, checked out into a worktree) and of this
# checkout, in ABBA order twice (8 runs, ~9 min alone on the box), then summarise.py.
#   bash scripts/probes/shared_prefix/cuda_form_cpu_speed/run.sh f5b6638
set -euo pipefail
BEFORE=${1:?usage: run.sh BEFORE_COMMIT}
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$ROOT"
OUT=docs/results/shared_prefix/cuda_form_cpu_speed
WT=$(mktemp -d)/before
git worktree add -f "$WT" "$BEFORE" -q
trap 'git worktree remove --force "$WT"' EXIT
for run in before1 after1 after2 before2 after3 before3 before4 after4; do
  case $run in before*) PP="$WT/python";; *) PP="$ROOT/python";; esac
  PYTHONPATH=$PP .venv/bin/python -m sglang_pd.bench_multiturn --preset capacity --configs on+shared --no-progress \
      --out-dir "$OUT/$run" > "$OUT/$run.log" 2>&1
  echo "$run rc=$?"
done
.venv/bin/python "$(dirname "$0")/summarise.py" "$OUT" | tee "$OUT/summary.txt"
