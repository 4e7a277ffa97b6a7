"""Shared by prof.py and steps.py: slice A of docs/trace.md (the first 400 requests of the public
conversation trace, default scaling) and a fresh pair of a bench/slo.py configuration, as bench_trace
starts it."""
import dataclasses
import statistics
from pathlib import Path

from sglang_pd.bench.fresh_run import config_deployment
from sglang_pd.bench.slo import parse_configs
from sglang_pd.bench.trace import TraceScaling, read_trace, scale, select
from sglang_pd.bench_trace import DEPLOYMENT
from sglang_pd.harness import PDDeployment

TRACE = "/work/traces/conversation_trace.jsonl"


def start(config_name: str, log_dir: str | None = None):
    """(started PDDeployment, slice A's scaled requests); the caller stops the pair."""
    config = parse_configs(config_name, None, None, 64)[0]
    deployment = config_deployment(config, DEPLOYMENT)
    if log_dir is not None:
        deployment = dataclasses.replace(deployment, log_dir=Path(log_dir))
    requests = scale(select(read_trace(TRACE), first=400), TraceScaling())
    return PDDeployment(deployment).start(), requests


def decode_server(dep: PDDeployment):
    return next(s for s in dep.servers if s.name.startswith("decode"))


def itl_mean_ms(replay) -> float:
    return 1000 * statistics.fmean(x for res in replay.results for x in res.itl_s)
