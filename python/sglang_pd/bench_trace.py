"""Trace replay benchmark: a Mooncake-format trace replayed open loop through a stock sglang-router in
PD mode, one fresh deployment per configuration (and per repeat), side by side.

    python -m sglang_pd.bench.trace_gen --out /tmp/trace.jsonl --conversations 5 --turns 4   # a small trace
    python -m sglang_pd.bench_trace --trace /tmp/trace.jsonl --configs off,on                # replay it
    python -m sglang_pd.bench_trace --trace conversation_trace.jsonl --first 400 --dry-run   # slice figures only
    python -m sglang_pd.bench_trace --trace conversation_trace.jsonl --first 400 --repeats 3 \\
        --ttft-target-ms 2000 --itl-target-ms 100                                          # the full comparison
    python -m sglang_pd.bench_trace --trace conversation_trace.jsonl --first 200 --configs off,on \\
        --sla-search --sla-ttft-p95-ms 2000                                                # sessions under an SLA

The trace's format, how to fetch the public one and the exact scaling rules (block tokens, max
blocks, output division and clamp, slices): bench/trace.py. The replay (open loop, streamed, what is
measured at the client): bench/trace_replay.py. The SLA search and what it can claim:
bench/sla_search.py. Configurations are bench/slo.py's names; each runs `--repeats` times, each time
on a fresh pair (with its router), and the report gives every run, the min / median / max over the
repeats, and each configuration's ratio to `off` and to `on-upstream` (medians). Before each replay
one unmeasured warm-up request outside the trace goes through the router; after it, the pair must go
idle and clean (recorded). Greedy outputs (ignore_eos) are compared across configurations and
repeats: evidence about KV only on a model whose output depends on its context (FINDINGS section 8).

Deployment defaults (DEPLOYMENT): the capacity model (4-layer Llama, fp32 on CPU), page size 16 = one
scaled hash block of the default `--block-tokens 16`, so prefix reuse is whole pages; a decode KV pool
of 16384 tokens: a default 400-request slice of the public trace has ~127k distinct block tokens, so
the decode cache must evict, as a production one would, while ~30 requests of ~300 tokens in flight
fit; prefill's pool 32768 tokens; 32 tokens reserved per decode request.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from sglang_pd.bench.fresh_run import config_deployment, run_fresh
from sglang_pd.bench.report import format_table, identical_outputs, machine
from sglang_pd.bench.sla_search import deployment_probe, search
from sglang_pd.bench.slo import SloTargets, parse_configs
from sglang_pd.bench.start_failure import StartFailure
from sglang_pd.bench.trace import TraceScaling, parse_window, read_trace, scale, scaled_stats, select, trace_stats
from sglang_pd.bench.trace_replay import measure_replay
from sglang_pd.bench.trace_report import (BASELINES, format_ratios, format_runs, format_spread, format_trace,
                                          format_round_verdicts, medians, numeric_keys, plot_cdfs, ratios,
                                          round_verdicts, spread)

DEFAULT_CONFIGS = "off,on-upstream,on,on+shared,on+local,on+shared+local"
DEPLOYMENT = dict(model="capacity", page_size=16, decode_max_total_tokens=16384, prefill_max_total_tokens=32768,
                  num_reserved_decode_tokens=32, with_router=True)


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    defaults = TraceScaling()
    p.add_argument("--trace", required=True, help="Mooncake-format JSONL file (bench/trace.py)")
    p.add_argument("--first", type=int, help="replay only the first N requests")
    p.add_argument("--window", help="replay only the requests with START_S <= timestamp < END_S, e.g. 60:180")
    p.add_argument("--block-tokens", type=int, default=defaults.block_tokens, help="tokens per hash block")
    p.add_argument("--max-blocks", type=int, default=defaults.max_blocks,
                   help="keep at most N blocks per request (its prefix); 0 keeps all")
    p.add_argument("--output-div", type=int, default=defaults.output_div, help="output length divided by this")
    p.add_argument("--output-min", type=int, default=defaults.output_min, help="then clamped to at least this")
    p.add_argument("--output-max", type=int, default=defaults.output_max, help="and at most this")
    p.add_argument("--token-seed", type=int, default=defaults.seed, help="seed of the blocks' token ids")
    p.add_argument("--speedup", type=float, default=1.0, help="send times divided by this")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="configurations (bench/slo.py), each on fresh pairs")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration, each on a fresh pair")
    p.add_argument("--model", default=DEPLOYMENT["model"], help="built-in model")
    p.add_argument("--page-size", type=int, default=DEPLOYMENT["page_size"])
    p.add_argument("--decode-max-total-tokens", type=int, default=DEPLOYMENT["decode_max_total_tokens"])
    p.add_argument("--local-prefill-tokens", type=int, default=64,
                   help="decode-local prefill threshold of +local configurations (uncached prompt tokens)")
    p.add_argument("--local-balance-tokens", type=int, default=0,
                   help="+local configurations also take requests up to this many uncached tokens when prefill's "
                        "backlog is larger (SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS; 0 = off)")
    p.add_argument("--transfer-backend", default="mooncake_tcp", choices=("mooncake_tcp", "nixl"))
    p.add_argument("--ttft-target-ms", type=float, help="TTFT target: requests scored on it (+reject runs with it)")
    p.add_argument("--itl-target-ms", type=float, help="ITL target: requests scored on it (+itl runs with it)")
    p.add_argument("--sla-search", action="store_true", help="also find each configuration's largest speedup "
                   "under --sla-ttft-p95-ms (bench/sla_search.py; on its first run's pair)")
    p.add_argument("--sla-ttft-p95-ms", type=float, help="the p95 TTFT the SLA search holds to")
    p.add_argument("--sla-probes", type=int, default=6, help="at most this many replays per SLA search")
    p.add_argument("--request-timeout-s", type=float, default=600, help="a request not done by then failed")
    p.add_argument("--out-dir", default="bench_results", help="where the JSON and PNG go")
    p.add_argument("--dry-run", action="store_true", help="print the slice's figures and the scaling; start nothing")
    p.add_argument("--no-progress", action="store_true")


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, checked together: any conflict or bad value ends with an error naming the flag."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_trace_args(p)
    _add_run_args(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.speedup <= 0 or args.sla_probes < 1:
        p.error("--repeats and --sla-probes must be >= 1 and --speedup > 0")
    if args.sla_search != (args.sla_ttft_p95_ms is not None):
        p.error("--sla-search and --sla-ttft-p95-ms go together")
    try:
        args.window_s = parse_window(args.window) if args.window else None
        args.scaling = TraceScaling(args.block_tokens, args.max_blocks or None, args.output_div, args.output_min,
                                    args.output_max, args.token_seed)
        args.configs = parse_configs(args.configs, args.itl_target_ms, args.ttft_target_ms, args.local_prefill_tokens,
                                     args.local_balance_tokens)
        args.slice = select(read_trace(args.trace), args.first, args.window_s)
    except (ValueError, OSError) as exc:  # TraceFormatError (a ValueError) names the file, line and field
        p.error(str(exc))
    args.slo = SloTargets(*(None if v is None else v / 1000 for v in (args.ttft_target_ms, args.itl_target_ms)))
    return args


def _deployment_fields(args) -> dict:
    return dict(DEPLOYMENT, model=args.model, page_size=args.page_size, transfer_backend=args.transfer_backend,
                decode_max_total_tokens=args.decode_max_total_tokens)


def _run_one(config, args, scaled, sla: dict, first: bool):
    """One run of `config` on a fresh pair (bench/fresh_run.py); on the first run of a configuration,
    the SLA search too when asked. Returns (summary | StartFailure, outputs)."""
    def measure(dep):
        summary, outputs = measure_replay(dep, scaled, args.speedup, config.name, not args.no_progress, args.slo,
                                          args.request_timeout_s)
        if args.sla_search and first:
            try:
                target_s = args.sla_ttft_p95_ms / 1000
                probe = deployment_probe(dep, args.slice, args.scaling, target_s, args.request_timeout_s)
                sla[config.name] = search(probe, args.speedup, target_s, args.sla_probes).as_dict()
            except RuntimeError as exc:  # a probe found the pair not clean: recorded, not the run's figures
                sla[config.name] = {"error": str(exc)}
        return summary, outputs

    return run_fresh(config.name, config_deployment(config, _deployment_fields(args)), measure)


def run_all(args, scaled) -> tuple[dict, dict, dict, dict]:
    """(runs: name -> summaries, outputs: run label -> outputs, start failures: name -> [StartFailure],
    SLA results: name -> search) over every configuration and repeat."""
    runs, outputs, failures, sla = {}, {}, {}, {}
    # Rounds: every configuration once, then again. A box that drifts (another tenant, thermal) then
    # moves every configuration's spread alike instead of biasing the configurations run last.
    for repeat in range(args.repeats):
        for config in args.configs:
            result, outs = _run_one(config, args, scaled, sla, first=config.name not in runs)
            if isinstance(result, StartFailure):
                failures.setdefault(config.name, []).append(result)
                continue
            runs.setdefault(config.name, []).append(result)
            outputs[config.name if repeat == 0 else f"{config.name} #{repeat + 1}"] = outs
    return runs, outputs, failures, sla


def build_report(args, trace: dict, runs: dict, outputs: dict, failures: dict, sla: dict, wall_s: float) -> dict:
    """The JSON report: what was replayed and how, every run, the spread, the ratios, the checks."""
    figures = medians(runs)
    return {"machine": machine(), "trace": trace, "speedup": args.speedup,
            "deployment": _deployment_fields(args), "local_prefill_tokens": args.local_prefill_tokens,
            "local_balance_tokens": args.local_balance_tokens,
            "slo": args.slo.describe(), "repeats": args.repeats, "request_timeout_s": args.request_timeout_s,
            "configs": [dataclasses.asdict(c) for c in args.configs], "runs": runs,
            "spread": {name: spread(rs, numeric_keys(rs[0])) for name, rs in runs.items()},
            "ratios": {base: ratios(figures, base) for base in BASELINES},
            "rounds_vs_off": round_verdicts(runs),
            "identical_outputs": identical_outputs(outputs),
            "sla_search": {"target_ttft_p95_ms": args.sla_ttft_p95_ms, "by_config": sla} if args.sla_search else None,
            "port_rebinds": {name: [m for r in rs for m in r["port_rebinds"]] for name, rs in runs.items()},
            "start_failures": {n: [f.as_dict() for f in fs] for n, fs in failures.items()},
            "wall_time_s": wall_s}


def print_report(report: dict, runs: dict, failures: dict) -> None:
    """The console report: the replayed slice, every run, the spread, the ratios, the checks."""
    print(f"\nbench_trace on {report['machine']}\n{report['trace']['description']}; SLO scored: {report['slo']}\n")
    print(format_runs(runs))
    if report["repeats"] > 1:
        print(f"\nmin / median / max over repeats:\n{format_spread(runs)}")
    for base in BASELINES:
        if report["ratios"][base]:
            print(f"\nratio to {base} (medians; below 1 = smaller):\n{format_ratios(report['ratios'][base], base)}")
    if report["repeats"] > 1 and report["rounds_vs_off"]:
        print(f"\nround by round against off (each round runs every configuration once):\n"
              f"{format_round_verdicts(report['rounds_vs_off'])}")
    print(f"\nevery figure (medians over repeats):\n{format_table(medians(runs))}\n")
    identical = report["identical_outputs"]
    for name, count in identical["counts"].items():
        print(f"identical greedy outputs {identical['reference']} vs {name}: {count}/{identical['num_outputs']}")
    for name, rs in runs.items():
        for number, run in enumerate(rs, start=1):
            if not run["clean_after_run"]["clean"]:
                print(f"WARNING [{name} run {number}] not idle and clean after the run: "
                      f"{run['clean_after_run']['detail'][:600]}")
            if run["errors"]:
                print(f"[{name} run {number}] errors: {run['errors']}")
    moved = {n: m for n, m in report["port_rebinds"].items() if m}
    print(f"ports moved by the harness (taken before bound): {moved or 'none'}")
    for fs in failures.values():
        for failure in fs:
            print(f"\n{failure.describe()}")
    if report["sla_search"]:
        print(f"\nSLA search, p95 TTFT <= {report['sla_search']['target_ttft_p95_ms']:g} ms:")
        for name, found in report["sla_search"]["by_config"].items():
            print(f"  [{name}] " + (found["error"] if "error" in found else
                                    f"largest passing speedup {found['max_speedup']}, smallest failing "
                                    f"{found['min_failing_speedup']}, offered {found['offered_rps']} req/s "
                                    f"({len(found['probes'])} probes)"))


def describe_trace(args, scaled) -> dict:
    """The trace part of the report: file, slice, its own figures, the scaling and what it sends."""
    slice_text = (f"first {args.first}" if args.first else f"window {args.window} s" if args.window else "all")
    stats, sent = trace_stats(args.slice), scaled_stats(scaled, args.scaling)
    return {"path": str(args.trace), "slice": {"first": args.first, "window_s": args.window_s},
            "stats": stats, "scaling": args.scaling.as_dict(), "scaled": sent,
            "description": format_trace(stats, sent, args.scaling.as_dict(), slice_text, args.speedup)}


def main(argv=None) -> int:
    """Run the benchmark (module docstring); 0 when every configuration started and no request failed."""
    args = parse_args(argv)
    scaled = scale(args.slice, args.scaling)
    trace = describe_trace(args, scaled)
    if args.dry_run:
        print(trace["description"])
        return 0
    t0 = time.perf_counter()
    runs, outputs, failures, sla = run_all(args, scaled)
    report = build_report(args, trace, runs, outputs, failures, sla, time.perf_counter() - t0)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_trace.json").write_text(json.dumps(report, indent=1))
    for name, fs in failures.items():
        for number, failure in enumerate(fs, start=1):
            failure.write_log(out / f"bench_trace_{name}_{number}_start_failure.log")
    if runs:
        plot_cdfs(runs, str(out / "bench_trace_cdf.png"))
        print_report(report, runs, failures)
    print(f"\nJSON and PNG in {out}/", file=sys.stderr)
    ok = all(r["failed"] == 0 for rs in runs.values() for r in rs)
    return 0 if runs and ok and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
