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

API key (`--api-key-file PATH`): when the servers run with SGLang's own `--api-key KEY` (every endpoint but
/health*, /ready* and /metrics then answers 401 without `Authorization: Bearer KEY`, the plugin's
/sglang_pd/* included), give the launcher a file holding that key (one line; the file must not be
readable by group or others). The preflight and the readiness watcher send it, and the router requires
it from its clients too and sends it to the workers. The key is in no process's command line: the file
keeps it out of the launcher's (and shell history), and sglang-router, which takes a key only as
`--api-key KEY`, is started through `sglang_pd.router_child`, which reads the key from a pipe this
launcher filled (`--api-key-fd N` is all its command line shows) and hands it to sglang-router's own
parser and launch function in-process. A `--router-arg` carrying `--api-key` is refused for that reason,
as is one carrying another of sglang-router's credential flags (SECRET_ROUTER_FLAGS: control-plane keys,
database password and URLs; sglang-router reads the latter from its environment too).

Readiness: the router's /readiness can answer 200 before it has registered every worker (a CI run's
router log shows 2 of 3), and a conversation pinned in that window stays on the decode server it
was placed on for good. A watcher (a short-lived child; the router keeps this process's PID) polls the
router's /workers and prints `launch_router: ready: ...` once every given worker is registered and
healthy, or a warning naming the missing ones after --ready-timeout. Send traffic after that line
(scripts: `wait_registered()`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from sglang_pd import router_child
from sglang_pd.secret_file import read_private

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
POLICIES = {
    "affinity": ["--prefill-policy", "round_robin", "--decode-policy", "manual", "--assignment-mode", "min_load"],
    "round_robin": ["--policy", "round_robin"],
}


class PreflightError(RuntimeError):
    """The deployment cannot be routed as asked; the message names the worker and the problem."""


class RouterNotReady(RuntimeError):
    """The router has not registered every given worker as healthy in time; the message names them."""


@dataclass(frozen=True)
class Worker:
    """One server as the preflight saw it."""

    url: str
    role: str
    model_path: str
    page_size: int
    transfer_backend: str


def read_api_key(path: str | os.PathLike) -> str:
    """The API key in `path` (one non-empty line without spaces). Raises PreflightError naming the path
    (never the content) when it is missing, unreadable, malformed, or readable by group or others."""
    p = Path(path)
    try:
        text, problem = read_private(p)
    except (OSError, UnicodeDecodeError) as exc:
        raise PreflightError(f"--api-key-file {p}: cannot be read ({type(exc).__name__})") from None
    if problem is not None:
        raise PreflightError(f"--api-key-file {p}: {problem}")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or any(c.isspace() for c in lines[0]):
        raise PreflightError(f"--api-key-file {p}: must hold exactly one key on one line, without spaces")
    if len(lines[0].encode("utf-8")) > router_child.MAX_KEY_BYTES:  # it reaches the router through a pipe
        raise PreflightError(f"--api-key-file {p}: key longer than {router_child.MAX_KEY_BYTES} bytes")
    return lines[0]


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header SGLang's --api-key (and sglang-router's) check: empty without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def probe(url: str, expected_role: str, timeout: float = 10, api_key: str | None = None) -> Worker:
    """Check one worker is up, runs sglang_pd and has `expected_role` (sending `api_key` if given)."""
    try:
        if requests.get(url + "/health", timeout=timeout).status_code != 200:
            raise PreflightError(f"{url}: /health did not answer 200")
        resp = requests.get(url + "/sglang_pd/info", headers=auth_headers(api_key), timeout=timeout)
    except requests.RequestException as exc:
        raise PreflightError(f"{url}: not reachable ({type(exc).__name__})") from None
    if resp.status_code == 401:
        raise PreflightError(f"{url}: /sglang_pd/info answered 401: the server runs with --api-key; "
                             + ("this --api-key-file holds another key" if api_key else "pass --api-key-file"))
    if resp.status_code != 200:
        raise PreflightError(f"{url}: no /sglang_pd/info (is the sglang_pd plugin installed there?)")
    info = resp.json()
    if info["role"] != expected_role:
        raise PreflightError(f"{url}: given as {expected_role} but the server runs as {info['role']}")
    return Worker(url, info["role"], info["model_path"], int(info["page_size"]), info["transfer_backend"])


def preflight(prefills: list[str], decodes: list[str], api_key: str | None = None) -> list[Worker]:
    """Probe every worker and check they agree on model, page size and transfer backend."""
    if not prefills or not decodes:
        raise PreflightError("need at least one --prefill and one --decode")
    workers = ([probe(u, "prefill", api_key=api_key) for u in prefills]
               + [probe(u, "decode", api_key=api_key) for u in decodes])
    for field in ("model_path", "page_size", "transfer_backend"):
        values = {getattr(w, field) for w in workers}
        if len(values) > 1:
            detail = ", ".join(f"{w.url}={getattr(w, field)}" for w in workers)
            raise PreflightError(f"workers disagree on {field}: {detail}")
    return workers


def unregistered(router_url: str, expected: list[str], timeout: float = 5, api_key: str | None = None) -> list[str]:
    """The `expected` worker URLs the router does not list as healthy on GET /workers (empty: all in)."""
    resp = requests.get(router_url + "/workers", headers=auth_headers(api_key), timeout=timeout)
    resp.raise_for_status()
    healthy = {w["url"].rstrip("/") for w in resp.json().get("workers", []) if w.get("is_healthy")}
    return [u for u in expected if u.rstrip("/") not in healthy]


def wait_registered(router_url: str, expected: list[str], timeout_s: float = 300, poll_s: float = 0.5,
                    keep_going=lambda: True, api_key: str | None = None) -> None:
    """Block until the router lists every `expected` worker as healthy; RouterNotReady names the missing
    ones after `timeout_s` (or when `keep_going()` turns false)."""
    deadline = time.monotonic() + timeout_s
    missing: list[str] = list(expected)
    while True:
        try:
            missing = unregistered(router_url, expected, api_key=api_key)
        except (requests.RequestException, ValueError):
            pass  # router not listening yet (or mid-start): keep polling
        if not missing:
            return
        if time.monotonic() > deadline or not keep_going():
            raise RouterNotReady(f"router {router_url} has not registered as healthy: {', '.join(missing)}")
        time.sleep(poll_s)


def _watch_readiness(router_url: str, expected: list[str], timeout_s: float, router_pid: int,
                     api_key: str | None = None) -> None:
    """Child body: report on stdout when the router (our parent, `router_pid`) has every worker."""
    try:
        wait_registered(router_url, expected, timeout_s, keep_going=lambda: os.getppid() == router_pid,
                        api_key=api_key)
        print(f"launch_router: ready: {router_url} routes to all {len(expected)} workers "
              f"(registered and healthy)", flush=True)
    except RouterNotReady as exc:
        if os.getppid() == router_pid:
            print(f"launch_router: WARNING: {exc}", file=sys.stderr, flush=True)


def router_argv(args: argparse.Namespace, key_fd: int | None = None) -> list[str]:
    """The router's command line for the checked deployment (sglang-router run by router_child). With a key,
    only `key_fd`, the pipe router_child reads it from (router_child.pass_key), is on it, never the key."""
    if args.api_key and key_fd is None:  # never start the router open when a key was given
        raise ValueError("a key was given: pass key_fd, the pipe holding it (router_child.pass_key)")
    argv = [sys.executable, "-m", "sglang_pd.router_child"]
    if key_fd is not None:
        argv += [router_child.KEY_FD_FLAG, str(key_fd)]  # must lead: router_child reads it there only
    argv += ["--pd-disaggregation", "--host", args.host, "--port", str(args.port)]
    for url, port in args.prefill:
        argv += ["--prefill", url, port or "none"]
    for url in args.decode:
        argv += ["--decode", url]
    if not any(a.split("=", 1)[0] == "--prometheus-host" for a in args.router_arg):
        argv += ["--prometheus-host", args.host]  # sglang-router's own default is 0.0.0.0
    return argv + POLICIES[args.policy] + list(args.router_arg)


def _prefill_arg(values: list[str]) -> tuple[str, str | None]:
    if len(values) not in (1, 2) or (len(values) == 2 and not values[1].isdigit()):
        raise argparse.ArgumentTypeError(f"--prefill takes URL [BOOTSTRAP_PORT], got {values}")
    return values[0].rstrip("/"), values[1] if len(values) == 2 else None


# sglang-router flags whose value is a credential: on the router's command line every local user would
# read it (`ps`, /proc/<pid>/cmdline). flag -> (its shortest abbreviation sglang-router's argparse takes,
# what to do instead). test_launch_router checks the abbreviations against sglang-router's own parser.
SECRET_ROUTER_FLAGS = {
    "--api-key": ("--ap", "use --api-key-file"),
    "--control-plane-api-keys": ("--control-plane-ap", "this launcher does not pass control-plane keys; "
                                 "use sglang-router's JWT flags (--jwt-issuer, --jwt-jwks-uri)"),
    "--oracle-password": ("--oracle-pa", "set ATP_PASSWORD in the launcher's environment instead"),
    "--postgres-db-url": ("--postgres-d", "set POSTGRES_DB_URL in the launcher's environment instead"),
    "--redis-url": ("--redis-u", "set REDIS_URL in the launcher's environment instead"),
}


def secret_flag(router_arg: str) -> str | None:
    """The credential flag of SECRET_ROUTER_FLAGS that `router_arg` names (whole, or abbreviated as
    sglang-router's argparse parser would take it), else None."""
    flag = router_arg.split("=", 1)[0]
    return next((name for name, (shortest, _) in SECRET_ROUTER_FLAGS.items()
                 if flag.startswith(shortest) and name.startswith(flag)), None)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefill", nargs="+", action="append", required=True, metavar="URL [BOOTSTRAP_PORT]")
    p.add_argument("--decode", action="append", required=True, metavar="URL")
    p.add_argument("--policy", choices=sorted(POLICIES), default="affinity")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--router-arg", action="append", default=[], help="extra sglang-router flag (repeatable)")
    p.add_argument("--check-only", action="store_true", help="run the preflight and exit")
    p.add_argument("--api-key-file", metavar="PATH",
                   help="file holding the key the servers run with (SGLang's --api-key): sent by the preflight, "
                        "given to the router (mode 600)")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds the readiness watcher waits for every worker to be registered (default 300)")
    args = p.parse_args(argv)
    try:
        args.prefill = [_prefill_arg(v) for v in args.prefill]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if not args.ready_timeout > 0:
        p.error(f"--ready-timeout must be > 0 seconds, got {args.ready_timeout}")
    for name in filter(None, map(secret_flag, args.router_arg)):
        p.error(f"--router-arg {name} would show its value to every local user (ps); {SECRET_ROUTER_FLAGS[name][1]}")
    args.decode = [u.rstrip("/") for u in args.decode]
    args.api_key = None  # read in main(), so a bad file is a preflight error naming it
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        args.api_key = read_api_key(args.api_key_file) if args.api_key_file else None
        workers = preflight([u for u, _ in args.prefill], args.decode, args.api_key)
    except PreflightError as exc:
        print(f"launch_router: {exc}", file=sys.stderr)
        return 2
    w = workers[0]
    print(f"launch_router: {len(workers)} workers agree: model={w.model_path} page_size={w.page_size} "
          f"backend={w.transfer_backend}; policy={args.policy} (header {ROUTING_KEY_HEADER})", flush=True)
    if args.check_only:
        return 0
    router_pid = os.getpid()
    if os.fork() == 0:  # the watcher; the router keeps our PID (whoever started us stops it by that PID)
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        code = 0
        try:
            _watch_readiness(f"http://{host}:{args.port}", [w.url for w in workers], args.ready_timeout,
                             router_pid, args.api_key)
        except BaseException:  # never let the watcher run on into the exec below
            code = 1
        finally:
            os._exit(code)
    # The key's pipe is made after the fork, so the watcher never holds it.
    argv = router_argv(args, router_child.pass_key(args.api_key) if args.api_key else None)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
