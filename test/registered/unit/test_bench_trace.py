"""The trace benchmark without servers: the Mooncake-format parser, slicing and scaling, the trace
generator, the SLA search, the report's spread and ratios, and the command line."""

import json
import math

import pytest

from sglang_pd.bench.pd_client import StreamResult
from sglang_pd.bench.sla_search import Probe, next_speedup, search
from sglang_pd.bench.trace import (TraceFormatError, TraceRequest, TraceScaling, block_hit_rate, block_token_ids,
                                   read_trace, scale, scaled_input_len, select, trace_stats)
from sglang_pd.bench.trace_gen import TraceShape, generate, write_trace
from sglang_pd.bench.trace_replay import offered_rps, ttft_quantile
from sglang_pd.bench.trace_report import (GATE_KEYS, format_ratios, format_round_verdicts, format_runs, format_spread,
                                          medians, ratios, round_verdicts, spread)
from sglang_pd.bench_trace import parse_args

pytestmark = pytest.mark.unit

GOOD = {"timestamp": 0, "input_length": 700, "output_length": 40, "hash_ids": [0, 1]}


def _write(tmp_path, lines: list) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"t.jsonl:2: not JSON"),
    ("[1, 2]", r"t.jsonl:2: expected a JSON object, got list"),
    ({"timestamp": 5, "output_length": 1, "hash_ids": [0]}, r"t.jsonl:2: missing field 'input_length'"),
    ({**GOOD, "timestamp": 5, "hash_ids": None}, r"t.jsonl:2: hash_ids must be a non-empty list"),
    ({"timestamp": 5, "input_length": 1, "output_length": 1}, r"t.jsonl:2: missing field 'hash_ids'"),
    ({**GOOD, "timestamp": 5, "output_length": "40"}, r"t.jsonl:2: output_length must be an integer, got str"),
    ({**GOOD, "timestamp": 5, "input_length": 7.5}, r"t.jsonl:2: input_length must be an integer, got float"),
    ({**GOOD, "timestamp": True}, r"t.jsonl:2: timestamp must be an integer, got bool"),
    ({**GOOD, "timestamp": 5, "input_length": -3}, r"t.jsonl:2: input_length must be >= 1, got -3"),
    ({**GOOD, "timestamp": 5, "output_length": 0}, r"t.jsonl:2: output_length must be >= 1, got 0"),
    ({**GOOD, "timestamp": 5, "hash_ids": [0, -1]}, r"t.jsonl:2: hash_ids must be a non-empty list of integers >= 0"),
    ({**GOOD, "timestamp": 5, "hash_ids": []}, r"t.jsonl:2: hash_ids must be a non-empty list"),
])
def test_the_parser_refuses_a_malformed_line_naming_its_number(tmp_path, bad, message):
    with pytest.raises(TraceFormatError, match=message):
        read_trace(_write(tmp_path, [GOOD, bad]))


def test_the_parser_refuses_a_timestamp_earlier_than_the_line_before(tmp_path):
    path = _write(tmp_path, [{**GOOD, "timestamp": 10}, {**GOOD, "timestamp": 10}, {**GOOD, "timestamp": 9}])
    with pytest.raises(TraceFormatError, match=r"t.jsonl:3: timestamp 9 is earlier than line 2's 10"):
        read_trace(path)


def test_the_parser_keeps_lines_skips_blanks_and_ignores_other_fields(tmp_path):
    path = _write(tmp_path, [GOOD, "", {**GOOD, "timestamp": 3000, "extra": "x"}])
    requests = read_trace(path)
    assert requests == [TraceRequest(1, 0, 700, 40, (0, 1)), TraceRequest(3, 3000, 700, 40, (0, 1))]
    with pytest.raises(TraceFormatError, match="no request"):
        read_trace(_write(tmp_path, [""]))


def _req(ts_ms, input_length, ids, output_length=100, line=1):
    return TraceRequest(line, ts_ms, input_length, output_length, tuple(ids))


def test_equal_hash_ids_give_equal_tokens_and_lengths_scale_as_documented():
    scaling = TraceScaling(block_tokens=8, max_blocks=None, seed=7)
    first, second, other = scale([_req(1000, 1024, [0, 1]), _req(1500, 1300, [0, 1, 2]), _req(2000, 512, [5])], scaling)
    assert first.input_ids == second.input_ids[:16]           # same blocks, same tokens: a shared prefix
    assert second.input_ids[:8] == block_token_ids(7, 0, 8) and other.input_ids != first.input_ids[:8]
    assert len(second.input_ids) == 20                         # round-half-up(1300 * 8 / 512 = 20.3)
    assert all(3 <= t < 512 for t in first.input_ids + second.input_ids)
    assert [r.send_at_s for r in (first, second, other)] == [0.0, 0.5, 1.0]  # from the slice's first request
    assert block_token_ids(8, 0, 8) != block_token_ids(7, 0, 8)   # another seed, other tokens
    # half up, clamped to the blocks' tokens and to at least one token
    assert scaled_input_len(_req(0, 32, [0]), scaling) == 1 and scaled_input_len(_req(0, 31, [0]), scaling) == 1
    assert scaled_input_len(_req(0, 96, [0]), scaling) == 2 and scaled_input_len(_req(0, 4000, [0]), scaling) == 8


def test_max_blocks_keeps_the_prefix_and_outputs_are_divided_and_clamped():
    scaling = TraceScaling(block_tokens=4, max_blocks=2, output_div=10, output_min=3, output_max=20)
    cut, short, long = scale([_req(0, 2048, [9, 8, 7, 6], output_length=95), _req(1, 100, [9], output_length=5),
                              _req(2, 600, [9, 8], output_length=10_000)], scaling)
    assert cut.hash_ids == (9, 8) and cut.num_dropped_blocks == 2 and len(cut.input_ids) == 8
    assert cut.input_ids == block_token_ids(0, 9, 4) + block_token_ids(0, 8, 4)
    assert [r.output_len for r in (cut, short, long)] == [9, 3, 20]
    with pytest.raises(ValueError, match="output_max"):
        TraceScaling(output_min=5, output_max=4)
    with pytest.raises(ValueError, match="block_tokens must be >= 1"):
        TraceScaling(block_tokens=0)


def test_a_slice_is_the_first_requests_or_a_time_window():
    requests = [_req(ms, 10, [i], line=i + 1) for i, ms in enumerate((0, 500, 1000, 2500, 4000))]
    assert [r.line for r in select(requests, first=2)] == [1, 2]
    assert [r.line for r in select(requests, window_s=(1.0, 4.0))] == [3, 4]   # start <= t < end
    assert scale(select(requests, window_s=(1.0, 4.0)), TraceScaling())[1].send_at_s == 1.5
    assert len(select(requests)) == 5
    with pytest.raises(ValueError, match="not both"):
        select(requests, first=1, window_s=(0, 1))
    with pytest.raises(ValueError, match="holds no request"):
        select(requests, window_s=(10, 20))


def test_trace_stats_give_the_infinite_cache_hit_rate():
    requests = [_req(0, 1000, [0, 1]), _req(2000, 1500, [0, 1, 2]), _req(4000, 600, [0, 3])]
    stats = trace_stats(requests)
    assert stats["requests"] == 3 and stats["duration_s"] == 4.0 and stats["input_p50"] == 1000
    assert stats["blocks"] == 7 and stats["distinct_blocks"] == 4
    assert stats["block_hit_rate"] == pytest.approx(3 / 7)  # 0,1 again in the second; 0 in the third
    assert block_hit_rate([]) == 0.0


def test_generated_traces_are_seeded_well_formed_and_each_turn_extends_the_last(tmp_path):
    shape = TraceShape(conversations=4, turns=3, system_blocks=2, first_blocks=2, turn_blocks=1, seed=3)
    rows = generate(shape)
    assert rows == generate(shape) and rows != generate(TraceShape(conversations=4, turns=3, seed=4))
    path = tmp_path / "gen.jsonl"
    write_trace(rows, path)
    requests = read_trace(path)  # the parser accepts it: the format, non-decreasing timestamps
    fields = {"timestamp", "input_length", "output_length", "hash_ids"}
    assert len(requests) == 12 and all(set(json.loads(line)) == fields for line in path.read_text().splitlines())
    by_first_own = {}
    for r in requests:
        assert r.hash_ids[:2] == (0, 1)                               # the shared system prompt
        assert (len(r.hash_ids) - 1) * 512 < r.input_length <= len(r.hash_ids) * 512
        assert shape.output_min <= r.output_length <= shape.output_max
        by_first_own.setdefault(r.hash_ids[2], []).append(r.hash_ids)
    assert len(by_first_own) == 4
    for turns in by_first_own.values():                               # a conversation, in time order
        assert [len(ids) for ids in turns] == [4, 5, 6]
        assert all(later[:len(earlier)] == earlier for earlier, later in zip(turns, turns[1:]))
    assert trace_stats(requests)["block_hit_rate"] > 0.5


def _probe_at(threshold: float):
    """A deterministic load curve: p95 TTFT grows with speedup; passes up to `threshold`."""
    def probe(speedup: float) -> Probe:
        p95 = speedup / threshold
        return Probe(speedup, p95, p95 <= 1.0, 0, speedup)
    return probe


def test_the_sla_search_doubles_then_bisects_within_its_probe_bound():
    found = search(_probe_at(5.0), start=1.0, target_s=1.0, max_probes=6)
    assert [p.speedup for p in found.probes][:4] == [1.0, 2.0, 4.0, 8.0]  # doubling until the first fail
    assert len(found.probes) == 6 and found.max_speedup <= 5.0 < found.min_failing_speedup
    assert found.min_failing_speedup / found.max_speedup < 8 / 4        # narrower than the doubling bracket
    down = search(_probe_at(0.3), start=1.0, target_s=1.0, max_probes=3)
    assert [p.speedup for p in down.probes] == [1.0, 0.5, 0.25] and down.max_speedup == 0.25
    never = search(_probe_at(0.01), start=1.0, target_s=1.0, max_probes=2)
    assert never.max_speedup is None and never.offered_rps is None
    assert next_speedup(2.0, 8.0) == pytest.approx(4.0)
    assert search(_probe_at(100), 1.0, 1.0, 3).as_dict()["min_failing_speedup"] is None


def test_p95_ttft_counts_failed_requests_as_infinite():
    ok = [StreamResult(ok=True, prompt_len=1, ttft_s=t / 100) for t in range(1, 20)]
    failed = StreamResult(ok=False, prompt_len=1, error="decode HTTP 500")
    assert ttft_quantile(ok + [failed], 95) == pytest.approx(0.19)   # 1 of 20 failed: p95 still finite
    assert math.isinf(ttft_quantile(ok[:-1] + [failed, failed], 95))  # 2 of 20: infinite
    with pytest.raises(ValueError):
        ttft_quantile([], 95)


def _run(ttft_p50, rps, hit=None, pages=None, failed=0):
    return {"ttft_p50_s": ttft_p50, "ttft_p90_s": 2 * ttft_p50, "ttft_p99_s": 3 * ttft_p50, "itl_p50_ms": 10.0,
            "itl_p90_ms": 20.0, "request_throughput": rps, "failed": failed, "refused": 0,
            "decode_hit_rate": hit, "kv_pages_transferred": pages, "prefill_computed_tokens": 100, "sglang_pd": True}


def test_report_spread_over_repeats_and_ratios_to_off_and_upstream():
    runs = {"off": [_run(2.0, 1.0, 0.0, 100), _run(4.0, 1.0, 0.0, 100), _run(3.0, 2.0, 0.0, 100)],
            "on-upstream": [_run(2.0, 2.0)], "on": [_run(1.0, 3.0, 0.5, 25)]}
    assert spread(runs["off"], ["ttft_p50_s", "decode_hit_rate"]) == {
        "ttft_p50_s": {"min": 2.0, "median": 3.0, "max": 4.0},
        "decode_hit_rate": {"min": 0.0, "median": 0.0, "max": 0.0}}
    figures = medians(runs)
    assert figures["off"]["ttft_p50_s"] == 3.0 and figures["on-upstream"]["decode_hit_rate"] is None
    vs_off = ratios(figures, "off")
    assert vs_off["on"]["ttft_p50_s"] == pytest.approx(1 / 3) and vs_off["on"]["request_throughput"] == 3.0
    assert vs_off["on"]["kv_pages_transferred"] == 0.25 and vs_off["on-upstream"]["kv_pages_transferred"] is None
    assert "decode_hit_rate" not in vs_off["on"]  # off's is 0, on-upstream's not exposed: never a ratio
    assert ratios(figures, "on-upstream")["on"]["ttft_p50_s"] == 0.5 and ratios(figures, "nope") == {}
    table = format_ratios(vs_off, "off")
    assert "| figure / off | on-upstream | on |" in table and "| TTFT p50 (s) | 0.67x | 0.33x |" in table
    assert "| off (3) | 2.000 / 3.000 / 4.000 |" in format_spread(runs)
    row = "| on-upstream | 1 | 2.000 | 4.000 | 6.000 | 10.0 | 20.0 | 2.00 | 0 | 0 | n/a | n/a | 100 |"
    assert row in format_runs(runs)


def test_offered_rate_of_a_replay():
    scaled = scale([_req(0, 10, [0]), _req(1000, 10, [1]), _req(4000, 10, [2])], TraceScaling())
    assert offered_rps(scaled, 1.0) == 0.5 and offered_rps(scaled, 4.0) == 2.0
    assert offered_rps(scaled[:1], 1.0) is None


def test_the_command_line_names_what_is_wrong(tmp_path, capsys):
    path = _write(tmp_path, [GOOD, {**GOOD, "timestamp": 100}])
    for argv, message in [(["--first", "1", "--window", "0:1"], "not both"),
                          (["--window", "abc"], "expected START_S:END_S"),
                          (["--sla-search"], "--sla-search and --sla-ttft-p95-ms go together"),
                          (["--output-min", "9", "--output-max", "3"], "output_max"),
                          (["--configs", "on+itl"], "needs --itl-target-ms"),
                          (["--speedup", "0"], "--speedup > 0")]:
        with pytest.raises(SystemExit):
            parse_args(["--trace", path, *argv])
        assert message in capsys.readouterr().err, argv
    args = parse_args(["--trace", path, "--max-blocks", "0", "--first", "1"])
    assert args.scaling.max_blocks is None and len(args.slice) == 1
    assert [c.name for c in args.configs] == ["off", "on-upstream", "on", "on+shared", "on+local", "on+shared+local"]


def test_token_ids_are_pinned_across_processes():
    """random.Random(str) seeds from the string's SHA-512, not from Python's per-process hash(): the same
    trace gives the same prompts in every run (checked with PYTHONHASHSEED 0 and 123 when pinned)."""
    assert block_token_ids(0, 0, 4) == [178, 249, 357, 202] and block_token_ids(3, 17, 4) == [357, 434, 280, 391]


def _gate_run(scale: float, **over) -> dict:
    run = {"ttft_p50_s": 1.0 * scale, "ttft_p90_s": 2.0 * scale, "ttft_p99_s": 3.0 * scale,
           "itl_p50_ms": 40.0 * scale, "itl_p90_ms": 80.0 * scale}
    run.update(over)
    return run


def test_round_verdicts_pair_each_round_with_offs_run_of_that_round():
    runs = {"off": [_gate_run(1.0), _gate_run(2.0), _gate_run(1.0)],
            "rec": [_gate_run(0.9), _gate_run(1.5), _gate_run(0.9, ttft_p99_s=3.3)],
            "on-upstream": [_gate_run(1.0), _gate_run(3.0)]}  # a start failure: one round fewer
    verdicts = round_verdicts(runs)
    assert set(verdicts) == {"rec", "on-upstream"}
    rec = verdicts["rec"]
    assert [r["no_worse"] for r in rec] == [True, True, False]  # round 2: 1.5 against off's 2.0, not 1.0
    assert rec[1]["ratios"]["ttft_p50_s"] == pytest.approx(0.75)
    assert rec[2]["ratios"]["ttft_p99_s"] == pytest.approx(1.1)
    assert [r["no_worse"] for r in verdicts["on-upstream"]] == [True, False]  # equal counts as no worse
    table = format_round_verdicts(verdicts)
    assert "| rec | all |" in table and "2 of 3" in table and "1 of 2" in table
    assert round_verdicts({"rec": runs["rec"]}) == {}


def test_round_verdicts_do_not_pass_a_run_missing_a_gate_figure():
    runs = {"off": [_gate_run(1.0)], "rec": [{k: v for k, v in _gate_run(0.5).items() if k != "itl_p90_ms"}]}
    row = round_verdicts(runs)["rec"][0]
    assert set(row["ratios"]) == set(GATE_KEYS) - {"itl_p90_ms"} and not row["no_worse"]
