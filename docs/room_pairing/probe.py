"""What a bootstrap room shared by two different prompts does (a finding, not fixed): prompts A and B
(same length, different tokens) sent under ONE room, as prefill A + decode A and prefill B + decode B
at the same time; then a room claimed by two decode requests (A, B) and one prefill (A); then one
decode (B) and two prefills (A, B). Per request: HTTP status, output ids, and whether they equal
plain's greedy output for its own prompt or for the OTHER prompt (a cross-request answer). Then a
normal pair, and the leak check. Client timeout 30 s. Writes probe.json beside this file.

    .venv/bin/python docs/room_pairing/probe.py
"""

import concurrent.futures as cf
import json
import random
from pathlib import Path

import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment

NEW = 8


def main() -> int:
    rng = random.Random(7)
    a, b = ([rng.randrange(3, 500) for _ in range(100)] for _ in range(2))
    dep = PDDeployment(DeploymentConfig(page_size=16, with_plain=True))
    rows = []
    with dep:
        plain = {"A": dep.generate(dep.plain.url, a, NEW)["output_ids"], "B": dep.generate(dep.plain.url, b, NEW)["output_ids"]}

        def send(role: str, prompt: str, room: int) -> dict:
            url = dep.prefill.url if role == "prefill" else dep.decodes[0].url
            body = {"input_ids": a if prompt == "A" else b, **dep.pairing(room),
                    "sampling_params": {"max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}}
            try:
                resp = requests.post(url + "/generate", json=body, timeout=30)
                out = resp.json().get("output_ids") if resp.ok else None
                row = {"status": resp.status_code, "output_ids": out}
            except requests.RequestException as exc:
                row = {"status": type(exc).__name__, "output_ids": None}
            if role == "decode" and row["output_ids"] is not None:
                other = "B" if prompt == "A" else "A"
                row["equals_plain_own_prompt"] = row["output_ids"] == plain[prompt]
                row["equals_plain_other_prompt"] = row["output_ids"] == plain[other]
            return {"role": role, "prompt": prompt, **row}

        for case, halves in (("two pairs, one room", [("prefill", "A"), ("decode", "A"), ("prefill", "B"), ("decode", "B")]),
                             ("two decodes, one prefill", [("prefill", "A"), ("decode", "A"), ("decode", "B")]),
                             ("one decode, two prefills", [("prefill", "A"), ("prefill", "B"), ("decode", "B")])):
            room = rng.randrange(2 ** 40)
            with cf.ThreadPoolExecutor(len(halves)) as pool:
                got = [f.result() for f in [pool.submit(send, role, prompt, room) for role, prompt in halves]]
            rows.append({"case": case, "requests": got, "servers_up": [s.is_running() for s in dep.servers]})
            print(json.dumps(rows[-1]), flush=True)
        _, decoded, _ = dep.generate_pd(a, NEW)
        clean = dep.wait_clean(timeout_s=400)
        report = {"command": "python docs/room_pairing/probe.py", "plain": plain, "cases": rows,
                  "normal_pair_after_equals_plain": decoded["output_ids"] == plain["A"],
                  "leak_check_clean": clean is not None}
    Path(__file__).with_name("probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "cases"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
