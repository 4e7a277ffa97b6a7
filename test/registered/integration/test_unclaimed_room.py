"""A decode request whose room no prefill request ever claims (its prefill half never sent: a crashed
router, a buggy client, a stranger) fails when prefill drops the room's transfer info as unclaimed,
with a reason naming that, instead of holding its lock and pages until decode's waiting timeout
(SGLang's default 300 s). The lock is held just before and released exactly once after; the pair keeps
serving; a prefill half that arrives after all fails at once. Prefill tells only a decode endpoint that
registered with it (never one a message names).
NIXL's status message carries the reason to the client; mooncake's carries none (SGLang's decode then
reports its generic prefill failure), so there the test tells the two exits apart by time and text.
The pair is conftest's pd_curve_ttl (peers authenticated, CURVE on: shared with test_curve_pair.py).

The other order: a prefill half that failed on its own (here: SGLang's bootstrap timeout, no transfer
info came) and a decode half that arrives after. SGLang re-creates the cleared room for the late
transfer info and decode would wait until the room expires as unclaimed; prefill remembers the room
its request failed, refuses the late transfer info and tells decode at once (counted apart from the
unclaimed expiry, which stays unchanged). Past the TTL prefill no longer remembers the room, and a
transfer info arriving then is left to that expiry: decode is told at the TTL, not at its own timeout."""

import time
import uuid

import pytest

from conftest import PAIR_BOOTSTRAP_TIMEOUT_S, PAIR_WAITING_TIMEOUT_S, UNCLAIMED_ROOM_TTL_TEST_S
from lock_checks import assert_lock_held, assert_released_once, in_background, wait_for_plan, wait_until
from sglang_pd.harness import PDDeployment
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

TTL_S = UNCLAIMED_ROOM_TTL_TEST_S
WAITING_TIMEOUT_S = PAIR_WAITING_TIMEOUT_S  # decode's own patience, SGLang's default: far longer than the TTL
BOOTSTRAP_TIMEOUT_S = PAIR_BOOTSTRAP_TIMEOUT_S  # prefill's patience for decode's transfer info


@pytest.fixture
def pd_ttl(pd_curve_ttl) -> PDDeployment:
    """conftest's CURVE + short-TTL pair (shared with test_curve_pair.py), per transfer backend."""
    return pd_curve_ttl


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + 31 * i) % (VOCAB_SIZE - 3) + 3 for i in range(n)]


def test_a_decode_half_without_its_prefill_half_fails_at_the_unclaimed_ttl(pd_ttl: PDDeployment):
    dep = pd_ttl
    primed = _prompt(1, 48)
    dep.generate_pd(primed, 8)  # decode holds this prefix: the orphan below matches and locks it
    prompt = primed + _prompt(2, 9)
    rid = f"orphan-{uuid.uuid4().hex[:8]}"
    expired0 = dep.scheduler_state(dep.prefill)["counters"]["unclaimed_rooms_expired_total"]
    start = time.monotonic()
    pairing = dep.pairing()
    job = in_background(dep.post_generate, dep.decodes[0].url, prompt, 8, rid=rid, **pairing)
    plan = wait_for_plan(dep, rid)
    assert plan["decode_prefix_len"] >= 48
    assert_lock_held(dep, rid)
    job["thread"].join(WAITING_TIMEOUT_S / 2)
    elapsed = time.monotonic() - start
    assert not job["thread"].is_alive(), "decode still waits: prefill's drop did not reach it"
    resp = job["resp"]
    assert resp.status_code >= 400 and "WAITING_TIMEOUT" not in resp.text, resp.text  # not decode's own timeout
    if dep.config.transfer_backend == "nixl":
        assert "no prefill request claimed it within 3 s" in resp.text, resp.text
    else:
        assert "Failed to get kvcache from prefill" in resp.text, resp.text  # SGLang's text for a prefill failure
    assert TTL_S * 0.9 <= elapsed < WAITING_TIMEOUT_S / 4, elapsed
    assert dep.scheduler_state(dep.prefill)["counters"]["unclaimed_rooms_expired_total"] == expired0 + 1
    assert_released_once(dep.wait_clean(), rid, plan["decode_prefix_len"])
    # The prefill half arriving after all: the room is tombstoned, so it fails at once with the reason
    # instead of waiting for a transfer info until prefill's bootstrap timeout (SGLang's default 300 s).
    start = time.monotonic()
    late = dep.post_generate(dep.prefill.url, prompt, 8, timeout=120, rid=f"{rid}-late", **pairing)
    assert time.monotonic() - start < 30 and "no prefill request claimed it" in late.text, late.text
    # the pair serves on, the same prompt included
    assert dep.generate_pd(prompt, 8)[1]["meta_info"]["decode_prefix_len"] >= 48
    dep.wait_clean()


def _late_decode_half(dep: PDDeployment, seed: int, wait_s: float) -> dict:
    """A primed prefix; a prefill half sent alone (no transfer info comes, so SGLang fails it at its
    bootstrap timeout and clears the room); `wait_s` later its decode half, which matches and locks the
    prefix. Returns rid, decode's response and elapsed s, the plan and prefill's counters before."""
    primed = _prompt(seed, 48)
    dep.generate_pd(primed, 8)  # decode holds this prefix: the late half matches and locks it
    prompt = primed + _prompt(seed + 1, 9)
    rid = f"late-decode-{uuid.uuid4().hex[:8]}"
    pairing = dep.pairing()
    counters0 = dep.scheduler_state(dep.prefill)["counters"]
    start = time.monotonic()
    early = dep.post_generate(dep.prefill.url, prompt, 8, timeout=120, rid=f"{rid}-prefill", **pairing)
    waited = time.monotonic() - start
    assert early.status_code >= 400 and "timed out" in early.text, early.text
    assert BOOTSTRAP_TIMEOUT_S * 0.9 <= waited < 60, waited
    assert dep.scheduler_state(dep.prefill)["handshake"]["gate"]["num_failed_rooms"] >= 1  # prefill remembers it
    time.sleep(wait_s)
    start = time.monotonic()
    resp = dep.post_generate(dep.decodes[0].url, prompt, 8, timeout=WAITING_TIMEOUT_S / 2, rid=rid, **pairing)
    elapsed = time.monotonic() - start
    assert resp.status_code >= 400 and "WAITING_TIMEOUT" not in resp.text, resp.text
    plan = wait_for_plan(dep, rid)  # decode matched, locked and preallocated before its info went out
    assert plan["decode_prefix_len"] >= 48
    return {"rid": rid, "prompt": prompt, "resp": resp, "elapsed": elapsed, "plan": plan, "before": counters0}


def _count(counters: dict, name: str) -> int:
    return counters.get(name, 0)


def test_a_decode_half_after_its_prefill_half_failed_is_told_at_once(pd_ttl: PDDeployment):
    dep = pd_ttl
    late = _late_decode_half(dep, 3, wait_s=0)
    resp = late["resp"]
    if dep.config.transfer_backend == "nixl":
        assert "arrived after prefill's request for it had failed: Request" in resp.text, resp.text
    else:
        assert "Failed to get kvcache from prefill" in resp.text, resp.text  # SGLang's text for a prefill failure
    time.sleep(TTL_S + 2)  # an admitted info would have expired as unclaimed by now
    before, after = late["before"], dep.scheduler_state(dep.prefill)["counters"]
    assert _count(after, "late_transfer_infos_refused_total") == _count(before, "late_transfer_infos_refused_total") + 1
    assert _count(after, "unclaimed_rooms_expired_total") == _count(before, "unclaimed_rooms_expired_total")
    assert late["elapsed"] < 30, late["elapsed"]  # at once: not the TTL (3 s here, 120 s default), not 300 s
    assert_released_once(dep.wait_clean(), late["rid"], late["plan"]["decode_prefix_len"])
    assert dep.generate_pd(late["prompt"], 8)[1]["meta_info"]["decode_prefix_len"] >= 48  # the pair serves on
    dep.wait_clean()


def test_a_decode_half_after_prefill_forgot_its_failed_room_expires_at_the_ttl(pd_ttl: PDDeployment):
    dep = pd_ttl
    late = _late_decode_half(dep, 5, wait_s=TTL_S + 1)  # prefill remembers a failed room for the TTL only
    if dep.config.transfer_backend == "nixl":
        assert "no prefill request claimed it within 3 s" in late["resp"].text, late["resp"].text
    before, after = late["before"], dep.scheduler_state(dep.prefill)["counters"]
    assert _count(after, "unclaimed_rooms_expired_total") == _count(before, "unclaimed_rooms_expired_total") + 1
    assert _count(after, "late_transfer_infos_refused_total") == _count(before, "late_transfer_infos_refused_total")
    assert TTL_S * 0.9 <= late["elapsed"] < 30, late["elapsed"]  # the TTL, not decode's own timeout
    assert_released_once(dep.wait_clean(), late["rid"], late["plan"]["decode_prefix_len"])


def test_a_prefill_half_aborted_after_its_decode_half_registered_tells_decode_at_once(pd_ttl: PDDeployment):
    """SGLang's prefill abort marks the room Failed and tells nobody: a decode whose transfer info had
    come held its pages and prefix lock until its waiting timeout (without the tell: still waiting at the
    client's 150 s). A test fault keeps the request in prefill's bootstrap queue, bootstrapped and uncomputed
    (SGLang's own "not yet" answer), while prefill aborts it; decode is told at once, with the reason."""
    _abort_a_held_prefill_half(pd_ttl, 9, "prefill_bootstrap_hold", "prefill_failures_told_total")


def test_a_prefill_half_aborted_in_prefills_waiting_queue_tells_decode_at_once(pd_ttl: PDDeployment):
    """SGLang's abort of a request in prefill's waiting queue (bootstrapped, queued for its forward) drops it
    without clearing its sender: decode untold, the room's tables kept. A test fault keeps the request in the
    waiting queue (out of the batches SGLang picks) while prefill aborts it; our hook clears the sender
    (counted) and decode is told at once."""
    _abort_a_held_prefill_half(pd_ttl, 11, "prefill_waiting_hold", "prefill_waiting_aborts_cleared_total")


def _abort_a_held_prefill_half(dep: PDDeployment, seed: int, fault: str, path_counter: str) -> None:
    """Hold a request on prefill with `fault` (bootstrapped, uncomputed), abort its prefill half, and check
    that decode is told at once (lock held before, released once after) and that `path_counter` moved."""
    primed = _prompt(seed, 48)
    dep.generate_pd(primed, 8)  # decode holds this prefix: the victim matches and locks it
    prompt = primed + _prompt(seed + 1, 9)
    rid = f"prefill-aborted-{uuid.uuid4().hex[:8]}"
    pairing = dep.pairing()
    room = pairing["bootstrap_room"]
    before = dep.scheduler_state(dep.prefill)
    dep.arm_faults(dep.prefill, **{f"{fault}_room": room})
    prefill_half = in_background(dep.post_generate, dep.prefill.url, prompt, 8, 120, rid=rid, **pairing)
    decode_half = in_background(dep.post_generate, dep.decodes[0].url, prompt, 8, WAITING_TIMEOUT_S / 2, rid=rid,
                                **pairing)
    plan = wait_for_plan(dep, rid)
    assert plan["decode_prefix_len"] >= 48
    # the state under test: decode's transfer info held on prefill, the request bootstrapped, held by the
    # fault where it is meant to be (it fires only there), not computed
    wait_until(lambda: dep.scheduler_state(dep.prefill)["faults"]["fired"].get(fault, 0)
               == before["faults"]["fired"].get(fault, 0) + 1, f"{fault} holding the victim", 60, 0.05)
    rooms = dep.scheduler_state(dep.prefill)["handshake"]["rooms"]
    assert room in rooms["transfer_info_rooms"] and room in rooms["by_status"].get("2", []), rooms  # WaitingForInput
    assert_lock_held(dep, rid)
    start = time.monotonic()
    dep.abort(dep.prefill, rid)
    prefill_half["thread"].join(60)
    decode_half["thread"].join(WAITING_TIMEOUT_S / 2)
    elapsed = time.monotonic() - start
    assert "resp" in decode_half, decode_half  # answered, not the client's own timeout
    resp = decode_half["resp"]
    assert resp.status_code >= 400 and "WAITING_TIMEOUT" not in resp.text and "timed out" not in resp.text, resp.text
    if dep.config.transfer_backend == "nixl":
        assert "prefill's request failed: Aborted by AbortReq." in resp.text, resp.text
    else:
        assert "Failed to get kvcache from prefill" in resp.text, resp.text  # SGLang's text for a prefill failure
    assert elapsed < 8, elapsed  # at once: before the fault would have let the request go (10 s)
    after = dep.scheduler_state(dep.prefill)["counters"]
    assert _count(after, "prefill_failures_told_total") == _count(before["counters"], "prefill_failures_told_total") + 1
    assert _count(after, path_counter) == _count(before["counters"], path_counter) + 1
    assert_released_once(dep.wait_clean(), rid, plan["decode_prefix_len"])
    assert dep.generate_pd(prompt, 8)[1]["meta_info"]["decode_prefix_len"] >= 48  # the pair serves on
    dep.wait_clean()

