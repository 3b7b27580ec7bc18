"""The fused kernel's deterministic two-kernel backward by tensor-memory-accelerator (TMA) tiles, its dK/dV kernel
optionally warp-specialised: the backward half of issue 37's TMA candidate (:mod:`.forward_tma` is the forward's), off
by default (:data:`.tuning.BWD_TMA`, :data:`.tuning.BWD_WS`) until a GPU has timed it against the default backward
(:mod:`.backward`).

The same arithmetic as :mod:`.backward`'s two-kernel scheme (DIFF Transformer Eq. 1, docs/methods.md §0; the steps
themselves are :mod:`.tile_ops`' ``_dkdv_accumulate`` and ``_dq_accumulate``, shared with it): a dK/dV kernel over key
blocks (G = dO·Vᵀ once for both maps, dV = (P1 − λP2)ᵀ dO, dK_i = dS_iᵀ Q_i) and a dQ kernel over query blocks
recomputing P1, P2 and G, after :mod:`.backward`'s preprocessing (Δ1, Δ2, dλ). For the classes the training targets
are read on: no user mask or segments, one query head per KV head, Q1 apart from Q2 (K shared or not), 16-bit inputs
on a GPU, head widths powers of two (:func:`.tuning._bwd_tma`). Q, K, V, dO tiles are bulk tensor copies through
descriptors made per program over one head's rows (rows past the end read as zeros; stores past it are dropped), dK,
dV and dQ stored the same way; the row statistics (log-sum-exps, Δ, λ) are loaded as in :mod:`.backward`.

``WS`` (the dK/dV kernel under :data:`.tuning.BWD_WS`): its loop over query blocks warp-specialised — a producer warp
group loading, two consumer warp groups computing 64 keys each of the block's 128 (their stores go to the two halves:
checked in the TTGIR, and held so by the report's contract on the dots' rows). Triton 3.6 and 3.9 apply that on sm_90
to a kernel's only loop with no branch on the step inside, so this variant masks every step (the identity on whole
blocks: the same numbers). The dQ kernel is not warp-specialised: on its 64-row tiles both consumers took the same
rows, and on 128-row ones the pass failed (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .forward_tma import _head_rows, _key_tiles
from .tile_ops import _dkdv_accumulate, _dq_accumulate, _row_block_longest_first, _row_statistics


@triton.jit
def _dkdv_step(
    dk1, dk2, dv, k1, k2, v, q1_desc, q2_desc, do_desc, LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, start_m,
    offs_n, n_ok, T, shift, qk_scale,
    DT: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr,
    PREC: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    # one query block against this program's key block, tiles transposed [BN, BM] (keys on rows), as in .backward
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < T
    q1 = q1_desc.load([start_m, 0])
    q2 = q2_desc.load([start_m, 0])
    do = do_desc.load([start_m, 0])
    if UPCAST:  # the interpreter with bf16 inputs (see diffattn.ops.triton): exact in float32
        q1, q2, do = q1.to(tl.float32), q2.to(tl.float32), do.to(tl.float32)
    lse1, lse2, delta1, delta2, lam = _row_statistics(LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, offs_m, m_ok)
    lam = lam[None, :]  # λ of each query (column)
    s1 = tl.dot(k1, tl.trans(q1), input_precision=PREC) * qk_scale
    s2 = tl.dot(k2, tl.trans(q2), input_precision=PREC) * qk_scale
    # queries past T load lse = +inf, so their P is 0 unmasked
    p1 = tl.exp2(s1 - lse1[None, :])
    p2 = tl.exp2(s2 - lse2[None, :])
    if MASKED:
        keep = n_ok[:, None] & m_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + shift)
        p1 = tl.where(keep, p1, 0.0)
        p2 = tl.where(keep, p2, 0.0)
    dk1, dk2, dv, _, _ = _dkdv_accumulate(dk1, dk2, dv, p1, p2, q1, q2, do, v, delta1[None, :], delta2[None, :], lam,
                                          DT, SHARED_K, True, True, PREC)  # fmt: skip
    return dk1, dk2, dv


@triton.jit
def _bwd_dkdv_tma_kernel(
    Q1, K1, Q2, K2, V, LAM, DO, LSE1, LSE2, DELTA1, DELTA2, DK1, DK2, DV_,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs,
    H, T, S, scale, qk_scale,
    CAUSAL: tl.constexpr, SHARED_K: tl.constexpr, WS: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (batch × head, key block): dK1, dK2, dV of its keys, over every query block that sees them
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b64 = (pid_bh // H).to(tl.int64)
    h64 = (pid_bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < S
    k1_desc = _head_rows(K1 + b64 * sk1b + h64 * sk1h, S, sk1s, BLOCK_N, BLOCK_D)
    k2_desc = _head_rows(K2 + b64 * sk2b + h64 * sk2h, S, sk2s, BLOCK_N, BLOCK_D)
    v_desc = _head_rows(V + b64 * svb + h64 * svh, S, svs, BLOCK_N, BLOCK_DV)
    k1, k2, v = _key_tiles(k1_desc, k2_desc, v_desc, start_n, SHARED_K, UPCAST)  # this program's key block
    row_base = (pid_bh * T).to(tl.int64)  # this head's first row of [B, H, T] (dO: DV elements a row)
    q1_desc = _head_rows(Q1 + b64 * sq1b + h64 * sq1h, T, sq1t, BLOCK_M, BLOCK_D)
    q2_desc = _head_rows(Q2 + b64 * sq2b + h64 * sq2h, T, sq2t, BLOCK_M, BLOCK_D)
    do_desc = _head_rows(DO + row_base * BLOCK_DV, T, BLOCK_DV, BLOCK_M, BLOCK_DV)
    dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_DV], 0.0, tl.float32)

    shift = S - T
    m_lo = 0
    m_full = 0
    if CAUSAL:  # query i sees key j iff i >= j − (S − T): earlier query blocks see none of these keys
        m_lo = tl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        # the first query block whose first row sees this block's last key, rounded up to a block
        m_full = (tl.maximum(start_n + BLOCK_N - 1 - shift, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        m_full = tl.minimum(tl.maximum(m_full, m_lo), T)
    m_full = tl.where(start_n + BLOCK_N > S, T, m_full)  # a partial key block: every query block masks
    if WS:  # one loop, every block masked (module docstring)
        for start_m in tl.range(m_lo, T, BLOCK_M, warp_specialize=True):
            dk1, dk2, dv = _dkdv_step(dk1, dk2, dv, k1, k2, v, q1_desc, q2_desc, do_desc, LSE1, LSE2, DELTA1, DELTA2,
                                      LAM, row_base, start_m, offs_n, n_ok, T, shift, qk_scale,
                                      DT, True, CAUSAL, SHARED_K, UPCAST, PREC, BLOCK_M)  # fmt: skip
    else:  # the diagonal and partial blocks masked, then the blocks that see every key whole
        for start_m in range(m_lo, m_full, BLOCK_M):
            dk1, dk2, dv = _dkdv_step(dk1, dk2, dv, k1, k2, v, q1_desc, q2_desc, do_desc, LSE1, LSE2, DELTA1, DELTA2,
                                      LAM, row_base, start_m, offs_n, n_ok, T, shift, qk_scale,
                                      DT, True, CAUSAL, SHARED_K, UPCAST, PREC, BLOCK_M)  # fmt: skip
        for start_m in range(m_full, T, BLOCK_M):
            dk1, dk2, dv = _dkdv_step(dk1, dk2, dv, k1, k2, v, q1_desc, q2_desc, do_desc, LSE1, LSE2, DELTA1, DELTA2,
                                      LAM, row_base, start_m, offs_n, n_ok, T, shift, qk_scale,
                                      DT, False, CAUSAL, SHARED_K, UPCAST, PREC, BLOCK_M)  # fmt: skip

    kv_rows = pid_bh.to(tl.int64) * S  # this head's first row of dK1, dK2, dV ([B, H, S, ·] contiguous)
    _head_rows(DK1 + kv_rows * BLOCK_D, S, BLOCK_D, BLOCK_N, BLOCK_D).store(
        [start_n, 0], (dk1 * scale).to(DK1.dtype.element_ty)
    )
    if not SHARED_K:
        _head_rows(DK2 + kv_rows * BLOCK_D, S, BLOCK_D, BLOCK_N, BLOCK_D).store(
            [start_n, 0], (dk2 * scale).to(DK2.dtype.element_ty)
        )
    _head_rows(DV_ + kv_rows * BLOCK_DV, S, BLOCK_DV, BLOCK_N, BLOCK_DV).store(
        [start_n, 0], dv.to(DV_.dtype.element_ty)
    )


@triton.jit
def _bwd_dq_tma_kernel(
    Q1, K1, Q2, K2, V, LAM, DO, LSE1, LSE2, DELTA1, DELTA2, DQ1, DQ2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs,
    H, T, S, scale, qk_scale,
    CAUSAL: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (batch × head, query block, the longest first when causal): dQ1, dQ2 of its rows, every key tile
    # masked as in .backward's dQ kernel (which masks every tile too)
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_m = _row_block_longest_first(CAUSAL)
    b64 = (pid_bh // H).to(tl.int64)
    h64 = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < T
    row_base = (pid_bh * T).to(tl.int64)
    q1 = _head_rows(Q1 + b64 * sq1b + h64 * sq1h, T, sq1t, BLOCK_M, BLOCK_D).load([start_m, 0])
    q2 = _head_rows(Q2 + b64 * sq2b + h64 * sq2h, T, sq2t, BLOCK_M, BLOCK_D).load([start_m, 0])
    do = _head_rows(DO + row_base * BLOCK_DV, T, BLOCK_DV, BLOCK_M, BLOCK_DV).load([start_m, 0])
    if UPCAST:
        q1, q2, do = q1.to(tl.float32), q2.to(tl.float32), do.to(tl.float32)
    lse1, lse2, delta1, delta2, lam = _row_statistics(LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, offs_m, m_ok)
    lam = lam[:, None]  # λ of each query row
    k1_desc = _head_rows(K1 + b64 * sk1b + h64 * sk1h, S, sk1s, BLOCK_N, BLOCK_D)
    k2_desc = _head_rows(K2 + b64 * sk2b + h64 * sk2h, S, sk2s, BLOCK_N, BLOCK_D)
    v_desc = _head_rows(V + b64 * svb + h64 * svh, S, svs, BLOCK_N, BLOCK_DV)
    dq1 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    shift = S - T
    if CAUSAL:  # noqa: SIM108
        kend = tl.minimum(tl.minimum(start_m + BLOCK_M, T) + shift, S)
    else:
        kend = S
    for start_n in range(0, kend, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v = _key_tiles(k1_desc, k2_desc, v_desc, start_n, SHARED_K, UPCAST)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
        keep = m_ok[:, None] & (offs_n < S)[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + shift)
        p1 = tl.where(keep, tl.exp2(s1 - lse1[:, None]), 0.0)
        p2 = tl.where(keep, tl.exp2(s2 - lse2[:, None]), 0.0)
        dq1, dq2 = _dq_accumulate(dq1, dq2, p1, p2, k1, k2, do, v, delta1[:, None], delta2[:, None], lam, DT, False,
                                  PREC)  # fmt: skip

    _head_rows(DQ1 + row_base * BLOCK_D, T, BLOCK_D, BLOCK_M, BLOCK_D).store(
        [start_m, 0], (dq1 * scale).to(DQ1.dtype.element_ty)
    )
    _head_rows(DQ2 + row_base * BLOCK_D, T, BLOCK_D, BLOCK_M, BLOCK_D).store(
        [start_m, 0], (dq2 * scale).to(DQ2.dtype.element_ty)
    )
