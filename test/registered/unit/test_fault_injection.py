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


def _pool(layers=2, slots=32, heads=2, dim=4):
    """SGLang's MHA KV pool on CPU (fp32), filled with distinct values."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=slots, page_size=1, dtype=torch.float32, head_num=heads, head_dim=dim,
                            layer_num=layers, device="cpu", enable_memory_saver=False)
    for i in range(layers):
        pool.get_key_buffer(i).copy_(torch.randn(pool.get_key_buffer(i).shape))
        pool.get_value_buffer(i).copy_(torch.randn(pool.get_value_buffer(i).shape))
    return pool


def test_read_kv_round_trips_and_noise_overwrites_exactly_the_slots():
    import torch

    from sglang_pd.srt.fault_injection import decode_kv, overwrite_with_noise, read_kv

    pool = _pool()
    slots = torch.tensor([3, 4, 9])
    before = decode_kv(read_kv(pool, slots))
    assert before.shape == (2, 2, 3, 2, 4)
    assert torch.equal(before[1, 0], pool.get_key_buffer(1)[slots]) and torch.equal(before[0, 1], pool.get_value_buffer(0)[slots])
    others = decode_kv(read_kv(pool, torch.tensor([0, 5, 31])))
    overwrite_with_noise(pool, slots, seed=1)
    after = decode_kv(read_kv(pool, slots))
    assert (after - before).abs().min() > 0, "every value of every layer overwritten"
    assert torch.equal(decode_kv(read_kv(pool, torch.tensor([0, 5, 31]))), others), "nothing else touched"


def test_kv_probes_keep_the_newest_and_show_in_the_snapshot():
    from sglang_pd.srt.fault_injection import MAX_PROBES

    plan = FaultPlan(enabled=True)
    for room in range(MAX_PROBES + 3):
        plan.keep_probe(room, {"shape": [room]})
    assert list(plan.snapshot()["kv_probes"]) == [str(r) for r in range(3, MAX_PROBES + 3)]
