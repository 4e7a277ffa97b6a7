"""Hook on SGLang's `CommonKVBootstrapServer` (disaggregation/common/conn.py, prefill's HTTP process):
its routes authenticated and checked before SGLang's handlers store anything. The guard itself is
srt/http/bootstrap_middleware.py; the client side is srt/hooks/connection/requests_sessions.py."""

from __future__ import annotations

from sglang_pd.srt.auth import this_host_names
from sglang_pd.srt.http import bootstrap_middleware, names_this_server
from sglang_pd.srt.state import current, mode_name


def after_setup_routes(result, server):
    """Put authentication and request checks in front of the bootstrap server's routes."""
    def sizes() -> dict:
        return {"attn_tp_size": server.attn_tp_size, "attn_cp_size": server.attn_cp_size,
                "pp_size": server.pp_size, "dp_size": server.dp_size}

    def registered_at(slot):
        dp_group, cp_rank, tp_rank, pp_rank = slot
        info = server.prefill_port_table.get(dp_group, {}).get(cp_rank, {}).get(tp_rank, {}).get(pp_rank)
        return None if info is None else (info.rank_ip, info.rank_port)

    names = this_host_names(server.host)
    port = int(server.port)

    def is_me(receiver: str) -> bool:
        return names_this_server(receiver, port, names)

    server.app.middlewares.append(bootstrap_middleware(current().peer_guard, sizes, _count_http, registered_at,
                                                       is_me))
    return result


def _count_http(name: str) -> None:
    """Count in this (HTTP) process, exporting to /metrics once SGLang's metrics are known to be on."""
    state = current()
    if not state.counters.bound:
        try:
            from sglang.srt.entrypoints.http_server import get_global_state
            from sglang.srt.runtime_context import get_disagg

            args = get_global_state().tokenizer_manager.server_args
            if args.enable_metrics:
                # the resolved values, as the schedulers label theirs (scheduler.after_init_disaggregation):
                # the raw argument can be "mooncake_tcp", which SGLang resolves to mooncake
                disagg = get_disagg()
                state.counters.bind(mode_name(disagg.disaggregation_mode),
                                    mode_name(disagg.disaggregation_transfer_backend))
        except Exception:  # a bootstrap server outside SGLang's HTTP server (benchmark): count only
            state.hook_failed("bootstrap_metrics_bind", "bootstrap guard counts without Prometheus")
    state.counters.add(name, 1)
