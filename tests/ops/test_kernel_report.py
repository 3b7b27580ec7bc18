"""Tests of benchmarks/kernel_report.py: the static report on the fused Triton kernels (registers, spills, MMA
instructions, matmul FLOPs per query–key pair against the FLOP model).

The TTGIR/ptxas/cuobjdump parsers are checked on handwritten text (no compiler needed). The real compile — every
kernel of the forward and of both backwards for sm_90 — runs in a subprocess without ``TRITON_INTERPRET``: other
test modules set it while importing the kernels, and a kernel is compiled or interpreted from the moment its
module is imported. That test is skipped only when Triton or its bundled ptxas/cuobjdump is missing, and it holds
the kernels to issue 18's contract: no spills, wgmma for every main-loop dot, the backward at its FLOP ideal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_report.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("kernel_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernel_report"] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


kr = _load_script()

# A trimmed TTGIR module in Triton 3.x's printed form: aliases first, a dot before any loop (blocked layout, FMA),
# a wgmma dot inside two nested loops next to a tt.reduce region and an scf.if/else, an mma.sync dot with an
# inline encoding in the outer loop, and a dot after the loops.
TTGIR = """\
#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [4, 8], warpsPerCTA = [8, 1], order = [1, 0]}>
#loc = loc("/x/triton_kernel.py":98:1)
#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], instrShape = [16, 64, 16]}>
#mma1 = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [2, 4], instrShape = [16, 8]}>
#shared = #ttg.nvmma_shared<{swizzlingByteWidth = 128, transposed = false, elementBitWidth = 16}>
#smem = #ttg.shared_memory
module attributes {"ttg.num-ctas" = 1 : i32, "ttg.num-warps" = 8 : i32, ttg.target = "cuda:90"} {
  tt.func public @k(%Q: !tt.ptr<bf16> {tt.divisibility = 16 : i32} loc("Q"(#loc))) attributes {noinline = false} {
    %pre = tt.dot %a, %b, %c, inputPrecision = ieee : tensor<16x32xf32, #ttg.dot_op<{opIdx = 0, parent = #blocked}>> * tensor<32x16xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked}>> -> tensor<16x16xf32, #blocked> loc(#loc1)
    %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %cst) -> (tensor<64x64xf32, #mma>)  : i32 {
      %inner = scf.for %j = %c0 to %n step %c1 iter_args(%y = %cst) -> (tensor<64x64xf32, #mma>)  : i32 {
        %s1_12 = ttng.warp_group_dot %q, %k, %cst {inputPrecision = 0 : i32, isAsync = true} : !ttg.memdesc<64x64xbf16, #shared, #smem> * !ttg.memdesc<64x32xbf16, #shared, #smem, mutable> -> tensor<64x32xf32, #mma> loc(#loc2)
        %s1_13:3 = ttng.warp_group_dot_wait %s1_12, %q, %k {pendings = 0 : i32} : tensor<64x32xf32, #mma>, !ttg.memdesc<64x64xbf16, #shared, #smem>, !ttg.memdesc<64x32xbf16, #shared, #smem, mutable> loc(#loc2)
        %m = "tt.reduce"(%s1_13) <{axis = 1 : i32}> ({
        ^bb0(%u: f32 loc(unknown), %w: f32 loc(unknown)):
          %mx = arith.maxnumf %u, %w : f32 loc(#loc3)
          tt.reduce.return %mx : f32 loc(#loc3)
        }) : (tensor<64x32xf32, #mma>) -> tensor<64xf32, #ttg.slice<{dim = 1, parent = #mma}>> loc(#loc3)
        scf.if %flag {
          tt.store %p, %v : tensor<64x!tt.ptr<f32>> loc(#loc4)
        } else {
          tt.store %p, %w : tensor<64x!tt.ptr<f32>> loc(#loc4)
        } loc(#loc4)
        scf.yield %s1_13#0 : tensor<64x32xf32, #mma> loc(#loc5)
      } loc(#loc5)
      %dv_7 = tt.dot %p2, %do, %acc, inputPrecision = tf32 : tensor<32x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [1, 8], instrShape = [16, 8]}>, kWidth = 2}>> * tensor<64x128xbf16, #ttg.dot_op<{opIdx = 1, parent = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [1, 8], instrShape = [16, 8]}>, kWidth = 2}>> -> tensor<32x128xf32, #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [1, 8], instrShape = [16, 8]}>> loc(#loc6)
      scf.yield %inner : tensor<64x64xf32, #mma> loc(#loc7)
    } loc(#loc7)
    %post = tt.dot %e, %f, %g, inputPrecision = tf32 : tensor<16x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma1, kWidth = 2}>> * tensor<64x16xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma1, kWidth = 2}>> -> tensor<16x16xf32, #mma1> loc(#loc8)
    tt.return loc(#loc9)
  } loc(#loc)
} loc(#loc)
"""  # noqa: E501 (real TTGIR lines are this long; the parser must read them whole)


def test_ttgir_dot_parser():
    dots = kr.parse_ttgir_dots(TTGIR)
    assert [d["result"] for d in dots] == ["%pre", "%s1_12", "%dv_7", "%post"]  # the _wait is no dot
    pre, s1, dv, post = dots

    assert (pre["op"], pre["m"], pre["n"], pre["k"]) == ("tt.dot", 16, 16, 32)
    assert (pre["in_loop"], pre["mma"], pre["mma_version"], pre["duplication"]) == (False, "fma", None, 1.0)

    # aliased wgmma encoding, two loops deep; 8 warps along M = 2 warpgroups = 128 rows for 64: done twice
    assert (s1["op"], s1["m"], s1["n"], s1["k"]) == ("ttng.warp_group_dot", 64, 32, 64)
    assert (s1["in_loop"], s1["loop_depth"], s1["mma"], s1["mma_version"]) == (True, 2, "wgmma", 3)
    assert s1["warps_per_cta"] == [8, 1] and s1["instr_shape"] == [16, 64, 16]
    assert s1["duplication"] == 2.0

    # inline mma.sync encoding; the reduce region and the if/else inside the inner loop did not end the outer loop
    assert (dv["m"], dv["n"], dv["k"], dv["loop_depth"], dv["mma"]) == (32, 128, 64, 1, "mma.sync")
    assert dv["warps_per_cta"] == [1, 8] and dv["duplication"] == 1.0  # 16·1 <= 32 rows, 8·8 <= 128 columns

    # after both loops: aliased mma.sync with 2 × 4 warps on a 16 × 16 result = (32/16)·(32/16) = 4 copies
    assert (post["in_loop"], post["mma"], post["warps_per_cta"], post["duplication"]) == (
        False,
        "mma.sync",
        [2, 4],
        4.0,
    )


def test_flops_per_pair_counts_loop_dots_with_duplication():
    dots = kr.parse_ttgir_dots(TTGIR)
    total = kr.add_dot_flops(dots, block_m=64, block_n=32)
    s1 = 2 * 64 * 32 * 64 * 2.0 / (64 * 32)  # duplicated wgmma
    dv = 2 * 32 * 128 * 64 / (64 * 32)
    assert [d["flops_per_pair"] for d in dots] == [0.0, s1, dv, 0.0]  # dots outside the loops: not per pair
    assert total == s1 + dv


def test_flops_per_pair_counts_one_of_two_phase_loops():
    # the forward walks whole tiles, then diagonal tiles, in two sibling loops with the same dots: a pair goes
    # through one of them, so the count is one loop's, not their sum
    loop = TTGIR.split("\n    %r:2 = ")[1].split("\n    %post")[0]
    head, tail = TTGIR.split("\n    %r:2 = ")[0], "\n    %post" + TTGIR.split("\n    %post")[1]
    twice = head + "\n    %r:2 = " + loop + "\n    %r2:2 = " + loop + tail
    dots = kr.parse_ttgir_dots(twice)
    assert [d["loop"] for d in dots] == [None, 1, 1, 3, 3, None]
    assert kr.add_dot_flops(dots, block_m=64, block_n=32) == kr.add_dot_flops(kr.parse_ttgir_dots(TTGIR), 64, 32)


def test_duplication_rules():
    assert kr.dot_duplication(3, [4, 2], 64, 128) == 1.0  # one warpgroup on 64 rows
    assert kr.dot_duplication(3, [8, 1], 128, 64) == 1.0
    assert kr.dot_duplication(3, [8, 1], 32, 64) == 4.0
    assert kr.dot_duplication(2, [1, 8], 32, 32) == 2.0  # 8 warps × 8 columns = 64 for 32
    assert kr.dot_duplication(2, [4, 2], 64, 16) == 1.0
    assert kr.dot_duplication(None, None, 16, 16) == 1.0


def test_text_parsers():
    assert kr.mma_kind("  wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {...}") == "wgmma"
    assert kr.mma_kind("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == "mma.sync"
    assert kr.mma_kind("fma.rn.f32") == "none"
    res = "Function _fwd_kernel:\n  REG:254 STACK:16 SHARED:1024 LOCAL:8 CONSTANT[0]:744 TEXTURE:0\n"
    assert kr.parse_res_usage(res) == {"REG": 254, "STACK": 16, "SHARED": 1024, "LOCAL": 8}
    log = (
        "ptxas info    : Function properties for _fwd_kernel\n"
        "    24 bytes stack frame, 20 bytes spill stores, 28 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers\n"
    )
    assert kr.parse_ptxas_log(log) == {"stack": 24, "spill_stores": 20, "spill_loads": 28, "registers": 255}
    assert kr.parse_target("sm90") == kr.parse_target("sm_90a") == 90
    assert kr.parse_config_spec("fwd:variant=V2,BLOCK_M=128,shared_k=false") == (
        "fwd",
        {"variant": "V2", "BLOCK_M": 128, "shared_k": False},
    )


def test_report_compiles_the_kernels_for_sm90_without_spills_on_wgmma(tmp_path):
    """The contract on the H100's instruction set, proven without one: for DIFF V1 (d 64, dv 128) and DIFF V2
    (d 64, dv 64, shared K) heads, every kernel of the forward and of both backwards has registers <= 255 and no
    spills (so does every alternative the autotuner may pick), every dot of a main loop is a wgmma issued once (no
    warpgroup repeating another's); the forward's and the default single-pass backward's matmul FLOPs per pair
    are the FLOP model's ideal (the issue asks <= 1.15x). The deterministic two-kernel backward recomputes QKᵀ
    and dO·Vᵀ in its dQ pass: reported, about 1.4x."""
    try:
        kr.toolchain(90)
    except kr.ToolchainMissing as err:
        pytest.skip(str(err))
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, str(SCRIPT), "--target", "sm90", "--variants", "V1,V2"]  # the default kernels
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "_fwd_kernel" in proc.stdout and "FLOP model" in proc.stdout

    rows = json.loads(out.read_text())
    kernels = [r for r in rows if r["kind"] != "backward"]
    defaults = [r for r in kernels if r["config"]["candidate"] == 0]
    assert sorted(r["kind"] for r in defaults) == sorted(["fwd", "dkdv_atomic", "preprocess", "dkdv", "dq"] * 2)
    # the autotuner's alternatives (triton_kernel._TUNING) are compiled too, and held to the same contract
    assert {r["kind"] for r in kernels if r["config"]["candidate"] > 0} == {"fwd", "dkdv_atomic"}
    for row in kernels:
        for key in ("kernel", "config", "registers", "spill_bytes", "mma", "flops_per_pair", "ideal_flops_per_pair"):
            assert key in row, key
        config = row["config"]
        assert (config["dtype"], config["d"], config["causal"]) == ("bf16", 64, True)
        assert 0 < row["registers"] <= 255 and row["spill_bytes"] == 0, row["kernel"]
        if row["kind"] == "preprocess":  # row sums only: no matmul
            assert row["dots"] == [] and row["flops_per_pair"] == 0
            continue
        assert row["shared_bytes"] > 0
        loop_dots = [d for d in row["dots"] if d["in_loop"]]
        assert loop_dots and row["mma"] == "wgmma"
        assert all(d["mma_version"] == 3 and d["duplication"] == 1 for d in loop_dots), (row["kernel"], loop_dots)
    for row in kernels:
        dv = row["config"]["dv"]
        if row["kind"] == "fwd":
            assert row["ideal_flops_per_pair"] == 2 * (2 * 64 + 2 * dv)  # attention_flops, forward 2·(2d + 2dv)
            assert row["flops_per_pair"] == row["ideal_flops_per_pair"]
        if row["kind"] == "dkdv_atomic":
            assert row["ideal_flops_per_pair"] == 2 * (6 * 64 + 2 * dv)  # backward 2·(6d + 2dv)
            assert row["flops_per_pair"] <= 1.15 * row["ideal_flops_per_pair"]
            assert row["flops_per_pair"] == row["ideal_flops_per_pair"]
    two_kernel = [r for r in rows if r["kind"] == "backward"]
    assert len(two_kernel) == 2 and all(1.3 < r["flops_ratio"] < 1.5 for r in two_kernel)
