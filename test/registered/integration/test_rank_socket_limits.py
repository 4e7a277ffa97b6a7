"""Bounded memory at prefill's rank socket, and a PD thread that dies anyway turns /health unhealthy.

One prefill server alone (mooncake_tcp, page 16, no decode needed: every message comes from this test),
unclaimed rooms kept 3 s. The last test kills the rank socket's reading thread with a test fault, so
the server is this module's own and is stopped after it.
"""

import random
import time

import psutil
import pytest
import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.deployment_requests import new_bootstrap_room
from sglang_pd.harness.hostile_peer import (PeerIdentity, PeerSocket, Templates, assert_threads_alive,
                                            handshake_view, rank_endpoint, wait_received)

from conftest import LOG_ROOT

pytestmark = pytest.mark.integration

TTL_S = 3
PEER = PeerIdentity("127.0.0.1", 5, "127.0.0.1:5")
T = Templates("mooncake", PEER)


@pytest.fixture(scope="module")
def dep():
    config = DeploymentConfig(page_size=16, fault_injection=True, log_dir=LOG_ROOT / "prefill_alone",
                              env_overrides=(("SGLANG_PD_UNCLAIMED_ROOM_TTL_S", str(TTL_S)),))
    deployment = PDDeployment(config)
    try:
        deployment.prefill.start()
        deployment.prefill.wait_healthy(time.monotonic() + config.startup_timeout_s)
        yield deployment
    finally:
        deployment.prefill.stop()


def _rss(dep: PDDeployment) -> int:
    root = psutil.Process(dep.prefill.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def _metric(dep: PDDeployment, name: str) -> float:
    hits = [v for k, v in dep.scrape_metrics(dep.prefill).items() if k.startswith(f"sglang_pd:{name}{{")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def _gate(dep):
    return handshake_view(dep, dep.prefill)["gate"]


def test_oversized_transfer_infos_do_not_grow_memory(dep: PDDeployment):
    rng = random.Random(32)
    endpoint = rank_endpoint(dep, dep.prefill)
    with PeerSocket(endpoint) as peer:
        peer.send(T.registration([4096, 8192], 2048))
    wait_received(dep, dep.prefill, _gate(dep)["num_received"])
    before, rss_before = _gate(dep), _rss(dep)
    for size in (32 << 20, 8 << 20):            # above libzmq's cap (16 MiB), above the field's cap
        for _ in range(3):
            with PeerSocket(endpoint) as peer:  # one connection each: libzmq drops the peer of an oversize frame
                peer.send(T.transfer_info(new_bootstrap_room(rng), rng.randbytes(size)[: size - size % 4]))
    view = wait_received(dep, dep.prefill, before["num_received"] + 3)
    time.sleep(1.0)
    gate = _gate(dep)
    assert gate["num_received"] == before["num_received"] + 3, "a 32 MiB frame got past libzmq's cap"
    assert gate["rejected"].get("transfer_info", 0) == before["rejected"].get("transfer_info", 0) + 3
    assert "more than the" in gate["peers"]["127.0.0.1"]["last"]
    assert view["rooms"]["transfer_info_rooms"] == []
    grown = _rss(dep) - rss_before
    print(f"MEMORY: 3 x 32 MiB + 3 x 8 MiB transfer infos for unclaimed rooms grew prefill by {grown / 2**20:.1f} MiB")
    assert grown < 40 << 20, f"prefill grew by {grown / 2**20:.0f} MiB"


def test_transfer_infos_of_rooms_nobody_claims_expire(dep: PDDeployment):
    rng = random.Random(3)
    rooms = [new_bootstrap_room(rng) for _ in range(20)]
    before = _gate(dep)
    with PeerSocket(rank_endpoint(dep, dep.prefill)) as peer:
        peer.send(T.registration([4096, 8192], 2048))
        for room in rooms:
            peer.send(T.transfer_info(room, [1, 2, 3]))
    view = wait_received(dep, dep.prefill, before["num_received"] + 1 + len(rooms))
    assert set(rooms) <= set(view["rooms"]["transfer_info_rooms"]), "the transfer infos were not held"
    expired_before = view["gate"]["unclaimed_rooms"]["num_expired"]
    deadline = time.monotonic() + TTL_S + 10
    while set(rooms) & set(handshake_view(dep, dep.prefill)["rooms"]["transfer_info_rooms"]):
        assert time.monotonic() < deadline, "unclaimed rooms were not dropped"
        time.sleep(0.5)
    view = handshake_view(dep, dep.prefill)
    assert view["gate"]["unclaimed_rooms"]["num_expired"] >= expired_before + len(rooms)
    assert not set(rooms) & {r for rs in view["rooms"]["by_status"].values() for r in rs}
    assert _metric(dep, "unclaimed_rooms_expired_total") >= len(rooms)


def test_a_dead_pd_thread_turns_health_unhealthy(dep: PDDeployment):
    assert requests.get(dep.prefill.url + "/health", timeout=60).status_code == 200
    assert_threads_alive(handshake_view(dep, dep.prefill), "prefill")
    dep.arm_faults(dep.prefill, rank_reader_exit=1)
    with PeerSocket(rank_endpoint(dep, dep.prefill)) as peer:
        peer.send(T.abort(1))
    deadline = time.monotonic() + 20
    while not handshake_view(dep, dep.prefill)["threads"]["dead"]:
        assert time.monotonic() < deadline, "the dead bootstrap thread was not noticed"
        time.sleep(0.5)
    dead = handshake_view(dep, dep.prefill)["threads"]["dead"]
    assert list(dead.values()) == ["bootstrap"], dead
    health = requests.get(dep.prefill.url + "/health", timeout=60)
    assert health.status_code == 503 and list(dead)[0] in health.text, health.text
    assert _metric(dep, "pd_threads_dead") == 1
