"""A PD pair with SGLANG_PD_PEER_CURVE=1 (secret + CURVE on every rank socket), per transfer backend: it
serves the same tokens as a plain server through a handshake that ran over CURVE, and a stranger who
reaches a rank port can neither deliver a message nor make libzmq buffer an unfinished one.

One pair per backend, shared with test_unclaimed_room.py (conftest's pd_curve_ttl: the room TTL 3 s,
SGLang's waiting and bootstrap timeouts 300 s and 10 s, fault injection on); stopped after their tests.
"""

import random
import time

import psutil
import pytest

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.hostile_peer import (PeerSocket, Templates, handshake_view, rank_endpoint,
                                            send_unfinished_multipart)
from sglang_pd.models import VOCAB_SIZE


pytestmark = pytest.mark.integration

FRAME_BYTES = 1 << 20
NUM_FRAMES = 200


@pytest.fixture
def dep(pd_curve_ttl) -> PDDeployment:
    return pd_curve_ttl


def _prompt(seed: int, prefix: list[int]) -> list[int]:
    rng = random.Random(seed)
    return prefix + [rng.randrange(3, VOCAB_SIZE) for _ in range(20)]


def _rss_mib(server) -> float:
    root = psutil.Process(server.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def test_a_curve_pair_serves_what_a_plain_server_serves(dep: PDDeployment, plain_url):
    """Four requests at once over a shared 64-token prefix: the registrations, transfer infos and statuses
    all crossed CURVE sockets (both gates admitted them), outputs equal a plain server's, pair clean."""
    prefix = _prompt(0, [])[:20] * 3 + [7, 8, 9, 10]
    for server in (dep.prefill, dep.decodes[0]):
        assert handshake_view(dep, server)["curve"] == "on"
    prompts = [_prompt(seed, prefix) for seed in range(1, 5)]
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda p: dep.generate_pd(p, 8)[1]["output_ids"], prompts))
    assert outputs == [dep.generate(plain_url, p, 8)["output_ids"] for p in prompts]
    for server in (dep.prefill, dep.decodes[0]):
        gate = handshake_view(dep, server)["gate"]
        assert gate["num_admitted"] > 0 and not gate["auth_refused"], gate
    dep.wait_clean()


def test_a_stranger_delivers_nothing_and_its_unfinished_message_is_not_buffered(dep: PDDeployment,
                                                                                 plain_url):
    """Before the check, the stranger's socket is refused CURVE's handshake: a complete message in the clear
    never reaches either gate (it would have been counted as `missing`), and 200 MiB of an unfinished
    multipart message leave both servers' memory as it was (without CURVE, +400 MiB for 400 frames:
    docs/results/security/peer_fuzz/unfinished_multipart.log)."""
    templates = Templates("nixl" if dep.config.transfer_backend == "nixl" else "mooncake")
    for server in (dep.prefill, dep.decodes[0]):
        endpoint = rank_endpoint(dep, server)
        before = handshake_view(dep, server)["gate"]
        with PeerSocket(endpoint) as stranger:
            stranger.send(templates.abort(12345))
            time.sleep(2)
        rss_before = _rss_mib(server)
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        sent = send_unfinished_multipart(host, int(port), NUM_FRAMES, FRAME_BYTES)
        grown = _rss_mib(server) - rss_before
        after = handshake_view(dep, server)["gate"]
        assert after["num_received"] == before["num_received"], (server.name, before, after)
        assert grown < 50, f"{server.name}: +{grown:.0f} MiB for {sent} unfinished frames"
        print(f"CURVE {dep.config.transfer_backend} {server.name}: stranger's frames taken by the kernel {sent} "
              f"of {NUM_FRAMES}, RSS {grown:+.1f} MiB, gate received {after['num_received']} (unchanged)")
    prompt = _prompt(9, [])
    assert dep.generate_pd(prompt, 8)[1]["output_ids"] == dep.generate(plain_url, prompt, 8)["output_ids"]
    dep.wait_clean()
