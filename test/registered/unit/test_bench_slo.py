"""SLO scoring of the benchmark and the HTTP side of early rejection, without SGLang servers."""

import re

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sglang_pd.bench.multiturn_workload import MAX_ATTEMPTS, WorkloadConfig, run_workload
from sglang_pd.bench.pd_client import StreamResult
from sglang_pd.bench.report import format_table, summarize
from sglang_pd.bench.slo import SHARED_BACKEND, SloTargets, meets_slo, parse_configs, slo_figures
from sglang_pd.srt.slo.early_rejection import decide_rejection
from sglang_pd.srt.http import RetryAfterMiddleware

pytestmark = pytest.mark.unit


def test_configs_parse_with_their_settings_and_bad_ones_are_named():
    configs = parse_configs("off,on,on+itl,on+itl+reject", 40, 3000)
    assert [(c.name, c.decode_radix) for c in configs] == [("off", False), ("on", True), ("on+itl", True),
                                                            ("on+itl+reject", True)]
    assert dict(configs[3].env) == {"SGLANG_PD_ITL_TARGET_MS": "40", "SGLANG_PD_TTFT_TARGET_MS": "3000"}
    with pytest.raises(ValueError, match="needs --ttft-target-ms"):
        parse_configs("on+reject", 40, None)
    with pytest.raises(ValueError, match=re.escape("unknown configuration 'on+fast'")):
        parse_configs("on+fast", 40, None)


def test_shared_puts_the_backend_on_both_servers_and_shared_decode_on_decode_only():
    both, decode_only, plain = parse_configs("on+shared,on+shared-decode,on", None, None)
    assert (both.decode_attention_backend, both.prefill_attention_backend) == (SHARED_BACKEND, SHARED_BACKEND)
    assert (decode_only.decode_attention_backend, decode_only.prefill_attention_backend) == (SHARED_BACKEND,
                                                                                            "torch_native")
    assert (plain.decode_attention_backend, plain.prefill_attention_backend) == ("torch_native", "torch_native")
    with pytest.raises(ValueError, match="use \\+shared or \\+shared-decode"):
        parse_configs("on+shared+shared-decode", None, None)


def _result(ttft, gaps, ok=True, rejected=False):
    return StreamResult(ok=ok, prompt_len=10, output_ids=[1] * (len(gaps) + 1), ttft_s=ttft, itl_s=gaps,
                        rejected=rejected)


def test_slo_attainment_and_goodput_count_refused_requests_as_missed():
    slo = SloTargets(ttft_s=1.0, itl_s=0.040)
    met, slow_first, slow_tokens = _result(0.5, [0.03, 0.04]), _result(1.5, [0.03]), _result(0.5, [0.05, 0.05])
    refused = _result(0.0, [], ok=False, rejected=True)
    assert meets_slo(met, slo) and not any(meets_slo(r, slo) for r in (slow_first, slow_tokens, refused))
    figures = slo_figures([met, slow_first, slow_tokens, refused], duration_s=2.0, targets=slo)
    assert figures["slo_attainment"] == 0.25 and figures["goodput"] == 0.5 and figures["rejected"] == 1
    assert figures["slo"] == "TTFT <= 1000 ms and ITL <= 40 ms"


def test_refused_turns_are_retried_and_reported_apart_from_failures():
    cfg = WorkloadConfig(num_clients=2, num_rounds=2, system_len=8, first_question_len=2, question_len=2,
                         max_new_tokens=2, concurrency=2)
    calls = []

    def refuse_first_of_each_turn(prompt, n):
        calls.append(tuple(prompt))
        if calls.count(tuple(prompt)) == 1:
            return StreamResult(ok=False, prompt_len=len(prompt), rejected=True, retry_after_s=0, error="503")
        return StreamResult(ok=True, prompt_len=len(prompt), output_ids=[5] * n, ttft_s=0.1, itl_s=[0.01])

    records = run_workload(cfg, refuse_first_of_each_turn)
    assert len(records) == 8 and sum(r.result.rejected for r in records) == 4 and MAX_ATTEMPTS >= 2
    summary = summarize(records, 1.0, {})
    summary.update(slo_figures([r.result for r in records], 1.0, SloTargets(1.0, 0.04)))
    assert (summary["failed"], summary["rejected"], summary["slo_attainment"]) == (0, 4, 0.5)
    assert "| SLO attainment | 0.500 |" in format_table({"on+itl+reject": summary})


def _app(status: int, message: str) -> TestClient:
    async def generate(request):
        return JSONResponse({"error": {"message": message}}, status_code=status)

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])
    app.add_middleware(RetryAfterMiddleware)
    return TestClient(app)


def test_rejection_503_gets_retry_after_and_other_responses_pass_unchanged():
    refusal = decide_rejection(7.4, target_ttft_s=2.0)
    resp = _app(503, refusal.message).post("/generate", json={})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "6"
    assert "predicted TTFT 7400 ms exceeds the target 2000 ms" in resp.json()["error"]["message"]
    other = _app(503, "server busy").post("/generate", json={})
    assert other.status_code == 503 and "retry-after" not in other.headers
    assert "retry-after" not in _app(200, "fine").post("/generate", json={}).headers
