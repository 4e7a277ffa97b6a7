"""Lock-path checks shared by the integration modules: the state an exit path claims (a lock held just
before it) and its outcome (released exactly once, nothing held after); waiting for a server state."""

import threading
import time

from sglang_pd.harness import PDDeployment


def wait_for_plan(dep: PDDeployment, rid: str, timeout_s: float = 60) -> dict:
    """Block until decode admission has planned (matched + locked + preallocated) `rid`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        plan = dep.scheduler_state(dep.decodes[0])["decode_admission"]["plans"].get(rid)
        if plan is not None:
            return plan
        time.sleep(0.2)
    raise AssertionError(f"decode never admitted {rid}")


def wait_until(predicate, what: str, timeout_s: float = 60, poll_s: float = 0.1):
    """Poll `predicate()` until it returns something truthy and return that; AssertionError naming `what`
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def in_background(fn, *args, **kwargs) -> dict:
    """Run `fn` in a daemon thread: {"thread", then "resp" or "error"}."""
    out: dict = {}

    def run():
        try:
            out["resp"] = fn(*args, **kwargs)
        except Exception as exc:  # surfaced by the test's assertions
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def assert_lock_held(dep: PDDeployment, rid: str) -> None:
    """The ledger shows `rid` holding (at least) one tree lock now: the exit about to run has one to release."""
    owners = dep.scheduler_state(dep.decodes[0])["lock_ledger"]["owners"]
    assert owners.get(rid, 0) >= 1, f"{rid} holds no lock before its exit: {owners}"
    print(f"\nLOCKS BEFORE EXIT {rid}: {owners[rid]} held by it, {sum(owners.values())} on decode")


def assert_released_once(reports: dict, rid: str, num_tokens: int) -> None:
    """After the exit (servers clean): `rid` holds nothing and its prefix lock was released exactly once."""
    ledger = reports["decode0"]["lock_ledger"]
    assert rid not in ledger["owners"]
    released = [r for r in ledger["recent_releases"] if r["owner"] == rid and r["num_tokens"] == num_tokens]
    assert len(released) == 1, (rid, ledger["recent_releases"][-8:])
    assert ledger["num_double_releases"] == 0 and ledger["num_unknown_releases"] == 0
