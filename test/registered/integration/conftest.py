"""Session-wide real deployments: started on first use, shared by every integration test, stopped
by PID at the end of the session.

`pd_page1`: prefill + decode (radix on) + plain server + router, page size 1 (mooncake_tcp).
`pd_page16`: prefill + decode (radix on), page size 16 (mooncake_tcp).
`pd_nixl`: prefill + decode (radix on), page size 16, NIXL over host memory.
All compare against `pd_page1`'s plain server (greedy output does not depend on page size/backend).
"""

import json
import os
import platform
from pathlib import Path

import pytest

from sglang_pd.config import Settings
from sglang_pd.harness import DeploymentConfig, PDDeployment

LOG_ROOT = Settings.from_env().test_logs or Path("/tmp/sglang_pd-test-logs")
# Tests that measure a README figure also write it as <name>.json into this folder when it is set
# (README prints the command, e.g. TEST_FIGURES_DIR=docs/figures pytest ... -k ...). Not SGLANG_PD_*:
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

_ENV = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
        ("SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", str(SESSION_PROBE_S)))


@pytest.fixture(scope="session")
def pd_page1() -> PDDeployment:
    return _deployment("page1", DeploymentConfig(page_size=1, with_plain=True, with_router=True,
                                                 fault_injection=True, log_dir=LOG_ROOT / "page1",
                                                 env_overrides=_ENV))


@pytest.fixture(scope="session")
def pd_page16() -> PDDeployment:
    return _deployment("page16", DeploymentConfig(page_size=16, fault_injection=True,
                                                  log_dir=LOG_ROOT / "page16", env_overrides=_ENV))


# NIXL stall bound for tests (default 60 s): an injected stall then fails within the test's patience.
NIXL_STALL_S = 8


@pytest.fixture(scope="session")
def pd_nixl() -> PDDeployment:
    env = _ENV + (("SGLANG_PD_NIXL_STALL_TIMEOUT_S", str(NIXL_STALL_S)),)
    return _deployment("nixl", DeploymentConfig(page_size=16, transfer_backend="nixl", fault_injection=True,
                                                log_dir=LOG_ROOT / "nixl", env_overrides=env))


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
