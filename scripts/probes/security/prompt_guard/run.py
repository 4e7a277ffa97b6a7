"""Single requests that end or stall a plain SGLang 0.5.23 server, sent to one without sglang_pd
(SGLANG_PLUGINS=none) and to one with it: what the client gets, whether the server answers /health
5 s later (restarted before the next case if not), and the server log's error lines. Cases: a prompt
token id outside the vocabulary, logprob_start_len below -1, n = 10**6 parallel samples (sent with a
30 s client timeout), a stop token id outside the vocabulary with min_new_tokens, a top_k (sampled) and a
min_new_tokens above int32 (this model runs without a tokenizer, so SGLang itself refuses min_new_tokens
here). Writes docs/results/security/prompt_guard/result.json.

    .venv/bin/python scripts/probes/security/prompt_guard/run.py
"""

import json
import tempfile
import time
from pathlib import Path

import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.server import log_tail
from sglang_pd.models import VOCAB_SIZE

OUT = Path(__file__).resolve().parents[4] / "docs" / "results" / "security" / "prompt_guard"
IDS = [5 + i % 100 for i in range(40)]
CASES = {  # name -> request body
    "input_id_outside_vocabulary": {"input_ids": [5, 6, VOCAB_SIZE, 7]},
    "logprob_start_len_below_minus_one": {"input_ids": IDS, "return_logprob": True, "logprob_start_len": -7},
    "a_million_parallel_samples": {"input_ids": IDS, "sampling_params": {"n": 10 ** 6}},
    "stop_token_id_outside_vocabulary": {"input_ids": IDS,
                                         "sampling_params": {"min_new_tokens": 1, "stop_token_ids": [10 ** 8]}},
    # sampled: at temperature 0 SGLang replaces top_k by 1 before the batch is built
    "top_k_above_int32": {"input_ids": IDS, "sampling_params": {"top_k": 2 ** 40, "temperature": 1.0}},
    "min_new_tokens_above_int32": {"input_ids": IDS,
                                   "sampling_params": {"max_new_tokens": None, "min_new_tokens": 2 ** 40}},
}


def _alive(server) -> bool:
    try:
        return server.is_running() and requests.get(server.url + "/health", timeout=10).ok
    except requests.RequestException:
        return False


def probe(plugin: bool) -> dict:
    rows = {}
    with tempfile.TemporaryDirectory() as logs:
        dep = PDDeployment(DeploymentConfig(plugin=plugin, with_plain=True, log_dir=Path(logs)))
        server = dep.plain
        server.start()
        try:
            server.wait_healthy(time.monotonic() + 300)
            for name, body in CASES.items():
                body = {**body, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0,
                                                    **body.get("sampling_params", {})}}
                start = time.monotonic()
                try:
                    resp = requests.post(server.url + "/generate", json=body, timeout=30)
                    answer = {"status": resp.status_code, "body": resp.text[:300]}
                except requests.RequestException as exc:
                    answer = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                answer["seconds"] = round(time.monotonic() - start, 2)
                time.sleep(5)
                alive = _alive(server)
                errors = [line for line in log_tail(server.log_path, 200).splitlines()
                          if "Error" in line or "error" in line][-3:]
                rows[name] = {"answer": answer, "server_up_5s_later": alive, "log_error_lines": errors}
                print(plugin, name, json.dumps(rows[name])[:400], flush=True)
                if not alive:
                    server.restart(time.monotonic() + 300)
        finally:
            server.stop()
    return {"plugin": plugin, "vocab_size": VOCAB_SIZE, "cases": rows}


def main() -> int:
    report = {"command": "python scripts/probes/security/prompt_guard/run.py", "requests": CASES,
              "upstream": probe(False), "sglang_pd": probe(True)}
    (OUT / "result.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({side: {name: (row["answer"].get("status", row["answer"].get("error", "")[:40]),
                                    row["server_up_5s_later"]) for name, row in report[side]["cases"].items()}
                      for side in ("upstream", "sglang_pd")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
