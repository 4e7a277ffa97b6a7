"""A PD deployment behind an API key: SGLang's own `--api-key` on prefill, decode and the plain server,
our launcher given the key by `--api-key-file` (sglang-router then requires it from clients and sends
it to the workers). Without the key every server and the router answer 401 (sglang_pd's own routes too;
/health and /metrics stay open, as SGLang has them); with it the router and a hand-paired request give
plain's outputs, and the pair ends clean."""

import os
import random
import subprocess
import sys
import time

import pytest
import requests

from conftest import LOG_ROOT
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import VOCAB_SIZE

pytestmark = pytest.mark.integration

KEY = "sglang-pd-test-" + os.urandom(12).hex()
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def pd_keyed():
    config = DeploymentConfig(page_size=16, with_plain=True, api_key=KEY, log_dir=LOG_ROOT / "api_key")
    with PDDeployment(config) as dep:
        yield dep


def _ids(seed: int, num: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(num)]


def test_without_the_key_every_server_refuses_and_with_it_pd_equals_plain(pd_keyed: PDDeployment):
    dep = pd_keyed
    ids = _ids(1)
    for server in dep.servers:
        assert dep.post_generate(server.url, ids, NEW_TOKENS, 60).status_code == 401, server.name
        for path in ("/sglang_pd/stats", "/sglang_pd/info"):
            assert requests.get(server.url + path, timeout=30).status_code == 401, (server.name, path)
        assert requests.get(server.url + "/health", timeout=30).status_code == 200
        wrong = {"Authorization": "Bearer not-" + KEY}
        assert dep.post_generate(server.url, ids, NEW_TOKENS, 60, headers=wrong).status_code == 401
    plain = dep.generate(dep.plain.url, ids, NEW_TOKENS, headers=dep.headers)["output_ids"]
    _, decoded, _ = dep.generate_pd(ids, NEW_TOKENS)
    assert decoded["output_ids"] == plain
    dep.wait_clean()


def test_the_launcher_with_the_key_file_routes_and_the_router_requires_the_key(pd_keyed: PDDeployment):
    dep = pd_keyed
    router = dep.start_launcher("affinity")
    try:
        assert "--api-key-file" in router.argv and KEY not in " ".join(router.argv)  # the key stays in the file
        for seed in (2, 3):
            ids = _ids(seed)
            assert dep.post_generate(router.url, ids, NEW_TOKENS, 60).status_code == 401
            routed = dep.generate(router.url, ids, NEW_TOKENS, headers=dep.headers)["output_ids"]
            assert routed == dep.generate(dep.plain.url, ids, NEW_TOKENS, headers=dep.headers)["output_ids"]
        # The launcher's readiness watcher read the router's worker list with the key. It polls on its own
        # (every 0.5 s, each read up to 5 s), so its line can come after the harness's own check passed.
        ready = f"launch_router: ready: {router.url} routes to all 2 workers"
        deadline = time.monotonic() + 30
        while ready not in router.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ready in router.log_path.read_text(), router.log_path.read_text()[-2000:]
    finally:
        router.stop()
    dep.wait_clean()


def test_the_launcher_without_the_key_file_names_the_401(pd_keyed: PDDeployment):
    dep = pd_keyed
    out = subprocess.run([sys.executable, "-m", "sglang_pd.launch_router", "--check-only",
                          "--prefill", dep.prefill.url, str(dep.bootstrap_port), "--decode", dep.decodes[0].url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"{dep.prefill.url}: /sglang_pd/info answered 401: the server runs with --api-key; pass --api-key-file" \
        in out.stderr
