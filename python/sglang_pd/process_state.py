"""Per-process state of sglang_pd: which hooks this process applied and the objects hooks own.

Each SGLang process (HTTP server, scheduler, detokenizer) loads the plugin separately, so each has
its own `STATE`. The scheduler's part reaches the HTTP process through SGLang's own
get_internal_state round trip (see `srt/scheduler_hooks.py`), never through shared files.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass, field

from sglang_pd.srt.disaggregation.admission_round import AdmissionRound
from sglang_pd.srt.disaggregation.decode_admission import DecodePrefixAdmission
from sglang_pd.srt.disaggregation.peer_guard import PeerGuard
from sglang_pd.srt.disaggregation.prefill_transfer_log import PrefillTransferLog
from sglang_pd.srt.disaggregation.radix_resume import RadixResume
from sglang_pd.srt.disaggregation.slo_controller import SloController
from sglang_pd.srt.fault_injection import FaultPlan
from sglang_pd.srt.mem_cache.lock_ledger import LockLedger
from sglang_pd.srt.mem_cache.tree_integrity import IntegrityReport
from sglang_pd.srt.pd_metrics import PDCounters


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
    """What sglang_pd holds in one process. Mutated only by plugin registration and hooks."""

    kind: ProcessKind | None = None
    applied_hooks: list[str] = field(default_factory=list)
    refused_reason: str | None = None
    prefill_log: PrefillTransferLog = field(default_factory=PrefillTransferLog)
    lock_ledger: LockLedger = field(default_factory=LockLedger)
    decode_admission: DecodePrefixAdmission = None  # built in __post_init__ around lock_ledger
    admission_round: AdmissionRound = None  # built in __post_init__ around decode_admission
    radix_resume: RadixResume = None  # built in __post_init__
    last_integrity: IntegrityReport | None = None
    hook_errors: dict[str, int] = field(default_factory=dict)
    faults: FaultPlan = field(default_factory=FaultPlan)
    num_retracted: int = 0
    counters: PDCounters = field(default_factory=PDCounters)
    slo: SloController = None  # built in __post_init__ from SGLANG_PD_*_TARGET_MS, around counters
    peer_guard: PeerGuard = field(default_factory=PeerGuard)  # keys at plugin start; gate/watch from hooks

    def __post_init__(self):
        self.decode_admission = DecodePrefixAdmission(self.lock_ledger, counters=self.counters)
        self.admission_round = AdmissionRound(self.decode_admission, counters=self.counters)
        self.radix_resume = RadixResume(counters=self.counters)
        self.slo = SloController.from_env(counters=self.counters)

    def count_hook_error(self, hook: str) -> None:
        """Count an exception a hook caught to keep SGLang serving (logged by the hook)."""
        self.hook_errors[hook] = self.hook_errors.get(hook, 0) + 1

    def record_integrity(self, report: IntegrityReport) -> None:
        """Keep the latest integrity report and count failures."""
        self.last_integrity = report
        self.counters.set("tree_locks_outstanding", report.num_outstanding_locks)
        if not report.ok:
            self.counters.add("integrity_failures_total", 1)

    def patched_hooks(self) -> list[str]:
        """Registered hooks whose target SGLang's HookRegistry really patched (read-only)."""
        from sglang.srt.plugins.hook_registry import HookRegistry

        return [h for h in self.applied_hooks if h.split(" ", 1)[1] in HookRegistry._patched]

    def snapshot(self) -> dict:
        """JSON-able view of this process's state (read-only)."""
        return {
            "process": self.kind.value if self.kind else None,
            "applied_hooks": self.patched_hooks(),
            "refused_reason": self.refused_reason,
            "prefill_transfer": self.prefill_log.snapshot(),
            "decode_admission": self.decode_admission.snapshot(),
            "lock_ledger": self.lock_ledger.summary(),
            "integrity": self.last_integrity.as_dict() if self.last_integrity else None,
            "hook_errors": dict(self.hook_errors),
            "faults": self.faults.snapshot(),
            "num_retracted": self.num_retracted,
            "radix_resume": self.radix_resume.snapshot(),
            "admission_round": self.admission_round.snapshot(),
            "counters": self.counters.snapshot(),
            "slo": self.slo.snapshot(num_recent_steps=512),
            "handshake": self.peer_guard.snapshot(),
        }


STATE = ProcessState()
