"""One PD request the way a router sends it: prefill (plain POST) + decode (streamed), paired by a
bootstrap room; returns token ids and the client-side timings (TTFT, inter-token gaps)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from dataclasses import dataclass, field

import requests

from sglang_pd.harness.deployment import new_bootstrap_room
from sglang_pd.srt.disaggregation.early_rejection import retry_after_from
from sglang_pd.srt.disaggregation.request_fields import FIELDS


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


def _mark_rejected(result: StreamResult, status: int, text: str, header: str | None = None) -> None:
    result.rejected = status == 503
    if result.rejected:
        result.retry_after_s = int(header) if header else retry_after_from(text)


def abort_prefill_half(prefill_url: str, rid: str, prefill: cf.Future, patience_s: float = 30.0) -> None:
    """Abort the prefill half of a pair whose decode half was refused, until prefill answers.

    Repeated because the abort can reach prefill before the request itself does (then it is a no-op
    and the request would wait for its decode until SGLang's bootstrap timeout)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        requests.post(prefill_url + "/abort_request", json={"rid": rid}, timeout=30)
        try:
            prefill.result(timeout=0.5)
            return
        except cf.TimeoutError:
            continue


def _plain_fields(meta_info: dict) -> dict:
    """Streamed chunks after the first repeat request-level fields as SGLang's accumulated
    one-element list; read them as the number they are."""
    return {k: (v[0] if k in FIELDS and isinstance(v, list) and len(v) == 1 else v) for k, v in meta_info.items()}


def _stream_decode(url: str, body: dict, start: float, timeout: float, result: StreamResult) -> None:
    last = None
    with requests.post(url + "/generate", json=body, stream=True, timeout=timeout) as resp:
        if resp.status_code >= 400:
            result.error = f"decode HTTP {resp.status_code}: {resp.text[:300]}"
            _mark_rejected(result, resp.status_code, resp.text, resp.headers.get("Retry-After"))
            return
        for line in resp.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            finish = (chunk.get("meta_info") or {}).get("finish_reason") or {}
            if finish.get("type") == "abort":  # a stream has sent its 200 before decode refuses it
                result.error = f"decode abort {finish.get('status_code')}: {finish.get('message', '')[:300]}"
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


def pd_stream(prefill_url: str, decode_url: str, bootstrap_port: int, input_ids: list[int],
              max_new_tokens: int, timeout: float = 600) -> StreamResult:
    """Run one greedy PD request; never raises for server-side failures (see `.error`)."""
    room = new_bootstrap_room()
    rid = f"pd-{room}"
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
    pairing = {"bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port, "bootstrap_room": room, "rid": rid}
    result = StreamResult(ok=False, prompt_len=len(input_ids), room=room)
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(1) as pool:
        prefill = pool.submit(requests.post, prefill_url + "/generate", timeout=timeout,
                              json={"input_ids": input_ids, "sampling_params": sampling, **pairing})
        try:
            _stream_decode(decode_url, {"input_ids": input_ids, "sampling_params": sampling, "stream": True,
                                        **pairing}, start, timeout, result)
        except requests.RequestException as exc:
            result.error = f"decode: {exc}"
        if result.rejected:  # as a router would: prefill must not wait for a decode that never comes
            abort_prefill_half(prefill_url, rid, prefill)
        try:
            prefill_resp = prefill.result()
            if prefill_resp.status_code >= 400 and not result.error and not result.rejected:
                result.error = f"prefill HTTP {prefill_resp.status_code}: {prefill_resp.text[:300]}"
        except requests.RequestException as exc:
            result.error = result.error or f"prefill: {exc}"
    result.latency_s = time.perf_counter() - start
    result.ok = result.ok and not result.error and len(result.output_ids) == max_new_tokens
    return result
