"""Hooks on SGLang's `TokenizerManager` (HTTP process): our meta_info fields as plain numbers; a
prompt's token ids checked against the vocabulary (http/request_checks.py) and, on a PD server, its pairing
fields (http/pairing_checks.py); a PD server's HTTP process runs
its threads without wake-up preemption (helper_threads.py)."""

from __future__ import annotations

from sglang_pd.srt.http import check_pairing
from sglang_pd.srt.http import (check_input_ids, check_logprob_start_len, check_sampling_limits,
                                                       check_top_logprobs_num)
from sglang_pd.srt.metrics import unwrap_request_fields
from sglang_pd.srt.state import current


def is_pd_server(server_args) -> bool:
    """True for a prefill or decode server (read-only)."""
    return str(getattr(server_args, "disaggregation_mode", "null")) in ("prefill", "decode")


def after_init(result, manager, server_args, port_args, *, start_pd_bootstrap_service=True):
    """SGLang has started the schedulers and detokenizer by now (they do not inherit this): a PD server's
    HTTP process moves every thread to SCHED_BATCH; the threads it starts later inherit it."""
    if is_pd_server(server_args):
        current().helper_threads.apply_to_process()
    return result


def after_update_request_meta_info(result, manager, meta_info, state, customized_info, index, finish_reason):
    """Unwrap our fields from SGLang's accumulated one-element lists into plain numbers."""
    unwrap_request_fields(meta_info)
    return result


def after_validate_one_request(result, manager, obj, input_ids):
    """After SGLang's own checks: an id outside the vocabulary, a top_logprobs_num above it, a
    logprob_start_len below -1, a stop token id outside the vocabulary or a top_k / min_new_tokens above
    int32, or (PD server)
    a malformed bootstrap room, host or port is refused here (ValueError: HTTP 400 naming it) instead of
    ending the scheduler; so is, on a decode with a peer secret, a bootstrap address it does not sign for."""
    vocab_size = manager.model_config.vocab_size
    if input_ids is not None:
        check_input_ids(input_ids, vocab_size)
    check_top_logprobs_num(getattr(obj, "top_logprobs_num", None), vocab_size)
    check_logprob_start_len(getattr(obj, "logprob_start_len", None))
    check_sampling_limits(getattr(obj, "sampling_params", None), vocab_size)
    if is_pd_server(manager.server_args):
        mode = str(manager.server_args.disaggregation_mode)
        host, port = getattr(obj, "bootstrap_host", None), getattr(obj, "bootstrap_port", None)
        check_pairing(mode, getattr(obj, "bootstrap_room", None), host, port)
        guard = current().peer_guard
        problem = guard.bootstrap_addresses.request_problem(
            mode, guard.auth is not None, host, port, manager.server_args.disaggregation_bootstrap_port)
        if problem is not None:
            raise ValueError(problem)
    return result
