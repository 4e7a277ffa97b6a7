"""One prompt token id outside the vocabulary, sent to a plain SGLang 0.5.23 server without sglang_pd
(SGLANG_PLUGINS=none) and to one with it: what the client gets, whether the server is still up, and the
tail of the server's log. Writes result.json beside this file.

    .venv/bin/python docs/prompt_guard/run.py
"""

import json
import tempfile
import time
from pathlib import Path

import requests

from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.server import log_tail
from sglang_pd.models import VOCAB_SIZE

HERE = Path(__file__).parent


def probe(plugin: bool) -> dict:
    with tempfile.TemporaryDirectory() as logs:
        dep = PDDeployment(DeploymentConfig(plugin=plugin, with_plain=True, log_dir=Path(logs)))
        server = dep.plain
        server.start()
        try:
            server.wait_healthy(time.monotonic() + 300)
            ids = [5, 6, VOCAB_SIZE, 7]
            try:
                resp = dep.post_generate(server.url, ids, 4, timeout=60)
                answer = {"status": resp.status_code, "body": resp.text[:300]}
            except requests.RequestException as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            time.sleep(5)
            alive = server.is_running() and requests.get(server.url + "/health", timeout=10).ok \
                if server.is_running() else False
            tail = [line for line in log_tail(server.log_path, 60).splitlines()
                    if "Error" in line or "error" in line][-4:]
            return {"plugin": plugin, "input_ids": ids, "vocab_size": VOCAB_SIZE, "answer": answer,
                    "server_up_5s_later": bool(alive), "log_error_lines": tail}
        finally:
            server.stop()


def main() -> int:
    report = {"command": "python docs/prompt_guard/run.py", "upstream": probe(False), "sglang_pd": probe(True)}
    (HERE / "result.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
