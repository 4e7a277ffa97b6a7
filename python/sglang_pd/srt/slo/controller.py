"""SLO-aware decode admission: one object per decode scheduler tying the pieces together.

    StepMeter --samples--> StepTimeModel --> decide_admission   (SGLANG_PD_ITL_TARGET_MS)
    entries / admissions --> TtftPredictor --> decide_rejection (SGLANG_PD_TTFT_TARGET_MS)

Hooks (srt/hooks/scheduling/scheduler.py, decode_scheduler.py, decode_prealloc_queue.py) call `on_step_start`,
`on_local_extend`, `admission_for`, `on_admitted` and `on_entry`; each returns plain values, never touches SGLang objects. Without either target the controller still
measures steps (observability) but never limits or refuses anything. Scheduler thread only.
"""

from __future__ import annotations

from typing import Sequence

from sglang_pd.srt.slo.early_rejection import RejectionDecision, TtftPredictor, decide_rejection
from sglang_pd.srt.slo.itl_admission import AdmissionDecision, StepMeter, decide_admission
from sglang_pd.srt.slo.step_time_model import StepTimeModel
from sglang_pd.srt.metrics import PDCounters


class SloController:
    """Targets (seconds; None = no limit), step meter and models of one decode scheduler."""

    def __init__(self, itl_target_s: float | None, ttft_target_s: float | None, counters: PDCounters):
        self.itl_target_s = itl_target_s
        self.ttft_target_s = ttft_target_s
        self.counters = counters
        self.meter = StepMeter()
        self.step_model = StepTimeModel()
        self.ttft = TtftPredictor()
        self.last_decision: AdmissionDecision | None = None
        self.last_rejection: str = ""

    def _gauge(self, name: str, value: float | None) -> None:
        if value is not None:
            self.counters.set(name, value)

    def on_step_start(self, now_s: float, num_running: int, num_tokens: int, after_idle: bool) -> None:
        """A decode forward starts: close the previous step's sample and learn from it (mutates)."""
        sample = self.meter.on_step_start(now_s, num_running, num_tokens, after_idle)
        if sample is not None:
            self.step_model.add(sample.num_running, sample.num_tokens, sample.step_s, sample.num_local_tokens)
            self._gauge("decode_step_seconds_measured", self.meter.ewma_step_s)

    def on_local_extend(self, num_tokens: int, num_running: int, after_idle: bool) -> None:
        """A decode-local prefill extend runs now: its tokens count in the current step's sample (mutates)."""
        self.meter.on_local_extend(num_tokens, num_running, after_idle)

    def admission_for(self, num_running: int, num_tokens: int, waiting_lens: Sequence[int],
                      extend_lens: Sequence[int] | None = None) -> int | None:
        """How many of the waiting requests (FIFO) may join now; None = no ITL target, take all.
        `extend_lens`: local-prefill candidates' extend tokens (see decide_admission)."""
        if self.itl_target_s is None:
            return None
        decision = decide_admission(self.step_model, self.itl_target_s, num_running, num_tokens, waiting_lens,
                                    extend_lens=extend_lens)
        self.last_decision = decision
        if decision.num_admit < len(waiting_lens):
            self.counters.add("decode_admission_deferred_steps_total")
        self._gauge("decode_admission_cap", decision.cap)
        self._gauge("decode_step_seconds_predicted", decision.predicted_step_s)
        return decision.num_admit

    def on_entry(self, rid: str, now_s: float, num_ahead: int, num_uncached_tokens: int,
                 refusable: bool = True) -> RejectionDecision:
        """A new request reaches decode: refuse it or remember its entry (mutates). `refusable` False:
        the request cannot be refused cleanly (its prefill cannot be told yet): admitted, counted."""
        predicted = self.ttft.predict(num_ahead, num_uncached_tokens)
        self._gauge("decode_ttft_seconds_predicted", predicted)
        if self.ttft_target_s is None:
            return decide_rejection(None, 0.0)
        decision = decide_rejection(predicted, self.ttft_target_s)
        if decision.reject and not refusable:
            self.counters.add("early_rejection_unrefusable_total")
            decision = decide_rejection(None, self.ttft_target_s)
        if decision.reject and num_ahead == 0:
            # Nothing ahead of it: its wait is its own prefill and transfer, which refusing cannot shorten
            # and a retry would meet again. An idle decode serves (a fit biased by a burst said refuse).
            self.counters.add("early_rejection_nothing_ahead_total")
            decision = decide_rejection(None, self.ttft_target_s)
        if decision.reject and self.ttft.take_probe(now_s):
            self.counters.add("early_rejection_probes_total")  # refused ones teach nothing: keep learning
            decision = decide_rejection(None, self.ttft_target_s)
        if decision.reject:
            self.counters.add("early_rejected_requests_total")
            self.last_rejection = decision.message
        else:
            self.ttft.on_entry(rid, now_s, num_ahead, num_uncached_tokens)
        return decision

    def on_admitted(self, rids: Sequence[str], now_s: float) -> None:
        """These requests joined the running batch (first token streamed now): learn TTFT (mutates)."""
        for rid in rids:
            self.ttft.on_admitted(rid, now_s)

    def snapshot(self, num_recent_steps: int = 0) -> dict:
        """JSON-able view (read-only apart from lazy refits); optionally the latest step samples."""
        step_fit, ttft_fit = self.step_model.fit.snapshot(), self.ttft.fit.snapshot()
        last = self.last_decision
        snap = {
            "itl_target_ms": None if self.itl_target_s is None else self.itl_target_s * 1000,
            "ttft_target_ms": None if self.ttft_target_s is None else self.ttft_target_s * 1000,
            "step_model": step_fit._asdict(), "step_model_ready": self.step_model.ready(),
            "measured_step_ms": None if self.meter.ewma_step_s is None else self.meter.ewma_step_s * 1000,
            "last_admission": None if last is None else last._asdict(),
            "num_deferred_steps": int(self.counters.get("decode_admission_deferred_steps_total")),
            "ttft_model": ttft_fit._asdict(), "ttft_pending": self.ttft.num_pending,
            "num_rejected": int(self.counters.get("early_rejected_requests_total")),
            "num_probes": int(self.counters.get("early_rejection_probes_total")), "last_rejection": self.last_rejection,
        }
        if self.itl_target_s is not None and last is not None and last.predicted_step_s is not None:
            snap["last_admission"]["predicted_step_ms"] = last.predicted_step_s * 1000
        if num_recent_steps:
            snap["recent_steps"] = [list(s) for s in list(self.meter.recent)[-num_recent_steps:]]
        return snap

