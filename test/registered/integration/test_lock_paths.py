"""Every decode lock path on real servers, each ending with both servers idle, integrity OK and
zero outstanding locks (PDDeployment.wait_clean reads /sglang_pd/stats, which runs check_integrity
in the scheduler)."""

import random
import threading
import time
import uuid

import pytest
import requests

from conftest import WAITING_TIMEOUT_S, initial_states
from sglang_pd.harness import PDDeployment
from sglang_pd.harness.server import free_port
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def _wait_for_plan(dep: PDDeployment, rid: str, timeout_s: float = 60) -> dict:
    """Block until decode admission has planned (matched + locked + preallocated) `rid`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        plan = dep.scheduler_state(dep.decodes[0])["decode_admission"]["plans"].get(rid)
        if plan is not None:
            return plan
        time.sleep(0.2)
    raise AssertionError(f"decode never admitted {rid}")


def _in_background(fn, *args, **kwargs) -> dict:
    out: dict = {}

    def run():
        try:
            out["resp"] = fn(*args, **kwargs)
        except Exception as exc:  # surfaced by the test's assertions
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


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
    fired_before = pd.scheduler_state(pd.decodes[0])["faults"]["fired"].get("transfer_fail", 0)
    pd.arm_faults(pd.decodes[0], transfer_fail=1)
    prompt = _tokens(31, 30)
    _, decoded, _ = pd.post_generate_pd(prompt, 8)
    assert decoded.status_code >= 400, decoded.text
    ok = pd.generate_pd(prompt, 8)[1]
    assert ok["output_ids"] == pd.generate(plain_url, prompt, 8)["output_ids"]
    reports = pd.wait_clean()
    assert reports["decode0"]["faults"]["fired"]["transfer_fail"] == fired_before + 1


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
    primed = _tokens(51, 48)
    pd.generate_pd(primed, 8)  # decode now holds this prefix: the request below locks it
    job = _in_background(pd.post_generate, pd.decodes[0].url, primed + _tokens(52, 9), 8, rid=rid,
                         **pd.pairing())
    plan = _wait_for_plan(pd, rid)
    assert plan["decode_prefix_len"] > 0
    assert pd.scheduler_state(pd.decodes[0])["lock_ledger"]["num_outstanding"] >= 1
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(60)
    assert plan["num_new_pages"] > 0
    pd.wait_clean()


def test_abort_in_prealloc_queue(pd: PDDeployment):
    """Bootstrap server unreachable: the request waits in the prealloc queue, then is aborted."""
    rid = f"abort-prealloc-{uuid.uuid4().hex[:8]}"
    job = _in_background(pd.post_generate, pd.decodes[0].url, _tokens(61, 40), 8, rid=rid,
                         **pd.pairing(bootstrap_port=free_port()))
    time.sleep(3)
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(60)
    assert not job["thread"].is_alive()
    pd.wait_clean()


def test_abort_in_running_batch(pd: PDDeployment, plain_url: str):
    rid = f"abort-running-{uuid.uuid4().hex[:8]}"
    prompt = _tokens(71, 30)
    job = _in_background(pd.post_generate_pd, prompt, 4000, rid=rid)
    _wait_for_plan(pd, rid)
    time.sleep(2.0)  # well inside a 4000-token generation
    pd.abort(pd.decodes[0], rid)
    job["thread"].join(120)
    _, decoded, _ = job["resp"]
    assert len(decoded.json().get("output_ids", [])) < 4000
    assert pd.generate_pd(prompt, 8)[1]["output_ids"] == pd.generate(plain_url, prompt, 8)["output_ids"]
    pd.wait_clean()


def test_transfer_timeout_releases(pd_page16: PDDeployment):
    """No prefill request for the room: decode gives up after the waiting timeout and releases."""
    start = time.monotonic()
    resp = pd_page16.post_generate(pd_page16.decodes[0].url, _tokens(81, 40), 8, **pd_page16.pairing())
    assert resp.status_code >= 400, resp.text
    assert time.monotonic() - start >= WAITING_TIMEOUT_S * 0.9
    pd_page16.wait_clean()
