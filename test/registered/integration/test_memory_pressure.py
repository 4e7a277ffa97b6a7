"""A decode pool too small for the load: retraction and admission refused after the lock, both
balanced; then the prefill server dies with requests in flight. Own deployment (it kills prefill)."""

import concurrent.futures as cf
import random
import time
import uuid

import pytest
import requests

from conftest import LOG_ROOT, WAITING_TIMEOUT_S, record_figures
from lock_checks import in_background
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

NUM_REQUESTS = 6
NEW_TOKENS = 160


@pytest.fixture(scope="module")
def pd_pressure():
    # 6 requests x (64 prompt + 160 new) tokens need ~1350 slots; the decode pool has 768.
    config = DeploymentConfig(page_size=16, decode_max_total_tokens=768, num_reserved_decode_tokens=32,
                              log_dir=LOG_ROOT / "pressure",
                              env_overrides=(("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),))
    with PDDeployment(config) as dep:
        yield dep


def test_retraction_keeps_outputs_and_stays_balanced(pd_pressure: PDDeployment, plain_url: str):
    """Concurrent long generations over a shared prefix force retraction; resume re-matches the tree
    (radix-aware resume, on by default) and restores only what the tree does not hold."""
    dep = pd_pressure
    rng = random.Random(7)
    shared = [6] + [rng.randrange(3, VOCAB_SIZE) for _ in range(47)]
    prompts = [shared + [rng.randrange(3, VOCAB_SIZE) for _ in range(16)] for _ in range(NUM_REQUESTS)]
    dep.generate_pd(shared, 4)  # the shared prefix is now on decode
    with cf.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        outs = list(pool.map(lambda p: dep.generate_pd(p, NEW_TOKENS)[1]["output_ids"], prompts))
    state = dep.scheduler_state(dep.decodes[0])
    resume = state["radix_resume"]
    print(f"\nPRESSURE retracted={state['num_retracted']} locks={state['lock_ledger']['num_locks']} "
          f"resumed={resume['num_resumed']} tokens restored: {resume['num_restored_tokens']} with re-match vs "
          f"{resume['num_backup_tokens']} without ({resume['num_reused_tokens']} taken from the tree)")
    record_figures("pressure_resume", {"num_retracted": state["num_retracted"], "num_resumed": resume["num_resumed"],
                                       "num_restored_tokens": resume["num_restored_tokens"],
                                       "num_backup_tokens": resume["num_backup_tokens"],
                                       "num_reused_tokens": resume["num_reused_tokens"]})
    assert state["num_retracted"] > 0, "the load must force decode retraction"
    assert resume["num_resumed"] > 0 and resume["pending"] == [] and state["hook_errors"] == {}
    assert resume["num_reused_tokens"] >= 48 * resume["num_resumed"]  # at least the shared prefix each
    assert resume["num_restored_tokens"] + resume["num_reused_tokens"] == resume["num_backup_tokens"]
    for prompt, out in zip(prompts, outs):
        assert out == dep.generate(plain_url, prompt, NEW_TOKENS)["output_ids"]
    reports = dep.wait_clean(timeout_s=120)
    assert reports["decode0"]["lock_ledger"]["num_double_releases"] == 0


def test_abort_in_the_retracted_queue(pd_pressure: PDDeployment):
    """A request retracted under memory pressure waits with its KV backed up to CPU and no tree lock
    (retraction released it); aborting it there leaves nothing behind and the others finish."""
    dep = pd_pressure
    rng = random.Random(17)
    shared = [6] + [rng.randrange(3, VOCAB_SIZE) for _ in range(47)]
    dep.generate_pd(shared, 4)
    rids = [f"retract-{i}-{uuid.uuid4().hex[:6]}" for i in range(NUM_REQUESTS)]
    jobs = [in_background(dep.post_generate_pd, shared + [rng.randrange(3, VOCAB_SIZE) for _ in range(16)],
                          NEW_TOKENS, rid=rid, timeout=300) for rid in rids]
    deadline, victim = time.monotonic() + 180, None
    while victim is None:
        assert time.monotonic() < deadline, "no request was retracted"
        state = dep.scheduler_state(dep.decodes[0])
        retracted = [r for r in state["queues"]["retracted"] if r in rids]
        victim = retracted[0] if retracted else None
        time.sleep(0.05)
    assert victim not in state["lock_ledger"]["owners"], "retraction gave its lock back (same snapshot)"
    dep.abort(dep.decodes[0], victim)
    for job in jobs:
        job["thread"].join(300)
    _, decoded, _ = next(j["resp"] for rid, j in zip(rids, jobs) if rid == victim)
    assert len(decoded.json().get("output_ids", [])) < NEW_TOKENS, "the abort cut the retracted request short"
    finished = [j["resp"][1] for rid, j in zip(rids, jobs) if rid != victim]
    assert all(r.status_code == 200 and len(r.json()["output_ids"]) == NEW_TOKENS for r in finished)
    reports = dep.wait_clean(timeout_s=120)
    assert reports["decode0"]["radix_resume"]["pending"] == []
    assert victim not in reports["decode0"]["lock_ledger"]["owners"]


def test_burst_is_admitted_in_rounds_that_evict_once(pd_pressure: PDDeployment, plain_url: str):
    """A full decode tree, then a burst of new prompts: admission rounds evict for the whole round."""
    dep = pd_pressure
    rng = random.Random(21)
    for _ in range(5):  # finished requests leave ~640 tokens cached on decode (pool: 768)
        dep.generate_pd([rng.randrange(3, VOCAB_SIZE) for _ in range(128)], 2)
    before = dep.scheduler_state(dep.decodes[0])
    prompts = [[rng.randrange(3, VOCAB_SIZE) for _ in range(96)] for _ in range(4)]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda p: dep.generate_pd(p, 8)[1]["output_ids"], prompts))
    after = dep.scheduler_state(dep.decodes[0])
    rounds0, rounds = before["admission_round"], after["admission_round"]
    evicted = after["counters"]["evicted_tokens_total"] - before["counters"]["evicted_tokens_total"]
    print(f"\nROUNDS rounds={rounds['num_rounds'] - rounds0['num_rounds']} "
          f"round evictions={rounds['num_evictions'] - rounds0['num_evictions']} "
          f"max round size={rounds['max_round_size']} tokens evicted={evicted}")
    record_figures("pressure_rounds", {"num_rounds": rounds["num_rounds"] - rounds0["num_rounds"],
                                       "num_round_evictions": rounds["num_evictions"] - rounds0["num_evictions"],
                                       "max_round_size": rounds["max_round_size"], "num_evicted_tokens": evicted,
                                       "num_burst_requests": len(prompts)})
    assert rounds["num_evictions"] > rounds0["num_evictions"] and evicted > 0
    assert rounds["num_planned"] - rounds0["num_planned"] >= len(prompts)
    for prompt, out in zip(prompts, outs):
        assert out == dep.generate(plain_url, prompt, 8)["output_ids"]
    reports = dep.wait_clean(timeout_s=120)
    assert reports["decode0"]["lock_ledger"]["num_double_releases"] == 0


def test_admission_refused_after_lock_releases_it(pd_pressure: PDDeployment, plain_url: str):
    """Decode-only requests pin most of the pool in the transfer queue (not retractable); a new
    request sharing a cached prefix is then matched and locked, refused for budget, its lock released,
    and retried (matched and locked again) until room frees."""
    dep = pd_pressure
    rng = random.Random(11)
    primed = [rng.randrange(3, VOCAB_SIZE) for _ in range(48)]
    dep.generate_pd(primed, 4)  # decode now holds these 48 tokens: the refused request locks them
    fillers = [f"pin-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    rid = f"refused-{uuid.uuid4().hex[:8]}"
    with cf.ThreadPoolExecutor(4) as pool:
        pinned = [pool.submit(dep.post_generate, dep.decodes[0].url,
                              [rng.randrange(3, VOCAB_SIZE) for _ in range(192)], 8, 300, rid=r, **dep.pairing())
                  for r in fillers]
        deadline = time.monotonic() + 60
        while not all(r in dep.scheduler_state(dep.decodes[0])["decode_admission"]["plans"] for r in fillers):
            assert time.monotonic() < deadline, "fillers were not admitted"
            time.sleep(0.2)
        replans0 = dep.scheduler_state(dep.decodes[0])["decode_admission"]["num_replans"]
        prompt = primed + [rng.randrange(3, VOCAB_SIZE) for _ in range(160)]
        waiting = pool.submit(dep.generate_pd, prompt, 8, rid=rid)
        deadline = time.monotonic() + 60
        while dep.scheduler_state(dep.decodes[0])["decode_admission"]["num_replans"] <= replans0:
            assert time.monotonic() < deadline, "the request was never refused after its lock"
            time.sleep(0.2)
        state = dep.scheduler_state(dep.decodes[0])
        assert state["decode_admission"]["plans"][rid]["decode_prefix_len"] >= len(primed)  # matched + locked
        refusals = [r for r in state["lock_ledger"]["recent_releases"] if r["owner"] == rid]
        assert refusals and refusals[0]["num_tokens"] >= len(primed), "the refused attempt's lock was released"
        assert rid in state["queues"]["prealloc"]  # refused: still waiting for room
        for filler in fillers:
            dep.abort(dep.decodes[0], filler)
        out = waiting.result(timeout=120)[1]["output_ids"]
        for fut in pinned:
            fut.result(timeout=60)
    assert out == dep.generate(plain_url, prompt, 8)["output_ids"]
    reports = dep.wait_clean(timeout_s=120)
    assert rid not in reports["decode0"]["lock_ledger"]["owners"]
    assert reports["decode0"]["lock_ledger"]["num_double_releases"] == 0


def test_prefill_death_releases_decode_locks_and_pages(pd_pressure: PDDeployment):
    dep = pd_pressure
    rid = f"orphan-{uuid.uuid4().hex[:8]}"
    rng = random.Random(8)
    prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(48)]
    dep.generate_pd(prompt, 8)  # decode holds this prefix: the orphan below locks it
    prompt = prompt + [rng.randrange(3, VOCAB_SIZE) for _ in range(9)]
    with cf.ThreadPoolExecutor(1) as pool:
        # Decode-only: preallocated and locked, waiting for KV from a prefill that is about to die.
        orphan = pool.submit(dep.post_generate, dep.decodes[0].url, prompt, 8, 300, rid=rid, **dep.pairing())
        deadline = time.monotonic() + 60
        while rid not in dep.scheduler_state(dep.decodes[0])["decode_admission"]["plans"]:
            assert time.monotonic() < deadline, "decode never admitted the request"
            time.sleep(0.2)
        assert dep.scheduler_state(dep.decodes[0])["lock_ledger"]["num_outstanding"] >= 1
        dep.prefill.stop(grace_s=0)
        resp = orphan.result(timeout=WAITING_TIMEOUT_S + 120)
    assert resp.status_code >= 400, resp.text
    dep.wait_clean(timeout_s=60, servers=dep.decodes)
    assert requests.get(dep.decodes[0].url + "/health", timeout=30).status_code == 200
