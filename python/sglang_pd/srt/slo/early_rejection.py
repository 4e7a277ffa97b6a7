"""Early rejection on decode (Mooncake's idea): refuse at the door a request that would miss its TTFT.

`TtftPredictor` learns, online, the time from a request entering decode (the prealloc queue) to
joining the running batch (its first token is streamed right then) as a robust linear function of
what is ahead of it (requests in the prealloc, transfer and waiting queues) and its uncached prompt
tokens (what prefill must compute and send). Entries are remembered by rid until the request joins
the batch; requests that never do (aborted, rejected) simply age out of the bounded table.

A predictor that refuses learns nothing from the refused, so a stale or biased fit (e.g. learnt in a
start-up burst whose wait sat in prefill's queue, invisible here) could refuse everything forever.
Two guards keep it honest: a short, fast-decaying window (the fit follows the latest admissions),
and a probe: when nothing was learnt for `PROBE_INTERVAL_S`, the next request is let through. And
`SloController.on_entry` never refuses a request with nothing ahead of it: its wait is its own prefill
and transfer, which refusing cannot shorten.

`decide_rejection` turns a prediction into a refusal with a message naming predicted vs target
TTFT and `retry_after_s=<n>`, which the HTTP process copies into a `Retry-After` header.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple

from sglang_pd.srt.slo.step_time_model import RobustLinearFit

RETRY_AFTER_KEY = "retry_after_s="
PROBE_INTERVAL_S = 2.0


class RejectionDecision(NamedTuple):
    """Whether to refuse a request now, with what it was predicted to wait."""

    reject: bool
    predicted_ttft_s: float | None  # None while the predictor is not ready (never rejects then)
    target_ttft_s: float
    retry_after_s: int
    message: str


class TtftPredictor:
    """Entry -> running-batch time, learned from requests decode admitted. Scheduler thread only."""

    def __init__(self, max_pending: int = 8192, **fit_kwargs):
        fit_kwargs.setdefault("min_samples", 8)
        fit_kwargs.setdefault("min_distinct_x0", 2)
        fit_kwargs.setdefault("window", 64)
        fit_kwargs.setdefault("half_life", 16.0)
        fit_kwargs.setdefault("refit_every", 1)
        self.fit = RobustLinearFit(num_features=2, **fit_kwargs)
        self._pending: OrderedDict[str, tuple[float, tuple[float, float]]] = OrderedDict()
        self._max_pending = max_pending
        self.last_predicted_s: float | None = None
        self.last_learnt_s: float | None = None
        self.last_probe_s: float | None = None

    def take_probe(self, now_s: float) -> bool:
        """True (and the probe is spent) when neither a lesson nor a probe happened for PROBE_INTERVAL_S:
        let this one request through. A burst that arrives before the probe is admitted is not all
        let through: one probe per interval (mutates)."""
        last = max((t for t in (self.last_learnt_s, self.last_probe_s) if t is not None), default=None)
        if last is not None and now_s - last < PROBE_INTERVAL_S:
            return False
        self.last_probe_s = now_s
        return True

    @staticmethod
    def features(num_ahead: int, num_uncached_tokens: int) -> tuple[float, float]:
        """(requests ahead, uncached tokens / 1000)."""
        return float(num_ahead), num_uncached_tokens / 1000.0

    def predict(self, num_ahead: int, num_uncached_tokens: int) -> float | None:
        """Predicted seconds until a new request joins the running batch; None until ready."""
        return self.fit.predict(self.features(num_ahead, num_uncached_tokens))

    def on_entry(self, rid: str, now_s: float, num_ahead: int, num_uncached_tokens: int) -> float | None:
        """Remember an accepted request's entry (mutates); returns its prediction."""
        self._pending[rid] = (now_s, self.features(num_ahead, num_uncached_tokens))
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
        self.last_predicted_s = self.predict(num_ahead, num_uncached_tokens)
        return self.last_predicted_s

    def on_admitted(self, rid: str, now_s: float) -> float | None:
        """The request joined the running batch: learn from it (mutates). Returns its measured time."""
        entry = self._pending.pop(rid, None)
        if entry is None:
            return None
        waited = now_s - entry[0]
        self.fit.add(entry[1], waited)
        self.last_learnt_s = now_s
        return waited

    @property
    def num_pending(self) -> int:
        """Entries waiting to join the running batch (or to age out)."""
        return len(self._pending)


def decide_rejection(predicted_ttft_s: float | None, target_ttft_s: float) -> RejectionDecision:
    """Refuse when the prediction exceeds the target (read-only; no prediction never refuses)."""
    if predicted_ttft_s is None or predicted_ttft_s <= target_ttft_s:
        return RejectionDecision(False, predicted_ttft_s, target_ttft_s, 0, "")
    retry_after = max(1, math.ceil(predicted_ttft_s - target_ttft_s))
    message = (f"sglang_pd early rejection: predicted TTFT {predicted_ttft_s * 1000:.0f} ms exceeds the target "
               f"{target_ttft_s * 1000:.0f} ms (SGLANG_PD_TTFT_TARGET_MS); {RETRY_AFTER_KEY}{retry_after}")
    return RejectionDecision(True, predicted_ttft_s, target_ttft_s, retry_after, message)


def retry_after_from(text: str) -> int | None:
    """The `retry_after_s=<n>` a rejection message carries, or None."""
    at = text.find(RETRY_AFTER_KEY)
    if at < 0:
        return None
    digits = ""
    for ch in text[at + len(RETRY_AFTER_KEY):]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None
