"""Settings: declared once, validated once, bad values named; the plugin refuses to run with them."""

import subprocess
import sys

import pytest

from sglang_pd.config import SETTINGS, validate

pytestmark = pytest.mark.unit


def test_defaults_and_good_values_pass():
    assert validate({}) == []
    assert validate({"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "2.5", "SGLANG_PD_ENABLE_FAULT_INJECTION": "1"}) == []
    assert all(s.help and s.name.startswith("SGLANG_PD_") for s in SETTINGS)


def test_bad_values_and_unknown_names_are_named():
    problems = validate({"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "soon", "SGLANG_PD_ENABLE_FAULT_INJECTION": "yes",
                         "SGLANG_PD_NIXL_STALL_TIMEOUT": "5"})
    assert "SGLANG_PD_NIXL_STALL_TIMEOUT_S='soon' is not a number of seconds" in problems
    assert "SGLANG_PD_ENABLE_FAULT_INJECTION='yes' must be 0 or 1" in problems
    assert any(p.startswith("SGLANG_PD_NIXL_STALL_TIMEOUT is not a sglang_pd setting") for p in problems)


def test_plugin_refuses_bad_settings():
    env = {"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "0", "PATH": "/usr/bin:/bin"}
    code = "import sglang_pd.plugin as p; p.register(); print('REFUSED', p.STATE.refused_reason is not None)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "REFUSED True" in proc.stdout, proc.stderr
    assert "[sglang_pd] bad setting: SGLANG_PD_NIXL_STALL_TIMEOUT_S='0' must be > 0 seconds" in proc.stderr


def test_on_by_default_flags_and_their_off_switch():
    from sglang_pd.config import enabled

    for name in ("SGLANG_PD_RADIX_RESUME", "SGLANG_PD_BATCHED_EVICTION"):
        assert enabled(name, {}) and not enabled(name, {name: "0"})
        assert validate({name: "on"}) == [f"{name}='on' must be 0 or 1"]
