"""Upstream SGLang alone: a PD pair whose servers do not load sglang_pd (SGLANG_PLUGINS names no
plugin), as the benchmark's `on-upstream` runs it. Same greedy outputs as our pair, none of our
fields, the same KV volume by SGLang's own metric, and the harness's plugin-less idle check
(SGLang's /v1/loads) passes after traffic. Own deployment."""

import random

import pytest

from conftest import LOG_ROOT, record_figures
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.equality import assert_same
from sglang_pd.harness.upstream_state import metric_totals
from sglang_pd.models import VOCAB_SIZE, model_config

pytestmark = pytest.mark.integration

KV_MB = "sglang:kv_transfer_total_mb_sum"
PAGE = 16


@pytest.fixture(scope="module")
def pd_upstream():
    with PDDeployment(DeploymentConfig(page_size=PAGE, plugin=False, log_dir=LOG_ROOT / "upstream")) as dep:
        yield dep


def _kv_mb(dep: PDDeployment) -> float:
    return metric_totals(dep.prefill.url, (KV_MB,))[KV_MB]


def _bytes_per_page() -> int:
    cfg = model_config("tiny")  # K and V, every layer, fp32
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4 * PAGE


def test_upstream_alone_serves_our_outputs_and_exposes_only_its_own_figures(pd_upstream, pd_page16):
    rng = random.Random(4242)
    prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(100)]
    mb0, ours0 = _kv_mb(pd_upstream), _kv_mb(pd_page16)
    full_pages = 0
    for _ in range(3):
        upstream = pd_upstream.generate_pd(prompt, 8)[1]
        ours = pd_page16.generate_pd(prompt, 8)[1]
        assert "decode_prefix_len" not in upstream["meta_info"] and "decode_prefix_len" in ours["meta_info"]
        assert_same(ours, upstream, "sglang_pd vs upstream alone")
        full_pages += -(-len(prompt) // PAGE)
        prompt = prompt + upstream["output_ids"] + [rng.randrange(3, VOCAB_SIZE) for _ in range(10)]
    sent_pages = (_kv_mb(pd_upstream) - mb0) * 2**20 / _bytes_per_page()
    ours_pages = (_kv_mb(pd_page16) - ours0) * 2**20 / _bytes_per_page()
    print(f"\nUPSTREAM_ALONE pages sent by SGLang's metric: upstream {sent_pages:.0f}, ours {ours_pages:.0f}, "
          f"without decode reuse {full_pages}")
    record_figures("upstream_alone", {"pages_sent_upstream_alone": sent_pages, "pages_sent_sglang_pd": ours_pages,
                                      "pages_without_decode_reuse": full_pages})
    assert 0 < sent_pages < full_pages, "upstream's flag alone reuses the decode tree on turns 2-3"
    assert sent_pages == pytest.approx(ours_pages), "the plugin moves the same KV as upstream's mechanism"
    reports = pd_upstream.wait_clean()
    assert all(r["busy"] == {} and r["leak_warnings"] == [] and "lock owners" in r["not_checked"]
               for r in reports.values()), reports
    pd_page16.wait_clean()


def test_upstream_alone_spawns_its_children_itself(pd_upstream):
    """Without the plugin SGLang keeps its own start method (spawn): the scheduler and the detokenizer are the
    server's own children and no forkserver runs (the contrast to test_pd_correctness's forkserver check)."""
    from sglang_pd.harness.server import descendants

    for server in (pd_upstream.prefill, pd_upstream.decodes[0]):
        tree = descendants(server.proc.pid)
        assert not any("multiprocessing.forkserver" in e.cmdline for e in tree), (server.name, tree)
        children = {e.comm: e.ppid for e in tree if e.comm.startswith("sglang::")}  # comm: 15 characters
        assert children == {"sglang::schedul": server.proc.pid, "sglang::detoken": server.proc.pid}, tree
