"""Markdown tables of docs/local_prefill.md, read from the stored JSONs (no figure typed by hand).

    .venv/bin/python scripts/probes/local_prefill/render_tables.py [JSON ...]

Runs are named by their path under docs/results/local_prefill/ as they were stored (e.g.
`repeats/run2/bench_multiturn_short.json`); a run folded into one of that folder's *_summary.json files
(scripts/docs/fold_series.py) is read from there.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
from fold_series import stored_run  # noqa: E402 (scripts/docs is not a package)

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results" / "local_prefill"


def load(name: str) -> dict:
    """The stored report of run `name` under RESULTS (folded runs read from their summary)."""
    return stored_run(RESULTS, name)


def label(name: str) -> str:
    """A run's name in a table: its folder under RESULTS."""
    return name.rsplit("/", 1)[0] if "/" in name else "main run"
COLUMNS = ("TTFT p50 (s)", "TTFT p90 (s)", "ITL p50 (ms)", "req/s", "served locally", "local extends (mixed)",
           "prefill tokens computed", "prefill tokens computed for declined", "KV pages moved", "identical to off")


def extends(r: dict) -> str:
    """Local extends run and how many inside a decode step ('-' without a threshold; runs before the
    mixed forward existed did not record them)."""
    b = r.get("decode_local_prefill")
    if not b:
        return "-"
    if b.get("num_extends") is None:
        return "not recorded"
    return f"{b['num_extends']} ({b['num_mixed_extends']})"


def row(name: str, r: dict, identical: dict) -> str:
    same = "ref" if name == identical["reference"] else f"{identical['counts'].get(name, 0)}/{identical['num_outputs']}"
    return (f"| {name} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['itl_p50_ms']:.1f} | "
            f"{r['request_throughput']:.2f} | {r['local_requests']}/{r['requests']} | {extends(r)} | "
            f"{r['prefill_computed_tokens']:.0f} | "
            f"{r['prefill_declined_computed_tokens']:.0f} | {r['kv_pages_transferred']:.0f} | {same} |")


def main_table(report: dict) -> str:
    lines = ["| config | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [row(name, r, report["identical_outputs"]) for name, r in report["results"].items()]
    return "\n".join(lines)


def breakdown_table(report: dict) -> str:
    lines = ["| config | TTFT p50 local / PD (ms) | receipt -> decided local | queued | extend -> joined "
             "| outside the scheduler |", "|---|---|---|---|---|---|"]
    for name, r in report["results"].items():
        b = r.get("decode_local_prefill")
        if not b:
            continue
        cell = lambda k: f"{b[k]['p50']:.1f} / {b[k]['p90']:.1f}" if k in b else "not recorded"  # noqa: E731
        ms = lambda s: f"{1000 * s:.1f}" if s else "-"  # noqa: E731
        lines.append(f"| {name} | {ms(r['ttft_p50_local_s'])} / {ms(r['ttft_p50_pd_s'])} | "
                     f"{cell('admitted_ms')} | {cell('queued_ms')} | {cell('extend_to_join_ms')} | "
                     f"{cell('outside_scheduler_ms')} |")
    return "\n".join(lines)


def sweep_table(report: dict) -> str:
    lines = ["| threshold | TTFT p50 (s) | TTFT p90 (s) | ITL p50 (ms) | req/s | served locally | prefill tokens "
             "computed | KV pages moved |", "|---|---|---|---|---|---|---|---|"]
    for threshold, r in sorted(report["local_sweep"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {threshold} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | {r['itl_p50_ms']:.1f} | "
                     f"{r['request_throughput']:.2f} | {r['local_requests']}/{r['requests']} | "
                     f"{r['prefill_computed_tokens']:.0f} | {r['kv_pages_transferred']:.0f} |")
    return "\n".join(lines)


def per_run_table(columns: list[str], names: list[str], row) -> str:
    """Markdown: a `run` column and `columns`; one row per run, cells from `row(its results)`."""
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in names:
        cells = row(load(name)["results"])
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ttft_split_table(paths: list[str]) -> str:
    """Mean TTFT at the client vs at decode's tokenizer manager (bench/report.ttft_split), on and on+local,
    one row per run."""
    from sglang_pd.bench.report import ttft_split

    def row(results: dict) -> list[str]:
        on, local = ttft_split(results["on"]), ttft_split(results["on+local"])
        inside = sum(results["on+local"]["decode_local_prefill"][k]["p50"]
                     for k in ("admitted_ms", "queued_ms", "extend_to_join_ms"))
        return [f"{on[k]:.1f} / {local[k]:.1f}" for k in ("client", "decode_server", "http_and_client")] + [
                f"{inside:.1f}"]

    return per_run_table(["client TTFT, mean ms: on / on+local", "decode's tokenizer manager (SGLang's TTFT histogram)",
                          "the rest: client, HTTP in and out", "on+local's local path inside decode's scheduler, p50"],
                         paths, row)


def answer_order_table(paths: list[str]) -> str:
    """Local requests whose declined prefill half answered at the client before their first token, per run."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{1000 * seconds:.1f}"

    def row(results: dict) -> list[str]:
        order = results["on+local"]["local_prefill_answer"]
        return [f"{order['num_before']} of {order['num_timed']}",
                f"{ms(order['ttft_p50_before_s'])} / {ms(order['ttft_p50_after_s'])}", ms(order["answer_minus_ttft_p50_s"])]

    return per_run_table(["prefill's answer before the first token", "TTFT p50 of those / of the others (ms)",
                          "answer minus first token, p50 (ms)"], paths, row)


def on_vs_local_table(paths: list[str]) -> str:
    """TTFT p50 and ITL p50, on vs on+local, one row per run (the goals' two ratios)."""
    lines = ["| run | TTFT p50 on / on+local (s) | TTFT gain | ITL p50 on / on+local (ms) | on+local ITL vs on "
             "| outside decode's scheduler, p50 (ms) | identical |", "|---|---|---|---|---|---|---|"]
    for path in paths:
        report = load(path)
        on, local = report["results"]["on"], report["results"]["on+local"]
        ident = report["identical_outputs"]
        outside = (local.get("decode_local_prefill") or {}).get("outside_scheduler_ms", {}).get("p50")
        lines.append(f"| {label(path)} | "
                     f"{on['ttft_p50_s']:.3f} / {local['ttft_p50_s']:.3f} | {on['ttft_p50_s'] / local['ttft_p50_s']:.2f}x | "
                     f"{on['itl_p50_ms']:.1f} / {local['itl_p50_ms']:.1f} | {local['itl_p50_ms'] / on['itl_p50_ms']:.2f}x | "
                     f"{outside:.1f} | {ident['counts'].get('on+local', '-')}/{ident['num_outputs']} |")
    return "\n".join(lines)


def pd_hop_table(paths: list[str]) -> str:
    """Per run: TTFT p50 on vs on+local, where on's PD requests spent time (SGLang's per-stage histograms,
    mean ms) and where on+local's local requests did (decode's per-request records, p50 ms)."""
    lines = ["| run | TTFT p50 on / on+local (ms) | gain | on: decode's handshake / transfer info sent -> KV "
             "arrived / prebuilt step (mean) | within it, prefill: waits for transfer info / queued / forward / "
             "KV transfer (mean) | on+local: decided local / queued / extend -> joined / outside (p50) |",
             "|---|---|---|---|---|---|"]
    for path in paths:
        results = load(path)["results"]
        on, local = results["on"], results["on+local"]
        mean = lambda role, stage: on["sglang_stage_latency"][role][stage]["mean_ms"]  # noqa: E731
        b = local["decode_local_prefill"]
        lines.append(
            f"| {label(path)} | {1000 * on['ttft_p50_s']:.1f} / {1000 * local['ttft_p50_s']:.1f} | "
            f"{on['ttft_p50_s'] / local['ttft_p50_s']:.2f}x | {mean('decode', 'decode_bootstrap'):.1f} / "
            f"{mean('decode', 'decode_transferred'):.1f} / {mean('decode', 'fake_output'):.1f} | "
            f"{mean('prefill', 'prefill_bootstrap'):.1f} / {mean('prefill', 'queue_time'):.1f} / "
            f"{mean('prefill', 'prefill_forward'):.1f} / {mean('prefill', 'prefill_transfer_kv_cache'):.1f} | "
            + " / ".join(f"{b[k]['p50']:.1f}" for k in ("admitted_ms", "queued_ms", "extend_to_join_ms",
                                                         "outside_scheduler_ms")) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    SHORT = "bench_multiturn_short.json"

    def runs(folder: str, names) -> list[str]:
        return [f"{folder}/{name}/{SHORT}" for name in names]

    print("\n## on vs on+local, short preset, every run with the default idle wait\n")
    print(on_vs_local_table([SHORT] + runs("repeats", [f"run{i}" for i in (2, 3, 4, 5)])
                            + runs("idle_wait", [f"wait_{i}" for i in (1, 2, 3)])))
    print("\n## runs 6-13, after 5f3d9bb (prefill's mooncake transfer workers at nice 19)\n")
    print(on_vs_local_table(runs("repeats", [f"run{i}" for i in range(6, 14)])))
    print("\n## the same, PD schedulers spinning (SGLANG_PD_IDLE_WAIT_US=0), alternating with the wait_* runs\n")
    print(on_vs_local_table(runs("idle_wait", [f"spin_{i}" for i in (1, 2, 3)])))
    stage_runs = runs("stages", [f"run{i}" for i in (1, 2, 3, 4)])
    print("\n## runs 14-17 (stages/, after 9ef0b8d)\n")
    print(on_vs_local_table(stage_runs))
    nice_runs = runs("transfer_nice", [f"nice{n}_{i}" for i in (1, 2, 3) for n in (0, 19)])
    print("\n## prefill's transfer workers at nice 0 vs 19, alternating (transfer_nice/)\n")
    print(on_vs_local_table(nice_runs) + "\n\n" + pd_hop_table(nice_runs))
    loop_runs = runs("decode_loop", [f"{loop}_{i}" for i in (1, 2, 3) for loop in ("overlap", "normal")])
    print("\n## decode on SGLang's overlap loop (default) vs its normal loop, alternating (decode_loop/)\n")
    print(on_vs_local_table(loop_runs) + "\n\n" + pd_hop_table(loop_runs))
    split_runs = runs("cpu_split", [f"{place}_{i}" for i in (1, 2, 3) for place in ("shared", "decode-scheduler")]
                      + [f"decode-step_{i}" for i in (1, 2, 3)])
    print("\n## every process on both CPUs vs decode's scheduler alone on one, alternating, then its main thread "
          "alone (cpu_split/)\n")
    print(on_vs_local_table(split_runs) + "\n\n" + pd_hop_table(split_runs))
    print("\n## runs 18-25 (repeats/, 2026-11-26, main after eb353e7; 18-21 ran beside a read-only audit of the README)\n")
    print(on_vs_local_table(runs("repeats", [f"run{i}" for i in range(18, 26)])))
    split_paths = runs("ttft_split", [f"run{i}" for i in (1, 2, 3)])
    print("\n## TTFT at the client vs at decode's tokenizer manager (ttft_split/)\n")
    print(on_vs_local_table(split_paths) + "\n\n" + ttft_split_table(split_paths))
    order_paths = runs("answer_order", [f"run{i}" for i in (1, 2, 3)])
    print("\n## when the declined prefill half answered, against the first token (answer_order/)\n")
    print(on_vs_local_table(order_paths) + "\n\n" + answer_order_table(order_paths))
    via_paths = runs("via_router", [f"{via}_{i}" for i in (1, 2, 3, 4) for via in ("router", "direct")])
    print("\n## through a stock sglang-router (--via-router) vs the direct client, alternating (via_router/)\n")
    print(on_vs_local_table(via_paths) + "\n\n" + ttft_split_table(via_paths))
    print("\n## where the time goes: on's PD hop by SGLang's stages vs on+local's local path (stages/)\n")
    print(pd_hop_table(stage_runs))
    given = [(str(p), json.loads(Path(p).read_text())) for p in sys.argv[1:]]
    for name, report in given or [(n, load(n)) for n in (SHORT, "bench_multiturn_capacity.json", f"sweep/{SHORT}")]:
        print(f"\n## {name}\n")
        print(sweep_table(report) if report["local_sweep"] else main_table(report))
        if not report["local_sweep"] and any(r.get("decode_local_prefill") for r in report["results"].values()):
            print("\n" + breakdown_table(report))
