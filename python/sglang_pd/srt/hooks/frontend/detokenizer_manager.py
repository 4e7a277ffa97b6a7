"""Hook on SGLang's `DetokenizerManager` (detokenizer process): a PD server's detokenizer runs its
threads without wake-up preemption (srt/threads/helper_threads.py)."""

from __future__ import annotations

from sglang_pd.srt.hooks.frontend.tokenizer_manager import is_pd_server
from sglang_pd.srt.state import current


def after_init(result, manager, server_args, port_args):
    """Every thread of a PD server's detokenizer (its loop and ZMQ threads) to SCHED_BATCH."""
    if is_pd_server(server_args):
        current().helper_threads.apply_to_process()
    return result
