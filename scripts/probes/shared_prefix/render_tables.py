"""Markdown tables of docs/shared_prefix_attention.md, read from the stored JSONs (no figure typed by hand).

    .venv/bin/python scripts/probes/shared_prefix/render_tables.py

Runs are named by their path under docs/results/shared_prefix/ as they were stored (e.g.
`repeats/run2/bench_multiturn_capacity.json`); a run folded into one of that folder's *_summary.json files
(scripts/docs/fold_series.py) is read from there, with its decode step samples as stored medians.
"""

import json
import sys
import statistics
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
from fold_series import stored_run  # noqa: E402 (scripts/docs is not a package)

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "shared_prefix"


def load(name: str) -> dict:
    """The stored report of run `name` under RESULTS (folded runs read from their summary)."""
    return stored_run(RESULTS, name)


def attention_table(name: str) -> str:
    """bench_attention cells: plain / shared ms per step, ratio, KV read, max diff (and, for a run with
    --versus-group-all, the backend that groups every shared run: its ms per step and groups)."""
    cells = load(name)["cells"]
    versus = any(c.get("group_all_ms") is not None for c in cells)
    lines = ["| requests per group | shared prefix | groups | torch_native ms/step | shared ms/step "
             "| torch_native / shared | KV tokens read per layer (torch_native / shared) | max abs diff |"
             + (" grouping every run: ms/step (groups) |" if versus else ""),
             "|---" * (9 if versus else 8) + "|"]
    for c in cells:
        lines.append(f"| {c['group_size']} | {c['prefix_len']} | {c['num_groups']} | {c['plain_ms']:.1f} | "
                     f"{c['shared_ms']:.1f} | {c['ratio']:.2f}x | {c['plain_kv_tokens']} / {c['shared_kv_tokens']} | "
                     f"{c['max_abs_diff']:.1e} |"
                     + (f" {c['group_all_ms']:.1f} ({c['group_all_groups']}) |" if versus else ""))
    return "\n".join(lines)


def kernel_ab(name: str) -> str:
    """own_kernel_ab/run.log: arena (22ed0f4) vs in-place kernel (HEAD), ms per step, per cell and run."""
    runs: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    version = cell = None
    for line in (RESULTS / name).read_text().splitlines():
        if line.startswith("== "):
            version, args = line.split()[1], line.split("bench_attention ")[1]
            words = args.split()
            fixed = {"--batch", "--group-sizes", "--prefix-lens", "--own-len", "--repeats"}
            cell = " ".join(w for i, w in enumerate(words) if w not in fixed and (i == 0 or words[i - 1] not in fixed))
        elif line.strip() and line.split()[0].isdigit():
            runs[(cell, line.split()[0])][version].append(float(line.split()[3]))
    lines = ["| workload | requests per group | arena (22ed0f4) ms/step | in-place kernel ms/step | arena / kernel |",
             "|---|---|---|---|---|"]
    for (cell, group), by in runs.items():
        old, new = by["22ed0f4"], by["HEAD"]
        lines.append(f"| {cell} | {group} | {' / '.join(f'{t:.2f}' for t in old)} | "
                     f"{' / '.join(f'{t:.2f}' for t in new)} | {statistics.mean(old) / statistics.mean(new):.2f}x |")
    return "\n".join(lines)


ROWS = [("ttft_p50_s", "TTFT p50 (s)", "{:.3f}", "down"), ("ttft_p90_s", "TTFT p90 (s)", "{:.3f}", "down"),
        ("itl_mean_ms", "ITL mean (ms)", "{:.1f}", "down"), ("itl_p50_ms", "ITL p50 (ms)", "{:.1f}", "down"),
        ("request_throughput", "request throughput (req/s)", "{:.2f}", "up"),
        ("output_token_throughput", "output throughput (tok/s)", "{:.1f}", "up"),
        ("decode_hit_rate", "decode hit rate", "{:.3f}", None),
        ("kv_pages_transferred", "KV pages transferred", "{:.0f}", None)]


def ratio(a: float, b: float, direction: str) -> str:
    """How much better b is than a ('down': smaller is better)."""
    if not a or not b:
        return ""
    r = a / b if direction == "down" else b / a
    return f"{r:.2f}x better" if r >= 1 else f"{1 / r:.2f}x worse"


def step_at(result: dict, lo: int, hi: int) -> str:
    """Median decode step (launch to launch) with lo..hi running requests, from the stored samples (or, for
    a folded run, the median fold_series.py stored for that range)."""
    slo = result["decode_slo"]
    if "recent_steps" not in slo:
        median = slo["recent_steps_medians"][f"{lo}-{hi}"]
        return f"{median[0]:.1f} ({median[1]})" if median else "-"
    samples = [s[2] * 1000 for s in slo["recent_steps"] if lo <= s[0] <= hi]
    return f"{statistics.median(samples):.1f} ({len(samples)})" if samples else "-"


def capacity_table(name: str, columns: list[tuple[str, str]]) -> str:
    """One column per configuration plus ratio columns (label, 'a vs b')."""
    report = load(name)
    results = report["results"]
    configs = list(results)
    head = "| metric | " + " | ".join(configs) + " | " + " | ".join(label for label, _ in columns) + " |"
    lines = [head, "|---" * (1 + len(configs) + len(columns)) + "|"]
    for key, label, fmt, direction in ROWS:
        cells = [fmt.format(results[c][key]) for c in configs]
        ratios = [ratio(results[b][key], results[a][key], direction) if direction else ""
                  for _, pair in columns for a, b in [pair.split(" vs ")]]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    for lo, hi in ((24, 32), (1, 8)):
        cells = [step_at(results[c], lo, hi) for c in configs]
        lines.append(f"| decode step with {lo}-{hi} running, median ms (samples) | " + " | ".join(cells)
                     + " |" + " |" * len(columns))
    ident = report["identical_outputs"]
    lines.append("")
    lines.append("Identical greedy outputs vs " + ident["reference"] + ": " + ", ".join(
        f"{n} {k}/{ident['num_outputs']}" for n, k in ident["counts"].items()))
    return "\n".join(lines)


def repeats_table(names: list[str]) -> str:
    """off vs on+shared over repeated runs: the goals' ratios per run."""
    lines = ["| run | ITL p50 off / on+shared (ms) | on+shared ITL vs off | TTFT p50 off / on+shared (s) | TTFT gain "
             "| req/s off / on+shared | throughput gain | identical outputs |", "|---" * 8 + "|"]
    for name in names:
        report = load(name)
        off, shared = report["results"]["off"], report["results"]["on+shared"]
        ident = report["identical_outputs"]
        lines.append(f"| {name} | {off['itl_p50_ms']:.1f} / {shared['itl_p50_ms']:.1f} | "
                     f"{ratio(off['itl_p50_ms'], shared['itl_p50_ms'], 'down')} | {off['ttft_p50_s']:.3f} / "
                     f"{shared['ttft_p50_s']:.3f} | {off['ttft_p50_s'] / shared['ttft_p50_s']:.2f}x | "
                     f"{off['request_throughput']:.2f} / {shared['request_throughput']:.2f} | "
                     f"{shared['request_throughput'] / off['request_throughput']:.2f}x | "
                     f"{ident['counts']['on+shared']}/{ident['num_outputs']} |")
    itl = [load(n)["results"]["on+shared"]["itl_p50_ms"] / load(n)["results"]["off"]["itl_p50_ms"] for n in names]
    lines.append(f"\nmedian on+shared / off ITL p50 over {len(names)} runs: {statistics.median(itl):.2f} "
                 f"(from {min(itl):.2f} to {max(itl):.2f}; > 1 is worse)")
    return "\n".join(lines)


def goals_table(name: str) -> str:
    """Every configuration of one capacity run against off, on the issue's four goals."""
    report = load(name)
    off, ident = report["results"]["off"], report["identical_outputs"]
    lines = ["| config | ITL p50 (ms) | vs off | TTFT p50 (s) | TTFT gain vs off | req/s | throughput vs off "
             "| identical to off |", "|---" * 8 + "|"]
    for config, r in report["results"].items():
        same = "ref" if config == ident["reference"] else f"{ident['counts'][config]}/{ident['num_outputs']}"
        if r is off:
            lines.append(f"| off | {r['itl_p50_ms']:.1f} | ref | {r['ttft_p50_s']:.3f} | ref | "
                         f"{r['request_throughput']:.2f} | ref | ref |")
            continue
        lines.append(f"| {config} | {r['itl_p50_ms']:.1f} | {ratio(off['itl_p50_ms'], r['itl_p50_ms'], 'down')} | "
                     f"{r['ttft_p50_s']:.3f} | {off['ttft_p50_s'] / r['ttft_p50_s']:.2f}x | "
                     f"{r['request_throughput']:.2f} | {r['request_throughput'] / off['request_throughput']:.2f}x | "
                     f"{same} |")
    return "\n".join(lines)


def counters(name: str, config: str) -> dict:
    """The decode server's shared-attention counters of one configuration."""
    return {k: v for k, v in load(name)["results"][config]["decode_shared_attention"].items() if k.endswith("total")}


def step_model(name: str) -> str:
    """The SLO step-time fit of each configuration of a run."""
    lines = ["| config | intercept (ms) | per running request (ms) | per 1,000 KV tokens (ms) | samples |",
             "|---|---|---|---|---|"]
    for config, r in load(name)["results"].items():
        fit = r["decode_slo"]["step_model"]
        if not fit or fit.get("intercept") is None:
            continue
        lines.append(f"| {config} | {1000 * fit['intercept']:.1f} | {1000 * fit['slopes'][0]:.2f} | "
                     f"{1000 * fit['slopes'][1]:.2f} | {fit['num_samples']} |")
    return "\n".join(lines)


def contention_table(name: str) -> str:
    """contention/contention.json: CPU time and run-queue wait per server thread group, client CPU, ITL."""
    report = load(name)
    lines = ["| config | measured window (s) | decode scheduler: ran / waited on the run queue (s) | decode's other threads "
             "ran (s) | prefill scheduler ran / waited (s) | prefill's other threads ran (s) | both HTTP processes "
             "ran (s) | client CPU (s) | ITL p50 (ms) |", "|---" * 9 + "|"]
    for config, r in report.items():
        if config == "cpu_placement":
            continue
        dec, pre = r["servers"]["decode"], r["servers"]["prefill"]
        sched = "sglang::schedul (main thread)"
        others = "sglang::schedul (other threads)"
        http = sum(t["run_s"] for role in (dec, pre) for n, t in role.items() if n.startswith("python"))
        lines.append(f"| {config} | {r['wall_s_with_priming']:.1f} | {dec[sched]['run_s']:.2f} / {dec[sched]['run_queue_wait_s']:.2f} | "
                     f"{dec[others]['run_s']:.2f} | {pre[sched]['run_s']:.2f} / {pre[sched]['run_queue_wait_s']:.2f} | "
                     f"{pre[others]['run_s']:.2f} | {http:.2f} | {r['client_cpu_s']:.2f} | {r['itl_p50_ms']:.1f} |")
    return "\n".join(lines)


def cpu_split_table(names: list[str]) -> str:
    """off vs on+shared per run with its CPU placement, and the decode step times behind the ITLs."""
    lines = ["| run | decode scheduler's CPU | ITL p50 off / on+shared (ms) | on+shared ITL vs off | decode step, "
             "median ms: off (all steps) / on+shared with 24-32 running | TTFT gain | throughput gain | "
             "identical outputs |", "|---" * 8 + "|"]
    for name in names:
        report = load(name)
        off, shared = report["results"]["off"], report["results"]["on+shared"]
        place = report.get("cpu_placement")
        where = ("shared with everything" if not place else "its main thread alone" if place.get("main_thread_only")
                 else "with its own other threads" if "decode_scheduler" in place else "with decode's other processes")
        lines.append(f"| {name.split('/')[-2]} | {where} | {off['itl_p50_ms']:.1f} / {shared['itl_p50_ms']:.1f} | "
                     f"{ratio(off['itl_p50_ms'], shared['itl_p50_ms'], 'down')} | {step_at(off, 1, 64)} / "
                     f"{step_at(shared, 24, 32)} | {off['ttft_p50_s'] / shared['ttft_p50_s']:.2f}x | "
                     f"{shared['request_throughput'] / off['request_throughput']:.2f}x | "
                     f"{report['identical_outputs']['counts']['on+shared']}/{report['identical_outputs']['num_outputs']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for name in ("bench_attention.json", "bench_attention_churn.json", "bench_attention_scatter.json",
                 "bench_attention_smollm2.json", "min_reads_saved/capacity.json", "min_reads_saved/smollm2.json"):
        print(f"\n## {name}\n\n{attention_table(name)}")
    print("\n## own_kernel_ab/run.log\n\n" + kernel_ab("own_kernel_ab/run.log"))
    print("\n## bench_multiturn_capacity.json\n")
    print(capacity_table("bench_multiturn_capacity.json", [("on+shared vs off", "on+shared vs off"),
                                                           ("on+shared vs on", "on+shared vs on"),
                                                           ("off+shared vs off", "off+shared vs off")]))
    print("\n## step model\n\n" + step_model("bench_multiturn_capacity.json"))
    print("\n## counters on+shared\n\n" + json.dumps(counters("bench_multiturn_capacity.json", "on+shared")))
    print("\n## repeats\n\n" + repeats_table(["bench_multiturn_capacity.json"] + [
        f"repeats/run{i}/bench_multiturn_capacity.json" for i in (2, 3, 4, 5, 6, 7, 8, 9)] + [
        "itl_target/bench_multiturn_capacity.json"] + [
        f"repeats/run{i}/bench_multiturn_capacity.json" for i in (11, 12, 13, 14)]))
    print("\n## itl_target (run 10 with an ITL-target configuration beside it)\n\n"
          + goals_table("itl_target/bench_multiturn_capacity.json"))
    for name in ("smollm2/bench_multiturn_short.json", "smollm2_16clients/bench_multiturn_short.json"):
        print(f"\n## {name}\n\n" + capacity_table(name, [("on+shared vs on", "on+shared vs on")]))
    print("\n## contention\n\n" + contention_table("contention/contention.json"))
    print("\n## contention, decode's scheduler alone on a CPU\n\n"
          + contention_table("contention/contention_decode-scheduler.json"))
    print("\n## contention, only the main thread of decode's scheduler alone on a CPU\n\n"
          + contention_table("contention/contention_decode-step.json"))
    print("\n## decode's scheduler alone on a CPU vs sharing both (cpu_split/, alternating), then the whole decode "
          "server alone\n\n" + cpu_split_table([f"cpu_split/{p}_{i}/bench_multiturn_capacity.json" for i in (1, 2, 3)
                                               for p in ("shared", "decode-scheduler")]
                                              + ["cpu_split/decode_1/bench_multiturn_capacity.json"]))
    step_runs = ["decode-step_1", "shared_4", "decode-step_2", "shared_5", "decode-step_3", "shared_6", "decode-step_4",
                 "shared_7", "decode-step_5", "shared_8", "decode-step_6"]  # in the order they ran
    print("\n## only the main thread of decode's scheduler alone on a CPU (decode-step), alternating with shared runs\n\n"
          + cpu_split_table([f"cpu_split/{run}/bench_multiturn_capacity.json" for run in step_runs]))
