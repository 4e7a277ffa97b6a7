"""SLO-aware decode admission without a server: the robust step-time model, the ITL admission decision
on real recorded decode traces and on a synthetic noisy decode loop, and the early-rejection rule."""

import json
import random
import statistics
from pathlib import Path

import pytest

from sglang_pd.config import Settings, problems as validate
from sglang_pd.srt.slo.early_rejection import (PROBE_INTERVAL_S, TtftPredictor, decide_rejection,
                                                          retry_after_from)
from sglang_pd.srt.slo.itl_admission import HEADROOM, PROBE_BATCH, StepMeter, decide_admission
from sglang_pd.srt.slo import SloController
from sglang_pd.srt.slo.step_time_model import RobustLinearFit, StepTimeModel
from sglang_pd.srt.metrics import PDCounters
from sglang_pd.srt.state import ProcessKind, build_state

pytestmark = pytest.mark.unit


def _scheduler_state(environ: dict):
    """A scheduler process's objects, built the way plugin.register() builds them."""
    return build_state(ProcessKind.SCHEDULER, Settings.from_env(environ))

TRACES = json.loads((Path(__file__).parents[2] / "fixtures" / "decode_step_traces.json").read_text())["traces"]


def _true_step(n: int, tokens: int) -> float:
    """A CPU-like decode step: fixed part + per request + per KV token (seconds)."""
    return 0.012 + 0.004 * n + 0.002 * tokens / 1000


def _noisy(rng: random.Random, value: float) -> float:
    if rng.random() < 0.1:  # a stall: another process took the core
        return value * rng.uniform(2, 5)
    return value + rng.gauss(0, 0.001)


def test_fit_recovers_step_time_through_noise_and_outliers():
    rng, model = random.Random(1), StepTimeModel()
    for _ in range(400):
        n = rng.randrange(1, 33)
        tokens = n * rng.randrange(700, 1000)
        model.add(n, tokens, _noisy(rng, _true_step(n, tokens)))
    for n in (1, 8, 16, 32):
        assert model.predict(n, n * 850) == pytest.approx(_true_step(n, n * 850), abs=0.0015)


def test_fit_is_not_ready_without_spread_and_follows_drift():
    fit = RobustLinearFit(num_features=1, half_life=64)
    for _ in range(50):
        fit.add([4], 0.03)
    assert not fit.ready() and fit.predict([4]) is None  # one batch size: no slope to trust yet
    for i in range(300):
        fit.add([1 + i % 8], 0.010 + 0.004 * (1 + i % 8))
    for i in range(300):  # the machine got slower: the window decays toward the new behaviour
        fit.add([1 + i % 8], 0.020 + 0.006 * (1 + i % 8))
    assert fit.predict([5]) == pytest.approx(0.050, abs=0.002)


def test_step_meter_pairs_launches_and_drops_idle_gaps():
    meter = StepMeter()
    assert meter.on_step_start(10.0, 3, 300, after_idle=False) is None
    sample = meter.on_step_start(10.02, 4, 404, after_idle=False)
    assert (sample.num_running, sample.num_tokens) == (3, 300) and sample.step_s == pytest.approx(0.02)
    assert meter.on_step_start(15.0, 1, 100, after_idle=True) is None  # 5 s spanned an idle scheduler
    assert len(meter.recent) == 1 and meter.ewma_step_s == pytest.approx(0.02)


def test_local_extend_tokens_ride_on_their_step_and_its_cost_is_learnt():
    """A decode-local prefill extend between two decode launches belongs to the first step's sample; with
    nothing decoding (or after idle) the open gap is no step. The model learns the extend's per-token cost,
    and admission predicts the step that carries an extend with it."""
    meter = StepMeter()
    meter.on_step_start(1.0, 4, 400, after_idle=False)
    meter.on_local_extend(32, num_running=4, after_idle=False)
    sample = meter.on_step_start(1.05, 6, 600, after_idle=False)
    assert (sample.num_running, sample.num_local_tokens) == (4, 32)
    assert meter.on_step_start(1.07, 6, 606, after_idle=False).num_local_tokens == 0
    meter.on_local_extend(16, num_running=0, after_idle=False)  # nothing was decoding
    assert meter.on_step_start(9.0, 1, 100, after_idle=False) is None

    rng, model = random.Random(5), StepTimeModel()
    for _ in range(400):
        n = rng.randrange(1, 17)
        local = rng.choice((0, 0, 0, 16, 32, 64))
        model.add(n, n * 800, _true_step(n, n * 800) + 0.0004 * local + rng.gauss(0, 0.0005), local)
    assert model.predict(8, 6400, 64) - model.predict(8, 6400) == pytest.approx(0.0256, abs=0.004)
    plain = decide_admission(model, 0.060, 3, 2400, [800] * 8)
    with_extends = decide_admission(model, 0.060, 3, 2400, [800] * 8, extend_lens=[32] * 8)
    assert with_extends.num_admit < plain.num_admit
    assert with_extends.predicted_step_s <= 0.060 * HEADROOM


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_admission_on_recorded_trace_keeps_predicted_and_observed_steps_in_target(trace):
    samples = TRACES[trace]
    model = StepTimeModel()
    for n, tokens, step_s in samples:
        model.add(n, tokens, step_s)
    assert model.ready()
    by_n = {}
    for n, tokens, step_s in samples:
        by_n.setdefault(n, []).append(step_s)
    mean_len = statistics.median(t / n for n, t, _ in samples)
    for target in (0.030, 0.040, 0.060):
        decision = decide_admission(model, target, 0, 0, [int(mean_len)] * 40)
        assert 1 <= decision.num_admit < 40 and decision.reason == "model"
        assert decision.predicted_step_s <= target * HEADROOM
        # What the real server measured at the admitted batch size (nearest recorded) honours the target.
        near = min(by_n, key=lambda n: (abs(n - decision.num_admit), n))
        assert statistics.median(by_n[near]) <= target * 1.15, (target, decision, near)
    # Adding to a batch already at the target admits nobody; an empty batch always admits one.
    full = decide_admission(model, 0.040, 12, int(12 * mean_len), [int(mean_len)] * 5)
    assert full.num_admit == 0
    starving = decide_admission(model, 0.001, 0, 0, [int(mean_len)] * 5)
    assert (starving.num_admit, starving.reason) == (1, "starvation_guard")


def _simulate(target_s: float | None, num_requests=48, new_tokens=32, prompt_len=800, seed=3):
    """A decode loop on the synthetic step time: admission per step, everyone waiting at t=0."""
    rng, ctl = random.Random(seed), SloController(target_s, None, PDCounters())
    waiting = [prompt_len] * num_requests
    running: list[list[int]] = []  # [kv_len, tokens left]
    now, steps, first_token = 0.0, [], []
    while waiting or running:
        take = ctl.admission_for(len(running), sum(r[0] for r in running), waiting)
        take = len(waiting) if take is None else take
        running += [[length, new_tokens] for length in waiting[:take]]
        first_token += [now] * take
        waiting = waiting[take:]
        n, tokens = len(running), sum(r[0] for r in running)
        step = _noisy(rng, _true_step(n, tokens))
        ctl.on_step_start(now, n, tokens, after_idle=False)
        now += step
        steps.append(step)
        running = [[kv + 1, left - 1] for kv, left in running if left > 1]
    return statistics.median(steps), statistics.median(first_token), ctl


def test_closed_loop_keeps_median_step_within_target_and_unlimited_does_not():
    free_step, free_ttft, _ = _simulate(None)
    capped_step, capped_ttft, ctl = _simulate(0.060)
    assert free_step > 0.120  # everyone at once: ~48 requests per step
    assert capped_step <= 0.060
    assert ctl.step_model.ready() and ctl.snapshot()["num_deferred_steps"] > 0
    assert capped_ttft > free_ttft  # the price: later first tokens


def test_probing_holds_a_small_batch_until_the_model_is_ready():
    decision = decide_admission(StepTimeModel(), 0.040, 0, 0, [800] * 10)
    assert (decision.num_admit, decision.reason) == (1, "probing")
    assert decide_admission(StepTimeModel(), 0.040, PROBE_BATCH - 1, 2400, [800] * 10).num_admit == 1
    assert decide_admission(StepTimeModel(), 0.040, PROBE_BATCH, 3200, [800] * 10).num_admit == 0


def test_ttft_predictor_learns_queue_wait_and_rejection_names_both_figures():
    predictor = TtftPredictor()
    assert predictor.predict(10, 100) is None
    assert not decide_rejection(None, 0.5).reject  # no model yet: never refuse
    for i in range(40):
        ahead = i % 10
        predictor.on_entry(f"r{i}", 100.0 + i, ahead, 64)
        predictor.on_admitted(f"r{i}", 100.0 + i + 0.2 + 0.5 * ahead)
    assert predictor.predict(8, 64) == pytest.approx(4.2, abs=0.05)
    decision = decide_rejection(predictor.predict(8, 64), target_ttft_s=2.0)
    assert decision.reject and decision.retry_after_s == 3
    assert "predicted TTFT 4200 ms exceeds the target 2000 ms" in decision.message
    assert retry_after_from(decision.message) == 3 and retry_after_from("no hint") is None
    assert not decide_rejection(predictor.predict(2, 64), target_ttft_s=2.0).reject


def test_controller_refuses_without_remembering_and_counts():
    counters = PDCounters()
    ctl = SloController(None, 10.0, counters)
    for i in range(20):  # all predicted within 10 s: accepted, and learnt from
        assert not ctl.on_entry(f"ok{i}", float(i), i % 5, 32).reject
        ctl.on_admitted([f"ok{i}"], float(i) + 0.5 * (i % 5))
    ctl.ttft_target_s = 1.0
    refused = ctl.on_entry("late", 21.5, 9, 32)  # predicted 4.5 s > 1 s
    assert refused.reject and ctl.snapshot()["num_rejected"] == 1 and counters.values["early_rejected_requests_total"] == 1
    assert ctl.ttft.num_pending == 0  # refused: nothing remembered for it
    assert "exceeds the target 1000 ms" in ctl.last_rejection
    assert ctl.snapshot()["num_rejected"] == 1
    # Nothing learnt for PROBE_INTERVAL_S (everyone refused): the next one goes through as a probe.
    probe = ctl.on_entry("probe", 21.5 + PROBE_INTERVAL_S, 9, 32)
    assert not probe.reject and ctl.snapshot()["num_probes"] == 1 and ctl.ttft.num_pending == 1
    # The rest of a burst arriving before the probe is admitted is refused: one probe per interval.
    assert all(ctl.on_entry(f"burst{i}", 22.0 + PROBE_INTERVAL_S, 9, 32).reject for i in range(5))
    assert ctl.snapshot()["num_probes"] == 1


def test_a_request_whose_prefill_cannot_be_told_is_let_through_and_counted():
    counters = PDCounters()
    ctl = SloController(None, 10.0, counters)
    for i in range(20):
        ctl.on_entry(f"ok{i}", float(i), i % 5, 32)
        ctl.on_admitted([f"ok{i}"], float(i) + 0.5 * (i % 5))
    ctl.ttft_target_s = 1.0
    assert ctl.on_entry("late", 21.5, 9, 32).reject  # refusable: refused (predicted 4.5 s > 1 s)
    decision = ctl.on_entry("unknown-prefill", 21.6, 9, 32, refusable=False)
    assert not decision.reject and ctl.ttft.num_pending == 1  # admitted, learnt from like any other
    assert counters.values["early_rejection_unrefusable_total"] == 1
    assert counters.values["early_rejected_requests_total"] == 1 and ctl.snapshot()["num_probes"] == 0


def test_a_refusing_predictor_relearns_from_probes():
    ctl = SloController(None, 1.0, PDCounters())
    now = 0.0
    for i in range(16):  # a start-up burst: long waits whatever is ahead (they sat in prefill's queue)
        ctl.on_entry(f"b{i}", now, i % 4, 32)
        ctl.on_admitted([f"b{i}"], now + 4.0)
        now += 0.1
    assert ctl.on_entry("x", now, 1, 32).reject  # biased: one request ahead looks like 4 s
    served = 0
    for i in range(60):  # calm now: a request admitted 0.2 s after it arrives, when let through
        now += 1.0
        if not ctl.on_entry(f"c{i}", now, 1, 32).reject:
            ctl.on_admitted([f"c{i}"], now + 0.2)
            served += 1
    assert ctl.ttft.predict(1, 32) == pytest.approx(0.2, abs=0.1)
    assert not ctl.on_entry("y", now + 0.5, 1, 32).reject and served > 30


def test_nothing_ahead_is_never_refused_even_by_a_biased_fit():
    """A burst taught the fit that every wait is 4 s; an idle decode still serves the next request (no
    refusal can shorten its own prefill), counted apart; one with a request ahead is refused."""
    counters = PDCounters()
    ctl = SloController(None, 1.0, counters)
    for i in range(16):
        ctl.on_entry(f"b{i}", i * 0.1, i % 4, 800)
        ctl.on_admitted([f"b{i}"], i * 0.1 + 4.0)
    assert ctl.ttft.predict(0, 64) > 1.0  # the fit says refuse
    before = counters.values.get("early_rejection_nothing_ahead_total", 0)
    decisions = [ctl.on_entry(f"idle{i}", 5.6 + i * 0.01, 0, 64) for i in range(5)]
    assert not any(d.reject for d in decisions)
    assert counters.values["early_rejection_nothing_ahead_total"] - before == 5
    assert counters.values.get("early_rejection_probes_total", 0) == 0  # no probe was spent on them
    assert ctl.on_entry("queued", 5.7, 3, 64).reject  # within the probe interval of the last lesson


def test_controller_without_targets_limits_and_refuses_nothing():
    ctl = _scheduler_state({}).slo
    assert ctl.admission_for(3, 3000, [800] * 9) is None
    assert not ctl.on_entry("r", 0.0, 100, 5000).reject


def test_target_settings_are_validated_by_name():
    assert validate({"SGLANG_PD_ITL_TARGET_MS": "40", "SGLANG_PD_TTFT_TARGET_MS": "2500.5"}) == []
    problems = validate({"SGLANG_PD_ITL_TARGET_MS": "0", "SGLANG_PD_TTFT_TARGET_MS": "fast"})
    assert "SGLANG_PD_ITL_TARGET_MS='0' must be > 0 milliseconds" in problems
    assert "SGLANG_PD_TTFT_TARGET_MS='fast' is not a number of milliseconds" in problems
    state = _scheduler_state({"SGLANG_PD_ITL_TARGET_MS": "40", "SGLANG_PD_TTFT_TARGET_MS": "2000"})
    assert (state.slo.itl_target_s, state.slo.ttft_target_s) == (0.04, 2.0)
    assert state.slo.counters is state.counters  # wired to the process's one PDCounters


def test_a_steady_batch_keeps_the_last_fit():
    fit = RobustLinearFit(num_features=1)
    for i in range(64):
        fit.add([1 + i % 4], 0.01 * (1 + i % 4))
    before = fit.predict([8])
    for _ in range(600):  # the whole window now holds one batch size: nothing to refit from
        fit.add([4], 0.04)
    assert not fit.ready() and fit.predict([8]) == pytest.approx(before)
