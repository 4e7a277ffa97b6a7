"""RefreshBeforeScrape on a real Starlette app: /metrics answers only after the refresh ran."""

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sglang_pd.srt.scrape_refresh import RefreshBeforeScrape

pytestmark = pytest.mark.unit


def _client(refresh) -> tuple[TestClient, dict]:
    seen = {"value": 0}

    async def metrics(request):
        return PlainTextResponse(f"integrity_failures {seen['value']}\n")

    async def other(request):
        return PlainTextResponse("ok")

    async def do_refresh():
        await refresh(seen)

    app = Starlette(routes=[Route("/metrics", metrics), Route("/generate", other)])
    app.add_middleware(RefreshBeforeScrape, refresh=do_refresh)
    return TestClient(app), seen


def test_scrape_serves_what_the_refresh_just_computed():
    calls = []

    async def refresh(seen):
        calls.append(1)
        seen["value"] += 1  # e.g. the integrity check found one more problem

    client, _ = _client(refresh)
    assert client.get("/metrics").text == "integrity_failures 1\n"
    assert client.get("/metrics").text == "integrity_failures 2\n"
    assert client.get("/generate").text == "ok" and len(calls) == 2  # other routes never refresh


def test_failed_refresh_answers_500_naming_the_error():
    async def refresh(seen):
        raise TimeoutError("scheduler did not answer")

    client, _ = _client(refresh)
    resp = client.get("/metrics")
    assert resp.status_code == 500 and "TimeoutError: scheduler did not answer" in resp.text
