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
