"""A PD pair whose servers both run `--attention-backend sglang_pd_shared_prefix` (radix on, page 16):
greedy outputs equal a plain torch_native server's, token for token, on concurrent requests that share
a system prompt and on a second turn nested under the first (one of them decoding 90 tokens); decode
really grouped them, read own parts in place with the C kernel it built at start-up and reused the
segments, prefill's extends attended only their new queries (counters on /sglang_pd/stats and
/metrics), nothing fell back, and the pair ends clean (no lock, no page held). Requests aborted while
decoding inside a group leave it, the group goes on with the others, whose outputs still equal a
plain server's (tokens and logprobs). Power check: with the partials averaged instead of merged by their
log-sum-exp (test fault shared_merge_average) the grouped requests' outputs differ from a plain server's.
The plain server is the session's (conftest's plain_url, torch_native), not one of this module's own."""

import concurrent.futures as cf
import random
import uuid

import pytest

from lock_checks import wait_until
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.equality import assert_differs, assert_same
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

pytestmark = pytest.mark.integration

NUM_CLIENTS = 6
NEW_TOKENS = 24
LONG_TOKENS = 90  # one request decodes on alone while the others finish: its group dissolves under it
NUM_GROUPED = 10   # 7 left after 3 aborts still save 6 x 480 reads per layer: above the threshold, grouped
GROUPED_TOKENS = 300


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    config = DeploymentConfig(page_size=16, fault_injection=True, decode_attention_backend=BACKEND_NAME,
                              prefill_attention_backend=BACKEND_NAME, log_dir=tmp_path_factory.mktemp("shared_prefix"))
    with PDDeployment(config) as dep:
        yield dep


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def _concurrent_pd(pd: PDDeployment, prompts: list[list[int]], lengths: list[int]) -> list[dict]:
    """Decode's answers to `prompts`, sent all at once (they decode side by side)."""
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p, n: pd.generate_pd(p, n)[1], prompts, lengths))


def test_outputs_equal_a_plain_server_and_decode_reads_the_shared_prefix_once(pd: PDDeployment, plain_url: str):
    info = pd.get_json(pd.decodes[0].url, "/sglang_pd/info")
    assert "REGISTER sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS" in info["scheduler_hooks"][0]
    rng = random.Random(17)
    # 480 tokens: shared by the 6 clients it saves 2,400 reads per layer, above the backend's threshold
    # for this model's 4 query heads (2,048; smaller groups are read in place, no segment)
    system = [1] + _tokens(rng, 479)
    pd.generate_pd(system + _tokens(rng, 3), 1)  # the system prompt is now in decode's tree
    lengths = [LONG_TOKENS] + [NEW_TOKENS] * (NUM_CLIENTS - 1)
    turn1 = [system + _tokens(rng, 5 + 3 * i) for i in range(NUM_CLIENTS)]
    out1 = _concurrent_pd(pd, turn1, lengths)
    turn2 = [p + o["output_ids"] + _tokens(rng, 7) for p, o in zip(turn1, out1)]  # nested under turn 1
    out2 = _concurrent_pd(pd, turn2, lengths)
    for body, prompt, n in zip(out1 + out2, turn1 + turn2, lengths * 2):
        assert_same(body, pd.generate(plain_url, prompt, n), f"prompt of {len(prompt)} tokens")

    shared = pd.scheduler_state(pd.decodes[0])["shared_attention"]
    print(f"decode shared attention: {shared}")
    assert shared["backend"] == BACKEND_NAME and shared["min_reads_saved"] == 2048
    assert shared["shared_attn_decode_steps_total"] >= NEW_TOKENS
    assert shared["shared_attn_groups_total"] > 0 and shared["shared_attn_kv_reads_saved_tokens_total"] > 0
    assert set(shared["fallback_layer_calls"].values()) == {0}
    # own parts read in place every step (the decode tokens alone are NEW_TOKENS per request and step);
    # segments mostly reused, not gathered again every step
    assert shared["shared_attn_own_tokens_total"] > NUM_CLIENTS * NEW_TOKENS
    assert shared["shared_attn_segment_gathered_tokens_total"] < shared["shared_attn_shared_tokens_total"]
    kernel = shared["kernel"]
    assert kernel["kernels"] == "cpu"  # SGLANG_PD_SHARED_PREFIX_KERNELS=auto on a CPU device
    assert kernel["source"] == "own_decode.c" and "-O3" in kernel["flags"] and kernel["build_s"] > 0
    prefill = pd.scheduler_state(pd.prefill)["shared_attention"]
    assert prefill["backend"] == BACKEND_NAME and prefill["shared_attn_extend_queries_total"] > 0
    assert prefill["shared_attn_decode_steps_total"] == 0
    metrics = PDDeployment.scrape_metrics(pd.decodes[0], "sglang_pd:shared_attn_kv_reads_saved_tokens")
    assert metrics and max(metrics.values()) == shared["shared_attn_kv_reads_saved_tokens_total"]
    pd.wait_clean()


def _wait_for_step(pd: PDDeployment, want, what: str) -> dict:
    """Poll decode's latest decode step (its grouping) until `want(step)`; returns that step."""
    def step_wanted():
        step = pd.scheduler_state(pd.decodes[0])["shared_attention"]["last_step"]
        return step if step is not None and want(step) else None
    return wait_until(step_wanted, f"a decode step with {what}", poll_s=0.02)


def test_members_aborted_mid_decode_leave_the_group_and_the_rest_equal_a_plain_server(pd: PDDeployment, plain_url: str):
    rng = random.Random(29)
    system = [1] + _tokens(rng, 479)
    pd.generate_pd(system + _tokens(rng, 3), 1)
    prompts = [system + _tokens(rng, 4 + 2 * i) for i in range(NUM_GROUPED)]
    rids = [f"grouped-{i}-{uuid.uuid4().hex[:6]}" for i in range(NUM_GROUPED)]
    aborted = set(rids[1::3])
    groups_before = pd.scheduler_state(pd.decodes[0])["shared_attention"]["shared_attn_groups_total"]
    with cf.ThreadPoolExecutor(NUM_GROUPED) as pool:
        futures = [pool.submit(pd.generate_pd, p, GROUPED_TOKENS, rid=r) for p, r in zip(prompts, rids)]
        _wait_for_step(pd, lambda s: s["batch_size"] == s["num_grouped_requests"] == NUM_GROUPED
                       and s["num_groups"] == 1, f"all {NUM_GROUPED} requests in one group")
        for rid in aborted:
            pd.abort(pd.decodes[0], rid)
        left = NUM_GROUPED - len(aborted)
        _wait_for_step(pd, lambda s: s["batch_size"] == s["num_grouped_requests"] == left and s["num_groups"] == 1,
                       f"the {left} others still in one group")
        bodies = {rid: f.result()[1] for rid, f in zip(rids, futures)}
    for prompt, rid in zip(prompts, rids):
        body = bodies[rid]
        if rid in aborted:
            assert body["meta_info"]["finish_reason"]["type"] == "abort"
            assert len(body["output_ids"]) < GROUPED_TOKENS
        else:
            assert_same(body, pd.generate(plain_url, prompt, GROUPED_TOKENS), rid)
    shared = pd.scheduler_state(pd.decodes[0])["shared_attention"]
    assert shared["shared_attn_groups_total"] > groups_before
    assert set(shared["fallback_layer_calls"].values()) == {0}
    pd.wait_clean()


def test_partials_averaged_instead_of_merged_change_the_grouped_outputs(pd: PDDeployment, plain_url: str):
    """Power check of the equality above: while shared_merge_average is armed, decode averages each
    request's segment and own partials (their weights ignored) instead of the log-sum-exp merge; the
    grouped requests' outputs then differ from a plain server's. Disarmed, the same pair equals plain again."""
    rng = random.Random(31)
    system = [1] + _tokens(rng, 479)
    pd.generate_pd(system + _tokens(rng, 3), 1)
    prompts = [system + _tokens(rng, 5 + 3 * i) for i in range(NUM_CLIENTS)]
    fired = lambda: pd.scheduler_state(pd.decodes[0])["faults"]["fired"].get("shared_merge_average", 0)  # noqa: E731
    # The group forms only while all 6 decode side by side (480 shared tokens x 5 saved reads >= the backend's
    # threshold); when their transfers land staggered it forms for fewer steps: send a fresh batch (at most 3).
    for attempt in range(3):
        before = fired()
        pd.arm_faults(pd.decodes[0], shared_merge_average=10**6)  # every grouped forward until disarmed
        try:
            broken = _concurrent_pd(pd, prompts, [NEW_TOKENS] * NUM_CLIENTS)
        finally:
            pd.arm_faults(pd.decodes[0], shared_merge_average=0)
        if fired() - before >= NEW_TOKENS // 2:
            break
        prompts = [system + _tokens(rng, 5 + 3 * i) for i in range(NUM_CLIENTS)]
    assert fired() - before >= NEW_TOKENS // 2, f"the requests decoded grouped while the fault was armed ({attempt + 1} tries)"
    for body, prompt in zip(broken, prompts):
        assert_differs(body, pd.generate(plain_url, prompt, NEW_TOKENS), "partials averaged")
    again = [system + _tokens(rng, 6 + 3 * i) for i in range(NUM_CLIENTS)]
    for body, prompt in zip(_concurrent_pd(pd, again, [NEW_TOKENS] * NUM_CLIENTS), again):
        assert_same(body, pd.generate(plain_url, prompt, NEW_TOKENS), "after")
    pd.wait_clean()
