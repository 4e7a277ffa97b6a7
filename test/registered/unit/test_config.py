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


def _register(env: dict) -> subprocess.CompletedProcess:
    """plugin.register() in a fresh HTTP-kind interpreter with exactly `env` (plus PATH)."""
    code = "import sglang_pd.plugin as p; p.register(); print('ACTIVE', p.STATE.refused_reason is None)"
    return subprocess.run([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=120)


def test_peer_secret_refuses_start_when_unusable_and_never_shows_the_secret(tmp_path):
    secret = "0123456789abcdef0123456789abcdef-the-real-secret"
    good = tmp_path / "secret"
    good.write_text(secret + "\n")
    short = tmp_path / "short"
    short.write_text("tiny-secret-value\n")
    cases = {str(tmp_path / "absent"): "does not exist", str(short): "shorter than 32 characters",
             str(tmp_path): "cannot be read"}
    for path, reason in cases.items():
        proc = _register({"SGLANG_PD_PEER_SECRET_FILE": path})
        assert proc.returncode != 0 and "ACTIVE" not in proc.stdout, proc.stdout
        assert f"refusing to start: SGLANG_PD_PEER_SECRET_FILE={path!r} is unusable" in proc.stderr
        assert reason in proc.stderr and "tiny-secret-value" not in proc.stderr
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good)})
    assert "ACTIVE True" in proc.stdout, proc.stderr
    assert "PD peers authenticated (HMAC-SHA256; key ids" in proc.stderr and secret not in proc.stderr + proc.stdout
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good), "SGLANG_DISAGG_STAGING_BUFFER": "1"})
    assert proc.returncode != 0 and "cannot be combined with SGLANG_DISAGG_STAGING_BUFFER=1" in proc.stderr


def test_without_the_secret_one_warning_and_a_secret_stops_an_inactive_plugin(tmp_path):
    proc = _register({})
    warnings = [line for line in proc.stderr.splitlines() if "SGLANG_PD_PEER_SECRET_FILE is not set" in line]
    assert "ACTIVE True" in proc.stdout and len(warnings) == 1 and "NOT authenticated" in warnings[0]
    good = tmp_path / "secret"
    good.write_text("k" * 40)
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good), "SGLANG_PD_RADIX_RESUME": "maybe"})
    assert proc.returncode != 0 and "is set but the plugin cannot activate" in proc.stderr
