"""Small Mooncake-format traces (bench/trace.py's format) for tests and smoke runs: multi-turn
conversations over a shared system prompt.

    python -m sglang_pd.bench.trace_gen --out trace.jsonl --conversations 5 --turns 4 --seed 0

Conversations start at Poisson times (`--rate` per second). Turn 1's hash_ids are the system prompt's
`--system-blocks` ids (0 .. S-1, the same in every conversation) then `--first-blocks` new ids; each
later turn comes an exponential think time (mean `--think-s`) after the one before and its hash_ids
are that turn's plus `--turn-blocks` new ids (the answer and the next question), so each turn's ids
extend the previous turn's, as the public conversation trace's do. input_length fills every block
but the last with 512 tokens, the last with 1-512; output_length is drawn in [--output-min,
--output-max]. Lines are sorted by timestamp (ms). Seeded: the same flags write the same file.
The public traces themselves: see bench/trace.py (fetched by the user, not shipped).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, fields
from pathlib import Path

from sglang_pd.bench.trace import TRACE_BLOCK_TOKENS


@dataclass(frozen=True)
class TraceShape:
    """What to generate; every count >= 1 (system_blocks and turn_blocks may be 0)."""

    conversations: int = 5
    turns: int = 4
    system_blocks: int = 2
    first_blocks: int = 2
    turn_blocks: int = 1
    rate: float = 1.0          # conversation starts per second
    think_s: float = 2.0       # mean seconds between a conversation's turns
    output_min: int = 16
    output_max: int = 512
    seed: int = 0

    def __post_init__(self):
        for name in ("conversations", "turns", "first_blocks", "output_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("system_blocks", "turn_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.rate <= 0 or self.think_s < 0:
            raise ValueError(f"rate must be > 0 and think_s >= 0, got {self.rate} and {self.think_s}")
        if self.output_max < self.output_min:
            raise ValueError(f"output_max ({self.output_max}) must be >= output_min ({self.output_min})")


def generate(shape: TraceShape) -> list[dict]:
    """The trace's lines (dicts in the Mooncake format), sorted by timestamp; seeded by shape.seed."""
    rng = random.Random(shape.seed)
    next_id = shape.system_blocks
    rows = []
    start_s = 0.0
    for _ in range(shape.conversations):
        start_s += rng.expovariate(shape.rate)
        at_s, ids = start_s, list(range(shape.system_blocks))
        for turn in range(shape.turns):
            new = shape.first_blocks if turn == 0 else shape.turn_blocks
            ids = ids + list(range(next_id, next_id + new))
            next_id += new
            if turn and shape.think_s:
                at_s += rng.expovariate(1 / shape.think_s)
            rows.append({"timestamp": int(at_s * 1000),
                         "input_length": (len(ids) - 1) * TRACE_BLOCK_TOKENS + rng.randint(1, TRACE_BLOCK_TOKENS),
                         "output_length": rng.randint(shape.output_min, shape.output_max),
                         "hash_ids": ids})
    rows.sort(key=lambda row: row["timestamp"])  # stable: a conversation's turns keep their order
    return rows


def write_trace(rows: list[dict], path: str | Path) -> None:
    """One JSON object a line."""
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


def main(argv=None) -> int:
    """Write the trace the flags describe (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSONL file to write")
    for f in fields(TraceShape):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                       help=f"default {f.default}")
    args = p.parse_args(argv)
    try:
        shape = TraceShape(**{f.name: getattr(args, f.name) for f in fields(TraceShape)})
    except ValueError as exc:
        p.error(str(exc))
    rows = generate(shape)
    write_trace(rows, args.out)
    print(f"wrote {len(rows)} requests ({shape.conversations} conversations x {shape.turns} turns) "
          f"over {rows[-1]['timestamp'] / 1000:.1f} s to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
