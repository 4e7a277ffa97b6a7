"""Open-loop replay of a scaled trace (bench/trace.py) through a stock sglang-router in PD mode.

Every request leaves at its `send_at_s / speedup` after the replay starts, whether or not earlier
ones have answered: the servers meet the trace's arrivals, not a client that waits (closed loop would
slow the arrivals down exactly when the servers fall behind, and hide it). Each is streamed greedy
with ignore_eos (pd_client.router_stream_async), so TTFT and the inter-token gaps are the client's
own clock, router hop included. All requests run as tasks on the client's one asyncio loop; how late
each left against its schedule is recorded (`send_lag_s`: the client's own delay on a box it shares
with the servers). A request decode refuses (503, early rejection) is not retried: it is counted as
refused. A request gets `timeout_s` to finish, then counts as failed.

`measure_replay` runs one replay on a started deployment and returns its summary (the client's
figures, the servers' deltas: bench/server_figures.py) and its outputs by request index.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable

from tqdm import tqdm

from sglang_pd.bench.multiturn_workload import RequestRecord
from sglang_pd.bench.pd_client import StreamResult, router_stream, router_stream_async, run_on_client_loop
from sglang_pd.bench.report import percentile
from sglang_pd.bench.server_figures import ServerFigures
from sglang_pd.bench.slo import SloTargets
from sglang_pd.bench.trace import ScaledRequest
from sglang_pd.harness import PDDeployment

WARMUP_PROMPT = [1] + list(range(3, 66))  # starts with id 1, which no scaled trace prompt holds: never a prefix of one


@dataclass(frozen=True)
class Replay:
    """What one replay saw at the client."""

    results: list[StreamResult]  # in the slice's order
    duration_s: float            # first send -> last answer
    send_lag_s: list[float]      # per request: how late it left against its schedule


def _report_done(task: asyncio.Task, on_done: Callable[[StreamResult], None]) -> None:
    """Done callback: hand a finished request's result on (a task that raised is raised by gather)."""
    if not task.cancelled() and task.exception() is None:
        on_done(task.result())


async def _replay(router_url: str, requests: list[ScaledRequest], speedup: float, timeout_s: float,
                  on_done: Callable[[StreamResult], None]) -> Replay:
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks, lags = [], []
    for request in requests:
        due = start + request.send_at_s / speedup
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        lags.append(max(0.0, loop.time() - due))
        task = asyncio.create_task(router_stream_async(router_url, request.input_ids, request.output_len, timeout_s))
        task.add_done_callback(lambda t: _report_done(t, on_done))
        tasks.append(task)
    results = await asyncio.gather(*tasks)
    return Replay(list(results), loop.time() - start, lags)


def replay(router_url: str, requests: list[ScaledRequest], speedup: float, timeout_s: float = 600,
           on_done: Callable[[StreamResult], None] = lambda r: None) -> Replay:
    """Send every request open loop (module docstring) and wait for all; blocks the caller. Raises only
    for the client's own errors (a server's failure is in the request's StreamResult)."""
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    last_send = requests[-1].send_at_s / speedup
    return run_on_client_loop(_replay(router_url, requests, speedup, timeout_s, on_done),
                              timeout=last_send + timeout_s + 120)


def warm_up(router_url: str) -> None:
    """One short request outside the trace before the measured replay (connections, the first batch),
    unmeasured; raises RuntimeError if it fails: the deployment cannot serve the replay."""
    result = router_stream(router_url, WARMUP_PROMPT, 4)
    if not result.ok:
        raise RuntimeError(f"warm-up request through the router failed: {result.error}")


def ttft_quantile(results: list[StreamResult], q: float) -> float:
    """The q-th percentile TTFT (s, nearest rank: the ceil(q% of n)-th smallest) over every request, a
    failed or refused one counting as infinite: more than (100 - q)% of them failed, and it is infinite."""
    if not results or not 0 < q <= 100:
        raise ValueError(f"need requests and 0 < q <= 100 (got {len(results)} requests, q={q})")
    ordered = sorted(r.ttft_s if r.ok else math.inf for r in results)
    return ordered[math.ceil(q / 100 * len(ordered)) - 1]


def offered_rps(requests: list[ScaledRequest], speedup: float) -> float | None:
    """Arrivals per second the replay offers: (n - 1) / (last send - first send); None for one instant."""
    span_s = (requests[-1].send_at_s - requests[0].send_at_s) / speedup
    return (len(requests) - 1) / span_s if span_s > 0 else None


def measure_replay(dep: PDDeployment, requests: list[ScaledRequest], speedup: float, label: str, progress: bool,
                   slo: SloTargets | None = None, timeout_s: float = 600) -> tuple[dict, dict[int, list[int]]]:
    """Warm up, replay `requests` through `dep`'s router, summarize. Returns (summary, outputs by index)."""
    warm_up(dep.router.url)
    figures = ServerFigures(dep.prefill.url, dep.decodes[0].url)
    before = figures.snapshot()
    bar = tqdm(total=len(requests), desc=label, disable=not progress, file=sys.stderr)
    cpu_start = time.process_time()
    seen = replay(dep.router.url, requests, speedup, timeout_s, on_done=lambda r: bar.update(1))
    bar.close()
    records = [RequestRecord(r.index, 0, result) for r, result in zip(requests, seen.results)]
    summary = figures.summarize_run(records, seen.duration_s, before, slo, time.process_time() - cpu_start)
    ok = [r for r in seen.results if r.ok]
    summary.update({
        "refused": sum(bool(r.rejected) for r in seen.results),
        "ttft_p95_s": percentile([r.ttft_s for r in ok], 95),
        "ttft_p95_failed_as_inf_s": ttft_quantile(seen.results, 95),
        "offered_rps": offered_rps(requests, speedup),
        "send_lag_p50_ms": 1000 * percentile(seen.send_lag_s, 50),
        "send_lag_max_ms": 1000 * max(seen.send_lag_s),
        "ttft_samples_s": [round(r.ttft_s, 6) for r in ok],
        "itl_samples_ms": [round(1000 * g, 4) for r in ok for g in r.itl_s],
    })
    summary.pop("per_round")  # summarize's per-round figures: a trace has no rounds (all are round 0)
    return summary, {r.index: result.output_ids for r, result in zip(requests, seen.results) if result.ok}
