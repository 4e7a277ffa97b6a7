"""Issue 42 probe: py-spy profile of decode's scheduler (45 s at 50 Hz) during a replay of the first 400
requests of the public conversation trace (default scaling) through the router, on a fresh pair.
usage: pip install --target /tmp/pyspy py-spy
       .venv/bin/python scripts/probes/trace/prof.py CONFIG SPEEDUP OUT.raw   (CONFIG: bench/slo.py name)
       python3 scripts/probes/trace/agg.py OUT.raw ...   (inclusive share of the main frames)
The trace at /work/traces/conversation_trace.jsonl (bench/trace.py says how to fetch it)."""
import subprocess
import sys

import psutil
from slice_a import decode_server, itl_mean_ms, start

from sglang_pd.bench.trace_replay import replay, warm_up

name, speedup, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
dep, reqs = start(name)
try:
    warm_up(dep.router.url)
    dpid = decode_server(dep).proc.pid
    children = psutil.Process(dpid).children(recursive=True)
    kids = [c for c in children if "scheduler" in " ".join(c.cmdline()) or "scheduler" in c.name()]
    print("decode pid", dpid, "children", [(c.pid, c.name()) for c in children], flush=True)
    spid = kids[0].pid if kids else dpid
    spy = subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "-p", str(spid), "-d", "45", "-r", "50", "--format", "raw",
                            "-o", out, "--nonblocking"], env={"PYTHONPATH": "/tmp/pyspy"})
    r = replay(dep.router.url, reqs, speedup)
    spy.wait()
    print(name, "ITL mean ms", itl_mean_ms(r), flush=True)
finally:
    dep.stop()
