"""A malformed transfer-info frame reaching prefill fails only its own request; prefill keeps serving.

The message is pushed over ZMQ to prefill's rank socket (address from its bootstrap server), exactly
where a broken or hostile decode peer would send it."""

import concurrent.futures as cf
import random
import time

import pytest
import requests
import zmq

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.deployment import new_bootstrap_room
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration


def _rank_endpoint(dep: PDDeployment) -> str:
    route = requests.get(f"http://127.0.0.1:{dep.bootstrap_port}/route", timeout=30, params={
        "prefill_dp_rank": 0, "prefill_cp_rank": 0, "target_tp_rank": 0, "target_pp_rank": 0}).json()
    info = route[0] if isinstance(route, list) else route
    return f"tcp://{info['rank_ip']}:{info['rank_port']}"


def _push(endpoint: str, frames: list[bytes]) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    sock.send_multipart(frames)
    sock.close()


def test_malformed_transfer_info_fails_only_its_room(pd_page1: PDDeployment, plain_url: str):
    dep = pd_page1
    rng = random.Random(9)
    prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(30)]
    room = new_bootstrap_room(rng)
    with cf.ThreadPoolExecutor(1) as pool:
        # Prefill side of the request: it waits for its decode peer's transfer info.
        waiting = pool.submit(dep.post_generate, dep.prefill.url, prompt, 8, 120, **dep.pairing(room))
        time.sleep(2)
        _push(_rank_endpoint(dep), [str(room).encode(), b"127.0.0.1", b"1", b"session", b"\x01\x02\x03",
                                    b"0", b"", b"1", b"not-a-number"])
        resp = waiting.result(timeout=120)
    assert resp.status_code >= 400, resp.text
    assert "malformed transfer info" in resp.text and "decode_prefix_len" in resp.text, resp.text
    rejection = dep.scheduler_state(dep.prefill)["prefill_transfer"]["rejections"][str(room)]
    assert "not a multiple of 4" in rejection["reason"]
    # The bootstrap thread survived: prefill still pairs with decode.
    assert dep.generate_pd(prompt, 8)[1]["output_ids"] == dep.generate(plain_url, prompt, 8)["output_ids"]
    dep.wait_clean()
