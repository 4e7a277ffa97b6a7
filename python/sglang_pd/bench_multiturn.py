"""Multi-turn cache-hit benchmark: the same workload with decode radix cache OFF and ON, side by side.

    python -m sglang_pd.bench_multiturn --preset short            # README main job (~3-4 min here)
    python -m sglang_pd.bench_multiturn --preset capacity         # FINDINGS §5 mechanism (decode pool < clients x prefix)
    python -m sglang_pd.bench_multiturn --prefill-url URL --decode-url URL --bootstrap-port P   # attach (one config)
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on,on+itl,on+itl+reject \
        --itl-target-ms 40 --ttft-target-ms 3000 --pareto-itl-targets 30,60   # SLO comparison + Pareto plot
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on-upstream,on   # what the plugin adds
    python -m sglang_pd.bench_multiturn --preset short --configs off,on,on+local --local-prefill-tokens 64 \
        --local-sweep 16,64,256 --out-dir docs/results/local_prefill        # decode-local prefill + threshold sweep
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on,off+shared,on+shared   # decode attention
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on+shared --cpu-split decode-step

Each configuration gets its own fresh PD deployment (started, primed with the shared system prompt,
measured, stopped). Prints a table (TTFT p50/p90/p99, ITL, request and token throughput, decode hit
rate, KV pages and bytes transferred, measured at prefill), writes JSON and a PNG of per-round TTFT
and hit rate, and checks that greedy outputs are identical across configurations. `on-upstream` runs
upstream's decode radix cache flag with sglang_pd not loaded: its figures come from what SGLang itself
exposes (its /metrics; decode hit rate and page counts read n/a), and a configuration whose servers
do not start is recorded with the log lines that say why. With SLO targets it also
scores every request (bench/slo.py: attainment, goodput; plots), and `--pareto-itl-targets` adds one
`on+itl` run per target and plots TTFT p50 against ITL p50. `+local` configurations serve requests
whose uncached prompt part is at most `--local-prefill-tokens` on decode (prefill declines them);
`--local-sweep` adds one such run per threshold (threshold 0 is the `on` run). Greedy outputs of every
configuration are compared with OFF's. `--cpu-split decode` gives the decode server a CPU of its own
(prefill, the client and the rest share the others), `--cpu-split decode-scheduler` only decode's scheduler
process, `--cpu-split decode-step` only that process's main thread, which runs the decode step
(harness/cpu_placement.py): as far as one box can stand for two. `--via-router` sends every request
through a stock sglang-router in PD mode started beside each pair (it picks the room and sends both
halves; it passes decode's stream on only after prefill's half has answered): the TTFT a router's
client sees, router hop and prefill's answer included.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from sglang_pd.bench.multiturn_workload import WorkloadConfig, run_workload, system_prompt
from sglang_pd.bench.pd_client import pd_stream, router_stream
from sglang_pd.bench.fresh_run import BackgroundStops, config_deployment, run_fresh
from sglang_pd.bench.report import (format_local_stages, format_prefill_answer, format_stages, format_table,
                                     format_ttft_split, identical_outputs, machine, plot, plot_summary)
from sglang_pd.bench.server_figures import ServerFigures
from sglang_pd.bench.slo import BenchConfig, SloTargets, parse_configs, plot_pareto, plot_slo
from sglang_pd.bench.start_failure import StartFailure
from sglang_pd.harness import PDDeployment
from sglang_pd.harness.cpu_placement import SPLITS, split_placement

PRESETS: dict[str, tuple[dict, dict]] = {  # name -> (workload, deployment)
    "tiny": (dict(num_clients=3, num_rounds=2, system_len=64, first_question_len=16, question_len=8,
                  max_new_tokens=8, concurrency=3), dict(model="tiny", page_size=16)),
    "short": (dict(num_clients=8, num_rounds=4, system_len=384, first_question_len=32, question_len=16,
                   max_new_tokens=24, concurrency=8),
              dict(model="tiny", page_size=1, decode_max_total_tokens=2048, num_reserved_decode_tokens=32)),
    "capacity": (dict(num_clients=32, num_rounds=4, system_len=768, first_question_len=32, question_len=16,
                      max_new_tokens=32, concurrency=32),
                 dict(model="capacity", page_size=1, decode_max_total_tokens=4096, num_reserved_decode_tokens=32,
                      prefill_max_total_tokens=16384)),
}
WORKLOAD_FLAGS = [f.name for f in dataclasses.fields(WorkloadConfig)]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="short")
    p.add_argument("--configs", "--modes", dest="configs", default="off,on",
                   help="configurations to run, in order, each on a fresh PD pair: "
                        "off|on[+itl][+reject][+shared][+local]|on-upstream")
    p.add_argument("--itl-target-ms", type=float, help="ITL target: +itl configs run with it; requests are scored on it")
    p.add_argument("--ttft-target-ms", type=float, help="TTFT target: +reject configs run with it; requests scored on it")
    p.add_argument("--pareto-itl-targets", default="",
                   help="comma list of ITL targets (ms): one extra on+itl run each, plotted TTFT p50 vs ITL p50")
    p.add_argument("--local-prefill-tokens", type=int, default=64,
                   help="decode-local prefill threshold of +local configurations (uncached prompt tokens)")
    p.add_argument("--local-balance-tokens", type=int, default=0,
                   help="+local configurations also take requests up to this many uncached tokens when prefill's "
                        "backlog is larger (SGLANG_PD_LOCAL_PREFILL_BALANCE_TOKENS; 0 = off)")
    p.add_argument("--local-sweep", default="",
                   help="comma list of thresholds: one extra on+local run each (0 = the on run), swept table")
    p.add_argument("--model", help="built-in model (overrides the preset's)")
    p.add_argument("--transfer-backend", default="mooncake_tcp", choices=("mooncake_tcp", "nixl"))
    p.add_argument("--page-size", type=int, help="KV page size (overrides the preset's)")
    p.add_argument("--decode-max-total-tokens", type=int, help="decode KV pool in tokens (overrides the preset's)")
    p.add_argument("--decode-arg", action="append", default=[], metavar="ARG",
                   help="an extra SGLang argument for every configuration's decode server, repeatable "
                        "(e.g. --decode-arg=--disable-overlap-schedule); one the harness sets itself is refused")
    p.add_argument("--cpu-split", choices=SPLITS,
                   help="decode: every configuration's decode server alone on the highest CPU; decode-scheduler: "
                        "only its scheduler process there; decode-step: only that process's main thread; prefill, "
                        "this client and the rest on the others (Linux affinity, checked on every thread of every "
                        "server process at start and after the run)")
    for name in WORKLOAD_FLAGS:
        kind = {"request_rate": float, "round_barrier": None}.get(name, int)
        flag = "--" + name.replace("_", "-")
        if kind is None:
            p.add_argument(flag, action="store_true", default=None, help="see WorkloadConfig")
        else:
            p.add_argument(flag, type=kind, help="override the preset (see WorkloadConfig)")
    p.add_argument("--via-router", action="store_true",
                   help="send every request through a stock sglang-router (PD mode) started beside each pair, "
                        "not as two halves from this client")
    p.add_argument("--prefill-url"), p.add_argument("--decode-url"), p.add_argument("--bootstrap-port", type=int)
    p.add_argument("--label", default="attached", help="column name in attach mode")
    p.add_argument("--out-dir", default="bench_results", help="where the JSON and PNG go")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    attach = [args.prefill_url, args.decode_url, args.bootstrap_port]
    if any(attach) and not all(attach):
        p.error("attach mode needs all of --prefill-url, --decode-url and --bootstrap-port")
    if any(attach) and (args.decode_arg or args.cpu_split or args.via_router):
        p.error("--decode-arg, --cpu-split and --via-router apply to the servers the benchmark starts; "
                "attach mode uses running ones")
    try:
        args.placement = split_placement(args.cpu_split) if args.cpu_split else None
    except ValueError as exc:
        p.error(f"--cpu-split: {exc}")
    try:
        args.configs = parse_configs(args.configs, args.itl_target_ms, args.ttft_target_ms, args.local_prefill_tokens,
                                     args.local_balance_tokens)
        args.pareto = [float(t) for t in args.pareto_itl_targets.split(",") if t.strip()]
        args.pareto_configs = [parse_configs("on+itl", t, None)[0] for t in args.pareto]
        args.sweep = [int(t) for t in args.local_sweep.split(",") if t.strip()]
        args.sweep_configs = [parse_configs("on+local" if t else "on", None, None, t)[0] for t in args.sweep]
    except ValueError as exc:
        p.error(str(exc))
    args.slo = SloTargets(*(None if v is None else v / 1000 for v in (args.ttft_target_ms, args.itl_target_ms)))
    return args


def workload_config(args) -> WorkloadConfig:
    base = dict(PRESETS[args.preset][0])
    base.update({k: getattr(args, k) for k in WORKLOAD_FLAGS if getattr(args, k) is not None})
    return WorkloadConfig(**base)


def measure(prefill_url, decode_url, bootstrap_port, cfg: WorkloadConfig, label: str, progress: bool,
            slo: SloTargets | None = None, after_priming=None, router_url: str | None = None):
    """Prime the shared prefix, call `after_priming()` if given, run the workload (through the router at
    `router_url` if given, else as two halves from this client), return (summary, outputs by (client, round))."""
    if router_url:
        send = lambda ids, n: router_stream(router_url, ids, n)  # noqa: E731
    else:
        send = lambda ids, n: pd_stream(prefill_url, decode_url, bootstrap_port, ids, n)  # noqa: E731
    primed = send(system_prompt(cfg), 1)
    if not primed.ok:
        raise RuntimeError(f"priming request failed: {primed.error}")
    if after_priming is not None:
        after_priming()
    figures = ServerFigures(prefill_url, decode_url)
    before = figures.snapshot()
    bar = tqdm(total=cfg.num_clients * cfg.num_rounds, desc=label, disable=not progress, file=sys.stderr)
    start, cpu_start = time.perf_counter(), time.process_time()
    records = run_workload(cfg, send, on_done=lambda r: bar.update(0 if r.result.rejected else 1))
    duration, client_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    bar.close()
    outputs = {(r.client, r.round): r.result.output_ids for r in records if not r.result.rejected}
    summary = figures.summarize_run(records, duration, before, slo, client_cpu_s)
    return summary, outputs


def run_config(config: BenchConfig, args, cfg: WorkloadConfig, stops: BackgroundStops | None = None):
    """Fresh deployment for one configuration (bench/fresh_run.py); stopped whatever happens (in `stops`
    when given: the caller waits for it).

    Returns (summary, outputs), or (StartFailure, {}) when a server of the pair does not start."""
    deployment = config_deployment(config, PRESETS[args.preset][1], transfer_backend=args.transfer_backend,
                                   model=args.model, page_size=args.page_size,
                                   decode_max_total_tokens=args.decode_max_total_tokens,
                                   extra_decode_args=tuple(args.decode_arg), cpu_placement=args.placement,
                                   with_router=args.via_router)

    def measure_pair(dep: PDDeployment):
        settled = []  # threads decode's moved scheduler thread started with the first request (decode-step)
        summary, outputs = measure(dep.prefill.url, dep.decodes[0].url, dep.bootstrap_port, cfg, config.name,
                                   not args.no_progress, args.slo, lambda: settled.append(dep.settle_placement()),
                                   router_url=dep.router.url if dep.router else None)
        summary["placement_checked"] = dict(dep.placement_checked)   # at start, then again after the run
        summary["placement_threads_settled"] = settled[0]
        summary["placement_checked_after_run"] = _placement_after_run(dep)
        return summary, outputs

    return run_fresh(config.name, deployment, measure_pair, stops)


def _placement_after_run(dep: PDDeployment) -> dict:
    """Processes checked per server after the run, or {"error": ...} naming a thread that left its CPUs
    meanwhile (e.g. one the moved scheduler thread started): recorded and printed, not raised."""
    try:
        return dep.check_placement()
    except RuntimeError as exc:
        return {"error": str(exc)[:2000]}


def _pareto_points(args, cfg: WorkloadConfig, results: dict) -> dict[str, dict]:
    """Run one on+itl configuration per Pareto target (reusing the main run of the same configuration)."""
    points = {}
    for target, config in zip(args.pareto, args.pareto_configs):
        point = results[config.name] if config in args.configs else run_config(config, args, cfg)[0]
        if isinstance(point, StartFailure):
            raise RuntimeError(point.describe())
        points[f"itl {target:g} ms"] = point
    return points


def _sweep_points(args, cfg: WorkloadConfig, results: dict) -> dict:
    """One run per swept threshold (reusing a main run of the same configuration)."""
    points = {}
    for threshold, config in zip(args.sweep, args.sweep_configs):
        point = results[config.name] if config in args.configs else run_config(config, args, cfg)[0]
        if isinstance(point, StartFailure):
            raise RuntimeError(point.describe())
        points[threshold] = point
    return points


def format_sweep(points: dict) -> str:
    """Markdown table: one row per decode-local prefill threshold."""
    lines = ["| threshold (tokens) | TTFT p50 (s) | TTFT p90 (s) | ITL p50 (ms) | req/s | served decode-locally "
             "| prefill tokens computed | KV pages moved |", "|---|---|---|---|---|---|---|---|"]
    for threshold, r in sorted(points.items()):
        lines.append(f"| {threshold} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['itl_p50_ms']:.1f} | "
                     f"{r['request_throughput']:.2f} | {r.get('local_requests', 0)}/{r['requests']} | "
                     f"{r['prefill_computed_tokens']:.0f} | {r['kv_pages_transferred']:.0f} |")
    return "\n".join(lines)


def _write_pareto(args, results: dict, pareto: dict, out: Path) -> None:
    refs = [(f"radix {n}", results[n]) for n in ("off", "on") if n in results]
    pts = [(label, r["ttft_p50_s"], r["itl_p50_ms"]) for label, r in refs + list(pareto.items())]
    plot_pareto(pts, str(out / f"bench_multiturn_{args.preset}_pareto.png"))
    print("\nPareto (TTFT p50 s, ITL p50 ms): " + "; ".join(f"{lbl}: {t:.3f}, {i:.1f}" for lbl, t, i in pts))


def _run_all(args, cfg: WorkloadConfig) -> tuple[dict, dict, dict]:
    """(results, outputs, start failures) of every configuration, or of the attached pair."""
    if args.prefill_url:
        summary, outs = measure(args.prefill_url, args.decode_url, args.bootstrap_port, cfg, args.label,
                                not args.no_progress, args.slo)
        return {args.label: summary}, {args.label: outs}, {}
    results, outputs, failures = {}, {}, {}
    if args.placement is not None:
        os.sched_setaffinity(0, args.placement.client)  # this process's client threads too
    with BackgroundStops() as stops:  # each configuration starts while the one before shuts down
        for config in args.configs:
            result, outs = run_config(config, args, cfg, stops)
            if isinstance(result, StartFailure):
                failures[config.name] = result
            else:
                results[config.name], outputs[config.name] = result, outs
    return results, outputs, failures


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = workload_config(args)
    t0 = time.perf_counter()
    results, outputs, failures = _run_all(args, cfg)
    pareto = _pareto_points(args, cfg, results) if args.pareto and not args.prefill_url else {}
    sweep = _sweep_points(args, cfg, results) if args.sweep and not args.prefill_url else {}
    identical = identical_outputs(outputs)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = {"preset": args.preset, "machine": machine(), "workload": dataclasses.asdict(cfg),
              "deployment": PRESETS[args.preset][1], "model": args.model, "page_size": args.page_size,
              "decode_max_total_tokens": args.decode_max_total_tokens,
              "extra_decode_args": args.decode_arg,
              "cpu_placement": args.placement and args.placement.as_dict(),
              "transfer_backend": args.transfer_backend, "slo": args.slo.describe(), "via_router": args.via_router,
              "configs": [dataclasses.asdict(c) for c in args.configs],
              "results": results, "pareto": pareto, "local_sweep": {str(t): r for t, r in sweep.items()},
              "identical_outputs": identical,
              "start_failures": {n: f.as_dict() for n, f in failures.items()},
              "wall_time_s": time.perf_counter() - t0}  # every configuration, start-ups and stops included
    (out / f"bench_multiturn_{args.preset}.json").write_text(json.dumps(report, indent=2))
    for failure in failures.values():
        failure.write_log(out / f"bench_multiturn_{args.preset}_{failure.config}_start_failure.log")
    if results:
        plot(results, str(out / f"bench_multiturn_{args.preset}.png"))
        plot_summary(results, str(out / f"bench_multiturn_{args.preset}_summary.png"))
    if results and all("slo_attainment" in r for r in results.values()):
        plot_slo(results, str(out / f"bench_multiturn_{args.preset}_slo.png"))
    print(f"\nbench_multiturn preset={args.preset} backend={args.transfer_backend} on {machine()}"
          + (" (every request through sglang-router)" if args.via_router else ""))
    if args.placement is not None:
        print(f"CPU placement: {args.placement.as_dict()}")
    print(f"workload: {json.dumps(dataclasses.asdict(cfg))}; SLO scored: {args.slo.describe()}\n")
    if results:
        print(format_table(results))
        for title, table in (("where the time went, by SGLang's own per-stage timestamps", format_stages(results)),
                             ("where the decode-local requests' time went", format_local_stages(results)),
                             ("TTFT at the client vs at decode's tokenizer manager", format_ttft_split(results)),
                             ("when the declined prefill half answered", format_prefill_answer(results))):
            if table:
                print(f"\n{title}:\n{table}\n")
    for name, count in identical["counts"].items():
        print(f"identical greedy outputs {identical['reference']} vs {name}: {count}/{identical['num_outputs']}")
    for name, result in results.items():
        if not result.get("clean_after_run", {"clean": True})["clean"]:
            print(f"\nWARNING [{name}] servers not idle and clean after the run: "
                  f"{result['clean_after_run']['detail'][:600]}")
        if "error" in result.get("placement_checked_after_run", {}):
            print(f"\nWARNING [{name}] CPU placement not kept during the run: {result['placement_checked_after_run']['error']}")
    for failure in failures.values():
        print(f"\n{failure.describe()}")
    if sweep:
        print("\ndecode-local prefill threshold sweep:\n" + format_sweep(sweep))
    if pareto:
        _write_pareto(args, results, pareto, out)
    print(f"\nJSON and PNGs in {out}/")
    ran_ok = all(r["failed"] == 0 for r in [*results.values(), *pareto.values(), *sweep.values()])
    return 0 if ran_ok and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
