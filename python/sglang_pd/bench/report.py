"""Statistics of a benchmark run and the side-by-side report (table, JSON, plots)."""

from __future__ import annotations

import os
import platform
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


def _hit_tokens(results) -> int:
    return sum(int(r.meta_info.get("decode_prefix_len", 0) or 0) for r in results)


def summarize(records: list[RequestRecord], duration_s: float, transfer: dict | None) -> dict:
    """Figures of one configuration. `transfer`: prefill counter deltas (pages, bytes, computed tokens,
    declined requests and the tokens prefill had computed for them), None where sglang_pd is not
    loaded (those figures are then None). Decode hit figures come from the decode_prefix_len sglang_pd
    adds to meta_info: None (not 0) when no response carries it."""
    ok = [r.result for r in records if r.result.ok]
    local = [r for r in ok if r.meta_info.get("decode_prefill_path") == "decode_local"]
    ttft = [r.ttft_s for r in ok]
    itl = [g for r in ok for g in r.itl_s]
    prompt_tokens = sum(r.prompt_len for r in ok)
    has_hits = any("decode_prefix_len" in r.meta_info for r in ok)
    hit_tokens = _hit_tokens(ok) if has_hits else None
    rounds = sorted({rec.round for rec in records})
    per_round = {}
    for rnd in rounds:
        rs = [rec.result for rec in records if rec.round == rnd and rec.result.ok]
        per_round[rnd + 1] = {
            "ttft_p50_s": percentile([r.ttft_s for r in rs], 50),
            "hit_rate": _hit_tokens(rs) / max(1, sum(r.prompt_len for r in rs)) if has_hits else None,
        }
    rejected = sum(bool(r.result.rejected) for r in records)
    return {
        "requests": len(records), "failed": len(records) - len(ok) - rejected,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0,
        "itl_mean_ms": 1000 * statistics.fmean(itl) if itl else 0.0, "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p90_ms": 1000 * percentile(itl, 90),
        "request_throughput": len(ok) / duration_s if duration_s else 0.0,
        "output_token_throughput": sum(len(r.output_ids) for r in ok) / duration_s if duration_s else 0.0,
        "prompt_tokens": prompt_tokens, "decode_hit_tokens": hit_tokens,
        "decode_hit_rate": None if hit_tokens is None else hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        **_prefill_figures(transfer),
        "local_requests": len(local),
        "local_prefill_tokens": sum(int(r.meta_info.get("decode_local_prefill_tokens", 0) or 0) for r in local),
        "ttft_p50_local_s": percentile([r.ttft_s for r in local], 50),
        "ttft_p50_pd_s": percentile([r.ttft_s for r in ok if r.meta_info.get("decode_prefill_path") != "decode_local"], 50),
        "local_prefill_answer": prefill_answer_order(local),
        "duration_s": duration_s, "per_round": per_round,
        "errors": sorted({r.result.error for r in records if not r.result.ok and not r.result.rejected})[:5],
    }


def identical_outputs(outputs: dict[str, dict]) -> dict:
    """Greedy outputs of every run (name -> request key -> token ids) compared with the reference run's
    (`off`, else the first): how many of the reference's requests each run answered the same."""
    if not outputs:
        return {"reference": None, "num_outputs": 0, "counts": {}}
    ref = "off" if "off" in outputs else next(iter(outputs))
    return {"reference": ref, "num_outputs": len(outputs[ref]),
            "counts": {name: sum(outputs[ref][k] == out.get(k) for k in outputs[ref])
                       for name, out in outputs.items() if name != ref}}


def machine() -> str:
    """One line describing this box, for the report's header."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()} {os.cpu_count()} cores, {mem_gib:.0f} GiB, no GPU, Python {platform.python_version()}"


def prefill_answer_order(results) -> dict | None:
    """For requests served decode-locally: how many had prefill's (declined) half answered at the client
    before decode's first token, and the TTFT p50 of those and of the others (s). None without any."""
    timed = [r for r in results if r.prefill_answer_s is not None]
    if not timed:
        return None
    before = [r.ttft_s for r in timed if r.prefill_answer_s < r.ttft_s]
    after = [r.ttft_s for r in timed if r.prefill_answer_s >= r.ttft_s]
    return {"num_before": len(before), "num_timed": len(timed),
            "ttft_p50_before_s": percentile(before, 50) if before else None,
            "ttft_p50_after_s": percentile(after, 50) if after else None,
            "answer_minus_ttft_p50_s": percentile([r.prefill_answer_s - r.ttft_s for r in timed], 50)}


def _prefill_figures(transfer: dict | None) -> dict:
    """Prefill's counter deltas as summary fields; all None without sglang_pd (`transfer` None)."""
    keys = {"kv_pages_transferred": "pages", "kv_bytes_transferred": "bytes",
            "prefill_computed_tokens": "computed_tokens", "prefill_declined": "declined",
            "prefill_declined_computed_tokens": "declined_computed_tokens"}
    return {field: None if transfer is None else transfer.get(key, 0) for field, key in keys.items()}


def local_breakdown(snapshot: dict | None, ttft_by_rid: dict[str, float]) -> dict | None:
    """Where the TTFT of requests served decode-locally goes, p50/p90 in ms, from decode's per-request
    records: receipt by the scheduler -> decided local (`admitted_ms`: handshake, match, lock,
    preallocation), decided -> extend planned (`queued_ms`), extend planned -> joined the running batch
    (`extend_to_join_ms`: the extend forward and its result; the first token is streamed inside it).
    `outside_scheduler_ms` = client TTFT minus the three (HTTP, tokenizer, detokenizer, client; slightly
    low, as the join comes a little after the first token is streamed). Also how many local extends ran
    and how many of them inside a decode step (mixed). None when the run had no threshold."""
    if not snapshot or not snapshot.get("threshold"):
        return None
    records = {rid: r for rid, r in snapshot["requests"].items() if r["state"] == "joined"}
    stages = ("admitted_ms", "queued_ms", "extend_to_join_ms")
    values = {key: [r[key] for r in records.values() if r.get(key) is not None] for key in stages}
    values["outside_scheduler_ms"] = [1000 * ttft_by_rid[rid] - sum(r[k] for k in stages)
                                      for rid, r in records.items()
                                      if rid in ttft_by_rid and all(r.get(k) is not None for k in stages)]
    out = {"num_joined": len(records), "num_extends": snapshot.get("num_extends"),
           "num_mixed_extends": snapshot.get("num_mixed_extends")}
    out.update({key: {"p50": percentile(v, 50), "p90": percentile(v, 90)} for key, v in values.items()})
    return out


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
# Shown when the run read the servers' figures (bench/server_figures.py): SGLang's own metrics, then
# sglang_pd's decode counters (n/a where the plugin is not loaded).
SERVER_ROWS = [
    ("sglang_kv_transfer_mb", "KV MB sent (SGLang kv_transfer_total_mb)", "{:.1f}", "down"),
    ("sglang_retracted_requests", "decode retractions (SGLang)", "{:.0f}", None),
    ("sglang_eviction_passes", "decode eviction passes (SGLang)", "{:.0f}", None),
    ("sglang_evicted_tokens", "decode tokens evicted (SGLang)", "{:.0f}", None),
]
PLUGIN_ROWS = [
    ("admission_rounds_total", "admission rounds (sglang_pd)", "{:.0f}", None),
    ("admission_round_evictions_total", "admission-round evictions (sglang_pd)", "{:.0f}", None),
    ("resume_requests_total", "radix-aware resumes (sglang_pd)", "{:.0f}", None),
    ("resume_restored_tokens_total", "tokens restored on resume (sglang_pd)", "{:.0f}", None),
    ("resume_backup_tokens_total", "tokens a full restore copies (sglang_pd)", "{:.0f}", None),
]
# Shown when some configuration served requests with decode-local prefill.
LOCAL_ROWS = [
    ("local_requests", "requests served decode-locally", "{:.0f}", None),
    ("local_prefill_tokens", "prompt tokens computed on decode", "{:.0f}", None),
    ("prefill_declined", "prefill halves declined", "{:.0f}", None),
    ("prefill_declined_computed_tokens", "prefill tokens computed for declined requests", "{:.0f}", None),
]
# Gain columns "gain (compared vs baseline)", when both configurations ran: (baseline, compared).
GAINS = [("off", "on"), ("off", "on-upstream"), ("on-upstream", "on"), ("on", "on+local")]
NOT_EXPOSED = ("n/a: not exposed without sglang_pd (upstream SGLang 0.5.23 has no decode_prefix_len in "
               "meta_info and no /sglang_pd/stats)")
# Shown when the run was scored against SLO targets (bench/slo.py).
SLO_ROWS = [
    ("rejected", "rejected requests (503, retried)", "{:.0f}", None),
    ("slo_attainment", "SLO attainment", "{:.3f}", "up"),
    ("goodput", "goodput (req/s meeting SLO)", "{:.2f}", "up"),
]


# SGLang's per-stage latencies (bench/server_figures.py), in a PD request's order: (role, stage, what).
STAGES = [
    ("decode", "decode_prepare", "decode: receipt -> preallocation queue"),
    ("decode", "decode_bootstrap", "decode: handshake, match, lock, preallocation"),
    ("prefill", "prefill_bootstrap", "prefill: waits for decode's transfer info"),
    ("prefill", "queue_time", "prefill: queued for a forward"),
    ("prefill", "prefill_forward", "prefill: forward"),
    ("prefill", "prefill_transfer_kv_cache", "prefill: KV transfer"),
    ("decode", "decode_transferred", "decode: transfer info sent -> KV arrived"),
    ("decode", "decode_waiting", "decode: waiting queue (KV arrived, or queued locally) -> first forward"),
    ("decode", "fake_output", "decode: prebuilt step (first token out)"),
]


def format_stages(results: dict[str, dict]) -> str:
    """Markdown table of SGLang's per-stage latencies: mean ms (requests) per configuration; '-' where no
    request of the run passed the stage. Empty when no run carries them."""
    def cell(name: str, role: str, stage: str) -> str:
        seen = results[name]["sglang_stage_latency"][role].get(stage)
        return "-" if seen is None else f"{seen['mean_ms']:.1f} ({seen['count']})"

    names = [n for n, r in results.items() if r.get("sglang_stage_latency")]
    return _stage_table("stage (SGLang's per-stage histogram), mean ms (requests)", names,
                        [(label, [cell(n, role, stage) for n in names]) for role, stage, label in STAGES])


# decode's per-request records of its local requests (`local_breakdown`), in their order: (key, what).
LOCAL_STAGES = [
    ("admitted_ms", "receipt -> decided local (handshake, match, lock, preallocation, decline sent)"),
    ("queued_ms", "queued for the extend"),
    ("extend_to_join_ms", "extend planned -> joined the running batch (first token streamed inside)"),
    ("outside_scheduler_ms", "outside decode's scheduler (client TTFT minus the three above)"),
]


def format_local_stages(results: dict[str, dict]) -> str:
    """Markdown table of where the decode-local requests' TTFT went: p50 / p90 ms per configuration that
    served any locally. Empty when none did."""
    names = [n for n, r in results.items() if (r.get("decode_local_prefill") or {}).get("num_joined")]
    breakdowns = [results[n]["decode_local_prefill"] for n in names]
    return _stage_table("decode-local requests (sglang_pd's records), p50 / p90 ms", names,
                        [(label, [f"{b[key]['p50']:.1f} / {b[key]['p90']:.1f}" for b in breakdowns])
                         for key, label in LOCAL_STAGES])


def ttft_split(result: dict) -> dict | None:
    """A run's mean TTFT split at decode's tokenizer manager, in ms: `client` (the benchmark's clock),
    `decode_server` (SGLang's TTFT histogram on decode: request received by its tokenizer manager ->
    first token back from the scheduler; the scheduler's work and the ZMQ hops to it and from it) and
    `http_and_client` (the rest: the client's send and parse, HTTP in and out, the tokenizer manager's
    streaming write). None when decode observed no first token in the run (metrics off)."""
    count = result.get("sglang_decode_ttft_count") or 0
    if count <= 0 or not result.get("ttft_mean_s"):
        return None
    client, server = 1000 * result["ttft_mean_s"], 1000 * result["sglang_decode_ttft_sum_s"] / count
    return {"client": round(client, 3), "decode_server": round(server, 3),
            "http_and_client": round(client - server, 3), "count": int(count)}


def format_ttft_split(results: dict[str, dict]) -> str:
    """Markdown table of `ttft_split` per configuration that has one; empty when none has."""
    splits = {n: ttft_split(r) for n, r in results.items()}
    names = [n for n, split in splits.items() if split]
    rows = [("client TTFT", "client"),
            ("decode's tokenizer manager: request in -> first token back (SGLang's TTFT histogram)", "decode_server"),
            ("the rest: client, HTTP in and out, the streaming write", "http_and_client")]
    return _stage_table("TTFT, mean ms", names, [(label, [f"{splits[n][key]:.1f}" for n in names])
                                                 for label, key in rows])


def format_prefill_answer(results: dict[str, dict]) -> str:
    """One line per configuration with local requests timed: how many had prefill's declined half answered
    at the client before their first token, and the TTFT p50 of those and of the others."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{1000 * seconds:.1f} ms"

    lines = []
    for name, result in results.items():
        order = result.get("local_prefill_answer")
        if order:
            lines.append(f"[{name}] prefill's declined half answered before decode's first token for "
                         f"{order['num_before']} of {order['num_timed']} local requests; TTFT p50 of those "
                         f"{ms(order['ttft_p50_before_s'])}, of the others {ms(order['ttft_p50_after_s'])}; "
                         f"answer minus first token, p50 {ms(order['answer_minus_ttft_p50_s'])}")
    return "\n".join(lines)


def _stage_table(title: str, names: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """Markdown: one column per configuration in `names`, one row per (label, cells); empty without names."""
    if not names:
        return ""
    lines = [f"| {title} | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    return "\n".join(lines + [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows])


def _ratio(off: float | None, on: float | None, direction: str | None) -> str:
    if direction is None or not off or not on:
        return ""
    value = off / on if direction == "down" else on / off
    return f"{value:.2f}x"


def _value(result: dict, key: str):
    """A row's value: summary fields first, then the run's sglang_pd counters (None where absent)."""
    if key in result:
        return result[key]
    return (result.get("sglang_pd_counters") or {}).get(key)


DIGEST_ROWS = [
    ("kv_digest_ms_per_request", "KV digest ms per request (prefill + decode)", "{:.3f}", None),
    ("kv_digest_share_of_ttft_p50", "KV digest / TTFT p50", "{:.4%}", None),
]


def _rows(results: dict[str, dict]) -> list:
    rows = list(ROWS)
    if any(r.get("kv_digest_ms_per_request") for r in results.values()):
        rows += DIGEST_ROWS
    if all("sglang_kv_transfer_mb" in r for r in results.values()):
        rows += SERVER_ROWS + PLUGIN_ROWS
    if all("slo_attainment" in r for r in results.values()):
        rows += SLO_ROWS
    if any(r.get("local_requests") for r in results.values()):
        rows += LOCAL_ROWS
    return rows


def format_table(results: dict[str, dict]) -> str:
    """Markdown table, one column per configuration, plus a gain column per GAINS pair that ran;
    a figure a configuration does not expose reads n/a (footnote NOT_EXPOSED)."""
    names = list(results)
    gains = [(base, other) for base, other in GAINS if base in results and other in results]
    head = "| metric | " + " | ".join(names + [f"gain ({other} vs {base})" for base, other in gains]) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1 + len(gains))]
    missing = False
    for key, label, fmt, direction in _rows(results):
        values = {n: _value(results[n], key) for n in names}
        missing |= any(v is None for v in values.values())
        cells = ["n/a" if values[n] is None else fmt.format(values[n]) for n in names]
        cells += [_ratio(values[base], values[other], direction) for base, other in gains]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ([f"\n{NOT_EXPOSED}"] if missing else []))


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
        if res["decode_hit_rate"] is not None:  # n/a without sglang_pd: no line rather than zeros
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
