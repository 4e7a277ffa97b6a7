"""Benchmark building blocks without servers: workload determinism/shape, statistics, table."""

import pytest

from sglang_pd.bench.multiturn_workload import RequestRecord, WorkloadConfig, questions, run_workload, system_prompt
from sglang_pd.bench.pd_client import StreamResult
from sglang_pd.bench.report import format_table, percentile, summarize

pytestmark = pytest.mark.unit


def test_percentile():
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([1, 2, 3, 4], 100) == 4


def test_workload_is_seeded_and_grows_each_round():
    cfg = WorkloadConfig(num_clients=3, num_rounds=3, system_len=20, first_question_len=5, question_len=4,
                         max_new_tokens=2, concurrency=2, round_barrier=True)
    assert system_prompt(cfg) == system_prompt(cfg) and len(system_prompt(cfg)) == 20
    assert questions(cfg, 0) != questions(cfg, 1)
    seen = []

    def echo(prompt, n):  # a stand-in server: answers with the prompt's last tokens
        seen.append(list(prompt))
        return StreamResult(ok=True, prompt_len=len(prompt), output_ids=prompt[-n:], ttft_s=0.01)

    records = run_workload(cfg, echo)
    assert len(records) == 9 and {r.round for r in records} == {0, 1, 2}
    # each conversation: 20 + 5, then + 2 answer + 4 question per round
    assert sorted(len(p) for p in seen) == [25] * 3 + [31] * 3 + [37] * 3


def test_question_lengths_spread_when_asked_and_stay_seeded():
    cfg = WorkloadConfig(num_clients=4, num_rounds=6, first_question_len=32, question_len=8, question_len_max=200)
    lengths = [len(q) for c in range(4) for q in questions(cfg, c)[1:]]
    assert all(8 <= n <= 200 for n in lengths) and len(set(lengths)) > 10
    assert [len(q) for q in questions(cfg, 2)] == [len(q) for q in questions(cfg, 2)]
    assert all(len(q) == 32 for q in (questions(cfg, c)[0] for c in range(4)))
    assert {len(q) for q in questions(WorkloadConfig(num_rounds=3, question_len=16), 0)[1:]} == {16}
    with pytest.raises(ValueError, match="question_len_max"):
        WorkloadConfig(question_len=16, question_len_max=8)


def test_workload_rejects_bad_config():
    with pytest.raises(ValueError, match="num_clients must be >= 1"):
        WorkloadConfig(num_clients=0)
    with pytest.raises(ValueError, match="request_rate"):
        WorkloadConfig(request_rate=-1)


def _rec(rnd, ttft, prefix, ok=True, error=""):
    return RequestRecord(0, rnd, StreamResult(ok=ok, prompt_len=100, output_ids=[1, 2], ttft_s=ttft,
                                              itl_s=[0.01], meta_info={"decode_prefix_len": prefix}, error=error))


def test_summary_and_side_by_side_table():
    off = summarize([_rec(0, 2.0, 0), _rec(1, 4.0, 0)], 2.0, {"pages": 200, "bytes": 800})
    on = summarize([_rec(0, 1.0, 0), _rec(1, 1.0, 90), _rec(1, 9.0, 0, ok=False, error="decode HTTP 500: TCP lane queue-full")], 2.0, {"pages": 110, "bytes": 440})
    assert (off["ttft_p50_s"], on["ttft_p50_s"], on["failed"]) == (3.0, 1.0, 1)
    assert off["errors"] == [] and on["errors"] == ["decode HTTP 500: TCP lane queue-full"]
    assert on["decode_hit_rate"] == pytest.approx(90 / 200) and on["per_round"][2]["hit_rate"] == 0.9
    table = format_table({"off": off, "on": on})
    assert "| TTFT p50 (s) | 3.000 | 1.000 | 3.00x |" in table
    assert "| KV pages transferred | 200 | 110 | 1.82x |" in table


def test_local_prefill_configs_rows_gains_and_sweep_table():
    from sglang_pd.bench.slo import parse_configs
    from sglang_pd.bench_multiturn import format_sweep

    (local,) = parse_configs("on+local", None, None, local_prefill_tokens=64)
    assert local.decode_radix and dict(local.env) == {"SGLANG_PD_LOCAL_PREFILL_TOKENS": "64"}
    on, balanced = parse_configs("on,on+shared-decode+local", None, None, local_prefill_tokens=128,
                                 local_balance_tokens=256)
    assert on.env == () and dict(balanced.env) == {"SGLANG_PD_LOCAL_PREFILL_TOKENS": "128",
                                                   "SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS": "256"}
    for bad in ("off+local", "on+local"):
        with pytest.raises(ValueError, match="--local-prefill-tokens > 0"):
            parse_configs(bad, None, None, local_prefill_tokens=0 if bad == "on+local" else 64)

    def rec(ttft, path, local_tokens):
        return RequestRecord(0, 0, StreamResult(ok=True, prompt_len=100, output_ids=[1, 2], ttft_s=ttft, itl_s=[0.01],
                                                meta_info={"decode_prefix_len": 90, "decode_prefill_path": path,
                                                           "decode_local_prefill_tokens": local_tokens}))

    counters = {"pages": 10, "bytes": 40, "computed_tokens": 20, "declined": 2, "declined_computed_tokens": 0}
    on = summarize([rec(0.08, "prefill", 0), rec(0.08, "prefill", 0)], 1.0, dict(counters, declined=0))
    local = summarize([rec(0.02, "decode_local", 10), rec(0.04, "decode_local", 10)], 1.0,
                      dict(counters, pages=0, computed_tokens=0))
    assert (local["local_requests"], local["local_prefill_tokens"], local["prefill_declined"]) == (2, 20, 2)
    table = format_table({"on": on, "on+local": local})
    assert "| TTFT p50 (s) | 0.080 | 0.030 | 2.67x |" in table
    assert "gain (on+local vs on)" in table.splitlines()[0]
    assert "| requests served decode-locally | 0 | 2 |  |" in table
    assert "| prefill tokens computed (prefill's counter) | 20 | 0 |  |" in table
    sweep = format_sweep({0: on, 64: local})
    assert "| 64 | 0.030 | " in sweep and "| 2/2 | 0 | 0 |" in sweep

    from sglang_pd.bench.report import format_local_stages, local_breakdown

    records = {"requests": {"pd-1": {"state": "joined", "admitted_ms": 2.0, "queued_ms": 1.0, "extend_to_join_ms": 9.0},
                            "pd-2": {"state": "aborted", "admitted_ms": 50.0, "queued_ms": None,
                                     "extend_to_join_ms": None}},
               "threshold": 64, "num_extends": 1, "num_mixed_extends": 1}
    local["decode_local_prefill"] = local_breakdown(records, {"pd-1": 0.030})
    stages = format_local_stages({"on": on, "on+local": local})
    assert stages.splitlines()[0].endswith("| on+local |")  # a configuration that served none gets no column
    assert "| queued for the extend | 1.0 / 1.0 |" in stages
    assert "| outside decode's scheduler (client TTFT minus the three above) | 18.0 / 18.0 |" in stages
    assert format_local_stages({"on": on}) == ""


def _metrics_text(observations: dict[tuple[str, str], list[float]], queue: list[float]) -> str:
    """A /metrics text as prometheus_client writes it, with SGLang's histogram names and labels."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    stages = Histogram("sglang:per_stage_req_latency_seconds", "per stage", ["engine_type", "stage", "tp_rank"],
                       registry=registry)
    queue_time = Histogram("sglang:queue_time_seconds", "queue", ["tp_rank"], registry=registry)
    for (stage, rank), values in observations.items():
        for value in values:
            stages.labels(engine_type="prefill", stage=stage, tp_rank=rank).observe(value)
    for value in queue:
        queue_time.labels(tp_rank="0").observe(value)
    return generate_latest(registry).decode()


def test_stage_latencies_parse_sglang_histograms_and_give_per_run_means():
    from sglang_pd.bench.report import format_stages
    from sglang_pd.bench.server_figures import stage_deltas
    from sglang_pd.harness.upstream_state import QUEUE_STAGE, LatencyTotal, parse_stage_latencies

    before = parse_stage_latencies(_metrics_text({("prefill_forward", "0"): [0.010]}, [0.5]))
    assert before == {"prefill_forward": LatencyTotal(0.010, 1.0), QUEUE_STAGE: LatencyTotal(0.5, 1.0)}
    # two ranks of one stage are summed; the earlier observations are still in the running totals
    after = parse_stage_latencies(_metrics_text({("prefill_forward", "0"): [0.010, 0.030],
                                                 ("prefill_forward", "1"): [0.050],
                                                 ("prefill_bootstrap", "0"): [0.004, 0.006]}, [0.5]))
    assert after["prefill_forward"].count == 3.0 and abs(after["prefill_forward"].sum_s - 0.090) < 1e-12
    deltas = stage_deltas(before, after)
    assert deltas == {"prefill_forward": {"count": 2, "mean_ms": 40.0},
                      "prefill_bootstrap": {"count": 2, "mean_ms": 5.0}}  # queue time: nothing new, left out
    with pytest.raises(ValueError, match="prefill_forward: count went down"):
        stage_deltas(after, before)
    table = format_stages({"on": {"sglang_stage_latency": {"prefill": deltas, "decode": {}}}, "off": {}})
    assert "| prefill: forward | 40.0 (2) |" in table and "| prefill: queued for a forward | - |" in table
    assert "off" not in table.splitlines()[0]  # a run without the figures gets no column
    assert format_stages({"off": {}}) == ""


def test_stage_latencies_refuse_a_stage_sample_without_its_label():
    from sglang_pd.harness.upstream_state import parse_stage_latencies

    with pytest.raises(ValueError, match="without a stage label"):
        parse_stage_latencies('sglang:per_stage_req_latency_seconds_count{tp_rank="0"} 3.0')
    # a sample without labels, and a label value with a space, parse too
    unlabelled = parse_stage_latencies('# TYPE sglang:queue_time_seconds histogram\n'
                                       'sglang:queue_time_seconds_sum 0.5\nsglang:queue_time_seconds_count 2.0\n'
                                       'sglang:per_stage_req_latency_seconds_count{model_name="a b",stage="s"} 3.0')
    assert unlabelled["queue_time"] == (0.5, 2.0) and unlabelled["s"] == (0.0, 3.0)


def test_ttft_split_at_decodes_tokenizer_manager():
    """The client's mean TTFT minus decode's tokenizer-manager mean (SGLang's histogram delta) is what the
    HTTP path and the client add; no split without first tokens observed on decode."""
    from sglang_pd.bench.report import format_ttft_split, ttft_split

    records = [RequestRecord(0, 0, StreamResult(ok=True, prompt_len=10, output_ids=[1, 2], ttft_s=t, itl_s=[0.005]))
               for t in (0.030, 0.050)]
    result = summarize(records, 1.0, None)
    assert result["ttft_mean_s"] == pytest.approx(0.040)
    result.update(sglang_decode_ttft_sum_s=0.050, sglang_decode_ttft_count=2)
    assert ttft_split(result) == {"client": 40.0, "decode_server": 25.0, "http_and_client": 15.0, "count": 2}
    table = format_ttft_split({"on": result, "off": dict(result, sglang_decode_ttft_count=0)})
    assert table.splitlines()[0] == "| TTFT, mean ms | on |", "a run without decode's first tokens has no column"
    assert "| the rest: client, HTTP in and out, the streaming write | 15.0 |" in table
    assert format_ttft_split({"off": dict(result, sglang_decode_ttft_count=0)}) == ""


def test_prefill_answer_order_of_local_requests():
    """Which local requests had prefill's declined half answered before their first token, with the TTFT
    p50 of each side; requests whose prefill half never answered are left out."""
    from sglang_pd.bench.report import format_prefill_answer, prefill_answer_order

    def local(ttft: float, answer: float | None) -> StreamResult:
        return StreamResult(ok=True, prompt_len=10, output_ids=[1], ttft_s=ttft, prefill_answer_s=answer,
                            meta_info={"decode_prefill_path": "decode_local"})

    results = [local(0.030, 0.020), local(0.050, 0.040), local(0.040, 0.045), local(0.060, None)]
    order = prefill_answer_order(results)
    assert order == pytest.approx({"num_before": 2, "num_timed": 3, "ttft_p50_before_s": 0.040,
                                   "ttft_p50_after_s": 0.040, "answer_minus_ttft_p50_s": -0.010})
    assert prefill_answer_order([local(0.060, None)]) is None
    summary = summarize([RequestRecord(0, 0, r) for r in results], 1.0, None)
    assert summary["local_prefill_answer"]["num_timed"] == 3 and summary["local_requests"] == 4
    assert format_prefill_answer({"on+local": summary}).startswith(
        "[on+local] prefill's declined half answered before decode's first token for 2 of 3 local requests")
    assert format_prefill_answer({"on": summarize([], 1.0, None)}) == ""
