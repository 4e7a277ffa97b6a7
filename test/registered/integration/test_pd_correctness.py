"""PD pair (decode radix cache on) vs a plain server, and the decode_prefix_len that reaches prefill."""

import random

import pytest

from sglang_pd.harness import PDDeployment
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.mem_cache.common import kv_to_page_num, page_align_floor

pytestmark = pytest.mark.integration

NEW_TOKENS = 8


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def _prompts(seed: int) -> list[list[int]]:
    """Lengths at and around page boundaries (16, 32, 64) plus shared-prefix variants."""
    rng = random.Random(seed)
    base = _tokens(rng, 64)
    lone = [_tokens(rng, n) for n in (1, 15, 16, 17, 31, 32, 33)]
    return lone + [base, base + [7, 8, 9], base[:30] + [11, 12], base[:48]]


def test_pd_outputs_equal_plain(pd: PDDeployment, plain_url: str):
    prompts = _prompts(seed=pd.config.page_size)
    assert len(prompts) >= 8
    for ids in prompts:
        _, decoded, _ = pd.generate_pd(ids, NEW_TOKENS)
        plain = pd.generate(plain_url, ids, NEW_TOKENS)
        assert len(decoded["output_ids"]) == NEW_TOKENS
        assert decoded["output_ids"] == plain["output_ids"], f"prompt len {len(ids)}"


def test_conversation_reuses_decode_prefix(pd: PDDeployment, plain_url: str):
    """4 turns: outputs equal plain; turn >= 2 reuses exactly the page-aligned previous context.

    Measured at prefill: the decode_prefix_len it was told and the KV pages it handed to its
    transport. The previous turn's prompt + its output are resident on decode after that turn.
    """
    page = pd.config.page_size
    rng = random.Random(100 + page)
    # Token 0 starts no other test prompt (those draw from 3..), so turn 1 matches nothing on decode.
    conv = [0] + _tokens(rng, 36)
    previous_context = 0
    for turn in range(4):
        _, decoded, room = pd.generate_pd(conv, NEW_TOKENS)
        assert decoded["output_ids"] == pd.generate(plain_url, conv, NEW_TOKENS)["output_ids"]
        record = pd.prefill_rooms()[room]
        expected_prefix = page_align_floor(previous_context, page)
        assert record["prompt_len"] == len(conv)
        assert record["decode_prefix_len"] == expected_prefix, f"turn {turn + 1}"
        if turn >= 1:
            assert record["decode_prefix_len"] > 0
        assert record["num_pages_sent"] == kv_to_page_num(len(conv) - expected_prefix, page)
        previous_context = len(conv) + len(decoded["output_ids"])
        conv = conv + decoded["output_ids"] + _tokens(rng, 13)


def test_router_serves_same_outputs(pd_page1: PDDeployment, plain_url: str):
    for ids in _prompts(seed=7)[:8]:
        routed = pd_page1.generate(pd_page1.router.url, ids, NEW_TOKENS)
        assert routed["output_ids"] == pd_page1.generate(plain_url, ids, NEW_TOKENS)["output_ids"]


def test_plugin_active_on_both_servers(pd_page1: PDDeployment):
    for server, role in ((pd_page1.prefill, "prefill"), (pd_page1.decodes[0], "decode")):
        info = pd_page1.get_json(server.url, "/sglang_pd/info")
        assert info["role"] == role and info["sglang_version"] == "0.5.23"
        assert "BEFORE sglang.srt.entrypoints.http_server.launch_server" in info["http_hooks"]
        assert any("finalize_bootstrap" in h for h in info["scheduler_hooks"][0])
    pd_page1.check_alive()
