"""The `on-upstream` side of the benchmark without SGLang servers: configuration parsing, figures a
plugin-less run cannot have (n/a, never 0), the idle check read from SGLang's /v1/loads shape, and
the record of a configuration whose servers did not start."""

import os
import sys
import time

import pytest

from sglang_pd.bench.multiturn_workload import RequestRecord
from sglang_pd.bench.pd_client import StreamResult
from sglang_pd.bench.report import NOT_EXPOSED, format_table, summarize
from sglang_pd.bench.slo import parse_configs
from sglang_pd.bench.start_failure import StartFailure
from sglang_pd.harness import DeploymentConfig, ServerProcess, ServerStartError
from sglang_pd.harness.deployment import NO_PLUGINS_ENV
from sglang_pd.harness.server import free_port
from sglang_pd.harness.upstream_state import busy_counts, leak_warnings

pytestmark = pytest.mark.unit


def test_on_upstream_is_the_radix_flag_without_the_plugin_and_takes_no_plugin_setting():
    off, upstream, on = parse_configs("off,on-upstream,on", None, None)
    assert (off.decode_radix, off.plugin) == (False, True)
    assert (upstream.name, upstream.decode_radix, upstream.plugin, upstream.env) == ("on-upstream", True, False, ())
    assert (on.decode_radix, on.plugin) == (True, True)
    with pytest.raises(ValueError, match="sglang_pd settings"):
        parse_configs("on-upstream+itl", 40, None)
    assert NO_PLUGINS_ENV == ("SGLANG_PLUGINS", "none")
    with pytest.raises(ValueError, match="fault_injection"):
        DeploymentConfig(plugin=False, fault_injection=True)
    with pytest.raises(ValueError, match="registered by sglang_pd"):
        DeploymentConfig(plugin=False, decode_attention_backend="sglang_pd_shared_prefix")
    with pytest.raises(ValueError, match="sglang_pd settings"):
        parse_configs("on-upstream+shared", None, None)


def _rec(rnd, ttft, meta):
    return RequestRecord(0, rnd, StreamResult(ok=True, prompt_len=100, output_ids=[1, 2], ttft_s=ttft,
                                              itl_s=[0.01], meta_info=meta))


def _server_fields(mb, passes):
    return {"sglang_kv_transfer_mb": mb, "sglang_retracted_requests": 0, "sglang_eviction_passes": passes,
            "sglang_evicted_tokens": 10 * passes}


def test_plugin_less_run_reads_n_a_where_only_sglang_pd_has_the_figure():
    upstream = summarize([_rec(0, 2.0, {}), _rec(1, 1.0, {"cached_tokens": 90})], 2.0, None)
    assert upstream["decode_hit_rate"] is None and upstream["decode_hit_tokens"] is None
    assert upstream["kv_pages_transferred"] is None and upstream["per_round"][2]["hit_rate"] is None
    on = summarize([_rec(0, 1.0, {"decode_prefix_len": 0}), _rec(1, 0.5, {"decode_prefix_len": 90})], 2.0,
                   {"pages": 110, "bytes": 440})
    off = summarize([_rec(0, 2.0, {"decode_prefix_len": 0}), _rec(1, 2.0, {"decode_prefix_len": 0})], 2.0,
                    {"pages": 200, "bytes": 800})
    upstream.update(_server_fields(4.0, 3), sglang_pd_counters=None)
    on.update(_server_fields(2.0, 1), sglang_pd_counters={"admission_rounds_total": 5})
    off.update(_server_fields(8.0, 0), sglang_pd_counters={"admission_rounds_total": 0})
    table = format_table({"off": off, "on-upstream": upstream, "on": on})
    assert "| metric | off | on-upstream | on | gain (on vs off) | gain (on-upstream vs off) | gain (on vs on-upstream) |" in table
    assert "| decode hit rate | 0.000 | n/a | 0.450 |" in table
    assert "| KV pages transferred | 200 | n/a | 110 | 1.82x |  |  |" in table
    assert "| KV MB sent (SGLang kv_transfer_total_mb) | 8.0 | 4.0 | 2.0 | 4.00x | 2.00x | 2.00x |" in table
    assert "| admission rounds (sglang_pd) | 0 | n/a | 5 |" in table
    assert NOT_EXPOSED in table


_LOAD = {"num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0, "max_total_num_tokens": 4096,
         "disaggregation": {"prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
                            "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0,
                            "decode_retracted_queue_reqs": 0},
         "queues": {"waiting": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}}


def test_upstream_idle_means_no_request_and_no_held_token_and_no_leak_line(tmp_path):
    assert busy_counts(_LOAD) == {}
    held = dict(_LOAD, num_used_tokens=768, disaggregation=dict(_LOAD["disaggregation"], decode_transfer_queue_reqs=1))
    assert busy_counts(held) == {"num_used_tokens": 768, "disaggregation.decode_transfer_queue_reqs": 1}
    log = tmp_path / "decode0.log"
    log.write_text("[2026] INFO ok\n[2026] WARNING pool memory leak detected! [full] total=4096, available=10\n")
    assert leak_warnings(log) == ["[2026] WARNING pool memory leak detected! [full] total=4096, available=10"]
    assert leak_warnings(tmp_path / "absent.log") == []


def test_start_failure_records_the_server_and_its_error_line(tmp_path):
    script = ("import sys; print('loading'); print('E1123 17:50:14.839467   12321 ucx_utils.cpp:674] VRAM "
              "registration cannot proceed.'); print('nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND', "
              "file=sys.stderr); raise SystemExit(1)")
    server = ServerProcess("decode0", [sys.executable, "-c", script], dict(os.environ), free_port(), tmp_path)
    server.start()
    with pytest.raises(ServerStartError) as exc:
        server.wait_healthy(time.monotonic() + 30)
    server.stop()
    failure = StartFailure.from_servers("on-upstream", [server], tmp_path, exc.value)
    assert failure.error.startswith("decode0 exited with 1")
    assert failure.servers[0].exit_code == 1
    assert failure.servers[0].error_lines == [
        "E1123 17:50:14.839467   12321 ucx_utils.cpp:674] VRAM registration cannot proceed.",
        "nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND"]
    assert "decode0 (exit code 1): nixl._bindings.nixlBackendError: NIXL_ERR_BACKEND" in failure.describe()
    failure.write_log(tmp_path / "failure.log")
    assert "==== decode0: last 60 log lines ====\n$ " in (tmp_path / "failure.log").read_text()
    assert failure.as_dict()["servers"][0]["name"] == "decode0"
