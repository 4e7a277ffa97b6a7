"""Which kernels the shared-prefix backend takes on a device, and the words that refuse it
(srt/attention/device_form.py; the hook's wiring in test_shared_prefix_backend.py)."""

import pytest

from sglang_pd.srt.attention.device_form import DeviceFacts, choose_kernels

pytestmark = pytest.mark.unit


def _facts(**change) -> DeviceFacts:
    base = dict(device="cuda", setting="auto", hip=False, interpreter=False, decode_graph="disabled",
                prefill_graph="disabled", serves_extends=True)
    return DeviceFacts(**{**base, **change})


@pytest.mark.parametrize("change, kernels", [
    (dict(device="cpu"), "cpu"),
    (dict(device="cpu", setting="cpu", decode_graph="full"), "cpu"),  # CPU has no CUDA graphs to mind
    (dict(device="cpu", setting="triton", interpreter=True), "triton"),
    ({}, "triton"),
    (dict(device="cuda:1", setting="triton"), "triton"),
    (dict(serves_extends=False, prefill_graph="breakable"), "triton"),  # extends go to another backend
    (dict(serves_decode=False, decode_graph="full"), "triton"),  # decode goes to another backend
])
def test_the_device_decides_unless_the_setting_picks(change, kernels):
    choice = choose_kernels(_facts(**change))
    assert (choice.kernels, choice.problem) == (kernels, None)


@pytest.mark.parametrize("change, words", [
    (dict(device="cpu", setting="triton"), "only under Triton's interpreter (TRITON_INTERPRET=1"),
    (dict(device="xpu"), "device xpu: the backend has CPU and CUDA (Triton) kernels only"),
    (dict(device="mps"), "device mps"),
    (dict(hip=True), "ROCm"),
    (dict(setting="cpu"), "SGLANG_PD_SHARED_PREFIX_KERNELS=cpu on device cuda"),
    (dict(decode_graph="full"), "--cuda-graph-backend-decode disabled"),
    (dict(decode_graph=None), "the decode CUDA graph (None)"),  # unknown is not off
    (dict(prefill_graph="breakable"), "--cuda-graph-backend-prefill disabled"),
])
def test_what_the_device_cannot_run_is_refused_by_name(change, words):
    choice = choose_kernels(_facts(**change))
    assert choice.kernels is None and words in choice.problem


def _server_args(flags: list[str]):
    """SGLang's own ServerArgs record from command-line `flags` (its parser, our backend registered)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_pd.models import ensure_model_dir
    from sglang_pd.srt.hooks.attention_backend import register_backend_choice

    register_backend_choice()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", str(ensure_model_dir("tiny")),
                                                      "--skip-tokenizer-init", *flags]))


@pytest.mark.parametrize("cpu_only", [True, False])
def test_the_harness_asks_sglang_for_the_shared_backend_on_either_device(monkeypatch, cpu_only):
    """The harness's server flags (harness/cpu_env.py) parse with SGLang's own argument parser, and on a GPU
    machine they put our backend on decode with its graph off: SGLang's defaults there would leave it out
    silently. (This box has no GPU: the GPU branch is exercised by is_cpu_only's answer only.)"""
    from sglang_pd.harness import cpu_env
    from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

    monkeypatch.setattr(cpu_env, "is_cpu_only", lambda: cpu_only)
    parsed = _server_args(cpu_env.cpu_server_args(BACKEND_NAME))
    if cpu_only:
        assert (parsed.device, parsed.attention_backend) == ("cpu", BACKEND_NAME)
    else:
        assert (parsed.device, parsed.attention_backend) == (None, None)
        assert (parsed.decode_attention_backend, parsed.prefill_attention_backend) == (BACKEND_NAME, "triton")
        assert parsed.cuda_graph_backend_decode == "disabled"
        assert parsed.mem_fraction_static == float(cpu_env.GPU_MEMORY_FRACTION)  # three servers share one GPU
        assert cpu_env.cpu_server_args("torch_native") == ["--mem-fraction-static", cpu_env.GPU_MEMORY_FRACTION]


def test_the_start_up_check_reads_what_sglangs_resolution_decided():
    """Resolution never writes ServerArgs' fields: it declares values over them (a CUDA server's raw
    `device` and `cuda_graph_config` stay None). The check reads the declarations, as SGLang does.
    CPU: the harness's flags, resolved by SGLang here. CUDA (no GPU here, so resolution cannot run): the
    harness's GPU flags, with what resolution would declare on a CUDA machine declared through SGLang's
    own declare_resolution."""
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig

    from sglang_pd.harness import cpu_env
    from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME, start_up_problem

    cpu = _server_args(cpu_env.cpu_server_args(BACKEND_NAME))
    cpu.resolve_once()
    assert start_up_problem(cpu) is None
    gpu_flags = ["--decode-attention-backend", BACKEND_NAME, "--prefill-attention-backend", "triton",
                 "--cuda-graph-backend-decode", "disabled"]
    for decode_graph, refused in (("disabled", False), ("full", True)):
        gpu = _server_args(gpu_flags)
        assert (gpu.device, gpu.cuda_graph_config) == (None, None)  # the raw fields
        declare_resolution(gpu, "a CUDA machine's resolution", device="cuda", attention_backend="triton",
                           cuda_graph_config=CudaGraphConfig(PhaseConfig(backend=decode_graph),
                                                             PhaseConfig(backend="breakable")))
        problem = start_up_problem(gpu)
        assert (problem is not None) == refused, problem
        if refused:
            assert "the decode CUDA graph (full)" in problem
    spec = _server_args([*gpu_flags, "--speculative-algorithm", "EAGLE"])
    declare_resolution(spec, "a CUDA machine's resolution", device="cuda", attention_backend="triton",
                       cuda_graph_config=CudaGraphConfig(PhaseConfig(backend="disabled"), PhaseConfig(backend="disabled")))
    assert "speculative decoding" in start_up_problem(spec)
