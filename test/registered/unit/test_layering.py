"""The house rules, as a scan of the source: layers imported downward only, no import cycle, module sizes,
one package per concern under srt/.

Layers, lowest first (a module may import its own layer or a lower one, never a higher one):

    0  sglang_pd (the version), secret_file, checkpoint      nothing of ours below them
    1  config, real_model                                   settings; the real model's files
    2  models, srt/metrics, srt/fault_injection             counters every logic package feeds
    3  srt/<concern>/ logic packages                        sideways imports allowed, the package graph acyclic
    4  srt/state                                            builds one process's objects
    5  srt/hooks                                            what SGLang calls (thin)
    6  plugin, harness, launch_router, router_child         entry point; deployments for tests
    7  bench, bench_*, demo, model_sensitivity              benchmarks and the demo

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parents[3] / "python" / "sglang_pd"
LOGIC_PACKAGES = ("admission", "attention", "auth", "handshake", "http", "local_prefill", "mem_cache", "processes",
                  "slo", "threads", "transfer", "wire")
SRT_TOP = {"__init__.py", "state.py", "fault_injection.py", "hooks", "metrics", *LOGIC_PACKAGES}
MAX_LINES, MAX_HOOK_LINES, MAX_MODULES_PER_PACKAGE = 400, 300, 12
_TOP = {"sglang_pd": 0, "secret_file": 0, "checkpoint": 0, "config": 1, "real_model": 1, "models": 2,
        "plugin": 6, "harness": 6, "launch_router": 6, "router_child": 6, "bench": 7, "demo": 7,
        "model_sensitivity": 7, "cpu_kernels": 0}
_SRT = {"metrics": 2, "fault_injection": 2, "state": 4, "hooks": 5, **{p: 3 for p in LOGIC_PACKAGES}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: `srt.<concern>` under srt/, else its top-level name."""
    parts = module.split(".")[1:]
    if not parts:
        return "sglang_pd"
    if parts[0] == "srt" and len(parts) > 1:
        return "srt." + parts[1]
    return "bench" if parts[0].startswith("bench") else parts[0]


def layer_of(unit: str) -> int:
    if unit.startswith("srt."):
        return _SRT[unit[4:]]
    return _TOP[unit]


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Modules of ours `path` imports (a `from pkg import module` counts as the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang_pd":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "sglang_pd"}
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PKG.rglob("*.py")}
    known = set(paths)
    return {m: imports_of(p, known) - {m} for m, p in paths.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `edges` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} (layer {layer_of(unit_of(m))}) imports {t} (layer {layer_of(unit_of(t))})"
                  for m, targets in edges.items() for t in targets
                  if layer_of(unit_of(t)) > layer_of(unit_of(m)))


def test_no_module_imports_a_higher_layer():
    assert upward_imports(graph()) == []


def test_no_import_cycle_between_modules():
    assert find_cycle(graph()) is None


def test_no_cycle_between_srt_packages():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph().items():
        packages[unit_of(module)] |= {unit_of(t) for t in targets if unit_of(t) != unit_of(module)}
    assert find_cycle(packages) is None


def test_the_scan_sees_an_upward_import_and_a_cycle():
    """The scan itself can fail: a logic module importing a hook, and two modules importing each other."""
    edges = {"sglang_pd.srt.slo.controller": {"sglang_pd.srt.hooks.scheduling.scheduler"},
             "sglang_pd.srt.handshake.a": {"sglang_pd.srt.handshake.b"},
             "sglang_pd.srt.handshake.b": {"sglang_pd.srt.handshake.a"}}
    assert upward_imports(edges) == ["sglang_pd.srt.slo.controller (layer 3) imports sglang_pd.srt.hooks.scheduling.scheduler "
                                     "(layer 5)"]
    assert find_cycle(edges) == ["sglang_pd.srt.handshake.a", "sglang_pd.srt.handshake.b",
                                 "sglang_pd.srt.handshake.a"]


def test_module_sizes():
    over = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > (MAX_HOOK_LINES if "hooks" in p.relative_to(PKG).parts else MAX_LINES)}
    assert over == {}, f"over {MAX_LINES} lines (hooks: {MAX_HOOK_LINES}): {over}"


def test_srt_is_one_package_per_concern():
    srt = PKG / "srt"
    entries = {p.name for p in srt.iterdir() if p.name != "__pycache__"}
    assert entries == SRT_TOP
    for package in (srt / name for name in SRT_TOP if (srt / name).is_dir()):
        modules = [p for p in package.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES_PER_PACKAGE, f"{package.name}: {len(modules)} modules"
        assert (package / "README.md").is_file(), f"srt/{package.name} has no README.md"
