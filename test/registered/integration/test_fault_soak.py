"""Fault soak: >= 200 requests over multi-turn conversations with random client aborts and injected
transfer failures. At the end: zero outstanding locks, KV pool back to its idle baseline (nothing in
flight), both servers healthy, and every non-faulted output equal to a plain server's."""

import concurrent.futures as cf
import random
import threading
import time
import uuid

import pytest

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment import new_bootstrap_room
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

NUM_CONVERSATIONS = 10
NUM_TURNS = 5
REQUESTS_PER_TURN = 4   # each turn: 4 requests sharing the conversation prefix (branches)
ABORT_RATE = 0.08
TRANSFER_FAIL_RATE = 0.06
NEW_TOKENS = 6
SOAK_DEADLINE_S = 900


def _conversation(dep: PDDeployment, conv_id: int, stats: dict, lock: threading.Lock, deadline: float):
    rng = random.Random(1000 + conv_id)
    context = [5 + conv_id] + [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randrange(20, 60))]
    checks = []
    for turn in range(NUM_TURNS):
        kept = None
        for branch in range(REQUESTS_PER_TURN):
            if time.monotonic() > deadline:
                raise AssertionError("soak exceeded its time bound")
            prompt = context + [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randrange(3, 12))]
            roll = rng.random()
            if roll < TRANSFER_FAIL_RATE:
                room = new_bootstrap_room(rng)
                dep.arm_faults(dep.decodes[0], transfer_fail_room=room)
                _, resp, _ = dep.post_generate_pd(prompt, NEW_TOKENS, room=room)
                with lock:
                    stats["faults_injected"] += 1
                    stats["failed_responses"] += int(resp.status_code >= 400)
                assert resp.status_code >= 400, f"injected transfer failure not reported: {resp.text}"
                continue
            if roll < TRANSFER_FAIL_RATE + ABORT_RATE:
                rid = f"soak-abort-{uuid.uuid4().hex[:10]}"
                pool = cf.ThreadPoolExecutor(1)
                pending = pool.submit(dep.post_generate_pd, prompt, 400, rid=rid)
                time.sleep(rng.uniform(0.05, 1.5))
                dep.abort(dep.decodes[0], rid)
                dep.abort(dep.prefill, rid)
                pending.result(timeout=300)
                pool.shutdown()
                with lock:
                    stats["aborts"] += 1
                continue
            _, decoded, _ = dep.generate_pd(prompt, NEW_TOKENS)
            checks.append((prompt, decoded["output_ids"]))
            kept = kept or (prompt, decoded["output_ids"])
            with lock:
                stats["ok"] += 1
        if kept is not None:
            context = kept[0] + kept[1]
    return checks


def test_fault_soak(pd_page16: PDDeployment, plain_url: str):
    dep = pd_page16
    before = dep.wait_clean()["decode0"]["integrity"]
    stats = {"ok": 0, "aborts": 0, "faults_injected": 0, "failed_responses": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + SOAK_DEADLINE_S
    with cf.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_conversation, dep, i, stats, lock, deadline) for i in range(NUM_CONVERSATIONS)]
        checks = [c for f in futures for c in f.result()]
    total = stats["ok"] + stats["aborts"] + stats["faults_injected"]
    assert total >= 200, stats
    assert stats["aborts"] > 0 and stats["faults_injected"] > 0, stats
    for prompt, output in checks:
        assert dep.generate(plain_url, prompt, NEW_TOKENS)["output_ids"] == output
    reports = dep.wait_clean(timeout_s=120)
    dep.check_alive()
    after = reports["decode0"]["integrity"]
    ledger = reports["decode0"]["lock_ledger"]
    assert ledger["num_outstanding"] == 0 and ledger["num_double_releases"] == 0
    assert after["in_flight_tokens"] == 0 and after["protected_tokens"] == 0
    # Idle baseline: every KV slot is free or held by the (evictable) tree.
    assert after["free_tokens"] + after["evictable_tokens"] == before["free_tokens"] + before["evictable_tokens"]
    print(f"\nSOAK requests={total} ok={stats['ok']} aborts={stats['aborts']} "
          f"transfer_faults={stats['faults_injected']} failed_responses={stats['failed_responses']} "
          f"outstanding_locks={ledger['num_outstanding']} locks_taken={ledger['num_locks']} "
          f"decode free+evictable before={before['free_tokens']}+{before['evictable_tokens']} "
          f"after={after['free_tokens']}+{after['evictable_tokens']} in_flight_after={after['in_flight_tokens']}")
