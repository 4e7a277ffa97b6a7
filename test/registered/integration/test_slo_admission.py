"""SLO-aware decode admission on a real PD pair (capacity model, decode pool 4,096 tokens, page 1):
under SGLANG_PD_ITL_TARGET_MS the measured ITL stays within the target while the cap really holds
requests back, and under SGLANG_PD_TTFT_TARGET_MS a request that would wait too long gets HTTP 503 +
Retry-After at once, holding no lock or page on decode and nothing on prefill; the next is served."""

import concurrent.futures as cf
import random
import time

import pytest
import requests

from sglang_pd.bench.multiturn_workload import WorkloadConfig, run_workload, system_prompt
from sglang_pd.bench.pd_client import abort_prefill_half, pd_stream
from sglang_pd.bench.report import percentile
from lock_checks import assert_lock_held, in_background
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

ITL_TARGET_MS = 40
TTFT_TARGET_MS = 1500
# A long shared system prompt: each running request adds ~4 ms to a decode step here, so 10 of them
# exceed the 40 ms target whatever else the box is doing (with 768 tokens they fit some runs).
WORKLOAD = WorkloadConfig(num_clients=10, num_rounds=2, system_len=1536, first_question_len=32, question_len=16,
                          max_new_tokens=32, concurrency=10)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    env = (("SGLANG_PD_ITL_TARGET_MS", str(ITL_TARGET_MS)), ("SGLANG_PD_TTFT_TARGET_MS", str(TTFT_TARGET_MS)))
    config = DeploymentConfig(model="capacity", page_size=1, decode_max_total_tokens=4096,
                              num_reserved_decode_tokens=32, prefill_max_total_tokens=16384, env_overrides=env,
                              log_dir=tmp_path_factory.mktemp("slo"))
    with PDDeployment(config) as dep:
        yield dep


def _slo(pd: PDDeployment) -> dict:
    return pd.scheduler_state(pd.decodes[0])["slo"]


def test_measured_itl_stays_within_target(pd: PDDeployment):
    info = pd.get_json(pd.decodes[0].url, "/sglang_pd/info")
    assert any("_get_new_prebuilt_batch" in h for h in info["scheduler_hooks"][0])  # ITL admission is hooked
    send = lambda ids, n: pd_stream(pd.prefill.url, pd.decodes[0].url, pd.bootstrap_port, ids, n)  # noqa: E731
    assert send(system_prompt(WORKLOAD), 1).ok
    records = run_workload(WORKLOAD, send)
    served = [r.result for r in records if r.result.ok]
    assert all(r.result.ok or r.result.rejected for r in records), [r.result.error for r in records][:3]
    assert len(served) >= WORKLOAD.num_clients
    itl_p50_ms = 1000 * percentile([g for r in served for g in r.itl_s], 50)
    slo = _slo(pd)
    print(f"ITL p50 {itl_p50_ms:.1f} ms (target {ITL_TARGET_MS}); server: {slo['measured_step_ms']:.1f} ms "
          f"measured, model {slo['step_model']}, {slo['num_deferred_steps']} steps held requests back, "
          f"{sum(r.result.rejected for r in records)} refused and retried")
    assert slo["step_model_ready"] and slo["itl_target_ms"] == ITL_TARGET_MS
    assert slo["num_deferred_steps"] > 0  # the cap really bit: memory alone would have admitted them
    assert itl_p50_ms <= ITL_TARGET_MS * 1.25
    pd.wait_clean()


def test_abort_of_a_request_the_itl_cap_holds_in_the_waiting_queue(pd: PDDeployment):
    """Requests whose KV arrived but the ITL cap keeps out of the running batch wait holding their
    prefix lock and pages; aborting one there releases both."""
    send = lambda ids, n, rid: pd.post_generate_pd(ids, n, rid=rid, timeout=300)  # noqa: E731
    rng = random.Random(12)
    primed = system_prompt(WORKLOAD)  # cached on decode by the previous test: every request locks it
    rids = [f"held-{i}-{rng.randrange(1 << 30)}" for i in range(10)]
    jobs = [in_background(send, primed + [rng.randrange(3, VOCAB_SIZE) for _ in range(16)], 160, rid)
            for rid in rids]
    deadline, victim = time.monotonic() + 120, None
    while victim is None:
        assert time.monotonic() < deadline, "the ITL cap never held one of the requests in the waiting queue"
        state = pd.scheduler_state(pd.decodes[0])
        held = [r for r in state["queues"]["waiting"] if r in rids and r in state["lock_ledger"]["owners"]]
        victim = held[-1] if held else None  # the last one waits longest
        time.sleep(0.05)
    assert_lock_held(pd, victim)
    assert victim in pd.scheduler_state(pd.decodes[0])["queues"]["waiting"], "admitted before the abort"
    pd.abort(pd.decodes[0], victim)
    for rid in rids:
        if rid != victim:
            pd.abort(pd.decodes[0], rid)  # the rest need not run to the end
    for job in jobs:
        job["thread"].join(120)
    reports = pd.wait_clean()
    assert victim not in reports["decode0"]["lock_ledger"]["owners"]
    assert any(r["owner"] == victim for r in reports["decode0"]["lock_ledger"]["recent_releases"])


def _fresh_prompt(rng: random.Random, length: int) -> list[int]:
    return [1] + [rng.randrange(3, VOCAB_SIZE) for _ in range(length - 1)]


def _pair_as_a_router_does(pd: PDDeployment, prompt: list[int], room: int):
    """Send prefill and decode halves; when decode refuses, abort the prefill half (router's job)."""
    extra = {**pd.pairing(room), "rid": f"burst-{room}"}
    with cf.ThreadPoolExecutor(1) as pool:
        prefill = pool.submit(pd.post_generate, pd.prefill.url, prompt, 32, 180, **extra)
        decode = pd.post_generate(pd.decodes[0].url, prompt, 32, 180, **extra)
        if decode.status_code == 503:
            abort_prefill_half(pd.prefill.url, extra["rid"], prefill)
        return prefill.result(), decode, room


def _burst(pd: PDDeployment, rng: random.Random, size: int = 24) -> list:
    rooms = [rng.randrange(1, 2**62) for _ in range(size)]
    with cf.ThreadPoolExecutor(len(rooms)) as pool:
        return list(pool.map(lambda room: _pair_as_a_router_does(pd, _fresh_prompt(rng, 800), room), rooms))


def test_early_rejection_is_a_503_with_retry_after_that_holds_nothing(pd: PDDeployment):
    """Bursts of fresh 800-token prompts until decode refuses some (at most 3). The predictor learns
    online: what the previous test taught it (a calm, capped load) may let a first burst through,
    and the requests it then admits teach it what a burst costs."""
    rng = random.Random(10)
    responses: list = []
    for _ in range(3):
        responses += _burst(pd, rng)
        if any(decode.status_code == 503 for _, decode, _ in responses):
            break
    refused = [(prefill, decode, room) for prefill, decode, room in responses if decode.status_code == 503]
    served = [decode for _, decode, _ in responses if decode.status_code == 200]
    assert refused and served, ([d.status_code for _, d, _ in responses], _slo(pd)["ttft_model"])
    for prefill, decode, room in refused:
        assert int(decode.headers["Retry-After"]) >= 1
        message = decode.json()["message"]
        assert "predicted TTFT" in message and f"exceeds the target {TTFT_TARGET_MS} ms" in message
        assert prefill.status_code >= 400  # its prefill half was aborted, not left waiting for a decode
    reports = pd.wait_clean()  # idle, integrity OK, no outstanding lock on either server
    decode_state = reports[pd.decodes[0].name]
    planned = set(decode_state["decode_admission"]["plans"])
    assert not planned & {f"burst-{room}" for _, _, room in refused}  # never matched, locked or preallocated
    assert decode_state["slo"]["num_rejected"] >= len(refused)
    assert decode_state["counters"]["early_rejected_requests_total"] >= len(refused)
    _, decoded, _ = pd.generate_pd(_fresh_prompt(rng, 64), 8)  # the server keeps serving
    assert len(decoded["output_ids"]) == 8
    pd.wait_clean()


def test_early_rejection_through_the_router_frees_prefill(pd: PDDeployment):
    """Through our launcher + sglang-router, as users deploy it: a request decode refuses must not keep
    prefill's half waiting for a decode that will never come (SGLang's bootstrap timeout is 300 s):
    prefill's queues and KV return to idle within seconds."""
    launcher = pd.start_launcher("affinity")
    try:
        rng = random.Random(14)
        prompts = [_fresh_prompt(rng, 800) for _ in range(24)]
        bodies = [{"input_ids": p, "sampling_params": {"max_new_tokens": 32, "temperature": 0.0}} for p in prompts]
        refused0 = _slo(pd)["num_rejected"]
        statuses: list[int] = []
        for _ in range(3):  # bursts until decode refuses some (the predictor learns online)
            with cf.ThreadPoolExecutor(len(bodies)) as pool:
                statuses += list(pool.map(lambda b: requests.post(launcher.url + "/generate", json=b,
                                                                  timeout=300).status_code, bodies))
            if _slo(pd)["num_rejected"] > refused0:
                break
        refused = _slo(pd)["num_rejected"] - refused0
        assert refused > 0, statuses
        deadline = time.monotonic() + 30
        while True:
            prefill = pd.scheduler_state(pd.prefill)
            busy = {q: rids for q, rids in prefill["queues"].items() if rids}
            if not busy and prefill["integrity"]["idle"]:
                break
            assert time.monotonic() < deadline, f"prefill still holds refused requests: {busy}"
            time.sleep(0.5)
        print(f"\nROUTER early rejection: {refused} refused by decode, statuses {sorted(set(statuses))}, "
              f"prefill idle again")
        pd.wait_clean()
    finally:
        launcher.stop()
