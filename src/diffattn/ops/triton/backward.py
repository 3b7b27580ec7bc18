"""The backward path of the fused kernel: gradients of both maps, of V and of λ (DIFF Transformer Eq. 1,
docs/methods.md §0), from the log-sum-exps and per-map outputs the forward (:mod:`.forward`) stored.

* **Preprocessing**, one small kernel over the rows: ``Δ_i = rowsum(dO ∘ O_i)``, and ``dλ = −Δ2`` per row, which
  comes for free from it.
* **One pass, FlashAttention-2 style** (``_bwd_dkdv_kernel`` with ``ATOMIC_DQ``), the differential structure
  exploited: ``G = dO·Vᵀ`` is computed once per tile and serves both maps (dP1 = G, dP2 = −λ·G), and
  ``dV = (P1 − λP2)ᵀ dO`` is a single product. A program owns a block of 128 keys and walks the query blocks of
  every query head of its GQA group, accumulating dK1, dK2, dV in registers and adding its share of dQ1, dQ2 to
  float32 buffers atomically: 6d + 2dv matmul FLOPs per query–key pair, the ideal. All tiles are laid out transposed
  (keys on rows), dQ as ``dQᵀ = Kᵀ·dSᵀ``, so every product has >= 64 rows and is a Hopper warpgroup MMA. The
  atomics make dQ's last bits vary run to run.
* **Two kernels, deterministic**: the key-block kernel without dQ, then ``_bwd_dq_kernel`` over query blocks, which
  recomputes P1, P2 and G for dQ1, dQ2 (1.4x the ideal), bit for bit the same every run. Which of the two runs is
  decided when the backward runs (:mod:`.launch`, :data:`.tuning.ATOMIC_DQ`).
* **The key-block kernel split in two** (:data:`.tuning.SPLIT_DKDV`, off until a GPU measures it faster): one
  launch accumulates dV alone (it needs neither V nor G), the next dK1, dK2 alone, each recomputing P1, P2 (2·2d more
  FLOPs per pair: 1.25x the key-block kernel's), for tiles as large as one of them allows — for wide heads (d = 128,
  dv = 256, whose three accumulators together leave room only for 32 × 32 tiles on mma.sync) and DIFF V1's (16
  queries a step together, 64 and 32 apart).
* **By TMA tiles** (:mod:`.backward_tma`, under :data:`.tuning.BWD_TMA` or :data:`.tuning.BWD_WS`, off until a GPU
  measures it faster): the two-kernel scheme for DIFF V1's and V2's heads without a mask, one query head per KV head,
  every tile a bulk tensor copy, its dK/dV kernel optionally warp-specialised.
* Only the query blocks on a key block's causal diagonal, or of a partial key block, form a causal or bounds mask;
  a user mask applies everywhere. A row whose every key is masked has log-sum-exp +inf, so its P, and every
  gradient it would give, is exactly 0.
* Segments (``SEGMENTS``, sequence packing) mask the pairs of different documents per tile, as in the forward, and a
  query block and key block with no document in common are skipped whole.

Precision: dot products take the input dtype with float32 accumulation, dS is rounded to the input dtype before
the dS·K and dSᵀ·Q products (as FlashAttention does); Δ, λ and the accumulators are float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile_ops import (
    _SUM,
    _dkdv_accumulate,
    _dq_accumulate,
    _head_offsets,
    _load_keys,
    _load_queries,
    _load_tile,
    _masked_scores,
    _row_block_longest_first,
    _row_statistics,
    _segment_range,
)


@triton.jit
def _bwd_preprocess_kernel(
    DO, O1, O2, DELTA1, DELTA2, DLAM, DQ1, DQ2,
    R, D, DV,
    ZERO_DQ1: tl.constexpr, ZERO_DQ2: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # the backward's row statistics in one pass over dO, O1, O2 (rows = B·H·T, all contiguous [R, DV]):
    # Δ_i = rowsum(dO ∘ O_i) = rowsum(P_i ∘ dP_i), dλ = −dO·O2 = −Δ2 (per row; autograd sums it to λ's shape),
    # all in float32; for the atomic-dQ backward also zero its float32 dQ rows, which are [R, D]
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < R
    offs_dv = tl.arange(0, BLOCK_DV)
    o_mask = ok[:, None] & (offs_dv < DV)[None, :]
    rows64 = rows.to(tl.int64)  # R · DV may pass 2³¹
    o_ptr = rows64[:, None] * DV + offs_dv[None, :]
    do = tl.load(DO + o_ptr, mask=o_mask, other=0.0).to(tl.float32)
    delta1 = tl.reduce(do * tl.load(O1 + o_ptr, mask=o_mask, other=0.0).to(tl.float32), 1, _SUM)
    delta2 = tl.reduce(do * tl.load(O2 + o_ptr, mask=o_mask, other=0.0).to(tl.float32), 1, _SUM)
    tl.store(DELTA1 + rows, delta1, mask=ok)
    tl.store(DELTA2 + rows, delta2, mask=ok)
    tl.store(DLAM + rows, -delta2, mask=ok)
    if ZERO_DQ1:
        offs_d = tl.arange(0, BLOCK_D)
        q_ptr = rows64[:, None] * D + offs_d[None, :]
        q_mask = ok[:, None] & (offs_d < D)[None, :]
        tl.store(DQ1 + q_ptr, tl.full([BLOCK_R, BLOCK_D], 0.0, tl.float32), mask=q_mask)
        if ZERO_DQ2:
            tl.store(DQ2 + q_ptr, tl.full([BLOCK_R, BLOCK_D], 0.0, tl.float32), mask=q_mask)


@triton.jit
def _bwd_dkdv_kernel(
    Q1, K1, Q2, K2, V, LAM, MASK, SEG, DO, LSE1, LSE2, DELTA1, DELTA2,
    DK1, DK2, DV_, DQ1, DQ2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, smt, sms,
    H, HKV, T, S, D, DV, scale, qk_scale, N_BUCKET,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    WITH_DK: tl.constexpr, WITH_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (key block, batch × kv head); it owns dK1, dK2, dV of its keys and visits every query head of
    # the GQA group, so they are accumulated in registers without atomics. ATOMIC_DQ (the default): also add
    # this key block's share of dQ1, dQ2 atomically into float32 buffers (FlashAttention-2's scheme: no second
    # pass that recomputes QKᵀ and dO·Vᵀ, at the price of atomics and run-to-run bit noise in dQ).
    # batch × kv head is the grid's fastest axis, so the first key blocks (when causal, those seen by the most
    # queries: the longest programs) of every head start first.
    # WITH_DK, WITH_DV: which accumulators this launch owns — both (one pass), or one each in two launches over the
    # same tiles (the split backward of wide heads, whose dK1, dK2 and dV together fill the registers: the dV pass
    # needs no V and no G = dO·Vᵀ, the dK pass no dV; each recomputes P1, P2). ATOMIC_DQ needs WITH_DK (dS)
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    rep = H // HKV
    loc_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < S
    offs_d, offs_dv, d_ok, dv_ok = _head_offsets(D, DV, BLOCK_D, BLOCK_DV)
    # addresses: 64-bit scalar offsets to this batch and KV head (below: each query head, and a mask's step),
    # 32-bit offsets within one head (_kernel_layout keeps each head's span below 2³¹ elements) or a mask tile.
    # No 64-bit vector lives across the loops (one did, and spilled)
    b64 = b.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    k_mask = n_ok[:, None] & d_ok[None, :]
    k1 = _load_tile(K1 + b64 * sk1b + hkv64 * sk1h + (offs_n[:, None] * sk1s + offs_d[None, :]), k_mask, UPCAST)
    if SHARED_K:
        k2 = k1
    else:
        k2 = _load_tile(K2 + b64 * sk2b + hkv64 * sk2h + (offs_n[:, None] * sk2s + offs_d[None, :]), k_mask, UPCAST)
    v_mask = n_ok[:, None] & dv_ok[None, :]
    # the accumulators this launch owns; where it owns none of them, K1 stands in, passed through the shared step
    # unread (tile_ops._dkdv_accumulate) and never stored
    v, dk1, dk2, dv = k1, k1, k1, k1
    if WITH_DK:  # G = dO·Vᵀ, for dS
        v = _load_tile(V + b64 * svb + hkv64 * svh + (offs_n[:, None] * svs + offs_dv[None, :]), v_mask, UPCAST)
        dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
        dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    if WITH_DV:
        dv = tl.full([BLOCK_N, BLOCK_DV], 0.0, tl.float32)

    shift = S - T
    m_lo = 0
    if CAUSAL:  # query i sees key j iff i >= j − (S − T): earlier query blocks see none of these keys
        m_lo = tl.maximum(pid_n * BLOCK_N - shift, 0) // BLOCK_M * BLOCK_M
    # query blocks from m_full on see every key of this block (all below the diagonal, the block inside [0, S))
    m_full = m_lo
    if CAUSAL:  # the first query block whose first row sees this block's last key, rounded up to a block
        m_full = (tl.maximum((pid_n + 1) * BLOCK_N - 1 - shift, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        m_full = tl.minimum(tl.maximum(m_full, m_lo), T)
    m_full = tl.where((pid_n + 1) * BLOCK_N > S, T, m_full)
    if MASK_KIND != 0 and not MASK_ROWS:  # key padding: one value per key of this block, read once
        key_mask = tl.load(MASK + b64 * smb + offs_n * sms, mask=n_ok, other=0)[:, None]
    seg_base = SEG  # None without segments; else this batch's document ids, and this key block's range of them
    if SEGMENTS:
        seg_base = SEG + b64 * S
        k_seg, k_seg_lo, k_seg_hi = _segment_range(seg_base, offs_n, n_ok)
    for r in range(0, rep):
        h = hkv * rep + r
        h64 = h.to(tl.int64)
        row_base = (b * H + h) * T
        q1_head = Q1 + b64 * sq1b + h64 * sq1h
        q2_head = Q2 + b64 * sq2b + h64 * sq2h
        row64 = tl.cast(row_base, tl.int64)
        do_head = DO + row64 * DV
        dq1_head = DQ1 + row64 * D
        dq2_head = DQ2 + row64 * D
        mask_head = MASK  # None without a user mask; else (a 4-D mask) at this batch and head
        if MASK_ROWS:
            mask_head = MASK + b64 * smb + h64 * smh
        for start_m in range(m_lo, T, BLOCK_M):
            offs_m = start_m + loc_m
            m_ok = offs_m < T
            visit = True
            if SEGMENTS:  # skip a query block with no document of this key block (query t is key t + S − T)
                q_seg, q_seg_lo, q_seg_hi = _segment_range(seg_base, offs_m + shift, m_ok)
                visit = (q_seg_hi >= k_seg_lo) & (q_seg_lo <= k_seg_hi)
            if visit:
                q1, q2, do = _load_queries(q1_head, q2_head, do_head, offs_m, m_ok, sq1t, sq2t, offs_d, d_ok, offs_dv,
                                           dv_ok, DV, SHARED_Q, UPCAST)  # fmt: skip
                lse1, lse2, delta1, delta2, lam = _row_statistics(
                    LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, offs_m, m_ok
                )
                lam = lam[None, :]  # λ of each query (column)

                # transposed tiles [BN, BM]: keys on rows, so dK/dV accumulate without transposing the big operands
                s1 = tl.dot(k1, tl.trans(q1), input_precision=PREC) * qk_scale
                s2 = tl.dot(k2, tl.trans(q2), input_precision=PREC) * qk_scale
                if MASK_KIND != 0:
                    if MASK_ROWS:
                        # the step's first row in 64 bits (T · S may pass 2³¹), then 32-bit offsets within the tile
                        step = mask_head + tl.cast(start_m, tl.int64) * smt  # (start_m: a Python int when interpreted)
                        mval = tl.load(
                            step + (loc_m[None, :] * smt + offs_n[:, None] * sms),
                            mask=n_ok[:, None] & m_ok[None, :],
                            other=0,
                        )
                    else:
                        mval = key_mask
                    s1, s2 = _masked_scores(s1, s2, mval, MASK_KIND)
                if SEGMENTS:
                    same = k_seg[:, None] == q_seg[None, :]
                    s1 = tl.where(same, s1, float("-inf"))
                    s2 = tl.where(same, s2, float("-inf"))
                # queries past T load lse = +inf, so their P is 0 unmasked; causality and the key bounds are applied
                # only where this block needs them (the diagonal blocks, a partial key block)
                p1 = tl.exp2(s1 - lse1[None, :])
                p2 = tl.exp2(s2 - lse2[None, :])
                if start_m < m_full:
                    keep = n_ok[:, None] & m_ok[None, :]
                    if CAUSAL:
                        keep = keep & (offs_n[:, None] <= offs_m[None, :] + shift)
                    p1 = tl.where(keep, p1, 0.0)
                    p2 = tl.where(keep, p2, 0.0)

                dk1, dk2, dv, ds1, ds2 = _dkdv_accumulate(dk1, dk2, dv, p1, p2, q1, q2, do, v, delta1[None, :],
                    delta2[None, :], lam, DT, SHARED_K, WITH_DK, WITH_DV, PREC)  # fmt: skip
                if ATOMIC_DQ:
                    # dQᵀ = Kᵀ dSᵀ, [d, BM]: its rows are the head dim (64), not the few query rows of the step, so
                    # this product is a warpgroup MMA too (dS·K would have BM = 16–32 rows: mma.sync only)
                    dq_ptr = offs_m[None, :] * D + offs_d[:, None]
                    dq_mask = m_ok[None, :] & d_ok[:, None]
                    dq1 = tl.dot(tl.trans(k1), ds1, input_precision=PREC) * scale
                    dq2 = tl.dot(tl.trans(k2), ds2, input_precision=PREC) * scale
                    if SHARED_Q:
                        tl.atomic_add(dq1_head + dq_ptr, dq1 + dq2, mask=dq_mask)
                    else:
                        tl.atomic_add(dq1_head + dq_ptr, dq1, mask=dq_mask)
                        tl.atomic_add(dq2_head + dq_ptr, dq2, mask=dq_mask)

    kv_head = (b64 * HKV + hkv64) * S  # this batch and KV head's first row of [B, Hkv, S]
    if WITH_DK:
        dk_ptr = kv_head * D + (offs_n[:, None] * D + offs_d[None, :])
        tl.store(DK1 + dk_ptr, (dk1 * scale).to(DK1.dtype.element_ty), mask=k_mask)
        if not SHARED_K:
            tl.store(DK2 + dk_ptr, (dk2 * scale).to(DK2.dtype.element_ty), mask=k_mask)
    if WITH_DV:
        dv_ptr = kv_head * DV + (offs_n[:, None] * DV + offs_dv[None, :])
        tl.store(DV_ + dv_ptr, dv.to(DV_.dtype.element_ty), mask=v_mask)


@triton.jit
def _bwd_dq_kernel(
    Q1, K1, Q2, K2, V, LAM, MASK, SEG, DO, LSE1, LSE2, DELTA1, DELTA2,
    DQ1, DQ2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, smt, sms,
    H, HKV, T, S, D, DV, scale, qk_scale, N_BUCKET,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (batch × query head, query block); it owns dQ1, dQ2 of its rows. Causal: the last query blocks
    # (the most keys) run first, as in the forward
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_m = _row_block_longest_first(CAUSAL)
    b = pid_bh // H
    h = pid_bh % H
    hkv = h // (H // HKV)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < T
    offs_d, offs_dv, d_ok, dv_ok = _head_offsets(D, DV, BLOCK_D, BLOCK_DV)
    # addresses: 64-bit scalar offsets to this batch and head (the mask: to this block's first row), 32-bit offsets
    # within one head (_kernel_layout keeps each head's span below 2³¹ elements) and within a mask tile
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    row_base = (b * H + h) * T  # rows of [B, H, T] (32-bit); dO and dQ hold each row's DV or D elements
    row64 = tl.cast(row_base, tl.int64)
    q1, q2, do = _load_queries(
        Q1 + b64 * sq1b + h64 * sq1h, Q2 + b64 * sq2b + h64 * sq2h, DO + row64 * DV,
        offs_m, m_ok, sq1t, sq2t, offs_d, d_ok, offs_dv, dv_ok, DV, SHARED_Q, UPCAST,
    )  # fmt: skip
    lse1, lse2, delta1, delta2, lam = _row_statistics(LSE1, LSE2, DELTA1, DELTA2, LAM, row_base, offs_m, m_ok)
    lam = lam[:, None]  # λ of each query row
    dq1 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    dq2 = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)

    shift = S - T
    if CAUSAL:  # noqa: SIM108
        kend = tl.minimum(tl.minimum((pid_m + 1) * BLOCK_M, T) + shift, S)
    else:
        kend = S
    k1_base = K1 + b64 * sk1b + hkv64 * sk1h
    k2_base = K2 + b64 * sk2b + hkv64 * sk2h
    v_base = V + b64 * svb + hkv64 * svh
    mask_base = MASK  # None without a user mask; else at this batch (and, for 4-D masks, head and first row)
    if MASK_KIND != 0:
        mask_base = MASK + b64 * smb
        if MASK_ROWS:
            mask_base += h64 * smh + (pid_m * BLOCK_M).to(tl.int64) * smt
    seg_base = SEG  # None without segments; else this batch's document ids, and this query block's (t: key t + S − T)
    if SEGMENTS:
        seg_base = SEG + b64 * S
        q_seg, q_seg_lo, q_seg_hi = _segment_range(seg_base, offs_m + shift, m_ok)
    loc_m = tl.arange(0, BLOCK_M)
    for start_n in range(0, kend, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        visit = True
        if SEGMENTS:  # skip a key tile with no document of this query block
            k_seg, k_seg_lo, k_seg_hi = _segment_range(seg_base, offs_n, n_ok)
            visit = (k_seg_hi >= q_seg_lo) & (k_seg_lo <= q_seg_hi)
        if visit:
            k1, k2, v = _load_keys(
                k1_base, k2_base, v_base, offs_n, sk1s, sk2s, svs, offs_d, offs_dv,
                n_ok[:, None] & d_ok[None, :], n_ok[:, None] & dv_ok[None, :], SHARED_K, UPCAST,
            )  # fmt: skip

            s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
            s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
            keep = m_ok[:, None] & n_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + shift)
            if SEGMENTS:
                keep = keep & (q_seg[:, None] == k_seg[None, :])
            if MASK_KIND != 0:
                if MASK_ROWS:
                    mptr = mask_base + (loc_m[:, None] * smt + offs_n[None, :] * sms)
                    mval = tl.load(mptr, mask=m_ok[:, None] & n_ok[None, :], other=0)
                else:
                    mval = tl.load(mask_base + offs_n * sms, mask=n_ok, other=0)[None, :]
                s1, s2 = _masked_scores(s1, s2, mval, MASK_KIND)
            p1 = tl.where(keep, tl.exp2(s1 - lse1[:, None]), 0.0)
            p2 = tl.where(keep, tl.exp2(s2 - lse2[:, None]), 0.0)
            dq1, dq2 = _dq_accumulate(dq1, dq2, p1, p2, k1, k2, do, v, delta1[:, None], delta2[:, None], lam, DT,
                                      SHARED_Q, PREC)  # fmt: skip

    dq_ptr = row64 * D + (offs_m[:, None] * D + offs_d[None, :])
    q_mask = m_ok[:, None] & d_ok[None, :]
    tl.store(DQ1 + dq_ptr, (dq1 * scale).to(DQ1.dtype.element_ty), mask=q_mask)
    if not SHARED_Q:
        tl.store(DQ2 + dq_ptr, (dq2 * scale).to(DQ2.dtype.element_ty), mask=q_mask)
