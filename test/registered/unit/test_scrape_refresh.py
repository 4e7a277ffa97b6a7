"""RefreshBeforeScrape on a real Starlette app: /metrics answers only after a refresh ran (single-flight,
at most one per min_interval_s)."""

import asyncio
import threading

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sglang_pd.srt.metrics import RefreshBeforeScrape

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _client(refresh, clock=None) -> tuple[TestClient, dict]:
    seen = {"value": 0}

    async def metrics(request):
        return PlainTextResponse(f"integrity_failures {seen['value']}\n")

    async def other(request):
        return PlainTextResponse("ok")

    async def do_refresh():
        await refresh(seen)

    app = Starlette(routes=[Route("/metrics", metrics), Route("/generate", other)])
    app.add_middleware(RefreshBeforeScrape, refresh=do_refresh, **({"clock": clock} if clock else {}))
    return TestClient(app), seen


def test_scrape_serves_what_the_refresh_just_computed():
    calls = []

    async def refresh(seen):
        calls.append(1)
        seen["value"] += 1  # e.g. the integrity check found one more problem

    clock = Clock()
    client, _ = _client(refresh, clock)
    assert client.get("/metrics").text == "integrity_failures 1\n"
    clock.now += 1.0
    assert client.get("/metrics").text == "integrity_failures 2\n"
    assert client.get("/generate").text == "ok" and len(calls) == 2  # other routes never refresh


def test_failed_refresh_answers_500_naming_the_error():
    async def refresh(seen):
        raise TimeoutError("scheduler did not answer")

    client, _ = _client(refresh)
    resp = client.get("/metrics")
    assert resp.status_code == 500 and "TimeoutError: scheduler did not answer" in resp.text


def test_a_flood_of_scrapes_costs_one_refresh_per_interval(gets_while_held):
    """/metrics is open without the API key and a refresh is work on every scheduler: scrapes arriving while
    one runs share it, and a scrape within min_interval_s of the last serves what that one computed."""
    calls, clock, gate = [], Clock(), threading.Event()

    async def refresh(seen):
        calls.append(1)
        while not gate.is_set():  # a scheduler round trip in flight
            await asyncio.sleep(0.01)
        seen["value"] += 1

    client, _ = _client(refresh, clock)
    with client:
        num_refreshes_while_out, responses = gets_while_held(client, "/metrics", 8, calls, gate)
        assert num_refreshes_while_out == 1
        assert [r.text for r in responses] == ["integrity_failures 1\n"] * 8 and len(calls) == 1  # one served all
        clock.now += 0.5
        assert client.get("/metrics").text == "integrity_failures 1\n" and len(calls) == 1  # within the interval
        clock.now += 0.6
        assert client.get("/metrics").text == "integrity_failures 2\n" and len(calls) == 2
