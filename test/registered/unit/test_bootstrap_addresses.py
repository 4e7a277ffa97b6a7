"""BootstrapAddresses (srt/auth/bootstrap_addresses.py) and its setting: which bootstrap servers a process with a
peer secret signs for; a secret decode without a list refused at start-up; a decode request naming another
address refused. The hook that sends or withholds SGLang's real requests: test_bootstrap_http.py."""

import secrets

import pytest

from sglang_pd.config import BOOTSTRAP_ADDRESSES, Settings, SettingsError
from sglang_pd.srt.auth import BootstrapAddresses

pytestmark = pytest.mark.unit


def test_the_setting_parses_hosts_and_host_ports_and_names_a_bad_entry(tmp_path):
    secret = tmp_path / "s"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    env = {"SGLANG_PD_PEER_SECRET_FILE": str(secret)}
    parsed = Settings.from_env({**env, BOOTSTRAP_ADDRESSES: " 10.0.0.5:8998, prefill-a ,[::1]:9000,[fe80::1],"})
    assert parsed.bootstrap_addresses == (("10.0.0.5", 8998), ("prefill-a", None), ("::1", 9000), ("fe80::1", None))
    assert Settings.from_env(env).bootstrap_addresses == ()
    for bad, says in (("h:0", "has a port outside [1, 65535]"), ("h:x", "has a port outside"),
                      ("a/b", "is not host or host:port"), ("[::1]x", "is not host or host:port"),
                      (":80", "is not host or host:port")):
        with pytest.raises(SettingsError, match=f"{BOOTSTRAP_ADDRESSES}='{bad}'.*{says}".replace("[", r"\[")):
            Settings.from_env({**env, BOOTSTRAP_ADDRESSES: bad})
    with pytest.raises(SettingsError, match="has no meaning without SGLANG_PD_PEER_SECRET_FILE"):
        Settings.from_env({BOOTSTRAP_ADDRESSES: "10.0.0.5"})


def test_a_listed_host_any_port_a_listed_host_port_and_prefills_own_address_only():
    addresses = BootstrapAddresses([("10.0.0.5", None), ("Prefill-B", 8998), ("::1", 9000)])
    assert addresses.allows("10.0.0.5", 1) and addresses.allows("10.0.0.5", 8998)
    assert addresses.allows("prefill-b", 8998) and not addresses.allows("prefill-b", 8999)
    assert addresses.allows("[::1]", 9000) and addresses.allows_url("http://[::1]:9000/route")
    assert not addresses.allows("10.0.0.6", 8998) and not addresses.allows_url("http://127.0.0.1:8998/route")
    assert addresses.allows_url("http://10.0.0.5/route")                          # port 80: any port of a host
    addresses.add_own(["127.0.0.1", "localhost"], 8998)                           # prefill's own server
    addresses.add_own(["node0"], None)                                            # its --dist-init-addr host
    assert addresses.allows("127.0.0.1", 8998) and addresses.allows("LOCALHOST", 8998)
    assert not addresses.allows("127.0.0.1", 8999) and addresses.allows("node0", 1234)
    assert addresses.snapshot()["own"] == ["127.0.0.1:8998", "localhost:8998", "node0"]
    prefill = BootstrapAddresses()
    prefill.add_prefill_own("127.0.0.1", 8998, None)                              # as the hook calls it
    assert prefill.allows("127.0.0.1", 8998) and prefill.allows("localhost", 8998) and prefill.allows("::1", 8998)
    assert not prefill.allows("127.0.0.1", 8999) and not prefill.allows("10.9.9.9", 8998)
    prefill.add_prefill_own("0.0.0.0", 8998, "node0:5000")
    assert prefill.allows("node0", 7000) and prefill.allows("0.0.0.0", 8998)


def test_a_secret_decode_without_a_list_may_not_start_and_a_request_elsewhere_is_named():
    empty, listed = BootstrapAddresses(), BootstrapAddresses([("10.0.0.5", 8998)])
    problem = empty.start_up_problem("decode", authenticated=True)
    assert BOOTSTRAP_ADDRESSES in problem and "is empty" in problem
    assert empty.start_up_problem("decode", authenticated=False) is None          # nothing is signed
    assert empty.start_up_problem("prefill", authenticated=True) is None          # signs for its own server
    assert listed.start_up_problem("decode", authenticated=True) is None
    assert listed.request_problem("decode", True, "10.0.0.5", None, 8998) is None  # port None: the default
    said = listed.request_problem("decode", True, "10.0.0.5", None, 8999)
    assert said.startswith("bootstrap address 10.0.0.5:8999 is not one this server signs for") and "10.0.0.5:8998" in said
    assert listed.request_problem("decode", True, "evil.example", 8998, 8998) is not None
    assert listed.request_problem("decode", False, "evil.example", 8998, 8998) is None
    assert listed.request_problem("prefill", True, "evil.example", 8998, 8998) is None


def test_sglangs_warm_up_request_to_a_decode_passes():
    """SGLang warms a decode up with a request naming its fake bootstrap host (no bootstrap request follows:
    a fake receiver); refusing it left the server unhealthy (found on a real pair)."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    from sglang_pd.srt.auth.bootstrap_addresses import SGLANG_FAKE_BOOTSTRAP_HOST

    assert SGLANG_FAKE_BOOTSTRAP_HOST == FAKE_BOOTSTRAP_HOST
    assert BootstrapAddresses([("127.0.0.1", None)]).request_problem("decode", True, FAKE_BOOTSTRAP_HOST, None, 8998) is None


def test_refusals_are_counted_per_address_in_bounded_memory():
    from sglang_pd.srt.auth.bootstrap_addresses import MAX_ADDRESSES

    addresses = BootstrapAddresses()
    assert addresses.refuse("10.0.0.9:1") and not addresses.refuse("10.0.0.9:1")  # logged the first time only
    for port in range(2, MAX_ADDRESSES + 51):      # MAX_ADDRESSES + 50 addresses in all
        addresses.refuse(f"10.0.0.9:{port}")
    refused = addresses.snapshot()["refused"]
    assert len(refused) == MAX_ADDRESSES + 1 and refused["10.0.0.9:1"] == 2 and refused["other"] == 50
    assert not addresses.refuse("10.0.0.10:1")                                     # past the cap: not logged
