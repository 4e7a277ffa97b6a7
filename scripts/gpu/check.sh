#!/usr/bin/env bash
# GPU check of the shared-prefix Triton kernels. NOT RUN: written on a 2-core box with no GPU, where the
# kernels ran only under Triton's CPU interpreter (test/registered/unit/test_triton_shared_prefix.py).
# On a CUDA machine with this checkout, within 10 minutes (the steps' timeouts add up to 600 s):
#   1. installs the GPU stack (sglang 0.5.23 with its CUDA deps) and this package;
#   2. runs the numerics cases on CUDA (triton_numerics.py --device cuda) and fails on a diff over tolerance;
#   3. sweeps our kernels against SGLang's Triton decode kernel: 8/32/128 requests x 1k/4k/16k shared prefix;
#   4. one capacity-preset bench_multiturn off, on, on+shared: the harness puts sglang_pd_shared_prefix on
#      decode with SGLang's Triton backend for extends and the decode CUDA graph off (harness/cpu_env.py).
# Everything goes to docs/gpu/.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=docs/gpu
mkdir -p "$OUT"
timeout 200 pip install -q "sglang==0.5.23" -e .
export PYTHONPATH="$PWD/python"
timeout 60 python test/registered/unit/triton_numerics.py --device cuda > "$OUT/numerics_cuda.json"
python - "$OUT/numerics_cuda.json" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))
bad = {name: c for name, c in cases.items() if name.startswith(("page", "groups", "nested", "inside"))
       and max(c["vs_torch"], c["vs_sglang_decode"]) > 1e-5}
bad.update({n: c for n, c in cases.items() if n.startswith("bf16") and c["vs_torch"] > 3e-2})
print("numerics on CUDA:", "ok" if not bad else f"OVER TOLERANCE {bad}")
sys.exit(1 if bad else 0)
PY
timeout 120 python scripts/gpu/sweep_attention.py --out "$OUT/sweep_attention.json"
timeout 220 python -m sglang_pd.bench_multiturn --preset capacity --configs off,on,on+shared --no-progress \
    --out-dir "$OUT/bench_multiturn_capacity"
