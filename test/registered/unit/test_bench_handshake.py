"""The handshake benchmark runs end to end on small counts and reports both modes side by side."""

import json

import pytest

from sglang_pd.bench_handshake import main

pytestmark = pytest.mark.unit


def test_bench_handshake_small(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--num-messages", "50", "--num-http", "10", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    for kind in ("registration", "transfer_info", "status"):
        assert results["zmq"][kind]["off"]["num"] == results["zmq"][kind]["on"]["num"] == 50
        assert results["zmq"][kind]["on"]["median_us"] > 0 and results["primitives"][kind]["verify_us"] > 0
    assert results["http_get_route"]["on"]["num"] == 10
    assert set(results["per_request_us"]) == {"off", "on", "added_us"}
    assert "per PD request (transfer info + status)" in capsys.readouterr().out
