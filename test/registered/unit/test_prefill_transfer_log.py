"""PrefillTransferLog: per-room records, totals counted once in PDCounters, bounded memory."""

import pytest

from sglang_pd.srt.transfer import PrefillTransferLog
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def test_records_plan_and_sent_pages():
    counters = PDCounters()
    log = PrefillTransferLog(counters)
    entry = log.record_bootstrap(room=7, rid="a", prompt_len=58, page_size=16, decode_prefix_len=48)
    assert entry.num_pages_planned == 1
    log.record_pages_sent(7, 1, 4096)
    log.record_pages_sent(99, 3, 3 * 4096)  # a room we never saw bootstrap for
    snap = log.snapshot()
    assert snap["rooms"]["7"]["num_pages_sent"] == 1
    assert (snap["num_pages_sent"], snap["num_pages_sent_unknown_room"]) == (4, 3)
    assert (snap["num_prompt_tokens"], snap["num_decode_prefix_tokens"]) == (58, 48)
    # one source: the metrics view and the stats view are the same numbers
    assert counters.get("kv_pages_transferred_total") == 4 and counters.get("kv_bytes_transferred_total") == 4 * 4096


def test_bounded_oldest_dropped_first():
    log = PrefillTransferLog(PDCounters(), max_rooms=2)
    for room in (1, 2, 3):
        log.record_bootstrap(room, str(room), 10, 1, 0)
    assert log.get(1) is None and log.get(3) is not None
    assert log.snapshot()["num_requests"] == 3


def test_rejects_bad_values():
    with pytest.raises(ValueError):
        PrefillTransferLog(PDCounters(), max_rooms=0)
    with pytest.raises(ValueError):
        PrefillTransferLog(PDCounters()).record_pages_sent(1, -1, 0)
