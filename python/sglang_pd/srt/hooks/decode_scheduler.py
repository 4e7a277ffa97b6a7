"""Hook on SGLang's `SchedulerDisaggregationDecodeMixin` (disaggregation/decode.py): ITL-target admission.

Without SGLANG_PD_ITL_TARGET_MS / SGLANG_PD_TTFT_TARGET_MS it calls SGLang's original unchanged.
"""

from __future__ import annotations

import time

from sglang_pd.srt.mem_cache.common import request_kv_len as kv_len
from sglang_pd.srt.state import current


def around_get_new_prebuilt_batch(original, scheduler, running_batch):
    """Let only the first `admission_for(...)` waiting requests join; learn TTFT from those that do."""
    slo = current().slo
    if slo.itl_target_s is None and slo.ttft_target_s is None:
        return original(scheduler, running_batch)
    waiting = scheduler.waiting_queue
    num_admit = slo.admission_for(running_batch.batch_size(), sum(kv_len(r) for r in running_batch.reqs),
                                  [kv_len(r) for r in waiting]) if waiting else None
    if num_admit is None or num_admit >= len(waiting):
        batch = original(scheduler, running_batch)
    else:
        held = waiting[num_admit:]
        scheduler.waiting_queue = waiting[:num_admit]
        try:
            batch = original(scheduler, running_batch)
        finally:  # upstream rebinds waiting_queue to what it did not take; the held ones stay behind it
            scheduler.waiting_queue = list(scheduler.waiting_queue) + held
    if batch is not None:
        slo.on_admitted([str(r.rid) for r in batch.reqs], time.perf_counter())
    return batch
