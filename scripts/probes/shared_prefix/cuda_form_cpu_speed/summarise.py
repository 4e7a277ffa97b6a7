"""Before / after table of the ABBA runs run.sh wrote (on+shared, capacity preset): each run's TTFT p50/p90,
ITL p50/p90 and req/s, the medians per side and after / before (ITL and TTFT: > 1 is slower after).

    python scripts/probes/shared_prefix/cuda_form_cpu_speed/summarise.py docs/results/shared_prefix/cuda_form_cpu_speed
"""

import json
import statistics
import sys
from pathlib import Path

KEYS = (("ttft_p50_s", "TTFT p50 s"), ("ttft_p90_s", "TTFT p90 s"), ("itl_p50_ms", "ITL p50 ms"),
        ("itl_p90_ms", "ITL p90 ms"), ("request_throughput", "req/s"))


def main(folder: Path) -> None:
    runs = {}
    for path in sorted(folder.glob("*/bench_multiturn_capacity.json")):
        result = json.loads(path.read_text())["results"]["on+shared"]
        if result["failed"]:
            raise SystemExit(f"{path}: {result['failed']} failed requests")
        runs[path.parent.name] = result
    print("| run | " + " | ".join(label for _, label in KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for name, result in runs.items():
        print(f"| {name} | " + " | ".join(f"{result[key]:.3g}" for key, _ in KEYS) + " |")
    medians = {side: {key: statistics.median(r[key] for n, r in runs.items() if n.startswith(side)) for key, _ in KEYS}
               for side in ("before", "after")}
    for side in ("before", "after"):
        print(f"| median {side} | " + " | ".join(f"{medians[side][key]:.3g}" for key, _ in KEYS) + " |")
    print("| after / before | " + " | ".join(f"{medians['after'][key] / medians['before'][key]:.2f}" for key, _ in KEYS)
          + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
