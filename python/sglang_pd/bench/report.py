"""Statistics of a benchmark run and the side-by-side report (table, JSON, plots)."""

from __future__ import annotations

import statistics
from typing import Sequence

from sglang_pd.bench.multiturn_workload import RequestRecord


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(records: list[RequestRecord], duration_s: float, transfer: dict) -> dict:
    """Figures of one configuration. `transfer`: prefill counter deltas (pages, bytes, computed tokens,
    declined requests and the tokens prefill had computed for them)."""
    ok = [r.result for r in records if r.result.ok]
    local = [r for r in ok if r.meta_info.get("decode_prefill_path") == "decode_local"]
    ttft = [r.ttft_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    prompt_tokens = sum(r.prompt_len for r in ok)
    hit_tokens = sum(int(r.meta_info.get("decode_prefix_len", 0) or 0) for r in ok)
    rounds = sorted({rec.round for rec in records})
    per_round = {}
    for rnd in rounds:
        rs = [rec.result for rec in records if rec.round == rnd and rec.result.ok]
        per_round[rnd + 1] = {
            "ttft_p50_s": percentile([r.ttft_s for r in rs], 50),
            "hit_rate": (sum(int(r.meta_info.get("decode_prefix_len", 0) or 0) for r in rs)
                         / max(1, sum(r.prompt_len for r in rs))),
        }
    rejected = sum(bool(r.result.rejected) for r in records)
    return {
        "requests": len(records), "failed": len(records) - len(ok) - rejected,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
        "itl_mean_ms": 1000 * statistics.fmean(itl) if itl else 0.0, "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p90_ms": 1000 * percentile(itl, 90),
        "request_throughput": len(ok) / duration_s if duration_s else 0.0,
        "output_token_throughput": sum(len(r.output_ids) for r in ok) / duration_s if duration_s else 0.0,
        "prompt_tokens": prompt_tokens, "decode_hit_tokens": hit_tokens,
        "decode_hit_rate": hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        "kv_pages_transferred": transfer.get("pages", 0), "kv_bytes_transferred": transfer.get("bytes", 0),
        "prefill_computed_tokens": transfer.get("computed_tokens", 0),
        "prefill_declined": transfer.get("declined", 0),
        "prefill_declined_computed_tokens": transfer.get("declined_computed_tokens", 0),
        "local_requests": len(local),
        "local_prefill_tokens": sum(int(r.meta_info.get("decode_local_prefill_tokens", 0) or 0) for r in local),
        "duration_s": duration_s, "per_round": per_round,
    }


# (key, label, format, ratio direction: "down" = OFF/ON is the gain, "up" = ON/OFF is the gain)
ROWS = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}", "down"), ("ttft_p90_s", "TTFT p90 (s)", "{:.3f}", "down"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}", "down"), ("itl_mean_ms", "ITL mean (ms)", "{:.1f}", "down"),
    ("itl_p50_ms", "ITL p50 (ms)", "{:.1f}", "down"),
    ("request_throughput", "request throughput (req/s)", "{:.2f}", "up"),
    ("output_token_throughput", "output throughput (tok/s)", "{:.1f}", "up"),
    ("decode_hit_rate", "decode hit rate", "{:.3f}", None),
    ("kv_pages_transferred", "KV pages transferred", "{:.0f}", "down"),
    ("kv_bytes_transferred", "KV bytes transferred", "{:.0f}", "down"),
    ("prefill_computed_tokens", "prefill tokens computed (prefill's counter)", "{:.0f}", "down"),
    ("failed", "failed requests", "{:.0f}", None),
]
# Shown when some configuration served requests with decode-local prefill.
LOCAL_ROWS = [
    ("local_requests", "requests served decode-locally", "{:.0f}", None),
    ("local_prefill_tokens", "prompt tokens computed on decode", "{:.0f}", None),
    ("prefill_declined", "prefill halves declined", "{:.0f}", None),
    ("prefill_declined_computed_tokens", "prefill tokens computed for declined requests", "{:.0f}", None),
]
# Gain columns, when both configurations ran: (baseline, compared).
GAINS = [("off", "on"), ("on", "on+local")]
# Shown when the run was scored against SLO targets (bench/slo.py).
SLO_ROWS = [
    ("rejected", "rejected requests (503, retried)", "{:.0f}", None),
    ("slo_attainment", "SLO attainment", "{:.3f}", "up"),
    ("goodput", "goodput (req/s meeting SLO)", "{:.2f}", "up"),
]


def _ratio(off: float, on: float, direction: str | None) -> str:
    if direction is None or not off or not on:
        return ""
    value = off / on if direction == "down" else on / off
    return f"{value:.2f}x"


def format_table(results: dict[str, dict]) -> str:
    """Markdown table, one column per configuration, plus a gain column per GAINS pair that ran."""
    names = list(results)
    gains = [(base, other) for base, other in GAINS if base in results and other in results]
    head = "| metric | " + " | ".join(names + [f"gain ({other} vs {base})" for base, other in gains]) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1 + len(gains))]
    rows = ROWS + (SLO_ROWS if all("slo_attainment" in r for r in results.values()) else [])
    rows += LOCAL_ROWS if any(r.get("local_requests") for r in results.values()) else []
    for key, label, fmt, direction in rows:
        cells = [fmt.format(results[n].get(key, 0)) for n in names]
        cells += [_ratio(results[base].get(key, 0), results[other].get(key, 0), direction) for base, other in gains]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (benchmarks run headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: dict[str, dict], path: str) -> None:
    """PNG: per-round TTFT p50 and decode hit rate for each configuration."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, res in results.items():
        rounds = sorted(int(r) for r in res["per_round"])
        ax1.plot(rounds, [res["per_round"][r]["ttft_p50_s"] for r in rounds], marker="o", label=name)
        ax2.plot(rounds, [res["per_round"][r]["hit_rate"] for r in rounds], marker="o", label=name)
    ax1.set(title="TTFT p50 per round", xlabel="round", ylabel="seconds")
    ax2.set(title="decode hit rate per round", xlabel="round", ylabel="reused / prompt tokens", ylim=(0, 1))
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_summary(results: dict[str, dict], path: str) -> None:
    """PNG: TTFT p50, ITL p50 and request throughput side by side, one bar per configuration."""
    plt = pyplot()
    names = list(results)
    panels = (("ttft_p50_s", "TTFT p50 (s)"), ("itl_p50_ms", "ITL p50 (ms)"), ("request_throughput", "requests / s"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels):
        bars = ax.bar(names, [results[n][key] for n in names], color=[f"C{i}" for i in range(len(names))])
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set(title=title)
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
