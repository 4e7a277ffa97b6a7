"""Environment and flags that let real SGLang 0.5.23 serve on a CPU-only box (see FINDINGS §1-2)."""

from __future__ import annotations

import json
import os

import torch

# Why each is needed, measured on 2-core CPU boxes:
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",                          # else RoPE imports vllm
    "SGLANG_HOST_IP": "127.0.0.1",                         # KV manager / transfer engine on loopback
    "MC_FORCE_TCP": "1",                                   # mooncake: TCP transport, no RDMA
    "MOONCAKE_PROTOCOL": "tcp",
    "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1",    # avoids pin_memory + cuda.Event in _send_kv_chunk
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0",  # avoids cuda.Event in early prefix send
    "UCX_NET_DEVICES": "lo",                               # NIXL/UCX listen on loopback only
    "UCX_MODULES": "^ib",                                  # else UCX segfaults at exit beside libibverbs1
    "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": json.dumps({"ucx_error_handling_mode": "none"}),
    "OMP_NUM_THREADS": "1",                                # several servers share 2 cores
    "TOKENIZERS_PARALLELISM": "false",
}


GPU_MEMORY_FRACTION = "0.25"  # of one GPU per server: a harness deployment runs up to 3 servers on it


def is_cpu_only() -> bool:
    """True when this machine has no CUDA device (the CPU workarounds then apply)."""
    return not torch.cuda.is_available()


def server_env(base: dict | None = None) -> dict:
    """A copy of `base` (default os.environ) with the CPU workarounds applied when CPU-only."""
    env = dict(os.environ if base is None else base)
    if is_cpu_only():
        env.update(CPU_ENV)
    return env


def cpu_server_args(attention_backend: str = "torch_native") -> list[str]:
    """SGLang flags for the device: on CPU what every server needs (fp32: fp16 matmul is ~50x slower on
    these CPUs); on a GPU SGLang's defaults with a quarter of the GPU's memory each, except that sglang_pd_shared_prefix serves decode only, with
    SGLang's Triton backend for the extends and the decode CUDA graph off (its Triton form allocates per
    forward: attention/device_form.py). The GPU branch has not run (no GPU here: docs/gpu/README.md).

    `attention_backend`: torch_native, or sglang_pd_shared_prefix (which wraps it) on decode."""
    if not is_cpu_only():
        shared_gpu = GPU_MEMORY_FRACTION  # the harness starts prefill, decode (and plain) on one GPU
        if attention_backend == "torch_native":
            return ["--mem-fraction-static", shared_gpu]
        return ["--mem-fraction-static", shared_gpu, "--decode-attention-backend", attention_backend,
                "--prefill-attention-backend", "triton", "--cuda-graph-backend-decode", "disabled"]
    return ["--device", "cpu", "--attention-backend", attention_backend, "--dtype", "float32",
            "--sleep-on-idle"]
