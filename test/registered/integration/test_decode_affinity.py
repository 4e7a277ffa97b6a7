"""1 prefill + 2 decode servers: the launcher's affinity policy keeps each conversation on the decode
server holding its prefix; the same router on round-robin, same run, for comparison."""

import concurrent.futures as cf
import random

import pytest
import requests

from conftest import LOG_ROOT, record_figures
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.launch_router import ROUTING_KEY_HEADER
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.mem_cache import page_align_floor

pytestmark = pytest.mark.integration

NUM_CONVERSATIONS = 8
NUM_TURNS = 4
NEW_TOKENS = 8
PAGE = 16


@pytest.fixture(scope="module")
def pd_two_decodes():
    with PDDeployment(DeploymentConfig(page_size=PAGE, num_decode=2, log_dir=LOG_ROOT / "two_decodes")) as dep:
        yield dep


def _conversation(router_url: str, key: str, seed: int) -> tuple[int, int, list[int]]:
    """Run one conversation; return (decode hit tokens, reusable tokens, output ids)."""
    rng = random.Random(seed)
    conv = [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randrange(40, 90))]
    hits = reusable = 0
    context = 0
    outputs = []
    for _ in range(NUM_TURNS):
        body = {"input_ids": conv, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0,
                                                        "ignore_eos": True}}
        resp = requests.post(router_url + "/generate", json=body, headers={ROUTING_KEY_HEADER: key}, timeout=300)
        resp.raise_for_status()
        out = resp.json()
        hits += int(out["meta_info"]["decode_prefix_len"])
        reusable += page_align_floor(context, PAGE)
        outputs += out["output_ids"]
        context = len(conv) + len(out["output_ids"])
        conv = conv + out["output_ids"] + [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randrange(8, 24))]
    return hits, reusable, outputs


def _run(dep: PDDeployment, policy: str, seed_base: int) -> dict:
    router = dep.start_launcher(policy)
    try:
        with cf.ThreadPoolExecutor(NUM_CONVERSATIONS) as pool:
            results = list(pool.map(lambda i: _conversation(router.url, f"{policy}-conv-{i}", seed_base + i),
                                    range(NUM_CONVERSATIONS)))
        # The launcher's readiness watcher said every worker was in (the harness waited for the same).
        assert f"launch_router: ready: {router.url} routes to all 3 workers" in router.log_path.read_text()
    finally:
        router.stop()
    per_decode = [dep.scheduler_state(d)["decode_admission"]["num_requests"] for d in dep.decodes]
    hits, reusable = sum(r[0] for r in results), sum(r[1] for r in results)
    return {"hits": hits, "reusable": reusable, "ratio": hits / reusable, "per_decode_requests": per_decode}


def test_affinity_reaches_the_reusable_prefix_round_robin_does_not(pd_two_decodes: PDDeployment):
    dep = pd_two_decodes
    before = [dep.scheduler_state(d)["decode_admission"]["num_requests"] for d in dep.decodes]
    affinity = _run(dep, "affinity", 5000)
    mid = affinity["per_decode_requests"]
    round_robin = _run(dep, "round_robin", 9000)
    served = [m - b for m, b in zip(mid, before)]
    print(f"\nAFFINITY hits/reusable={affinity['hits']}/{affinity['reusable']}={affinity['ratio']:.3f} "
          f"per-decode requests={served}; ROUND_ROBIN hits/reusable={round_robin['hits']}/"
          f"{round_robin['reusable']}={round_robin['ratio']:.3f}")
    record_figures("decode_affinity", {"affinity": dict(affinity, per_decode_requests=served),
                                       "round_robin": round_robin})
    assert affinity["ratio"] >= 0.9
    assert round_robin["ratio"] < affinity["ratio"]
    # Load kept balanced: neither decode server took more than 3/4 of the affinity run.
    assert max(served) <= 0.75 * sum(served), served
    dep.wait_clean()


def test_launcher_refuses_inconsistent_deployment(pd_two_decodes: PDDeployment, pd_page1: PDDeployment):
    """A decode server of another page size: clear error naming it, no router started."""
    import subprocess
    import sys

    dep = pd_two_decodes
    proc = subprocess.run([sys.executable, "-m", "sglang_pd.launch_router", "--check-only",
                           "--prefill", dep.prefill.url, str(dep.bootstrap_port),
                           "--decode", dep.decodes[0].url, "--decode", pd_page1.decodes[0].url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "workers disagree on page_size" in proc.stderr and pd_page1.decodes[0].url in proc.stderr
