"""The decoding path of the fused kernel (flash-decoding), for a forward that needs no gradient and whose
programs would leave most of the GPU idle (few sequences, short T; DIFF Transformer Eq. 1, docs/methods.md §0).

The forward kernel (:mod:`.forward`, ``SPLIT``) then runs with one more grid axis over key ranges: each program
writes its rows' per-map outputs, normalised over its keys only, and their log-sum-exps to float32 buffers
``[splits, B·H·T, ...]``. ``_combine_kernel`` merges the splits, per map, and forms ``O1 − λ·O2`` in float32
(docs/methods.md §0.2). How many splits, and the tiles of a split forward, are :mod:`.tuning`'s choice
(``_num_splits``, ``_SPLIT_TILES``); the launch is :func:`.launch._fwd_run`'s.

``_decode_vector_kernel`` is a candidate for the split forward where a program has one query row (T = 1, one query
head per KV head: MHA, every preset): the same split rows by float32 vector products on the CUDA cores, one row a
program, instead of a 16-row tensor-core tile with one real row. It runs for a route ``triton[decode vec …]`` (the
route sweep's rows; auto's where the route table lists one for a decode class) or where forced for every call
(:data:`.tuning.DECODE_VECTOR`): :func:`.tuning._decode_vector`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile_ops import _MAX, _SUM, _head_offsets, _masked_scores


@triton.jit
def _combine_kernel(
    PO1, PO2, PL1, PL2, LAM, OUT, LSE1, LSE2,
    H, T, DV, R, NSPLIT,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # merge the key splits of the decoding forward, per map: O = Σ_s 2^(lse_s − lse) O_s, lse = log2 Σ_s 2^lse_s;
    # then O1 − λ·O2 in float32. A row that saw no key in any split keeps output 0 and lse +inf (as in _fwd_kernel).
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < R
    rows64 = rows.to(tl.int64)  # splits · R · DV may pass 2³¹
    offs_dv = tl.arange(0, BLOCK_DV)
    o_mask = ok[:, None] & (offs_dv < DV)[None, :]
    m1 = tl.full([BLOCK_R], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_R], float("-inf"), tl.float32)
    part = rows64  # sp · R + rows, stepped in 64 bits (sp · R itself would be a 32-bit product)
    for _sp in range(0, NSPLIT):
        m1 = tl.maximum(m1, tl.load(PL1 + part, mask=ok, other=float("-inf")))
        m2 = tl.maximum(m2, tl.load(PL2 + part, mask=ok, other=float("-inf")))
        part += R
    m1_safe = tl.where(m1 == float("-inf"), 0.0, m1)
    m2_safe = tl.where(m2 == float("-inf"), 0.0, m2)
    l1 = tl.full([BLOCK_R], 0.0, tl.float32)
    l2 = tl.full([BLOCK_R], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_R, BLOCK_DV], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_R, BLOCK_DV], 0.0, tl.float32)
    part = rows64
    for _sp in range(0, NSPLIT):
        w1 = tl.exp2(tl.load(PL1 + part, mask=ok, other=float("-inf")) - m1_safe)
        w2 = tl.exp2(tl.load(PL2 + part, mask=ok, other=float("-inf")) - m2_safe)
        p_ptr = part[:, None] * DV + offs_dv[None, :]
        acc1 += w1[:, None] * tl.load(PO1 + p_ptr, mask=o_mask, other=0.0)
        acc2 += w2[:, None] * tl.load(PO2 + p_ptr, mask=o_mask, other=0.0)
        l1 += w1
        l2 += w2
        part += R
    ok1 = l1 > 0.0
    ok2 = l2 > 0.0
    l1 = tl.where(ok1, l1, 1.0)
    l2 = tl.where(ok2, l2, 1.0)
    lam = tl.load(LAM + rows, mask=ok, other=0.0)  # rows index [B, H, T] like λ
    out = acc1 / l1[:, None] - lam[:, None] * (acc2 / l2[:, None])
    tl.store(OUT + rows64[:, None] * DV + offs_dv[None, :], out.to(OUT.dtype.element_ty), mask=o_mask)
    tl.store(LSE1 + rows, tl.where(ok1, m1_safe + tl.log2(l1), float("inf")), mask=ok)
    tl.store(LSE2 + rows, tl.where(ok2, m2_safe + tl.log2(l2), float("inf")), mask=ok)


@triton.jit
def _vector_softmax(acc, row_max, row_sum, s, v):
    # one map's online-softmax update for one query row against a key tile, in float32 on the CUDA cores: s [BN]
    # scores in log2 units, v [BN, BLOCK_DV]. Nothing visible yet: max −inf, so subtract 0 instead (no NaN)
    max_new = tl.maximum(row_max, tl.reduce(s, 0, _MAX))
    max_safe = tl.where(max_new == float("-inf"), 0.0, max_new)
    alpha = tl.exp2(row_max - max_safe)
    p = tl.exp2(s - max_safe)
    row_sum = row_sum * alpha + tl.reduce(p, 0, _SUM)
    acc = acc * alpha + tl.reduce(p[:, None] * v, 0, _SUM)
    return acc, max_new, row_sum


@triton.jit
def _decode_vector_kernel(
    Q1, K1, Q2, K2, V, MASK, PO1, PO2, PL1, PL2,
    sq1b, sq1h, sq2b, sq2h, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, sms,
    H, HKV, S, D, DV, qk_scale, R, SPLIT_LEN, V_HALF,
    MASK_KIND: tl.constexpr, SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr, DV_HALF: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # the decoding forward of one query row (T = 1, one query head per KV head: nothing to pack into a tile's rows)
    # by vector products instead of 16-row tensor-core tiles of which one row is real: program = (row b·H + h, key
    # split), keys [split·L, +L) with L = SPLIT_LEN rounded up to whole tiles of BLOCK_N (as in _fwd_kernel's SPLIT).
    # Scores s_i = K_i q_i and P_i·V are float32 sums over a [BLOCK_N, BLOCK_D] / [BLOCK_N, BLOCK_DV] tile in
    # registers: no shared-memory staging of operands and few registers, so several programs share an SM and hide
    # each other's load latency (what SGLang's and LightLLM's Triton decoding kernels do for one query head per KV
    # head). Writes the split's normalised per-map rows and log-sum-exps (−inf when it saw no key) to the
    # [splits, R, ...] float32 buffers _combine_kernel merges. A user mask row: key padding (smh = 0) or the row's
    # own row of a 4-D mask (T = 1: no position stride); causal is moot at T = 1 (the row sees every key).
    row = tl.program_id(0)
    b = row // H
    h = row % H
    hkv = h // (H // HKV)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    offs_d, offs_dv, d_ok, dv_ok = _head_offsets(D, DV, BLOCK_D, BLOCK_DV)
    q1 = tl.load(Q1 + b64 * sq1b + h64 * sq1h + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if SHARED_Q:  # noqa: SIM108 (compile-time branch) DiffK: one Q serves both maps
        q2 = q1
    else:
        q2 = tl.load(Q2 + b64 * sq2b + h64 * sq2h + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    k1_base = K1 + b64 * sk1b + hkv64 * sk1h
    k2_base = K2 + b64 * sk2b + hkv64 * sk2h
    v_base = V + b64 * svb + hkv64 * svh
    mask_base = MASK  # None without a user mask
    if MASK_KIND != 0:
        mask_base = MASK + b64 * smb + h64 * smh
    if DV_HALF > 0:  # noqa: SIM108 (compile-time branch) V as two halves: columns >= DV_HALF are V_HALF past va
        v_cols = tl.where(offs_dv < DV_HALF, offs_dv, offs_dv + (V_HALF - DV_HALF))
    else:
        v_cols = offs_dv

    split_len = (SPLIT_LEN + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    k_lo = tl.program_id(1) * split_len
    k_hi = tl.minimum(S, k_lo + split_len)
    m1 = tl.full([], float("-inf"), tl.float32)
    m2 = tl.full([], float("-inf"), tl.float32)
    l1 = tl.full([], 0.0, tl.float32)
    l2 = tl.full([], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_DV], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_DV], 0.0, tl.float32)
    for start_n in range(k_lo, k_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S  # a split ends on a tile boundary or at S: no tile reaches into the next split
        k_mask = n_ok[:, None] & d_ok[None, :]
        k1 = tl.load(k1_base + offs_n[:, None] * sk1s + offs_d[None, :], mask=k_mask, other=0.0).to(tl.float32)
        s1 = tl.reduce(k1 * q1[None, :], 1, _SUM) * qk_scale  # [BN], log2 units
        if SHARED_K:  # (a compile-time branch) DIFF V2, DAA, DiffQ: one K, read once
            s2 = tl.reduce(k1 * q2[None, :], 1, _SUM) * qk_scale
        else:
            k2 = tl.load(k2_base + offs_n[:, None] * sk2s + offs_d[None, :], mask=k_mask, other=0.0).to(tl.float32)
            s2 = tl.reduce(k2 * q2[None, :], 1, _SUM) * qk_scale
        s1 = tl.where(n_ok, s1, float("-inf"))
        s2 = tl.where(n_ok, s2, float("-inf"))
        if MASK_KIND != 0:
            mval = tl.load(mask_base + offs_n * sms, mask=n_ok, other=0)
            s1, s2 = _masked_scores(s1, s2, mval, MASK_KIND)
        v_mask = n_ok[:, None] & dv_ok[None, :]
        v = tl.load(v_base + offs_n[:, None] * svs + v_cols[None, :], mask=v_mask, other=0.0).to(tl.float32)
        acc1, m1, l1 = _vector_softmax(acc1, m1, l1, s1, v)
        acc2, m2, l2 = _vector_softmax(acc2, m2, l2, s2, v)

    ok1 = l1 > 0.0
    ok2 = l2 > 0.0
    part = tl.program_id(1).to(tl.int64) * R + row
    tl.store(PO1 + part * DV + offs_dv, acc1 / tl.where(ok1, l1, 1.0), mask=dv_ok)
    tl.store(PO2 + part * DV + offs_dv, acc2 / tl.where(ok2, l2, 1.0), mask=dv_ok)
    tl.store(PL1 + part, tl.where(ok1, m1 + tl.log2(tl.where(ok1, l1, 1.0)), float("-inf")))
    tl.store(PL2 + part, tl.where(ok2, m2 + tl.log2(tl.where(ok2, l2, 1.0)), float("-inf")))
