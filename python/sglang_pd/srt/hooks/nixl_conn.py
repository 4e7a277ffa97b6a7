"""Hook on sglang.srt.disaggregation.nixl.conn: a NIXL registration NIXL itself refuses is dropped, not fatal.

The gate checks a registration's frames, but the agent metadata blob is NIXL's to parse:
`add_remote_agent` raises on a bad blob (and upstream has already stored the peer by then), and a
blob naming another agent than the frame leaves a peer no transfer can reach. Either way the peer
is forgotten, the refusal counted and logged, and prefill's bootstrap thread keeps running.
"""

from __future__ import annotations

import logging

from sglang_pd.process_state import STATE

logger = logging.getLogger(__name__)


def around_add_remote_peer(original, mgr, decode_kv_args):
    """Register a NIXL peer; on failure forget it (counted) instead of ending the bootstrap thread."""
    name = decode_kv_args.agent_name
    known = name in mgr.decode_kv_args_table
    try:
        original(mgr, decode_kv_args)
        if known or mgr.agent.check_remote_metadata(name):
            return None
        problem = "its agent metadata names another agent"
    except Exception as exc:  # NIXL's own parse of a peer-supplied blob
        problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    if not known:
        mgr.decode_kv_args_table.pop(name, None)
    STATE.counters.add("handshake_messages_rejected_total", 1)
    gate = STATE.peer_guard.gate
    if gate is not None:
        gate.count_external_rejection("registration")
    logger.warning("sglang_pd: NIXL registration of agent %r (%s:%s) refused: %s", name,
                   decode_kv_args.endpoint, decode_kv_args.dst_port, problem)
    return None
