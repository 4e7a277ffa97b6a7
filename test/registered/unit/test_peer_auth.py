"""HMAC tags over handshake frames and bootstrap HTTP: what is accepted, what is refused and why."""

import hashlib
import os
import secrets
import subprocess
import sys
import time

import pytest

from sglang_pd.srt.auth.peer_auth import (
    DEFAULT_MAX_SKEW_S, AuthFailure, PeerAuth, ReplayGuard, key_id, process_start_time, receiver_name)
from sglang_pd.secret_file import SecretFileError, read_keys

pytestmark = pytest.mark.unit

KEY_A = hashlib.sha256(b"first key").hexdigest().encode()   # 64 hex digits, as `openssl rand -hex 32` makes
KEY_B = hashlib.sha256(b"second key").hexdigest().encode()
RECV = b"127.0.0.1:16000"     # the rank socket a message is signed for
ME = "127.0.0.1:8998"         # the bootstrap server a request is signed for
IS_ME = ME.__eq__
FRAMES = [b"42", b"127.0.0.1", b"5000", b"127.0.0.1:16000", b"\x01\x00\x00\x00", b"3", b"", b"1", b"16", b""]


class Clock:
    def __init__(self, now=1_800_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_signed_frames_verify_once_and_come_back_without_the_trailer():
    auth = PeerAuth([KEY_A])
    msg = FRAMES + auth.sign_frames(FRAMES, RECV)
    assert len(msg) == len(FRAMES) + 5
    assert auth.verify_frames(msg, RECV) == (None, FRAMES, None)
    assert auth.verify_frames(msg, RECV).failure is AuthFailure.REPLAYED


def test_a_message_is_bound_to_the_receiver_it_was_signed_for():
    """A genuine signed message replayed to another rank socket (another port, another host) fails its MAC
    there; a bootstrap request signed for another server is refused as such."""
    auth = PeerAuth([KEY_A])
    msg = FRAMES + auth.sign_frames(FRAMES, RECV)
    for elsewhere in (b"127.0.0.1:16001", b"10.0.0.2:16000", b""):
        assert auth.verify_frames(list(msg), elsewhere).failure is AuthFailure.BAD_MAC
    assert auth.verify_frames(list(msg), RECV).failure is None
    header, _ = auth.sign_http_request("GET", "/route", b"", "127.0.0.1:8999")
    assert auth.verify_http_request("GET", "/route", b"", header, IS_ME).failure is AuthFailure.WRONG_RECEIVER
    forged_to = header.replace("to=127.0.0.1:8999", f"to={ME}")  # naming this server breaks the MAC instead
    assert auth.verify_http_request("GET", "/route", b"", forged_to, IS_ME).failure is AuthFailure.BAD_MAC


def test_receiver_names_of_endpoints():
    assert receiver_name("tcp://127.0.0.1:5000") == b"127.0.0.1:5000"
    assert receiver_name("tcp://127.0.0.2:0;127.0.0.1:5000") == b"127.0.0.1:5000"
    assert receiver_name("tcp://[::1]:5000") == b"[::1]:5000"


@pytest.mark.parametrize("tamper", ["edit", "move_boundary", "drop", "add", "reorder"])
def test_any_change_to_the_frames_breaks_the_tag(tamper):
    auth = PeerAuth([KEY_A])
    trailer = auth.sign_frames(FRAMES, RECV)
    body = {
        "edit": FRAMES[:8] + [b"17"] + FRAMES[9:],
        "move_boundary": [FRAMES[0] + FRAMES[1]] + FRAMES[2:],
        "drop": FRAMES[:-1],
        "add": FRAMES + [b""],
        "reorder": [FRAMES[1], FRAMES[0]] + FRAMES[2:],
    }[tamper]
    assert auth.verify_frames(body + trailer, RECV).failure is AuthFailure.BAD_MAC


def test_missing_wrong_secret_malformed_and_stale_are_told_apart():
    clock = Clock()
    real, impostor = PeerAuth([KEY_A], clock=clock), PeerAuth([KEY_B], clock=clock)
    assert real.verify_frames(FRAMES, RECV).failure is AuthFailure.MISSING
    assert real.verify_frames(FRAMES + impostor.sign_frames(FRAMES, RECV), RECV).failure is AuthFailure.UNKNOWN_KEY
    forged = FRAMES + real.sign_frames(FRAMES, RECV)
    forged[-1] = bytes(32)  # right key id, tag not made with the key
    assert real.verify_frames(forged, RECV).failure is AuthFailure.BAD_MAC
    bad = FRAMES + real.sign_frames(FRAMES, RECV)
    bad[-3] = b"not-a-time"
    assert real.verify_frames(bad, RECV).failure is AuthFailure.MALFORMED
    old = FRAMES + real.sign_frames(FRAMES, RECV)
    clock.now += 31
    assert real.verify_frames(old, RECV).failure is AuthFailure.STALE
    future = FRAMES + PeerAuth([KEY_A], clock=Clock(clock.now + 60)).sign_frames(FRAMES, RECV)
    assert real.verify_frames(future, RECV).failure is AuthFailure.STALE


def test_rotation_new_key_first_old_key_still_verifies():
    old_only, both = PeerAuth([KEY_A]), PeerAuth([KEY_B, KEY_A])
    assert both.key_ids[0] == key_id(KEY_B).decode()
    assert both.verify_frames(FRAMES + old_only.sign_frames(FRAMES, RECV), RECV).failure is None
    assert old_only.verify_frames(FRAMES + both.sign_frames(FRAMES, RECV), RECV).failure is AuthFailure.UNKNOWN_KEY
    assert PeerAuth([KEY_A, KEY_B]).verify_frames(FRAMES + both.sign_frames(FRAMES, RECV), RECV).failure is None


def test_replay_memory_is_bounded_and_forgets_after_the_window():
    guard = ReplayGuard(capacity=2)
    assert guard.admit(b"n1", 10.0, now=0.0) is None
    assert guard.admit(b"n1", 10.0, now=1.0) is AuthFailure.REPLAYED
    assert guard.admit(b"n2", 10.0, now=1.0) is None
    assert guard.admit(b"n3", 10.0, now=1.0) is AuthFailure.OVERLOADED
    assert guard.admit(b"n3", 20.0, now=11.0) is None and len(guard) == 1


def test_http_request_and_answer_tags():
    server, client = PeerAuth([KEY_A]), PeerAuth([KEY_A])
    header, nonce = client.sign_http_request("PUT", "/route", b'{"rank_port":1}', ME)
    assert server.verify_http_request("PUT", "/route", b'{"rank_port":1}', header, IS_ME) == (None, None, nonce)
    assert server.verify_http_request("PUT", "/route", b'{"rank_port":1}', header, IS_ME).failure is AuthFailure.REPLAYED
    header, _ = client.sign_http_request("GET", "/route?prefill_dp_rank=0", b"", ME)
    assert server.verify_http_request("GET", "/route?prefill_dp_rank=1", b"", header, IS_ME).failure is AuthFailure.BAD_MAC
    assert server.verify_http_request("GET", "/route", b"", None, IS_ME).failure is AuthFailure.MISSING
    answer = server.sign_http_response(nonce, 200, b'{"rank_ip":"10.0.0.1"}')
    assert client.verify_http_response(nonce, 200, b'{"rank_ip":"10.0.0.1"}', answer).failure is None
    assert client.verify_http_response(nonce, 200, b'{"rank_ip":"6.6.6.6"}', answer).failure is AuthFailure.BAD_MAC
    other_nonce = client.sign_http_request("GET", "/route", b"", ME)[1]
    replayed = client.verify_http_response(other_nonce, 200, b'{"rank_ip":"10.0.0.1"}', answer)
    assert replayed.failure is AuthFailure.BAD_MAC  # an answer to another request
    fake = PeerAuth([KEY_B]).sign_http_response(nonce, 200, b"{}")
    assert client.verify_http_response(nonce, 200, b"{}", fake).failure is AuthFailure.UNKNOWN_KEY


def _private(path, text: str, mode: int = 0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def test_secret_file_rules_and_the_secret_never_shows(tmp_path):
    new, old = secrets.token_hex(32).encode(), secrets.token_urlsafe(32).encode()  # 256 bits each
    path = _private(tmp_path / "secret", "# rotation: new key first\n" + new.decode() + "\n\n" + old.decode() + "\n")
    assert read_keys(path) == [new, old]
    auth = PeerAuth.from_file(path)
    assert new.decode() not in repr(auth) and old.decode() not in repr(auth)
    path.write_text("too-short\n")
    with pytest.raises(SecretFileError, match="shorter than 32") as err:
        read_keys(path)
    assert "too-short" not in str(err.value)
    with pytest.raises(SecretFileError, match="does not exist"):
        read_keys(tmp_path / "absent")
    with pytest.raises(SecretFileError, match="cannot be read"):
        read_keys(tmp_path)
    path.write_text("# only a comment\n")
    with pytest.raises(SecretFileError, match="holds no key"):
        read_keys(path)
    assert os.path.exists(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_secret_file_group_or_others_may_read_or_write_is_refused(tmp_path, mode):
    key = secrets.token_hex(32)
    path = _private(tmp_path / "secret", key + "\n", mode)
    with pytest.raises(SecretFileError, match=f"readable or writable by group or others \\(mode {mode:o}\\); chmod 600") as err:
        read_keys(path)
    assert key not in str(err.value)
    path.chmod(0o600)
    assert read_keys(path) == [key.encode()]
    path.chmod(0o400)
    assert read_keys(path) == [key.encode()]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_secret_file_another_user_owns_is_refused(tmp_path):
    path = _private(tmp_path / "secret", secrets.token_hex(32) + "\n")
    os.chown(path, 65534, -1)
    with pytest.raises(SecretFileError, match=f"owned by uid 65534, not by this server's user \\(uid {os.geteuid()}\\)"):
        read_keys(path)


@pytest.mark.parametrize("key, strong", [
    (secrets.token_hex(32), True),              # openssl rand -hex 32: 64 hex digits, 256 bits
    (secrets.token_urlsafe(32), True),          # 43 base64 characters
    (secrets.token_hex(16), False),             # 32 hex digits: 128 bits
    ("k" * 64, False),                          # one character repeated
    ("a" * 32 + "-first-secret", False),        # padded: one character is most of it
], ids=["hex-256-bits", "base64-256-bits", "hex-128-bits", "repeated", "padded"])
def test_keys_need_256_bits_by_the_estimate(tmp_path, key, strong):
    path = _private(tmp_path / "secret", key + "\n")
    if strong:
        assert read_keys(path) == [key.encode()]
        return
    with pytest.raises(SecretFileError, match="openssl rand -hex 32") as err:
        read_keys(path)
    assert key not in str(err.value)


def test_process_start_time_reads_the_kernel_clock_of_that_process():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = process_start_time(child.pid)
        after = time.time()
    finally:
        child.kill()
        child.wait()
    assert before - 0.011 <= started <= after  # ticks of 10 ms, truncated: up to one tick early
    assert process_start_time() <= before


_VERIFY_IN_A_NEW_PROCESS = """
import sys, time
from sglang_pd.srt.auth.peer_auth import PeerAuth, process_start_time
auth = PeerAuth.from_file(sys.argv[1])
RECV = b"127.0.0.1:16000"
frames = [bytes.fromhex(h) for h in sys.argv[2].split(",")]
replayed = auth.verify_frames(frames, RECV).failure
fresh = auth.verify_frames(frames[:-5] + auth.sign_frames(frames[:-5], RECV), RECV).failure
print(replayed.value if replayed else "accepted", fresh.value if fresh else "accepted",
      abs(auth.not_before - process_start_time()) < 0.005, time.time() - int(frames[-3]) / 1000.0)
"""


def test_a_message_signed_before_a_restart_is_refused_by_the_new_process(tmp_path):
    """The nonce memory is per process: a server restarted inside the window must not accept again what
    its previous process accepted. Here this test process plays the previous server, a fresh interpreter
    the restarted one."""
    secret = tmp_path / "secret"
    _private(secret, KEY_A.decode() + "\n")
    previous = PeerAuth.from_file(secret)
    msg = FRAMES + previous.sign_frames(FRAMES, RECV)
    assert previous.not_before <= time.time()
    assert previous.verify_frames(list(msg), RECV).failure is None  # accepted once by the process it was meant for
    time.sleep(0.05)  # the restarted process starts strictly after the signature, beyond tick rounding
    out = subprocess.run([sys.executable, "-c", _VERIFY_IN_A_NEW_PROCESS, str(secret), ",".join(f.hex() for f in msg)],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    replayed, fresh, not_before_is_start, age_s = out[0], out[1], out[2], float(out[3])
    assert age_s < DEFAULT_MAX_SKEW_S  # inside the replay window: the nonce check alone would have accepted it
    assert not_before_is_start == "True"
    assert replayed == AuthFailure.BEFORE_START.value
    assert fresh == "accepted"  # a message signed after the start still passes


def test_not_before_applies_to_bootstrap_http_requests_too():
    clock = Clock()
    signer, restarted = PeerAuth([KEY_A], clock=clock), PeerAuth([KEY_A], clock=clock, not_before=clock.now + 1)
    header, _ = signer.sign_http_request("PUT", "/route", b"{}", ME)
    clock.now += 2
    assert restarted.verify_http_request("PUT", "/route", b"{}", header, IS_ME).failure is AuthFailure.BEFORE_START
    header, _ = signer.sign_http_request("PUT", "/route", b"{}", ME)
    assert restarted.verify_http_request("PUT", "/route", b"{}", header, IS_ME).failure is None
