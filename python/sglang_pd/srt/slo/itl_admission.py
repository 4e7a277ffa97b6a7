"""ITL-target admission on decode: measure each decode step, learn step time, cap admissions.

Decode moves requests whose KV has arrived from its waiting queue into the running batch. Upstream
takes every one memory allows; a CPU (or memory-bound GPU) step costs a fixed part plus a part per
running request, so each admission makes every running request's next token later. Here:

- `StepMeter` turns the starts of consecutive decode forwards into step samples: the time from one
  launch to the next is what a streaming client sees between two tokens (forward + scheduling +
  output). A gap that spans an idle scheduler is not a step and is dropped. A decode-local prefill
  extend run inside a gap is part of that step: its tokens ride on the sample.
- `decide_admission` admits waiting requests in FIFO order only while the learned model predicts
  the next step within `HEADROOM` x target (the batch's KV grows by one token per request per step
  after the decision, and the client sees the step plus its streaming overhead). An empty batch
  always admits one request (no starvation); before the first fit the batch grows by one request
  per step up to `PROBE_BATCH`, which gives the model distinct batch sizes to learn from without
  paying for a large batch blind.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple, Sequence

from sglang_pd.srt.slo.step_time_model import StepTimeModel

PROBE_BATCH = 4
HEADROOM = 0.9


class StepSample(NamedTuple):
    """One measured decode step: batch it ran, seconds until the next step started, local-prefill
    tokens extended in between."""

    num_running: int
    num_tokens: int
    step_s: float
    num_local_tokens: int = 0


class StepMeter:
    """Pairs consecutive decode launches into StepSamples. Mutated on the scheduler thread only."""

    def __init__(self, max_recent: int = 512, ewma_alpha: float = 0.1):
        self._prev: tuple[float, int, int] | None = None
        self._local_tokens = 0  # local-prefill tokens extended since the last decode launch
        self.recent: deque[StepSample] = deque(maxlen=max_recent)
        self.ewma_step_s: float | None = None
        self._alpha = ewma_alpha

    def on_step_start(self, now_s: float, num_running: int, num_tokens: int,
                      after_idle: bool) -> StepSample | None:
        """A decode forward starts now; returns the sample it closes (None after idle or first)."""
        prev, self._prev = self._prev, (now_s, num_running, num_tokens)
        local, self._local_tokens = self._local_tokens, 0
        if prev is None or after_idle or now_s <= prev[0]:
            return None
        sample = StepSample(prev[1], prev[2], now_s - prev[0], local)
        self.recent.append(sample)
        self.ewma_step_s = (sample.step_s if self.ewma_step_s is None
                            else self._alpha * sample.step_s + (1 - self._alpha) * self.ewma_step_s)
        return sample


    def on_local_extend(self, num_tokens: int, num_running: int, after_idle: bool) -> None:
        """A local-prefill extend of `num_tokens` runs now. Between two decode steps it belongs to the
        first one's sample; with nothing decoding (or after idle) the open gap is no step at all."""
        if after_idle or num_running == 0:
            self._prev, self._local_tokens = None, 0
        else:
            self._local_tokens += num_tokens


class AdmissionDecision(NamedTuple):
    """How many waiting requests may join the running batch this step, and why."""

    num_admit: int
    predicted_step_s: float | None  # predicted step with them admitted (None: model not ready)
    cap: int                        # running requests the target allows at the current mean length
    reason: str                     # "model", "probing" or "starvation_guard"


def max_batch_within(model: StepTimeModel, target_s: float, tokens_per_request: float) -> int | None:
    """Largest batch whose predicted step fits `target_s` at this mean KV length (None: not ready)."""
    coef = model.fit.coefficients()
    if coef is None:
        return None
    per_request = coef[1] + coef[2] * tokens_per_request / 1000.0
    if per_request <= 0:
        return 1 << 20 if coef[0] <= target_s else 0
    return max(0, int(math.floor((target_s - coef[0]) / per_request)))


def decide_admission(model: StepTimeModel, target_s: float, num_running: int, num_tokens: int,
                     waiting_lens: Sequence[int], probe_batch: int = PROBE_BATCH,
                     extend_lens: Sequence[int] | None = None) -> AdmissionDecision:
    """FIFO admission under an ITL target (read-only). `waiting_lens`: KV length of each waiting request;
    `extend_lens`: for decode-local prefill candidates, the tokens their extend computes first (the step
    that carries the extend is predicted with them)."""
    if not model.ready():
        num_admit = min(len(waiting_lens), 1 if num_running < probe_batch else 0)
        return AdmissionDecision(num_admit, None, max(probe_batch, num_running), "probing")
    target_s *= HEADROOM
    mean_len = num_tokens / num_running if num_running else (waiting_lens[0] if waiting_lens else 0)
    cap = max_batch_within(model, target_s, mean_len) or 0
    extend_lens = extend_lens if extend_lens is not None else [0] * len(waiting_lens)
    n, tokens, local, num_admit = num_running, num_tokens, 0, 0
    predicted = model.predict(n, tokens) if n else None
    for length, extend in zip(waiting_lens, extend_lens):
        candidate = model.predict(n + 1, tokens + length, local + extend)
        if candidate > target_s and n > 0:
            break
        n, tokens, local, num_admit, predicted = n + 1, tokens + length, local + extend, num_admit + 1, candidate
        if candidate > target_s:  # only reachable with an empty batch: admit one, no more
            return AdmissionDecision(num_admit, predicted, max(cap, 1), "starvation_guard")
    return AdmissionDecision(num_admit, predicted, cap, "model")
