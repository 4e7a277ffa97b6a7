"""FaultPlan: counted and room-targeted faults, refusal when disabled, unknown names."""

import pytest

from sglang_pd.srt.fault_injection import Fault, FaultPlan

pytestmark = pytest.mark.unit


def test_counted_and_targeted_faults():
    plan = FaultPlan(enabled=True)
    rest = plan.arm_from_keys({"sglang_pd_fault_prefix_exceeds": 2, "sglang_pd_fault_transfer_fail_room": 77,
                               "pp_max_micro_batch_size": 4})
    assert rest == {"pp_max_micro_batch_size": 4}
    assert not plan.take(Fault.TRANSFER_FAIL, room=5), "a room-targeted fault fires for its room only"
    assert plan.take(Fault.TRANSFER_FAIL, room=77) and not plan.take(Fault.TRANSFER_FAIL, room=77)
    assert [plan.take(Fault.PREFIX_EXCEEDS, room=1) for _ in range(3)] == [True, True, False]
    assert plan.snapshot()["fired"] == {"transfer_fail": 1, "prefix_exceeds": 2}


def test_refused_when_disabled_or_unknown():
    with pytest.raises(ValueError, match="fault injection is disabled"):
        FaultPlan(enabled=False).arm_from_keys({"sglang_pd_fault_transfer_fail": 1})
    assert FaultPlan(enabled=False).arm_from_keys({"pp_max_micro_batch_size": 4}) == {"pp_max_micro_batch_size": 4}
    with pytest.raises(ValueError, match="unknown fault 'explode'"):
        FaultPlan(enabled=True).arm_from_keys({"sglang_pd_fault_explode": 1})
    with pytest.raises(ValueError, match="must be >= 0"):
        FaultPlan(enabled=True).arm(Fault.TRANSFER_FAIL, -1)
