"""A PD scheduler's idle wait on its own: it sleeps the configured time and counts it; 0 is off; the
setting is validated at start-up (bad values refused with a message naming it)."""

import time

import pytest

from sglang_pd.config import IDLE_WAIT_US, Settings, problems
from sglang_pd.srt.threads import IdleWait
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def test_a_wait_sleeps_its_time_and_is_counted():
    counters = PDCounters()
    wait = IdleWait(0.002, counters)
    assert wait.enabled
    start = time.perf_counter()
    for _ in range(3):
        wait.wait()
    assert time.perf_counter() - start >= 0.006
    assert counters.values["pd_idle_waits_total"] == 3
    assert counters.values["pd_idle_wait_seconds_total"] >= 0.006


def test_zero_is_upstreams_spin_and_negative_is_refused():
    assert not IdleWait(0.0, PDCounters()).enabled
    with pytest.raises(ValueError, match=">= 0"):
        IdleWait(-1e-6, PDCounters())


def test_the_setting_defaults_to_500_us_and_refuses_bad_values():
    assert Settings.from_env({}).idle_wait_us == 500
    assert Settings.from_env({IDLE_WAIT_US: "0"}).idle_wait_us == 0
    for bad in ("-1", "abc", "100001", "2.5"):
        (problem,) = problems({IDLE_WAIT_US: bad})
        assert problem.startswith(f"{IDLE_WAIT_US}={bad!r}") and "microseconds" in problem
