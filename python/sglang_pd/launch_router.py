"""Start a PyPI router (sglang-router) in PD mode so each conversation stays on the decode server
that holds its prefix, after checking that the deployment is consistent.

    python -m sglang_pd.launch_router --prefill http://P:30001 8998 --decode http://D1:30002 \\
        --decode http://D2:30002 [--policy affinity|round_robin] [--host 127.0.0.1] [--port 30000]

Clients mark a conversation with the header `X-SMG-Routing-Key: <conversation id>` (same value on
every turn). Policy `affinity` (default) is the router's `manual` decode policy: a key is pinned to
one decode server for as long as it is used, and new keys go to the least-loaded decode server
(`--assignment-mode min_load`), so load stays balanced across conversations; prefill is round-robin.
Why not cache_aware: it matches on request text, and PD clients here send token ids; consistent
hashing cannot rebalance when load is uneven. Requests without the header are placed by load.

Preflight (fails with one clear line naming the worker): every worker answers /health; every worker
runs the sglang_pd plugin; --prefill URLs are prefill servers and --decode URLs decode servers; all
agree on model, page size and transfer backend.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import requests

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
POLICIES = {
    "affinity": ["--prefill-policy", "round_robin", "--decode-policy", "manual", "--assignment-mode", "min_load"],
    "round_robin": ["--policy", "round_robin"],
}


class PreflightError(RuntimeError):
    """The deployment cannot be routed as asked; the message names the worker and the problem."""


@dataclass(frozen=True)
class Worker:
    """One server as the preflight saw it."""

    url: str
    role: str
    model_path: str
    page_size: int
    transfer_backend: str


def probe(url: str, expected_role: str, timeout: float = 10) -> Worker:
    """Check one worker is up, runs sglang_pd and has `expected_role`."""
    try:
        if requests.get(url + "/health", timeout=timeout).status_code != 200:
            raise PreflightError(f"{url}: /health did not answer 200")
        resp = requests.get(url + "/sglang_pd/info", timeout=timeout)
    except requests.RequestException as exc:
        raise PreflightError(f"{url}: not reachable ({type(exc).__name__})") from None
    if resp.status_code != 200:
        raise PreflightError(f"{url}: no /sglang_pd/info (is the sglang_pd plugin installed there?)")
    info = resp.json()
    if info["role"] != expected_role:
        raise PreflightError(f"{url}: given as {expected_role} but the server runs as {info['role']}")
    return Worker(url, info["role"], info["model_path"], int(info["page_size"]), info["transfer_backend"])


def preflight(prefills: list[str], decodes: list[str]) -> list[Worker]:
    """Probe every worker and check they agree on model, page size and transfer backend."""
    if not prefills or not decodes:
        raise PreflightError("need at least one --prefill and one --decode")
    workers = [probe(u, "prefill") for u in prefills] + [probe(u, "decode") for u in decodes]
    for field in ("model_path", "page_size", "transfer_backend"):
        values = {getattr(w, field) for w in workers}
        if len(values) > 1:
            detail = ", ".join(f"{w.url}={getattr(w, field)}" for w in workers)
            raise PreflightError(f"workers disagree on {field}: {detail}")
    return workers


def router_argv(args: argparse.Namespace) -> list[str]:
    """The sglang-router command line for the checked deployment."""
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--host", args.host, "--port", str(args.port)]
    for url, port in args.prefill:
        argv += ["--prefill", url, port or "none"]
    for url in args.decode:
        argv += ["--decode", url]
    return argv + POLICIES[args.policy] + list(args.router_arg)


def _prefill_arg(values: list[str]) -> tuple[str, str | None]:
    if len(values) not in (1, 2) or (len(values) == 2 and not values[1].isdigit()):
        raise argparse.ArgumentTypeError(f"--prefill takes URL [BOOTSTRAP_PORT], got {values}")
    return values[0].rstrip("/"), values[1] if len(values) == 2 else None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill", nargs="+", action="append", required=True, metavar="URL [BOOTSTRAP_PORT]")
    p.add_argument("--decode", action="append", required=True, metavar="URL")
    p.add_argument("--policy", choices=sorted(POLICIES), default="affinity")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--router-arg", action="append", default=[], help="extra sglang-router flag (repeatable)")
    p.add_argument("--check-only", action="store_true", help="run the preflight and exit")
    args = p.parse_args(argv)
    try:
        args.prefill = [_prefill_arg(v) for v in args.prefill]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.decode = [u.rstrip("/") for u in args.decode]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        workers = preflight([u for u, _ in args.prefill], args.decode)
    except PreflightError as exc:
        print(f"launch_router: {exc}", file=sys.stderr)
        return 2
    w = workers[0]
    print(f"launch_router: {len(workers)} workers agree: model={w.model_path} page_size={w.page_size} "
          f"backend={w.transfer_backend}; policy={args.policy} (header {ROUTING_KEY_HEADER})", flush=True)
    if args.check_only:
        return 0
    argv = router_argv(args)
    os.execv(argv[0], argv)  # become the router: whoever started us stops it by our PID


if __name__ == "__main__":
    raise SystemExit(main())
