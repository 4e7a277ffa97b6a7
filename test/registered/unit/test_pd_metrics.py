"""PDCounters: the one source of every counter; Prometheus twins; docs/observability.md lists every metric."""

from pathlib import Path

import pytest

from sglang_pd.srt.metrics.pd_metrics import LABELLED_COUNTERS, METRICS, PREFIX, PDCounters, markdown_table

pytestmark = pytest.mark.unit


def test_counts_gauges_and_refusals():
    counters = PDCounters()
    counters.add("decode_replans_total")
    counters.add("kv_pages_transferred_total", 5)
    counters.set("tree_locks_outstanding", 3)
    assert counters.get("decode_replans_total") == 1 and counters.get("kv_pages_transferred_total") == 5
    assert counters.snapshot()["tree_locks_outstanding"] == 3
    with pytest.raises(ValueError, match="cannot decrease"):
        counters.add("decode_replans_total", -1)
    with pytest.raises(KeyError):
        counters.add("no_such_metric_total")
    with pytest.raises(KeyError):
        counters.set("no_such_gauge", 1)


def test_labelled_counter_per_hook():
    counters = PDCounters()
    counters.add_labelled("hook_errors_total", "unlock")
    counters.add_labelled("hook_errors_total", "unlock")
    counters.add_labelled("hook_errors_total", "lock")
    assert counters.snapshot()["hook_errors_total"] == {"unlock": 2, "lock": 1}
    with pytest.raises(ValueError):
        counters.add_labelled("hook_errors_total", "lock", -1)


def test_bound_metrics_carry_the_values_counted_before_binding():
    from prometheus_client import REGISTRY, generate_latest

    counters = PDCounters()
    counters.add("admission_rounds_total", 2)
    counters.set("admission_round_max_size", 7)
    counters.bind("decode", "unit-test-backend")
    counters.add("admission_rounds_total")
    counters.add_labelled("hook_errors_total", "lock")
    text = generate_latest(REGISTRY).decode()
    labels = 'role="decode",transfer_backend="unit-test-backend"'
    assert f"{PREFIX}admission_rounds_total{{{labels}}} 3.0" in text
    assert f"{PREFIX}admission_round_max_size{{{labels}}} 7.0" in text
    assert f'{PREFIX}hook_errors_total{{hook="lock",{labels}}} 1.0' in text


def test_observability_page_lists_every_metric_as_declared():
    """docs/observability.md's table is `python -m sglang_pd.srt.metrics.pd_metrics` output, row for row."""
    page = (Path(__file__).parents[3] / "docs" / "observability.md").read_text()
    assert markdown_table() in page
    assert all(f"`{PREFIX}{name}`" in markdown_table() for name in [*METRICS, *LABELLED_COUNTERS])
