"""Sessions under an SLA: per configuration, the largest replay speedup at which the slice's p95 TTFT
stays under a target, and the arrival rate that speedup offers.

The search (`search`): a probe replays the whole chosen slice at one speedup and passes when its p95
TTFT (nearest rank over every request, a failed or refused one counting as infinite) is at most the
target. From the starting speedup it doubles while probes pass (halves while they fail) until it has
a passing and a failing speedup, then bisects between them geometrically (the midpoint of the
ratio), stopping at `max_probes` probes or when the two are within `precision` of each other.

What it is and is not, stated in the report:
- the answer is a bracket (largest passing, smallest failing speedup): the threshold lies between;
  one probe per speedup on a shared, noisy box, so neighbouring probes can disagree;
- every probe of a configuration runs on the deployment its measured run used, after that run: not a
  fresh pair each (six starts a configuration would cost more than the probes). Before each probe the
  pair must be idle and clean, and the probe's prompts are drawn with a token seed of its own
  (scaling seed + 1000 + probe number), so no probe finds the measured run's or an earlier probe's
  prefixes in either server's cache; the caches do still hold those entries (evictable), as a server
  that has been running would; the measured run started from empty caches.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from sglang_pd.bench.fresh_run import clean_after_run
from sglang_pd.bench.trace import TraceRequest, TraceScaling, scale
from sglang_pd.bench.trace_replay import offered_rps, replay, ttft_quantile
from sglang_pd.harness import PDDeployment

PROBE_SEED_OFFSET = 1000


@dataclass(frozen=True)
class Probe:
    """One replay of the search."""

    speedup: float
    ttft_p95_s: float      # infinite when more than 5% of the requests failed or were refused
    passed: bool
    num_failed: int        # failed or refused
    offered_rps: float | None


@dataclass(frozen=True)
class SlaResult:
    """The bracket the search found; `max_speedup` None when even the slowest probe failed."""

    target_s: float
    max_speedup: float | None
    min_failing_speedup: float | None   # None when every probe passed
    offered_rps: float | None           # at max_speedup
    probes: tuple[Probe, ...]

    def as_dict(self) -> dict:
        """JSON form (infinite p95 as None)."""
        out = dataclasses.asdict(self)
        for probe in out["probes"]:
            probe["ttft_p95_s"] = None if math.isinf(probe["ttft_p95_s"]) else probe["ttft_p95_s"]
        return out


def next_speedup(passing: float | None, failing: float | None) -> float:
    """Where to probe next: double the best pass, halve the lowest fail, else their geometric midpoint."""
    if passing is None:
        return failing / 2
    if failing is None:
        return passing * 2
    return math.sqrt(passing * failing)


def search(probe: Callable[[float], Probe], start: float, target_s: float, max_probes: int = 6,
           precision: float = 1.1) -> SlaResult:
    """Run probes (module docstring) from speedup `start`; returns the bracket and every probe made."""
    if start <= 0 or max_probes < 1 or precision <= 1:
        raise ValueError(f"need start > 0, max_probes >= 1, precision > 1 (got {start}, {max_probes}, {precision})")
    probes: list[Probe] = []
    passing = failing = None
    speedup = start
    while len(probes) < max_probes:
        result = probe(speedup)
        probes.append(result)
        if result.passed:
            passing = speedup if passing is None else max(passing, speedup)
        else:
            failing = speedup if failing is None else min(failing, speedup)
        if passing is not None and failing is not None and failing / passing <= precision:
            break
        speedup = next_speedup(passing, failing)
    at_best = next((p.offered_rps for p in probes if p.speedup == passing), None)
    return SlaResult(target_s, passing, failing, at_best, tuple(probes))


def deployment_probe(dep: PDDeployment, requests: list[TraceRequest], scaling: TraceScaling, target_s: float,
                     timeout_s: float = 600) -> Callable[[float], Probe]:
    """A probe function replaying `requests` on `dep`'s router (module docstring: fresh token seed per
    probe, the pair checked idle and clean first; raises RuntimeError when it is not)."""
    count = [0]

    def probe(speedup: float) -> Probe:
        count[0] += 1
        clean = clean_after_run(dep)
        if not clean["clean"]:
            raise RuntimeError(f"SLA probe {count[0]}: the pair is not idle and clean: {clean['detail'][:600]}")
        scaled = scale(requests, dataclasses.replace(scaling, seed=scaling.seed + PROBE_SEED_OFFSET + count[0]))
        seen = replay(dep.router.url, scaled, speedup, timeout_s)
        p95 = ttft_quantile(seen.results, 95)
        return Probe(speedup, p95, p95 <= target_s, sum(not r.ok for r in seen.results), offered_rps(scaled, speedup))

    return probe
