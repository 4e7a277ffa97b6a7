"""The decode-local prefill decision (local_prefill/decision.py) on real SGLang requests: every input it
reads (prompt and prefix lengths, prompt logprobs, each unsupported feature, request kind, rebootstrap,
a live duplicate rid) and the order its reasons are given in."""

import pytest

from conftest import make_req
from sglang_pd.srt.local_prefill.decision import LocalFallback, decide
from sglang_pd.srt.mem_cache import RequestKind

pytestmark = pytest.mark.unit

PROMPT = list(range(1, 101))


def _req(**attrs):
    req = make_req("r", PROMPT)
    for name, value in attrs.items():
        setattr(req, name, value)
    return req


def test_a_plain_request_within_the_threshold_is_local():
    got = decide(16, _req(), 90)
    assert (got.local, got.num_uncached, got.fallback) == (True, 10, None)


@pytest.mark.parametrize("attr,what", [  # written out: a feature dropped from the list must fail here
    ("grammar", "structured output (grammar)"), ("multimodal_inputs", "multimodal input"),
    ("input_embeds", "input embeddings"), ("positional_embed_overrides", "positional embedding overrides"),
    ("lora_id", "LoRA adapter"), ("return_hidden_states", "hidden states"),
    ("return_sampling_mask", "sampling mask"), ("session", "session"),
])
def test_each_unsupported_feature_goes_to_prefill_named(attr, what):
    got = decide(16, _req(**{attr: object()}), 90)
    assert (got.local, got.fallback, got.detail) == (False, LocalFallback.UNSUPPORTED_REQUEST, what)


@pytest.mark.parametrize("return_logprob,start,expected", [
    (True, 0, LocalFallback.INPUT_LOGPROBS),
    (True, 99, LocalFallback.INPUT_LOGPROBS),   # the last prompt position
    (True, 100, None),                            # past the prompt: output logprobs only, decode returns them
    (True, -1, None),                             # SGLang's "no prompt logprobs"
    (False, 0, None),
])
def test_only_prompt_logprobs_go_to_prefill(return_logprob, start, expected):
    got = decide(16, _req(return_logprob=return_logprob, logprob_start_len=start), 90)
    assert got.fallback is expected and got.local is (expected is None)


@pytest.mark.parametrize("kind", [RequestKind.WARMUP, RequestKind.HEALTH_CHECK])
def test_warmup_health_checks_and_rebootstraps_are_not_considered(kind):
    for got in (decide(16, _req(), 90, kind=kind), decide(16, _req(), 90, is_rebootstrap=True)):
        assert (got.local, got.fallback) == (False, None)  # nothing decided: nothing counted


def test_a_live_duplicate_rid_goes_to_prefill_only_when_it_would_be_local():
    got = decide(16, _req(), 90, rid_is_live=True)
    assert (got.local, got.fallback) == (False, LocalFallback.DUPLICATE_RID)
    assert decide(16, _req(), 50, rid_is_live=True).fallback is None  # over the threshold: plain PD
    assert decide(16, _req(grammar=object()), 90, rid_is_live=True).fallback is LocalFallback.UNSUPPORTED_REQUEST


def test_reasons_come_in_order_full_hit_logprobs_unsupported():
    both = dict(return_logprob=True, logprob_start_len=0, lora_id="adapter")
    assert decide(16, _req(**both), 100).fallback is LocalFallback.FULL_PREFIX_HIT
    assert decide(16, _req(**both), 90).fallback is LocalFallback.INPUT_LOGPROBS
