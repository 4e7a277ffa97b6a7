#!/usr/bin/env bash
# The own-part C kernel (0a1fa8b and later: own KV read in place from the pool) against the own-KV arena
# it replaced (22ed0f4), with the same benchmark code: this tree's bench_attention.py and
# bench/attention_world.py are copied over the old commit's (its backend is untouched), so both run the
# same cells, including --churn. Alternating, two runs each; log in docs/results/shared_prefix/own_kernel_ab/.
#   bash scripts/probes/shared_prefix/own_kernel_ab/run.sh > docs/results/shared_prefix/own_kernel_ab/run.log 2>&1
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$ROOT"
OLD=$(mktemp -d)/22ed0f4
git worktree add --detach "$OLD" 22ed0f4 > /dev/null
trap 'git worktree remove --force "$OLD"' EXIT
cp python/sglang_pd/bench_attention.py "$OLD/python/sglang_pd/bench_attention.py"
cp python/sglang_pd/bench/attention_world.py "$OLD/python/sglang_pd/bench/attention_world.py"
CELLS=("--churn 32" "--churn 32 --scatter" "--churn 0")
for i in 1 2; do
  for cell in "${CELLS[@]}"; do
    for v in 22ed0f4 HEAD; do
      if [ "$v" = 22ed0f4 ]; then P="$OLD/python"; else P="$ROOT/python"; fi
      # shellcheck disable=SC2086
      ARGS="--batch 32 --group-sizes 32,1 --prefix-lens 768 --own-len 130 --repeats 100 $cell"
      echo "== $v run $i: PYTHONPATH=$P .venv/bin/python -m sglang_pd.bench_attention $ARGS"
      # shellcheck disable=SC2086
      PYTHONPATH="$P" .venv/bin/python -m sglang_pd.bench_attention $ARGS 2>&1 | sed -n "/^group/,\$p" | grep -E "^ +[0-9]"
    done
  done
done
