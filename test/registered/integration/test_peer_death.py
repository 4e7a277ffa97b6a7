"""A peer dies or shuts down under load. Own deployment (it kills and restarts servers).

- Decode killed (SIGKILL) while prefill holds requests for it: prefill fails them and ends idle with
  nothing leaked, keeps serving, and pairs with the decode server once it is back.
- A child's crash signal (SIGQUIT, as SGLang's scheduler sends its parent on an exception) sent to decode's
  forkserver ends all of decode; prefill stays up.
- Shutdown under load (SIGTERM to both): each exits within the grace period on its own and every
  client request ends (answered or refused), none hangs.
"""

import os
import random
import signal
import time

import pytest

from conftest import LOG_ROOT, WAITING_TIMEOUT_S
from lock_checks import in_background
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.server import descendants, group_pids
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

BOOTSTRAP_TIMEOUT_S = 30  # prefill gives up on a room whose decode never sent its transfer info
GRACE_S = 20


@pytest.fixture(scope="module")
def pd_mortal():
    env = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
           ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(BOOTSTRAP_TIMEOUT_S)))
    with PDDeployment(DeploymentConfig(page_size=16, log_dir=LOG_ROOT / "peer_death", env_overrides=env)) as dep:
        yield dep


def _load(dep: PDDeployment, seed: int, num: int, prompt_len: int, new_tokens: int) -> list[dict]:
    rng = random.Random(seed)
    return [in_background(dep.post_generate_pd, [rng.randrange(3, VOCAB_SIZE) for _ in range(prompt_len)],
                          new_tokens, timeout=BOOTSTRAP_TIMEOUT_S + WAITING_TIMEOUT_S + 120) for _ in range(num)]


def _busy(state: dict) -> int:
    return sum(len(rids) for rids in state["queues"].values())


def test_decode_killed_under_load_leaves_prefill_clean(pd_mortal: PDDeployment):
    dep = pd_mortal
    jobs = _load(dep, 1, 8, 600, 64)
    deadline = time.monotonic() + 60
    while _busy(dep.scheduler_state(dep.prefill)) == 0:  # prefill holds some of them right now
        assert time.monotonic() < deadline, "prefill never had the load in its queues"
        time.sleep(0.05)
    in_prefill = _busy(dep.scheduler_state(dep.prefill))
    dep.decodes[0].kill()
    for job in jobs:
        job["thread"].join(BOOTSTRAP_TIMEOUT_S + WAITING_TIMEOUT_S + 150)
        assert not job["thread"].is_alive(), "a request hung after decode died"
    failed = [j for j in jobs if "error" in j or j["resp"][1].status_code >= 400]
    assert failed, "decode died mid-load, yet every request succeeded"
    reports = dep.wait_clean(timeout_s=BOOTSTRAP_TIMEOUT_S + 90, servers=[dep.prefill])
    assert _busy(reports["prefill"]) == 0 and reports["prefill"]["integrity"]["in_flight_tokens"] == 0
    print(f"\nDECODE DEATH prefill held {in_prefill} request(s) at the kill; {len(failed)}/{len(jobs)} failed; "
          f"prefill idle, integrity {reports['prefill']['integrity']['ok']}")
    dep.restart(dep.decodes[0], time.monotonic() + 300)
    prompt = [random.Random(2).randrange(3, VOCAB_SIZE) for _ in range(40)]
    _, decoded, _ = dep.generate_pd(prompt, 8)
    assert len(decoded["output_ids"]) == 8
    dep.wait_clean()


def test_a_childs_crash_signal_through_the_forkserver_ends_the_whole_server(pd_mortal: PDDeployment):
    """On CPU the scheduler's parent is the forkserver (srt/processes/start_method.py), so the SIGQUIT SGLang's
    scheduler sends its parent when it hits an exception lands there, not on the server: the forkserver ends,
    its children die with it (SGLang sets their parent-death signal), SGLang's subprocess watchdog sees the
    scheduler gone and ends the server. Here that SIGQUIT is sent to decode's forkserver: every process of decode
    is gone within 30 s; prefill stays up and, with decode restarted, the pair serves again."""
    dep = pd_mortal
    decode = dep.decodes[0]
    forkservers = [e for e in descendants(decode.proc.pid) if "multiprocessing.forkserver" in e.cmdline]
    assert len(forkservers) == 1, descendants(decode.proc.pid)
    os.kill(forkservers[0].pid, signal.SIGQUIT)
    deadline = time.monotonic() + 30
    while decode.proc.poll() is None or group_pids(decode.proc.pid):
        assert time.monotonic() < deadline, f"decode still running: {group_pids(decode.proc.pid)}"
        time.sleep(0.2)
    assert dep.prefill.is_running(), "prefill went down with decode"
    dep.restart(decode, time.monotonic() + 300)
    _, decoded, _ = dep.generate_pd([random.Random(3).randrange(3, VOCAB_SIZE) for _ in range(40)], 8)
    assert len(decoded["output_ids"]) == 8
    dep.wait_clean()


def test_shutdown_under_load_exits_within_grace(pd_mortal: PDDeployment):
    dep = pd_mortal
    jobs = _load(dep, 3, 8, 300, 200)
    deadline = time.monotonic() + 60
    while not dep.scheduler_state(dep.decodes[0])["queues"]["running"]:
        assert time.monotonic() < deadline, "decode never started running the load"
        time.sleep(0.05)
    start = time.monotonic()
    graceful = {s.name: s.stop(grace_s=GRACE_S) for s in (dep.decodes[0], dep.prefill)}
    elapsed = time.monotonic() - start
    for job in jobs:
        job["thread"].join(60)
    assert all(not j["thread"].is_alive() for j in jobs), "a client request hung after the shutdown"
    print(f"\nSHUTDOWN under load: exited within grace {graceful}, {elapsed:.1f} s for both")
    assert graceful == {"decode0": True, "prefill": True}, graceful
