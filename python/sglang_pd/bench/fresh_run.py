"""One benchmark configuration on a PD deployment of its own: started, measured by the caller's
function, checked idle and clean, stopped whatever happens. A pair that does not start becomes a
`StartFailure` (its servers' error lines) instead of figures; ports a server lost to another socket
while starting were moved by the harness and are listed with the figures (`port_rebinds`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from sglang_pd.bench.slo import BenchConfig
from sglang_pd.bench.start_failure import StartFailure
from sglang_pd.harness import DeploymentConfig, PDDeployment, ServerStartError


def config_deployment(config: BenchConfig, base: dict, **overrides) -> DeploymentConfig:
    """The DeploymentConfig that runs `config`: `base` (DeploymentConfig fields, e.g. a preset's), then
    `overrides` whose value is not None (command-line flags left unset keep the base's value)."""
    fields = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    return DeploymentConfig(decode_radix=config.decode_radix, env_overrides=config.env, plugin=config.plugin,
                            decode_attention_backend=config.decode_attention_backend,
                            prefill_attention_backend=config.prefill_attention_backend, **fields)


class BackgroundStops:
    """Stops deployments in threads, so the next configuration starts while the last one shuts down
    (SGLang takes ~5 s to drain and exit, idle on the CPU). Context manager: leaving it waits for every
    stop and raises the first error one of them raised."""

    def __init__(self):
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def add(self, dep: PDDeployment) -> None:
        def stop():
            try:
                dep.stop()
            except BaseException as exc:  # re-raised by join()
                self._errors.append(exc)
        thread = threading.Thread(target=stop, name=f"stop-{dep.log_dir.name}")
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]

    def __enter__(self) -> "BackgroundStops":
        return self

    def __exit__(self, *exc) -> None:
        self.join()


def run_fresh(name: str, deployment: DeploymentConfig, measure: Callable[[PDDeployment], tuple[dict, dict]],
              stops: BackgroundStops | None = None) -> tuple[dict | StartFailure, dict]:
    """Start a fresh deployment, call `measure(dep)` -> (summary, outputs), then record in the summary
    whether the pair went idle and clean (`clean_after_run`), how long it took to start and the ports
    moved meanwhile; stop it whatever happens (in `stops` when given, else before returning). Returns
    (summary, outputs), or (StartFailure, {}) when a server of the pair does not start."""
    t0 = time.perf_counter()
    dep = PDDeployment(deployment)
    try:
        dep.start()
    except ServerStartError as exc:
        print(f"[{name}] PD pair did not start (logs {dep.log_dir})", file=sys.stderr)
        return StartFailure.from_servers(name, dep.servers, dep.log_dir, exc), {}
    try:
        startup_s = time.perf_counter() - t0
        print(f"[{name}] PD pair up in {startup_s:.0f}s (logs {dep.log_dir})", file=sys.stderr)
        summary, outputs = measure(dep)
        summary["clean_after_run"] = clean_after_run(dep)
        summary["startup_s"] = startup_s
        summary["port_rebinds"] = [{"server": s, "flag": f, "taken": old, "new": new}
                                   for s, f, old, new in dep.port_rebinds]
        return summary, outputs
    finally:
        if stops is None:
            dep.stop()
        else:
            stops.add(dep)


def clean_after_run(dep: PDDeployment, timeout_s: float = 60) -> dict:
    """Whether the pair went idle and clean after the run (PDDeployment.wait_clean), not raised:
    a leak is a finding to record beside the figures."""
    try:
        reports = dep.wait_clean(timeout_s=timeout_s)
        return {"clean": True, "checked_by": {name: "sglang_pd integrity check" if "integrity" in r else
                                              "SGLang /v1/loads + idle-check log (lock owners not checkable)"
                                              for name, r in reports.items()}}
    except AssertionError as exc:
        return {"clean": False, "detail": str(exc)[:2000]}
