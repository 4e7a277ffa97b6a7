"""Settings: declared once, validated once, bad values named; the plugin refuses to run with them."""

import secrets
import subprocess
import sys

import pytest

from sglang_pd.config import SETTINGS, Settings, SettingsError, problems as validate

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


def test_plugin_stops_the_process_on_bad_settings():
    env = {"SGLANG_PD_NIXL_STALL_TIMEOUT_S": "0", "SGLANG_PD_TYPO": "1", "PATH": "/usr/bin:/bin"}
    code = "import sglang_pd.plugin as p; p.register(); print('STILL RUNNING')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "STILL RUNNING" not in proc.stdout, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[sglang_pd]")]
    assert lines and lines[-1].startswith("[sglang_pd] refusing to start: bad setting: "), proc.stderr
    assert "SGLANG_PD_NIXL_STALL_TIMEOUT_S='0' must be > 0 seconds" in lines[-1]
    assert "SGLANG_PD_TYPO is not a sglang_pd setting" in lines[-1]


def test_on_by_default_flags_and_their_off_switch():
    for name, field in (("SGLANG_PD_RADIX_RESUME", "radix_resume"), ("SGLANG_PD_BATCHED_EVICTION", "batched_eviction")):
        assert getattr(Settings.from_env({}), field) and not getattr(Settings.from_env({name: "0"}), field)
        assert validate({name: "on"}) == [f"{name}='on' must be 0 or 1"]


def _register(env: dict, before: str = "") -> subprocess.CompletedProcess:
    """plugin.register() in a fresh HTTP-kind interpreter with exactly `env` (plus PATH)."""
    code = f"import sglang_pd.plugin as p; {before}p.register(); print('ACTIVE', p.refused_reason is None)"
    return subprocess.run([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=120)


def test_peer_secret_refuses_start_when_unusable_and_never_shows_the_secret(tmp_path):
    secret = secrets.token_hex(32)
    good = tmp_path / "secret"
    good.write_text(secret + "\n")
    good.chmod(0o600)
    short = tmp_path / "short"
    short.write_text("tiny-secret-value\n")
    short.chmod(0o600)
    shared = tmp_path / "shared"
    shared.write_text(secret + "\n")
    shared.chmod(0o644)
    cases = {str(tmp_path / "absent"): "does not exist", str(short): "shorter than 32 characters",
             str(tmp_path): "cannot be read", str(shared): "readable or writable by group or others (mode 644)"}
    for path, reason in cases.items():
        proc = _register({"SGLANG_PD_PEER_SECRET_FILE": path})
        assert proc.returncode != 0 and "ACTIVE" not in proc.stdout, proc.stdout
        assert f"refusing to start: bad setting: SGLANG_PD_PEER_SECRET_FILE={path!r} is unusable" in proc.stderr
        assert reason in proc.stderr and "tiny-secret-value" not in proc.stderr and secret not in proc.stderr
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good)})
    assert "ACTIVE True" in proc.stdout, proc.stderr
    assert "PD peers authenticated (HMAC-SHA256; key ids" in proc.stderr and secret not in proc.stderr + proc.stdout
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good), "SGLANG_DISAGG_STAGING_BUFFER": "1"})
    assert proc.returncode != 0 and "cannot be combined with SGLANG_DISAGG_STAGING_BUFFER=1" in proc.stderr


def test_without_the_secret_one_warning_and_with_it_an_inactive_plugin_stops_the_server(tmp_path):
    proc = _register({})
    warnings = [line for line in proc.stderr.splitlines() if "SGLANG_PD_PEER_SECRET_FILE is not set" in line]
    assert "ACTIVE True" in proc.stdout and len(warnings) == 1 and "NOT authenticated" in warnings[0]
    good = tmp_path / "secret"
    good.write_text(secrets.token_hex(32))
    good.chmod(0o600)
    other_version = "p.installed_sglang_version = lambda: '0.0.1'; "
    proc = _register({}, before=other_version)
    assert "ACTIVE False" in proc.stdout and "plugin NOT active" in proc.stderr, "no secret: inactive, serving"
    proc = _register({"SGLANG_PD_PEER_SECRET_FILE": str(good)}, before=other_version)
    assert proc.returncode != 0 and "is set but the plugin cannot activate" in proc.stderr


def test_the_remote_peer_opt_out_warns_and_cannot_be_combined_with_a_secret(tmp_path):
    proc = _register({"SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS": "1"})
    warnings = [line for line in proc.stderr.splitlines() if "SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS=1" in line]
    assert "ACTIVE True" in proc.stdout and len(warnings) == 1 and "any process on any host" in warnings[0]
    good = tmp_path / "secret"
    good.write_text(secrets.token_hex(32))
    good.chmod(0o600)
    proc = _register({"SGLANG_PD_ALLOW_UNAUTHENTICATED_REMOTE_PEERS": "1", "SGLANG_PD_PEER_SECRET_FILE": str(good)})
    assert proc.returncode != 0 and "has no meaning with SGLANG_PD_PEER_SECRET_FILE" in proc.stderr


def test_the_auth_skew_window_is_capped():
    assert Settings.from_env({"SGLANG_PD_PEER_AUTH_MAX_SKEW_S": "120"}).peer_auth_max_skew_s == 120.0
    with pytest.raises(SettingsError, match="SGLANG_PD_PEER_AUTH_MAX_SKEW_S='121' exceeds the cap of 120 seconds"):
        Settings.from_env({"SGLANG_PD_PEER_AUTH_MAX_SKEW_S": "121"})


def test_one_settings_object_parsed_from_the_declarations():
    import dataclasses

    assert {s.field for s in SETTINGS} == {f.name for f in dataclasses.fields(Settings)}
    assert Settings.from_env({}) == Settings(), "declared defaults and the dataclass defaults agree"
    parsed = Settings.from_env({"SGLANG_PD_ITL_TARGET_MS": "40", "SGLANG_PD_MODEL_DIR": "/tmp/m",
                                "SGLANG_PD_ENABLE_FAULT_INJECTION": "1"})
    assert (parsed.itl_target_s, str(parsed.models_root), parsed.fault_injection) == (0.04, "/tmp/m", True)
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"SGLANG_PD_TTFT_TARGET_MS": "-1", "SGLANG_PD_BOGUS": "1"})
    assert len(err.value.problems) == 2 and "SGLANG_PD_BOGUS is not a sglang_pd setting" in str(err.value)
