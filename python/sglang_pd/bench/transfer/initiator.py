"""The initiator process of a pair: owns the source buffers, times verified WRITEs of every case.

Timed per transfer: descriptor build + the endpoint's write (setup + transfer + wait); the target's
verify comes after the clock stops. One untimed warm-up precedes the `repeats` timed transfers.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import asdict

from sglang_pd.bench.transfer.buffers import VerificationError, make_buffers
from sglang_pd.bench.transfer.descriptors import case_descriptors
from sglang_pd.bench.transfer.layout import Case, Geometry
from sglang_pd.harness.endpoints.loopback import apply_env
from sglang_pd.bench.transfer.pipe import call_target, recv_within
from sglang_pd.bench.transfer.results import Row, make_row
from sglang_pd.bench.transfer.transports import ENDPOINTS, MODES, Endpoint


def measure(ep: Endpoint, tconn, geom: Geometry, case: Case, label: str, coalesce: bool,
            addrs: tuple[list[int], list[int]], repeats: int, timeout_s: float) -> Row:
    """One warm-up + `repeats` timed, verified transfers of `case` through endpoint `ep`."""
    totals, setups, descs = [], [], 0
    for i in range(repeats + 1):
        call_target(tconn, timeout_s, "clear", case.page_size, case.dst_pages)
        tag = f"{label}/{case.page_size}/{case.tokens}/{i}".encode()
        t0 = time.perf_counter()
        local, remote = case_descriptors(geom, case, coalesce, addrs)
        built = time.perf_counter()
        setup = ep.write(local, remote, tag, timeout_s) + (built - t0)
        total = time.perf_counter() - t0
        call_target(tconn, timeout_s, "verify", tag, case)
        descs = len(local)
        if i:
            totals.append(total)
            setups.append(setup)
    return make_row(label, geom, case, descs, totals, setups)


def initiator_main(kind: str, tconn, rconn, geom: Geometry, cases: list[Case],
                   repeats: int, timeout_s: float) -> None:
    """Initiator process: owns the source buffers, WRITEs every case, sends rows (or why not) back.

    Sends exactly one message on rconn: ("ok", row dicts), ("verify_failed" | "missing" | "error",
    message); always tells the target to stop and closes its endpoint."""
    apply_env()
    ep = None
    try:
        bufs = make_buffers(geom, pattern=True)
        ep = ENDPOINTS[kind](f"bench-init-{os.getpid()}", bufs)
        status, info = recv_within(tconn, timeout_s, "target ready")
        if status != "ready":
            raise RuntimeError(f"target failed to start:\n{info}")
        ep.connect(info)
        addrs = ([b.ctypes.data for b in bufs], info["addrs"])
        rows = [measure(ep, tconn, geom, case, label, coalesce, addrs, repeats, timeout_s)
                for case in cases for label, coalesce in MODES[kind]]
        rconn.send(("ok", [asdict(row) for row in rows]))     # plain dicts: no class pickling
    except VerificationError as exc:
        rconn.send(("verify_failed", str(exc)))
    except ImportError as exc:
        rconn.send(("missing", f"{type(exc).__name__}: {exc}"))
    except BaseException:
        rconn.send(("error", traceback.format_exc()))
    finally:
        try:
            tconn.send(("stop",))
        except OSError:
            pass
        if ep is not None:
            ep.close()
