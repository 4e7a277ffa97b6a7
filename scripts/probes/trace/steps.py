"""Issue 42 probe: decode's own gauges (SGLang /metrics: running requests, generation throughput, token
usage, queue lengths) sampled every 0.5 s during the same replay as prof.py; means over busy samples.
usage: .venv/bin/python scripts/probes/trace/steps.py CONFIG SPEEDUP LOGDIR"""
import json
import statistics
import sys
import threading
import time

from slice_a import decode_server, itl_mean_ms, start

from sglang_pd.bench.trace_replay import replay, warm_up
from sglang_pd.harness.upstream_state import metric_totals

GAUGES = ("sglang:num_running_reqs", "sglang:gen_throughput", "sglang:token_usage", "sglang:num_queue_reqs",
          "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs")

name, speedup, logdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
dep, reqs = start(name, logdir)
try:
    warm_up(dep.router.url)
    url = decode_server(dep).url
    samples, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            samples.append({"t": time.time(), **metric_totals(url, GAUGES, timeout=5)})
            time.sleep(0.5)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    r = replay(dep.router.url, reqs, speedup)
    stop.set()
    th.join()
    with open(logdir + "/metrics_samples.json", "w") as f:
        json.dump(samples, f)
    busy = [x for x in samples if x["sglang:num_running_reqs"] > 0]
    for key in GAUGES:
        print(key, "mean over busy samples %.2f" % statistics.fmean(x[key] for x in busy), flush=True)
    print(name, "ITL mean ms", itl_mean_ms(r), flush=True)
finally:
    dep.stop()
