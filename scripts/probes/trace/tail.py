"""Issue 42 probe: what the TTFT tail of a stored bench_trace run is made of, and where decode-local
prefill moves time. Reads a bench_trace JSON and the trace file it replayed (the slice and scaling are
taken from the JSON), and prints, per configuration and run:
  - the 8 slowest requests: index in the slice, scaled prompt tokens, send time (s), TTFT (s);
  - the share of the slowest 1% that arrived in a burst (>= 4 requests sent in the same second);
  - SGLang's stage means (ms) on both servers.

usage: .venv/bin/python scripts/probes/trace/tail.py RUN.json conversation_trace.jsonl
"""

import collections
import json
import sys

from sglang_pd.bench.trace import TraceScaling, read_trace, scale, select

BURST = 4


def main(run_path: str, trace_path: str) -> None:
    report = json.load(open(run_path))
    slicing, scaling = report["trace"]["slice"], report["trace"]["scaling"]
    window = tuple(slicing["window_s"]) if slicing.get("window_s") else None
    requests = scale(select(read_trace(trace_path), slicing.get("first"), window),
                     TraceScaling(**{k: scaling[k] for k in TraceScaling.__dataclass_fields__}))
    per_second = collections.Counter(int(r.send_at_s) for r in requests)
    for name, runs in report["runs"].items():
        for number, run in enumerate(runs, 1):
            ttft = run["ttft_samples_s"]
            order = sorted(range(len(ttft)), key=lambda i: -ttft[i])
            slowest = [(i, len(requests[i].input_ids), round(requests[i].send_at_s, 1), round(ttft[i], 3))
                       for i in order[:8]]
            tail = order[:max(1, len(order) // 100)]
            in_burst = sum(per_second[int(requests[i].send_at_s)] >= BURST for i in tail)
            stages = {f"{side}.{k}": round(v["mean_ms"]) for side, figures in run["sglang_stage_latency"].items()
                      for k, v in figures.items()}
            print(f"{name} run {number}: slowest (index, prompt tokens, sent at s, TTFT s) {slowest}")
            print(f"  slowest 1% ({len(tail)}): {in_burst} sent in a second with >= {BURST} requests; "
                  f"local requests {run.get('local_requests')}")
            print(f"  stage means (ms): {stages}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
