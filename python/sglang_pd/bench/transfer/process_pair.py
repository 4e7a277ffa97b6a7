"""One transport's run: a spawned target + initiator pair on this host, reaped however it ends."""

from __future__ import annotations

import multiprocessing as mp

from sglang_pd.bench.transfer.buffers import VerificationError
from sglang_pd.bench.transfer.initiator import initiator_main
from sglang_pd.bench.transfer.layout import Case, Geometry
from sglang_pd.bench.transfer.results import Row, Skip
from sglang_pd.bench.transfer.target import target_main
from sglang_pd.bench.transfer.transports import MODES


def _reap(procs: list) -> None:
    """Join our own child processes; terminate (then kill) any that outlive a grace period."""
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _spawn_pair(kind: str, geom: Geometry, cases: list[Case], repeats: int, timeout_s: float):
    """Start target and initiator; returns ([target, initiator], the result pipe's receiving end)."""
    ctx = mp.get_context("spawn")
    init_end, target_end = ctx.Pipe()
    result_recv, result_send = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=target_main, args=(kind, target_end, geom, timeout_s),
                         name=f"bench-{kind}-target", daemon=True),
             ctx.Process(target=initiator_main, name=f"bench-{kind}-initiator", daemon=True,
                         args=(kind, init_end, result_send, geom, cases, repeats, timeout_s))]
    for proc in procs:
        proc.start()
    for end in (init_end, target_end, result_send):
        end.close()
    return procs, result_recv


def run_backend(kind: str, geom: Geometry, cases: list[Case], repeats: int,
                timeout_s: float, budget_s: float) -> list[Row] | Skip:
    """Spawn target + initiator for one transport; its rows, or a Skip saying why there are none.

    Raises VerificationError when a transfer delivered wrong bytes. Both children are reaped before
    it returns."""
    procs, result_recv = _spawn_pair(kind, geom, cases, repeats, timeout_s)
    label = MODES[kind][0][0]
    try:
        if not result_recv.poll(budget_s):
            return Skip(label, f"no result within {budget_s:.0f} s (stopped)", failed=True)
        status, payload = result_recv.recv()
    except EOFError:
        return Skip(label, f"initiator died (exit code {procs[1].exitcode})", failed=True)
    finally:
        _reap(procs)
    if status == "ok":
        return [Row(**row) for row in payload]
    if status == "verify_failed":
        raise VerificationError(f"{label}: {payload}")
    return Skip(label, payload.strip(), failed=status != "missing")
