#!/usr/bin/env bash
# Every measurement of docs/local_prefill.md, in sequence (alone on the box: ~30 min), into
# docs/results/local_prefill/; each log starts with its command. Then
# `python scripts/probes/local_prefill/render_tables.py` prints the tables. The repeated runs were folded
# into *_summary.json by scripts/docs/fold_series.py: run it again after re-measuring them (add the new
# run folders to its SERIES) and remove the folders.
#   bash scripts/probes/local_prefill/measure.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
D=docs/results/local_prefill
PY=.venv/bin/python
run() { bash scripts/run_logged.sh "$@"; }  # run LOG CMD...: the command, then its output, into LOG
ALL=off,on,on+local,on+shared,on+local+shared
run $D/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs $ALL \
    --local-prefill-tokens 64 --out-dir $D --no-progress
run $D/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity --configs $ALL \
    --local-prefill-tokens 64 --out-dir $D --no-progress
for i in 2 3 4 5; do
  run $D/repeats/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/repeats/run$i --no-progress
done
# runs 6-13: after 5f3d9bb (prefill's mooncake transfer workers at nice 19, the new default)
for i in 6 7 8 9 10 11 12 13; do
  run $D/repeats/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/repeats/run$i --no-progress
done
run $D/sweep/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on \
    --local-sweep 0,16,64,256 --out-dir $D/sweep --no-progress
# PD schedulers spinning (SGLANG_PD_IDLE_WAIT_US=0, upstream's sleep(0)) vs waiting (the default), alternating
for i in 1 2 3; do
  for mode in spin wait; do
    if [ $mode = spin ]; then us=0; else us=500; fi
    run $D/idle_wait/${mode}_$i/bench_multiturn_short.log env SGLANG_PD_IDLE_WAIT_US=$us $PY -m sglang_pd.bench_multiturn \
        --preset short --configs on,on+local --local-prefill-tokens 64 --out-dir $D/idle_wait/${mode}_$i --no-progress
  done
done
# where the time goes: SGLang's per-stage latencies of on's PD requests beside on+local's local path
for i in 1 2 3 4; do
  run $D/stages/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/stages/run$i --no-progress
done
# prefill's mooncake transfer workers at upstream's priority (nice 0) vs the default nice 19, alternating
for i in 1 2 3; do
  for nice in 0 19; do
    run $D/transfer_nice/nice${nice}_$i/bench_multiturn_short.log env SGLANG_PD_TRANSFER_WORKER_NICE=$nice \
        $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local --local-prefill-tokens 64 \
        --out-dir $D/transfer_nice/nice${nice}_$i --no-progress
  done
done
# decode on SGLang's overlap loop (its default on CPU too) vs its normal loop, alternating
for i in 1 2 3; do
  for loop in overlap normal; do
    extra=(); [ $loop = normal ] && extra=(--decode-arg=--disable-overlap-schedule)
    run $D/decode_loop/${loop}_$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short \
        --configs on,on+local --local-prefill-tokens 64 "${extra[@]}" --out-dir $D/decode_loop/${loop}_$i --no-progress
  done
done
# decode's scheduler on a CPU of its own (--cpu-split decode-scheduler) vs every process on both CPUs, alternating
for i in 1 2 3; do
  for place in shared decode-scheduler; do
    extra=(); [ $place != shared ] && extra=(--cpu-split $place)
    run $D/cpu_split/${place}_$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short \
        --configs on,on+local --local-prefill-tokens 64 "${extra[@]}" --out-dir $D/cpu_split/${place}_$i --no-progress
  done
done
# then only the main thread of decode's scheduler alone (--cpu-split decode-step)
for i in 1 2 3; do
  run $D/cpu_split/decode-step_$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short \
      --configs on,on+local --local-prefill-tokens 64 --cpu-split decode-step --out-dir $D/cpu_split/decode-step_$i --no-progress
done
# runs 18-25: 2026-11-26, main after eb353e7 (no product code changed since the runs above)
for i in 18 19 20 21 22 23 24 25; do
  run $D/repeats/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/repeats/run$i --no-progress
done
# then with the TTFT split at decode's tokenizer manager in the report (same command, new table)
for i in 1 2 3; do
  run $D/ttft_split/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/ttft_split/run$i --no-progress
done
# then with the client's record of when the declined prefill half answered (same command, new line)
for i in 1 2 3; do
  run $D/answer_order/run$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short --configs on,on+local \
      --local-prefill-tokens 64 --out-dir $D/answer_order/run$i --no-progress
done
# 2026-11-26 (seventh session): through a stock sglang-router (--via-router), alternating with the direct client
for i in 1 2 3 4; do
  for via in router direct; do
    extra=(); [ $via = router ] && extra=(--via-router)
    run $D/via_router/${via}_$i/bench_multiturn_short.log $PY -m sglang_pd.bench_multiturn --preset short \
        --configs on,on+local --local-prefill-tokens 64 "${extra[@]}" --out-dir $D/via_router/${via}_$i --no-progress
  done
done
# capacity preset (prefill busy with the PD requests): when the declined half answers, direct and through the router
for via in direct router; do
  extra=(); [ $via = router ] && extra=(--via-router)
  run $D/via_router/capacity_$via/bench_multiturn_capacity.log $PY -m sglang_pd.bench_multiturn --preset capacity \
      --configs on,on+local --local-prefill-tokens 64 "${extra[@]}" --out-dir $D/via_router/capacity_$via --no-progress
done
