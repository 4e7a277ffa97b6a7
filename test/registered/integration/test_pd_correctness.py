"""PD pair (decode radix cache on) vs a plain server, and the decode_prefix_len and pages that reach
prefill: one suite (mixin), one class per transfer backend."""

import concurrent.futures as cf
import json
import random
import time

import pytest
import requests

from sglang_pd.harness import PDDeployment
from sglang_pd.harness.equality import assert_differs, assert_same
from sglang_pd.models import VOCAB_SIZE
from sglang_pd.srt.mem_cache import kv_to_page_num, page_align_floor

pytestmark = pytest.mark.integration

NEW_TOKENS = 8


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]


def _prompts(seed: int) -> list[list[int]]:
    """Lengths at and around page boundaries (16, 32, 64) plus shared-prefix variants."""
    rng = random.Random(seed)
    base = _tokens(rng, 64)
    lone = [_tokens(rng, n) for n in (1, 15, 16, 17, 31, 32, 33)]
    return lone + [base, base + [7, 8, 9], base[:30] + [11, 12], base[:48]]


class CorrectnessSuite:
    """The same checks for every transport; subclasses provide the `dep` fixture."""

    def test_pd_outputs_equal_plain(self, dep: PDDeployment, plain_url: str):
        prompts = _prompts(seed=dep.config.page_size)
        assert len(prompts) >= 8
        for ids in prompts:
            _, decoded, _ = dep.generate_pd(ids, NEW_TOKENS)
            assert len(decoded["output_ids"]) == NEW_TOKENS
            assert_same(decoded, dep.generate(plain_url, ids, NEW_TOKENS), f"prompt of {len(ids)} tokens")
        dep.wait_clean()

    def test_conversation_reuses_decode_prefix(self, dep: PDDeployment, plain_url: str):
        """4 turns: outputs equal plain; turn >= 2 reuses exactly the page-aligned previous context.

        Measured at prefill: the decode_prefix_len it was told, the KV pages it handed to its
        transport and, over NIXL, the pages NIXL itself was asked to move.
        """
        page = dep.config.page_size
        rng = random.Random(100 + page)
        # Token 0 starts no other test prompt (those draw from 3..), so turn 1 matches nothing on decode.
        conv = [0] + _tokens(rng, 36)
        previous_context = 0
        for turn in range(4):
            _, decoded, room = dep.generate_pd(conv, NEW_TOKENS)
            assert_same(decoded, dep.generate(plain_url, conv, NEW_TOKENS), f"turn {turn + 1}")
            record = dep.prefill_rooms()[room]
            expected_prefix = page_align_floor(previous_context, page)
            expected_pages = kv_to_page_num(len(conv) - expected_prefix, page)
            assert record["prompt_len"] == len(conv)
            assert record["decode_prefix_len"] == expected_prefix, f"turn {turn + 1}"
            if turn >= 1:
                assert record["decode_prefix_len"] > 0
            assert record["num_pages_sent"] == expected_pages
            if dep.config.transfer_backend == "nixl":
                assert record["num_pages_nixl"] == expected_pages, f"turn {turn + 1}: counted at NIXL"
            previous_context = len(conv) + len(decoded["output_ids"])
            conv = conv + decoded["output_ids"] + _tokens(rng, 13)
        dep.wait_clean()

    def test_full_prefix_hit_moves_zero_pages(self, dep: PDDeployment, plain_url: str):
        prompt = [2] + _tokens(random.Random(21), 47)  # 48 tokens: a multiple of both page sizes
        first = dep.generate_pd(prompt, NEW_TOKENS)[1]
        _, again, room = dep.generate_pd(prompt, NEW_TOKENS)
        record = dep.prefill_rooms()[room]
        assert record["decode_prefix_len"] == len(prompt)
        assert record["num_pages_planned"] == 0 and record["num_pages_sent"] == 0
        if dep.config.transfer_backend == "nixl":
            assert record["num_pages_nixl"] == 0
        plain = dep.generate(plain_url, prompt, NEW_TOKENS)
        assert_same(first, plain, "first")
        assert_same(again, plain, "full prefix hit")
        dep.wait_clean()

    # ---- power checks: each equality above can fail. The path is broken on purpose, for one room, and
    # the output must then differ from the plain server's (tokens, or logprobs beyond the tolerance).
    def test_a_transferred_page_corrupted_on_arrival_changes_the_output_or_is_caught(self, dep: PDDeployment,
                                                                                     plain_url: str):
        """kv_page_corrupt: decode overwrites the first page prefill sent before any forward reads it. Without
        KV digests (page1: no secret) the output differs from plain (the power check); with them (a secret:
        SGLANG_PD_KV_DIGEST=auto is on) decode catches it before use: the request fails with HTTP 500 naming
        the room, the pages are freed and never cached (the same prompt again starts from an empty prefix
        and equals plain), counted, nothing leaks."""
        rng = random.Random(600 + dep.config.page_size)
        prompt = _tokens(rng, 40)
        room, fired = arm_for_new_room(dep, "kv_page_corrupt")
        if not kv_digest_on(dep):
            _, decoded, _ = dep.generate_pd(prompt, NEW_TOKENS, room=room)
            assert decode_fired(dep, "kv_page_corrupt") == fired + 1
            assert_differs(decoded, dep.generate(plain_url, prompt, NEW_TOKENS), "one transferred page corrupted")
        else:
            assert_caught_by_the_kv_digest(dep, plain_url, prompt, room, "kv_page_corrupt", fired)
        again = _tokens(rng, 40)  # the same pair, unbroken: equal again
        assert_same(dep.generate_pd(again, NEW_TOKENS)[1], dep.generate(plain_url, again, NEW_TOKENS), "after")
        dep.wait_clean()

    def test_decode_prefix_len_one_page_ahead_changes_the_output(self, dep: PDDeployment, plain_url: str):
        """prefix_page_ahead: decode tells prefill it holds one page more than it does and leaves that
        page as the pool had it (prefill skips it): decode then reads KV it never received."""
        page = dep.config.page_size
        rng = random.Random(610 + page)
        primed = _tokens(rng, 2 * page + 3)
        dep.generate_pd(primed, NEW_TOKENS)  # decode holds this prefix: the broken request's match
        prompt = primed + _tokens(rng, 3 * page)
        room, fired = arm_for_new_room(dep, "prefix_page_ahead")
        if not kv_digest_on(dep):
            _, decoded, _ = dep.generate_pd(prompt, NEW_TOKENS, room=room)
            assert decode_fired(dep, "prefix_page_ahead") == fired + 1
            assert_differs(decoded, dep.generate(plain_url, prompt, NEW_TOKENS), "decode_prefix_len one page ahead")
        else:  # decode digests from the prefix it holds, prefill from the one it was told: one page apart
            assert_caught_by_the_kv_digest(dep, plain_url, prompt, room, "prefix_page_ahead", fired, cached_prefix=True)
        assert dep.prefill_rooms()[room]["decode_prefix_len"] == page_align_floor(len(primed), page) + page
        dep.wait_clean()


    def test_a_room_shared_by_two_prompts_never_pairs_them(self, dep: PDDeployment, plain_url: str):
        """Prompt A's prefill half waits in room R; then prompt B's decode half arrives under the same R
        (what gave decode B exactly A's continuation before, docs/results/security/room_pairing/). Prefill now sees that
        the transfer info was computed for another prompt: it refuses A's half before sending a page,
        fails the room and tells decode, so B's half ends with an error, never with A's output. A second
        decode request in a room a first one holds is refused (400); the first pair equals plain; nothing
        leaks."""
        from sglang_pd.harness.deployment_requests import new_bootstrap_room
        from sglang_pd.harness.hostile_peer import handshake_view

        rng = random.Random(501 + dep.config.page_size)
        a, b = _tokens(rng, 40), _tokens(rng, 40)
        room = new_bootstrap_room(rng)
        before = handshake_view(dep, dep.prefill)["gate"]["prompt_digests"]
        with cf.ThreadPoolExecutor(1) as pool:
            prefill_a = pool.submit(dep.post_generate, dep.prefill.url, a, NEW_TOKENS, 120, **dep.pairing(room))
            deadline = time.monotonic() + 30
            while room not in handshake_view(dep, dep.prefill)["rooms"]["by_status"].get("1", []):  # Bootstrapping
                assert time.monotonic() < deadline and not prefill_a.done(), "A's prefill half never waited"
                time.sleep(0.1)
            decode_b = dep.post_generate(dep.decodes[0].url, b, NEW_TOKENS, 120, **dep.pairing(room))
            answer_a = prefill_a.result(timeout=120)
        named = f"room {room}'s transfer info was sent for a different prompt"
        assert answer_a.status_code >= 400 and named in answer_a.text, (answer_a.status_code, answer_a.text[:300])
        plain_a = dep.generate(plain_url, a, NEW_TOKENS)["output_ids"]
        assert decode_b.status_code >= 400, (decode_b.status_code, decode_b.text[:300])
        assert "output_ids" not in decode_b.text or plain_a != decode_b.json().get("output_ids")
        # A second decode request in a room another decode request holds is refused at the door (upstream's
        # decode scheduler dies when such a shared room fails); the first one is then served normally.
        room2 = new_bootstrap_room(rng)
        with cf.ThreadPoolExecutor(1) as pool:
            first = pool.submit(dep.post_generate, dep.decodes[0].url, b, NEW_TOKENS, 120, **dep.pairing(room2))
            deadline = time.monotonic() + 30
            def decode_holds_room2() -> bool:
                by_status = handshake_view(dep, dep.decodes[0])["rooms"]["by_status"]
                return any(room2 in rooms for rooms in by_status.values())

            while not decode_holds_room2():
                assert time.monotonic() < deadline and not first.done(), "the first decode half never waited"
                time.sleep(0.1)
            second = dep.post_generate(dep.decodes[0].url, a, NEW_TOKENS, 60, **dep.pairing(room2))
            assert second.status_code == 400 and f"bootstrap_room {room2} is already in use" in second.text, \
                (second.status_code, second.text[:300])
            prefill_b = dep.post_generate(dep.prefill.url, b, NEW_TOKENS, 120, **dep.pairing(room2))
            decoded = first.result(timeout=120)
        assert prefill_b.ok and decoded.ok, (prefill_b.text[:200], decoded.text[:200])
        assert decoded.json()["output_ids"] == dep.generate(plain_url, b, NEW_TOKENS)["output_ids"]
        after = handshake_view(dep, dep.prefill)["gate"]["prompt_digests"]
        assert after["num_mismatched"] == before["num_mismatched"] + 1
        assert after["num_matched"] == before["num_matched"] + 1          # the normal pair: digest sent, matched
        assert after["num_absent"] == before["num_absent"]
        dep.wait_clean()


def arm_for_new_room(dep: PDDeployment, fault: str) -> tuple[int, int]:
    """A new room with `fault` armed for it on decode, and how often the fault had fired before."""
    from sglang_pd.harness.deployment_requests import new_bootstrap_room

    room, before = new_bootstrap_room(), decode_fired(dep, fault)
    dep.arm_faults(dep.decodes[0], **{f"{fault}_room": room})
    return room, before


def kv_digest_on(dep: PDDeployment) -> bool:
    """Whether the pair checks transferred KV against prefill's digest (SGLANG_PD_KV_DIGEST resolved)."""
    return all(dep.scheduler_state(s)["handshake"]["kv_digest"]["on"] for s in (dep.prefill, dep.decodes[0]))


def assert_caught_by_the_kv_digest(dep: PDDeployment, plain_url: str, prompt: list[int], room: int, fault: str,
                                   fired: int, cached_prefix: bool = False) -> None:
    """The request in `room` (its fault armed) fails on decode with the digest mismatch named, counted once;
    its pages are not cached: the same prompt again reuses no more than the prefix cached before
    (`cached_prefix`: a primed prefix may stay) and its output equals plain."""
    counters = lambda: dep.scheduler_state(dep.decodes[0])["counters"]  # noqa: E731
    before = counters()["kv_digest_mismatches_total"]
    _, decode_resp, _ = dep.post_generate_pd(prompt, NEW_TOKENS, room=room)
    assert decode_fired(dep, fault) == fired + 1
    assert decode_resp.status_code == 500 and f"KV digest mismatch for room {room}" in decode_resp.text, \
        (decode_resp.status_code, decode_resp.text[:400])
    assert counters()["kv_digest_mismatches_total"] == before + 1
    dep.wait_clean()
    _, again, _ = dep.generate_pd(prompt, NEW_TOKENS)
    reused = again["meta_info"]["decode_prefix_len"]
    assert reused < len(prompt) - dep.config.page_size if cached_prefix else reused == 0, reused
    assert_same(again, dep.generate(plain_url, prompt, NEW_TOKENS), "the caught prompt again")


def decode_fired(dep: PDDeployment, fault: str) -> int:
    """How often test fault `fault` fired on decode."""
    return dep.scheduler_state(dep.decodes[0])["faults"]["fired"].get(fault, 0)


class TestMooncakeTcp(CorrectnessSuite):
    @pytest.fixture(params=[1, 16], ids=["page1", "page16"])
    def dep(self, request) -> PDDeployment:
        return request.getfixturevalue(f"pd_page{request.param}")


def test_a_prefill_half_aborted_while_its_mooncake_write_is_under_way_tells_decode_after_it(pd_page16: PDDeployment,
                                                                                           plain_url: str):
    """Mooncake: prefill's worker has taken the room's chunk and its send starts late (test fault, 5 s), so
    the write into decode's pages is still to land when prefill aborts the request and SGLang clears the
    sender. Decode is not told then (it would free the pages the write lands in): it still waits, locked,
    1.5 s later; it is told once the write is done, and releases once."""
    dep = pd_page16
    fired = lambda state: state["faults"]["fired"].get("prefill_send_delay", 0)  # noqa: E731
    aborted = abort_prefill_half_mid_transfer(
        dep, random.Random(35), 40, "prefill_send_delay_room",
        lambda room, before: fired(dep.scheduler_state(dep.prefill)) == fired(before) + 1)  # its send under way
    aborted["decode_half"]["thread"].join(60)
    assert "resp" in aborted["decode_half"] and aborted["decode_half"]["resp"].status_code >= 400, aborted
    assert_told_once_and_serving(dep, plain_url, aborted)


def abort_prefill_half_mid_transfer(dep: PDDeployment, rng: random.Random, suffix_len: int, fault_key: str,
                                    in_flight) -> dict:
    """Prime a prefix on decode, send both halves of a request extending it with `fault_key` armed for its
    room, wait until `in_flight(room, before)` (the state under test: the room's write in flight on prefill)
    with decode's lock held, abort the prefill half, and check that 1.5 s later decode still waits, locked,
    its tell held on prefill. Returns what the caller's further checks need."""
    from lock_checks import assert_lock_held, in_background, wait_for_plan, wait_until

    primed = _tokens(rng, 32)
    dep.generate_pd(primed, NEW_TOKENS)  # decode holds this prefix: the victim locks it
    prompt = primed + _tokens(rng, suffix_len)
    pairing = dep.pairing()
    room = pairing["bootstrap_room"]
    rid = f"aborted-mid-transfer-{room}"
    before = dep.scheduler_state(dep.prefill)
    dep.arm_faults(dep.prefill, **{fault_key: room})
    halves = [in_background(dep.post_generate, url, prompt, NEW_TOKENS, 120, dep.headers, rid=rid, **pairing)
              for url in (dep.prefill.url, dep.decodes[0].url)]
    plan = wait_for_plan(dep, rid)
    wait_until(lambda: in_flight(room, before), "the room's write in flight on prefill", 30, 0.05)
    assert_lock_held(dep, rid)
    dep.abort(dep.prefill, rid)
    halves[0]["thread"].join(30)  # answered after SGLang failed and cleared its sender
    assert "resp" in halves[0] and halves[0]["resp"].status_code >= 400, halves[0]
    time.sleep(1.5)  # housekeeping ran at least once meanwhile (1 s): the write still in flight, so...
    assert halves[1]["thread"].is_alive(), halves[1]  # ...decode not told: it still waits, locked
    assert_lock_held(dep, rid)
    held = dep.scheduler_state(dep.prefill)
    assert _counter(held, "prefill_failure_tells_held_total") == _counter(before, "prefill_failure_tells_held_total") + 1
    return {"decode_half": halves[1], "before": before, "held": held, "plan": plan, "rid": rid, "prompt": prompt}


def assert_told_once_and_serving(dep: PDDeployment, plain_url: str, aborted: dict) -> None:
    """After decode answered: prefill counted one tell, the lock was released once, the pair serves on."""
    from lock_checks import assert_released_once

    before, after = aborted["before"], dep.scheduler_state(dep.prefill)
    tells = {k: (_counter(before, k), _counter(after, k)) for k in ("prefill_failures_told_total",
             "prefill_failure_tells_held_total", "prefill_failure_tells_dropped_total")}
    assert _counter(after, "prefill_failures_told_total") == _counter(before, "prefill_failures_told_total") + 1, tells
    assert _counter(after, "prefill_failure_tells_dropped_total") == \
        _counter(before, "prefill_failure_tells_dropped_total"), tells
    assert_released_once(dep.wait_clean(), aborted["rid"], aborted["plan"]["decode_prefix_len"])
    prompt = aborted["prompt"]
    assert dep.generate_pd(prompt, NEW_TOKENS)[1]["output_ids"] == \
        dep.generate(plain_url, prompt, NEW_TOKENS)["output_ids"]  # the pair serves on
    dep.wait_clean()


def _counter(state: dict, name: str) -> float:
    return state["counters"].get(name, 0)


class TestNixlHostMemory(CorrectnessSuite):
    @pytest.fixture
    def dep(self, pd_nixl) -> PDDeployment:
        return pd_nixl

    def test_stalled_transfer_fails_in_bounded_time_and_releases(self, dep: PDDeployment, plain_url: str):
        """Stall bound above upstream's 5 s settle window: decode is told (it used not to be)."""
        from conftest import NIXL_STALL_S

        assert_stall_cancelled_and_decode_told(dep, plain_url, NIXL_STALL_S)


    def test_a_prefill_half_aborted_during_its_transfer_tells_decode_only_once_the_writes_settled(
            self, dep: PDDeployment, plain_url: str):
        """An abort on prefill while the room's NIXL transfer is in flight (held there by the stall fault):
        SGLang clears the sender at once, and telling decode then would let it free pages a write may still
        land in. The tell is held (counted) while the transfer is in flight; decode keeps waiting, its lock
        held, until the stall bound cancels the transfer; then it is told, with the abort's reason, and
        releases once."""
        from conftest import NIXL_STALL_S

        stalls = lambda state: state["prefill_transfer"]["num_nixl_stalls"]  # noqa: E731
        in_transfer = lambda room, before: room in dep.scheduler_state(dep.prefill)["handshake"]["rooms"][  # noqa: E731
            "by_status"].get("3", [])  # KVPoll.Transferring
        aborted = abort_prefill_half_mid_transfer(dep, random.Random(34), 8, "nixl_stall_room", in_transfer)
        assert stalls(aborted["held"]) == stalls(aborted["before"])  # the stall not cancelled yet
        decode_half = aborted["decode_half"]
        decode_half["thread"].join(NIXL_STALL_S + 30)
        told_at = dep.scheduler_state(dep.prefill)
        assert "resp" in decode_half, decode_half
        resp = decode_half["resp"]
        assert resp.status_code >= 400 and "prefill's request failed: Aborted by AbortReq." in resp.text, resp.text
        assert stalls(told_at) == stalls(aborted["before"]) + 1  # told after the stall was cancelled
        assert _counter(told_at, "nixl_uncancellable_stalls_total") == 0  # cancelled: nothing writes any more
        assert_told_once_and_serving(dep, plain_url, aborted)


def assert_stall_cancelled_and_decode_told(dep: PDDeployment, plain_url: str, stall_s: float) -> None:
    """A NIXL transfer that never reports done is cancelled past the bound; only then is the room
    failed; decode hears it within the bound (plus scheduling slack) and releases lock and pages."""
    import time

    from sglang_pd.harness.deployment_requests import new_bootstrap_room

    rng = random.Random(33)
    primed = _tokens(rng, 32)
    dep.generate_pd(primed, NEW_TOKENS)  # decode holds this prefix: the stalled request locks it
    prompt = primed + _tokens(rng, 8)
    room = new_bootstrap_room()
    stalls0 = dep.scheduler_state(dep.prefill)["prefill_transfer"]["num_nixl_stalls"]
    dep.arm_faults(dep.prefill, nixl_stall_room=room)
    start = time.monotonic()
    _, decoded, _ = dep.post_generate_pd(prompt, NEW_TOKENS, room=room, timeout=stall_s + 120,
                                         rid=f"stall-{room}")
    elapsed = time.monotonic() - start
    assert decoded.status_code >= 400, decoded.text
    assert elapsed < stall_s + 20, f"decode heard of the stalled room after {elapsed:.1f} s (bound {stall_s} s)"
    prefill = dep.scheduler_state(dep.prefill)
    assert prefill["prefill_transfer"]["num_nixl_stalls"] == stalls0 + 1
    assert prefill["counters"]["nixl_uncancellable_stalls_total"] == 0
    reports = dep.wait_clean()
    released = [r for r in reports["decode0"]["lock_ledger"]["recent_releases"] if r["owner"] == f"stall-{room}"]
    assert released and released[-1]["num_tokens"] == len(primed), "its prefix lock was held, then released"
    assert dep.generate_pd(prompt, NEW_TOKENS)[1]["output_ids"] == \
        dep.generate(plain_url, prompt, NEW_TOKENS)["output_ids"]
    dep.wait_clean()


def test_router_serves_same_outputs(pd_page1: PDDeployment, plain_url: str):
    for ids in _prompts(seed=7)[:8]:
        routed = pd_page1.generate(pd_page1.router.url, ids, NEW_TOKENS)
        assert routed["output_ids"] == pd_page1.generate(plain_url, ids, NEW_TOKENS)["output_ids"]


def test_every_transferred_request_is_checked_against_prefills_kv_digest_with_a_secret(pd_page1, pd_page16, pd_nixl,
                                                                                       plain_url: str):
    """SGLANG_PD_KV_DIGEST=auto: on with a secret (pd_page16 mooncake, pd_nixl), off without (pd_page1). On,
    each PD request's KV is digested by prefill and checked by decode before use (counted on both sides,
    nothing missing or mismatched) and the outputs equal plain; off, neither side counts one."""
    rng = random.Random(4401)
    for dep, on in ((pd_page16, True), (pd_nixl, True), (pd_page1, False)):
        assert kv_digest_on(dep) is on, dep.config
        names = ("kv_digests_sent_total", "kv_digests_checked_total", "kv_digest_mismatches_total",
                 "kv_digests_missing_total")
        before = [dep.scheduler_state(s)["counters"] for s in (dep.prefill, dep.decodes[0])]
        for _ in range(3):
            prompt = _tokens(rng, 50)
            assert_same(dep.generate_pd(prompt, NEW_TOKENS)[1], dep.generate(plain_url, prompt, NEW_TOKENS), "digest")
        after = [dep.scheduler_state(s)["counters"] for s in (dep.prefill, dep.decodes[0])]
        sent, checked, mismatched, missing = (after[0][names[0]] - before[0][names[0]],
                                              *(after[1][n] - before[1][n] for n in names[1:]))
        assert (sent, checked, mismatched, missing) == ((3, 3, 0, 0) if on else (0, 0, 0, 0)), dep.config
        dep.wait_clean()


def test_plugin_active_on_both_servers(pd_page1: PDDeployment):
    for server, role in ((pd_page1.prefill, "prefill"), (pd_page1.decodes[0], "decode")):
        info = pd_page1.get_json(server.url, "/sglang_pd/info")
        assert info["role"] == role and info["sglang_version"] == "0.5.23"
        assert "BEFORE sglang.srt.entrypoints.http_server.launch_server" in info["http_hooks"]
        assert any("finalize_bootstrap" in h for h in info["scheduler_hooks"][0])
    pd_page1.check_alive()


def test_on_cpu_every_server_starts_its_children_from_a_forkserver_and_they_run_our_hooks(pd_page1: PDDeployment):
    """SGLANG_PD_CPU_FORKSERVER (default on, srt/processes/start_method.py): on each server (prefill, decode,
    plain) the scheduler and the detokenizer are children of one forkserver process, itself a child of the
    server, not spawned by the server; /sglang_pd/info says so; and each child loaded the plugin for its own kind
    (the scheduler's hooks are the scheduler rows of the table, not the HTTP process's)."""
    from sglang_pd.harness.server import descendants
    from sglang_pd.srt.hooks.table import hooks_for
    from sglang_pd.srt.state import ProcessKind

    scheduler_rows = {f"{spec.hook_type} {spec.target}" for spec in hooks_for(ProcessKind.SCHEDULER)}
    for server in (pd_page1.prefill, pd_page1.decodes[0], pd_page1.plain):
        info = pd_page1.get_json(server.url, "/sglang_pd/info")
        assert info["process_start"]["method"] == "forkserver", (server.name, info["process_start"])
        tree = descendants(server.proc.pid)
        forkservers = [e for e in tree if "multiprocessing.forkserver" in e.cmdline]
        assert len(forkservers) == 1 and forkservers[0].ppid == server.proc.pid, (server.name, tree)
        children = {e.comm: e.ppid for e in tree if e.comm.startswith("sglang::")}  # comm: 15 characters
        assert children == {"sglang::schedul": forkservers[0].pid, "sglang::detoken": forkservers[0].pid}, \
            (server.name, tree)
        assert scheduler_rows <= set(info["scheduler_hooks"][0]), server.name
        assert not any("http_server" in hook for hook in info["scheduler_hooks"][0]), server.name


@pytest.mark.parametrize("bad, named", [(VOCAB_SIZE, f"input_ids[2] = {VOCAB_SIZE} is outside this model's vocabulary"),
                                        (-1, "input_ids[2] = -1 is outside this model's vocabulary"),
                                        (2.5, "input_ids[2] = 2.5 is not an integer token id")])
def test_a_prompt_token_outside_the_vocabulary_is_refused_and_every_server_keeps_serving(pd_page1: PDDeployment,
                                                                                       bad, named):
    """Upstream's scheduler dies at the embedding lookup on such an id (the whole server with it): the
    plain server and both halves of a PD pair answer HTTP 400 naming the id and the range, stay up, leak
    nothing, and then serve a normal request whose outputs equal plain's."""
    dep, rng = pd_page1, random.Random(404)
    servers = (dep.plain, dep.prefill, dep.decodes[0])
    assert all(s.is_running() for s in servers)
    ids = _tokens(rng, 2) + [bad] + _tokens(rng, 20)
    plain = dep.post_generate(dep.plain.url, ids, NEW_TOKENS)
    pre, dec, _ = dep.post_generate_pd(ids, NEW_TOKENS)
    for name, resp in (("plain", plain), ("prefill", pre), ("decode", dec)):
        assert resp.status_code == 400, (name, resp.status_code, resp.text[:300])
        assert named in resp.text and f"[0, {VOCAB_SIZE})" in resp.text or "not an integer" in named, (name, resp.text)
    assert all(s.is_running() for s in servers)
    good = _tokens(rng, 30)
    _, decoded, _ = dep.generate_pd(good, NEW_TOKENS)
    assert decoded["output_ids"] == dep.generate(dep.plain.url, good, NEW_TOKENS)["output_ids"]
    dep.wait_clean()


def test_a_refusal_reaches_the_client_through_the_router_streamed_or_not(pd_page1: PDDeployment):
    """A token outside the vocabulary sent through the stock sglang-router in PD mode: not streamed, HTTP 400
    naming the id; streamed, HTTP 200 (SGLang commits the stream before the request is read) whose first event
    is the error with code 400 and the same message, then [DONE]: the client learns why, no output token is
    sent, and the pair keeps serving (scripts/probes/security/router_errors/probe.py records all four ways)."""
    dep = pd_page1
    bad = [5, 6, VOCAB_SIZE + 7, 8]
    named = f"input_ids[2] = {VOCAB_SIZE + 7} is outside this model's vocabulary [0, {VOCAB_SIZE})"
    sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0}
    flat = requests.post(dep.router.url + "/generate", json={"input_ids": bad, "sampling_params": sampling},
                         timeout=120)
    assert flat.status_code == 400 and named in flat.text, (flat.status_code, flat.text[:300])
    streamed = requests.post(dep.router.url + "/generate", timeout=120,
                             json={"input_ids": bad, "sampling_params": sampling, "stream": True})
    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert streamed.status_code == 200 and events[-1] == "[DONE]", (streamed.status_code, streamed.text[:300])
    error = json.loads(events[0])["error"]
    assert error["code"] == 400 and named in error["message"] and len(events) == 2, events
    assert dep.generate(dep.router.url, [5, 6, 7, 8], NEW_TOKENS)["output_ids"]
    dep.wait_clean()


def test_a_malformed_pairing_or_top_logprobs_is_refused_and_both_servers_keep_serving(pd_page1: PDDeployment):
    """Each request below ends upstream's scheduler (decode: a room without a host dies in
    `_bootstrap_addr`; prefill: top_logprobs_num above the vocabulary dies in torch.topk, a
    logprob_start_len below -1 in an assertion after the forward), stalls its HTTP process (n = 10**6
    copies; a batch multiplying n), gets a 500 that names nothing (a stop_regex that does not compile, a
    list rid for one prompt) or carries a field no peer can use; a stop token id outside the vocabulary
    and a top_k above int32 pass SGLang's checks and end the scheduler later. Each is answered with HTTP 400 naming the field, by the
    server it was sent to; both stay up, leak nothing, and then serve a normal pair whose outputs equal
    plain's."""
    dep, rng = pd_page1, random.Random(405)
    ids = _tokens(rng, 24)
    sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    decode_only = [({"bootstrap_room": 12345}, "bootstrap_host is required on a decode server"),
                   ({"bootstrap_room": 12345, "bootstrap_host": "\x00;x", "bootstrap_port": 8998},
                    "is not a host name or IP address"),
                   ({"bootstrap_room": 12345, "bootstrap_host": "127.0.0.1", "bootstrap_port": 70000},
                    "bootstrap_port 70000 must be an integer in [1, 65535]")]
    paired = [({"bootstrap_room": -5}, "bootstrap_room -5 must be an integer"),
              ({"bootstrap_room": 2 ** 63}, "bootstrap_room"),  # ours or pydantic's parse error: both name it
              ({"return_logprob": True, "top_logprobs_num": 10 ** 6},
               f"top_logprobs_num 1000000 must be an integer in [0, {VOCAB_SIZE}]"),
              ({"return_logprob": True, "logprob_start_len": -7}, "logprob_start_len -7 must be an integer >= -1"),
              ({"sampling_params": {**sampling, "n": 10 ** 6}},
               "sampling_params.n 1000000 must be an integer in [1, 128]"),
              # upstream answers these two with HTTP 500 (re.error, TypeError) without naming the field
              ({"sampling_params": {**sampling, "stop_regex": "(("}},
               "sampling_params.stop_regex '((' is not a valid regular expression"),
              ({"rid": ["a", "b"]}, "rid ['a', 'b'] must be a string for a single prompt"),
              # accepted by SGLang's checks, then the scheduler raises on them (penalizer mask, int32 tensors)
              ({"sampling_params": {**sampling, "min_new_tokens": 1, "stop_token_ids": [10 ** 8]}},
               f"sampling_params.stop_token_ids[0] = 100000000 must be a token id in [0, {VOCAB_SIZE})"),
              ({"sampling_params": {**sampling, "top_k": 2 ** 40}}, "sampling_params.top_k 1099511627776 is above"),
              # a batch multiplies n: three prompts x 64 copies
              ({"input_ids": [ids] * 3, "sampling_params": {**sampling, "n": 64}},
               "sampling_params.n asks for 192 copies of this request's 3 prompt(s), more than 128")]
    servers = (dep.prefill, dep.decodes[0])
    assert all(s.is_running() for s in servers)
    for extra, named in decode_only:
        resp = requests.post(dep.decodes[0].url + "/generate", timeout=60,
                             json={"input_ids": ids, "sampling_params": sampling, **extra})
        assert resp.status_code == 400 and named in resp.text, (extra, resp.status_code, resp.text[:300])
    for extra, named in paired:
        body = {"input_ids": ids, "sampling_params": sampling, **dep.pairing(), **extra}
        for server in servers:
            resp = requests.post(server.url + "/generate", json=body, timeout=60)
            assert resp.status_code == 400 and named in resp.text, (server.name, extra, resp.text[:300])
    assert all(s.is_running() for s in servers)
    _, decoded, _ = dep.generate_pd(ids, NEW_TOKENS)
    assert decoded["output_ids"] == dep.generate(dep.plain.url, ids, NEW_TOKENS)["output_ids"]
    dep.wait_clean()
