"""Figures read from the servers around a benchmark run, as deltas over the run.

Two sources, kept apart so a figure is never filled from the other one:
- SGLang's own Prometheus metrics (`sglang:*` on /metrics): there with or without sglang_pd, so these
  compare a plugin-less deployment (`on-upstream`) with ours. Among them SGLang's per-stage request
  latencies: where a request's time went on each server, by SGLang's own timestamps.
- sglang_pd's counters (`/sglang_pd/stats`): only where the plugin is active; None elsewhere.
"""

from __future__ import annotations

import requests

from sglang_pd.bench.report import local_breakdown, summarize
from sglang_pd.bench.slo import SloTargets, slo_figures
from sglang_pd.harness import PDDeployment
from sglang_pd.harness.upstream_state import LatencyTotal, metric_totals, stage_latencies

# summary key -> (server role, SGLang metric)
UPSTREAM = {
    "sglang_kv_transfer_mb": ("prefill", "sglang:kv_transfer_total_mb_sum"),
    "sglang_kv_transfers": ("prefill", "sglang:kv_transfer_total_mb_count"),
    "sglang_transfer_failed": ("prefill", "sglang:num_transfer_failed_reqs_total"),
    "sglang_retracted_requests": ("decode", "sglang:num_retracted_requests_total"),
    "sglang_eviction_passes": ("decode", "sglang:eviction_duration_seconds_count"),
    "sglang_evicted_tokens": ("decode", "sglang:evicted_tokens_total"),
    # decode's tokenizer manager: request received -> first token received back from the scheduler
    # (SGLang's TTFT histogram; a PD prefill server never observes it)
    "sglang_decode_ttft_sum_s": ("decode", "sglang:time_to_first_token_seconds_sum"),
    "sglang_decode_ttft_count": ("decode", "sglang:time_to_first_token_seconds_count"),
}
# sglang_pd decode counters (PDCounters names) reported per run
PLUGIN_DECODE = ("decode_retractions_total", "resume_requests_total", "resume_backup_tokens_total",
                 "resume_restored_tokens_total", "admission_rounds_total", "admission_round_evictions_total",
                 "evicted_tokens_total", "kv_digests_checked_total", "kv_digest_seconds_total")
# sglang_pd prefill counters reported per run: how often a request's clear found prefill's bootstrap thread
# handling a message (and waited for it; see handshake/sockets.py)
PLUGIN_PREFILL = ("prefill_sender_clears_total", "clears_waited_for_bootstrap_total",
                  "clear_bootstrap_wait_timeouts_total",
                  "room_pops_waited_for_bootstrap_total", "room_pop_bootstrap_wait_timeouts_total",
                  "kv_digests_sent_total", "kv_digest_seconds_total")


def stage_deltas(before: dict[str, LatencyTotal], after: dict[str, LatencyTotal]) -> dict[str, dict]:
    """Per stage observed between two `stage_latencies` snapshots: how many requests passed it and their
    mean time in it (ms). Pure; a stage no request passed in between is left out."""
    out = {}
    for stage, total in after.items():
        prior = before.get(stage, LatencyTotal(0.0, 0.0))
        count = total.count - prior.count
        if count < 0:
            raise ValueError(f"stage {stage}: count went down ({prior.count} -> {total.count}): not one server")
        if count:
            out[stage] = {"count": int(count), "mean_ms": round(1000 * (total.sum_s - prior.sum_s) / count, 3)}
    return out


def plugin_active(url: str) -> bool:
    """True when the server runs sglang_pd (it answers GET /sglang_pd/info)."""
    return requests.get(url + "/sglang_pd/info", timeout=30).status_code == 200


def _counters(url: str) -> dict:
    return PDDeployment.get_json(url, "/sglang_pd/stats")["schedulers"][0]["counters"]


def digest_cost(summary: dict) -> dict:
    """SGLANG_PD_KV_DIGEST's cost in a run: digest time per checked request, prefill's and decode's together
    (ms), and that as a share of the run's TTFT p50; empty when no request was checked."""
    decode, prefill = summary.get("sglang_pd_counters") or {}, summary.get("sglang_pd_prefill_counters") or {}
    checked = decode.get("kv_digests_checked_total", 0)
    if not checked:
        return {}
    ms = 1000 * (decode["kv_digest_seconds_total"] + prefill.get("kv_digest_seconds_total", 0.0)) / checked
    ttft = summary.get("ttft_p50_s")
    return {"kv_digest_ms_per_request": round(ms, 3),
            "kv_digest_share_of_ttft_p50": round(ms / 1000 / ttft, 5) if ttft else None}


class ServerFigures:
    """Snapshots of one PD pair's figures; `delta()` gives what a run added."""

    def __init__(self, prefill_url: str, decode_url: str):
        self.urls = {"prefill": prefill_url, "decode": decode_url}
        self.plugin = plugin_active(prefill_url)

    def snapshot(self) -> dict:
        """Current values: SGLang's metrics, and sglang_pd's counters when the plugin is active."""
        by_role = {role: metric_totals(url, tuple(m for r, m in UPSTREAM.values() if r == role))
                   for role, url in self.urls.items()}
        snap = {"upstream": {key: by_role[role][metric] for key, (role, metric) in UPSTREAM.items()},
                "stages": {role: stage_latencies(url) for role, url in self.urls.items()}}
        if self.plugin:
            prefill, decode = _counters(self.urls["prefill"]), _counters(self.urls["decode"])
            snap["transfer"] = {"pages": prefill["kv_pages_transferred_total"],
                                "bytes": prefill["kv_bytes_transferred_total"],
                                "computed_tokens": prefill["prefill_computed_tokens_total"],
                                "declined": prefill["prefill_declined_requests_total"],
                                "declined_computed_tokens": prefill["prefill_declined_computed_tokens_total"]}
            snap["plugin"] = {name: decode[name] for name in PLUGIN_DECODE}
            snap["plugin_prefill"] = {name: prefill[name] for name in PLUGIN_PREFILL}
        return snap

    def delta(self, before: dict, after: dict) -> dict:
        """Summary fields for the run between two snapshots (sglang_pd's are None without the plugin)."""
        fields = {key: after["upstream"][key] - before["upstream"][key] for key in UPSTREAM}
        fields["sglang_stage_latency"] = {role: stage_deltas(before["stages"][role], after["stages"][role])
                                          for role in self.urls}
        fields["sglang_pd_counters"] = ({k: after["plugin"][k] - before["plugin"][k] for k in PLUGIN_DECODE}
                                        if self.plugin else None)
        fields["sglang_pd_prefill_counters"] = ({k: after["plugin_prefill"][k] - before["plugin_prefill"][k]
                                                 for k in PLUGIN_PREFILL} if self.plugin else None)
        return fields

    def transfer(self, before: dict, after: dict) -> dict | None:
        """Prefill's counters over the run (sglang_pd's record): KV pages and bytes handed to the transport,
        prompt tokens its model computed, halves decode declined and the tokens computed for them; None
        without the plugin."""
        if not self.plugin:
            return None
        return {k: after["transfer"][k] - before["transfer"][k] for k in after["transfer"]}

    def summarize_run(self, records: list, duration_s: float, before: dict, slo: SloTargets | None = None,
                      client_cpu_s: float | None = None) -> dict:
        """A run's summary: the client's figures of `records` (report.summarize), what the servers added
        since the `before` snapshot (taken now, after the run), the SLO scoring when targets are set, and
        decode's sglang_pd state where the plugin runs (admission SLO, shared attention, the local
        requests' breakdown, matched by the pd_client rid `pd-<room>`)."""
        after = self.snapshot()
        summary = summarize(records, duration_s, self.transfer(before, after))
        summary.update(self.delta(before, after), sglang_pd=self.plugin, client_cpu_s=client_cpu_s)
        if slo is not None and (slo.ttft_s or slo.itl_s):
            summary.update(slo_figures([r.result for r in records], duration_s, slo))
        decode_state = (PDDeployment.get_json(self.urls["decode"], "/sglang_pd/stats")["schedulers"][0]
                        if self.plugin else {})
        summary["decode_slo"] = decode_state.get("slo")
        summary["decode_shared_attention"] = decode_state.get("shared_attention")
        ttft_by_rid = {f"pd-{r.result.room}": r.result.ttft_s for r in records if r.result.ok}
        summary["decode_local_prefill"] = local_breakdown(decode_state.get("local_prefill"), ttft_by_rid)
        summary.update(digest_cost(summary))
        return summary
