"""The ``@triton.jit`` steps the fused kernels share (two-map attention, DIFF Transformer Eq. 1, docs/methods.md §0):
a head's column offsets, loading a pair of operands that the two maps may share, a key/value tile, a query block
with its gradient and row statistics, and the user mask applied to both maps' scores under the masking rule of
:mod:`diffattn.ops._inputs` (docs/methods.md §0.2).

Triton inlines every one of them into the kernel that calls it, so they change no generated code (the sm_90 report
of ``benchmarks/kernel_report.py`` is the same with them as with the steps written out); each exists so that the
forward (:mod:`.forward`), the backward (:mod:`.backward`) and the decoding merge (:mod:`.decode`) state it once.

Addresses follow the kernels' rule (:mod:`.launch`): the ``*_base`` / ``*_head`` pointers passed in already hold the
64-bit batch and head offsets, and the offsets added here are 32-bit offsets within one head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._inputs import mask_floor

# Row max / row sum are tl.reduce with the combine functions tl.max / tl.sum use themselves, and zeros are tl.full:
# tl.max, tl.sum and tl.zeros are @jit functions decorated when *triton* is imported, so they break the interpreter
# whenever triton was imported before TRITON_INTERPRET was set (by torch.compile or `diffattn info` earlier in the
# same process); the interpreter recognises these two combine functions and reduces with numpy.
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine

# The masking rule's threshold (diffattn.ops._inputs.mask_floor) for each mask dtype the kernels read: an additive
# mask value at or below it masks its key (-inf), so a row of finfo.min attends to nothing, as in every backend
_MASK_FLOOR_F16 = tl.constexpr(mask_floor(torch.float16))
_MASK_FLOOR_BF16 = tl.constexpr(mask_floor(torch.bfloat16))
_MASK_FLOOR_F32 = tl.constexpr(mask_floor(torch.float32))


@triton.jit
def _row_block_longest_first(CAUSAL: tl.constexpr):
    # the program's block of query rows (grid axis 1). Causal: the last blocks, which see the most keys, run first
    # and the short ones fill the tail of the launch
    pid_m = tl.program_id(1)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    return pid_m


@triton.jit
def _head_offsets(D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # the columns of a Q/K row (d, padded to BLOCK_D) and of a V/O row (dv, padded to BLOCK_DV), and which are real
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    return offs_d, offs_dv, d_ok, dv_ok


@triton.jit
def _load_tile(ptrs, mask, UPCAST: tl.constexpr):
    # UPCAST: interpreter + bf16 only (see diffattn.ops.triton); the values are exact in fp32
    x = tl.load(ptrs, mask=mask, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _load_keys(
    k1_base, k2_base, v_base, offs_n, sk1s, sk2s, svs, offs_d, v_cols, k_mask, v_mask,
    SHARED_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    # the key tile offs_n of K1, K2 ([BN, BLOCK_D]) and V ([BN, BLOCK_DV], columns v_cols) of one KV head.
    # SHARED_K: one K serves both maps (DAA / DiffQ / DIFF V2), read once. Each address is formed right before its
    # load: computing both first moved ptxas's register counts on sm_90 (benchmarks/kernel_report.py)
    k1 = _load_tile(k1_base + offs_n[:, None] * sk1s + offs_d[None, :], k_mask, UPCAST)
    if SHARED_K:  # noqa: SIM108 (compile-time branch)
        k2 = k1
    else:
        k2 = _load_tile(k2_base + offs_n[:, None] * sk2s + offs_d[None, :], k_mask, UPCAST)
    v = _load_tile(v_base + offs_n[:, None] * svs + v_cols[None, :], v_mask, UPCAST)
    return k1, k2, v


@triton.jit
def _load_queries(
    q1_head, q2_head, do_head, offs_m, m_ok, sq1t, sq2t, offs_d, d_ok, offs_dv, dv_ok, DV,
    SHARED_Q: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    # the backward's query block offs_m of one query head: Q1, Q2 ([BM, BLOCK_D]) and dO ([BM, BLOCK_DV], rows of DV
    # contiguous elements). SHARED_Q: one Q serves both maps (DiffK), read once
    q_mask = m_ok[:, None] & d_ok[None, :]
    q1 = _load_tile(q1_head + (offs_m[:, None] * sq1t + offs_d[None, :]), q_mask, UPCAST)
    if SHARED_Q:  # noqa: SIM108 (compile-time branch)
        q2 = q1
    else:
        q2 = _load_tile(q2_head + (offs_m[:, None] * sq2t + offs_d[None, :]), q_mask, UPCAST)
    do = _load_tile(do_head + (offs_m[:, None] * DV + offs_dv[None, :]), m_ok[:, None] & dv_ok[None, :], UPCAST)
    return q1, q2, do


@triton.jit
def _row_statistics(LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, offs_m, m_ok):
    # what the backward reads per query row of [B, H, T] (row_base: the head's first row): both maps' log-sum-exps
    # (+inf past T, so P is 0 there), Δ1, Δ2 of the preprocessing, and λ
    lse1 = tl.load(LSE1 + row_base + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=m_ok, other=float("inf"))
    delta1 = tl.load(DELTA1 + row_base + offs_m, mask=m_ok, other=0.0)
    delta2 = tl.load(DELTA2 + row_base + offs_m, mask=m_ok, other=0.0)
    lam = tl.load(LAM + row_base + offs_m, mask=m_ok, other=0.0)
    return lse1, lse2, delta1, delta2, lam


@triton.jit
def _dkdv_accumulate(
    dk1, dk2, dv, p1, p2, q1, q2, do, v, delta1, delta2, lam,
    DT: tl.constexpr, SHARED_K: tl.constexpr, WITH_DK: tl.constexpr, WITH_DV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    # one query step of a key block's gradients, tiles transposed [BN, BM] (keys on rows): dV = (P1 − λP2)ᵀ dO (the
    # signed map multiplies dO once); G = dO·Vᵀ is dP1 and dP2 = −λ·G (one product for both maps), dS_i = P_i ∘ (dP_i −
    # Δ_i) rounded to the input dtype DT, dK_i += dS_i Q_i. Returns the accumulators and dS1, dS2 (P1, P2 where
    # WITH_DK is off: not used then). λ, Δ1, Δ2: per query, [1, BM]
    ds1 = p1
    ds2 = p2
    if WITH_DV:
        dv += tl.dot((p1 - lam * p2).to(DT).to(do.dtype), do, input_precision=PREC)
    if WITH_DK:
        g = tl.dot(v, tl.trans(do), input_precision=PREC)
        ds1 = (p1 * (g - delta1)).to(DT).to(q1.dtype)
        ds2 = ((p2 * (g - delta2)) * (-lam)).to(DT).to(q2.dtype)
        dk1 += tl.dot(ds1, q1, input_precision=PREC)
        if SHARED_K:
            dk1 += tl.dot(ds2, q2, input_precision=PREC)
        else:
            dk2 += tl.dot(ds2, q2, input_precision=PREC)
    return dk1, dk2, dv, ds1, ds2


@triton.jit
def _dq_accumulate(
    dq1, dq2, p1, p2, k1, k2, do, v, delta1, delta2, lam,
    DT: tl.constexpr, SHARED_Q: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    # one key step of a query block's gradients, tiles [BM, BN]: G = dO·Vᵀ is dP1 and dP2 = −λ·G, dS_i = P_i ∘ (dP_i −
    # Δ_i) rounded to the input dtype DT, dQ_i += dS_i K_i (into dQ1 alone where SHARED_Q). λ, Δ1, Δ2: per row, [BM, 1]
    g = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds1 = p1 * (g - delta1)
    ds2 = (p2 * (g - delta2)) * (-lam)
    dq1 += tl.dot(ds1.to(DT).to(k1.dtype), k1, input_precision=PREC)
    if SHARED_Q:
        dq1 += tl.dot(ds2.to(DT).to(k2.dtype), k2, input_precision=PREC)
    else:
        dq2 += tl.dot(ds2.to(DT).to(k2.dtype), k2, input_precision=PREC)
    return dq1, dq2


@triton.jit
def _segment_range(seg_base, offs, ok):
    # the smallest and largest document id of the tokens offs (those with ok) of a packed row: a query block and a
    # key tile can share a document only if their ranges overlap, so a tile outside the block's is skipped whole
    seg = tl.load(seg_base + offs, mask=ok, other=0)
    hi = tl.reduce(tl.where(ok, seg, -2147483647), 0, _MAX)
    lo = -tl.reduce(tl.where(ok, -seg, -2147483647), 0, _MAX)
    return seg, lo, hi


@triton.jit
def _key_tile_documents(seg_base, start_n, S, seg_lo, seg_hi, SEG, SEGMENTS: tl.constexpr, BLOCK_N: tl.constexpr):
    # the document ids of the key tile at start_n, and whether it shares a document with the query block (whose
    # id range is seg_lo..seg_hi); without segments: (SEG, True), decided at compile time
    if SEGMENTS:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_seg, k_seg_lo, k_seg_hi = _segment_range(seg_base, offs_n, offs_n < S)
        return k_seg, (k_seg_hi >= seg_lo) & (k_seg_lo <= seg_hi)
    else:
        return SEG, True


@triton.jit
def _masked_scores(s1, s2, mval, MASK_KIND: tl.constexpr):
    # the user mask's value for each score of both maps (broadcast over rows for key padding): a bool mask
    # (MASK_KIND 1) hides the scores where it is 0; an additive one (2) is added, converted to log2 units, except
    # at or below the masking rule's threshold for its dtype, where it hides the score (-inf)
    if MASK_KIND == 1:
        s1 = tl.where(mval != 0, s1, float("-inf"))
        s2 = tl.where(mval != 0, s2, float("-inf"))
    else:
        if mval.dtype == tl.float16:
            floor = _MASK_FLOOR_F16
        elif mval.dtype == tl.bfloat16:
            floor = _MASK_FLOOR_BF16
        else:
            floor = _MASK_FLOOR_F32
        mval = mval.to(tl.float32)
        bias = tl.where(mval <= floor, float("-inf"), mval) * 1.4426950408889634
        s1 = s1 + bias
        s2 = s2 + bias
    return s1, s2
