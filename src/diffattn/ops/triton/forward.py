"""The forward path of the fused kernel: both maps' attention and their difference in one pass over the keys
(DIFF Transformer Eq. 1, docs/methods.md §0):

    out = softmax(Q1 K1ᵀ·s + M) V − λ · softmax(Q2 K2ᵀ·s + M) V

* **One pass over K/V tiles.** Each program owns a block of query rows and keeps *two* online-softmax accumulators
  (running max, running sum, un-normalised ``P_i V``), one per map, against the same V tile. Both log-sum-exps are
  stored for the backward (:mod:`.backward`); both per-map outputs ``O1 = P1 V`` and ``O2 = P2 V`` are stored only
  when a gradient will be needed (they give the backward's row sums ``Δ_i = rowsum(dO ∘ O_i)`` without an extra
  pass). ``O = O1 − λ·O2`` is formed in float32 (docs/methods.md §0.2) before the one rounding to the output dtype.
  The alternative — a first pass for both log-sum-exps and a second for ``(P1 − λP2) V`` — has the same FLOPs
  (4 QKᵀ + 1 PV vs 2 QKᵀ + 2 PV with V of width 2d) but reads K twice; the one-pass form is the default.
* **GQA rows are packed.** A program serves one KV head and a block of rows drawn from all ``H/Hkv`` query heads of
  its group (row r ↦ head r // T, position r % T), so decoding (T = 1) fills a tile with the group's heads and
  every K/V byte is read once per group.
* **Masked tiles only where needed.** Causal is bottom-right aligned (query i sees keys j <= i + S − T); only the
  tiles on the causal diagonal and the last partial tile form a causal or bounds mask, and causal row blocks run
  longest-first. A user mask (key padding or a 4-D mask, :mod:`.launch`) applies on every tile; a row with every key
  masked gives output 0 and stores log-sum-exp +inf, which makes its backward P exactly 0.
* **Segments** (``SEGMENTS``, sequence packing): a document id per token ([B, S] int32) is read per tile and a key of
  another document than the row's is masked, no [T, S] mask formed; a key tile whose id range misses the query
  block's is skipped whole.
* **Key splits** (``SPLIT``, decoding): a program takes one range of keys and writes float32 partial outputs and
  log-sum-exps, which :mod:`.decode` merges.
* **By TMA tiles** (:mod:`.forward_tma`, DIFF V1's and V2's heads without a mask under :data:`.tuning.FWD_TMA`, off
  until a GPU measures it faster): the same arithmetic, one query head's rows a program, every tile a bulk tensor
  copy.
* **Column blocks** (``COLUMNS``, wide heads under :data:`.tuning.FWD_COLUMNS`, off until a GPU measures it faster):
  a program takes one block of V's and O's columns and recomputes both maps' scores for it (1.33x the FLOPs at
  d = 128, dv = 256), so its accumulators are half as wide and its tiles can be 128 rows on wgmma instead of 32 × 32.

Precision: dot products take the input dtype with float32 accumulation, probabilities are rounded to the input dtype
before the P·V product (as FlashAttention does); softmax statistics, λ and the subtraction are float32. Scores are
in log2 units (``qk_scale`` = scale · log2 e), so the softmax runs on exp2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile_ops import (
    _MAX,
    _SUM,
    _head_offsets,
    _key_tile_documents,
    _load_keys,
    _load_tile,
    _masked_scores,
    _row_block_longest_first,
    _segment_range,
)


@triton.jit
def _online_softmax(acc, row_max, row_sum, s, v, DT: tl.constexpr, PREC: tl.constexpr):
    # one map's online-softmax update against a key tile (scores s in log2 units): running max, running sum and
    # un-normalised P·V (acc). A row with nothing visible yet keeps max −inf, so subtract 0 instead (no NaN)
    max_new = tl.maximum(row_max, tl.reduce(s, 1, _MAX))
    max_safe = tl.where(max_new == float("-inf"), 0.0, max_new)
    alpha = tl.exp2(row_max - max_safe)
    p = tl.exp2(s - max_safe[:, None])
    row_sum = row_sum * alpha + tl.reduce(p, 1, _SUM)
    acc = acc * alpha[:, None] + tl.dot(p.to(DT).to(v.dtype), v, input_precision=PREC)
    return acc, max_new, row_sum


@triton.jit
def _normalised(acc, row_max, row_sum, EMPTY_LSE: tl.constexpr):
    # one map's output rows and log-sum-exps (log2 units) from its online softmax's end state. A row that saw no key
    # (row sum 0) attends to nothing: output 0, and log-sum-exp EMPTY_LSE (+inf: the backward's P exactly 0; a key
    # split's partial row, −inf: the merge weighs it 0)
    ok = row_sum > 0.0
    row_sum = tl.where(ok, row_sum, 1.0)
    return acc / row_sum[:, None], tl.where(ok, row_max + tl.log2(row_sum), EMPTY_LSE)


@triton.jit
def _fwd_tile(
    acc1, acc2, m1, m2, l1, l2, q1, q2, start_n, k1_base, k2_base, v_base, sk1s, sk2s, svs,
    mask_base, mask_rows, sms, t_row, row_ok, shift, S, offs_d, d_ok, dv_ok, qk_scale, v_cols, q_seg, k_seg,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr,
    SEGMENTS: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # one key tile of the forward: both maps' scores against it, their online-softmax updates, P_i·V.
    # MASKED = False: a tile every row of the block sees whole (below the causal diagonal, inside [0, S)), so no
    # causal or bounds mask is formed; only a user mask (MASK_KIND) still applies there.
    # Addresses: k1_base, k2_base, v_base point at this batch and KV head (64-bit), keys are 32-bit offsets from
    # there (_kernel_layout keeps one head's span below 2³¹ elements); mask_base is the user mask at this batch
    # (key padding), mask_rows the [BM] pointers to the block's rows in a 4-D mask (MASK_ROWS: 64-bit, since
    # T · S may pass 2³¹)
    DT = k1_base.dtype.element_ty  # the input dtype: probabilities are rounded to it before the P·V product
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < S
    if MASKED:
        k_mask = n_ok[:, None] & d_ok[None, :]
        v_mask = n_ok[:, None] & dv_ok[None, :]
    else:
        k_mask = d_ok[None, :]
        v_mask = dv_ok[None, :]
    k1, k2, v = _load_keys(
        k1_base, k2_base, v_base, offs_n, sk1s, sk2s, svs, offs_d, v_cols, k_mask, v_mask, SHARED_K, UPCAST
    )

    s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale  # [BM, BN], log2 units
    s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
    if MASKED:
        keep = n_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= t_row[:, None] + shift)
        s1 = tl.where(keep, s1, float("-inf"))
        s2 = tl.where(keep, s2, float("-inf"))
    if MASK_KIND != 0:
        if MASK_ROWS:
            mptr = mask_rows[:, None] + offs_n[None, :] * sms
            mval = tl.load(mptr, mask=row_ok[:, None] & n_ok[None, :], other=0)
        else:  # key padding: one value per key, shared by every row of the block
            mval = tl.load(mask_base + offs_n * sms, mask=n_ok, other=0)[None, :]
        s1, s2 = _masked_scores(s1, s2, mval, MASK_KIND)
    if SEGMENTS:  # q_seg: the rows' documents [BM], k_seg: this tile's keys' [BN]
        same = q_seg[:, None] == k_seg[None, :]
        s1 = tl.where(same, s1, float("-inf"))
        s2 = tl.where(same, s2, float("-inf"))

    acc1, m1, l1 = _online_softmax(acc1, m1, l1, s1, v, DT, PREC)
    acc2, m2, l2 = _online_softmax(acc2, m2, l2, s2, v, DT, PREC)
    return acc1, acc2, m1, m2, l1, l2


@triton.jit
def _fwd_kernel(
    Q1, K1, Q2, K2, V, LAM, MASK, SEG,
    OUT, O1, O2, LSE1, LSE2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, smt, sms,
    H, HKV, T, S, D, DV, qk_scale, R, SPLIT_LEN, N_BUCKET, V_HALF,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr, SAVE_PARTS: tl.constexpr, SPLIT: tl.constexpr,
    DV_HALF: tl.constexpr, COLUMNS: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (block of packed rows, batch × kv head[, key split]); a row is (query head of the group, query
    # position). SPLIT (decoding, few programs): program_id(2) takes keys [split·L, +L), L = SPLIT_LEN rounded up to
    # whole tiles of BLOCK_N, and writes per-split normalised outputs and log-sum-exps (−inf when it saw no key) to
    # O1/O2/LSE1/LSE2, which are then [splits, R = B·H·T, ...] float32 buffers that _combine_kernel merges
    # (flash-decoding).
    # COLUMNS (wide heads, not with SPLIT): program_id(2) takes output columns [c·BLOCK_DV, +BLOCK_DV) of V and O
    # only, recomputing both maps' scores and softmax statistics (identical in every column program, so each stores
    # the same log-sum-exps): accumulators of half the width, for tiles the whole width leaves no registers for.
    # Batch × head is the grid's fastest axis and, when causal, the row blocks run last-first: the blocks with the
    # most keys start first and the short ones fill the tail of the launch
    pid_bh = tl.program_id(0)
    pid_m = _row_block_longest_first(CAUSAL)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    rep = H // HKV
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < rep * T
    h_row = hkv * rep + rows // T
    t_row = rows % T
    offs_d, offs_dv, d_ok, dv_ok = _head_offsets(D, DV, BLOCK_D, BLOCK_DV)
    if COLUMNS:  # this program's block of V's and O's columns
        offs_dv = tl.program_id(2) * BLOCK_DV + offs_dv
        dv_ok = offs_dv < DV
    # 64-bit element offsets wherever a tensor may hold 2³¹ elements or more: batch and head offsets, this block's
    # rows (they span query heads), the rows of a 4-D mask and of the outputs. 32-bit: keys within one KV head
    # (_kernel_layout keeps each head's span below 2³¹) and row indices b·H·T + h·T + t (B·H·T < 2³¹, checked)
    b64 = b.to(tl.int64)
    h64 = h_row.to(tl.int64)
    t64 = t_row.to(tl.int64)

    q_mask = row_ok[:, None] & d_ok[None, :]
    q1 = _load_tile(Q1 + b64 * sq1b + (h64 * sq1h + t64 * sq1t)[:, None] + offs_d[None, :], q_mask, UPCAST)
    if SHARED_Q:  # DiffK: one Q serves both maps
        q2 = q1
    else:
        q2 = _load_tile(Q2 + b64 * sq2b + (h64 * sq2h + t64 * sq2t)[:, None] + offs_d[None, :], q_mask, UPCAST)
    lam = tl.load(LAM + (b * H + h_row) * T + t_row, mask=row_ok, other=0.0)  # λ per row: [B, H, T] float32

    # causal, bottom-right aligned: row t sees keys j <= t + S − T, so no key past the block's last row's limit.
    # Keys below k_full are visible to every row of the block and lie inside [0, S): their tiles need no causal
    # or boundary mask (only the diagonal and the last partial tile do, as in FlashAttention)
    shift = S - T
    if CAUSAL:
        kend = tl.minimum(tl.reduce(tl.where(row_ok, t_row, 0), 0, _MAX) + 1 + shift, S)
        k_full = -tl.reduce(tl.where(row_ok, -t_row, -T), 0, _MAX) + 1 + shift  # the block's smallest t, + 1
    else:
        kend = S
        k_full = S
    k_full = tl.minimum(k_full, S) // BLOCK_N * BLOCK_N

    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.full([BLOCK_M], 0.0, tl.float32)
    l2 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)

    hkv64 = hkv.to(tl.int64)
    k1_base = K1 + b64 * sk1b + hkv64 * sk1h
    k2_base = K2 + b64 * sk2b + hkv64 * sk2h
    v_base = V + b64 * svb + hkv64 * svh
    mask_base = MASK  # None without a user mask
    mask_rows = MASK
    if MASK_KIND != 0:
        mask_base = MASK + b64 * smb
        mask_rows = mask_base + (h64 * smh + t64 * smt)  # the block's rows in a 4-D mask (MASK_ROWS)
    seg_base = SEG  # None without segments; else this batch's [S] document ids, and the rows' (row t: key t + S − T)
    q_seg = SEG
    seg_lo = 0
    seg_hi = 0
    if SEGMENTS:
        seg_base = SEG + b64 * S
        q_seg, seg_lo, seg_hi = _segment_range(seg_base, t_row + shift, row_ok)
    if SPLIT:
        # whole tiles of this launch's BLOCK_N a split, so that no tile straddles two splits: the host's SPLIT_LEN is
        # a multiple of the tile it planned with, and a launch on a longer tile (a candidate's, a test's) rounds it
        # up — the splits then still cover [0, S) once, the last ones possibly empty (their rows' lse −inf, weight 0)
        split_len = (SPLIT_LEN + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        k_lo = tl.program_id(2) * split_len
        k_hi = tl.minimum(kend, k_lo + split_len)
    else:
        k_lo = 0
        k_hi = kend
    k_mid = tl.maximum(tl.minimum(k_full, k_hi), k_lo)
    if DV_HALF > 0:  # noqa: SIM108 (compile-time branch) V as two halves: columns >= DV_HALF are V_HALF past va
        v_cols = tl.where(offs_dv < DV_HALF, offs_dv, offs_dv + (V_HALF - DV_HALF))
    else:
        v_cols = offs_dv
    # FlashAttention's two phases, unrolled at compile time: the tiles every row sees whole (k_lo..k_mid, no causal
    # or bounds mask formed), then the diagonal and boundary tiles (k_mid..k_hi, MASKED)
    for phase in tl.static_range(2):
        for start_n in range(k_mid if phase == 1 else k_lo, k_hi if phase == 1 else k_mid, BLOCK_N):
            # a compile-time branch at the call site: triton 3.6 cannot pass seg_base (None without segments) into
            # a jit function (`cannot convert None of type NoneType to tensor`); newer tritons can
            if SEGMENTS:
                k_seg, visit = _key_tile_documents(seg_base, start_n, S, seg_lo, seg_hi, SEG, SEGMENTS, BLOCK_N)
            else:
                k_seg = SEG
                visit = True
            if visit:
                acc1, acc2, m1, m2, l1, l2 = _fwd_tile(acc1, acc2, m1, m2, l1, l2, q1, q2, start_n, k1_base,
                    k2_base, v_base, sk1s, sk2s, svs, mask_base, mask_rows, sms, t_row, row_ok, shift, S, offs_d,
                    d_ok, dv_ok, qk_scale, v_cols, q_seg, k_seg,
                    phase == 1, CAUSAL, MASK_KIND, MASK_ROWS, SEGMENTS, SHARED_K, UPCAST, PREC, BLOCK_N)  # fmt: skip

    row_off = (b * H + h_row) * T + t_row
    o_mask = row_ok[:, None] & dv_ok[None, :]
    if SPLIT:  # a key split's partial rows, merged by the decoding path's combine kernel
        o1, lse1 = _normalised(acc1, m1, l1, float("-inf"))
        o2, lse2 = _normalised(acc2, m2, l2, float("-inf"))
        part = tl.program_id(2).to(tl.int64) * R + row_off
        p_ptr = part[:, None] * DV + offs_dv[None, :]
        tl.store(O1 + p_ptr, o1, mask=o_mask)
        tl.store(O2 + p_ptr, o2, mask=o_mask)
        tl.store(LSE1 + part, lse1, mask=row_ok)
        tl.store(LSE2 + part, lse2, mask=row_ok)
    else:
        o1, lse1 = _normalised(acc1, m1, l1, float("inf"))
        o2, lse2 = _normalised(acc2, m2, l2, float("inf"))
        out = o1 - lam[:, None] * o2  # float32 subtraction (docs/methods.md §0.2)
        o_ptr = row_off.to(tl.int64)[:, None] * DV + offs_dv[None, :]
        tl.store(OUT + o_ptr, out.to(OUT.dtype.element_ty), mask=o_mask)
        tl.store(LSE1 + row_off, lse1, mask=row_ok)
        tl.store(LSE2 + row_off, lse2, mask=row_ok)
        if SAVE_PARTS:
            tl.store(O1 + o_ptr, o1.to(O1.dtype.element_ty), mask=o_mask)
            tl.store(O2 + o_ptr, o2.to(O2.dtype.element_ty), mask=o_mask)
