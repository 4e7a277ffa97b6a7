"""Where the decode scheduler's time went during a capacity run with the shared-prefix backend, by
category, from a py-spy raw (collapsed stacks) recording stored in docs/results/shared_prefix/profile/.

The recording is made by record.py beside this script (the on+shared capacity pair, the capacity
workload attached to it, py-spy on the decode scheduler for 6 s from 2.5 s into the workload):

    PYSPY=/tmp/tools/bin/py-spy .venv/bin/python scripts/probes/shared_prefix/profile/record.py
    python scripts/probes/shared_prefix/profile/summarise.py
"""

import gzip
from collections import Counter
from pathlib import Path

CATEGORIES = [  # first match wins, in this order
    ("merge_own", "attention: own parts (C kernel, read in place)"),
    ("segment_partial", "attention: segments (fused kernel)"),
    ("forward_decode", "attention: other (merge, set_kv, accumulators)"),
    ("init_forward_metadata", "attention: plan (grouping, segment cache, own slots)"),
    ("UnquantizedLinearMethod", "linear layers"),
    ("LlamaForCausalLM.forward", "model: norms, rotary, activations, logits"),
    ("forward_batch_generation", "sampling and batch prep"),
    ("process_batch_result", "result processing and streaming"),
    ("prealloc", "admission (prealloc, match, lock)"),
    ("get_next_disagg_decode_batch_to_run", "next batch: SGLang's (prebuilt requests merged, decode prepared)"),
    ("sglang_pd", "other sglang_pd hooks"),
    ("on_idle", "idle"),
]


def main() -> None:
    counts, total = Counter(), 0
    with gzip.open(Path(__file__).resolve().parents[4] / "docs" / "results" / "shared_prefix" / "profile"
                   / "decode_scheduler.pyspy.txt.gz", "rt") as f:
        for line in f:
            stack, _, num = line.rstrip().rpartition(" ")
            if "run_event_loop" not in stack:
                continue  # other threads
            total += int(num)
            label = next((lab for key, lab in CATEGORIES if key.lower() in stack.lower()), "other scheduler")
            counts[label] += int(num)
    print(f"samples {total}")
    for label, num in counts.most_common():
        print(f"{100 * num / total:5.1f}% {label}")


if __name__ == "__main__":
    main()
