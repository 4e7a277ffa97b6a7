"""descriptor_batches: only batches over the limit are split, in order, nothing lost."""

import pytest

from sglang_pd.srt.transfer import descriptor_batches

pytestmark = pytest.mark.unit


def test_split_only_over_the_limit_in_order():
    blocks = list(range(1030))
    parts = descriptor_batches(blocks, 512)
    assert [len(p) for p in parts] == [512, 512, 6] and [b for p in parts for b in p] == blocks
    small = list(range(512))
    assert descriptor_batches(small, 512) == [small]
    assert descriptor_batches([], 512) == [[]]
    with pytest.raises(ValueError, match="max_per_batch must be >= 1"):
        descriptor_batches(blocks, 0)


def test_setting_is_declared_and_validated():
    from sglang_pd.config import Settings, SettingsError

    assert Settings.from_env({}).mooncake_max_batch_descriptors == 512
    assert Settings.from_env({"SGLANG_PD_MOONCAKE_MAX_BATCH_DESCRIPTORS": "64"}).mooncake_max_batch_descriptors == 64
    with pytest.raises(SettingsError, match="must be a whole number >= 1"):
        Settings.from_env({"SGLANG_PD_MOONCAKE_MAX_BATCH_DESCRIPTORS": "0"})
