"""The plugin seam: entry point discovery, per-process hook sets, version refusal, hook table health."""

import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

from sglang_pd.srt.hooks.table import HOOK_TABLE, hooks_for, registrations_for
from sglang_pd.srt.state import ProcessKind

pytestmark = pytest.mark.unit


def _resolve(target: str):
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(target)


_LITERALS = (type(None), bool, int, float, str, tuple, list)


@pytest.mark.parametrize("spec", HOOK_TABLE, ids=lambda s: s.target.rsplit(".", 2)[-2] + "." + s.target.rsplit(".", 1)[-1])
def test_every_hook_target_resolves_and_signatures_line_up(spec):
    """Each hook takes exactly its target's parameters: same order, kinds, names (the instance may be
    named for its role), defaults present in the same places and equal where upstream's is a literal.
    Callers pass arguments by keyword too, so a hook that drifted from its target breaks at run time."""
    target = _resolve(spec.target)
    assert callable(target)
    owner, name = _resolve(spec.target.rsplit(".", 1)[0]), spec.target.rsplit(".", 1)[1]
    if isinstance(owner, type) and isinstance(owner.__dict__.get(name), classmethod):
        target = owner.__dict__[name].__func__  # SGLang's registry hands a classmethod's hook the class first
    assert spec.why, "every hook states why it exists"
    target_params = list(inspect.signature(target).parameters.values())
    hook_params = list(inspect.signature(spec.fn).parameters.values())
    if spec.hook_type in ("AFTER", "AROUND"):
        hook_params = hook_params[1:]  # result / original come first
    assert len(hook_params) == len(target_params), (spec.target, hook_params, target_params)
    for i, (mine, theirs) in enumerate(zip(hook_params, target_params)):
        where = f"{spec.target} parameter {i} ({theirs.name})"
        assert mine.kind == theirs.kind, where
        assert mine.name == theirs.name or (i == 0 and theirs.name in ("self", "cls")), where
        assert (mine.default is inspect.Parameter.empty) == (theirs.default is inspect.Parameter.empty), where
        if isinstance(theirs.default, _LITERALS):
            assert mine.default == theirs.default, where


def test_table_targets_are_unique_per_process():
    for kind in ProcessKind:
        targets = [s.target for s in hooks_for(kind)]
        assert len(targets) == len(set(targets))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=240)


def test_entry_point_loads_in_main_and_scheduler_processes():
    # Real SGLang plugin discovery (entry point group sglang.srt.plugins), in fresh interpreters.
    proc = _run("""
        from sglang.srt.plugins import load_plugins
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang_pd.srt.state import current
        def run_scheduler_process():
            load_plugins()
        run_scheduler_process()
        print("KIND", current().kind.value)
        print("PATCHED", sorted(HookRegistry._patched))
        print("SNAP", current().snapshot()["applied_hooks"])
    """)
    assert proc.returncode == 0, proc.stderr
    assert "KIND scheduler" in proc.stdout
    expected = ([f"{s.hook_type} {s.target}" for s in hooks_for(ProcessKind.SCHEDULER)]
                + [f"REGISTER {r.target}" for r in registrations_for(ProcessKind.SCHEDULER)])
    assert f"SNAP {expected}" in proc.stdout, "every scheduler hook of the table is really patched"
    assert "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.finalize_bootstrap" in proc.stdout
    assert "sglang_pd 0.1.0 active in scheduler process" in proc.stderr

    proc = _run("""
        from sglang.srt.plugins import load_plugins
        from sglang_pd.srt.state import current
        load_plugins()
        print("KIND", current().kind.value)
        print("PATCHED", current().patched_hooks())
    """)
    assert proc.returncode == 0, proc.stderr
    assert "KIND http" in proc.stdout
    expected = ([f"{s.hook_type} {s.target}" for s in hooks_for(ProcessKind.HTTP)]
                + [f"REGISTER {r.target}" for r in registrations_for(ProcessKind.HTTP)])
    assert f"PATCHED {expected}" in proc.stdout


def test_other_sglang_version_refused_with_one_line():
    proc = _run("""
        import sglang_pd.plugin as plugin
        from sglang.srt.plugins.hook_registry import HookRegistry
        plugin.installed_sglang_version = lambda: "0.5.22"
        plugin.register()
        print("REGISTERED", dict(HookRegistry._hooks))
    """)
    assert proc.returncode == 0, proc.stderr
    assert "REGISTERED {}" in proc.stdout
    lines = [l for l in proc.stderr.splitlines() if l.startswith("[sglang_pd]")]
    assert lines == ["[sglang_pd] sglang_pd 0.1.0 requires sglang==0.5.23, found 0.5.22; plugin NOT active"]
