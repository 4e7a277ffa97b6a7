"""SingleFlight: one question to the schedulers for every HTTP caller that asks while it is out, and the
HTTP hook's routes (/sglang_pd/stats, /info, the /metrics refresh, /health) sharing theirs."""

import asyncio
from types import SimpleNamespace

import pytest

from sglang_pd.srt.metrics import SingleFlight

pytestmark = pytest.mark.unit


class HeldQuestion:
    """An async question that stays out until `release`; counts how often it was asked."""

    def __init__(self, answers=None, error=None):
        self.num_asked, self.released = 0, asyncio.Event()
        self.answers, self.error = answers, error

    async def __call__(self):
        self.num_asked += 1
        await self.released.wait()
        if self.error is not None:
            raise self.error
        return self.answers[self.num_asked - 1] if self.answers else self.num_asked


async def _while_out(flight, question, num_callers):
    """Start `num_callers` at once, release the question once they all wait on it, collect the results."""
    callers = [asyncio.ensure_future(flight.result()) for _ in range(num_callers)]
    await asyncio.sleep(0.05)
    num_asked_while_out = question.num_asked
    question.released.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    return num_asked_while_out, results


def test_callers_that_arrive_while_the_question_is_out_share_it():
    question = HeldQuestion()
    flight = SingleFlight(question)
    num_asked, results = asyncio.run(_while_out(flight, question, 50))
    assert num_asked == 1 and results == [1] * 50 and flight.num_asked == 1


def test_without_an_interval_each_later_caller_asks_again():
    async def run():
        question = HeldQuestion()
        question.released.set()
        flight = SingleFlight(question)
        return [await flight.result() for _ in range(3)], flight.num_asked

    assert asyncio.run(run()) == ([1, 2, 3], 3)


def test_an_answer_younger_than_the_interval_is_reused():
    async def run():
        now, question = [100.0], HeldQuestion()
        question.released.set()
        flight = SingleFlight(question, min_interval_s=1.0, clock=lambda: now[0])
        first, reused = await flight.result(), await flight.result()
        now[0] += 0.99
        still = await flight.result()
        now[0] += 0.02
        return first, reused, still, await flight.result(), flight.num_asked

    assert asyncio.run(run()) == (1, 1, 1, 2, 2)


def test_a_failed_question_raises_to_every_sharer_and_is_asked_again():
    async def run():
        question = HeldQuestion(error=RuntimeError("scheduler 0 did not answer"))
        flight = SingleFlight(question, min_interval_s=10.0, clock=lambda: 100.0)
        num_asked, results = await _while_out(flight, question, 5)
        question.error, question.answers = None, [None, "fresh"]
        return num_asked, results, await flight.result(), flight.num_asked

    num_asked, results, after, total = asyncio.run(run())
    assert num_asked == 1 and all(isinstance(r, RuntimeError) and "scheduler 0" in str(r) for r in results)
    assert after == "fresh" and total == 2  # nothing stored from the failure, despite the 10 s interval


def test_the_http_hooks_routes_share_one_question_to_the_schedulers(monkeypatch):
    """/sglang_pd/stats, /info, the /metrics refresh and /health's question all ask through one flight: 30
    concurrent calls mixed across them reach SGLang's get_internal_state once."""
    import sglang.srt.entrypoints.http_server as upstream_http
    from sglang_pd.srt.hooks.frontend import http_server

    asked, released = [], None

    async def get_internal_state():
        asked.append(1)
        await released.wait()
        return [{"sglang_pd": {"handshake": {"threads": {"dead": {}}}}}]

    manager = SimpleNamespace(get_internal_state=get_internal_state, bootstrap_server=None)
    monkeypatch.setattr(upstream_http, "get_global_state", lambda: SimpleNamespace(tokenizer_manager=manager))

    async def run():
        nonlocal released
        released = asyncio.Event()
        calls = [http_server._scheduler_states, http_server._refresh_schedulers, http_server._dead_pd_threads] * 10
        callers = [asyncio.ensure_future(call()) for call in calls]
        await asyncio.sleep(0.05)
        num_asked_while_out = len(asked)
        released.set()
        results = await asyncio.gather(*callers)
        return num_asked_while_out, results

    num_asked, results = asyncio.run(run())
    assert num_asked == 1 and len(asked) == 1
    assert results[0] == [{"handshake": {"threads": {"dead": {}}}}] and results[2] == {}
