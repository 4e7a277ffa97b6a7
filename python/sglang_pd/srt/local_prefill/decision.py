"""The decode-local prefill decision: does decode compute this request's uncached prompt tail itself?

Taken on decode after admission matched, locked and preallocated the request, and before its transfer
info reaches prefill (with SGLang's defaults prefill computes nothing until that info arrives):
num_uncached = prompt_len - decode_prefix_len. The request is served locally when
0 < num_uncached <= `threshold`, unless it needs what only prefill's half returns or what the local
extend does not run; it then goes to prefill as before, with a `LocalFallback` (counted by the queue).
Threshold 0 is off: nothing is decided, nothing counted, every request takes the PD path.

Balance (`balance_tokens` > threshold; 0 = off): a request past the threshold but within `balance_tokens`
is also served locally when decode would finish it first: its tokens plus those already queued for local
extends (`local_backlog`) do not exceed the uncached tokens decode is still waiting for from prefill
(`prefill_backlog`: requests whose transfer info went out and whose KV has not arrived). Prefill's
backlog is work prefill has ahead of this request, so a burst of arrivals is split between the two
servers instead of queueing at prefill; when prefill has no backlog, only the threshold applies, so the
longer extends (and their cost to running requests' ITL) happen only while prefill is the bottleneck.

Pure: reads the request (duck-typed: SGLang's `Req` or any object with its attributes), mutates nothing,
imports nothing of SGLang.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from sglang_pd.srt.mem_cache import RequestKind
from sglang_pd.srt.metrics import recorded_decode_prefix_len


class LocalFallback(str, enum.Enum):
    """Why a request within the threshold still goes to prefill (counter local_prefill_fallback_<value>_total)."""

    INPUT_LOGPROBS = "input_logprobs"            # prompt logprobs: only prefill's half returns them
    FULL_PREFIX_HIT = "full_prefix_hit"          # nothing to extend: the first token needs the last prompt position
    UNSUPPORTED_REQUEST = "unsupported_request"  # grammar, multimodal, embeddings, LoRA, hidden states...
    DECLINE_UNSENT = "decline_unsent"            # prefill could not be told to drop the room: it computes it
    DUPLICATE_RID = "duplicate_rid"              # another live local request has this rid (records are per rid)


class LocalDecision(NamedTuple):
    """What decode does with one request."""

    local: bool
    num_uncached: int
    fallback: LocalFallback | None  # set when the request was within the threshold but goes to prefill
    detail: str = ""                 # which unsupported feature, or why a duplicate rid, for the log
    balanced: bool = False           # within reach only through the balance rule (past the threshold)


UNSUPPORTED = (  # request attribute set (truthy) -> the feature the local extend does not run
    ("grammar", "structured output (grammar)"), ("multimodal_inputs", "multimodal input"),
    ("input_embeds", "input embeddings"), ("positional_embed_overrides", "positional embedding overrides"),
    ("lora_id", "LoRA adapter"), ("return_hidden_states", "hidden states"),
    ("return_sampling_mask", "sampling mask"), ("session", "session"),
)


def unsupported_feature(req: Any) -> str | None:
    """The first feature `req` asks for that the local extend does not run (None: none)."""
    return next((what for attr, what in UNSUPPORTED if getattr(req, attr, None)), None)


def wants_input_logprobs(req: Any) -> bool:
    """Prompt logprobs asked for: only prefill's half returns them (decode holds the prefix, not its logits)."""
    return bool(req.return_logprob) and 0 <= req.logprob_start_len < len(req.origin_input_ids)


def within_reach(threshold: int, num_uncached: int, balance_tokens: int = 0, prefill_backlog: int = 0,
                 local_backlog: int = 0) -> tuple[bool, bool]:
    """(within reach, only through the balance rule) for `num_uncached` tokens (pure; see the module)."""
    if num_uncached <= threshold:
        return True, False
    balanced = num_uncached <= balance_tokens and local_backlog + num_uncached <= prefill_backlog
    return balanced, balanced


def uncached_awaited(reqs: Any) -> int:
    """Prefill's backlog as decode sees it: the uncached prompt tokens of `reqs` (the requests whose transfer
    info went to prefill and whose KV has not arrived), each its prompt minus the `decode_prefix_len` the
    hand-off recorded in `customized_info` (the whole prompt when none was recorded)."""
    return sum(max(0, len(req.origin_input_ids) - recorded_decode_prefix_len(req)) for req in reqs)


def decide(threshold: int, req: Any, decode_prefix_len: int, *, kind: RequestKind = RequestKind.NORMAL,
           is_rebootstrap: bool = False, rid_is_live: bool = False, balance_tokens: int = 0,
           prefill_backlog: int = 0, local_backlog: int = 0) -> LocalDecision:
    """Local or PD for one admitted request. Only NORMAL requests on their first bootstrap are considered
    (warmup and health checks move no real KV; a rebootstrap is SGLang's recompute on prefill).
    `rid_is_live`: another request under `req.rid` is local here now (the queue keeps records per rid).
    `balance_tokens`, `prefill_backlog`, `local_backlog`: the balance rule (module docstring)."""
    num_uncached = len(req.origin_input_ids) - decode_prefix_len
    reach, balanced = within_reach(threshold, num_uncached, balance_tokens, prefill_backlog, local_backlog)
    if kind is not RequestKind.NORMAL or is_rebootstrap or threshold <= 0 or not reach:
        return LocalDecision(False, num_uncached, None)
    if num_uncached <= 0:
        return LocalDecision(False, num_uncached, LocalFallback.FULL_PREFIX_HIT)
    if wants_input_logprobs(req):
        return LocalDecision(False, num_uncached, LocalFallback.INPUT_LOGPROBS, balanced=balanced)
    feature = unsupported_feature(req)
    if feature:
        return LocalDecision(False, num_uncached, LocalFallback.UNSUPPORTED_REQUEST, feature, balanced=balanced)
    if rid_is_live:
        return LocalDecision(False, num_uncached, LocalFallback.DUPLICATE_RID,
                             "another request under this rid is local here", balanced=balanced)
    return LocalDecision(True, num_uncached, None, balanced=balanced)
