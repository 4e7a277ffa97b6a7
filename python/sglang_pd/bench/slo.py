"""SLO side of the multi-turn benchmark: configurations to compare, SLO attainment, goodput, plots.

A configuration name is `off` or `on` (decode radix cache, sglang_pd active) optionally followed by
`+itl` (decode admission under SGLANG_PD_ITL_TARGET_MS), `+reject` (early rejection under
SGLANG_PD_TTFT_TARGET_MS), `+shared` (attention backend sglang_pd_shared_prefix instead of
torch_native on both servers: shared-prefix decode on decode, extends with only their new queries on prefill),
`+shared-decode` (that backend on decode only, prefill keeps torch_native),
`+digest` (SGLANG_PD_KV_DIGEST=1: transferred KV checked against prefill's digest; no secret needed to measure it)
and `+local` (decode-local prefill under SGLANG_PD_LOCAL_PREFILL_TOKENS), e.g.
`off,on,on+itl+reject,on+shared,on+local+shared`; or `on-upstream`: upstream's
`--disaggregation-decode-enable-radix-cache` with the sglang_pd plugin not loaded, and `off-upstream`: the
same pair with the flag off (no +features: they are the plugin's). A request meets the SLO when it
completed, its TTFT <= the TTFT target and its mean inter-token gap (TPOT) <= the ITL target; a
refused request (503) never does. Goodput = requests meeting the SLO per second of the run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sglang_pd.bench.report import pyplot
from sglang_pd.config import ITL_TARGET_MS as ITL_ENV, KV_DIGEST as DIGEST_ENV, LOCAL_PREFILL_TOKENS as LOCAL_ENV
from sglang_pd.config import LOCAL_PREFILL_BALANCE_TOKENS as BALANCE_ENV
from sglang_pd.config import TTFT_TARGET_MS as TTFT_ENV

_FEATURES = ("itl", "reject", "shared", "shared-decode", "local", "digest")
SHARED_BACKEND = "sglang_pd_shared_prefix"  # srt/hooks/attention_backend.BACKEND_NAME (a unit test ties them)
# base name -> (decode radix cache on, sglang_pd plugin loaded)
_BASES = {"off": (False, True), "on": (True, True), "on-upstream": (True, False), "off-upstream": (False, False)}


@dataclass(frozen=True)
class BenchConfig:
    """One server configuration of a benchmark run."""

    name: str
    decode_radix: bool
    env: tuple[tuple[str, str], ...] = ()
    plugin: bool = True  # False: the servers run SGLang without sglang_pd (upstream alone)
    decode_attention_backend: str = "torch_native"
    prefill_attention_backend: str = "torch_native"


@dataclass(frozen=True)
class SloTargets:
    """What a request must meet (seconds); None = not scored on it."""

    ttft_s: float | None
    itl_s: float | None

    def describe(self) -> str:
        """E.g. 'TTFT <= 3000 ms and ITL <= 40 ms'."""
        parts = [f"{label} <= {value * 1000:.0f} ms" for label, value in (("TTFT", self.ttft_s), ("ITL", self.itl_s))
                 if value is not None]
        return " and ".join(parts) or "no SLO"


def parse_configs(text: str, itl_target_ms: float | None, ttft_target_ms: float | None,
                  local_prefill_tokens: int | None = None, local_balance_tokens: int = 0) -> list[BenchConfig]:
    """Configurations from `off,on,on-upstream,on+itl,...`; raises ValueError naming what is wrong or missing.
    `local_balance_tokens` > 0: +local configurations also run decode-local prefill's balance rule."""
    configs = []
    for name in [n.strip() for n in text.split(",") if n.strip()]:
        base, *features = name.split("+")
        if base not in _BASES or any(f not in _FEATURES for f in features):
            raise ValueError(f"unknown configuration {name!r}: use off|on|on-upstream|off-upstream, then optional +itl, "
                             "+reject, +shared, +shared-decode, +local, +digest")
        decode_radix, plugin = _BASES[base]
        if features and not plugin:
            raise ValueError(f"configuration {name!r}: +itl, +reject, +shared and +local are sglang_pd "
                             f"settings; {base} runs without the plugin")
        env = []
        if "itl" in features:
            if itl_target_ms is None:
                raise ValueError(f"configuration {name!r} needs --itl-target-ms")
            env.append((ITL_ENV, f"{itl_target_ms:g}"))
        if "reject" in features:
            if ttft_target_ms is None:
                raise ValueError(f"configuration {name!r} needs --ttft-target-ms")
            env.append((TTFT_ENV, f"{ttft_target_ms:g}"))
        if "local" in features:
            if base != "on" or not local_prefill_tokens:
                raise ValueError(f"configuration {name!r} needs the decode radix cache (on) and "
                                 "--local-prefill-tokens > 0")
            env.append((LOCAL_ENV, str(local_prefill_tokens)))
            if local_balance_tokens:
                env.append((BALANCE_ENV, str(local_balance_tokens)))
        if "digest" in features:
            env.append((DIGEST_ENV, "1"))
        if "shared" in features and "shared-decode" in features:
            raise ValueError(f"configuration {name!r}: +shared already puts the backend on decode; "
                             "use +shared or +shared-decode")
        decode_backend = SHARED_BACKEND if {"shared", "shared-decode"} & set(features) else "torch_native"
        prefill_backend = SHARED_BACKEND if "shared" in features else "torch_native"
        configs.append(BenchConfig(name, decode_radix, tuple(env), plugin=plugin,
                                   decode_attention_backend=decode_backend, prefill_attention_backend=prefill_backend))
    if not configs:
        raise ValueError("no configuration given")
    return configs


def meets_slo(result, targets: SloTargets) -> bool:
    """True when a StreamResult completed within both targets."""
    if not result.ok:
        return False
    if targets.ttft_s is not None and result.ttft_s > targets.ttft_s:
        return False
    tpot = statistics.fmean(result.itl_s) if result.itl_s else 0.0
    return targets.itl_s is None or tpot <= targets.itl_s


def slo_figures(results: list, duration_s: float, targets: SloTargets) -> dict:
    """SLO attainment (share of all requests, refused ones included) and goodput (req/s)."""
    met = sum(meets_slo(r, targets) for r in results)
    return {"slo_attainment": met / len(results) if results else 0.0,
            "goodput": met / duration_s if duration_s else 0.0,
            "rejected": sum(bool(r.rejected) for r in results), "slo": targets.describe()}


def plot_slo(results: dict[str, dict], path: str) -> None:
    """PNG: SLO attainment and goodput per configuration."""
    plt = pyplot()
    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, [results[n]["slo_attainment"] for n in names])
    ax2.bar(names, [results[n]["goodput"] for n in names])
    slo = next(iter(results.values()))["slo"] if results else ""
    ax1.set(title=f"SLO attainment ({slo})", ylabel="share of requests", ylim=(0, 1))
    ax2.set(title="goodput", ylabel="requests meeting the SLO per s")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_pareto(points: list[tuple[str, float, float]], path: str) -> None:
    """PNG: TTFT p50 vs ITL p50, one labelled point per (label, ttft_p50_s, itl_p50_ms)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    tuned = [(lbl, t, i) for lbl, t, i in points if lbl.startswith("itl")]
    if tuned:
        ax.plot([i for _, _, i in tuned], [t for _, t, _ in tuned], "o-", label="radix ON + ITL target")
    for label, ttft, itl in points:
        ax.annotate(label, (itl, ttft), textcoords="offset points", xytext=(5, 5), fontsize=8)
        if not label.startswith("itl"):
            ax.plot([itl], [ttft], "s", label=label)
    ax.set(title="TTFT p50 vs ITL p50 (lower-left is better)", xlabel="ITL p50 (ms)", ylabel="TTFT p50 (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
