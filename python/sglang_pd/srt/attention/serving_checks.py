"""Where the sglang_pd_shared_prefix backend can serve: the start-up checks, in words an operator can act on.

    server_args_problem(server_args, ...)   the server's own process, before any subprocess (engine hook)
    kernel_choice(runner, ...) + runner_problem(runner, choice)   the model runner (the backend's factory)

The device's kernels are decided by device_form.choose_kernels; here the facts are read from SGLang's
resolved server arguments (`resolved`: resolution declares values over the raw fields, which it never
writes) or model runner, server features no run has taken through the backend are refused by name
(speculative decoding, two-batch overlap, pdmux, PD role switch, attention data parallelism), and what
only the machine or the model tells is checked: the CPU kernels
need torch's fused CPU attention (partials.py) and a C compiler (own_decode_kernel.py), the Triton ones an
importable triton; every form needs eager mode (no torch.compile), an MHA model, an MHA / SWA pool of
float32/float16/bfloat16 KV laid out [tokens, kv heads, head_dim], value heads like key heads. Each
returns None or the problem (the caller prefixes the flag). SGLang's pool classes are imported lazily.
"""

from __future__ import annotations

import os

import torch

from sglang_pd.srt.attention.device_form import DeviceFacts, KernelChoice, choose_kernels
from sglang_pd.srt.attention.own_decode_kernel import build_problem
from sglang_pd.srt.attention.partials import missing_kernel

KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# Server features no run has taken through this backend, refused by name (SGLang field -> why).
UNRUN_FEATURES = (
    ("speculative_algorithm", "speculative decoding (--speculative-algorithm): its verify forwards reach this "
                              "backend as extends and need the draft tree's masks, which it does not read"),
    ("enable_two_batch_overlap", "--enable-two-batch-overlap: this backend plans whole batches"),
    ("enable_pdmux", "--enable-pdmux: not run with this backend"),
    ("enable_pd_role_switch", "--enable-pd-role-switch: a switch to decode turns the decode CUDA graph on, which "
                              "this backend cannot be captured in"),
)


def resolved(server_args):
    """SGLang's live view of `server_args` with resolution's declarations over the raw fields (resolution
    never writes the fields: a raw `device` or `cuda_graph_config` can be None on a server that resolved
    them). Child processes get the declarations with the pickled record."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    return resolving_view(server_args)


def feature_problem(cfg) -> str | None:
    """The first server feature (UNRUN_FEATURES, attention data parallelism) `cfg` turns on, or None."""
    for name, why in UNRUN_FEATURES:
        if getattr(cfg, name, None):
            return why
    if (getattr(cfg, "attn_dp_size", None) or 1) > 1:
        return f"attention data parallelism (attn_dp_size {cfg.attn_dp_size}): not run with this backend"
    return None


def device_facts(device, cfg, setting: str, serves_extends: bool, serves_decode: bool) -> DeviceFacts:
    """DeviceFacts from resolved server arguments `cfg` (their CUDA-graph phases; None: unknown) and this
    process."""
    graphs = getattr(cfg, "cuda_graph_config", None) if cfg is not None else None
    phase = lambda name: getattr(getattr(graphs, name, None), "backend", None)  # noqa: E731
    return DeviceFacts(device=str(device), setting=setting, hip=torch.version.hip is not None,
                       interpreter=os.environ.get("TRITON_INTERPRET") == "1", decode_graph=phase("decode"),
                       prefill_graph=phase("prefill"), serves_extends=serves_extends, serves_decode=serves_decode)


def _runner_cfg(runner):
    server_args = getattr(runner, "server_args", None)
    return None if server_args is None else resolved(server_args)


def kernel_choice(runner, backend_name: str, setting: str) -> KernelChoice:
    """The kernels a model runner takes: its device, its server's resolved CUDA-graph phases, and which
    forwards the backend serves (the runner's resolved prefill / decode backend names)."""
    serves_extends = getattr(runner, "prefill_attention_backend_str", backend_name) == backend_name
    serves_decode = getattr(runner, "decode_attention_backend_str", backend_name) == backend_name
    return choose_kernels(device_facts(runner.device, _runner_cfg(runner), setting, serves_extends, serves_decode))


def _cpu_kernels_problem() -> str | None:
    problem = missing_kernel()
    if problem is not None:
        return problem
    problem = build_problem()  # builds the kernel (once per process)
    return None if problem is None else f"its own-part C kernel cannot be built here: {problem}"


def server_args_problem(server_args, backend_name: str, setting: str) -> str | None:
    """Why a server whose resolved arguments give `backend_name` the prefill or decode forwards cannot serve
    with it, as far as the arguments and this machine tell (features, device, CUDA graphs, the CPU kernels'
    build); None when they do not name it or it can."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    cfg = resolved(server_args)
    prefill, decode = attention_backends_of(cfg)
    if backend_name not in (prefill, decode):
        return None
    problem = feature_problem(cfg)
    if problem is not None:
        return problem
    choice = choose_kernels(device_facts(cfg.device, cfg, setting, prefill == backend_name, decode == backend_name))
    if choice.problem is not None:
        return choice.problem
    return _cpu_kernels_problem() if choice.kernels == "cpu" else None


def runner_problem(runner, choice: KernelChoice) -> str | None:
    """Why this model runner cannot use the backend with `choice` (kernel_choice's), or None."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.runtime_context import get_flags

    if choice.problem is not None:
        return choice.problem
    cfg = _runner_cfg(runner)
    problem = None if cfg is None else feature_problem(cfg)
    if problem is not None:
        return problem
    if choice.kernels == "cpu":
        problem = _cpu_kernels_problem()
        if problem is not None:
            return problem
    else:
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            return f"its Triton kernels need triton, which does not import here: {exc}"
    if get_flags().capture.enable_torch_compile:
        return "--enable-torch-compile: the backend runs eagerly only"
    if runner.use_mla_backend:
        return "MLA models: the backend reads MHA KV pools only"
    pool = runner.token_to_kv_pool
    if type(pool) not in (MHATokenToKVPool, SWAKVPool):
        return f"KV pool {type(pool).__name__}: only MHATokenToKVPool / SWAKVPool layouts are read"
    if pool.dtype not in KV_DTYPES:
        return f"KV cache dtype {pool.dtype}: quantised KV is not read (float32/float16/bfloat16 only)"
    if isinstance(pool, MHATokenToKVPool):
        keys, values = pool.get_key_buffer(pool.start_layer), pool.get_value_buffer(pool.start_layer)
        if keys.dim() != 3 or keys.shape[1] != pool.head_num or not keys.is_contiguous():
            return f"KV buffer of shape {tuple(keys.shape)}: expected contiguous [tokens, {pool.head_num} heads, head_dim]"
        if values.shape != keys.shape:
            return f"value buffer {tuple(values.shape)} unlike key buffer {tuple(keys.shape)} (v_head_dim != head_dim)"
    return None
