"""What a bootstrap room shared by two different prompts does, upstream SGLang 0.5.23 alone (sglang_pd not
loaded) vs with sglang_pd (prompt binding, srt/wire/prompt_binding.py), on the same kind of PD
pair (mooncake TCP, page 16). Prompts A and B (100 tokens each) under ONE room: (1) two full pairs at
once; (2) two decode requests (A, B) and one prefill (A); (3) one decode (B) and two prefills (A, B).
Per request: HTTP status, output ids, and whether a decode answer equals plain's greedy output for its
own prompt or for the OTHER prompt (one client answered with another's continuation). Then a normal
pair, and (with sglang_pd) the leak check. Client timeout 30 s. Writes
docs/results/security/room_pairing/probe.json.

    .venv/bin/python scripts/probes/security/room_pairing/probe.py
"""

import concurrent.futures as cf
import json
import random
from pathlib import Path

import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment

NEW = 8
CASES = (("two pairs, one room", [("prefill", "A"), ("decode", "A"), ("prefill", "B"), ("decode", "B")]),
         ("two decodes, one prefill", [("prefill", "A"), ("decode", "A"), ("decode", "B")]),
         ("one decode, two prefills", [("prefill", "A"), ("prefill", "B"), ("decode", "B")]))


def probe(plugin: bool) -> dict:
    rng = random.Random(7)
    prompts = {"A": [rng.randrange(3, 500) for _ in range(100)], "B": [rng.randrange(3, 500) for _ in range(100)]}
    dep = PDDeployment(DeploymentConfig(page_size=16, with_plain=True, plugin=plugin))
    rows = []
    with dep:
        plain = {name: dep.generate(dep.plain.url, ids, NEW)["output_ids"] for name, ids in prompts.items()}

        def send(role: str, prompt: str, room: int) -> dict:
            url = dep.prefill.url if role == "prefill" else dep.decodes[0].url
            body = {"input_ids": prompts[prompt], **dep.pairing(room),
                    "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}}
            try:
                resp = requests.post(url + "/generate", json=body, timeout=30)
                out = resp.json().get("output_ids") if resp.ok else None
                row = {"status": resp.status_code, "output_ids": out,
                       "error": None if resp.ok else resp.text[:240]}
            except requests.RequestException as exc:
                row = {"status": type(exc).__name__, "output_ids": None, "error": None}
            if role == "decode" and row["output_ids"] is not None:
                other = "B" if prompt == "A" else "A"
                row["equals_plain_own_prompt"] = row["output_ids"] == plain[prompt]
                row["equals_plain_other_prompt"] = row["output_ids"] == plain[other]
            return {"role": role, "prompt": prompt, **row}

        for case, halves in CASES:
            room = rng.randrange(2 ** 40)
            with cf.ThreadPoolExecutor(len(halves)) as pool:
                got = [f.result() for f in [pool.submit(send, role, prompt, room) for role, prompt in halves]]
            rows.append({"case": case, "requests": got, "servers_up": [s.is_running() for s in dep.servers]})
            print(plugin, json.dumps(rows[-1]), flush=True)
        _, decoded, _ = dep.generate_pd(prompts["A"], NEW)
        clean = dep.wait_clean(timeout_s=400) if plugin else None
        crossed = sum(1 for row in rows for r in row["requests"] if r.get("equals_plain_other_prompt"))
        return {"plugin": plugin, "plain": plain, "cases": rows, "answers_with_the_other_prompts_output": crossed,
                "normal_pair_after_equals_plain": decoded["output_ids"] == plain["A"],
                "leak_check_clean": None if clean is None else True}


def main() -> int:
    report = {"command": "python scripts/probes/security/room_pairing/probe.py", "upstream": probe(False), "sglang_pd": probe(True)}
    (Path(__file__).resolve().parents[4] / "docs" / "results" / "security" / "room_pairing" / "probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({side: {k: v for k, v in report[side].items() if k not in ("cases", "plain")}
                      for side in ("upstream", "sglang_pd")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
