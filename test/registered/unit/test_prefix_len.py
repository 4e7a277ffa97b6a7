"""The rules for decode_prefix_len (mem_cache/prefix_len.py) and the callers that apply them: the wire
schema (pool bound), decode admission (the tree's match) and prefill (what decode sent)."""

import pytest

from conftest import make_req
from sglang_pd.srt.mem_cache import check_for_prompt, check_in_pool

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("decode_prefix_len,prompt,page", [(0, 40, 16), (32, 40, 16), (40, 40, 1), (48, 48, 16)])
def test_for_prompt_accepts_aligned_values_within_the_prompt(decode_prefix_len, prompt, page):
    check_for_prompt(decode_prefix_len, prompt, page)


@pytest.mark.parametrize("decode_prefix_len,prompt,page,message", [
    (8, 40, 16, "not aligned to page size 16"),
    (48, 40, 16, "exceeds the prompt length 40"),
    (41, 40, 1, "exceeds the prompt length 40"),
    (-16, 40, 16, "is negative"),
    (1.5, 40, 1, "must be an int"),
    (True, 40, 1, "must be an int"),
    (0, 40, 0, "page_size must be >= 1"),
])
def test_for_prompt_names_the_broken_part(decode_prefix_len, prompt, page, message):
    with pytest.raises(ValueError, match=message):
        check_for_prompt(decode_prefix_len, prompt, page)


def test_in_pool_bounds_the_value_by_the_pool_only():
    check_in_pool(0, 4, 16)
    check_in_pool(64, 4, 16)  # the whole pool: alignment and the prompt are the per-request rule's
    check_in_pool(7, 4, 16)
    for bad in (-1, 65):
        with pytest.raises(ValueError, match=rf"decode_prefix_len {bad} is outside \[0, 64\]"):
            check_in_pool(bad, 4, 16)


@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_the_wire_schema_applies_the_pool_rule(backend):
    from sglang_pd.harness.hostile_peer import PeerIdentity, Templates
    from sglang_pd.srt.wire import FrameLimits, Side, check_message

    limits = FrameLimits(backend, Side.PREFILL, page_size=16, max_kv_pages=4, max_frame_bytes=1 << 20)
    t = Templates(backend, PeerIdentity("127.0.0.1", 40001, "127.0.0.1:16001"))
    for accepted in (0, 24, 64):  # unaligned passes here: prefill checks the prompt rule per request
        assert check_message(t.transfer_info(7, [1, 2], decode_prefix_len=accepted), limits).reason is None
    verdict = check_message(t.transfer_info(7, [1, 2], decode_prefix_len=80), limits)
    assert verdict.room == 7 and "decode_prefix_len 80 is outside [0, 64]" in verdict.reason, verdict


def test_decode_admission_refuses_a_match_that_breaks_the_rule(pool, ledger):
    """A tree reporting an unaligned match: AdmissionError before any lock (the hook then serves the
    request through SGLang's own path)."""
    from sglang.srt.mem_cache.common import match_kv_cache

    from sglang_pd.srt.admission.decode_admission import AdmissionError, RequestKind
    from sglang_pd.srt.state import current

    if pool.page_size == 1:
        pytest.skip("every length is aligned to one-token pages")
    pool.cache_tokens(list(range(8)))

    def one_token_more(req, tree, token_ids, max_prefix_len=None):
        result = match_kv_cache(req, tree, token_ids, max_prefix_len=max_prefix_len)
        return result._replace(device_prefix_len=result.device_prefix_len + 1)

    req = make_req("bent", list(range(8)) + [300, 301])
    with pytest.raises(AdmissionError, match="not aligned to page size"):
        current().decode_admission.match_and_lock(req, pool.tree, RequestKind.NORMAL, one_token_more)
    assert req.lock is None and ledger.owners() == {} and pool.integrity(ledger).ok
