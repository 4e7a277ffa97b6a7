"""HealthGuardMiddleware on a real Starlette app: /health turns 503 naming dead PD threads; concurrent
callers share one question to the schedulers."""

import asyncio
import threading

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sglang_pd.srt.http import HealthGuardMiddleware

pytestmark = pytest.mark.unit


def _app(dead_threads) -> HealthGuardMiddleware:
    async def health(request):
        return PlainTextResponse("ok")

    return HealthGuardMiddleware(Starlette(routes=[Route("/health", health), Route("/other", health)]),
                                 dead_threads=dead_threads)


def test_a_dead_pd_thread_turns_health_into_503_naming_it():
    async def dead():
        return {"bootstrap_thread": "bootstrap"}

    client = TestClient(_app(dead))
    resp = client.get("/health")
    assert resp.status_code == 503 and resp.json()["dead_threads"] == {"bootstrap_thread": "bootstrap"}
    assert client.get("/other").status_code == 200  # other routes untouched


def test_concurrent_health_calls_share_one_question(gets_while_held):
    """/health is open without the API key and each question is a round trip to every scheduler: 20 callers
    arriving while one question is out wait for it instead of asking 20 times."""
    asked, answer = [], threading.Event()

    async def dead():
        asked.append(1)
        while not answer.is_set():  # the schedulers' answer in flight
            await asyncio.sleep(0.01)
        return {}

    app = _app(dead)
    with TestClient(app) as client:
        num_asked_while_out, responses = gets_while_held(client, "/health", 20, asked, answer)
    assert num_asked_while_out == 1
    assert [r.status_code for r in responses] == [200] * 20 and app.num_asked == 1
