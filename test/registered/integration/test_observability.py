"""Decode-side hits made visible: per-request meta_info fields, /sglang_pd/stats counters and
Prometheus metrics on /metrics, each moving by exactly the expected amount over 3 turns."""

import json
import os
import random
import time

import pytest

from lock_checks import in_background
from sglang_pd.harness import PDDeployment
from sglang_pd.harness.server import descendants
from sglang_pd.models import VOCAB_SIZE, model_config
from sglang_pd.srt.mem_cache import kv_to_page_num, page_align_floor
from sglang_pd.srt.metrics.scrape_refresh import MIN_INTERVAL_S

pytestmark = pytest.mark.integration

COUNTERS = ("decode_prompt_tokens_total", "decode_prefix_hit_tokens_total", "decode_pages_saved_total",
            "kv_pages_transferred_total", "kv_bytes_transferred_total")


def _bytes_per_page(page_size: int) -> int:
    cfg = model_config("tiny")  # float32 K and V for every layer
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4 * page_size


def _metric(samples: dict, name: str, role: str) -> float:
    hits = [v for k, v in samples.items() if k.startswith(f"sglang_pd:{name}{{") and f'role="{role}"' in k]
    assert len(hits) == 1, (name, role, samples)
    return hits[0]


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in COUNTERS}


def test_three_turn_conversation_moves_every_counter_exactly(pd: PDDeployment):
    page, bpp = pd.config.page_size, _bytes_per_page(pd.config.page_size)
    dec, pre = pd.decodes[0], pd.prefill
    pd.wait_clean()
    stats0 = {s.name: pd.scheduler_state(s)["counters"] for s in (dec, pre)}
    prom0 = {s.name: pd.scrape_metrics(s) for s in (dec, pre)}
    rng = random.Random(300 + page)
    conv = [8] + [rng.randrange(3, VOCAB_SIZE) for _ in range(50)]
    expected = {k: 0 for k in COUNTERS}
    context = 0
    for turn in range(3):
        _, decoded, _ = pd.generate_pd(conv, 8)
        prefix = page_align_floor(context, page)
        pages = kv_to_page_num(len(conv) - prefix, page)
        meta = decoded["meta_info"]
        assert (meta["decode_prefix_len"], meta["decode_kv_pages_transferred"], meta["decode_kv_bytes_transferred"]) \
            == (prefix, pages, pages * bpp), f"turn {turn + 1}: {json.dumps(meta)}"
        expected["decode_prompt_tokens_total"] += len(conv)
        expected["decode_prefix_hit_tokens_total"] += prefix
        expected["decode_pages_saved_total"] += kv_to_page_num(len(conv), page) - pages
        expected["kv_pages_transferred_total"] += pages
        expected["kv_bytes_transferred_total"] += pages * bpp
        context = len(conv) + len(decoded["output_ids"])
        conv = conv + decoded["output_ids"] + [rng.randrange(3, VOCAB_SIZE) for _ in range(11)]
    assert expected["decode_prefix_hit_tokens_total"] > 0
    reports = pd.wait_clean()
    dec_delta = _delta(reports[dec.name]["counters"], stats0[dec.name])
    assert dec_delta == expected
    pre_delta = _delta(reports[pre.name]["counters"], stats0[pre.name])
    assert (pre_delta["kv_pages_transferred_total"], pre_delta["kv_bytes_transferred_total"]) == \
        (expected["kv_pages_transferred_total"], expected["kv_bytes_transferred_total"])
    prom1 = {s.name: pd.scrape_metrics(s) for s in (dec, pre)}
    for name in COUNTERS:
        got = _metric(prom1[dec.name], name, "decode") - _metric(prom0[dec.name], name, "decode")
        assert got == expected[name], name
    for name in ("kv_pages_transferred_total", "kv_bytes_transferred_total"):
        got = _metric(prom1[pre.name], name, "prefill") - _metric(prom0[pre.name], name, "prefill")
        assert got == expected[name], name
    assert _metric(prom1[dec.name], "tree_locks_outstanding", "decode") == 0
    assert reports[dec.name]["counters"]["integrity_failures_total"] == 0


def test_stats_endpoint_has_counters_tree_and_ledger(pd_page1: PDDeployment):
    state = pd_page1.scheduler_state(pd_page1.decodes[0])
    assert {"counters", "integrity", "lock_ledger", "decode_admission"} <= set(state)
    assert state["counters"]["role"] == "decode"
    assert {"evictable_tokens", "protected_tokens", "free_tokens", "total_tokens"} <= set(state["integrity"])
    assert {"num_outstanding", "num_locks", "num_releases", "num_double_releases"} <= set(state["lock_ledger"])


def test_metrics_are_true_at_scrape_without_any_stats_call(pd_page16: PDDeployment):
    """Only /metrics is read here: the lock gauge follows the ledger as locks come and go, and every
    scrape runs the integrity check whose counters it shows."""
    dep = pd_page16
    dec = dep.decodes[0]
    rng = random.Random(77)
    primed = [rng.randrange(3, VOCAB_SIZE) for _ in range(48)]
    dep.generate_pd(primed, 8)  # decode holds these 48 tokens: the request below locks them
    first = dep.scrape_metrics(dec)
    time.sleep(MIN_INTERVAL_S + 0.2)  # a scrape within the interval serves the last refresh's figures
    second = dep.scrape_metrics(dec)
    assert _metric(second, "integrity_checks_total", "decode") > _metric(first, "integrity_checks_total", "decode")
    assert _metric(second, "tree_locks_outstanding", "decode") == 0
    rid = f"scrape-{rng.randrange(1 << 30)}"
    job = in_background(dep.post_generate, dec.url, primed + [3, 4, 5], 8, rid=rid, **dep.pairing())
    deadline = time.monotonic() + 60
    while _metric(dep.scrape_metrics(dec), "tree_locks_outstanding", "decode") < 1:  # waits for KV, locked
        assert time.monotonic() < deadline, "the held lock never showed on /metrics"
        time.sleep(0.2)
    dep.abort(dec, rid)
    job["thread"].join(60)
    deadline = time.monotonic() + 60
    while _metric(dep.scrape_metrics(dec), "tree_locks_outstanding", "decode") != 0:
        assert time.monotonic() < deadline, "the released lock still shows on /metrics"
        time.sleep(0.2)
    assert _metric(dep.scrape_metrics(dec), "integrity_failures_total", "decode") == 0
    dep.wait_clean()


def test_prefill_waits_instead_of_spinning_while_its_request_is_in_flight(pd_page16: PDDeployment):
    """Prefill has the request in its bootstrap / inflight queue with nothing to compute while decode's
    transfer info and the transfer are under way: it sleeps SGLANG_PD_IDLE_WAIT_US (default 500 us), counted;
    fully idle, it never does (SGLang's own idle path). pd_page16 has no router: a router's health checks
    (/health generates a request on prefill) would make prefill busy in the idle window."""
    pd, pre = pd_page16, pd_page16.prefill
    pd.wait_clean()
    idle0 = pd.scheduler_state(pre)["counters"]
    time.sleep(1.0)
    idle1 = pd.scheduler_state(pre)["counters"]
    assert idle1["pd_idle_waits_total"] == idle0["pd_idle_waits_total"], "a fully idle scheduler waited"
    rng = random.Random(77)
    _, decoded, _ = pd.generate_pd([9] + [rng.randrange(3, VOCAB_SIZE) for _ in range(40)], 4)
    assert len(decoded["output_ids"]) == 4
    after = pd.wait_clean()[pre.name]["counters"]
    waits = after["pd_idle_waits_total"] - idle1["pd_idle_waits_total"]
    waited = after["pd_idle_wait_seconds_total"] - idle1["pd_idle_wait_seconds_total"]
    assert waits >= 1, "prefill spun (no counted wait) while its request was in flight"
    assert waited >= waits * 400e-6, (waits, waited)  # each wait really slept (~500 us)
    metrics = pd.scrape_metrics(pre)
    assert _metric(metrics, "pd_idle_waits_total", "prefill") == after["pd_idle_waits_total"]


def _proc_field(tid: int, key: str) -> str:
    """A field of /proc/<tid>/status (a thread id works as well as a process id)."""
    for line in open(f"/proc/{tid}/status"):
        if line.startswith(f"{key}:"):
            return line.split()[1]
    raise AssertionError(f"/proc/{tid}/status has no {key}")


def _kernel_nice(tid: int) -> int:
    stat = open(f"/proc/{tid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def test_prefill_transfer_workers_run_at_the_lower_priority_and_nothing_else_does(pd_page16: PDDeployment):
    """mooncake's transfer workers spin while their transfer runs: prefill starts each one at
    SGLANG_PD_TRANSFER_WORKER_NICE (default 19). Read from the kernel: every transfer worker SGLang
    started (as many as the thread watch found) runs at 19 inside prefill's scheduler process, whose
    main thread keeps nice 0; decode has no transfer worker and lowers nothing; a transfer still works."""
    pd, pre, dec = pd_page16, pd_page16.prefill, pd_page16.decodes[0]
    rng = random.Random(78)
    _, decoded, _ = pd.generate_pd([9] + [rng.randrange(3, VOCAB_SIZE) for _ in range(40)], 4)
    assert len(decoded["output_ids"]) == 4
    states = pd.wait_clean()
    prio, workers = states[pre.name]["transfer_worker_priority"], states[pre.name]["handshake"]["threads"]
    assert prio["nice"] == 19 and prio["errors"] == []
    assert len(prio["threads"]) == workers["by_role"]["transfer_worker"] >= 1, (prio, workers)
    scheduler_pids = {int(_proc_field(t["tid"], "Tgid")) for t in prio["threads"]}
    assert len(scheduler_pids) == 1
    (scheduler_pid,) = scheduler_pids
    assert scheduler_pid != pre.proc.pid and scheduler_pid in {e.pid for e in descendants(pre.proc.pid)}
    for thread in prio["threads"]:
        assert thread["nice"] == 19 and _kernel_nice(thread["tid"]) == 19, thread
    assert _kernel_nice(scheduler_pid) == 0  # the scheduler's own thread is not lowered
    assert states[pre.name]["counters"]["pd_transfer_workers_lowered_total"] == len(prio["threads"])
    assert states[dec.name]["transfer_worker_priority"]["threads"] == []
    assert _metric(pd.scrape_metrics(pre), "pd_transfer_workers_lowered_total", "prefill") == len(prio["threads"])


def _threads(pid: int) -> dict[int, str]:
    """Thread id -> name (comm) of process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        except OSError:
            continue  # ended meanwhile
    return out


def _children(pid: int) -> dict[str, int]:
    """Process name -> pid of every process below server `pid`: SGLang's scheduler and detokenizer (children of
    the forkserver on CPU, of the server itself under spawn), the forkserver and resource tracker ("python")."""
    return {entry.comm: entry.pid for entry in descendants(pid)}


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


def test_helper_threads_run_sched_batch_and_the_scheduler_thread_does_not(pd_page16: PDDeployment,
                                                                          pd_page1: PDDeployment):
    """SGLANG_PD_HELPER_THREADS_BATCH=1 (pd_page16 sets it), read from the kernel in both PD servers: every thread of
    the HTTP and detokenizer processes at SCHED_BATCH, the scheduler thread at SCHED_OTHER, its ZMQ I/O
    threads and (prefill) its transfer workers at SCHED_BATCH, as the scheduler's own record says; a plain
    (aggregated) server and the page-1 pair (setting unset: off) keep every thread at SCHED_OTHER; a request is
    served afterwards."""
    pd = pd_page16
    rng = random.Random(79)
    for _ in range(2):  # the first may start per-peer helpers; the sweep (<= 1/s, at a step) sees them in the second
        _, decoded, _ = pd.generate_pd([9] + [rng.randrange(3, VOCAB_SIZE) for _ in range(40)], 4)
        assert len(decoded["output_ids"]) == 4
        time.sleep(1.2)
    states = pd.wait_clean()
    for server in (pd.prefill, pd.decodes[0]):
        kids = _children(server.proc.pid)
        scheduler = next(pid for name, pid in kids.items() if name.startswith("sglang::schedul"))
        detokenizer = next(pid for name, pid in kids.items() if name.startswith("sglang::detoken"))
        http, detok, sched = _threads(server.proc.pid), _threads(detokenizer), _threads(scheduler)
        assert len(http) > 1 and detok and len(sched) > 1, (server.name, http, detok, sched)
        assert {t: _policy(t) for t in http} == {t: os.SCHED_BATCH for t in http}, server.name
        assert {t: _policy(t) for t in detok} == {t: os.SCHED_BATCH for t in detok}, server.name
        assert _policy(scheduler) == os.SCHED_OTHER, server.name  # the thread that runs steps
        zmq = [t for t, name in sched.items() if name.startswith("ZMQbg/")]
        assert zmq and all(_policy(t) == os.SCHED_BATCH for t in zmq), (server.name, {t: sched[t] for t in zmq})
        record = states[server.name]["helper_threads"]
        assert record["enabled"] and record["scope"] == "scheduler" and record["errors"] == [], record
        assert record["step_tid"] == scheduler and record["step_policy"] == "other", record
        assert record["num_batched"] > len(zmq), record  # Python helpers too
        assert states[server.name]["counters"]["pd_helper_threads_batched_total"] == record["num_batched"]
        role = "prefill" if server is pd.prefill else "decode"
        # /metrics sums the processes that export: the scheduler, and the HTTP process once it exports (its first
        # bootstrap count: an impostor test earlier in the session may have caused one on prefill)
        http_process = pd.get_json(server.url, "/sglang_pd/stats", headers=pd.headers)["http_process"]
        from_http = http_process["counters"]["pd_helper_threads_batched_total"] if http_process["metrics_exported"] else 0
        assert _metric(pd.scrape_metrics(server), "pd_helper_threads_batched_total", role) == \
            record["num_batched"] + from_http, (server.name, record["num_batched"], http_process["metrics_exported"])
    for thread in states[pd.prefill.name]["transfer_worker_priority"]["threads"]:
        assert _policy(thread["tid"]) == os.SCHED_BATCH, thread
    for server in (pd_page1.plain, pd_page1.prefill, pd_page1.decodes[0]):
        tids = [t for pid in (server.proc.pid, *(e.pid for e in descendants(server.proc.pid))) for t in _threads(pid)]
        assert len(tids) > 3 and all(_policy(t) == os.SCHED_OTHER for t in tids), server.name
    assert pd_page1.scheduler_state(pd_page1.decodes[0])["helper_threads"]["num_batched"] == 0
