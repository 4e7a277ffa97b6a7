"""One PD request the way a router sends it: prefill (plain POST) + decode (streamed), paired by a
bootstrap room; returns token ids and the client-side timings (TTFT, inter-token gaps). Or one streamed
request through a real sglang-router (`router_stream`), which sends both halves itself.

Every request runs on one asyncio loop (aiohttp) in a background thread of the benchmark process,
whatever thread calls `pd_stream`: on a 2-core box the client shares the cores with both PD servers,
and every CPU second it spends is taken from the servers it measures. A thread per request parsing
its stream with `requests` (the previous client) cost several times what the event loop does; the
benchmark records the client's own CPU in its JSON (`client_cpu_s`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.srt.slo import retry_after_from
from sglang_pd.srt.metrics import FIELDS


@dataclass
class StreamResult:
    """Client-observed outcome of one request."""

    ok: bool
    prompt_len: int
    output_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gap per token after the first
    latency_s: float = 0.0
    meta_info: dict = field(default_factory=dict)
    room: int = 0
    error: str = ""
    rejected: bool = False                # decode refused it at the door (HTTP 503, early rejection)
    retry_after_s: int | None = None      # what the refusal asked the client to wait
    prefill_answer_s: float | None = None  # when prefill's half answered, from the start (None: it did not)


def _mark_rejected(result: StreamResult, status: int, text: str, header: str | None = None) -> None:
    result.rejected = status == 503
    if result.rejected:
        result.retry_after_s = int(header) if header else retry_after_from(text)


def _plain_fields(meta_info: dict) -> dict:
    """Streamed chunks after the first repeat request-level fields as SGLang's accumulated
    one-element list; read them as the number they are."""
    return {k: (v[0] if k in FIELDS and isinstance(v, list) and len(v) == 1 else v) for k, v in meta_info.items()}


class _Loop:
    """The benchmark process's asyncio loop (daemon thread) and its HTTP session, made on first use."""

    _lock = threading.Lock()
    _instance: _Loop | None = None

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="pd-client-loop", daemon=True).start()
        self.session = self.run(self._session(), timeout=30)

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),  # no cap: one connection per stream
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),  # wait_for bounds it
                                     json_serialize=lambda obj: orjson.dumps(obj).decode())

    @classmethod
    def get(cls) -> _Loop:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, coro, timeout: float):
        """Run `coro` on the loop from any other thread; its result (raises what it raises)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def run_on_client_loop(coro, timeout: float):
    """Run `coro` on the benchmark's client loop (where every request of this module runs) from any
    other thread; blocks the caller, returns its result (raises what it raises)."""
    return _Loop.get().run(coro, timeout)


async def _stream_decode(session: aiohttp.ClientSession, url: str, body: dict, start: float,
                         result: StreamResult, who: str = "decode") -> None:
    last = None
    async with session.post(url + "/generate", json=body) as resp:
        if resp.status >= 400:
            text = await resp.text()
            result.error = f"{who} HTTP {resp.status}: {text[:300]}"
            _mark_rejected(result, resp.status, text, resp.headers.get("Retry-After"))
            return
        async for line in resp.content:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            chunk = orjson.loads(line[5:])
            finish = (chunk.get("meta_info") or {}).get("finish_reason") or {}
            if finish.get("type") == "abort":  # a stream has sent its 200 before decode refuses it
                result.error = f"{who} abort {finish.get('status_code')}: {finish.get('message', '')[:300]}"
                _mark_rejected(result, int(finish.get("status_code") or 0), str(finish.get("message", "")))
                return
            ids = chunk.get("output_ids") or []
            now = time.perf_counter()
            new = ids[len(result.output_ids):] if len(ids) >= len(result.output_ids) else ids
            if not new:
                continue
            if last is None:
                result.ttft_s = now - start
            else:
                result.itl_s.extend([(now - last) / len(new)] * len(new))
            last = now
            result.output_ids.extend(new)
            result.meta_info = _plain_fields(chunk.get("meta_info", result.meta_info))
    result.ok = True


async def _abort_prefill_half(session: aiohttp.ClientSession, prefill_url: str, rid: str, prefill: asyncio.Task,
                              patience_s: float = 30.0) -> None:
    """Abort the prefill half of a pair whose decode half was refused, until prefill answers.

    Repeated because the abort can reach prefill before the request itself does (then it is a no-op
    and the request would wait for its decode until SGLang's bootstrap timeout)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline and not prefill.done():
        async with session.post(prefill_url + "/abort_request", json={"rid": rid}) as resp:
            await resp.read()
        await asyncio.wait([prefill], timeout=0.5)


async def _prefill_half(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, str]:
    async with session.post(url + "/generate", json=body) as resp:
        return resp.status, await resp.text()


def _greedy(max_new_tokens: int) -> dict:
    """The benchmark's sampling: greedy, exactly `max_new_tokens` (EOS ignored)."""
    return {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}


def _finish(result: StreamResult, start: float, max_new_tokens: int) -> StreamResult:
    """Stamp the latency; ok only with no error and every token asked for (mutates `result`)."""
    result.latency_s = time.perf_counter() - start
    result.ok = result.ok and not result.error and len(result.output_ids) == max_new_tokens
    return result


def _stamp_prefill_answer(task: asyncio.Task, result: StreamResult, start: float) -> None:
    """Done callback of the prefill half: when its answer reached the client (not when it failed)."""
    if not task.cancelled() and task.exception() is None:
        result.prefill_answer_s = time.perf_counter() - start


async def pd_stream_async(prefill_url: str, decode_url: str, bootstrap_port: int, input_ids: list[int],
                          max_new_tokens: int, timeout: float = 600) -> StreamResult:
    """Run one greedy PD request on the client's loop; never raises for server-side failures (see `.error`)."""
    session = _Loop.get().session
    room = new_bootstrap_room()
    rid = f"pd-{room}"
    sampling = _greedy(max_new_tokens)
    pairing = {"bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": room, "rid": rid}
    result = StreamResult(ok=False, prompt_len=len(input_ids), room=room)
    start = time.perf_counter()
    prefill = asyncio.create_task(_prefill_half(session, prefill_url, {"input_ids": input_ids,
                                                                       "sampling_params": sampling, **pairing}))
    prefill.add_done_callback(lambda task: _stamp_prefill_answer(task, result, start))
    try:
        await asyncio.wait_for(_stream_decode(session, decode_url, {"input_ids": input_ids, "sampling_params": sampling,
                                                                    "stream": True, **pairing}, start, result), timeout)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.error = f"decode: {type(exc).__name__}: {exc}"
    if result.rejected:  # as a router would: prefill must not wait for a decode that never comes
        await _abort_prefill_half(session, prefill_url, rid, prefill)
    try:
        status, text = await asyncio.wait_for(prefill, timeout)
        if status >= 400 and not result.error and not result.rejected:
            result.error = f"prefill HTTP {status}: {text[:300]}"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.error = result.error or f"prefill: {type(exc).__name__}: {exc}"
    return _finish(result, start, max_new_tokens)


def pd_stream(prefill_url: str, decode_url: str, bootstrap_port: int, input_ids: list[int],
              max_new_tokens: int, timeout: float = 600) -> StreamResult:
    """`pd_stream_async` from any thread (blocks the caller, not the loop)."""
    return _Loop.get().run(pd_stream_async(prefill_url, decode_url, bootstrap_port, input_ids, max_new_tokens,
                                           timeout), timeout=2 * timeout + 60)


async def router_stream_async(router_url: str, input_ids: list[int], max_new_tokens: int,
                              timeout: float = 600) -> StreamResult:
    """One greedy request streamed through sglang-router in PD mode, which picks the pair and the bootstrap
    room and sends both halves itself; it passes decode's stream on only after prefill's half has answered
    (FINDINGS section 7), so the TTFT seen here includes that wait. `room` holds this client's request
    number (the rid is `pd-<room>`, as `pd_stream`'s, so decode's per-request records match); when
    prefill's half answered is not visible here (`prefill_answer_s` stays None)."""
    session = _Loop.get().session
    number = new_bootstrap_room()
    sampling = _greedy(max_new_tokens)
    result = StreamResult(ok=False, prompt_len=len(input_ids), room=number)
    start = time.perf_counter()
    try:
        await asyncio.wait_for(_stream_decode(session, router_url, {"input_ids": input_ids, "sampling_params": sampling,
                                                                    "stream": True, "rid": f"pd-{number}"},
                                              start, result, who="router"), timeout)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.error = f"router: {type(exc).__name__}: {exc}"
    return _finish(result, start, max_new_tokens)


def router_stream(router_url: str, input_ids: list[int], max_new_tokens: int, timeout: float = 600) -> StreamResult:
    """`router_stream_async` from any thread (blocks the caller, not the loop)."""
    return _Loop.get().run(router_stream_async(router_url, input_ids, max_new_tokens, timeout), timeout=timeout + 60)
