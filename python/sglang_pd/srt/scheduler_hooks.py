"""Hook that carries the scheduler's sglang_pd state to the HTTP process."""

from __future__ import annotations

from sglang_pd.process_state import STATE

INTERNAL_STATE_KEY = "sglang_pd"


def after_get_internal_state(result, scheduler, recv_req):
    """Add this scheduler's sglang_pd snapshot to SGLang's get_internal_state reply."""
    result.internal_state[INTERNAL_STATE_KEY] = STATE.snapshot()
    return result
