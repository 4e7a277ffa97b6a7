"""What SGLang itself shows about a running server: for deployments whose servers run without sglang_pd
(no /sglang_pd/stats, no decode_prefix_len), and for figures comparable with and without the plugin.

- `idle_report()`: idleness from SGLang's GET /v1/loads (no request in any queue, no KV token held
  outside the tree's evictable part) plus the warnings of SGLang's own idle pool check in the log.
- `metric_totals()`: SGLang's Prometheus samples on /metrics, summed over their labels.
- `stage_latencies()`: SGLang's per-stage request latency totals on /metrics (where a PD request's time
  goes, by SGLang's own timestamps).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, NamedTuple

import requests

# Lines SGLang's idle invariant check (scheduler_components/invariant_checker.py) logs on a violation.
LEAK_MARKERS = ("memory leak detected", "KV double free", "KV page use-after-free")
# What the sglang_pd integrity check covers that nothing upstream exposes.
NOT_CHECKED = ("lock owners, double or unknown releases (sglang_pd's lock ledger); upstream shows only "
               "token and request counts")

_LOAD_COUNTS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens")
_DISAGG_QUEUES = ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs", "decode_prealloc_queue_reqs",
                  "decode_transfer_queue_reqs", "decode_retracted_queue_reqs")
_QUEUES = ("waiting", "paused", "retracted", "prealloc_ready")


def load(url: str, timeout: float = 30) -> dict:
    """SGLang's load snapshot of the server's (first) data-parallel rank: GET /v1/loads."""
    resp = requests.get(url + "/v1/loads", timeout=timeout)
    resp.raise_for_status()
    return resp.json()["loads"][0]


def busy_counts(snapshot: dict) -> dict[str, int]:
    """The non-zero request and token counts of a /v1/loads snapshot (empty: idle).

    num_used_tokens = total - free - evictable: KV held by running or in-flight requests or by a tree
    lock never released. Idle with nothing held means 0."""
    counts = {name: snapshot[name] for name in _LOAD_COUNTS}
    counts.update({f"disaggregation.{n}": snapshot["disaggregation"][n] for n in _DISAGG_QUEUES})
    counts.update({f"queues.{n}": snapshot["queues"][n] for n in _QUEUES})
    return {name: value for name, value in counts.items() if value}


def leak_warnings(log_path: Path) -> list[str]:
    """Lines of a server log where SGLang's idle check reported a pool invariant violation."""
    if not Path(log_path).exists():
        return []
    lines = Path(log_path).read_text(errors="replace").splitlines()
    return [line for line in lines if any(marker in line for marker in LEAK_MARKERS)]


def idle_report(url: str, log_path: Path) -> dict:
    """Whether a server without sglang_pd is idle and clean, from what SGLang exposes.

    `idle`: /v1/loads shows no request anywhere and no KV token held; `ok`: no leak warning in the log.
    `not_checked` names what only the sglang_pd integrity check can see."""
    snapshot = load(url)
    busy, leaks = busy_counts(snapshot), leak_warnings(log_path)
    return {"idle": not busy, "ok": not leaks, "busy": busy, "leak_warnings": leaks[:5],
            "max_total_num_tokens": snapshot["max_total_num_tokens"], "not_checked": NOT_CHECKED}


def metric_totals(url: str, names: tuple[str, ...], timeout: float = 30) -> dict[str, float]:
    """The value of each Prometheus sample `name` on the server's /metrics, summed over its label sets.

    A name with no sample is 0.0: SGLang's labelled counters appear at their first increment."""
    totals = dict.fromkeys(names, 0.0)
    for name, _, value in _samples(requests.get(url + "/metrics", timeout=timeout).text):
        if name in totals:
            totals[name] += value
    return totals


def _samples(metrics_text: str) -> Iterator[tuple[str, str, float]]:
    """(name, label text without braces, value) of each sample line of a Prometheus text; comments skipped."""
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        yield name, labels.rstrip("}"), float(value)


# SGLang's per-stage request latency histogram (observability/req_time_stats.py `RequestStage`), one label
# set per stage; and its queue-time histogram, the one place a prefill request's wait for a forward shows.
STAGE_METRIC = "sglang:per_stage_req_latency_seconds"
QUEUE_METRIC = "sglang:queue_time_seconds"
QUEUE_STAGE = "queue_time"  # the name `stage_latencies` files QUEUE_METRIC under
_STAGE_LABEL = re.compile(r'(?:^|,)stage="([^"]*)"')


class LatencyTotal(NamedTuple):
    """A histogram's running totals: seconds observed and number of observations."""

    sum_s: float
    count: float


def parse_stage_latencies(metrics_text: str) -> dict[str, LatencyTotal]:
    """Per stage, the totals of SGLang's per-stage histogram in a /metrics text, summed over the other
    labels (ranks); the queue-time histogram under QUEUE_STAGE. Pure; a stage never observed is absent."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for name, labels, value in _samples(metrics_text):
        for suffix, into in (("_sum", sums), ("_count", counts)):
            if name == STAGE_METRIC + suffix:
                match = _STAGE_LABEL.search(labels)
                if match is None:
                    raise ValueError(f"{name} sample without a stage label: {{{labels}}}")
                stage = match.group(1)
            elif name == QUEUE_METRIC + suffix:
                stage = QUEUE_STAGE
            else:
                continue
            into[stage] = into.get(stage, 0.0) + value
    return {stage: LatencyTotal(sums.get(stage, 0.0), counts[stage]) for stage in counts}


def stage_latencies(url: str, timeout: float = 30) -> dict[str, LatencyTotal]:
    """`parse_stage_latencies` of the server's /metrics now (SGLang's --enable-metrics)."""
    resp = requests.get(url + "/metrics", timeout=timeout)
    resp.raise_for_status()
    return parse_stage_latencies(resp.text)
