#!/usr/bin/env bash
# Every measurement of docs/shared_prefix_attention.md, in sequence (alone on the box: ~50 min), into
# docs/results/shared_prefix/; each log starts with its command. Then
# `python scripts/probes/shared_prefix/render_tables.py` prints the page's tables. The repeated runs
# (repeats/, cpu_split/) were folded into *_summary.json by scripts/docs/fold_series.py: run it again after
# re-measuring them (add the new run folders to its SERIES) and remove the folders.
#   bash scripts/probes/shared_prefix/measure.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
D=docs/results/shared_prefix
S=scripts/probes/shared_prefix
PY=.venv/bin/python
run() { bash scripts/run_logged.sh "$@"; }  # run LOG CMD...: the command, then its output, into LOG
run $D/bench_attention.log $PY -m sglang_pd.bench_attention --versus-group-all --json $D/bench_attention.json
run $D/bench_attention_churn.log $PY -m sglang_pd.bench_attention --batch 32 --group-sizes 1,4,32 --prefix-lens 768 \
    --own-len 130 --repeats 60 --churn 32 --json $D/bench_attention_churn.json
run $D/bench_attention_scatter.log $PY -m sglang_pd.bench_attention --scatter --group-sizes 1,64 --prefix-lens 128,1024 \
    --json $D/bench_attention_scatter.json
run $D/bench_attention_smollm2.log $PY -m sglang_pd.bench_attention --geometry smollm2 --batch 16 --group-sizes 1,4,16 \
    --prefix-lens 128,1024 --page-size 16 --versus-group-all --json $D/bench_attention_smollm2.json
# the grouping threshold (min_reads_saved): small groups timed grouped and read in place, side by side
run $D/min_reads_saved/capacity.log $PY -m sglang_pd.bench_attention --group-sizes 2,4,8,16 --prefix-lens 64,128,256,512 \
    --versus-group-all --json $D/min_reads_saved/capacity.json
run $D/min_reads_saved/smollm2.log $PY -m sglang_pd.bench_attention --geometry smollm2 --batch 16 --page-size 16 \
    --group-sizes 2,4,16 --prefix-lens 128,512,1024 --repeats 4 --versus-group-all --json $D/min_reads_saved/smollm2.json
run $D/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
    --configs off,on,off+shared,on+shared --out-dir $D --no-progress
for i in 2 3 4 5; do
  run $D/repeats/run$i/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs off,on+shared --out-dir $D/repeats/run$i --no-progress
done
# runs 6-8: after 5f3d9bb (prefill's mooncake transfer workers at nice 19, the new default)
for i in 6 7 8; do
  run $D/repeats/run$i/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs off,on+shared --out-dir $D/repeats/run$i --no-progress
done
# run 9: after 0c1819d (segments only where they save enough reads: min_reads_saved)
run $D/repeats/run9/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
    --configs off,on+shared --out-dir $D/repeats/run9 --no-progress
# run 10, with an ITL-target configuration beside it (target chosen below off's usual ITL before the run)
run $D/itl_target/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
    --configs off,on+shared,on+shared+itl --itl-target-ms 15 --out-dir $D/itl_target --no-progress
# runs 11-14: 2026-11-26, main after eb353e7 (no product code changed since the split runs of cpu_split/)
for i in 11 12 13 14; do
  run $D/repeats/run$i/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs off,on+shared --out-dir $D/repeats/run$i --no-progress
done
run $D/smollm2/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --model smollm2 --preset short --num-clients 4 \
    --num-rounds 3 --max-new-tokens 16 --transfer-backend nixl --page-size 16 --configs on,on+shared \
    --out-dir $D/smollm2 --no-progress
run $D/smollm2_repeat/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --model smollm2 --preset short --num-clients 4 \
    --num-rounds 3 --max-new-tokens 16 --transfer-backend nixl --page-size 16 --configs on,on+shared \
    --out-dir $D/smollm2_repeat --no-progress
run $D/smollm2_16clients/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --model smollm2 --preset short \
    --num-clients 16 --num-rounds 3 --max-new-tokens 16 --transfer-backend nixl --page-size 16 --configs on,on+shared \
    --out-dir $D/smollm2_16clients --no-progress
run $D/own_kernel_ab/run.log bash $S/own_kernel_ab/run.sh
PYSPY=${PYSPY:-/tmp/tools/bin/py-spy} run $D/profile/record.log $PY $S/profile/record.py
# decode's scheduler on a CPU of its own (--cpu-split decode-scheduler) vs every process on both CPUs, alternating;
# then one run with the whole decode server on its own CPU (--cpu-split decode)
for i in 1 2 3; do
  for place in shared decode-scheduler; do
    extra=(); [ $place != shared ] && extra=(--cpu-split $place)
    run $D/cpu_split/${place}_$i/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
        --configs off,on+shared "${extra[@]}" --out-dir $D/cpu_split/${place}_$i --no-progress
  done
done
run $D/cpu_split/decode_1/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
    --configs off,on+shared --cpu-split decode --out-dir $D/cpu_split/decode_1 --no-progress
# then only the main thread of decode's scheduler alone (--cpu-split decode-step), alternating with more shared runs
one() {  # one PLACE I
  extra=(); [ $1 != shared ] && extra=(--cpu-split $1)
  run $D/cpu_split/$1_$2/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs off,on+shared "${extra[@]}" --out-dir $D/cpu_split/$1_$2 --no-progress
}
one decode-step 1; one shared 4; one decode-step 2; one shared 5; one decode-step 3; one shared 6; one decode-step 4
one shared 7; one decode-step 5; one shared 8; one decode-step 6
# CPU time and run-queue wait of every server thread: every process on both CPUs, then decode's scheduler alone
run $D/contention/run.log $PY $S/contention/run.py
run $D/contention/run_decode-scheduler.log $PY $S/contention/run.py --cpu-split decode-scheduler
run $D/contention/run_decode-step.log $PY $S/contention/run.py --cpu-split decode-step
run $D/send_preemption/run.log $PY $S/send_preemption/run.py
