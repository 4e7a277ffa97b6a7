#!/usr/bin/env bash
# This round's partials (fused CPU attention kernel, commit 0329499 and later) against the previous
# commit's (bmm + softmax + bmm, a4d0f43), same cells, alternating, two runs each; its log is folded into
# docs/results/shared_prefix/kernel_ab_summary.json (scripts/docs/fold_series.py).
#   bash scripts/probes/shared_prefix/kernel_ab/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$ROOT"
OLD=$(mktemp -d)/a4d0f43
git worktree add --detach "$OLD" a4d0f43 > /dev/null
trap 'git worktree remove --force "$OLD"' EXIT
ARGS=(--batch 32 --group-sizes 32,1 --prefix-lens 768 --own-len 100 --repeats 20)
for i in 1 2; do
  for v in a4d0f43 HEAD; do
    if [ "$v" = a4d0f43 ]; then P="$OLD/python"; else P="$ROOT/python"; fi
    echo "== $v run $i: PYTHONPATH=$P .venv/bin/python -m sglang_pd.bench_attention ${ARGS[*]}"
    PYTHONPATH="$P" .venv/bin/python -m sglang_pd.bench_attention "${ARGS[@]}" 2>&1 | grep -E "^group|^ +[0-9]"
  done
done
