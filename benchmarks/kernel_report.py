"""Static report on the fused Triton kernels (diffattn/ops/triton/), compiled ahead of time for a GPU
that need not be present: registers, spills, shared memory, which tensor-core instructions each matmul became,
and the matmul FLOPs per query–key pair the kernels actually issue against the FLOP model's ideal.

Usage: python benchmarks/kernel_report.py [--target sm90] [--dtype bf16] [--kernels fwd,dkdv,dq]
                                          [--variants V1,V2,W] [--masks none,padding,bool,additive,segments]
                                          [--configs KIND:KEY=VAL,...] [--jobs N] [--require-triton 3.6.0]
                                          [--json OUT] [--dump DIR]

How the kernels are compiled. The script runs the real launch path of the ``triton`` backend (``_fwd_op`` /
``_bwd_op`` on empty CPU tensors of a representative problem, ``--shape``) with the launcher replaced by a
recorder, so every argument, constexpr and tile size is exactly what a GPU launch would pass: tiles from
``_blocks`` as on a GPU (the module's ``INTERPRETED`` is forced off while recording), ``num_warps`` and
``num_stages`` from there, and every alternative the autotuner may time (``_candidates``). Each recorded launch is
then specialised as Triton's JIT would (16-divisible integers and pointers, ints equal to 1 and ``None`` become
constants) and compiled with ``triton.compile`` for ``--target``.
Kernels picked at import: the script must run where ``TRITON_INTERPRET`` is unset (``main`` removes it before
importing Triton); under the interpreter the kernels cannot be compiled.

Variants: ``V1`` = DIFF Transformer heads (Q1, Q2, K1, K2 of width d = 64, V of width dv = 128); ``V2`` = DIFF
V2 heads (two query heads sharing one K of width 64, V of width 64, so ``SHARED_K``); ``W`` = the widest heads the
kernels take (d = 128, dv = 256: the two-kernel backward, 32-row tiles). Each is compiled with every user mask of
``--masks``: none, ``padding`` (2-D key padding, one value per key), ``bool`` and ``additive`` (per-row 4-D masks,
[B, 1, T, S] as transformers builds them, the additive one in q's dtype) and ``segments`` (sequence packing: one
document id per token, [B, S] int32, compared per tile, no mask tensor); a masked variant is labelled e.g.
``V1+bool``. Kernels: ``fwd`` (the training forward, saving O1, O2 for the backward), ``dkdv_atomic`` (the default
single-pass backward with atomic dQ, FlashAttention-2's scheme), ``preprocess`` (its row statistics Δ1, Δ2, dλ),
``dkdv`` and ``dq`` (the deterministic two-kernel backward: ``ATOMIC_DQ = False`` or
``torch.use_deterministic_algorithms``, wide heads, and "v1" heads with a 4-D mask), ``dv`` and ``dk`` (that dK/dV
kernel split into a dV launch and a dK launch, ``tuning.SPLIT_DKDV``: wide heads only), ``fwd_cols`` (the training
forward by halves of V's columns, ``tuning.FWD_COLUMNS``: wide heads only), ``fwd_tma`` (the training forward by
TMA tiles, :mod:`diffattn.ops.triton.forward_tma`, ``tuning.FWD_TMA``: V1 and V2 heads without a mask),
``dkdv_tma``, ``dq_tma`` and ``dkdv_ws`` (the two-kernel backward so, :mod:`diffattn.ops.triton.backward_tma`,
``tuning.BWD_TMA``, and its dK/dV kernel warp-specialised, ``tuning.BWD_WS``; the TTGIR holds each consumer
partition's dots on its 64 of the block's 128 keys, and ``flops/pair`` counts one partition's: half the kernel's),
``short`` (the training
forward at T = 64 rows, ``--short-t``: the 64-row tiles of short sequences), ``prefill`` (the forward without
gradient split over keys, and its combine kernel, at ``--short-t`` and at the shape's T: a few long prompts leave
SMs idle, so they split too), ``decode`` (the key-split forward at T = 1 and its combine kernel; V1
reads V's two halves in place, as DiffLlama decodes), ``epilogue`` (the SDPA routes' O1 − λ·O2 as one kernel and
its backward, :mod:`diffattn.ops.triton.epilogue`, with one λ and with one per head and token, without and with the
head's norm; no mask reaches it; DIFF V1's λ by :mod:`diffattn.ops.triton.reparam`, forward and backward; and, for
heads with V twice as wide as Q, the one-call routes' [V; V] and its gradient by :mod:`diffattn.ops.triton.vcopies`,
and the epilogue reading ``sdpa_split``'s two calls' outputs unjoined, without and with the norm).
A kernel a variant never launches has no row (e.g. ``dkdv_atomic`` for ``W``, ``dv``, ``dk`` and ``fwd_cols`` for
``V1`` and ``V2``,
``epilogue`` with a mask, or ``dkdv_atomic`` for ``V1`` with a 4-D mask).

How to read the columns:

* ``regs`` — registers per thread (``cuobjdump -res-usage``). 255 is the hardware ceiling; at 8 warps
  (256 threads) one CTA per SM fits up to 255 registers, two CTAs need <= 128.
* ``spill`` — ``spill_bytes`` = ptxas's "bytes spill stores" + "bytes spill loads" (``ptxas -v``, the log of
  the very ptxas run that built the cubin; static bytes of spill instructions, not traffic). If the log is not
  available it falls back to cuobjdump's STACK + LOCAL (``spill_source`` says which). Anything above 0 means
  the tile does not fit in registers: local-memory round trips inside the loop.
* ``smem`` — dynamic shared memory per CTA (``metadata.shared``); 228 KiB per SM on an H100.
* ``i64 mul`` — 64-bit integer multiplies in the TTGIR (``arith.muli`` on i64): the batch, head and row offsets
  that may pass 2³¹ elements are computed in 64 bits (0 would mean 32-bit offsets only).
* ``mma`` — ``wgmma`` if the PTX has ``wgmma.mma_async`` (Hopper warpgroup MMA), ``mma.sync`` if it has
  only Ampere-style ``mma.sync``, ``none`` for neither (FMA). On sm_90, ``mma.sync`` reaches about half of peak.
* ``dots`` (JSON, and the lines under the table) — every ``tt.dot`` / ``ttng.warp_group_dot`` of the TTGIR with
  its shape M×N×K, whether it sits in a loop, its MMA version (3 = wgmma, 2 = mma.sync) and ``warpsPerCTA``.
  A wgmma warpgroup (4 warps) owns 64 rows, so a dot of M rows computed by ``warpsPerCTA[0]`` warps along M is
  done ``64·warpsPerCTA[0]/4 / M`` times over when that exceeds 1 (e.g. M = 64 with warpsPerCTA [8, 1]: twice,
  every warpgroup computing the same product); mma.sync tiles are 16 rows × 8 columns per warp, so its
  duplication is ``max(1, 16·w[0]/M)·max(1, 8·w[1]/N)``. Duplication is wasted tensor-core time, never wrong
  results.
* ``flops/pair`` — matmul FLOPs per query–key pair as the kernel is written and laid out: Σ over dots in the
  main loop of 2·M·N·K·duplication / (BLOCK_M·BLOCK_N) (one iteration covers a BLOCK_M × BLOCK_N tile of
  queries × keys; the dK/dV kernel's tiles are [keys, queries], the same count). ``ideal`` is the FLOP model of
  :func:`diffattn.bench.attention.attention_flops` for one DIFF head pair: forward 2·(2d + 2dv), backward
  2·(6d + 2dv). The backward is judged as a whole (row "backward (dkdv + dq)", or ``dkdv_atomic`` alone); its
  two kernels have no separate ideal (null). ratio > 1 = recomputation (the dq pass recomputes QKᵀ and dO·Vᵀ)
  plus layout duplication.

Compiles take a second or two each (identical specialisations once); the default, every kernel × 3 variants × 5
masks, about 200 of them, takes ~2–4 minutes on one CPU core, less with ``--jobs N`` (N forked compiling
processes). Every launch is compiled even when one fails. Exit code 0 when every kernel compiled; 1 when any did
not (the report of the others on stdout, each failure, with its kernel, variant, tiles and error, on stderr); 2 when
Triton or its bundled CUDA toolchain (ptxas, cuobjdump) is missing, or the imported Triton is not the version
``--require-triton`` names (the oldest supported one is checked so, from a side folder: ``.ci/run``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

KINDS = (
    *("fwd", "dkdv_atomic", "preprocess", "dkdv", "dq", "dv", "dk", "fwd_cols", "fwd_tma"),
    *("dkdv_tma", "dq_tma", "dkdv_ws"),
    *("short", "prefill", "decode", "epilogue"),
)
DEFAULT_KINDS = KINDS
SHORT_T = (64,)  # query lengths of the "short" and "prefill" forwards (rows per KV head with the default H = HKV)
VARIANTS: dict[str, dict] = {
    "V1": {"d": 64, "dv": 128, "shared_q": False, "shared_k": False},  # DIFF Transformer: V of width 2d
    "V2": {"d": 64, "dv": 64, "shared_q": False, "shared_k": True},  # DIFF V2: two query heads share K and V
    "W": {"d": 128, "dv": 256, "shared_q": False, "shared_k": False},  # the widest heads the kernels take
    # paper-830m's DIFF heads (d_model 1536 over 8 DIFF heads of 2·96): padded to 128 / 256 inside the kernels
    "M": {"d": 96, "dv": 192, "shared_q": False, "shared_k": False},
}
DEFAULT_VARIANTS = ("V1", "V2", "W")
#: user masks the kernels read (besides causality): none, 2-D key padding (one value per key, [B, 1, 1, S]), the
#: per-row 4-D masks, bool and additive ([B, 1, T, S] as transformers builds them: MASK_ROWS), and the segment ids of
#: sequence packing ([B, S] int32 document ids: SEGMENTS, no mask tensor)
MASKS = ("none", "padding", "bool", "additive", "segments")
DEFAULT_MASKS = MASKS
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DEFAULT_SHAPE = (2, 16, 16, 2048, 2048)  # B, H, HKV, T, S: only divisibility by 16 (and == 1) reaches the code
_TILE_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
_OPTION_KEYS = ("num_warps", "num_stages", "maxnreg")  # compile options a --configs row may set (maxnreg: a cap)
FORWARD_KINDS = ("fwd", "fwd_cols", "fwd_tma", "short", "prefill", "decode")
_MMA_RANK = {"none": 0, "mma.sync": 1, "wgmma": 2}


class ToolchainMissing(RuntimeError):
    """Triton, or the CUDA tools it bundles (ptxas, cuobjdump), is not installed."""


# --------------------------------------------------------------------------------------------------------------
# Parsing compiler output (pure text; no Triton needed)
# --------------------------------------------------------------------------------------------------------------

_ALIAS_RE = re.compile(r"^(#[\w.]+)\s*=\s*(.*)$")
_DOT_RE = re.compile(r"^\s*(%[\w#:.]+)\s*=\s*(tt\.dot|ttng\.warp_group_dot)\b")  # \b: not warp_group_dot_wait
_TYPE_RE = re.compile(r"(?:tensor|!ttg\.memdesc)<(\d+(?:x\d+)+)x([A-Za-z]\w*)")
_INTS_RE = r"\[([\d,\s]*)\]"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def dot_duplication(version: int | None, warps: list[int] | None, m: int, n: int) -> float:
    """How many times the warp layout computes each element of an M×N dot result (1 = no waste).

    wgmma (version 3): a warpgroup of 4 warps owns 64 rows, so warpsPerCTA[0] warps along M cover
    64·warpsPerCTA[0]/4 rows. mma.sync (version 2): a warp's tile is 16 × 8."""
    if not warps:
        return 1.0
    wm = warps[0]
    wn = warps[1] if len(warps) > 1 else 1
    if version == 3:
        return max(1.0, 64 * wm / 4 / m)
    if version == 2:
        return max(1.0, 16 * wm / m) * max(1.0, 8 * wn / n)
    return 1.0


def parse_ttgir_dots(ttgir: str) -> list[dict]:
    """Every dot op of a TTGIR module: result name, op, M, N, K, loop nesting, MMA version and warp layout.

    The encoding of a dot's result type is resolved through the ``#name = ...`` aliases at the top of the
    module. Loop nesting is read from the printer's indentation: a region opener (a line ending in ``{``) holds
    every following line indented deeper, so a dot is in a loop when an open ``scf.for``/``scf.while`` holds it.
    """
    aliases: dict[str, str] = {}
    dots: list[dict] = []
    stack: list[tuple[int, int | None]] = []  # (indent, loop number or None) of the open regions
    loops = 0
    for line in ttgir.splitlines():
        if not line.strip():
            continue
        m_alias = _ALIAS_RE.match(line)
        if m_alias:
            aliases[m_alias.group(1)] = m_alias.group(2)
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m_dot = _DOT_RE.match(line)
        if m_dot:
            in_loops = [n for _, n in stack if n is not None]
            dots.append(_parse_dot(line, m_dot, aliases, len(in_loops), in_loops[0] if in_loops else None))
        code = re.sub(r"\s+loc\(.*\)\s*$", "", line).rstrip()
        if code.endswith("{"):
            is_loop = bool(re.search(r"\bscf\.(for|while)\b", code))
            loops += is_loop
            stack.append((indent, loops if is_loop else None))
    return dots


def _parse_dot(line: str, match: re.Match, aliases: dict[str, str], loop_depth: int, loop: int | None) -> dict:
    code = re.sub(r"\s+loc\([^()]*(\([^()]*\))?[^()]*\)\s*$", "", line)
    types = _TYPE_RE.findall(code)
    if len(types) < 3:
        raise ValueError(f"cannot read the operand types of this dot: {line.strip()[:200]}")
    a_dims, c_dims = _ints(types[-3][0].replace("x", ",")), _ints(types[-1][0].replace("x", ","))
    m, n, k = c_dims[-2], c_dims[-1], a_dims[-1]
    result_type = code.rsplit("->", 1)[-1]
    enc_name = re.search(r"#[\w.]+", result_type)
    enc = ""
    if enc_name:
        enc = aliases.get(enc_name.group(0), result_type)
    version = re.search(r"versionMajor\s*=\s*(\d+)", enc)
    warps = re.search(r"warpsPerCTA\s*=\s*" + _INTS_RE, enc)
    instr = re.search(r"instrShape\s*=\s*" + _INTS_RE, enc)
    ver = int(version.group(1)) if version and "mma" in enc else None
    warps_l = _ints(warps.group(1)) if warps else None
    return {
        "result": match.group(1),
        "op": match.group(2),
        "m": m,
        "n": n,
        "k": k,
        "in_loop": loop_depth > 0,
        "loop_depth": loop_depth,
        "loop": loop,  # the outermost loop holding it (numbered in program order), None outside loops
        "mma_version": ver,
        "mma": {3: "wgmma", 2: "mma.sync"}.get(ver, "fma") if ver is not None else "fma",
        "warps_per_cta": warps_l,
        "instr_shape": _ints(instr.group(1)) if instr else None,
        "operand_dtype": types[-3][1],
        "duplication": dot_duplication(ver, warps_l, m, n),
    }


def add_dot_flops(dots: list[dict], block_m: int | None, block_n: int | None) -> float:
    """Fill each dot's ``flops_per_pair`` (0 outside the main loop): 2·M·N·K·duplication per iteration over the
    BLOCK_M·BLOCK_N query–key pairs an iteration covers; return the per-pair total of the costliest top-level
    loop (with the loops nested in it). A kernel that walks its keys in phases (the forward: whole tiles without a
    mask, then the diagonal ones) has one loop per phase and each pair goes through exactly one of them, so the
    phases are not added up."""
    per_loop: dict[int | None, float] = {}
    for dot in dots:
        if dot["in_loop"] and block_m and block_n:
            dot["flops_per_pair"] = 2 * dot["m"] * dot["n"] * dot["k"] * dot["duplication"] / (block_m * block_n)
            per_loop[dot.get("loop")] = per_loop.get(dot.get("loop"), 0.0) + dot["flops_per_pair"]
        else:
            dot["flops_per_pair"] = 0.0
    return max(per_loop.values(), default=0.0)


_I64_MUL_RE = re.compile(r"^\s*%\S+ = arith\.muli [^\n]*(?:: |x)i64\b", re.MULTILINE)  # ": i64", "<..xi64"


def mma_kind(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma.sync"
    return "none"


def parse_res_usage(text: str) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL of the (single) function in ``cuobjdump -res-usage`` output."""
    out = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", text)
        if m:
            out[key] = int(m.group(1))
    return out


def parse_ptxas_log(text: str) -> dict[str, int]:
    out = {}
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if m:
        out["stack"], out["spill_stores"], out["spill_loads"] = (int(x) for x in m.groups())
    m = re.search(r"Used (\d+) registers", text)
    if m:
        out["registers"] = int(m.group(1))
    return out


# --------------------------------------------------------------------------------------------------------------
# Toolchain and compilation
# --------------------------------------------------------------------------------------------------------------


def parse_target(target: str) -> int:
    m = re.fullmatch(r"sm_?(\d+)a?", target.strip().lower())
    if not m:
        raise ValueError(f"--target must look like sm90 or sm_80, got {target!r}")
    return int(m.group(1))


def toolchain(capability: int = 90) -> dict[str, str]:
    """Paths of the ptxas and cuobjdump that Triton bundles; ToolchainMissing if either (or Triton) is absent."""
    try:
        import triton
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as err:
        raise ToolchainMissing(f"triton (with its NVIDIA backend) is not installed: {err}") from err
    try:
        return {"ptxas": get_ptxas(capability).path, "cuobjdump": triton.knobs.nvidia.cuobjdump.path}
    except RuntimeError as err:  # knobs raise "Cannot find <tool>"
        raise ToolchainMissing(f"triton's bundled CUDA toolchain is incomplete: {err}") from err


@dataclass
class Launch:
    """One kernel launch as the backend would issue it."""

    kernel: object  # a triton JITFunction
    args: tuple
    consts: dict  # constexpr keyword arguments, tiles included
    options: dict = field(default_factory=dict)  # num_warps / num_stages (absent = Triton's default)
    kind: str = ""
    candidate: int = 0  # 0 = the default tiles; 1.. = the autotuner's alternatives (tuning._TUNING)
    shape: tuple[int, ...] = ()  # B, H, HKV, T, S of the recorded problem


def _record_launches(
    kind: str, spec: dict, dtype_name: str, shape: tuple[int, ...], short_t: int | None = None
) -> list[Launch]:
    """Run the backend's launch path on empty CPU tensors with the launcher swapped for a recorder."""
    import torch
    import triton

    from diffattn.ops.routes import TRITON_VARIANTS
    from diffattn.ops.triton import (
        backward,
        backward_tma,
        decode,
        epilogue,
        forward,
        forward_tma,
        launch,
        reparam,
        tuning,
        vcopies,
    )

    kernels = (
        forward._fwd_kernel,
        forward_tma._fwd_tma_kernel,
        backward_tma._bwd_dkdv_tma_kernel,
        backward_tma._bwd_dq_tma_kernel,
        backward._bwd_dkdv_kernel,
        backward._bwd_dq_kernel,
        decode._combine_kernel,
        backward._bwd_preprocess_kernel,
        epilogue._subtract_fwd_kernel,
        epilogue._subtract_bwd_kernel,
        reparam._lambda_fwd_kernel,
        reparam._lambda_bwd_kernel,
        vcopies._v_twice_fwd_kernel,
        vcopies._v_twice_bwd_kernel,
    )
    if not all(isinstance(kernel, triton.runtime.jit.JITFunction) for kernel in kernels):
        raise RuntimeError(
            "diffattn.ops.triton was imported with TRITON_INTERPRET=1, so its kernels are interpreted and "
            "cannot be compiled; run this in a process without TRITON_INTERPRET"
        )
    dtype = getattr(torch, DTYPES[dtype_name])
    b, h, hkv, t, s = shape
    if kind == "decode":
        t = 1
    elif kind in ("short", "prefill"):
        t = short_t or SHORT_T[0]
    d, dv, causal = spec["d"], spec["dv"], spec.get("causal", True)

    def empty(*size, dt=dtype):
        return torch.empty(*size, dtype=dt)

    q1, k1, v = empty(b, h, t, d), empty(b, hkv, s, d), empty(b, hkv, s, dv)
    q2 = None if spec["shared_q"] else empty(b, h, t, d)
    k2 = None if spec["shared_k"] else empty(b, hkv, s, d)
    lam = empty(b, h, t, dt=torch.float32)
    mask = {
        None: None,
        "padding": lambda: empty(b, 1, 1, s, dt=torch.bool),  # 2-D key padding, as validate stores it
        "bool": lambda: empty(b, 1, t, s, dt=torch.bool),  # a per-row 4-D mask, transformers' [B, 1, T, S]
        "additive": lambda: empty(b, 1, t, s),  # additive, in q's dtype (validate casts it so)
        "segments": None,  # no mask tensor: the segment ids below
    }[spec.get("mask")]
    mask = mask() if mask else None
    segments = empty(b, s, dt=torch.int32) if spec.get("mask") == "segments" else None
    scale = d**-0.5
    recorded: list[Launch] = []

    def record(kernel, grid_of, args, consts, kind_, d_, dv_, rows, *_rest, **_kw):
        # every configuration _launch may run on a GPU: the default tiles and, where the launch is autotuned, each
        # alternative the autotuner times (its retry on OutOfResources needs a GPU to trigger)
        fp32, split = consts["PREC"] == "ieee", consts.get("SPLIT", False)
        candidates = tuning._candidates(kind_, d_, dv_, rows, fp32, split, tuning._mask_class(consts))
        if tuning._decoding_launch(kind_, rows, fp32, split):  # its candidate tiles too
            candidates += [(16, bn, w, st) for bn, w, st in tuning.DECODE_TILES[tuning._width_class(d_, dv_)]]
        for i, (bm, bn, warps, stages) in enumerate(candidates):
            tiles = {"BLOCK_M": bm, "BLOCK_N": bn}
            options = {"num_warps": warps, "num_stages": stages, **tuning._compile_options(kind_, rows)}
            recorded.append(Launch(kernel, tuple(args), {**consts, **tiles}, options, kind_, candidate=i))

    class Recorder:  # for the small kernels launched directly as kernel[grid](...)
        def __init__(self, kernel, kind_):
            self.kernel, self.kind, self.candidate = kernel, kind_, 0

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
                recorded.append(Launch(self.kernel, args, kwargs, options, self.kind, candidate=self.candidate))

            return run

    # the decoding candidates by vector products (tuning.DECODE_VECTORS) are reported as decode rows
    direct = {"_combine_kernel": "combine", "_bwd_preprocess_kernel": "preprocess", "_decode_vector_kernel": "decode"}
    subtract = ("_subtract_fwd_kernel", "_subtract_bwd_kernel")  # the fused epilogue's two kernels
    lambda_kernels = ("_lambda_fwd_kernel", "_lambda_bwd_kernel")  # DIFF's λ, Eq. 2 (reported with the epilogue)
    v_kernels = ("_v_twice_fwd_kernel", "_v_twice_bwd_kernel")  # DIFF V1's [V; V] (reported with the epilogue)
    patched = (
        [(launch, n) for n in ("_launch", *direct)]
        + [(epilogue, n) for n in subtract]
        + [(reparam, n) for n in lambda_kernels]
        + [(vcopies, n) for n in v_kernels]
        + [
            (tuning, n)
            for n in (
                *("INTERPRETED", "BLOCK_OVERRIDE", "SPLIT_OVERRIDE", "AUTOTUNE", "ATOMIC_DQ"),
                *("SPLIT_DKDV", "FWD_COLUMNS", "FWD_TMA", "BWD_TMA", "BWD_WS", "DECODE_VECTOR"),
            )
        ]
    )
    saved = {(module, n): getattr(module, n) for module, n in patched}
    launch._launch = record
    for name, kind_ in direct.items():
        setattr(launch, name, Recorder(saved[launch, name], kind_))
    for name in subtract:
        setattr(epilogue, name, Recorder(saved[epilogue, name], "epilogue"))
    for name in lambda_kernels:
        setattr(reparam, name, Recorder(saved[reparam, name], "epilogue"))
    for name in v_kernels:
        setattr(vcopies, name, Recorder(saved[vcopies, name], "epilogue"))
    tuning.INTERPRETED, tuning.BLOCK_OVERRIDE = False, None  # GPU tiles and no bf16 upcast, whatever the environment
    # every kernel and candidate the backend can launch, whatever its defaults: the autotuner's alternatives and the
    # single-pass backward (the deterministic one is asked for below, by atomic = False) are compiled even where
    # tuning.AUTOTUNE or tuning.ATOMIC_DQ is off by default
    tuning.AUTOTUNE, tuning.ATOMIC_DQ = True, True
    tuning.SPLIT_OVERRIDE = 4 if kind in ("decode", "prefill") else None  # CPU tensors would never split
    # the split dK/dV kernel and the forwards by column blocks and by TMA tiles for their own kinds only (the atomic
    # one: set above)
    for name in ("split", "cols", "tma", "btma", "bws"):
        flag, kinds = TRITON_VARIANTS[name]
        setattr(tuning, flag, kind in kinds)
    try:
        if kind == "epilogue":  # O1 − λ·O2 and its backward, on an SDPA route's outputs; no mask reaches it
            if spec.get("mask") is None:
                o1, o2, dout = empty(b, h, t, dv), empty(b, h, t, dv), empty(b, h, t, dv)
                # one call's output over both maps (the one-call routes' backward writes its gradient whole)
                o_pair, dout_pair = empty(b, 2 * h, t, dv), empty(b, h, t, dv)
                # one λ, and DIFF V2's one per head and token; without and with the head's norm (DIFF V1's Eq. 3)
                for lam_e in (torch.empty((), dtype=torch.float32), lam.unsqueeze(-1)):
                    for norm in (None, 1e-5):
                        epilogue._subtract_impl(o1, o2, lam_e, norm, 0.8)
                        epilogue._subtract_bwd_impl(dout, o1, o2, lam_e, norm, 0.8)
                        epilogue._subtract_pair_bwd_impl(dout_pair, o_pair, lam_e, False, norm, 0.8)
                # DIFF V1's λ from its four float32 vectors of width d, forward and backward
                vectors = [empty(d, dt=torch.float32) for _ in range(4)]
                _, exps = reparam._lambda_fwd(*vectors, 0.8)
                reparam._lambda_bwd(torch.empty((), dtype=torch.float32), exps, *vectors)
                if dv == 2 * d:  # DIFF V1's [V; V] from V's halves, as a projection lays them out, and its gradient
                    halves = empty(b, s, 2 * hkv, d).transpose(1, 2)
                    twice = vcopies._v_twice_impl(halves)
                    vcopies._v_twice_bwd_impl(twice[..., :d], twice[..., d:], torch.empty_like(halves))
                    # sdpa_split's two calls' outputs (one per slice of V) read unjoined, with V1's one λ
                    oa, ob, lam1 = empty(b, 2 * h, t, d), empty(b, 2 * h, t, d), torch.empty((), dtype=torch.float32)
                    for norm in (None, 1e-5):
                        epilogue._subtract_parts_impl(oa, ob, lam1, False, norm, 0.8)
                        epilogue._subtract_parts_bwd_impl(dout, oa, ob, lam1, False, norm, 0.8)
        elif kind == "decode":
            if dv == 2 * d:  # DiffLlama decodes with V's two halves read in place
                v_heads = empty(b, 2 * hkv, s, d)
                v, v_second = v_heads[:, :hkv], v_heads[:, hkv:]
            else:
                v_second = None
            launch._fwd_op(q1, k1, q2, k2, v, lam, mask, causal, scale, False, v_second, segments)
            # each decoding candidate by vector products on the same call, where it applies (one row a KV head, no
            # segments): its launch alone (the combine after it is the one recorded above)
            vector = launch._decode_vector_kernel
            for i, tile in enumerate(tuning.DECODE_VECTORS[tuning._width_class(d, dv)], start=1):
                tuning.DECODE_VECTOR, vector.candidate = tile, i
                before = len(recorded)
                launch._fwd_op(q1, k1, q2, k2, v, lam, mask, causal, scale, False, v_second, segments)
                recorded[before:] = [r for r in recorded[before:] if r.kernel is saved[launch, "_decode_vector_kernel"]]
        elif kind in ("fwd", "fwd_cols", "fwd_tma", "short", "prefill"):
            save = kind in ("fwd", "fwd_cols", "fwd_tma", "short")
            launch._fwd_op(q1, k1, q2, k2, v, lam, mask, causal, scale, save, None, segments)
        else:
            o1, o2, dout = empty(b, h, t, dv), empty(b, h, t, dv), empty(b, h, t, dv)
            lse1, lse2 = empty(b, h, t, dt=torch.float32), empty(b, h, t, dt=torch.float32)
            atomic = kind in ("dkdv_atomic", "preprocess")
            launch._bwd_op(dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic, segments)
    finally:
        for (module, n), val in saved.items():
            setattr(module, n, val)
    if kind in ("short", "prefill"):  # the forward at a short length: its own rows of the report
        for r in recorded:
            r.kind = kind if r.kind == "fwd" else r.kind
    elif kind not in ("fwd", "decode"):  # one kernel of the backward's launches
        recorded = [r for r in recorded if r.kind == kind]
    for r in recorded:
        r.shape = (b, h, hkv, t, s)
    return recorded


def _specialize(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for ASTSource, as Triton's JIT derives them from the launch arguments."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    kernel = launch.kernel
    bound = inspect.signature(kernel.fn).bind(*launch.args, **launch.consts).arguments
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(kernel.params):
        value = bound.get(p.name, p.default)
        if p.is_constexpr:
            signature[p.name], constexprs[(i,)] = "constexpr", value
            continue
        ty, spec = native_specialize_impl(
            CUDABackend, value, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment
        )
        signature[p.name] = ty
        if ty == "constexpr":  # None, or an int equal to 1
            constexprs[(i,)] = spec
        elif isinstance(spec, str):
            attrs[(i,)] = CUDABackend.parse_attr(spec)
    return signature, constexprs, attrs


class CompileFailed(RuntimeError):
    """Kernels that did not compile. ``failures``: one dict per failed launch (kernel, variant, kind, tiles,
    error); ``rows``: the report's rows of every launch that did compile."""

    def __init__(self, failures: list[dict], rows: list[dict]):
        self.failures, self.rows = failures, rows
        super().__init__(f"{len(failures)} launch(es) did not compile: " + "; ".join(map(_failure_text, failures)))


def _failure_text(failure: dict) -> str:
    return f"{failure['kernel']} ({failure['variant']}, {failure['kind']}, {failure['tile']}): {failure['error']}"


def _compile_key(launch: Launch, capability: int) -> tuple:
    """What makes two launches one compile: the kernel, its specialisation and its compile options (e.g. the
    preprocess kernel, which reads no mask, is the same kernel under every mask)."""
    signature, constexprs, attrs = _specialize(launch)
    key = (launch.kernel.fn.__name__, capability, *(repr(sorted(x.items())) for x in (signature, constexprs, attrs)))
    return (*key, repr(sorted(launch.options.items())))


def _try_compile(launch: Launch, capability: int, tools: dict[str, str]) -> dict | str:
    """The compiled kernel's summary (:func:`_compile_new`), or the error that stopped it as one string: a kernel
    that does not compile is a row of the report's failures, not the end of the report."""
    try:
        return _compile_new(launch, capability, tools, *_specialize(launch))
    except Exception as err:  # Triton's CompilationError, ptxas's and cuobjdump's failures, ...
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        # Triton's CompilationError quotes the source first and ends with the message
        text = " / ".join(lines[-3:]) if lines else ""
        return f"{type(err).__name__}: {text}"[:800]


_POOL_LAUNCHES: list[Launch] = []  # the launches a forked worker compiles, by index (inherited, never pickled)


def _pool_compile(job: tuple[int, int, dict[str, str]]) -> dict | str:
    index, capability, tools = job
    return _try_compile(_POOL_LAUNCHES[index], capability, tools)


def _compile_all(
    launches: list[Launch], capability: int, tools: dict[str, str], jobs: int = 1, progress=None
) -> list[dict | str]:
    """Each launch's compiled summary or error string, compiling each distinct specialisation once; with ``jobs``
    > 1 in that many forked processes (each compile is one process's work: Triton and ptxas use one core)."""
    keys: list[tuple | str] = []
    for launch in launches:
        try:
            keys.append(_compile_key(launch, capability))
        except Exception as err:  # a launch Triton cannot even specialise
            keys.append(f"{type(err).__name__}: {err}"[:800])
    todo = {key: i for i, key in enumerate(keys) if not isinstance(key, str)}  # first launch of each key
    if progress:
        progress(f"compiling {len(todo)} kernels ({len(launches)} launches) on {max(1, jobs)} process(es) ...")
    if jobs > 1 and len(todo) > 1:
        import multiprocessing

        global _POOL_LAUNCHES
        _POOL_LAUNCHES = launches
        try:
            with multiprocessing.get_context("fork").Pool(min(jobs, len(todo))) as pool:
                results = pool.map(_pool_compile, [(i, capability, tools) for i in todo.values()], 1)
            built = dict(zip(todo, results, strict=True))
        finally:
            _POOL_LAUNCHES = []
    else:
        built = {}
        for key, i in todo.items():
            if progress:
                progress(f"compiling {launches[i].kernel.__name__} ({launches[i].kind}) ...")
            built[key] = _try_compile(launches[i], capability, tools)
    return [key if isinstance(key, str) else built[key] for key in keys]


def _compile_new(launch: Launch, capability: int, tools: dict[str, str], signature, constexprs, attrs) -> dict:
    """Compile one launch for ``capability``: its TTGIR and PTX, name, warps, stages, shared memory and ptxas's
    and cuobjdump's resource counts (plain data, so that a worker process can hand it back)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    knobs = triton.knobs
    saved = (knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log)
    # a cache hit would skip ptxas, and its -v log is where the spill counts are
    knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
            compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=dict(launch.options))
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        res = subprocess.run([tools["cuobjdump"], "-res-usage", str(cubin)], capture_output=True, text=True, check=True)
    meta = compiled.metadata
    return {
        "name": meta.name,
        "num_warps": meta.num_warps,
        "num_stages": meta.num_stages,
        "shared": meta.shared,
        "ttgir": compiled.asm["ttgir"],
        "ptx": compiled.asm["ptx"],
        "res_usage": parse_res_usage(res.stdout),
        "ptxas": parse_ptxas_log(log.getvalue()),
    }


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------


def _ideal(kind: str, d: int, dv: int) -> float | None:
    """Ideal matmul FLOPs per query–key pair of one DIFF head pair, from the benchmark's FLOP model. None for
    the two kernels of the split backward (only their sum has an ideal) and for the combine kernel."""
    from diffattn.bench.attention import attention_flops

    direction = {"backward": "bwd", "dkdv_atomic": "bwd"}.get(kind, "fwd" if kind in FORWARD_KINDS else None)
    if direction is None:
        return None
    return attention_flops(1, 1, 1, 1, d, dv, causal=False, kind="diff")[direction]  # one pair: t = s = 1


def parse_config_spec(text: str) -> tuple[str, dict]:
    """``KIND[:KEY=VAL,...]`` → (kind, settings). Keys: variant, mask (one of :data:`MASKS`), d, dv, shared_q,
    shared_k, causal, BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg."""
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown kernel {kind!r} in --configs {text!r}; choose from {', '.join(KINDS)}")
    settings: dict = {}
    for item in filter(None, rest.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--configs entries are KEY=VAL, got {item!r}")
        if key == "variant":
            settings[key] = val
        elif key == "mask":
            if val not in MASKS:
                raise ValueError(f"unknown mask {val!r} in --configs {text!r}; choose from {', '.join(MASKS)}")
            settings[key] = None if val == "none" else val
        elif key in ("shared_q", "shared_k", "causal"):
            settings[key] = val.lower() in ("1", "true", "yes")
        elif key in ("d", "dv", *_TILE_KEYS, *_OPTION_KEYS):
            settings[key] = int(val)
        else:
            raise ValueError(f"unknown key {key!r} in --configs {text!r}")
    return kind, settings


def _row(launch: Launch, built: dict, label: str, spec: dict, dtype: str, target: str, shape) -> dict:
    dots = parse_ttgir_dots(built["ttgir"])
    bm, bn = launch.consts.get("BLOCK_M"), launch.consts.get("BLOCK_N")
    flops = add_dot_flops(dots, bm, bn)
    if launch.consts.get("COLUMNS"):  # one program per block of V's columns: each pair is visited that many times
        flops *= -(-spec["dv"] // launch.consts["BLOCK_DV"])
    res, ptxas = built["res_usage"], built["ptxas"]
    if "spill_stores" in ptxas:
        spill, source = ptxas["spill_stores"] + ptxas["spill_loads"], "ptxas -v: spill stores + spill loads"
    else:
        spill, source = res.get("STACK", 0) + res.get("LOCAL", 0), "cuobjdump: STACK + LOCAL"
    decode = launch.kind == "fwd" and bool(launch.consts.get("SPLIT"))
    kind = "decode" if decode else launch.kind  # the key-split forward at T = 1 is its own row
    # (the FLOP model counts tensor-core products: none for a kernel without any, the decoding by vector products)
    ideal = _ideal(kind, spec["d"], spec["dv"]) if dots else None
    return {
        "kernel": built["name"],
        "kind": kind,
        "config": {
            "variant": label,
            "target": target,
            "dtype": dtype,
            "d": spec["d"],
            "dv": spec["dv"],
            "causal": spec.get("causal", True),
            "mask": spec.get("mask") or "none",
            "shared_q": spec["shared_q"],
            "shared_k": spec["shared_k"],
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "num_warps": built["num_warps"],
            "num_stages": built["num_stages"],
            "candidate": launch.candidate,
            "shape_BHHkvTS": list(launch.shape or shape),
            "constexprs": dict(launch.consts),
        },
        "registers": res.get("REG", ptxas.get("registers")),
        "spill_bytes": spill,
        "spill_source": source,
        "spill_stores": ptxas.get("spill_stores"),
        "spill_loads": ptxas.get("spill_loads"),
        "stack_bytes": res.get("STACK"),
        "local_bytes": res.get("LOCAL"),
        "shared_bytes": built["shared"],
        "i64_multiplies": len(_I64_MUL_RE.findall(built["ttgir"])),
        "mma": mma_kind(built["ptx"]),
        "dots": dots,
        "pairs_per_iteration": bm * bn if bm and bn else None,
        "flops_per_pair": flops,
        "ideal_flops_per_pair": ideal,
        "flops_ratio": flops / ideal if ideal else None,
    }


def _combined_backward(*parts: dict) -> dict:
    """One row for the backward's kernels together (dK/dV then dQ, or the split dV, dK, then dQ): their FLOPs
    against the backward's ideal."""
    flops = sum(r["flops_per_pair"] for r in parts)
    first = parts[0]
    ideal = _ideal("backward", first["config"]["d"], first["config"]["dv"])
    config = {k: v for k, v in first["config"].items() if k not in (*_TILE_KEYS, "constexprs")}
    config["tiles"] = {r["kind"]: {k: r["config"][k] for k in _TILE_KEYS} for r in parts}
    return {
        "kernel": f"backward ({' + '.join(r['kind'] for r in parts)})",
        "kind": "backward",
        "config": config,
        "registers": max(r["registers"] for r in parts),  # the worst of them
        "spill_bytes": sum(r["spill_bytes"] for r in parts),
        "spill_source": first["spill_source"],
        "shared_bytes": max(r["shared_bytes"] for r in parts),
        "mma": min((r["mma"] for r in parts), key=_MMA_RANK.__getitem__),  # the weakest of them
        "dots": [{"kernel": r["kernel"], **dot} for r in parts for dot in r["dots"]],
        "flops_per_pair": flops,
        "ideal_flops_per_pair": ideal,
        "flops_ratio": flops / ideal if ideal else None,
    }


def kernel_report(
    target: str = "sm90",
    dtype: str = "bf16",
    kernels: tuple[str, ...] | list[str] = DEFAULT_KINDS,
    variants: tuple[str, ...] | list[str] = DEFAULT_VARIANTS,
    masks: tuple[str, ...] | list[str] = DEFAULT_MASKS,
    short_t: tuple[int, ...] | list[int] = SHORT_T,
    configs: tuple[str, ...] | list[str] = (),
    shape: tuple[int, ...] = DEFAULT_SHAPE,
    dump: str | Path | None = None,
    progress=None,
    jobs: int = 1,
) -> list[dict]:
    """Compile the requested kernels for ``target`` and return one row per compiled kernel (plus a combined
    backward row per variant and mask that has both ``dkdv`` and ``dq``). ``jobs``: compile in that many forked
    processes. Every launch is compiled even when one fails; then :class:`CompileFailed` names each that did not
    compile and carries the rows of those that did. ``masks``: the user masks each variant
    is compiled with (:data:`MASKS`; a masked variant is labelled e.g. ``V1+bool``). ``short_t``: the query
    lengths of the ``short`` and ``prefill`` forwards (a row each). ``configs``: extra
    ``KIND[:KEY=VAL,...]`` specs (see :func:`parse_config_spec`). Raises ToolchainMissing without Triton's CUDA
    tools."""
    capability = parse_target(target)
    tools = toolchain(capability)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    work: list[tuple[str, str, dict, dict, int | None]] = []  # (kind, label, head spec, tile overrides, T)
    for mask in masks:
        if mask not in MASKS:
            raise ValueError(f"unknown mask {mask!r}; choose from {', '.join(MASKS)}")
    for name in variants:
        if name not in VARIANTS:
            raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
        for mask in masks:
            label = name if mask == "none" else f"{name}+{mask}"
            for kind in kernels:
                if kind not in KINDS:
                    raise ValueError(f"unknown kernel {kind!r}; choose from {', '.join(KINDS)}")
                spec = {**VARIANTS[name], "mask": None if mask == "none" else mask}
                lengths = {"short": tuple(short_t), "prefill": (*short_t, shape[3])}.get(kind, (None,))
                for t in lengths:
                    work.append((kind, label, spec, {}, t))
    for text in configs:
        kind, settings = parse_config_spec(text)
        base = settings.pop("variant", "V1")
        launch_keys = (*_TILE_KEYS, *_OPTION_KEYS)
        spec = {**VARIANTS[base], **{k: v for k, v in settings.items() if k not in launch_keys}}
        work.append((kind, f"{base} [{text}]", spec, {k: v for k, v in settings.items() if k in launch_keys}, None))

    recorded: list[tuple[Launch, str, dict]] = []  # (launch, label, head spec)
    for kind, label, spec, overrides, t in work:
        for launch in _record_launches(kind, spec, dtype, tuple(shape), t):
            if overrides and launch.candidate > 0:  # overridden tiles replace the default; one row
                continue
            if overrides and "BLOCK_M" in launch.consts:
                launch.consts.update({k: v for k, v in overrides.items() if k in ("BLOCK_M", "BLOCK_N")})
                launch.options.update({k: v for k, v in overrides.items() if k in _OPTION_KEYS})
            recorded.append((launch, label, spec))
    built_all = _compile_all([launch for launch, _, _ in recorded], capability, tools, jobs, progress)
    rows: list[dict] = []
    failures: list[dict] = []
    for (launch, label, spec), built in zip(recorded, built_all, strict=True):
        if isinstance(built, str):
            tile = " ".join(f"{k}={v}" for k, v in {**launch.consts, **launch.options}.items() if k in _TILE_KEYS)
            failures.append(
                {"kernel": launch.kernel.__name__, "variant": label, "kind": launch.kind, "tile": tile, "error": built}
            )
            continue
        row = _row(launch, built, label, spec, dtype, target, tuple(shape))
        rows.append(row)
        if dump:
            out = Path(dump)
            out.mkdir(parents=True, exist_ok=True)
            c = row["config"]  # the tiles too: a kernel's candidates would overwrite one another
            tile = f"{c['BLOCK_M']}x{c['BLOCK_N']}w{c['num_warps']}s{c['num_stages']}" if c["BLOCK_M"] else ""
            stem = re.sub(r"[^\w.-]+", "_", f"{row['kernel']}_{label}_{row['kind']}_{tile}".rstrip("_"))
            for ext in ("ttgir", "ptx"):
                (out / f"{stem}.{ext}").write_text(built[ext])
    for label in dict.fromkeys(r["config"]["variant"] for r in rows):
        parts = {r["kind"]: r for r in rows if r["config"]["variant"] == label and not r["config"].get("candidate")}
        for kinds in (("dkdv", "dq"), ("dv", "dk", "dq")):  # the two-kernel backward, and with its split dK/dV
            if all(k in parts for k in kinds):
                rows.append(_combined_backward(*(parts[k] for k in kinds)))
    if failures:
        raise CompileFailed(failures, rows)
    return rows


# --------------------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------------------


def _fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def _dot_text(dot: dict) -> str:
    where = "loop" if dot["in_loop"] else "once"
    layout = f"{dot['mma']}{dot['warps_per_cta'] or ''}".replace(" ", "")
    dup = f" x{dot['duplication']:g} dup" if dot["duplication"] > 1 else ""
    return f"{dot['result']} {dot['m']}x{dot['n']}x{dot['k']} {where} {layout}{dup}"


def format_report(rows: list[dict]) -> str:
    head = (
        "kernel",
        "kind",
        "variant",
        "d/dv",
        "tile",
        "regs",
        "spill",
        "smem KiB",
        "i64 mul",
        "mma",
        "flops/pair",
        "ideal",
        "ratio",
    )
    table = [head]
    for r in rows:
        c = r["config"]
        if "tiles" in c:  # the combined backward: its parts' rows carry the tiles
            tile = "see parts"
        elif c.get("BLOCK_N") and not c.get("BLOCK_M"):  # a decoding candidate by vector products: one row
            tile = f"vec x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} (candidate)"
        elif c.get("BLOCK_M"):
            tile = f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"
            if c.get("candidate"):  # an autotuner's alternative, or a decoding launch's candidate (tuning.DECODE_TILES)
                tile += " (candidate)" if r["kind"] in ("decode", "prefill") else " (tuned)"  # (splits: no tuner)
        else:
            tile = f"w{c['num_warps']}"
        table.append(
            (
                r["kernel"],
                r["kind"],
                c["variant"],
                f"{c['d']}/{c['dv']}",
                tile,
                _fmt(r["registers"]),
                _fmt(r["spill_bytes"]),
                f"{r['shared_bytes'] / 1024:.0f}",
                _fmt(r.get("i64_multiplies")),
                r["mma"],
                f"{r['flops_per_pair']:.0f}",
                _fmt(r["ideal_flops_per_pair"], ".0f"),
                _fmt(r["flops_ratio"], ".2f"),
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("Dots (TTGIR; M x N x K, in the main loop or once, MMA kind + warpsPerCTA, duplication):")
    for r in rows:
        if r["kind"] == "backward":
            continue
        dots = "; ".join(_dot_text(d) for d in r["dots"]) or "none"
        lines.append(f"  {r['kernel']} ({r['config']['variant']}): {dots}")
    lines.append("")
    lines.append(
        "FLOP model (matmul FLOPs per query-key pair; ideal = diffattn.bench.attention.attention_flops, one DIFF "
        "head pair: forward 2(2d + 2dv), backward 2(6d + 2dv)):"
    )
    for r in rows:
        if r["flops_ratio"] is None:
            continue
        dup = sum(d["flops_per_pair"] * (1 - 1 / d["duplication"]) for d in r["dots"])
        c = r["config"]
        tile = f", {c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}" if c.get("BLOCK_M") else ""
        lines.append(
            f"  {r['kernel']} ({c['variant']}, {r['kind']}{tile}): "
            f"{r['flops_per_pair']:.0f} / {r['ideal_flops_per_pair']:.0f}"
            f" = {r['flops_ratio']:.2f}x ideal ({dup:.0f} per pair of it is warp-layout duplication)"
        )
    spill = [f"{r['kernel']} ({r['config']['variant']})" for r in rows if r["spill_bytes"] and r["kind"] != "backward"]
    lines.append(
        f"Spills: {', '.join(spill) if spill else 'none'} (source: {rows[0]['spill_source'] if rows else '-'})"
    )
    return "\n".join(lines)


def _triton_version(required: str | None) -> str:
    """'triton VERSION (PATH)' of the Triton this process imports; ToolchainMissing if it is not ``required``
    (e.g. when the side folder of an older Triton did not reach PYTHONPATH)."""
    try:
        import triton
    except ImportError as err:
        raise ToolchainMissing(f"triton is not installed: {err}") from err
    where = f"triton {triton.__version__} ({Path(triton.__file__).parent})"
    if required and triton.__version__ != required:
        raise ToolchainMissing(f"{where} is not the triton {required} asked for by --require-triton")
    return where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--target", default="sm90", help="GPU architecture to compile for (default sm90 = H100)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--kernels", default=",".join(DEFAULT_KINDS), help=f"comma list of {', '.join(KINDS)}")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma list of V1 (d 64, dv 128), V2 (d 64, dv 64, K shared), W (d 128, dv 256), "
        "M (d 96, dv 192: paper-830m's heads; not by default)",
    )
    parser.add_argument(
        "--masks",
        default=",".join(DEFAULT_MASKS),
        help="comma list of user masks to compile each variant with: none, padding (2-D key padding), bool and "
        "additive (per-row 4-D [B, 1, T, S])",
    )
    parser.add_argument(
        "--short-t",
        default=",".join(map(str, SHORT_T)),
        help="comma list of query lengths T at which the short and prefill forwards are compiled",
    )
    parser.add_argument(
        "--configs", nargs="*", default=[], help="extra rows: KIND[:KEY=VAL,...], e.g. fwd:variant=V2,BLOCK_M=128"
    )
    parser.add_argument("--shape", default=",".join(map(str, DEFAULT_SHAPE)), help="B,H,HKV,T,S of the launches")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many processes (default 1)")
    parser.add_argument("--require-triton", help="exit 2 unless the imported triton is this version, e.g. 3.6.0")
    parser.add_argument("--json", help="write the rows as a JSON list to this path")
    parser.add_argument("--dump", help="also write each kernel's TTGIR and PTX into this folder")
    args = parser.parse_args(argv)
    # the kernels are compiled or interpreted from the moment their module is imported
    os.environ.pop("TRITON_INTERPRET", None)
    failures: list[dict] = []
    try:
        print(f"kernel_report: {_triton_version(args.require_triton)}", file=sys.stderr, flush=True)
        rows = kernel_report(
            target=args.target,
            dtype=args.dtype,
            kernels=[k for k in args.kernels.split(",") if k],
            variants=[v for v in args.variants.split(",") if v],
            masks=[m for m in args.masks.split(",") if m],
            short_t=tuple(int(x) for x in args.short_t.split(",") if x),
            configs=args.configs,
            shape=tuple(int(x) for x in args.shape.split(",")),
            dump=args.dump,
            progress=lambda msg: print(msg, file=sys.stderr, flush=True),
            jobs=args.jobs,
        )
    except ToolchainMissing as err:
        print(f"kernel_report: {err}", file=sys.stderr)
        return 2
    except CompileFailed as err:
        rows, failures = err.rows, err.failures
    except ValueError as err:
        parser.error(str(err))
    print(format_report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    if failures:
        lines = [f"kernel_report: {len(failures)} kernel launch(es) did not compile for {args.target}:"]
        lines += [f"  {_failure_text(f)}" for f in failures]
        print("\n".join(lines), file=sys.stderr)
        print(f"Compile failures: {len(failures)} (listed on stderr)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
