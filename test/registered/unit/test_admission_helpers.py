"""Admission's pieces taken out of the DecodePreallocQueue hooks: the round's candidates, the new room of a
locally served request's rebootstrap, the headroom of a mixed extend's running requests, and the test
faults that bend the hand-off. Real SGLang requests; queue entries are bare records of the three fields
SGLang's DecodeRequest carries for the loop."""

from types import SimpleNamespace

import pytest

from conftest import make_req
from sglang_pd.srt.admission import round_candidates
from sglang_pd.srt.admission.headroom import need_space_for_single_req, retractable_tokens
from sglang_pd.srt.admission import mark_declined, needs_new_room, renew_room
from sglang_pd.srt.fault_injection import Fault, FaultPlan, HandoffBend
from sglang_pd.srt.metrics import PDCounters

pytestmark = pytest.mark.unit


def _entry(rid, waiting=True, rebootstrap=False):
    return SimpleNamespace(req=make_req(rid, [1, 2, 3]), waiting_for_input=waiting, is_rebootstrap=rebootstrap)


def test_candidates_start_at_the_first_request_and_skip_what_the_loop_skips():
    entries = [_entry("before"), _entry("first"), _entry("bootstrapping", waiting=False),
               _entry("rebootstrap", rebootstrap=True), _entry("aborted"), _entry("next"), _entry("last")]
    aborted = entries[4].req
    got = round_candidates(entries, entries[1].req, 10, lambda req: req is aborted)
    assert [r.rid for r in got] == ["first", "next", "last"]


def test_candidates_stop_at_the_free_rows():
    entries = [_entry(f"r{i}") for i in range(5)]
    assert [r.rid for r in round_candidates(entries, entries[0].req, 2, lambda req: False)] == ["r0", "r1"]
    assert round_candidates(entries, make_req("absent", [1]), 5, lambda req: False) == []


def test_a_declined_request_rebootstraps_in_a_new_room_nobody_holds():
    req = make_req("local", [1, 2, 3])
    req.bootstrap_room = 7
    assert not needs_new_room(req, is_rebootstrap=True)  # never declined
    mark_declined(req, 7)
    assert not needs_new_room(req, is_rebootstrap=False) and needs_new_room(req, is_rebootstrap=True)
    draws = iter([7, 8, 9])  # its own room, then one in use, then a free one
    counters = PDCounters()
    assert renew_room(req, {8: "held"}, counters, randbits=lambda bits: next(draws)) == 7
    assert req.bootstrap_room == 9 and counters.get("local_prefill_rebootstrap_rooms_total") == 1
    assert not needs_new_room(req, is_rebootstrap=True)  # the new room was never declined


def _running(prompt_len, num_output, max_new_tokens):
    req = make_req(f"p{prompt_len}", list(range(1, prompt_len + 1)))
    req.output_ids.extend([5] * num_output)
    req.sampling_params.max_new_tokens = max_new_tokens
    return req


def test_headroom_is_the_neediest_running_request_less_what_retracts():
    running = [_running(10, 2, 100), _running(40, 5, 50)]
    assert retractable_tokens(running) == 12 + 45
    assert need_space_for_single_req(running, retractable_tokens(running), 4096) == (10 + 100) - 57  # most to go
    assert need_space_for_single_req(running, 0, 30) == 40 + 30  # max_new_tokens capped (CLIP_MAX_NEW_TOKEN)


def test_handoff_faults_bend_only_their_room_once():
    faults = FaultPlan(enabled=True)
    assert faults.bend_handoff(5, 32, 40, 3, 16) == HandoffBend(None, 0)
    faults.arm_room(Fault.PREFIX_UNALIGNED, 5)
    assert faults.bend_handoff(6, 32, 40, 3, 16) == HandoffBend(None, 0)
    assert faults.bend_handoff(5, 32, 40, 3, 16) == HandoffBend(33, 0)
    assert faults.bend_handoff(5, 32, 40, 3, 16) == HandoffBend(None, 0)
    faults.arm_room(Fault.PREFIX_EXCEEDS, 5)
    assert faults.bend_handoff(5, 32, 40, 3, 16) == HandoffBend(56, 0)
    faults.arm_room(Fault.PREFIX_PAGE_AHEAD, 5)
    assert faults.bend_handoff(5, 0, 40, 16, 16) == HandoffBend(None, 0)  # a page of slots or less: not taken
    assert faults.bend_handoff(5, 0, 40, 48, 16) == HandoffBend(16, 16)
