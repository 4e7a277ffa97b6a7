"""Settings whose decisions each decode rank makes on its own are refused with tensor parallelism.

Decode-local prefill decides per request on each rank, and the SLO admission caps a step from that
rank's own step timings; with --tp-size > 1 the ranks run one batch together, and ranks that decided
differently would run different batches (a collective that never matches). Refused at start-up."""

from types import SimpleNamespace

import pytest

from sglang_pd.config import Settings
from sglang_pd.srt.hooks.scheduling.scheduler import local_prefill_problem, slo_problem

pytestmark = pytest.mark.unit


def test_slo_targets_are_refused_on_a_tensor_parallel_decode():
    itl = Settings(itl_target_s=0.05)
    both = Settings(itl_target_s=0.05, ttft_target_s=1.0)
    assert slo_problem(itl, 1) == "" and slo_problem(Settings(), 4) == ""
    assert slo_problem(itl, 2).startswith("SGLANG_PD_ITL_TARGET_MS with --tp-size 2: each tensor-parallel rank")
    assert "SGLANG_PD_ITL_TARGET_MS and SGLANG_PD_TTFT_TARGET_MS with --tp-size 4" in slo_problem(both, 4)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_local_prefill_is_refused_on_a_tensor_parallel_decode(tp_size, monkeypatch):
    from sglang.srt import runtime_context

    from sglang_pd.srt.hooks.scheduling.takeover import owns_decode_queue

    # SGLang's published configuration, as a decode server has it (not published in a unit test)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(pp_size=1))
    monkeypatch.setattr(runtime_context, "get_disagg",
                        lambda: SimpleNamespace(disaggregation_decode_allocation_policy="early",
                                                disaggregation_decode_enable_radix_cache=False))

    queue = SimpleNamespace()  # without the decode radix cache sglang_pd takes no queue over: named too
    assert not owns_decode_queue(queue)
    scheduler = SimpleNamespace(spec_algorithm=SimpleNamespace(is_none=lambda: True), require_mlp_sync=False,
                                disagg_decode_prealloc_queue=queue, tp_size=tp_size)
    problem = local_prefill_problem(scheduler, "nixl")
    assert "--disaggregation-decode-enable-radix-cache" in problem
    assert ("--tp-size 2: each tensor-parallel rank would decide on its own" in problem) == (tp_size == 2)
