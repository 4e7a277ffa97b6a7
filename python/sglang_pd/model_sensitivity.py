"""Does the output of the built-in models depend on the KV? Measured, per model, on the checkpoint the
servers load (transformers' Llama on CPU, eager attention: the reference implementation, not SGLang).

    python -m sglang_pd.model_sensitivity --out docs/results/evidence/sensitivity.json     # ~1 min here

For random prompts of the lengths the tests and benchmarks use, the greedy output (8 tokens) is
computed once as is and once with each break, and the share of prompts whose output changed is
reported, with the median change of the first token's logprobs (max over the vocabulary):
- `attention_zeroed`: every attention layer's output is zero (the model sees only the current token);
- `context_shuffled`: the prompt's tokens before the last in a random order;
- `page_replaced`: one 16-token page of the prompt's KV (every layer) holds the KV of other tokens, the
  rest of the KV untouched: what a wrong transferred or cached page is;
- `tail_shifted`: the last 8 prompt tokens computed at positions one page (16) later than the prefix
  (RoPE): what a local extend at wrong positions is.
With `--dummy`, the same for weights drawn as SGLang's `--load-format dummy` draws them (uniform in
+-1e-3): the models every equality check used before.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from sglang_pd.models import VOCAB_SIZE, ensure_model_dir, model_config

LENGTHS = (41, 64, 100, 200, 481, 768)
NEW_TOKENS = 8
PAGE = 16
TAIL = 8


def load(name: str, dummy: bool):
    """The built-in model `name` in transformers (eager attention); `dummy`: SGLang's dummy weights instead."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = ensure_model_dir(name)
    if not dummy:
        return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    model = LlamaForCausalLM(LlamaConfig(**model_config(name), attn_implementation="eager")).eval()
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.rand(param.shape, generator=gen) * 2e-3 - 1e-3)
    return model


@torch.no_grad()
def _continue(model, cache, last_token: int, position: int) -> tuple[list[int], torch.Tensor]:
    """Greedy NEW_TOKENS from `cache` (the prompt minus its last token) fed `last_token` at `position`;
    returns (tokens, first token's logprobs)."""
    tokens, first, token, pos = [], None, last_token, position
    for _ in range(NEW_TOKENS):
        out = model(torch.tensor([[token]]), past_key_values=cache, position_ids=torch.tensor([[pos]]), use_cache=True)
        logprobs = torch.log_softmax(out.logits[0, -1], -1)
        first = logprobs if first is None else first
        token, pos, cache = int(logprobs.argmax()), pos + 1, out.past_key_values
        tokens.append(token)
    return tokens, first


@torch.no_grad()
def _prefix_cache(model, ids: list[int], offset: int = 0):
    return model(torch.tensor([ids]), position_ids=torch.arange(offset, offset + len(ids))[None],
                 use_cache=True).past_key_values


def greedy(model, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    return _continue(model, _prefix_cache(model, ids[:-1]), ids[-1], len(ids) - 1)


def with_attention_zeroed(model, ids: list[int]):
    hooks = [layer.self_attn.o_proj.register_forward_hook(lambda mod, args, out: out * 0)
             for layer in model.model.layers]
    try:
        return greedy(model, ids)
    finally:
        for hook in hooks:
            hook.remove()


def with_page_replaced(model, ids: list[int], rng: random.Random):
    cache = _prefix_cache(model, ids[:-1])
    start = rng.randrange(0, (len(ids) - 1) // PAGE) * PAGE
    other = list(ids[:-1])
    other[start:start + PAGE] = [rng.randrange(3, VOCAB_SIZE) for _ in range(PAGE)]
    wrong = _prefix_cache(model, other)
    for layer, bad in zip(cache.layers, wrong.layers):
        layer.keys[:, :, start:start + PAGE] = bad.keys[:, :, start:start + PAGE]
        layer.values[:, :, start:start + PAGE] = bad.values[:, :, start:start + PAGE]
    return _continue(model, cache, ids[-1], len(ids) - 1)


@torch.no_grad()
def with_tail_shifted(model, ids: list[int]):
    cache = _prefix_cache(model, ids[:-TAIL])
    start = len(ids) - TAIL + PAGE
    cache = model(torch.tensor([ids[-TAIL:-1]]), past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(start, start + TAIL - 1)[None]).past_key_values
    return _continue(model, cache, ids[-1], start + TAIL - 1)


def measure(name: str, num_prompts: int, dummy: bool, seed: int = 7) -> dict:
    """Share of prompts whose greedy output each break changes, per break (module docstring)."""
    model, rng = load(name, dummy), random.Random(seed)
    breaks = {"attention_zeroed": lambda ids: with_attention_zeroed(model, ids),
              "context_shuffled": lambda ids: greedy(model, rng.sample(ids[:-1], len(ids) - 1) + ids[-1:]),
              "page_replaced": lambda ids: with_page_replaced(model, ids, rng),
              "tail_shifted": lambda ids: with_tail_shifted(model, ids)}
    changed = {b: 0 for b in breaks}
    shifts: dict[str, list[float]] = {b: [] for b in breaks}
    for i in range(num_prompts):
        ids = [rng.randrange(3, VOCAB_SIZE) for _ in range(LENGTHS[i % len(LENGTHS)])]
        tokens, logprobs = greedy(model, ids)
        for what, broken in breaks.items():
            other, other_logprobs = broken(ids)
            changed[what] += other != tokens
            shifts[what].append(float((other_logprobs - logprobs).abs().max()))
    return {"weights": "SGLang --load-format dummy (uniform +-1e-3)" if dummy else "seeded checkpoint (checkpoint.py)",
            "num_prompts": num_prompts, "prompt_lengths": list(LENGTHS), "new_tokens": NEW_TOKENS,
            "outputs_changed": {b: f"{n}/{num_prompts}" for b, n in changed.items()},
            "share_changed": {b: n / num_prompts for b, n in changed.items()},
            "median_first_logprob_change": {b: statistics.median(v) for b, v in shifts.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,capacity")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--dummy", action="store_true", help="also measure SGLang's dummy weights, for comparison")
    p.add_argument("--out", help="JSON file to write")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    t0, report = time.perf_counter(), {}
    for name in args.models.split(","):
        report[name] = measure(name, args.num_prompts, dummy=False)
        if args.dummy:
            report[f"{name} (dummy weights)"] = measure(name, args.num_prompts, dummy=True)
    for name, figures in report.items():
        print(f"{name}: {figures['outputs_changed']}; median first-token |d logprob| "
              f"{ {b: round(v, 4) for b, v in figures['median_first_logprob_change'].items()} }")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": "python -m sglang_pd.model_sensitivity "
                                              + " ".join(argv or []), "models": report,
                                              "wall_time_s": round(time.perf_counter() - t0, 1)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
