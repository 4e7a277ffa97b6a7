"""Session-wide real deployments: started on first use, shared by every integration test, stopped
by PID at the end of the session.

`pd_page1`: prefill + decode (radix on) + plain server + router, page size 1 (mooncake_tcp); peers
           NOT authenticated (no SGLANG_PD_PEER_SECRET_FILE: upstream's behaviour plus our frame checks).
`pd_page16`: prefill + decode (radix on), page size 16 (mooncake_tcp), peers authenticated.
`pd_nixl`: prefill + decode (radix on), page size 16, NIXL over host memory, peers authenticated.
All compare against `pd_page1`'s plain server (greedy output does not depend on page size/backend).
Every test on pd_page16 / pd_nixl therefore also runs the whole PD handshake signed and verified.
"""

import json
import os
import platform
import secrets
from pathlib import Path

import pytest

from sglang_pd.config import Settings
from sglang_pd.harness import DeploymentConfig, PDDeployment
from sglang_pd.harness.test_logs import session_log_root, write_private_file

# This session's own folder (server logs, the test peer secret) unless SGLANG_PD_TEST_LOGS names one:
# two test runs on one box never share it (harness/test_logs.py).
LOG_ROOT = session_log_root(Settings.from_env().test_logs)

# Tests that measure a docs figure also write it as <name>.json into this folder when it is set
# (the docs pages print the command, e.g. TEST_FIGURES_DIR=docs/results/figures pytest ... -k ...). Not SGLANG_PD_*:
# the servers inherit the environment, and the plugin refuses unknown names under its prefix.
FIGURES_DIR_ENV = "TEST_FIGURES_DIR"


def record_figures(name: str, figures: dict) -> None:
    """Write `figures` (what the test printed) to $TEST_FIGURES_DIR/<name>.json; no-op when unset."""
    folder = os.environ.get(FIGURES_DIR_ENV)
    if not folder:
        return
    path = Path(folder) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    machine = f"{platform.machine()} {os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}"
    path.write_text(json.dumps({"test": test, "machine": machine, "figures": figures}, indent=2) + "\n")

# Decode gives up on a transfer that never starts after this long (default 300 s): the timeout path
# is then testable in-session. Normal requests here finish in about a second.
WAITING_TIMEOUT_S = 30

_started: dict[str, PDDeployment] = {}
_secret_written: list[Path] = []
initial_states: dict[str, dict] = {}


def _deployment(name: str, config: DeploymentConfig) -> PDDeployment:
    if name not in _started:
        dep = PDDeployment(config).start()
        _started[name] = dep
        # Before any test request: what warmup left behind (it must leave the tree empty).
        initial_states[name] = dep.wait_clean()
    return _started[name]


# Mooncake blacklists a decode session after one failed transfer and probes it again every 30 s by
# default; the prefill-side transport failure test needs the pair serving again within seconds.
SESSION_PROBE_S = 2

# Transfer infos of a room no prefill request claims are dropped after this long; the same as decode's
# own patience, so no test's legitimately late prefill half can lose its room.
_ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
        ("SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", str(SESSION_PROBE_S)),
        ("SGLANG_PD_UNCLAIMED_ROOM_TTL_S", str(WAITING_TIMEOUT_S)))


def peer_secret_file() -> Path:
    """The shared secret of the authenticated deployments (fresh per session, mode 0600)."""
    path = LOG_ROOT / "peer_secret"
    if not _secret_written:
        LOG_ROOT.mkdir(parents=True, exist_ok=True)
        write_private_file(path, secrets.token_hex(32) + "\n")
        _secret_written.append(path)
    return path


def _auth_env() -> tuple[tuple[str, str], ...]:
    return (("SGLANG_PD_PEER_SECRET_FILE", str(peer_secret_file())),)


@pytest.fixture(scope="session")
def pd_page1() -> PDDeployment:
    return _deployment("page1", DeploymentConfig(page_size=1, with_plain=True, with_router=True,
                                                 fault_injection=True, log_dir=LOG_ROOT / "page1",
                                                 env_overrides=_ENV))


@pytest.fixture(scope="session")
def pd_page16() -> PDDeployment:
    """Also runs with SGLANG_PD_HELPER_THREADS_BATCH=1 (opt-in; test_observability checks it from the kernel)."""
    return _deployment("page16", DeploymentConfig(page_size=16, fault_injection=True, log_dir=LOG_ROOT / "page16",
                                                  env_overrides=_ENV + _auth_env()
                                                  + (("SGLANG_PD_HELPER_THREADS_BATCH", "1"),)))


# NIXL stall bound for tests (default 60 s): an injected stall then fails within the test's patience.
NIXL_STALL_S = 8


@pytest.fixture(scope="session")
def pd_nixl() -> PDDeployment:
    env = _ENV + _auth_env() + (("SGLANG_PD_NIXL_STALL_TIMEOUT_S", str(NIXL_STALL_S)),)
    return _deployment("nixl", DeploymentConfig(page_size=16, transfer_backend="nixl", fault_injection=True,
                                                log_dir=LOG_ROOT / "nixl", env_overrides=env))


# The CURVE + short-TTL pair, per transfer backend: test_curve_pair.py (CURVE on every rank socket) and
# test_unclaimed_room.py (rooms no request claims) both run on it, one start per backend instead of two.
# Neither concern changes the other's path: the room bookkeeping under test sits behind the socket layer
# CURVE encrypts, and the curve tests' requests finish in about a second, far inside the TTL and timeouts.
UNCLAIMED_ROOM_TTL_TEST_S = 3
PAIR_WAITING_TIMEOUT_S = 300    # decode's own patience, SGLang's default: far longer than the TTL
PAIR_BOOTSTRAP_TIMEOUT_S = 10   # prefill's patience for decode's transfer info (SGLang's default 300 s)
CURVE_TTL_FIXTURE = "pd_curve_ttl"


@pytest.fixture(scope="session", params=["nixl", "mooncake_tcp"])
def pd_curve_ttl(request) -> PDDeployment:
    """Stopped when the tests move to the other backend, or after the last test using it
    (pytest_runtest_teardown below), never kept for the rest of the session."""
    env = (("SGLANG_PD_UNCLAIMED_ROOM_TTL_S", str(UNCLAIMED_ROOM_TTL_TEST_S)),
           ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(PAIR_WAITING_TIMEOUT_S)),
           ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", str(PAIR_BOOTSTRAP_TIMEOUT_S)),
           ("SGLANG_PD_PEER_CURVE", "1")) + _auth_env()
    config = DeploymentConfig(page_size=16, transfer_backend=request.param, env_overrides=env,
                              fault_injection=True,  # the unclaimed-room abort tests hold their room in prefill
                              log_dir=LOG_ROOT / f"curve_ttl_{request.param}")
    deployment = PDDeployment(config)
    _stop_after_last_use.append(deployment)
    try:
        deployment.start()
        deployment.wait_clean()
        yield deployment
    finally:
        if deployment in _stop_after_last_use:  # not yet stopped after its last test
            _stop_after_last_use.remove(deployment)
            deployment.stop()


_stop_after_last_use: list[PDDeployment] = []
_last_curve_ttl_item: list = []


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by session parameters
def pytest_collection_modifyitems(session, config, items):
    """The tests on pd_curve_ttl run one after another, by backend (pytest groups a session fixture's params),
    and the pair stops after the last of them (pytest_runtest_teardown)."""
    users = [item for item in items if CURVE_TTL_FIXTURE in getattr(item, "fixturenames", ())]
    if not users:
        return
    first = items.index(users[0])
    rest = [item for item in items if item not in users]
    items[:] = rest[:first] + users + rest[first:]
    _last_curve_ttl_item[:] = [users[-1]]


def pytest_runtest_teardown(item, nextitem):
    if _last_curve_ttl_item and item is _last_curve_ttl_item[0]:
        while _stop_after_last_use:
            _stop_after_last_use.pop().stop()


@pytest.fixture(params=[1, 16], ids=["page1", "page16"])
def pd(request) -> PDDeployment:
    """Each PD deployment in turn (parametrized over page size)."""
    return request.getfixturevalue(f"pd_page{request.param}")


@pytest.fixture(scope="session")
def plain_url(pd_page1) -> str:
    return pd_page1.plain.url


def pytest_sessionfinish(session, exitstatus):
    for dep in _started.values():
        dep.stop()
    _started.clear()


def pytest_terminal_summary(terminalreporter):
    """How many outputs were compared (harness/equality.assert_same), how many differed only past a greedy
    tie (passed, counted), and the largest logprob difference among those compared."""
    from sglang_pd.harness.equality import LOGPROB_TOL, TALLY

    terminalreporter.write_line(f"equality checks: {TALLY.num_compared} outputs compared, {TALLY.num_tie_flips} "
                                f"greedy tie flips, max |d logprob| {TALLY.max_logprob_diff:.2e} "
                                f"(tolerance {LOGPROB_TOL:g})")
    record_figures("equality_checks", {"num_compared": TALLY.num_compared, "num_tie_flips": TALLY.num_tie_flips,
                                       "max_logprob_diff": TALLY.max_logprob_diff, "tolerance": LOGPROB_TOL})
