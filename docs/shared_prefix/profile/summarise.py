"""Where the decode scheduler's time went during a capacity run with the shared-prefix backend, by
category, from a py-spy raw (collapsed stacks) recording stored beside this file.

How the recording was made (py-spy is not a project dependency: `pip install --target /tmp/tools py-spy`):
a PD pair as `bench_multiturn --configs on+shared` starts it (capacity preset; both servers
`--attention-backend sglang_pd_shared_prefix`), the capacity workload attached to it
(`python -m sglang_pd.bench_multiturn --preset capacity --prefill-url ... --decode-url ... --bootstrap-port ...`),
and 2.5 s after the workload started: `py-spy record -p <decode scheduler pid> -d 6 -r 250 -f raw
-o decode_scheduler.pyspy.txt --nonblocking`.

    python docs/shared_prefix/profile/summarise.py
"""

import gzip
from collections import Counter
from pathlib import Path

CATEGORIES = [  # first match wins, in this order
    ("rows_partial", "attention: own parts (arena, fused kernel)"),
    ("segment_partial", "attention: segments (fused kernel)"),
    ("write_step_kv", "attention: step token into arena"),
    ("forward_decode", "attention: other (merge, set_kv, accumulators)"),
    ("init_forward_metadata", "attention: plan (grouping, arena keep/fill/move)"),
    ("UnquantizedLinearMethod", "linear layers"),
    ("LlamaForCausalLM.forward", "model: norms, rotary, activations, logits"),
    ("forward_batch_generation", "sampling and batch prep"),
    ("process_batch_result", "result processing and streaming"),
    ("prealloc", "admission (prealloc, match, lock)"),
    ("sglang_pd", "other sglang_pd hooks"),
    ("on_idle", "idle"),
]


def main() -> None:
    counts, total = Counter(), 0
    with gzip.open(Path(__file__).parent / "decode_scheduler.pyspy.txt.gz", "rt") as f:
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
