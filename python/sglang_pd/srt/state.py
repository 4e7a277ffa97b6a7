"""The objects sglang_pd keeps in one SGLang process, built in one place from one Settings object.

Layers: SGLang calls the hook functions (srt/hooks/) -> they read this process's `ProcessState`
(`current()`) -> the logic classes it holds (srt/disaggregation/, srt/mem_cache/), each handed its
collaborators through its constructor by `build_state`, never reaching this module.

Each SGLang process (HTTP server, scheduler, detokenizer) loads the plugin separately, so each has
its own state; `plugin.register()` builds and installs it. The scheduler's part reaches the HTTP
process through SGLang's own get_internal_state round trip (srt/hooks/scheduling/scheduler.py).
"""

from __future__ import annotations

import enum
import inspect
import logging
from dataclasses import dataclass, field

from sglang_pd.config import Settings
from sglang_pd.srt.admission import AdmissionRound
from sglang_pd.srt.admission import DecodePrefixAdmission
from sglang_pd.srt.threads import HelperThreadPolicy
from sglang_pd.srt.threads import IdleWait
from sglang_pd.srt.threads import TransferWorkerPriority
from sglang_pd.srt.local_prefill import LocalPrefill
from sglang_pd.srt.transfer import HostMemoryScope
from sglang_pd.srt.handshake import PeerGuard, build_peer_guard
from sglang_pd.srt.transfer import PrefillTransferLog
from sglang_pd.srt.admission import RadixResume
from sglang_pd.srt.wire import RoomDeclineTable
from sglang_pd.srt.transfer import TransferWatch
from sglang_pd.srt.attention import SharedAttentionStats
from sglang_pd.srt.slo import SloController
from sglang_pd.srt.fault_injection import FaultPlan
from sglang_pd.srt.mem_cache import LockLedger
from sglang_pd.srt.mem_cache import IntegrityReport
from sglang_pd.srt.metrics import PDCounters
from sglang_pd.srt.processes import StartMethodPolicy


logger = logging.getLogger("sglang_pd.hooks")

INTERNAL_STATE_KEY = "sglang_pd"  # where a scheduler's snapshot rides SGLang's get_internal_state reply


class ProcessKind(str, enum.Enum):
    """Which SGLang process the plugin was loaded in."""

    HTTP = "http"
    SCHEDULER = "scheduler"
    DETOKENIZER = "detokenizer"
    DP_CONTROLLER = "dp_controller"


# The SGLang function that calls load_plugins() in each subprocess; anything else is the main
# (HTTP / engine) process.
_ENTRY_FUNCTIONS = {
    "run_scheduler_process": ProcessKind.SCHEDULER,
    "run_detokenizer_process": ProcessKind.DETOKENIZER,
    "run_data_parallel_controller_process": ProcessKind.DP_CONTROLLER,
}


def mode_name(mode) -> str:
    """SGLang's mode/backend value as a plain string ("decode", "nixl", ...): enums carry it in `.value`."""
    return str(getattr(mode, "value", mode))


def detect_process_kind() -> ProcessKind:
    """Classify the current process from the call stack of load_plugins()."""
    for frame in inspect.stack(0):
        kind = _ENTRY_FUNCTIONS.get(frame.function)
        if kind is not None:
            return kind
    return ProcessKind.HTTP


@dataclass
class ProcessState:
    """What sglang_pd holds in one process. Built by `build_state`; mutated by hooks only."""

    kind: ProcessKind
    settings: Settings
    counters: PDCounters
    lock_ledger: LockLedger
    decode_admission: DecodePrefixAdmission
    admission_round: AdmissionRound
    radix_resume: RadixResume
    slo: SloController
    faults: FaultPlan
    prefill_log: PrefillTransferLog
    nixl_host_memory: HostMemoryScope
    local_prefill: LocalPrefill
    room_declines: RoomDeclineTable
    transfer_watch: TransferWatch
    shared_attention: SharedAttentionStats
    peer_guard: PeerGuard
    idle_wait: IdleWait
    transfer_worker_priority: TransferWorkerPriority
    helper_threads: HelperThreadPolicy
    start_method: StartMethodPolicy
    applied_hooks: list[str] = field(default_factory=list)
    last_integrity: IntegrityReport | None = None

    def hook_failed(self, hook: str, message: str, *args) -> None:
        """Count an exception a hook caught to keep SGLang serving (stats `hook_errors`, metric
        `sglang_pd:hook_errors_total{hook=...}`) and log it: with its traceback the first time for this
        hook, then one line at the 2nd, 4th, 8th, ... time. Call inside the `except` block."""
        self.counters.add_labelled("hook_errors_total", hook)
        num = self.counters.labelled["hook_errors_total"][hook]
        if num == 1:
            logger.exception("sglang_pd: hook %s failed: " + message, hook, *args)
        elif int(num) & (int(num) - 1) == 0:
            logger.error("sglang_pd: hook %s failed again (%d times so far): " + message, hook, num, *args)

    @property
    def hook_errors(self) -> dict[str, int]:
        """Caught hook exceptions per hook name (read-only view of the counters)."""
        return {hook: int(n) for hook, n in self.counters.labelled["hook_errors_total"].items()}

    def record_integrity(self, report: IntegrityReport) -> None:
        """Keep the latest integrity report and count failures."""
        self.last_integrity = report
        self.counters.add("integrity_checks_total")
        if not report.ok:
            self.counters.add("integrity_failures_total")

    def patched_hooks(self) -> list[str]:
        """Registered hooks whose target SGLang's HookRegistry really patched (read-only)."""
        from sglang.srt.plugins.hook_registry import HookRegistry

        return [h for h in self.applied_hooks
                if h.startswith("REGISTER ") or h.split(" ", 1)[1] in HookRegistry._patched]

    def snapshot(self) -> dict:
        """JSON-able view of this process's state (read-only)."""
        return {
            "process": self.kind.value,
            "applied_hooks": self.patched_hooks(),
            "prefill_transfer": self.prefill_log.snapshot(),
            "decode_admission": self.decode_admission.snapshot(),
            "lock_ledger": self.lock_ledger.summary(),
            "integrity": self.last_integrity.as_dict() if self.last_integrity else None,
            "hook_errors": dict(self.hook_errors),
            "faults": self.faults.snapshot(),
            "num_retracted": int(self.counters.get("decode_retractions_total")),
            "radix_resume": self.radix_resume.snapshot(),
            "admission_round": self.admission_round.snapshot(),
            "counters": self.counters.snapshot(),
            "slo": self.slo.snapshot(num_recent_steps=512),
            "local_prefill": self.local_prefill.snapshot(),
            "room_declines": self.room_declines.snapshot(),
            "shared_attention": self.shared_attention.snapshot(),
            "handshake": self.peer_guard.snapshot(),
            "transfer_worker_priority": self.transfer_worker_priority.snapshot(),
            "helper_threads": self.helper_threads.snapshot(),
        }


def build_state(kind: ProcessKind, settings: Settings) -> ProcessState:
    """Every object of one process, wired to its collaborators (the only place that does it)."""
    counters = PDCounters()
    ledger = LockLedger(counters)
    admission = DecodePrefixAdmission(ledger)
    faults = FaultPlan(enabled=settings.fault_injection)
    prefill_log = PrefillTransferLog(counters)
    return ProcessState(
        kind=kind, settings=settings, counters=counters, lock_ledger=ledger, decode_admission=admission,
        admission_round=AdmissionRound(admission), radix_resume=RadixResume(counters),
        slo=SloController(settings.itl_target_s, settings.ttft_target_s, counters), faults=faults,
        prefill_log=prefill_log, nixl_host_memory=HostMemoryScope(),
        local_prefill=LocalPrefill(settings.local_prefill_tokens, settings.local_prefill_step_tokens, counters,
                                   balance_tokens=settings.local_prefill_balance_tokens),
        room_declines=RoomDeclineTable(counters),
        transfer_watch=TransferWatch(settings.nixl_stall_timeout_s, prefill_log, faults),
        shared_attention=SharedAttentionStats(counters),
        peer_guard=build_peer_guard(settings.peer_secret_file, settings.peer_auth_max_skew_s, settings.peer_curve,
                                    settings.unclaimed_room_ttl_s, settings.allow_unauthenticated_remote_peers,
                                    settings.kv_digest_on, settings.bootstrap_addresses),
        idle_wait=IdleWait(settings.idle_wait_us / 1e6, counters),
        transfer_worker_priority=TransferWorkerPriority(settings.transfer_worker_nice, counters),
        helper_threads=HelperThreadPolicy(settings.helper_threads_batch, counters),
        start_method=StartMethodPolicy(settings.cpu_forkserver))


_current: ProcessState | None = None


def install(state: ProcessState | None) -> ProcessState | None:
    """Make `state` this process's state (None uninstalls); returns the one it replaces."""
    global _current
    previous, _current = _current, state
    return previous


def installed() -> bool:
    """True once this process's state was built and installed (read-only)."""
    return _current is not None


def current() -> ProcessState:
    """This process's state; raises RuntimeError if the plugin never built one (hooks run only after)."""
    if _current is None:
        raise RuntimeError("sglang_pd: no process state (plugin.register() did not run or refused)")
    return _current
