"""Hook on SGLang's `MooncakeKVManager` (disaggregation/mooncake/conn.py): bootstrap messages checked first."""

from __future__ import annotations

from sglang_pd.srt.disaggregation.transfer_info_guard import MOONCAKE
from sglang_pd.srt.hooks.common_conn import guard_bootstrap_message


def around_handle_abort_notification(original, mgr, msg):
    """Drop (and fail the room of) a malformed mooncake transfer-info message before upstream parses it."""
    return guard_bootstrap_message(original, mgr, msg, MOONCAKE)
