"""Issue 42 probe: decode's own gauges (SGLang /metrics: running requests, generation throughput, token
usage, queue lengths) sampled every 0.5 s during the same replay as prof.py; means over busy samples.
usage: .venv/bin/python scripts/probes/trace/steps.py CONFIG SPEEDUP LOGDIR"""
import sys, statistics, dataclasses
from sglang_pd.bench.fresh_run import config_deployment
from sglang_pd.bench.slo import parse_configs
from sglang_pd.bench.trace import TraceScaling, read_trace, select, scale
from sglang_pd.bench.trace_replay import replay, warm_up
from sglang_pd.bench_trace import DEPLOYMENT
from sglang_pd.harness import PDDeployment
from pathlib import Path
name, speedup, logdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
cfg = parse_configs(name, None, None, 64)[0]
reqs = scale(select(read_trace("/work/traces/conversation_trace.jsonl"), first=400), TraceScaling())
dc = config_deployment(cfg, DEPLOYMENT)
dc = dataclasses.replace(dc, log_dir=Path(logdir))
dep = PDDeployment(dc).start()
try:
    warm_up(dep.router.url)
    import threading, time, requests, re, json
    samples, stop = [], threading.Event()
    dec = next(s for s in dep.servers if s.name.startswith("decode"))
    def poll():
        while not stop.is_set():
            t = requests.get(f"http://127.0.0.1:{dec.port}/metrics", timeout=5).text
            row = {"t": time.time()}
            for key in ("sglang:num_running_reqs", "sglang:gen_throughput", "sglang:token_usage", "sglang:num_queue_reqs", "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs"):
                m = re.search(re.escape(key) + r"\{[^}]*\} ([0-9.e+-]+)", t)
                row[key] = float(m.group(1)) if m else None
            samples.append(row); time.sleep(0.5)
    th = threading.Thread(target=poll, daemon=True); th.start()
    r = replay(dep.router.url, reqs, speedup)
    stop.set(); th.join()
    json.dump(samples, open(logdir + "/metrics_samples.json", "w"))
    busy = [x for x in samples if (x["sglang:num_running_reqs"] or 0) > 0]
    for key in samples[0]:
        vals = [x[key] for x in busy if x.get(key) is not None]
        if vals and key != "t": print(key, "mean over busy samples %.2f" % statistics.fmean(vals), flush=True)
    itl = [x for res in r.results for x in res.itl_s]
    print(name, "ITL mean ms", 1000 * statistics.fmean(itl), flush=True)
finally:
    dep.stop()
