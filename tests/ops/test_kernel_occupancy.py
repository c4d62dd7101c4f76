"""The Triton kernels keep a GPU busy: occupancy, spills and barrier phases from the compiled
kernels, no GPU needed.

The launchers plan the bf16 training step of InLine-DeiT-T's layer (batch 128), Swin-T's first
stage at windows of 7 (4,096 windows) and a 14 x 14 map (batch 256), with the streaming and with
the resident core kernels; every kernel they choose is compiled for sm_80 / 86 / 89 / 90 through
the ``ptxas`` in triton's wheel, the resident ones for sm_90 (``python -m tools.kernel_audit
--occupancy``, in a subprocess: this process interprets). Resident warps per multiprocessor follow
from the registers (65,536 per SM, allocated per warp in units of 256), the warps per program, the
shared memory and the target's limits; barriers per program from the SASS (``nvdisasm``) and the
TTGIR's loops (:mod:`tools.kernel_phases`).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90")

REPO = pathlib.Path(__file__).resolve().parents[2]  # `python -m tools.kernel_audit` runs from the repository root


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("occupancy")
    env = dict(os.environ, TRITON_INTERPRET="0")
    cmd = [sys.executable, "-m", "tools.kernel_audit", "--occupancy", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    print(proc.stdout[-4000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "occupancy.json").read_text())


def test_one_streaming_kernel_each_way_and_the_predictors_three_at_every_shape(rows):
    # the predictor's backward runs over chunks of samples at these batches, merged by a second launch
    predictor = ["predictor_bwd", "predictor_bwd_merge", "predictor_fwd"]
    for target in TARGETS:
        for shape in ("DeiT-T", "Swin 7x7", "14x14"):
            here = [r for r in rows if r["target"] == target and r["shape"] == shape]
            kernels = sorted(r["kernel"] for r in here if r["design"] in ("stream", "both"))
            assert kernels == ["inline_bwd_stream", "inline_fwd_stream", *predictor], kernels
            resident = sorted(r["kernel"] for r in here if r["design"] == "resident")
            expected = ["inline_bwd_resident", "inline_fwd_resident"] if target == "sm_90" else []
            assert resident == expected, (target, shape, resident)


def test_no_kernel_spills_on_any_target(rows):
    spilling = [(r["target"], r["shape"], r["kernel"], r["spills"]) for r in rows if r["spills"]]
    assert spilling == []
    assert {r["target"] for r in rows} == set(TARGETS)


def test_resident_warps_follow_registers_warps_and_shared_memory():
    from tools.kernel_audit import TARGETS as T
    from tools.kernel_audit import resident_warps

    sm90, sm86 = T[3], T[1]
    assert resident_warps(sm90, 80, 8, 10_240) == 24  # 80 * 32 * 8 = 20,480 registers a program: 3 fit
    assert resident_warps(sm90, 128, 8, 16_384) == 16
    assert resident_warps(sm90, 181, 8, 0) == 8  # 184 allocated: 47,104 a program
    assert resident_warps(sm86, 32, 8, 0) == 48  # the target's 48 warps bound it
    assert resident_warps(sm90, 32, 4, 100_000) == 8  # shared memory: two programs


# Barriers one program of each core kernel executes at InLine-DeiT-T's layer on sm_90 (B 128, 197
# tokens, 6 heads of 32): the kernels' counts (115, 281, 18, 38; the streaming ones at their
# 16-row tiles) rounded up by about 10 %. Each barrier is a serial phase of the program
# (docs/benchmarks.md, "What predicts the kernels' GPU time without a GPU?"): a kernel change that
# adds phases must raise its bound on purpose.
BARRIER_BOUNDS = {
    "inline_fwd_stream": 127,
    "inline_bwd_stream": 310,
    "inline_fwd_resident": 20,
    "inline_bwd_resident": 42,
}


# The predictor's serial chains, the same way: the forward at DeiT-T's layer (29: its token loop has
# none), the backward's sample blocks at DeiT-T's layer (one block a chunk: 32) and at Swin's 4,096
# windows of 7 x 7 (eight blocks a chunk: 235), each chunk one program.
PREDICTOR_BARRIER_BOUNDS = {
    ("predictor_fwd", "DeiT-T"): 32,
    ("predictor_bwd", "DeiT-T"): 36,
    ("predictor_bwd", "Swin 7x7"): 260,
}


def test_predictor_barriers_per_program_on_sm_90(rows):
    for (kernel, shape), bound in PREDICTOR_BARRIER_BOUNDS.items():
        (r,) = [r for r in rows if r["target"] == "sm_90" and r["shape"] == shape and r["kernel"] == kernel]
        assert r["barriers"] is not None and r["barriers"] <= bound, (
            kernel,
            shape,
            r["barriers"],
            r["barrier_rule"],
            bound,
        )


def test_core_kernels_barriers_per_program_at_deit_t_on_sm_90(rows):
    core = {r["kernel"]: r for r in rows if r["target"] == "sm_90" and r["shape"] == "DeiT-T" and r["design"] != "both"}
    assert sorted(core) == sorted(BARRIER_BOUNDS)
    for kernel, bound in BARRIER_BOUNDS.items():
        r = core[kernel]
        assert r["barriers"] is not None and r["barriers"] <= bound, (
            f"{kernel} at DeiT-T's layer (B 128, 197 tokens, 6 heads of 32, bf16, sm_90): "
            f"{r['barriers']} barriers per program ({r['barrier_rule']}), bound {bound}"
        )


def test_every_kernel_has_a_barrier_count_and_its_phase_waves(rows):
    unmatched = [(r["target"], r["shape"], r["kernel"], r.get("phases_error")) for r in rows if r["barriers"] is None]
    assert unmatched == []
    for r in rows:
        waves = r["programs"] / (r["programs_per_sm"] * T_SMS[r["target"]])
        assert r["waves"] == round(waves, 2) and r["phase_waves"] == r["barriers"] * math.ceil(waves), r


T_SMS = {"sm_80": 108, "sm_86": 82, "sm_89": 128, "sm_90": 132}

# A made-up listing in nvdisasm's form: 3 barriers outside loops, a loop (1 barrier of its own)
# holding a loop of 2 barriers, an arrive-only barrier (no wait: not counted), a trap branching to
# itself (no loop); and its TTGIR: the outer loop over tokens in tiles of 32 (its bound the third
# element of the launch's tuple argument, the second a specialised constant), the inner over the
# taps' 3 rows, and a 9-trip loop LLVM unrolled (no SASS loop).
LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_0:
        /*0020*/                   LDS R2, [R1] ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_1:
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/               @P0 BRA `(.L_x_1) ;
        /*0070*/                   BAR.ARV 0x1, 0x40 ;
        /*0080*/              @!P1 BRA `(.L_x_0) ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00b0*/                   EXIT ;
.L_x_2:
        /*00c0*/                   BRA `(.L_x_2);
"""
TTGIR = (
    '  tt.func public @k(%X: !tt.ptr<bf16> {tt.divisibility = 16 : i32} loc("X"(#loc)), '
    '%geo: i32 loc("geo"(#loc)), %geo_0: i32 loc("geo"(#loc))) attributes {noinline = false} {'
    """
    %c0_i32 = arith.constant 0 : i32 loc(#loc1)
    %c1_i32 = arith.constant 1 : i32 loc(#loc1)
    %c3_i32 = arith.constant 3 : i32 loc(#loc1)
    %c9_i32 = arith.constant 9 : i32 loc(#loc1)
    %c32_i32 = arith.constant 32 : i32 loc(#loc1)
    %a = scf.for %i = %c0_i32 to %geo_0 step %c32_i32 iter_args(%x = %c0_i32) -> (i32)  : i32 {
      %b = scf.for %j = %c0_i32 to %c3_i32 step %c1_i32 iter_args(%y = %x) -> (i32)  : i32 {
        scf.yield %y : i32 loc(#loc2)
      } loc(#loc2)
      scf.yield %b : i32 loc(#loc3)
    } loc(#loc3)
    scf.for %k = %c0_i32 to %c9_i32 step %c1_i32  : i32 {
    } loc(#loc4)
    tt.return loc(#loc5)
  } loc(#loc)
"""
)
SIGNATURE = {"X": "*bf16", "geo": ("i32", "constexpr", "i32"), "BLOCK": "constexpr"}


def test_barriers_per_program_from_a_listing_straight_line_loop_and_nested_constant_loop():
    from tools import kernel_phases

    structure = kernel_phases.barrier_structure(LISTING, TTGIR, kernel_phases.parameter_paths(SIGNATURE))
    assert structure["straight"] == 3
    (outer,) = structure["loops"]
    assert (outer["barriers"], outer["lo"], outer["hi"], outer["step"]) == (1, 0, [1, 2], 32)
    (inner,) = outer["loops"]
    assert (inner["barriers"], inner["hi"], inner["step"], inner["loops"]) == (2, 3, 1, [])
    args = ("bfloat16", (5, 1, 197))  # 197 tokens: 7 tiles of 32
    assert kernel_phases.barriers_per_program(structure, args) == 3 + 7 * (1 + 3 * 2)
    assert kernel_phases.describe(structure) == "3 + ceil(geo_0 / 32) x (1 + 3 x 2)"
    assert kernel_phases.phase_waves(52, kernel_phases.waves(768, 3, 132)) == 52 * 2


def test_sass_loops_the_ttgir_cannot_account_for_are_an_error():
    from tools import kernel_phases

    no_loops = "\n".join(line for line in TTGIR.splitlines() if "scf.for" not in line)
    with pytest.raises(kernel_phases.PhaseError, match="1 SASS loops against 0 scf.for loops"):
        kernel_phases.barrier_structure(LISTING, no_loops, kernel_phases.parameter_paths(SIGNATURE))


def test_a_loop_ptxas_split_in_two_counts_nothing_when_neither_part_has_a_barrier():
    # ptxas may run a loop as an unrolled body and a remainder loop: two SASS loops for one
    # scf.for. Without a barrier in either, the kernel's barriers are its straight-line ones.
    from tools import kernel_phases

    listing = """
        /*0000*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_0:
        /*0010*/                   LDG.E R2, [R4.64] ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0030*/                   LDG.E R3, [R4.64] ;
        /*0040*/               @P1 BRA `(.L_x_1) ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/                   EXIT ;
"""
    one_loop = "\n".join(line for line in TTGIR.splitlines() if "%j = " not in line and "%k = " not in line)
    structure = kernel_phases.barrier_structure(listing, one_loop, kernel_phases.parameter_paths(SIGNATURE))
    assert structure == {"straight": 2, "loops": []}
    with_barrier = listing.replace("LDG.E R3, [R4.64]", "BAR.SYNC.DEFER_BLOCKING 0x0")
    with pytest.raises(kernel_phases.PhaseError, match="2 SASS loops against 1 scf.for loops"):
        kernel_phases.barrier_structure(with_barrier, one_loop, kernel_phases.parameter_paths(SIGNATURE))
