"""50 hostile /generate bodies (bootstrap room/host/port of wrong type or range, huge or negative
sampling values, logprob fields beyond the vocabulary or below -1, n = 0 / a string / 10**6, malformed
or over-long input_ids, stop lists, bad regexes, embeddings / images / hidden states on a text server,
LoRA path, custom logit processor, DP rank, session) sent to a PD pair's prefill alone, decode alone,
and both paired as a router would; after each, both servers' /health. Stops at the first server down.
Writes docs/results/security/prompt_guard/http_fuzz.json.

    .venv/bin/python scripts/probes/security/prompt_guard/http_fuzz.py
"""
import concurrent.futures as cf
import json
import sys
from pathlib import Path

import requests
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import VOCAB_SIZE
dep = PDDeployment(DeploymentConfig(page_size=16))
ok_ids = [5 + i % 100 for i in range(40)]
cases = {
  "control": {},
  "room_without_host": {"bootstrap_room": 12345},
  "room_str": {"bootstrap_room": "abc"}, "room_neg": {"bootstrap_room": -5}, "room_huge": {"bootstrap_room": 2**80},
  "room_float": {"bootstrap_room": 1.5}, "port_str": {"bootstrap_port": "x"}, "port_huge": {"bootstrap_port": 10**9},
  "port_neg": {"bootstrap_port": -1}, "host_garbage": {"bootstrap_host": "\x00\xff;rm"}, "host_list": {"bootstrap_host": [1]},
  "rid_dict": {"rid": {"a": 1}}, "rid_huge": {"rid": "x" * 100000},
  "mnt_huge": {"sampling_params": {"max_new_tokens": 10**12}}, "mnt_neg": {"sampling_params": {"max_new_tokens": -3}},
  "temp_nan": {"sampling_params": {"temperature": float("nan"), "max_new_tokens": 4}},
  "top_k_0": {"sampling_params": {"top_k": 0, "max_new_tokens": 4}},
  "stop_ids_bad": {"sampling_params": {"stop_token_ids": [10**9], "max_new_tokens": 4}},
  "logit_bias_bad": {"sampling_params": {"logit_bias": {"999999": 5.0}, "max_new_tokens": 4}},
  "logprob_start_huge": {"return_logprob": True, "logprob_start_len": 10**9},
  "top_logprobs_huge": {"return_logprob": True, "top_logprobs_num": 10**6},
  "input_ids_nested": {"input_ids": [[1, 2], [3]]}, "input_ids_empty": {"input_ids": []},
  "input_ids_strs": {"input_ids": ["a", "b"]},
  "lora": {"lora_path": "../../etc/passwd"},
  "custom_logit_processor": {"custom_logit_processor": "garbage"},
  "data_parallel_rank": {"data_parallel_rank": 99},
  "session": {"session_params": {"id": "nope"}},
  # added with the logprob_start_len / n checks (upstream: -7 ends the scheduler, n = 10**6 stalls HTTP)
  "logprob_start_neg": {"return_logprob": True, "logprob_start_len": -7},
  "logprob_start_beyond": {"return_logprob": True, "logprob_start_len": 41},
  "n_huge": {"sampling_params": {"n": 10**6}}, "n_zero": {"sampling_params": {"n": 0}},
  "n_str": {"sampling_params": {"n": "2"}},
  "token_ids_logprob_bad": {"return_logprob": True, "token_ids_logprob": [VOCAB_SIZE, -5]},
  "min_new_huge": {"sampling_params": {"min_new_tokens": 2**40}},
  "min_new_neg": {"sampling_params": {"min_new_tokens": -3}},
  "seed_huge": {"sampling_params": {"sampling_seed": 2**70, "temperature": 1.0}},
  "temp_huge": {"sampling_params": {"temperature": 1e300}},
  "min_p_big": {"sampling_params": {"min_p": 5.0, "temperature": 1.0}},
  "top_k_huge": {"sampling_params": {"top_k": 2**40}},
  "rep_zero": {"sampling_params": {"repetition_penalty": 0.0}},
  "bias_key_str": {"sampling_params": {"logit_bias": {"abc": 1.0}}},
  "bias_key_vocab": {"sampling_params": {"logit_bias": {str(VOCAB_SIZE): 1.0}}},
  "stop_many": {"sampling_params": {"stop": ["ab%d" % i for i in range(5000)]}},
  "stop_regex_bad": {"sampling_params": {"stop_regex": "(("}},
  "rid_list": {"rid": ["a", "b"]},
  "input_embeds": {"input_embeds": [[1.0, 2.0]]},
  "image_data": {"image_data": "http://127.0.0.1:1/x.png"},
  "hidden_states": {"return_hidden_states": True},
  "priority_huge": {"priority": 10**30},
  "ids_too_long": {"input_ids": [5] * 100000},
}
with dep:
    rows = []
    for name, extra in cases.items():
        for target in ("prefill", "decode", "pair"):
            body_ids = extra.get("input_ids", ok_ids)
            ex = {k: v for k, v in extra.items() if k != "input_ids"}
            sp = {"max_new_tokens": 4, "temperature": 0.0, **ex.pop("sampling_params", {})}
            body = {"input_ids": body_ids, "sampling_params": sp, **ex}
            if target == "pair":
                body = {**dep.pairing(), **body}
            try:
                if target == "pair":
                    with cf.ThreadPoolExecutor(2) as pool:
                        fs = [pool.submit(requests.post, u + "/generate", data=json.dumps(body, allow_nan=True), headers={"Content-Type": "application/json"}, timeout=40) for u in (dep.prefill.url, dep.decodes[0].url)]
                        st = [f.result().status_code for f in fs]
                else:
                    url = dep.prefill.url if target == "prefill" else dep.decodes[0].url
                    st = requests.post(url + "/generate", data=json.dumps(body, allow_nan=True), headers={"Content-Type": "application/json"}, timeout=40).status_code
            except Exception as e:
                st = type(e).__name__
            alive = []
            for s in dep.servers:
                try:
                    alive.append(s.is_running() and requests.get(s.url + "/health", timeout=10).status_code)
                except Exception as e:
                    alive.append(type(e).__name__)
            print(name, target, st, alive, flush=True)
            rows.append({"case": name, "sent_to": target, "status": st, "health_after": alive})
            if name == "control" and target == "pair": assert st == [200, 200], st
            if not all(a == 200 for a in alive):
                print("SERVER DOWN after", name, target)
                break
        else:
            continue
        break
    servers_up = all(row["health_after"] == [200, 200] for row in rows)
    clean = dep.wait_clean(timeout_s=60) if servers_up else None
    report = {"command": "python scripts/probes/security/prompt_guard/http_fuzz.py", "num_bodies": len(cases) - 1,
              "servers_up_after_every_body": servers_up, "leak_check_clean": clean is not None, "rows": rows}
    (Path(__file__).resolve().parents[4] / "docs" / "results" / "security" / "prompt_guard" / "http_fuzz.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    sys.exit(0 if servers_up else 1)
