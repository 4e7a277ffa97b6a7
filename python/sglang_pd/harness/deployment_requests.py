"""The requests side of a PD deployment: generate through prefill + decode paired by a room, read stats,
arm faults, abort, and wait until every server is idle and clean.

`DeploymentRequests` is a base of `PDDeployment` (harness/deployment.py), which provides what it reads:
`prefill`, `decodes` (ServerProcess), `headers` (auth headers or None), `bootstrap_port` and `config`
(`plugin`: whether sglang_pd runs on the servers).
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import time

import requests

from sglang_pd.harness import upstream_state
from sglang_pd.harness.equality import logprob_fields
from sglang_pd.harness.server import ServerProcess


def _recorded_faults(report: dict) -> dict:
    """Hook errors and double / unknown lock releases a scheduler report shows (empty when none)."""
    ledger = report.get("lock_ledger") or {}
    found = {"hook_errors": report.get("hook_errors"),
             "double_releases": ledger.get("num_double_releases"),
             "unknown_releases": ledger.get("num_unknown_releases")}
    if "error" in report:
        found["snapshot_error"] = report["error"]
    return {k: v for k, v in found.items() if v}


def new_bootstrap_room(rng: random.Random | None = None) -> int:
    """A random bootstrap room id (63-bit, as SGLang's router uses)."""
    return (rng or random).randrange(1, 2**63 - 1)


class DeploymentRequests:
    """Requests to a running deployment and its clean-state checks (see the module docstring)."""

    @staticmethod
    def post_generate(url: str, input_ids: list[int], max_new_tokens: int = 8, timeout: float = 300,
                      headers: dict | None = None, logprobs: bool = True, **extra) -> requests.Response:
        """POST /generate (greedy, ignore_eos) with `input_ids`; the raw response, any status. With
        `logprobs` (default) the answer carries the output logprobs equality.compare reads (False: none;
        a request asking for logprobs never runs inside a mixed decode-local extend)."""
        body = {"input_ids": input_ids, **(logprob_fields() if logprobs else {"return_logprob": False}),
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                    "ignore_eos": True}, **extra}
        return requests.post(url + "/generate", json=body, headers=headers, timeout=timeout)

    @classmethod
    def generate(cls, url: str, input_ids: list[int], max_new_tokens: int = 8, timeout: float = 300,
                 headers: dict | None = None, **extra) -> dict:
        """POST /generate (greedy); returns the JSON body, raising on HTTP errors."""
        resp = cls.post_generate(url, input_ids, max_new_tokens, timeout, headers, **extra)
        resp.raise_for_status()
        return resp.json()

    def pairing(self, room: int | None = None, bootstrap_port: int | None = None) -> dict:
        """The bootstrap fields a router adds to pair one request across prefill and decode."""
        return {"bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port or self.bootstrap_port,
                "bootstrap_room": new_bootstrap_room() if room is None else room}

    def post_generate_pd(self, input_ids: list[int], max_new_tokens: int = 8, decode_index: int = 0,
                         timeout: float = 300, room: int | None = None,
                         **extra) -> tuple[requests.Response, requests.Response, int]:
        """Like generate_pd but returns the raw responses (for failure paths) and the room."""
        pairing = self.pairing(room)
        with cf.ThreadPoolExecutor(2) as pool:
            fp = pool.submit(self.post_generate, self.prefill.url, input_ids, max_new_tokens, timeout,
                             self.headers, **pairing, **extra)
            fd = pool.submit(self.post_generate, self.decodes[decode_index].url, input_ids, max_new_tokens,
                             timeout, self.headers, **pairing, **extra)
            return fp.result(), fd.result(), pairing["bootstrap_room"]

    def generate_pd(self, input_ids: list[int], max_new_tokens: int = 8, decode_index: int = 0,
                    room: int | None = None, timeout: float = 300, **extra) -> tuple[dict, dict, int]:
        """Send the request to prefill and decode paired by a bootstrap room, as a router does.

        `extra` goes into both bodies (e.g. `rid`). Returns (prefill_body, decode_body, room).
        """
        pairing = self.pairing(room)
        room = pairing["bootstrap_room"]
        with cf.ThreadPoolExecutor(2) as pool:
            fp = pool.submit(self.generate, self.prefill.url, input_ids, max_new_tokens, timeout, self.headers,
                             **pairing, **extra)
            fd = pool.submit(self.generate, self.decodes[decode_index].url, input_ids, max_new_tokens,
                             timeout, self.headers, **pairing, **extra)
            return fp.result(), fd.result(), room

    @staticmethod
    def get_json(url: str, path: str, timeout: float = 30, headers: dict | None = None) -> dict:
        """GET `path` on a server and return its JSON body."""
        resp = requests.get(url + path, headers=headers, timeout=timeout)
        resp.raise_for_status()
        return resp.json()

    def prefill_rooms(self) -> dict[int, dict]:
        """Prefill's transfer record per bootstrap room (decode_prefix_len that reached it, pages)."""
        stats = self.get_json(self.prefill.url, "/sglang_pd/stats", headers=self.headers)
        rooms: dict[int, dict] = {}
        for sched in stats["schedulers"]:
            rooms.update({int(k): v for k, v in sched["prefill_transfer"]["rooms"].items()})
        return rooms

    def scheduler_state(self, server: ServerProcess) -> dict:
        """sglang_pd state of the server's (first) scheduler, with a fresh integrity report."""
        return self.get_json(server.url, "/sglang_pd/stats", headers=self.headers)["schedulers"][0]

    def arm_faults(self, server: ServerProcess, **counts: int) -> None:
        """Arm test faults on a server started with fault_injection=True."""
        resp = requests.post(server.url + "/sglang_pd/faults", json=counts, headers=self.headers, timeout=30)
        resp.raise_for_status()

    def abort(self, server: ServerProcess, rid: str) -> None:
        """Ask a server to abort request `rid` (SGLang's /abort_request)."""
        requests.post(server.url + "/abort_request", json={"rid": rid}, headers=self.headers,
                      timeout=30).raise_for_status()

    def wait_clean(self, timeout_s: float = 90.0, servers: list[ServerProcess] | None = None) -> dict[str, dict]:
        """Wait until every PD server (or `servers`) is idle and clean; returns their reports.

        With sglang_pd: idle with a passing integrity check (no lock, nothing in flight, every token
        accounted for), and, at once (they never go back down), no hook error and no double or unknown
        lock release. Without it (config.plugin False), or on a decode server with the radix cache off
        (no tree to check), what SGLang itself shows
        (upstream_state.idle_report: no request in any queue, no KV token held outside the evictable
        tree, no leak warning from SGLang's idle check); lock owners and double releases cannot be
        checked without sglang_pd. Raises AssertionError naming what is not clean: at once for recorded
        faults, with the last reports if time runs out.
        """
        deadline = time.monotonic() + timeout_s
        servers = servers or [self.prefill, *self.decodes]
        while True:
            reports = {s.name: self._clean_report(s) for s in servers}
            faults = {n: r["faults"] for n, r in reports.items() if r["faults"]}
            if faults:
                raise AssertionError(f"plugin faults recorded: {faults}")
            if all(r["idle"] and r["ok"] for r in reports.values()):
                return {n: r["report"] for n, r in reports.items()}
            if time.monotonic() > deadline:
                summary = {n: r["summary"] for n, r in reports.items()}
                raise AssertionError(f"deployment not clean after {timeout_s}s: {summary}")
            time.sleep(0.5)

    def _clean_report(self, server: ServerProcess) -> dict:
        """One server's idle/ok verdict, its report, a summary for errors and the faults sglang_pd recorded."""
        state = self.scheduler_state(server) if self.config.plugin else None
        faults = _recorded_faults(state) if state is not None else {}
        if state is None or state.get("integrity") is None:
            # No sglang_pd, or no radix tree to check (decode with the radix cache off): SGLang's view.
            report = upstream_state.idle_report(server.url, server.log_path)
            return {"idle": report["idle"], "ok": report["ok"], "report": report, "summary": report,
                    "faults": faults}
        integrity = state["integrity"]
        return {"idle": integrity.get("idle"), "ok": integrity.get("ok"), "report": state, "faults": faults,
                "summary": {"integrity": state.get("integrity"), "lock_ledger": state.get("lock_ledger"),
                            "queues": state.get("queues")}}

    @staticmethod
    def scrape_metrics(server: ServerProcess, prefix: str = "sglang_pd:") -> dict[str, float]:
        """Prometheus samples of `server`'s /metrics whose name starts with `prefix` (labels kept)."""
        text = requests.get(server.url + "/metrics", timeout=30).text
        samples = {}
        for line in text.splitlines():
            if line.startswith(prefix):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples
