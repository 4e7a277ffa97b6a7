"""Multi-turn chat workload: N clients x R rounds over a shared system prompt.

Round 1 prompt = system + client question; round r+1 = previous prompt + previous answer + new
question. Seeded: the same config always yields the same token ids (vocab of the built-in models).
A turn that decode refuses (early rejection, 503) is retried after the Retry-After it was given, up
to MAX_ATTEMPTS times; every attempt is a record (a refused one never meets an SLO).
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable

from sglang_pd.bench.pd_client import StreamResult
from sglang_pd.models import VOCAB_SIZE


@dataclass(frozen=True)
class WorkloadConfig:
    """Shape and pacing of the workload."""

    num_clients: int = 8
    num_rounds: int = 4
    system_len: int = 512
    first_question_len: int = 32
    question_len: int = 16
    question_len_max: int = 0       # > question_len: later questions' lengths drawn in [question_len, this]
    max_new_tokens: int = 32
    concurrency: int = 8            # conversations in flight at once
    request_rate: float = 0.0       # conversation starts per second (Poisson); 0 = all at once
    round_barrier: bool = False     # every client finishes round r before any starts round r+1
    seed: int = 0

    def __post_init__(self):
        for name in ("num_clients", "num_rounds", "max_new_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.request_rate < 0:
            raise ValueError(f"request_rate must be >= 0, got {self.request_rate}")
        if self.question_len_max and self.question_len_max < self.question_len:
            raise ValueError(f"question_len_max ({self.question_len_max}) must be 0 or >= question_len "
                             f"({self.question_len})")


@dataclass
class RequestRecord:
    """One measured request."""

    client: int
    round: int
    result: StreamResult


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def system_prompt(cfg: WorkloadConfig) -> list[int]:
    """The shared system prompt (token 1 first, like a BOS)."""
    return [1] + _tokens(random.Random(cfg.seed), cfg.system_len - 1)


def questions(cfg: WorkloadConfig, client: int) -> list[list[int]]:
    """The user turns of one client, one list per round (seeded: the same config, the same tokens)."""
    rng = random.Random(cfg.seed * 1_000_003 + client + 1)

    def length(rnd: int) -> int:
        if rnd == 0:
            return cfg.first_question_len
        return rng.randint(cfg.question_len, cfg.question_len_max) if cfg.question_len_max else cfg.question_len

    return [_tokens(rng, length(r)) for r in range(cfg.num_rounds)]


Send = Callable[[list[int], int], StreamResult]
MAX_ATTEMPTS = 4
MAX_RETRY_WAIT_S = 10.0


class _Conversation:
    def __init__(self, cfg: WorkloadConfig, client: int, system: list[int]):
        self.client, self.history, self.turns = client, list(system), questions(cfg, client)

    def step(self, send: Send, cfg: WorkloadConfig, rnd: int) -> list[RequestRecord]:
        prompt = self.history + self.turns[rnd]
        records = []
        for _ in range(MAX_ATTEMPTS):
            result = send(prompt, cfg.max_new_tokens)
            records.append(RequestRecord(self.client, rnd, result))
            if not result.rejected:
                break
            time.sleep(min(result.retry_after_s or 1, MAX_RETRY_WAIT_S))
        self.history = prompt + result.output_ids
        return records


def run_workload(cfg: WorkloadConfig, send: Send, on_done: Callable[[RequestRecord], None] = lambda r: None,
                 deadline_s: float = 3600) -> list[RequestRecord]:
    """Drive every conversation; returns all records (failed ones included, see result.ok)."""
    system = system_prompt(cfg)
    convs = [_Conversation(cfg, c, system) for c in range(cfg.num_clients)]
    records: list[RequestRecord] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + deadline_s

    def step(conv, rnd):
        if time.monotonic() > stop_at:
            raise TimeoutError(f"workload exceeded its {deadline_s} s bound")
        recs = conv.step(send, cfg, rnd)
        with lock:
            records.extend(recs)
        for rec in recs:
            on_done(rec)

    with cf.ThreadPoolExecutor(cfg.concurrency) as pool:
        if cfg.round_barrier:
            for rnd in range(cfg.num_rounds):
                list(pool.map(lambda c: step(c, rnd), convs))
        else:
            rng = random.Random(cfg.seed)
            futures = []
            for conv in convs:
                futures.append(pool.submit(lambda c=conv: [step(c, r) for r in range(cfg.num_rounds)]))
                if cfg.request_rate > 0:
                    time.sleep(rng.expovariate(cfg.request_rate))
            for fut in futures:
                fut.result()
    return records
