"""Multi-turn cache-hit benchmark: the same workload with decode radix cache OFF and ON, side by side.

    python -m sglang_pd.bench_multiturn --preset short            # README main job (~3-4 min here)
    python -m sglang_pd.bench_multiturn --preset capacity         # FINDINGS §5 mechanism (decode pool < clients x prefix)
    python -m sglang_pd.bench_multiturn --prefill-url URL --decode-url URL --bootstrap-port P   # attach (one config)
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on,on+itl,on+itl+reject \
        --itl-target-ms 40 --ttft-target-ms 3000 --pareto-itl-targets 30,60   # SLO comparison + Pareto plot
    python -m sglang_pd.bench_multiturn --preset short --configs off,on,on+local --local-prefill-tokens 64 \
        --local-sweep 16,64,256 --out-dir docs/local_prefill        # decode-local prefill + threshold sweep
    python -m sglang_pd.bench_multiturn --preset capacity --configs off,on,off+shared,on+shared   # decode attention

Each configuration gets its own fresh PD deployment (started, primed with the shared system prompt,
measured, stopped). Prints a table (TTFT p50/p90/p99, ITL, request and token throughput, decode hit
rate, KV pages and bytes transferred, measured at prefill), writes JSON and a PNG of per-round TTFT
and hit rate, and checks that greedy outputs are identical OFF vs ON. With SLO targets it also
scores every request (bench/slo.py: attainment, goodput; plots), and `--pareto-itl-targets` adds one
`on+itl` run per target and plots TTFT p50 against ITL p50. `+local` configurations serve requests
whose uncached prompt part is at most `--local-prefill-tokens` on decode (prefill declines them);
`--local-sweep` adds one such run per threshold (threshold 0 is the `on` run). Greedy outputs of every
configuration are compared with OFF's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from tqdm import tqdm

from sglang_pd.bench.multiturn_workload import WorkloadConfig, run_workload, system_prompt
from sglang_pd.bench.pd_client import pd_stream
from sglang_pd.bench.report import format_table, plot, plot_summary, summarize
from sglang_pd.bench.slo import BenchConfig, SloTargets, parse_configs, plot_pareto, plot_slo, slo_figures
from sglang_pd.harness import DeploymentConfig, PDDeployment

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
                   help="configurations to run, in order, each on a fresh PD pair: off|on[+itl][+reject][+shared]")
    p.add_argument("--itl-target-ms", type=float, help="ITL target: +itl configs run with it; requests are scored on it")
    p.add_argument("--ttft-target-ms", type=float, help="TTFT target: +reject configs run with it; requests scored on it")
    p.add_argument("--pareto-itl-targets", default="",
                   help="comma list of ITL targets (ms): one extra on+itl run each, plotted TTFT p50 vs ITL p50")
    p.add_argument("--local-prefill-tokens", type=int, default=64,
                   help="decode-local prefill threshold of +local configurations (uncached prompt tokens)")
    p.add_argument("--local-sweep", default="",
                   help="comma list of thresholds: one extra on+local run each (0 = the on run), swept table")
    p.add_argument("--model", help="built-in model (overrides the preset's)")
    p.add_argument("--transfer-backend", default="mooncake_tcp", choices=("mooncake_tcp", "nixl"))
    p.add_argument("--page-size", type=int, help="KV page size (overrides the preset's)")
    p.add_argument("--decode-max-total-tokens", type=int, help="decode KV pool in tokens (overrides the preset's)")
    for name in WORKLOAD_FLAGS:
        kind = {"request_rate": float, "round_barrier": None}.get(name, int)
        flag = "--" + name.replace("_", "-")
        if kind is None:
            p.add_argument(flag, action="store_true", default=None, help="see WorkloadConfig")
        else:
            p.add_argument(flag, type=kind, help="override the preset (see WorkloadConfig)")
    p.add_argument("--prefill-url"), p.add_argument("--decode-url"), p.add_argument("--bootstrap-port", type=int)
    p.add_argument("--label", default="attached", help="column name in attach mode")
    p.add_argument("--out-dir", default="bench_results", help="where the JSON and PNG go")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    attach = [args.prefill_url, args.decode_url, args.bootstrap_port]
    if any(attach) and not all(attach):
        p.error("attach mode needs all of --prefill-url, --decode-url and --bootstrap-port")
    try:
        args.configs = parse_configs(args.configs, args.itl_target_ms, args.ttft_target_ms, args.local_prefill_tokens)
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


def _prefill_counters(url: str) -> dict:
    """Prefill's own counters: KV moved, prompt tokens its model computed, halves decode declined."""
    state = PDDeployment.get_json(url, "/sglang_pd/stats")["schedulers"][0]["counters"]
    return {"pages": state["kv_pages_transferred_total"], "bytes": state["kv_bytes_transferred_total"],
            "computed_tokens": state["prefill_computed_tokens_total"],
            "declined": state["prefill_declined_requests_total"],
            "declined_computed_tokens": state["prefill_declined_computed_tokens_total"]}


def measure(prefill_url, decode_url, bootstrap_port, cfg: WorkloadConfig, label: str, progress: bool,
            slo: SloTargets | None = None):
    """Prime the shared prefix, run the workload, return (summary, outputs by (client, round))."""
    send = lambda ids, n: pd_stream(prefill_url, decode_url, bootstrap_port, ids, n)  # noqa: E731
    primed = send(system_prompt(cfg), 1)
    if not primed.ok:
        raise RuntimeError(f"priming request failed: {primed.error}")
    before = _prefill_counters(prefill_url)
    bar = tqdm(total=cfg.num_clients * cfg.num_rounds, desc=label, disable=not progress, file=sys.stderr)
    start = time.perf_counter()
    records = run_workload(cfg, send, on_done=lambda r: bar.update(0 if r.result.rejected else 1))
    duration = time.perf_counter() - start
    bar.close()
    after = _prefill_counters(prefill_url)
    transfer = {k: after[k] - before[k] for k in after}
    outputs = {(r.client, r.round): r.result.output_ids for r in records if not r.result.rejected}
    summary = summarize(records, duration, transfer)
    if slo is not None and (slo.ttft_s or slo.itl_s):
        summary.update(slo_figures([r.result for r in records], duration, slo))
    decode_state = PDDeployment.get_json(decode_url, "/sglang_pd/stats")["schedulers"][0]
    summary["decode_slo"] = decode_state.get("slo")
    summary["decode_shared_attention"] = decode_state.get("shared_attention")
    return summary, outputs


def run_config(config: BenchConfig, args, cfg: WorkloadConfig):
    """Fresh deployment for one configuration; stopped whatever happens."""
    deploy = dict(PRESETS[args.preset][1], transfer_backend=args.transfer_backend, env_overrides=config.env)
    if args.model:
        deploy["model"] = args.model
    if args.page_size:
        deploy["page_size"] = args.page_size
    if args.decode_max_total_tokens:
        deploy["decode_max_total_tokens"] = args.decode_max_total_tokens
    t0 = time.perf_counter()
    with PDDeployment(DeploymentConfig(decode_radix=config.decode_radix,
                                       decode_attention_backend=config.decode_attention_backend, **deploy)) as dep:
        print(f"[{config.name}] PD pair up in {time.perf_counter() - t0:.0f}s (logs {dep.log_dir})", file=sys.stderr)
        return measure(dep.prefill.url, dep.decodes[0].url, dep.bootstrap_port, cfg, config.name,
                       not args.no_progress, args.slo)


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()} {os.cpu_count()} cores, {mem_gib:.0f} GiB, no GPU, Python {platform.python_version()}"


def _pareto_points(args, cfg: WorkloadConfig, results: dict) -> dict[str, dict]:
    """Run one on+itl configuration per Pareto target (reusing the main run of the same configuration)."""
    points = {}
    for target, config in zip(args.pareto, args.pareto_configs):
        points[f"itl {target:g} ms"] = (results[config.name] if config in args.configs
                                        else run_config(config, args, cfg)[0])
    return points


def _sweep_points(args, cfg: WorkloadConfig, results: dict) -> dict:
    """One run per swept threshold (reusing a main run of the same configuration)."""
    points = {}
    for threshold, config in zip(args.sweep, args.sweep_configs):
        points[threshold] = (results[config.name] if config in args.configs
                             else run_config(config, args, cfg)[0])
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


def identical_outputs(outputs: dict[str, dict]) -> dict:
    """Greedy outputs of every configuration compared with the reference (`off`, else the first run)."""
    if not outputs:
        return {"reference": None, "num_outputs": 0, "counts": {}}
    ref = "off" if "off" in outputs else next(iter(outputs))
    return {"reference": ref, "num_outputs": len(outputs[ref]),
            "counts": {name: sum(outputs[ref][k] == out.get(k) for k in outputs[ref])
                       for name, out in outputs.items() if name != ref}}


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = workload_config(args)
    results, outputs = {}, {}
    if args.prefill_url:
        results[args.label], outputs[args.label] = measure(args.prefill_url, args.decode_url, args.bootstrap_port,
                                                           cfg, args.label, not args.no_progress, args.slo)
    else:
        for config in args.configs:
            results[config.name], outputs[config.name] = run_config(config, args, cfg)
    pareto = _pareto_points(args, cfg, results) if args.pareto and not args.prefill_url else {}
    sweep = _sweep_points(args, cfg, results) if args.sweep and not args.prefill_url else {}
    same = None
    if "off" in outputs and "on" in outputs:
        same = sum(outputs["off"][k] == outputs["on"].get(k) for k in outputs["off"])
    identical = identical_outputs(outputs)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = {"preset": args.preset, "machine": machine(), "workload": dataclasses.asdict(cfg),
              "deployment": PRESETS[args.preset][1], "model": args.model, "page_size": args.page_size,
              "decode_max_total_tokens": args.decode_max_total_tokens,
              "transfer_backend": args.transfer_backend, "slo": args.slo.describe(),
              "configs": [dataclasses.asdict(c) for c in args.configs],
              "results": results, "pareto": pareto, "local_sweep": {str(t): r for t, r in sweep.items()},
              "identical_outputs_off_vs_on": same, "identical_outputs": identical}
    (out / f"bench_multiturn_{args.preset}.json").write_text(json.dumps(report, indent=2))
    plot(results, str(out / f"bench_multiturn_{args.preset}.png"))
    plot_summary(results, str(out / f"bench_multiturn_{args.preset}_summary.png"))
    if all("slo_attainment" in r for r in results.values()):
        plot_slo(results, str(out / f"bench_multiturn_{args.preset}_slo.png"))
    print(f"\nbench_multiturn preset={args.preset} backend={args.transfer_backend} on {machine()}")
    print(f"workload: {json.dumps(dataclasses.asdict(cfg))}; SLO scored: {args.slo.describe()}\n")
    print(format_table(results))
    if same is not None:
        print(f"\nidentical greedy outputs OFF vs ON: {same}/{len(outputs['off'])}")
    for name, count in identical["counts"].items():
        print(f"identical greedy outputs {identical['reference']} vs {name}: {count}/{identical['num_outputs']}")
    if sweep:
        print("\ndecode-local prefill threshold sweep:\n" + format_sweep(sweep))
    if pareto:
        _write_pareto(args, results, pareto, out)
    print(f"\nJSON and PNGs in {out}/")
    return 0 if all(r["failed"] == 0 for r in [*results.values(), *pareto.values(), *sweep.values()]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
