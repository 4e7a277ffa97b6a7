"""The trace benchmark's report: per-run rows, the spread over repeats, ratios to a baseline
configuration, TTFT and ITL CDFs. Pure functions of the run summaries (bench/trace_replay.py)."""

from __future__ import annotations

import statistics

from sglang_pd.bench.report import pyplot

# (summary key, label, format): the figures of every run, in the order the tables show them.
FIGURES = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}"), ("ttft_p90_s", "TTFT p90 (s)", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}"), ("itl_p50_ms", "ITL p50 (ms)", "{:.1f}"),
    ("itl_p90_ms", "ITL p90 (ms)", "{:.1f}"), ("request_throughput", "req/s", "{:.2f}"),
    ("failed", "failed", "{:.0f}"), ("refused", "refused", "{:.0f}"),
    ("decode_hit_rate", "decode hit rate", "{:.3f}"), ("kv_pages_transferred", "KV pages moved", "{:.0f}"),
    ("prefill_computed_tokens", "prefill tokens computed", "{:.0f}"),
    ("slo_attainment", "SLO attainment", "{:.3f}"), ("goodput", "goodput (req/s)", "{:.2f}"),
]
# Figures a ratio to a baseline is given for: not counts of failures (0 / 0), nor the decode hit rate (off's
# is 0 and on-upstream does not expose it: never a ratio to either baseline).
RATIO_KEYS = [key for key, _, _ in FIGURES if key not in ("failed", "refused", "decode_hit_rate")]
BASELINES = ("off", "on-upstream")


def _cell(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _figures(runs: dict[str, list[dict]]) -> list[tuple[str, str, str]]:
    """FIGURES that some run has (the SLO ones only when the runs were scored)."""
    return [f for f in FIGURES if any(f[0] in r for rs in runs.values() for r in rs)]


def median_or_none(values: list) -> float | None:
    """Median of `values`; None when any is None (a figure a configuration does not expose)."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


def spread(runs: list[dict], keys: list[str]) -> dict[str, dict | None]:
    """min / median / max of each key over the repeats of one configuration (None where not exposed)."""
    out = {}
    for key in keys:
        values = [r.get(key) for r in runs]
        out[key] = None if median_or_none(values) is None else {
            "min": min(values), "median": statistics.median(values), "max": max(values)}
    return out


def numeric_keys(run: dict) -> list[str]:
    """The summary fields that are figures: numbers (bools excluded), or None where not exposed."""
    return [k for k, v in run.items() if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))]


def medians(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per configuration, the median over its repeats of every numeric summary field (report.format_table
    reads these as one run's figures); None where a figure is not exposed."""
    out = {}
    for name, rs in runs.items():
        out[name] = {k: median_or_none([r.get(k) for r in rs]) for k in numeric_keys(rs[0])}
        out[name]["sglang_pd_counters"] = {k: median_or_none([(r.get("sglang_pd_counters") or {}).get(k) for r in rs])
                                           for k in (rs[0].get("sglang_pd_counters") or {})} or None
    return out


def ratios(figures: dict[str, dict], baseline: str) -> dict[str, dict[str, float | None]]:
    """Each configuration's figure divided by `baseline`'s (median figures, `medians`): plain ratios,
    below 1 = smaller (better for TTFT, ITL, pages, prefill tokens; worse for req/s, hit rate,
    attainment, goodput). None where either side is missing or the baseline is 0. {} without baseline."""
    if baseline not in figures:
        return {}
    base = figures[baseline]
    return {name: {key: (f[key] / base[key] if f.get(key) is not None and base.get(key) else None)
                   for key in RATIO_KEYS if key in base}
            for name, f in figures.items() if name != baseline}


def format_runs(runs: dict[str, list[dict]]) -> str:
    """Markdown: one row per run (configuration, repeat), one column per figure."""
    figures = _figures(runs)
    lines = ["| configuration | run | " + " | ".join(label for _, label, _ in figures) + " |",
             "|" + "---|" * (len(figures) + 2)]
    for name, rs in runs.items():
        for number, run in enumerate(rs, start=1):
            cells = [_cell(run.get(key), fmt) for key, _, fmt in figures]
            lines.append(f"| {name} | {number} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_spread(runs: dict[str, list[dict]]) -> str:
    """Markdown: one row per configuration, each figure as min / median / max over its repeats."""
    figures = _figures(runs)
    lines = ["| configuration (repeats) | " + " | ".join(label for _, label, _ in figures) + " |",
             "|" + "---|" * (len(figures) + 1)]
    for name, rs in runs.items():
        stats = spread(rs, [key for key, _, _ in figures])
        cells = ["n/a" if stats[key] is None else
                 " / ".join(fmt.format(stats[key][s]) for s in ("min", "median", "max")) for key, _, fmt in figures]
        lines.append(f"| {name} ({len(rs)}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_ratios(table: dict[str, dict], baseline: str) -> str:
    """Markdown: `ratios` to `baseline`, one column per other configuration; empty without it."""
    if not table:
        return ""
    names = list(table)
    labels = {key: label for key, label, _ in FIGURES}
    keys = [k for k in RATIO_KEYS if any(k in table[n] for n in names)]
    lines = [f"| figure / {baseline} | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for key in keys:
        cells = ["n/a" if table[n].get(key) is None else f"{table[n][key]:.2f}x" for n in names]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cdf(ax, values: list[float], label: str) -> None:
    if values:
        ordered = sorted(values)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)


def plot_cdfs(runs: dict[str, list[dict]], path: str) -> None:
    """PNG: TTFT and ITL CDFs, one line per configuration (its repeats' requests pooled)."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rs in runs.items():
        _cdf(ax1, [v for r in rs for v in r["ttft_samples_s"]], name)
        _cdf(ax2, [v for r in rs for v in r["itl_samples_ms"]], name)
    ax1.set(title="TTFT CDF (client, through the router)", xlabel="seconds", ylabel="share of requests")
    ax2.set(title="ITL CDF (client)", xlabel="ms", ylabel="share of gaps", xscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_trace(stats: dict, scaled: dict, scaling: dict, slice_text: str, speedup: float) -> str:
    """The lines that say what was replayed: the slice's own figures, then the scaling and what it gives."""
    kept = "every block" if scaling["max_blocks"] is None else f"at most {scaling['max_blocks']} blocks"
    return (f"trace slice {slice_text}: {stats['requests']} requests over {stats['duration_s']:.1f} s, input p50 "
            f"{stats['input_p50']:.0f} tokens, output p50 {stats['output_p50']:.0f}, infinite-cache block hit rate "
            f"{stats['block_hit_rate']:.3f} ({stats['distinct_blocks']} distinct of {stats['blocks']} blocks)\n"
            f"scaled: block {scaling['block_tokens']} tokens, {kept} "
            f"({scaled['num_cut_to_max_blocks']} requests cut), output // {scaling['output_div']} in "
            f"[{scaling['output_min']}, {scaling['output_max']}], token seed {scaling['seed']}; sent: input p50 "
            f"{scaled['input_p50']:.0f} (max {scaled['input_max']}), output p50 {scaled['output_p50']:.0f}, "
            f"{scaled['input_tokens']} prompt tokens, {scaled['distinct_block_tokens']} distinct block tokens; "
            f"speedup {speedup:g}x")


# The figures issue 42's gate holds a configuration to against `off`, round by round (lower is better).
GATE_KEYS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_ms", "itl_p90_ms")


def round_verdicts(runs: dict[str, list[dict]], baseline: str = "off") -> dict[str, list[dict]]:
    """Per configuration other than `baseline`, per round (the i-th run of each; bench_trace runs every
    configuration once per round), its ratio to the baseline's run of the same round for each of
    GATE_KEYS and whether it was no worse on all of them (ratio <= 1). Rounds one of the two lacks (a start
    failure) are left out. Empty without the baseline. Pure."""
    if baseline not in runs:
        return {}
    out = {}
    for name, rs in runs.items():
        if name == baseline:
            continue
        rows = []
        for number, (run, base) in enumerate(zip(rs, runs[baseline]), start=1):
            ratio = {k: run[k] / base[k] for k in GATE_KEYS if run.get(k) is not None and base.get(k)}
            rows.append({"round": number, "ratios": ratio,
                         "no_worse": len(ratio) == len(GATE_KEYS) and all(r <= 1.0 for r in ratio.values())})
        out[name] = rows
    return out


def format_round_verdicts(verdicts: dict[str, list[dict]], baseline: str = "off") -> str:
    """Markdown: each configuration's per-round ratios to `baseline` and how many rounds were no worse."""
    if not verdicts:
        return ""
    labels = {key: label for key, label, _ in FIGURES}
    lines = [f"| configuration / {baseline}, same round | round | " + " | ".join(labels[k] for k in GATE_KEYS)
             + " | no worse on all |", "|" + "---|" * (len(GATE_KEYS) + 3)]
    for name, rows in verdicts.items():
        for row in rows:
            cells = [f"{row['ratios'][k]:.2f}x" if k in row["ratios"] else "n/a" for k in GATE_KEYS]
            lines.append(f"| {name} | {row['round']} | " + " | ".join(cells) + f" | {'yes' if row['no_worse'] else 'no'} |")
        lines.append(f"| {name} | all | " + " | ".join("" for _ in GATE_KEYS)
                     + f" | {sum(r['no_worse'] for r in rows)} of {len(rows)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """`python -m sglang_pd.bench.trace_report bench_trace.json`: the round-by-round table of a stored run."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("json", help="a bench_trace.json")
    args = p.parse_args(argv)
    with open(args.json) as f:
        runs = json.load(f)["runs"]
    print(format_round_verdicts(round_verdicts(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
