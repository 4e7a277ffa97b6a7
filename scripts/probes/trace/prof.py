"""Issue 42 probe: py-spy profile of decode's scheduler (45 s at 50 Hz) during a replay of the first 400
requests of the public conversation trace (default scaling) through the router, on a fresh pair.
usage: pip install --target /tmp/pyspy py-spy
       .venv/bin/python scripts/probes/trace/prof.py CONFIG SPEEDUP OUT.raw   (CONFIG: bench/slo.py name)
       python3 scripts/probes/trace/agg.py OUT.raw ...   (inclusive share of the main frames)
The trace at /work/traces/conversation_trace.jsonl (bench/trace.py says how to fetch it)."""
import subprocess, sys, time, threading
import psutil
from sglang_pd.bench.fresh_run import config_deployment
from sglang_pd.bench.slo import parse_configs
from sglang_pd.bench.trace import TraceScaling, read_trace, select, scale
from sglang_pd.bench.trace_replay import replay, warm_up
from sglang_pd.bench_trace import DEPLOYMENT
from sglang_pd.harness import PDDeployment

name, speedup, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
cfg = parse_configs(name, None, None, 64)[0]
reqs = scale(select(read_trace("/work/traces/conversation_trace.jsonl"), first=400), TraceScaling())
dep = PDDeployment(config_deployment(cfg, DEPLOYMENT)).start()
try:
    warm_up(dep.router.url)
    dpid = next(s for s in dep.servers if s.name.startswith("decode")).proc.pid
    kids = [c for c in psutil.Process(dpid).children(recursive=True) if "scheduler" in " ".join(c.cmdline()) or "scheduler" in c.name()]
    print("decode pid", dpid, "children", [(c.pid, c.name()) for c in psutil.Process(dpid).children(recursive=True)], flush=True)
    spid = kids[0].pid if kids else dpid
    spy = subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "-p", str(spid), "-d", "45", "-r", "50", "--format", "raw", "-o", out, "--nonblocking"],
                           env={"PYTHONPATH": "/tmp/pyspy"})
    r = replay(dep.router.url, reqs, speedup)
    spy.wait()
    import statistics
    itl = [x for res in r.results for x in res.itl_s]
    print(name, "ITL mean ms", 1000 * statistics.fmean(itl), flush=True)
finally:
    dep.stop()
