"""Every decode lock path on real servers, each ending with both servers idle, integrity OK and
zero outstanding locks (PDDeployment.wait_clean reads /sglang_pd/stats, which runs check_integrity
in the scheduler)."""

import random
import time
import uuid

import pytest
import requests

from conftest import WAITING_TIMEOUT_S, initial_states
from lock_checks import assert_lock_held, assert_released_once, in_background, wait_for_plan
from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import assert_threads_alive
from sglang_pd.harness.server import free_port
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


PRIMED = 48  # a multiple of both page sizes under test


def _primed_prompt(dep: PDDeployment, seed: int, num_new: int = 9) -> tuple[list[int], int]:
    """A prompt whose first PRIMED tokens decode already holds (cached by a finished request first), so
    admitting it matches and locks at least them: (prompt, PRIMED)."""
    primed = _tokens(seed, PRIMED)
    dep.generate_pd(primed, 8)
    return primed + _tokens(seed + 1, num_new), PRIMED


def _tree_tokens(dep: PDDeployment) -> int:
    integrity = dep.scheduler_state(dep.decodes[0])["integrity"]
    return integrity["evictable_tokens"] + integrity["protected_tokens"]


def test_warmup_left_the_decode_tree_empty(pd: PDDeployment):
    name = f"page{pd.config.page_size}"
    decode = initial_states[name]["decode0"]
    assert decode["integrity"]["evictable_tokens"] + decode["integrity"]["protected_tokens"] == 0
    assert decode["decode_admission"]["num_skipped_tree"] >= 1, "warmup went through our admission"
    assert decode["lock_ledger"]["num_locks"] == decode["lock_ledger"]["num_releases"]


def test_health_check_never_enters_the_tree(pd_page1: PDDeployment):
    before = _tree_tokens(pd_page1)
    for server in (pd_page1.decodes[0], pd_page1.prefill):
        assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200
    pd_page1.wait_clean()
    assert _tree_tokens(pd_page1) == before


def test_success_path_releases_every_lock(pd: PDDeployment):
    conv = [1] + _tokens(11, 40)
    before = pd.scheduler_state(pd.decodes[0])["lock_ledger"]
    for _ in range(3):
        _, decoded, _ = pd.generate_pd(conv, 8)
        conv = conv + decoded["output_ids"] + _tokens(len(conv), 9)
    reports = pd.wait_clean()
    after = reports["decode0"]["lock_ledger"]
    assert after["num_locks"] - before["num_locks"] >= 3
    assert after["num_outstanding"] == 0 and after["num_double_releases"] == 0
    assert reports["decode0"]["decode_admission"]["num_handoff_mismatches"] == 0


def test_injected_transfer_failure_fails_only_that_request(pd: PDDeployment, plain_url: str):
    """Decode-local failure right after the hand-off: the request's prefix lock (taken at admission)
    is released once on SGLang's failure path."""
    fired_before = pd.scheduler_state(pd.decodes[0])["faults"]["fired"].get("transfer_fail", 0)
    prompt, locked = _primed_prompt(pd, 31)
    rid = f"fail-{uuid.uuid4().hex[:8]}"
    pd.arm_faults(pd.decodes[0], transfer_fail=1)
    _, decoded, _ = pd.post_generate_pd(prompt, 8, rid=rid)
    assert decoded.status_code >= 400, decoded.text
    reports = pd.wait_clean()
    plan = reports["decode0"]["decode_admission"]["plans"][rid]
    assert plan["decode_prefix_len"] >= locked  # it was matched and locked before the failure
    assert_released_once(reports, rid, plan["decode_prefix_len"])
    assert reports["decode0"]["faults"]["fired"]["transfer_fail"] == fired_before + 1
    ok = pd.generate_pd(prompt, 8)[1]
    assert ok["output_ids"] == pd.generate(plain_url, prompt, 8)["output_ids"]
    pd.wait_clean()


# Every length is aligned to page size 1, so the unaligned case runs on the page-16 deployment only.
@pytest.mark.parametrize("deployment,fault,message", [
    ("pd_page16", "prefix_unaligned", "not aligned to page size 16"),
    ("pd_page16", "prefix_exceeds", "exceeds the prompt length"),
    ("pd_page1", "prefix_exceeds", "exceeds the prompt length"),
])
def test_bad_decode_prefix_len_is_rejected_by_prefill(request, plain_url: str, deployment, fault, message):
    pd: PDDeployment = request.getfixturevalue(deployment)
    conv = [3] + _tokens(41, 35)
    first = pd.generate_pd(conv, 8)[1]
    conv = conv + first["output_ids"] + _tokens(42, 20)  # turn 2: a decode hit to corrupt
    pd.arm_faults(pd.decodes[0], **{fault: 1})
    prefill_resp, decode_resp, room = pd.post_generate_pd(conv, 8)
    assert prefill_resp.status_code >= 400 and message in prefill_resp.text, prefill_resp.text
    assert decode_resp.status_code >= 400, decode_resp.text
    rejection = pd.scheduler_state(pd.prefill)["prefill_transfer"]["rejections"][str(room)]
    assert message in rejection["reason"]
    assert pd.generate_pd(conv, 8)[1]["output_ids"] == pd.generate(plain_url, conv, 8)["output_ids"]
    pd.wait_clean()


def test_abort_in_transfer_queue(pd: PDDeployment):
    """Decode-only request: matched, locked, preallocated, then waits for KV that never comes."""
    rid = f"abort-transfer-{uuid.uuid4().hex[:8]}"
    prompt, locked = _primed_prompt(pd, 51)
    job = in_background(pd.post_generate, pd.decodes[0].url, prompt, 8, rid=rid, **pd.pairing())
    plan = wait_for_plan(pd, rid)
    assert plan["decode_prefix_len"] >= locked and plan["num_new_pages"] > 0
    assert rid in pd.scheduler_state(pd.decodes[0])["queues"]["transfer"]
    assert_lock_held(pd, rid)
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(60)
    assert_released_once(pd.wait_clean(), rid, plan["decode_prefix_len"])


def test_abort_in_prealloc_queue(pd: PDDeployment):
    """Bootstrap server unreachable: the request waits in the prealloc queue, then is aborted.

    Decode matches and locks only once the bootstrap is done (SGLang's prealloc loop takes only
    requests waiting for input), so a request in this queue holds no lock by construction: the test
    asserts exactly that before the abort, and nothing left after it."""
    rid = f"abort-prealloc-{uuid.uuid4().hex[:8]}"
    prompt, _ = _primed_prompt(pd, 61)
    job = in_background(pd.post_generate, pd.decodes[0].url, prompt, 8, rid=rid,
                         **pd.pairing(bootstrap_port=free_port()))
    deadline = time.monotonic() + 30
    while rid not in pd.scheduler_state(pd.decodes[0])["queues"]["prealloc"]:
        assert time.monotonic() < deadline, "the request never reached decode's prealloc queue"
        time.sleep(0.2)
    state = pd.scheduler_state(pd.decodes[0])
    assert rid not in state["lock_ledger"]["owners"] and rid not in state["decode_admission"]["plans"]
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(60)
    assert not job["thread"].is_alive()
    reports = pd.wait_clean()
    assert rid not in reports["decode0"]["queues"]["prealloc"]


def test_abort_in_running_batch(pd: PDDeployment, plain_url: str):
    rid = f"abort-running-{uuid.uuid4().hex[:8]}"
    prompt, _ = _primed_prompt(pd, 71)
    job = in_background(pd.post_generate_pd, prompt, 4000, rid=rid)
    wait_for_plan(pd, rid)
    deadline = time.monotonic() + 60
    while rid not in pd.scheduler_state(pd.decodes[0])["queues"]["running"]:
        assert time.monotonic() < deadline, "the request never started decoding"
        time.sleep(0.2)
    time.sleep(1.0)  # well inside a 4000-token generation
    assert_lock_held(pd, rid)
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(120)
    _, decoded, _ = job["resp"]
    assert len(decoded.json().get("output_ids", [])) < 4000
    reports = pd.wait_clean()
    assert rid not in reports["decode0"]["lock_ledger"]["owners"]
    assert any(r["owner"] == rid for r in reports["decode0"]["lock_ledger"]["recent_releases"])
    assert pd.generate_pd(prompt, 8)[1]["output_ids"] == pd.generate(plain_url, prompt, 8)["output_ids"]
    pd.wait_clean()


def test_transfer_timeout_releases(pd_page16: PDDeployment):
    """No prefill request for the room: decode gives up after the waiting timeout and releases."""
    rid = f"timeout-{uuid.uuid4().hex[:8]}"
    prompt, locked = _primed_prompt(pd_page16, 81)
    start = time.monotonic()
    job = in_background(pd_page16.post_generate, pd_page16.decodes[0].url, prompt, 8, rid=rid,
                         **pd_page16.pairing())
    plan = wait_for_plan(pd_page16, rid)
    assert plan["decode_prefix_len"] >= locked
    assert_lock_held(pd_page16, rid)
    job["thread"].join(WAITING_TIMEOUT_S + 60)
    assert job["resp"].status_code >= 400, job["resp"].text
    assert time.monotonic() - start >= WAITING_TIMEOUT_S * 0.9
    assert_released_once(pd_page16.wait_clean(), rid, plan["decode_prefix_len"])


@pytest.mark.parametrize("deployment", ["pd_page16", "pd_nixl"])
def test_prefill_side_transport_failure_releases_decode_lock(request, plain_url: str, deployment):
    """The transport on prefill reports the room's send failed (test fault at the backend's send call):
    upstream's own prefill-side failure path fails the room and tells decode, which releases the lock
    it took at admission. Mooncake also blacklists the decode session until its probe passes (every
    SESSION_PROBE_S here): the pair must serve again."""
    from conftest import SESSION_PROBE_S

    dep: PDDeployment = request.getfixturevalue(deployment)
    prompt, locked = _primed_prompt(dep, 91)
    room = new_bootstrap_room()
    rid = f"prefill-fail-{room}"
    fired0 = dep.scheduler_state(dep.prefill)["faults"]["fired"].get("prefill_transfer_fail", 0)
    dep.arm_faults(dep.prefill, prefill_transfer_fail_room=room)
    prefill_resp, decode_resp, _ = dep.post_generate_pd(prompt, 8, room=room, rid=rid, timeout=120)
    assert decode_resp.status_code >= 400 and prefill_resp.status_code >= 400, (prefill_resp.text, decode_resp.text)
    assert dep.scheduler_state(dep.prefill)["faults"]["fired"]["prefill_transfer_fail"] == fired0 + 1
    reports = dep.wait_clean()
    plan = reports["decode0"]["decode_admission"]["plans"][rid]
    assert plan["decode_prefix_len"] >= locked
    assert_released_once(reports, rid, plan["decode_prefix_len"])
    deadline = time.monotonic() + 10 * SESSION_PROBE_S + 30
    while True:  # served again once the session is trusted again (at once on NIXL)
        _, decoded, _ = dep.post_generate_pd(prompt, 8, timeout=120)
        if decoded.status_code == 200:
            break
        assert time.monotonic() < deadline, f"the pair did not recover: {decoded.text}"
        time.sleep(1)
    assert decoded.json()["output_ids"] == dep.generate(plain_url, prompt, 8)["output_ids"]
    dep.wait_clean()


def test_transfer_worker_error_fails_only_that_room(pd_page16: PDDeployment, plain_url: str):
    """Prefill's mooncake transfer worker raises on one room (test fault at the send: the KeyError SGLang
    0.5.23's worker raised for a room cleared under it, docs/results/fresh_clone/ci_run_0b55ee0_failed.log).
    Upstream alone ends the worker thread and every later room on it waits for decode's timeout. With
    sglang_pd the room fails, decode releases the lock it took, and the same worker (one decode session
    maps to one worker queue) serves the next request at once: no session blacklist, no timeout."""
    dep = pd_page16
    prompt, locked = _primed_prompt(dep, 111)
    state0 = dep.scheduler_state(dep.prefill)
    assert_threads_alive(state0["handshake"], "prefill")
    fired0 = state0["faults"]["fired"].get("prefill_worker_error", 0)
    failed0 = state0["counters"]["transfer_worker_errors_total"].get("failed", 0)
    room = new_bootstrap_room()
    rid = f"worker-error-{room}"
    dep.arm_faults(dep.prefill, prefill_worker_error_room=room)
    start = time.monotonic()
    prefill_resp, decode_resp, _ = dep.post_generate_pd(prompt, 8, room=room, rid=rid, timeout=120)
    assert decode_resp.status_code >= 400 and prefill_resp.status_code >= 400, (prefill_resp.text, decode_resp.text)
    assert time.monotonic() - start < WAITING_TIMEOUT_S, "failed by decode's timeout, not by prefill's word"
    state = dep.scheduler_state(dep.prefill)
    assert state["faults"]["fired"]["prefill_worker_error"] == fired0 + 1
    assert state["counters"]["transfer_worker_errors_total"]["failed"] == failed0 + 1
    reports = dep.wait_clean()
    plan = reports["decode0"]["decode_admission"]["plans"][rid]
    assert plan["decode_prefix_len"] >= locked
    assert_released_once(reports, rid, plan["decode_prefix_len"])
    assert_threads_alive(reports["prefill"]["handshake"], "prefill")
    assert requests.get(dep.prefill.url + "/health", timeout=60).status_code == 200
    for seed in (112, 113):  # served at once, by the worker that raised
        again = _tokens(seed, 40)
        _, decoded, _ = dep.post_generate_pd(again, 8, timeout=120)
        assert decoded.status_code == 200, decoded.text
        assert decoded.json()["output_ids"] == dep.generate(plain_url, again, 8)["output_ids"]
    dep.wait_clean()
