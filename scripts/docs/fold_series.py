"""Fold series of stored benchmark runs into one summary JSON per series (docs/results/<topic>/*_summary.json).

A series is a set of runs of one command (repeats, A/B pairs, earlier rounds) whose figures the pages quote
as rows of a table. Each run's folder held a JSON, a console log and two PNGs; the summary keeps, per run:

- `path`: the run's JSON (or log) as it was stored, and `files`: every file of the run that was folded;
- `commit`: the last commit that added or changed that file, where `git show <commit>:<path>` still
  reads every folded original;
- `command`: the log's first line when it names the command (`$ ...`, `=== HH:MM:SS ...`), else the
  command the measurement script or the page states (`command_source` says which);
- `report`: the run's JSON itself, with one change: every `recent_steps` list (decode's last 512 step
  samples `[running requests, running KV tokens, seconds]`) is replaced by `recent_steps_medians`, the
  median step in ms and the sample count for the running-request ranges the pages' tables use (1-8,
  24-32, 1-64), and `num_recent_steps`. A log-only run (kernel_ab) keeps its log's lines verbatim.

The originals are read from git (the commit above), not from the working tree, so the script gives the
same summaries after the originals were removed.

    python3 scripts/docs/fold_series.py            # (re)write every summary below
    python3 scripts/docs/fold_series.py --check    # exit 1 if a stored summary differs from what git gives
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEP_RANGES = ((1, 8), (24, 32), (1, 64))  # running-request ranges the tables' step medians use


@dataclass(frozen=True)
class Series:
    """One summary: `runs` are JSON (or log) paths in git, keyed in the summary by `key_base`-relative path."""

    out: str
    about: str
    key_base: str
    runs: tuple[str, ...]
    command: str = ""  # the stated command for runs whose log does not name it ({out_dir}: the run's folder)
    command_source: str = ""
    extra: dict = field(default_factory=dict)


def _runs(base: str, names, file: str) -> tuple[str, ...]:
    return tuple(f"{base}/{name}/{file}" for name in names)


LP, SP = "docs/local_prefill", "docs/shared_prefix"
SHORT_ON_LOCAL = (".venv/bin/python -m sglang_pd.bench_multiturn --preset short --configs on,on+local "
                  "--local-prefill-tokens 64 --out-dir {out_dir} --no-progress")
SERIES = (
    Series("docs/results/shared_prefix/repeats_summary.json",
           "off vs on+shared, capacity preset, repeated (runs 2-9 and 11-14; run 10 is itl_target/, kept)", SP,
           _runs(f"{SP}/repeats", [f"run{i}" for i in (*range(2, 10), *range(11, 15))], "bench_multiturn_capacity.json")),
    Series("docs/results/shared_prefix/cpu_split_summary.json",
           "off vs on+shared, capacity preset, decode's scheduler / step thread / server on a CPU of its own "
           "(--cpu-split) alternating with the default placement", SP,
           _runs(f"{SP}/cpu_split", [f"shared_{i}" for i in range(1, 9)] + [f"decode-scheduler_{i}" for i in (1, 2, 3)]
                 + [f"decode-step_{i}" for i in range(1, 7)] + ["decode_1"], "bench_multiturn_capacity.json")),
    Series("docs/results/shared_prefix/gather_backend_summary.json",
           "the previous round's shared-prefix backend (segments gathered per step; before the own-part C kernel): "
           "attention micro-benchmarks and multi-turn runs, moved to gather_backend/ in ed1cb23; cited by no page", SP,
           tuple(f"{SP}/gather_backend/{name}" for name in (
               "bench_attention.json", "bench_attention_scatter.json", "bench_attention_smollm2.json",
               "bench_multiturn_capacity.json", "itl/bench_multiturn_capacity.json",
               "smollm2/bench_multiturn_short.json", "smollm2_16clients/bench_multiturn_short.json")),
           command_source="none stored with these files: each report's settings / configs / workload say what ran"),
    Series("docs/results/shared_prefix/kernel_ab_summary.json",
           "fused-kernel partials (0329499 and later) against bmm + softmax + bmm (a4d0f43), alternating; "
           "cited by no page (the later own_kernel_ab/ is)", SP, (f"{SP}/kernel_ab/run.log",),
           command="bash docs/shared_prefix/kernel_ab/run.sh",
           command_source="the script's header (now scripts/probes/shared_prefix/kernel_ab/run.sh)"),
    Series("docs/results/local_prefill/repeats_summary.json",
           "on vs on+local, short preset, repeated (runs 2-13 and 18-25)", LP,
           _runs(f"{LP}/repeats", [f"run{i}" for i in (*range(2, 14), *range(18, 26))], "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/idle_wait_summary.json",
           "on vs on+local, short preset, PD schedulers spinning (SGLANG_PD_IDLE_WAIT_US=0) vs waiting (500), alternating",
           LP, _runs(f"{LP}/idle_wait", [f"{m}_{i}" for i in (1, 2, 3) for m in ("spin", "wait")],
                     "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/stages_summary.json",
           "on vs on+local, short preset, runs 14-17 with SGLang's per-stage latencies (sglang_stage_latency)", LP,
           _runs(f"{LP}/stages", [f"run{i}" for i in range(1, 5)], "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/transfer_nice_summary.json",
           "on vs on+local, short preset, prefill's transfer workers at nice 0 vs 19, alternating", LP,
           _runs(f"{LP}/transfer_nice", [f"nice{n}_{i}" for i in (1, 2, 3) for n in (0, 19)],
                 "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/decode_loop_summary.json",
           "on vs on+local, short preset, decode on SGLang's overlap loop vs its normal loop, alternating", LP,
           _runs(f"{LP}/decode_loop", [f"{m}_{i}" for i in (1, 2, 3) for m in ("overlap", "normal")],
                 "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/cpu_split_summary.json",
           "on vs on+local, short preset, default placement vs --cpu-split decode-scheduler, then decode-step", LP,
           _runs(f"{LP}/cpu_split", [f"{p}_{i}" for i in (1, 2, 3) for p in ("shared", "decode-scheduler")]
                 + [f"decode-step_{i}" for i in (1, 2, 3)], "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/ttft_split_summary.json",
           "on vs on+local, short preset, with the TTFT split at decode's tokenizer manager", LP,
           _runs(f"{LP}/ttft_split", [f"run{i}" for i in (1, 2, 3)], "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/answer_order_summary.json",
           "on vs on+local, short preset, with when the declined prefill half answered (local_prefill_answer)", LP,
           _runs(f"{LP}/answer_order", [f"run{i}" for i in (1, 2, 3)], "bench_multiturn_short.json")),
    Series("docs/results/local_prefill/via_router_summary.json",
           "on vs on+local through a stock sglang-router (--via-router) alternating with the direct client; "
           "short preset x 4 pairs, capacity preset once each way", LP,
           _runs(f"{LP}/via_router", [f"{v}_{i}" for i in (1, 2, 3, 4) for v in ("router", "direct")],
                 "bench_multiturn_short.json")
           + _runs(f"{LP}/via_router", ["capacity_direct", "capacity_router"], "bench_multiturn_capacity.json")),
    Series("docs/results/local_prefill/earlier_rounds_summary.json",
           "runs on earlier code kept for comparison: separate_extend/ (a local extend as its own forward, "
           "before the mixed forward) and baseline/ (upstream's torch_native extend on decode, round 1)", LP,
           (f"{LP}/separate_extend/bench_multiturn_short.json", f"{LP}/separate_extend/bench_multiturn_capacity.json",
            f"{LP}/separate_extend/sweep/bench_multiturn_short.json", f"{LP}/baseline/bench_multiturn_short.json"),
           command=("the short command of docs/local_prefill/README.md with `--out-dir docs/local_prefill/baseline`; "
                    "code: commit fc4c289 without its `outside the scheduler` figure (the page's words; the report's "
                    "`configs` list what ran)"),
           command_source="docs/local_prefill/README.md (baseline: its log does not name the command)"),
    Series("docs/results/recheck/recheck_summary.json",
           "re-check of the two open goals on 2026-11-27's final main: capacity off vs on+shared and short on vs "
           "on+local, twice each, alternating", "docs/recheck",
           _runs("docs/recheck", ["capacity_1", "capacity_2"], "bench_multiturn_capacity.json")
           + _runs("docs/recheck", ["short_1", "short_2"], "bench_multiturn_short.json")),
    Series("docs/results/evidence/speed_summary.json",
           "capacity off,on on the code before the seeded checkpoints (speed_old_*, dummy weights) and after "
           "(speed_new_*), alternating, twice each", "docs/models",
           _runs("docs/models", ["speed_old_1", "speed_new_1", "speed_old_2", "speed_new_2"],
                 "bench_multiturn_capacity.json"),
           command=("PYTHONPATH=<old checkout or this tree>/python .venv/bin/python -m sglang_pd.bench_multiturn "
                    "--no-progress --out-dir {out_dir} --preset capacity --configs off,on"),
           command_source="scripts/bench/models_rerun.sh (its run function; the console logs do not name it)"),
    Series("docs/results/benchmarks/upstream_vs_plugin/earlier_run_summary.json",
           "the upstream-vs-plugin capacity command on older code (before the plugin-less idle check and the merge "
           "of shared-prefix attention and decode-local prefill)", "docs/upstream_vs_plugin",
           ("docs/upstream_vs_plugin/earlier_run/bench_multiturn_capacity.json",),
           command=("python -m sglang_pd.bench_multiturn --preset capacity --configs off,on-upstream,on "
                    "--out-dir docs/upstream_vs_plugin"),
           command_source="docs/upstream_vs_plugin/README.md (\"the same capacity command on older code\")"),
)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def content_commit(path: str) -> str:
    """The last commit that added or changed `path` (its content is readable there)."""
    commit = git("log", "-1", "--format=%H", "--diff-filter=AMR", "--", path).strip()
    if not commit:
        raise SystemExit(f"{path}: no commit holds it")
    return commit


def run_files(path: str, commit: str) -> list[str]:
    """Every file of the run: the stored files in the JSON's folder named after its stem (json, log, the
    PNGs `_summary` / `_slo` / `_pareto`), and a console.log beside it; never a script."""
    folder, stem = path.rsplit("/", 1)[0], Path(path).stem
    names = git("ls-tree", "--name-only", commit, folder + "/").split()
    own = {stem + suffix for suffix in ("", "_summary", "_slo", "_pareto")}
    return sorted(n for n in names if Path(n).name.split(".")[0] in own and Path(n).suffix not in (".py", ".sh")
                  or Path(n).name == "console.log")


def stated_command(files: list[str], commit: str, series: Series, path: str) -> tuple[str | None, str]:
    """The command from the run's log when its first line names it, else the series' stated one."""
    for log in (f for f in files if f.endswith(".log")):
        first = git("show", f"{commit}:{log}").splitlines()[:1]
        if first and first[0].startswith("$ "):
            return first[0][2:], f"first line of {log}"
        if first and first[0].startswith("=== ") and " .venv/" in first[0]:
            return first[0].split(" ", 2)[2], f"first line of {log}"
    if series.command:
        return series.command.format(out_dir=path.rsplit("/", 1)[0]), series.command_source
    return None, series.command_source


def step_medians(steps: list) -> dict:
    """Median decode step (ms) and sample count per running-request range; None where no sample falls."""
    out = {}
    for lo, hi in STEP_RANGES:
        ms = [s[2] * 1000 for s in steps if lo <= s[0] <= hi]
        out[f"{lo}-{hi}"] = [statistics.median(ms), len(ms)] if ms else None
    return out


def slim(node):
    """`node` with every recent_steps list replaced by its medians (see the module docstring)."""
    if isinstance(node, dict):
        out = {k: slim(v) for k, v in node.items() if k != "recent_steps"}
        if isinstance(node.get("recent_steps"), list):
            out["recent_steps_medians"] = step_medians(node["recent_steps"])
            out["num_recent_steps"] = len(node["recent_steps"])
        return out
    if isinstance(node, list):
        return [slim(v) for v in node]
    return node


def fold(series: Series) -> dict:
    runs = {}
    for path in series.runs:
        commit = content_commit(path)
        files = run_files(path, commit)
        command, source = stated_command(files, commit, series, path)
        entry = {"path": path, "files": files, "commit": commit, "command": command, "command_source": source}
        text = git("show", f"{commit}:{path}")
        if path.endswith(".json"):
            entry["report"] = slim(json.loads(text))
        else:
            entry["log_lines"] = text.splitlines()
        runs[path[len(series.key_base) + 1:]] = entry
    return {"about": series.about, "folded_by": "python3 scripts/docs/fold_series.py",
            "read_originals": "git show <commit>:<path> (each run's commit and files below)",
            "recent_steps_medians": "decode step ms, median and samples, per running-request range "
                                    "(replaces the 512 stored samples)", "runs": runs}


def stored_run(results: Path, name: str) -> dict:
    """The stored report of run `name`: its JSON under `results`, else its entry in a summary this script
    wrote there (the render_tables scripts read folded runs through this)."""
    path = results / name
    if path.exists():
        return json.loads(path.read_text())
    for summary in sorted(results.glob("*_summary.json")):
        runs = json.loads(summary.read_text())["runs"]
        if name in runs:
            return runs[name]["report"]
    raise FileNotFoundError(f"{name}: neither under {results} nor in a summary there")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    stale = []
    for series in SERIES:
        text = json.dumps(fold(series), indent=1) + "\n"
        out = ROOT / series.out
        if args.check:
            if not out.exists() or out.read_text() != text:
                stale.append(series.out)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {series.out}: {len(series.runs)} runs, {len(text) // 1024} KiB")
    if stale:
        print("differs from its originals: " + ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
