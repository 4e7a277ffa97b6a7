"""The Triton shared-prefix decode kernels (attention/triton_kernels.py) against torch and SGLang's own
Triton kernels, under Triton's interpreter on CPU.

The numerics run in a subprocess (triton_numerics.py beside this file) with TRITON_INTERPRET=1 in its
environment: the variable only counts before triton is imported, and another test module of this pytest
process may have imported it already. One run computes every case; each test asserts on its figures
(printed with -s). float32 cases: max |diff| <= 1e-5 against a float64 torch reference, SGLang's
`decode_attention_fwd` on the same pool and whole rows, and the CPU implementation on the same plan;
bf16 pool: <= 3e-2 against the float64 reference (the bf16 output's own rounding, ~2^-8 of values up to ~4).
The backend cases run SGLang's decode (and one MIXED: a unit check only, 0.5.23's eager runner hands
MIXED batches to backends as EXTEND) forwards through the sglang_pd_shared_prefix backend
built with these kernels (what a CUDA device gets; one built by the factory for a runner that says cuda)
against SGLang's TorchNativeAttnBackend, on real SGLang pools: the backend's code path with the Triton
kernels, on CPU tensors.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DRIVER = Path(__file__).with_name("triton_numerics.py")
FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 3e-2
DECODE_CASES = {  # case -> shared segments the grouping must find (else the case tests nothing)
    "page1_mha": 1, "page16_prefix_at_boundary_gqa": 1, "page16_prefix_mid_page_gqa": 1,
    "page64_prefix_mid_page_mha": 1, "page64_prefix_at_boundary_gqa": 1, "groups_of_one": 0,
    "nested_page16_gqa": 2, "inside_another_page1_gqa": 2}


@pytest.fixture(scope="module")
def figures() -> dict:
    """Every case's figures from one interpreter run of the driver."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3] / "python"),
                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(DRIVER)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    print(json.dumps(result, indent=1))
    return result


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_decode_case_fp32(figures, case):
    found = figures[case]
    assert found["segments"] == DECODE_CASES[case]
    for reference in ("vs_torch", "vs_sglang_decode", "vs_cpu_path"):
        assert found[reference] <= FP32_TOLERANCE, (reference, found)


def test_bf16_pool(figures):
    found = figures["bf16_page16_mid_page_gqa"]
    assert found["segments"] == 1 and found["vs_torch"] <= BF16_TOLERANCE


def test_segment_of_one_member(figures):
    found = figures["segment_of_one"]
    assert found["vs_torch"] <= FP32_TOLERANCE and found["lse_vs_torch"] <= FP32_TOLERANCE


def test_empty_own_part(figures):
    found = figures["empty_own"]
    assert found["empty_is_zero_and_neg_inf"]
    assert found["merged_vs_segment"] <= FP32_TOLERANCE and found["lse_vs_segment"] <= FP32_TOLERANCE


def test_merge_against_sglang_merge_state(figures):
    found = figures["merge_vs_sglang_merge_state"]
    assert found["out"] <= FP32_TOLERANCE and found["lse"] <= FP32_TOLERANCE


BACKEND_CASES = ["backend_one_group_gqa_page16", "backend_several_groups_gqa_page16", "backend_mid_page_gqa_page64",
                 "backend_inside_prefix_mha_page1", "backend_no_sharing_gqa_page16", "backend_created_for_cuda"]


@pytest.mark.parametrize("case", BACKEND_CASES)
def test_backend_decode_forward_through_the_triton_kernels_equals_torch_native(figures, case):
    found = figures[case]
    assert found["kernels"] == "triton"
    assert found["groups"] == found["expected_groups"]  # the grouping the scenario is about, or it tests nothing
    assert found["vs_torch_native"] <= FP32_TOLERANCE


def test_backend_mixed_forward_through_the_triton_kernels_equals_torch_native(figures):
    found = figures["backend_mixed_forward"]
    assert found["kernels"] == "triton" and found["decode_rows"] == 2 and found["groups"] == 1
    assert found["vs_torch_native"] <= FP32_TOLERANCE
