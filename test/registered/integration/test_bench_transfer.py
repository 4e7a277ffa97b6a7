"""`python -m sglang_pd.bench_transfer --quick`: NIXL (UCX, DRAM), Mooncake TCP and the in-process copy
all move the same scattered KV pages between two real processes on 127.0.0.1, every transfer verified."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

BACKENDS = ("copy", "nixl", "nixl+coalesce", "mooncake_tcp")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_transfer") / "result.json"
    proc = subprocess.run([sys.executable, "-m", "sglang_pd.bench_transfer", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout, json.loads(out.read_text())


def test_every_backend_moved_verified_bytes(quick_run):
    stdout, doc = quick_run
    assert doc["skipped"] == []                   # nixl and mooncake are both installed here
    rows = {row["backend"]: row for row in doc["rows"]}
    assert set(rows) == set(BACKENDS), rows.keys()
    for name, row in rows.items():
        assert row["bytes_moved"] > 0 and row["gbps"] > 0 and row["seconds"] > 0, row
        assert row["verified"] is True, row
        assert row["ratio_to_copy"] > 0, row
        assert name in stdout                     # and it is in the printed table
    assert rows["copy"]["ratio_to_copy"] == pytest.approx(1.0)


def test_rows_describe_the_same_case(quick_run):
    _, doc = quick_run
    rows = {row["backend"]: row for row in doc["rows"]}
    geom = doc["geometry"]
    (page_size,), (tokens,) = doc["settings"]["page_sizes"], doc["settings"]["tokens"]
    expected = tokens * geom["kv_heads"] * geom["head_dim"] * 4 * geom["num_buffers"]   # tokens % page_size == 0
    for row in rows.values():
        assert (row["page_size"], row["tokens"], row["bytes_moved"]) == (page_size, tokens, expected)
    pages = tokens // page_size
    assert rows["nixl"]["descriptors"] == rows["mooncake_tcp"]["descriptors"] == pages * geom["num_buffers"]
    # runs of 1..8 adjacent pages: coalescing must cut descriptors (same bytes, fewer, larger descriptors)
    assert rows["nixl+coalesce"]["descriptors"] < rows["nixl"]["descriptors"]
    assert rows["nixl+coalesce"]["descriptors"] % geom["num_buffers"] == 0
