"""NIXL stall bound below upstream's 5 s settle window: the stalled transfer is cancelled before the
room is failed (never a failure while a write may still land) and decode is told within the bound.
The bound above 5 s is the session NIXL deployment's (test_pd_correctness.py)."""

import pytest

from conftest import LOG_ROOT, WAITING_TIMEOUT_S
from sglang_pd.harness import DeploymentConfig, PDDeployment
from test_pd_correctness import assert_stall_cancelled_and_decode_told

pytestmark = pytest.mark.integration

STALL_S = 3


@pytest.fixture(scope="module")
def pd_nixl_short_stall():
    env = (("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAITING_TIMEOUT_S)),
           ("SGLANG_PD_NIXL_STALL_TIMEOUT_S", str(STALL_S)))
    with PDDeployment(DeploymentConfig(page_size=16, transfer_backend="nixl", fault_injection=True,
                                       log_dir=LOG_ROOT / "nixl_short_stall", env_overrides=env)) as dep:
        yield dep


def test_short_stall_bound_cancels_then_fails(pd_nixl_short_stall: PDDeployment, plain_url: str):
    assert_stall_cancelled_and_decode_told(pd_nixl_short_stall, plain_url, STALL_S)
