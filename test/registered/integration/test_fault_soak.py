"""Fault soak: >= 200 requests over multi-turn conversations with random client aborts, injected
transfer failures on both sides (decode-local, at prefill's transport, and an exception in prefill's
transfer worker, which must fail only its room and live on) and one prefill crash
(SIGKILL, then restarted) in the middle. At the end: zero outstanding locks, KV pool back to its idle
baseline (nothing in flight), both servers healthy, and every completed output equal to a plain
server's. Own deployment (it kills prefill).

Run twice: on today's PD path (`pd`), and with decode-local prefill on beside the shared-prefix
attention backend on both servers (`local+shared`; compared with the same torch_native plain server).
Decode-local prefill alone, on torch_native, ran here as a third variant until the tier had to fit CI's
time: its paths are the `local+shared` run's (the backend only changes how decode reads the KV) and
test_local_prefill.py drives them on torch_native. With local prefill most later turns are computed on decode while each
turn's last branch, and every request given an injected transfer failure, is made too long to be local
and crosses prefill; every conversation also aborts one local request held in the local queue and one
whose local extend is under way (the state decode saw at the abort is counted).
"""

import concurrent.futures as cf
import random
import threading
import time
import uuid

import pytest
import requests

from conftest import LOG_ROOT, SESSION_PROBE_S, WAITING_TIMEOUT_S, record_figures
from sglang_pd.config import LOCAL_PREFILL_TOKENS
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import assert_threads_alive
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

pytestmark = pytest.mark.integration

NUM_CONVERSATIONS = 10
NUM_TURNS = 5
REQUESTS_PER_TURN = 4   # each turn: 4 requests sharing the conversation prefix (branches)
ABORT_RATE = 0.08
TRANSFER_FAIL_RATE = 0.04          # decode-local, right after the hand-off
PREFILL_FAIL_RATE = 0.03           # at prefill's transport (mooncake then re-probes the decode session)
WORKER_ERROR_RATE = 0.03           # prefill's transfer worker raises on the room (and must live on)
FAULT_RATE = TRANSFER_FAIL_RATE + PREFILL_FAIL_RATE + WORKER_ERROR_RATE
NEW_TOKENS = 6
SOAK_DEADLINE_S = 900
BOOTSTRAP_TIMEOUT_S = 30
# The `local` run: a later turn's uncached part is what the page-aligned match left (< 16) plus its
# 3-11 new tokens, so it is computed on decode; the first turn of a conversation mostly is not.
LOCAL_THRESHOLD = 32
LOCAL_ABORTS = {2: "local_queue_hold", 3: "local_extend_delay"}  # turn -> fault, on branch 1


@pytest.fixture(scope="module", params=["pd", "local+shared"])
def pd_soak(request):
    """(the pair, its variant); `+shared`: the shared-prefix attention backend on both servers."""
    env = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
           ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(BOOTSTRAP_TIMEOUT_S)),
           ("SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", str(SESSION_PROBE_S)))
    variant = request.param
    if variant.startswith("local"):
        env += ((LOCAL_PREFILL_TOKENS, str(LOCAL_THRESHOLD)),)
    backend = BACKEND_NAME if variant.endswith("+shared") else "torch_native"
    with PDDeployment(DeploymentConfig(page_size=16, fault_injection=True, env_overrides=env,
                                       decode_attention_backend=backend, prefill_attention_backend=backend,
                                       log_dir=LOG_ROOT / f"soak_{variant.replace('+', '_')}")) as dep:
        yield dep, variant


def _local_abort(dep: PDDeployment, fault: str, prompt: list[int], stats: dict, lock: threading.Lock,
                 deadline: float) -> None:
    """Send `prompt` (meant to be computed on decode) with `fault` armed for its room, abort it while the
    fault keeps it in its local state (queued: held 5 s; extending: the extend starts 3 s late) and
    count the state decode had seen at the abort. An attempt that never reached decode's local path (no
    pairing while prefill is down) is counted unserved and sent again, as the soak's other requests are."""
    while True:
        rid, room = f"soak-local-{uuid.uuid4().hex[:10]}", new_bootstrap_room()
        dep.arm_faults(dep.decodes[0], **{f"{fault}_room": room})
        pool = cf.ThreadPoolExecutor(1)
        pending = pool.submit(dep.post_generate_pd, prompt, 64, rid=rid, room=room, logprobs=False)
        time.sleep(0.5 if fault == "local_queue_hold" else 1.0)
        _try(lambda: dep.abort(dep.decodes[0], rid))
        _try(lambda: dep.abort(dep.prefill, rid))
        _try(lambda: pending.result(timeout=300))
        pool.shutdown()
        record = dep.scheduler_state(dep.decodes[0])["local_prefill"]["requests"].get(rid)
        if record is not None:
            break
        _count(stats, lock, "unserved")
        assert time.monotonic() < deadline, f"no local request to abort: {stats}"
        time.sleep(1.0)
    seen = record["abort_seen"] or {"state": "after_it_joined"}
    _count(stats, lock, f"local_abort_{seen['state']}")
    _count(stats, lock, "aborts")


def _conversation(dep: PDDeployment, local: bool, conv_id: int, stats: dict, lock: threading.Lock,
                  deadline: float):
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
            if local and branch == 1 and turn in LOCAL_ABORTS:
                _local_abort(dep, LOCAL_ABORTS[turn], prompt, stats, lock, deadline)
                continue
            if local and (branch == REQUESTS_PER_TURN - 1 or roll < FAULT_RATE):
                # the PD path: too many new tokens to be computed on decode (a transfer fault needs it;
                # each turn's last branch takes it beside the local ones)
                prompt = prompt + [rng.randrange(3, VOCAB_SIZE) for _ in range(LOCAL_THRESHOLD + 1)]
            if roll < FAULT_RATE:
                side = dep.decodes[0] if roll < TRANSFER_FAIL_RATE else dep.prefill
                fault = ("transfer_fail_room" if side is dep.decodes[0] else
                         "prefill_transfer_fail_room" if roll < TRANSFER_FAIL_RATE + PREFILL_FAIL_RATE else
                         "prefill_worker_error_room")
                room = new_bootstrap_room(rng)
                while not _try(lambda: dep.arm_faults(side, **{fault: room})):  # prefill down: the crash
                    _count(stats, lock, "unserved")
                    assert time.monotonic() < deadline, f"prefill never came back: {stats}"
                    time.sleep(1.0)
                resp = _send(dep, prompt, room=room)
                _count(stats, lock, "faults_injected")
                assert resp is None or resp.status_code >= 400, f"injected {fault} not reported: {resp.text}"
                continue
            if roll < FAULT_RATE + ABORT_RATE:
                rid = f"soak-abort-{uuid.uuid4().hex[:10]}"
                pool = cf.ThreadPoolExecutor(1)
                pending = pool.submit(dep.post_generate_pd, prompt, 400, rid=rid, logprobs=False)
                time.sleep(rng.uniform(0.05, 1.5))
                _try(lambda: dep.abort(dep.decodes[0], rid))
                _try(lambda: dep.abort(dep.prefill, rid))
                _try(lambda: pending.result(timeout=300))
                pool.shutdown()
                _count(stats, lock, "aborts")
                continue
            decoded = _send(dep, prompt)
            while decoded is None or decoded.status_code != 200:  # the prefill crash: retry once it is back
                _count(stats, lock, "unserved")
                assert time.monotonic() < deadline, f"not served again after the prefill crash: {stats}"
                time.sleep(1.0)
                decoded = _send(dep, prompt)
            body = decoded.json()
            output = body["output_ids"]
            _count(stats, lock, f"served_{body['meta_info'].get('decode_prefill_path', 'unlabelled')}")
            checks.append((prompt, output))
            kept = kept or (prompt, output)
            _count(stats, lock, "ok")
        if kept is not None:
            context = kept[0] + kept[1]
    return checks


def _send(dep: PDDeployment, prompt: list[int], **extra):
    """The decode half's response, or None when a server dropped the connection (the prefill crash).
    Without logprobs, as every soak request: one asking for them never runs inside a mixed local extend,
    a path the local runs must exercise; their outputs are compared by token."""
    try:
        return dep.post_generate_pd(prompt, NEW_TOKENS, logprobs=False, **extra)[1]
    except requests.RequestException:
        return None


def _try(fn) -> bool:
    try:
        fn()
        return True
    except Exception:
        return False


def _count(stats: dict, lock: threading.Lock, key: str) -> None:
    with lock:
        stats[key] = stats.get(key, 0) + 1


def _crash_prefill_midway(dep: PDDeployment, stats: dict, lock: threading.Lock, at_requests: int) -> float:
    """SIGKILL prefill once `at_requests` requests are done, restart it; returns seconds it was down."""
    while stats["ok"] + stats["aborts"] + stats["faults_injected"] < at_requests:
        time.sleep(0.2)
    start = time.monotonic()
    dep.prefill.kill()
    dep.restart(dep.prefill, time.monotonic() + 300)
    return time.monotonic() - start


def test_fault_soak(pd_soak: tuple[PDDeployment, str], plain_url: str):
    dep, variant = pd_soak
    local = variant.startswith("local")
    before = dep.wait_clean()["decode0"]["integrity"]
    stats = {"ok": 0, "aborts": 0, "faults_injected": 0, "unserved": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + SOAK_DEADLINE_S
    with cf.ThreadPoolExecutor(4) as pool:
        crash = pool.submit(_crash_prefill_midway, dep, stats, lock, 100)
        futures = [pool.submit(_conversation, dep, local, i, stats, lock, deadline) for i in range(NUM_CONVERSATIONS)]
        checks = [c for f in futures for c in f.result()]
        down_s = crash.result()
    total = stats["ok"] + stats["aborts"] + stats["faults_injected"]  # unserved attempts were retried
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
    fired = {s: reports[s]["faults"]["fired"] for s in ("decode0", "prefill")}
    assert_threads_alive(reports["prefill"]["handshake"], "prefill")
    worker_errors = reports["prefill"]["counters"]["transfer_worker_errors_total"]
    # every injected worker error (since the restart) failed its room, and the worker lived on
    assert worker_errors.get("failed", 0) == fired["prefill"].get("prefill_worker_error", 0), (worker_errors, fired)
    local_figures = _check_local(dep, reports, stats) if local else None
    shared_figures = _check_shared(dep, reports) if variant.endswith("+shared") else None
    record_figures(f"fault_soak_{variant.replace('+', '_')}",
                   {"requests": total, **dict(sorted(stats.items())), "prefill_down_s": round(down_s, 1),
                    "faults_fired": fired, "prefill_transfer_worker_errors": worker_errors,
                    "locks_taken": ledger["num_locks"],
                    "outstanding_locks": ledger["num_outstanding"], "local_prefill": local_figures,
                    "shared_attention_decode": shared_figures})
    print(f"\nSOAK requests={total} ok={stats['ok']} aborts={stats['aborts']} "
          f"transfer_faults={stats['faults_injected']} (fired: decode {fired['decode0']}, prefill after its "
          f"restart {fired['prefill']}) unserved={stats['unserved']} prefill down {down_s:.0f} s; "
          f"outstanding_locks={ledger['num_outstanding']} locks_taken={ledger['num_locks']} "
          f"decode free+evictable before={before['free_tokens']}+{before['evictable_tokens']} "
          f"after={after['free_tokens']}+{after['evictable_tokens']} in_flight_after={after['in_flight_tokens']}; "
          f"{ {k: v for k, v in sorted(stats.items()) if k.startswith(('served_', 'local_abort_'))} }")


def _check_local(dep: PDDeployment, reports: dict, stats: dict) -> dict:
    """The local run exercised what it is about: requests computed on decode beside ones from prefill,
    local extends inside decode steps, aborts that found a request queued and one extending, and
    prefill computed nothing for a room decode declined (prefill's records start at its restart)."""
    local = reports["decode0"]["local_prefill"]
    assert stats.get("served_decode_local", 0) >= 60 and stats.get("served_prefill", 0) >= 30, stats
    assert local["num_mixed_extends"] > 0 and local["num_queued"] == 0 and local["num_extending"] == 0, local
    # One of each per conversation, every one aborted in a local state (a request that waited behind
    # another conversation's 3 s extend delay may still be queued when its abort lands)
    aborted = (stats.get("local_abort_queued", 0), stats.get("local_abort_extending", 0))
    assert sum(aborted) == 2 * NUM_CONVERSATIONS and min(aborted) >= NUM_CONVERSATIONS // 2, stats
    declines = dep.scheduler_state(dep.prefill)["prefill_transfer"]["declines"]
    assert declines and all(d["computed_tokens"] == 0 for d in declines.values()), declines
    print(f"\nLOCAL requests={local['num_requests']} extends={local['num_extends']} "
          f"(mixed {local['num_mixed_extends']}) aborted_queued={local['num_aborted']} failed={local['num_failed']} "
          f"fallbacks={local['fallbacks']} prefill_declines_since_restart={len(declines)}")
    return {key: local[key] for key in ("num_requests", "num_extends", "num_mixed_extends", "num_aborted",
                                        "num_failed", "fallbacks")} | {"prefill_declines_since_restart": len(declines)}


def _check_shared(dep: PDDeployment, reports: dict) -> dict:
    """The shared-prefix backend served decode's steps (own parts read in place) and its local extends
    (offset-causal), and prefill's extends, with no layer call handed to torch_native."""
    decode = reports["decode0"]["shared_attention"]
    prefill = dep.scheduler_state(dep.prefill)["shared_attention"]  # since its restart
    for side in (decode, prefill):
        assert side["backend"] == BACKEND_NAME and set(side["fallback_layer_calls"].values()) == {0}, side
    assert decode["shared_attn_decode_steps_total"] > 0 and decode["shared_attn_own_tokens_total"] > 0, decode
    assert decode["shared_attn_extend_queries_total"] > 0 and prefill["shared_attn_extend_queries_total"] > 0
    return {name: decode[name] for name in ("shared_attn_decode_steps_total", "shared_attn_groups_total",
                                            "shared_attn_own_tokens_total", "shared_attn_extend_queries_total")}
