"""Mooncake-format traces: read, slice, scale to a small model on a CPU box, and turn into token ids.

Format (JSONL, one request a line, as the public traces of github.com/kvcache-ai/Mooncake):
  timestamp      int, ms from the trace's start; non-decreasing (a line earlier than the one before it
                 is refused: replay order would no longer be the trace's order)
  input_length   int >= 1, prompt tokens
  output_length  int >= 1, generated tokens
  hash_ids       list of ints >= 0, one per 512-token block of the prompt; equal ids are equal blocks,
                 and an id stands for its whole prefix (a request's ids extend its earlier turn's)
Other fields are ignored and blank lines skipped; anything else malformed is refused with its line
number (TraceFormatError). The public conversation trace is not shipped here; fetch it with
  git clone --depth 1 https://github.com/kvcache-ai/Mooncake \
    && cp Mooncake/FAST25-release/traces/conversation_trace.jsonl .

Slice (`select`): the first N requests, or those whose timestamp lies in [start_s, end_s); send times
are rebased so the slice's first request goes at 0.
Scaling (`TraceScaling`, `scale`), exactly:
  - each hash id is a block of `block_tokens` token ids in [3, 512) (0-2 are special in the built-in
    models' vocabulary of 512) drawn from random.Random(f"{seed}/{hash_id}"): equal ids, equal tokens;
  - only the first `max_blocks` ids of a request are kept (its prefix; None keeps all);
  - scaled input length = round-half-up(input_length * block_tokens / 512), clamped to
    [1, kept blocks * block_tokens]; the prompt is the kept blocks' tokens concatenated, cut to it;
  - output length = output_length // output_div, clamped to [output_min, output_max].
`trace_stats` gives a slice's own figures, among them the infinite-cache block hit rate: the share of
its blocks whose hash id an earlier request of the slice already had.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_pd.bench.report import percentile
from sglang_pd.models import VOCAB_SIZE

TRACE_BLOCK_TOKENS = 512  # tokens per hash id in the Mooncake traces
FIRST_TOKEN_ID = 3        # ids 0-2: the built-in models' special tokens; ids drawn in [3, VOCAB_SIZE = 512)
_INT_FIELDS = ("timestamp", "input_length", "output_length")


class TraceFormatError(ValueError):
    """A trace line that is not a Mooncake-format request; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace, as read."""

    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class TraceScaling:
    """How a trace is shrunk for a small model on CPU (see the module docstring for the exact rules)."""

    block_tokens: int = 16
    max_blocks: int | None = 64
    output_div: int = 16
    output_min: int = 4
    output_max: int = 32
    seed: int = 0

    def __post_init__(self):
        for name in ("block_tokens", "output_div", "output_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_blocks is not None and self.max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1 (or None: all), got {self.max_blocks}")
        if self.output_max < self.output_min:
            raise ValueError(f"output_max ({self.output_max}) must be >= output_min ({self.output_min})")

    def as_dict(self) -> dict:
        """JSON form, for the report."""
        return asdict(self)


@dataclass(frozen=True)
class ScaledRequest:
    """One request as the replay sends it."""

    index: int               # position in the slice
    line: int                # line of the trace file
    send_at_s: float         # from the slice's first request, before any speedup
    input_ids: list[int]
    output_len: int
    hash_ids: tuple[int, ...]  # the kept blocks
    num_dropped_blocks: int    # blocks past max_blocks, not sent


def _field(obj: dict, name: str, where: str) -> int:
    if name not in obj:
        raise TraceFormatError(f"{where}: missing field {name!r}")
    value = obj[name]
    if type(value) is not int:  # bool is an int subclass: refused too
        raise TraceFormatError(f"{where}: {name} must be an integer, got {type(value).__name__} {value!r}")
    if value < (0 if name == "timestamp" else 1):
        raise TraceFormatError(f"{where}: {name} must be >= {0 if name == 'timestamp' else 1}, got {value}")
    return value


def parse_line(text: str, path: str | Path, line: int) -> TraceRequest:
    """One trace line -> TraceRequest; raises TraceFormatError naming `path:line` and the problem."""
    where = f"{path}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    timestamp, input_length, output_length = (_field(obj, name, where) for name in _INT_FIELDS)
    if "hash_ids" not in obj:
        raise TraceFormatError(f"{where}: missing field 'hash_ids'")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not ids or any(type(i) is not int or i < 0 for i in ids):
        raise TraceFormatError(f"{where}: hash_ids must be a non-empty list of integers >= 0, got {ids!r:.80}")
    return TraceRequest(line, timestamp, input_length, output_length, tuple(ids))


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Every request of a Mooncake-format trace file, in file order; raises TraceFormatError at the first
    malformed line (bad JSON, missing field, wrong type, length < 1, timestamp below the line before)."""
    requests: list[TraceRequest] = []
    with open(path) as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            request = parse_line(text, path, number)
            if requests and request.timestamp_ms < requests[-1].timestamp_ms:
                raise TraceFormatError(f"{path}:{number}: timestamp {request.timestamp_ms} is earlier than line "
                                       f"{requests[-1].line}'s {requests[-1].timestamp_ms} (timestamps must not "
                                       "decrease)")
            requests.append(request)
    if not requests:
        raise TraceFormatError(f"{path}: no request in the file")
    return requests


def select(requests: list[TraceRequest], first: int | None = None,
           window_s: tuple[float, float] | None = None) -> list[TraceRequest]:
    """The first `first` requests, or those with start <= timestamp / 1000 < end (`window_s`), or all.
    Raises ValueError when both are given or the slice is empty."""
    if first is not None and window_s is not None:
        raise ValueError("give a count of first requests or a time window, not both")
    if first is not None:
        if first < 1:
            raise ValueError(f"first must be >= 1, got {first}")
        chosen = requests[:first]
    elif window_s is not None:
        start, end = window_s
        if not 0 <= start < end:
            raise ValueError(f"window {start}:{end} s: need 0 <= start < end")
        chosen = [r for r in requests if start <= r.timestamp_ms / 1000 < end]
    else:
        chosen = list(requests)
    if not chosen:
        raise ValueError(f"the slice (first={first}, window={window_s}) holds no request")
    return chosen


def parse_window(text: str) -> tuple[float, float]:
    """'START_S:END_S' -> (start, end) seconds; raises ValueError naming the text."""
    try:
        start, end = (float(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"window {text!r}: expected START_S:END_S, e.g. 60:180") from None
    return start, end


def block_token_ids(seed: int, hash_id: int, block_tokens: int) -> list[int]:
    """The token ids of one hash block: the same (seed, hash_id) always gives the same ids."""
    rng = random.Random(f"{seed}/{hash_id}")
    return [rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(block_tokens)]


def scaled_input_len(request: TraceRequest, scaling: TraceScaling) -> int:
    """round-half-up(input_length * block_tokens / 512), clamped to [1, kept blocks * block_tokens]."""
    kept = len(request.hash_ids[:scaling.max_blocks])
    scaled = (request.input_length * scaling.block_tokens + TRACE_BLOCK_TOKENS // 2) // TRACE_BLOCK_TOKENS
    return max(1, min(scaled, kept * scaling.block_tokens))


def scaled_output_len(request: TraceRequest, scaling: TraceScaling) -> int:
    """output_length // output_div, clamped to [output_min, output_max]."""
    return max(scaling.output_min, min(scaling.output_max, request.output_length // scaling.output_div))


def scale(requests: list[TraceRequest], scaling: TraceScaling) -> list[ScaledRequest]:
    """The slice as the replay sends it (module docstring: the rules); send times from its first request."""
    start_ms = requests[0].timestamp_ms
    blocks: dict[int, list[int]] = {}
    out = []
    for index, request in enumerate(requests):
        kept = request.hash_ids[:scaling.max_blocks]
        tokens: list[int] = []
        for hash_id in kept:
            if hash_id not in blocks:
                blocks[hash_id] = block_token_ids(scaling.seed, hash_id, scaling.block_tokens)
            tokens += blocks[hash_id]
        out.append(ScaledRequest(index, request.line, (request.timestamp_ms - start_ms) / 1000,
                                 tokens[:scaled_input_len(request, scaling)], scaled_output_len(request, scaling),
                                 kept, len(request.hash_ids) - len(kept)))
    return out


def block_hit_rate(id_lists: list[tuple[int, ...]]) -> float:
    """Share of all blocks whose id an earlier list already held (an infinite cache's hit rate)."""
    seen: set[int] = set()
    hits = total = 0
    for ids in id_lists:
        hits += sum(i in seen for i in ids)
        total += len(ids)
        seen.update(ids)
    return hits / total if total else 0.0


def trace_stats(requests: list[TraceRequest]) -> dict:
    """A slice's own figures, as the trace states them (unscaled)."""
    inputs = [r.input_length for r in requests]
    return {"requests": len(requests),
            "duration_s": (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000,
            "input_p50": statistics.median(inputs), "input_p90": percentile(inputs, 90),
            "output_p50": statistics.median(r.output_length for r in requests),
            "blocks": sum(len(r.hash_ids) for r in requests),
            "distinct_blocks": len({i for r in requests for i in r.hash_ids}),
            "block_hit_rate": block_hit_rate([r.hash_ids for r in requests])}


def scaled_stats(scaled: list[ScaledRequest], scaling: TraceScaling) -> dict:
    """What the replay sends: lengths after scaling, distinct block tokens (the working set a cache that
    never evicts would hold) and the kept blocks' infinite-cache hit rate."""
    inputs = [len(r.input_ids) for r in scaled]
    return {"input_p50": statistics.median(inputs), "input_max": max(inputs), "input_tokens": sum(inputs),
            "output_p50": statistics.median(r.output_len for r in scaled),
            "output_tokens": sum(r.output_len for r in scaled),
            "distinct_block_tokens": len({i for r in scaled for i in r.hash_ids}) * scaling.block_tokens,
            "num_cut_to_max_blocks": sum(r.num_dropped_blocks > 0 for r in scaled),
            "block_hit_rate": block_hit_rate([r.hash_ids for r in scaled])}
