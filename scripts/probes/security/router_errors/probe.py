"""Where does a refused request's 400 go when it passes the stock sglang-router in PD mode?

Starts one PD pair (page size 1, built-in tiny model) with sglang-router in front, then sends one request
whose input_ids hold a token outside the vocabulary, four ways: through the router streaming and not
streaming, and straight to each half (the bodies the router would send them, streaming). Records status,
content type and body of each. Writes docs/results/security/router_errors/probe.json (or --out).

usage: .venv/bin/python scripts/probes/security/router_errors/probe.py [--out FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
from pathlib import Path

import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.models import VOCAB_SIZE

ROOT = Path(__file__).resolve().parents[4]


def _answer(resp: requests.Response) -> dict:
    return {"status": resp.status_code, "content_type": resp.headers.get("content-type"),
            "body": resp.content.decode(errors="replace")[:600]}


def _post(url: str, body: dict) -> dict:
    try:
        return _answer(requests.post(url + "/generate", json=body, timeout=60, stream=False))
    except requests.RequestException as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs/results/security/router_errors/probe.json")
    args = p.parse_args(argv)
    bad = [5, 6, VOCAB_SIZE + 7, 8]
    sampling = {"max_new_tokens": 4, "temperature": 0.0}
    results = {"input_ids": bad, "vocab_size": VOCAB_SIZE}
    with PDDeployment(DeploymentConfig(page_size=1, with_router=True)) as dep:
        router = dep.router.url
        for stream in (True, False):
            results[f"router_stream_{stream}"] = _post(router, {"input_ids": bad, "sampling_params": sampling,
                                                                "stream": stream})
        pairing = dep.pairing()
        body = {"input_ids": bad, "sampling_params": sampling, "stream": True, **pairing}
        with cf.ThreadPoolExecutor(2) as pool:
            halves = {name: pool.submit(_post, url, body)
                      for name, url in (("prefill_half_stream", dep.prefill.url),
                                        ("decode_half_stream", dep.decodes[0].url))}
            results.update({name: fut.result() for name, fut in halves.items()})
        good = {"input_ids": [5, 6, 7, 8], "sampling_params": sampling, "stream": True}
        results["router_good_stream"] = _post(router, good)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
