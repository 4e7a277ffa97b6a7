"""A PD request's bootstrap room, host and port: the forms routers send pass (IPv4, bracketed IPv6, DNS
names, no port = the server's default, no room = SGLang's own refusal), and each malformed field is
named, including decode's missing host (upstream's decode scheduler dies on it)."""

import pytest

from sglang_pd.srt.http.pairing_checks import MAX_ROOM, check_pairing

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("mode, room, host, port", [
    ("decode", 5, "127.0.0.1", 8998), ("decode", 0, "[::1]", 1), ("decode", MAX_ROOM, "prefill-0.pd.svc", None),
    ("prefill", 7, None, None), ("prefill", 7, "10.0.0.2", 65535), ("decode", None, None, None)])
def test_the_forms_routers_send_pass(mode, room, host, port):
    check_pairing(mode, room, host, port)


@pytest.mark.parametrize("mode, room, host, port, message", [
    ("decode", 5, None, None, "bootstrap_host is required on a decode server"),
    ("decode", -5, "h", None, "bootstrap_room -5 must be an integer in [0, 2**63 - 1]"),
    ("prefill", MAX_ROOM + 1, None, None, f"bootstrap_room {MAX_ROOM + 1} must be an integer"),
    ("decode", 1.5, "h", None, "bootstrap_room 1.5 must be an integer"),
    ("decode", True, "h", None, "bootstrap_room True must be an integer"),
    ("decode", "12", "h", None, "bootstrap_room '12' must be an integer"),
    ("decode", 5, "h", "8998", "bootstrap_port '8998' must be an integer in [1, 65535]"),
    ("decode", 5, "h", 0, "bootstrap_port 0 must be an integer in [1, 65535]"),
    ("prefill", 5, None, 70000, "bootstrap_port 70000 must be an integer in [1, 65535]"),
    ("decode", 5, "\x00;rm -rf", 1, "bootstrap_host '\\x00;rm -rf' is not a host name or IP address"),
    ("decode", 5, "", 1, "bootstrap_host '' is not a host name or IP address"),
    ("decode", 5, ["h"], 1, "bootstrap_host ['h'] is not a host name or IP address"),
    ("decode", 5, "a" * 254, 1, "is not a host name or IP address"),
    ("prefill", 5, "http://x/", 1, "bootstrap_host 'http://x/' is not a host name or IP address"),
])
def test_each_malformed_field_is_named(mode, room, host, port, message):
    with pytest.raises(ValueError) as info:
        check_pairing(mode, room, host, port)
    assert message in str(info.value)
