"""One conversation through the router, per turn: the decode_prefix_len prefill was told and pages sent.

    python -m sglang_pd.demo [--page-size 16] [--turns 4] [--transfer-backend mooncake_tcp]

(The README main job is the multi-turn benchmark; this is the per-turn view of one conversation.)

Requests go through the router exactly as a client's would; per turn we print what prefill was told
(decode_prefix_len) and the KV pages it really sent, read from prefill's /sglang_pd/stats.
"""

from __future__ import annotations

import argparse
import random
import time

from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import DEFAULT_MODEL, VOCAB_SIZE


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="built-in model name")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--transfer-backend", default="mooncake_tcp", choices=("mooncake_tcp", "nixl"))
    parser.add_argument("--system-len", type=int, default=120, help="tokens in the first prompt")
    parser.add_argument("--question-len", type=int, default=24, help="new user tokens per later turn")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.turns < 1 or args.page_size < 1:
        parser.error(f"--turns ({args.turns}) and --page-size ({args.page_size}) must be >= 1")
    return args


def _new_room_record(dep: PDDeployment, seen: set[int]) -> dict:
    rooms = dep.prefill_rooms()
    new = [room for room in rooms if room not in seen]
    if len(new) != 1:
        raise RuntimeError(f"expected exactly one new bootstrap room at prefill, found {len(new)}")
    seen.add(new[0])
    return rooms[new[0]]


def run_conversation(dep: PDDeployment, args: argparse.Namespace) -> list[dict]:
    """Drive the conversation through the router; one result row per turn."""
    rng = random.Random(args.seed)
    conv = [rng.randrange(3, VOCAB_SIZE) for _ in range(args.system_len)]
    seen = set(dep.prefill_rooms())
    rows = []
    for turn in range(1, args.turns + 1):
        start = time.perf_counter()
        out = dep.generate(dep.router.url, conv, args.max_new_tokens)
        elapsed = time.perf_counter() - start
        record = _new_room_record(dep, seen)
        rows.append({"turn": turn, "prompt_len": len(conv), "decode_prefix_len": record["decode_prefix_len"],
                     "pages_sent": record["num_pages_sent"], "pages_full": -(-len(conv) // args.page_size),
                     "latency_s": elapsed})
        conv = conv + out["output_ids"] + [rng.randrange(3, VOCAB_SIZE) for _ in range(args.question_len)]
    return rows


def format_table(rows: list[dict]) -> str:
    """The per-turn table the README shows."""
    head = f"{'turn':>4} {'prompt_len':>10} {'decode_prefix_len':>17} {'pages_sent':>10} {'pages_without_reuse':>19} {'latency_s':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['turn']:>4} {r['prompt_len']:>10} {r['decode_prefix_len']:>17} {r['pages_sent']:>10} "
                     f"{r['pages_full']:>19} {r['latency_s']:>9.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    config = DeploymentConfig(model=args.model, page_size=args.page_size, with_router=True,
                              transfer_backend=args.transfer_backend)
    t0 = time.perf_counter()
    with PDDeployment(config) as dep:
        print(f"PD pair + router up in {time.perf_counter() - t0:.0f}s (logs: {dep.log_dir})", flush=True)
        rows = run_conversation(dep, args)
    print(f"\nmodel={args.model} page_size={args.page_size} backend={args.transfer_backend} "
          "decode radix cache ON; figures read from prefill's /sglang_pd/stats\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
