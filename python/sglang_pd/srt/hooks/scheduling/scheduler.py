"""Hooks on SGLang's `Scheduler` (managers/scheduler.py): metrics labels, state export, faults, step timing,
and the scheduler-wide parts of decode-local prefill (start-up check, idleness, in-flight batches, client
aborts)."""

from __future__ import annotations

import logging
import time

from sglang_pd.srt.fault_injection import Fault
from sglang_pd.srt.hooks.scheduling.decode_scheduler import release_local
from sglang_pd.srt.hooks.scheduling.takeover import owns_decode_queue
from sglang_pd.srt.mem_cache import request_kv_len as kv_len
from sglang_pd.srt.mem_cache import check_integrity
from sglang_pd.srt.state import INTERNAL_STATE_KEY, current, mode_name

logger = logging.getLogger(__name__)


def run_integrity_check(scheduler) -> None:
    """Check tree/allocator/ledger invariants now (scheduler thread) and keep the report."""
    tree = getattr(scheduler, "tree_cache", None)
    if tree is None or getattr(tree, "disable", True):
        return
    state = current()
    state.record_integrity(check_integrity(tree, scheduler.token_to_kv_pool_allocator, state.lock_ledger,
                                           idle=scheduler.is_fully_idle()))


_MAX_LISTED = 64


def queue_rids(scheduler) -> dict[str, list[str]]:
    """The request ids in each of SGLang's queues of this scheduler (first 64 each; read-only).

    Decode: prealloc -> transfer -> waiting -> running, and retracted; prefill: bootstrap -> waiting
    -> running -> inflight (sending KV)."""
    running = scheduler.running_batch.reqs if scheduler.running_batch is not None else []
    queues = {"waiting": scheduler.waiting_queue, "running": running}
    prealloc = scheduler.disagg_decode_prealloc_queue
    if prealloc is not None:
        queues.update(prealloc=prealloc.queue, retracted=prealloc.retracted_queue,
                      transfer=scheduler.disagg_decode_transfer_queue.queue)
    if scheduler.disagg_prefill_bootstrap_queue is not None:
        queues.update(bootstrap=scheduler.disagg_prefill_bootstrap_queue.queue,
                      inflight=scheduler.disagg_prefill_inflight_queue or [])
    return {name: [str(getattr(item, "req", item).rid) for item in list(items)[:_MAX_LISTED]]
            for name, items in queues.items()}


def after_get_internal_state(result, scheduler, recv_req):
    """Add this scheduler's sglang_pd snapshot (with a fresh integrity check and its queues) to the reply."""
    state = current()
    try:
        run_integrity_check(scheduler)
        result.internal_state[INTERNAL_STATE_KEY] = dict(state.snapshot(), queues=queue_rids(scheduler))
    except Exception as exc:  # observability must never take the scheduler down
        state.hook_failed("get_internal_state", "state snapshot failed")
        result.internal_state[INTERNAL_STATE_KEY] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def around_set_internal_state(original, scheduler, recv_req):
    """Take sglang_pd fault keys out of a set_internal_state request; pass the rest to SGLang."""
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    try:
        remaining = current().faults.arm_from_keys(dict(recv_req.server_args))
    except ValueError as exc:
        logger.warning("sglang_pd: %s", exc)
        return SetInternalStateReqOutput(updated=False)
    if len(remaining) == len(recv_req.server_args):
        return original(scheduler, recv_req)
    if not remaining:
        return SetInternalStateReqOutput(updated=True)
    recv_req.server_args = remaining
    return original(scheduler, recv_req)


def after_init_disaggregation(result, scheduler):
    """Label this scheduler's metrics with its role and backend; export them if metrics are on."""
    from sglang.srt.runtime_context import get_observability

    state = current()
    role = mode_name(scheduler.disaggregation_mode)
    backend = mode_name(scheduler.transfer_backend)
    try:
        if get_observability().enable_metrics:
            state.counters.bind(role, backend)
        else:
            state.counters.role, state.counters.backend = role, backend
    except Exception:
        state.hook_failed("init_disaggregation", "could not set up metrics")
    if role in ("prefill", "decode"):
        state.helper_threads.start_scheduler()  # this is the scheduler thread: it keeps SCHED_OTHER
    if role == "decode" and state.local_prefill.enabled:
        problem = local_prefill_problem(scheduler, backend)
        if problem:  # the operator asked for it: refuse to start rather than serve without it
            raise RuntimeError(f"sglang_pd: SGLANG_PD_LOCAL_PREFILL_TOKENS={state.local_prefill.threshold} "
                               f"cannot run here: {problem}")
    if role == "decode":
        problem = slo_problem(state.settings, scheduler.tp_size)
        if problem:
            raise RuntimeError(f"sglang_pd: {problem}")
    return result


_PER_RANK = ("each tensor-parallel rank would decide on its own (from its own timings), and ranks that decide "
             "differently run different batches: not supported yet, use --tp-size 1 on decode or unset it")


def slo_problem(settings, tp_size: int) -> str:
    """Why the SLO admission settings cannot run on a decode scheduler of `tp_size` ranks ('' if they can)."""
    names = [name for name, value in (("SGLANG_PD_ITL_TARGET_MS", settings.itl_target_s),
                                      ("SGLANG_PD_TTFT_TARGET_MS", settings.ttft_target_s)) if value is not None]
    if not names or tp_size <= 1:
        return ""
    return f"{' and '.join(names)} with --tp-size {tp_size}: {_PER_RANK}"


def local_prefill_problem(scheduler, backend: str) -> str:
    """Why decode-local prefill cannot run on this decode scheduler ('' if it can; read-only)."""
    from sglang.srt.runtime_context import get_disagg, get_parallel

    queue = scheduler.disagg_decode_prealloc_queue
    problems = [
        (not scheduler.spec_algorithm.is_none(), "speculative decoding is not supported"),
        (get_parallel().pp_size > 1, "pipeline parallelism is not supported"),
        (scheduler.tp_size > 1, f"--tp-size {scheduler.tp_size}: {_PER_RANK}"),
        (scheduler.require_mlp_sync, "DP attention is not supported"),
        (get_disagg().disaggregation_decode_allocation_policy != "early",
         "--disaggregation-decode-allocation-policy must be 'early' (otherwise prefill computes before "
         "decode can decline)"),
        (backend not in ("mooncake", "nixl"), f"transfer backend {backend!r}: the decline needs mooncake or nixl"),
        (queue is None or not owns_decode_queue(queue),
         "it needs --disaggregation-decode-enable-radix-cache on a plain full-attention tree"),
    ]
    return "; ".join(why for bad, why in problems if bad)


_FAULT_EXTEND_DELAY_S = 3.0  # Fault.LOCAL_EXTEND_DELAY: the targeted request's local extend starts this late


def before_run_batch(scheduler, batch, pp_proxy_tensors=None):
    """A forward starts now. Decode: the SLO step meter closes the previous step's sample, and a local
    extend's tokens count in the current step. Prefill: count the prompt tokens its model computes."""
    state = current()
    state.helper_threads.maybe_sweep()
    mode = mode_name(scheduler.disaggregation_mode)
    if mode == "decode" and batch.forward_mode.is_decode():
        state.slo.on_step_start(time.perf_counter(), batch.batch_size(), sum(kv_len(r) for r in batch.reqs),
                                bool(scheduler._sched_idled))
    elif mode == "decode" and state.local_prefill.is_extend_batch(batch):
        decoding, idled = batch.decoding_reqs or [], bool(scheduler._sched_idled)
        if decoding:  # a mixed forward: its decode rows are this step's batch, the extend's tokens its extra
            state.slo.on_step_start(time.perf_counter(), len(decoding), sum(kv_len(r) for r in decoding), idled)
            state.slo.on_local_extend(state.local_prefill.num_extend_tokens(), len(decoding), False)
        else:
            state.slo.on_local_extend(state.local_prefill.num_extend_tokens(), scheduler.running_batch.batch_size(),
                                      idled)
        if any(state.faults.take(Fault.LOCAL_EXTEND_DELAY, int(r.bootstrap_room)) for r in batch.reqs):
            time.sleep(_FAULT_EXTEND_DELAY_S)
    elif mode == "prefill" and batch.forward_mode.is_extend():
        for req, num_tokens in zip(batch.reqs, batch.extend_lens):
            if req.bootstrap_room is not None:
                state.prefill_log.record_computed(int(req.bootstrap_room), int(num_tokens))


def after_is_disable_overlap_for_batch(result, scheduler, batch, last_batch):
    """Overlap loop: the result of a local extend (the first token, and whether it already finished) is
    processed before the next batch launches, as the PD path streams its first token at once."""
    return bool(result) or current().local_prefill.is_extend_batch(last_batch)


def after_is_fully_idle(result, scheduler, for_health_check=False, ignore_waiting=False):
    """Decode-local prefill requests hold a row and pages outside SGLang's queues: not idle while any do."""
    return bool(result) and current().local_prefill.num_pending() == 0


def around_pause_generation(original, scheduler, recv_req):
    """A retract-mode pause whose last batch is the bound local extend: SGLang retracts that batch's
    requests (releasing their rows, pages and locks, holding them for re-bootstrap), so the extend is over
    and will not join: its records become RETRACTED and the batch is unbound. An extend the overlap loop has
    already moved past (not last_batch) is not retracted by SGLang and joins after the pause as before."""
    local = current().local_prefill
    batch = local.extend_batch()
    takes_extend = (batch is not None and getattr(recv_req, "mode", None) == "retract"
                    and scheduler.last_batch is batch and batch is not scheduler.running_batch)
    result = original(scheduler, recv_req)
    if takes_extend:
        local.retract_extend()
    return result


def after_collect_inflight_batches(result, scheduler):
    """The bound local extend batch is in flight until it joins the running batch: list it with SGLang's.

    Upstream looks for running requests only in running_batch and last_batch. Once the overlap loop has
    processed the extend's result and launched the next decode, the extend batch is neither, so its local
    requests (and, when mixed, the running requests folded into it; running_batch is empty until the
    join) were invisible to SGLang's abort, which then let them decode to max_new_tokens, and to its
    SGLANG_REQ_RUNNING_TIMEOUT scan. Listed here, SGLang's own abort sets their `to_finish` and they
    finish through its normal path after the join (one release of row, pages and lock)."""
    batch = current().local_prefill.extend_batch()
    return result if batch is None else [*result, batch]


def after_abort_request(result, scheduler, recv_req):
    """A client abort also reaches requests queued for a local extend: answered, row, pages and lock given
    back. One already in the extend batch is SGLang's running-batch abort (the batch is among its in-flight
    batches, `after_collect_inflight_batches`); only its state is recorded here."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from sglang.srt.managers.scheduler import _make_abort_req

    state = current()
    if not state.local_prefill.enabled:
        return result

    def matches(rid: str) -> bool:
        return bool(recv_req.abort_all) or rid.startswith(recv_req.rid)

    def lock_state(req) -> str:
        lock = getattr(req, "lock", None)
        found = state.lock_ledger.state_of(lock) if lock is not None else None
        return found.value if found is not None else "none"

    for req in state.local_prefill.abort(matches, lock_state):
        scheduler.send_abort_output(_make_abort_req(req, finished_reason=recv_req.finished_reason), req)
        if req.finished_reason is None:
            req.finished_reason = FINISH_ABORT()
        release_local(scheduler, req)
    return result


def after_on_idle(result, scheduler):
    """A PD scheduler that is not fully idle (transfers, handshakes in flight) and had nothing to run
    sleeps SGLANG_PD_IDLE_WAIT_US instead of spinning on upstream's sleep(0) (idle_wait.py)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    state = current()
    state.helper_threads.maybe_sweep()
    wait = state.idle_wait
    if (wait.enabled and scheduler.disaggregation_mode != DisaggregationMode.NULL
            and not scheduler.is_fully_idle()):
        wait.wait()
    return result
