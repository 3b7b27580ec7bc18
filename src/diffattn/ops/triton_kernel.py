"""Fused Triton kernels for two-map (differential) attention, forward and backward (DIFF Transformer Eq. 1,
docs/methods.md §0):

    out = softmax(Q1 K1ᵀ·s + M) V − λ · softmax(Q2 K2ᵀ·s + M) V

The ``triton`` backend of :func:`diffattn.ops.diff_attention`. What it does, and why:

* **Forward, one pass over K/V tiles.** Each program owns a block of query rows and keeps *two* online-softmax
  accumulators (running max, running sum, un-normalised ``P_i V``), one per map, against the same V tile.
  Both log-sum-exps are stored for the backward; both per-map outputs ``O1 = P1 V`` and ``O2 = P2 V`` are
  stored only when a gradient will be needed (they give the backward's row sums ``Δ_i = rowsum(dO ∘ O_i)``
  without an extra pass). ``O = O1 − λ·O2`` is formed in float32 (docs/methods.md §0.2) before the one rounding to the
  output dtype. The alternative — a first pass for both log-sum-exps and a second for ``(P1 − λP2) V`` — has
  the same FLOPs (4 QKᵀ + 1 PV vs 2 QKᵀ + 2 PV with V of width 2d) but reads K twice; it was not measured
  (no GPU was lent when this was written), so the one-pass form is the default.
* **GQA rows are packed.** A forward program serves one KV head and a block of rows drawn from all
  ``H/Hkv`` query heads of its group (row r ↦ head r // T, position r % T), so decoding (T = 1) fills a tile
  with the group's heads and every K/V byte is read once per group, as in the baseline.
* **Decoding splits the keys** (flash-decoding) when a forward needs no gradient and its programs would leave
  most SMs idle (few sequences, short T): each split writes per-map partial outputs and log-sum-exps, and a
  small kernel merges them and forms O1 − λ·O2.
* **Backward in one pass, FlashAttention-2 style**, with the differential structure exploited: ``G = dO·Vᵀ``
  is computed once per tile and serves both maps (dP1 = G, dP2 = −λ·G), ``dV = (P1 − λP2)ᵀ dO`` is a single
  product, and ``dλ = −Σ Δ2`` comes for free from the preprocessing. A program owns a block of 128 keys and
  walks the query blocks of every query head of its GQA group, accumulating dK1, dK2, dV in registers and
  adding its share of dQ1, dQ2 to float32 buffers atomically: 6d + 2dv matmul FLOPs per query–key pair, the
  ideal (the baseline's backward at the same d_model). All tiles are laid out transposed (keys on rows), dQ
  as ``dQᵀ = Kᵀ·dSᵀ``, so every product has >= 64 rows and is a Hopper warpgroup MMA. The atomics make dQ's
  last bits vary run to run; :data:`ATOMIC_DQ` = False, ``torch.use_deterministic_algorithms(True)`` (both read
  when the backward runs, not at the forward), heads wider than d = 64, dv = 128 and DIFF V1 heads with a per-row
  4-D mask take the deterministic two-kernel scheme instead (the key-block kernel without dQ, then one over query
  blocks that recomputes P1, P2 and G for dQ1, dQ2: 1.4x the ideal).
* **Shared operands.** When ``k1 is k2`` (DAA, DiffQ) the kernels load K once and accumulate one dK; when
  ``q1 is q2`` (DiffK) likewise for Q.
* **Masks.** Causal is bottom-right aligned (query i sees keys j <= i + S − T); the mask from
  :func:`~diffattn.ops._inputs.validate` — 2-D key padding (stored as [B, 1, 1, S]) or any 4-D bool/additive
  mask broadcastable to [B, H, T, S] — is read through its strides (0 on broadcast dims), never expanded (a
  mask whose rows do not start at multiples of 16 elements is read from a copy with padded rows, made once per
  mask: Triton vectorises only aligned loads).
  Masked keys follow the rule of :mod:`diffattn.ops._inputs` (an additive value at or below its threshold,
  :func:`~diffattn.ops._inputs.mask_floor`, is read as ``-inf``), and a row with every key masked gives 0 output
  and 0 gradient (its log-sum-exp is stored as +inf), like every backend.
* **Any length, head dims up to 128 (V up to 256).** Lengths need not be multiples of the block size and
  head dims are padded to a power of two >= 16 inside the kernel (loads are masked), so tiny test shapes work.
* **Autograd and torch.compile.** Forward and backward are ``torch.library.custom_op`` s with fake
  (meta) implementations and a registered autograd formula, so the op traces under ``torch.compile``.

Precision: dot products take the input dtype (fp16/bf16) with float32 accumulation, probabilities are rounded
to the input dtype before the P·V and dS·K products (as FlashAttention does); softmax statistics, λ and the
subtraction are float32. Float32 inputs use IEEE fp32 dots (not TF32) so the fp32 path matches ``reference``.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set *before* this module is first
imported, because ``triton.jit`` picks compiled or interpreted at decoration time): that is how the tests check
them without a GPU. The interpreter mis-multiplies bfloat16 (it feeds the raw 16-bit patterns to numpy's
matmul), so under the interpreter bfloat16 dot operands are widened to float32 after the same rounding —
numerically what a GPU's bf16 MMA with fp32 accumulation computes.

Addresses: batch and head offsets, a block's rows and the rows of a 4-D mask are 64-bit (a tensor may hold more
than 2³¹ elements); offsets within one head and row indices of [B, H, T] are 32-bit, kept in range by the host
(:func:`_kernel_layout`, :func:`_check_offsets`). Launches run under a device guard for the tensors' GPU
(:func:`_on_device`: Triton launches on the current device).

Tiles on a GPU: a default per kernel, head width and mask class (:data:`_TILES`, :data:`_MASK_TILES`), and for
the training forward and the single-pass backward a few alternatives that ``triton.autotune`` times on first use of
each shape class (:data:`_TUNING`, :data:`AUTOTUNE`). Every one of them is compiled ahead of time for sm_90 by
``benchmarks/kernel_report.py`` (registers, spills, MMA kind and warp layout of every dot), without a mask, with key
padding and with bool and additive 4-D masks, and held by the tests to no spills and wgmma for every dot, issued
once: the forward takes 128-row tiles on 8 warps so no warpgroup repeats another's dots. The forward masks only
the tiles that need it (the causal diagonal, the last partial tile), the backward only the query blocks on its key
block's diagonal or of a partial key block; causal blocks run longest-first. None of this has been timed on
hardware yet. A launch that is not autotuned and runs out of shared memory or registers retries with smaller
tiles.
"""

from __future__ import annotations

import contextlib
import logging
import weakref

import torch
import triton
import triton.language as tl

from ._inputs import DiffAttentionInputs, mask_floor

logger = logging.getLogger(__name__)

#: True when this module's kernels were built for Triton's interpreter (TRITON_INTERPRET=1 at first import).
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

#: Backward dQ scheme. True (default) = one pass over key blocks that also adds its share of dQ1, dQ2 with atomic
#: float32 adds (FlashAttention-2): the FLOP ideal, every product a warpgroup MMA on sm_90. False = a second kernel
#: over query blocks that recomputes QKᵀ and dO·Vᵀ (1.4x the ideal) but is bit-for-bit deterministic; it is also
#: used under ``torch.use_deterministic_algorithms(True)``, for heads wider than d = 64, dv = 128 (whose dK1, dK2,
#: dV accumulators for 128 keys do not fit in registers) and for d = 64, dv = 128 with a per-row 4-D mask. Read,
#: like deterministic mode, when the backward runs.
ATOMIC_DQ: bool = True

#: Key splits of the forward when it needs no gradient (flash-decoding), or None for the heuristic: split only when
#: the row blocks × batch × KV heads leave most of the GPU idle, as in decoding with few sequences.
SPLIT_OVERRIDE: int | None = None

#: (BLOCK_M, BLOCK_N) forced for every kernel, or None for the heuristics. Under the interpreter the default is
#: 16 × 16, so tiny test shapes span several (and partial) tiles.
BLOCK_OVERRIDE: tuple[int, int] | None = None

_LOG2E = 1.4426950408889634  # softmax runs in base 2 (exp2 is the hardware instruction); scores are pre-scaled

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


# --------------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(
    acc1, acc2, m1, m2, l1, l2, q1, q2, start_n, k1_base, k2_base, v_base, sk1s, sk2s, svs,
    mask_base, mask_rows, sms, t_row, row_ok, shift, S, offs_d, d_ok, offs_dv, dv_ok, qk_scale,
    v_cols,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr,
    SHARED_K: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
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
    k1 = tl.load(k1_base + offs_n[:, None] * sk1s + offs_d[None, :], mask=k_mask, other=0.0)
    if SHARED_K:  # noqa: SIM108
        k2 = k1  # DAA / DiffQ / DIFF V2: one K read serves both maps
    else:
        k2 = tl.load(k2_base + offs_n[:, None] * sk2s + offs_d[None, :], mask=k_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * svs + v_cols[None, :], mask=v_mask, other=0.0)
    if UPCAST:
        k1 = k1.to(tl.float32)
        k2 = k2.to(tl.float32)
        v = v.to(tl.float32)

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

    acc1, m1, l1 = _online_softmax(acc1, m1, l1, s1, v, DT, PREC)
    acc2, m2, l2 = _online_softmax(acc2, m2, l2, s2, v, DT, PREC)
    return acc1, acc2, m1, m2, l1, l2


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
def _fwd_kernel(
    Q1, K1, Q2, K2, V, LAM, MASK,
    OUT, O1, O2, LSE1, LSE2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t,
    sk1b, sk1h, sk1s, sk2b, sk2h, sk2s,
    svb, svh, svs,
    smb, smh, smt, sms,
    H, HKV, T, S, D, DV, qk_scale, R, SPLIT_LEN, N_BUCKET, V_HALF,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr, SAVE_PARTS: tl.constexpr, SPLIT: tl.constexpr,
    DV_HALF: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (block of packed rows, batch × kv head[, key split]); a row is (query head of the group, query
    # position). SPLIT (decoding, few programs): program_id(2) takes keys [split·SPLIT_LEN, +SPLIT_LEN) and writes
    # per-split normalised outputs and log-sum-exps (−inf when it saw no key) to O1/O2/LSE1/LSE2, which are then
    # [splits, R = B·H·T, ...] float32 buffers that _combine_kernel merges (flash-decoding).
    # Batch × head is the grid's fastest axis and, when causal, the row blocks run last-first: the blocks with the
    # most keys start first and the short ones fill the tail of the launch
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    rep = H // HKV
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < rep * T
    h_row = hkv * rep + rows // T
    t_row = rows % T
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    # 64-bit element offsets wherever a tensor may hold 2³¹ elements or more: batch and head offsets, this block's
    # rows (they span query heads), the rows of a 4-D mask and of the outputs. 32-bit: keys within one KV head
    # (_kernel_layout keeps each head's span below 2³¹) and row indices b·H·T + h·T + t (B·H·T < 2³¹, checked)
    b64 = b.to(tl.int64)
    h64 = h_row.to(tl.int64)
    t64 = t_row.to(tl.int64)

    q_mask = row_ok[:, None] & d_ok[None, :]
    q1 = tl.load(Q1 + b64 * sq1b + (h64 * sq1h + t64 * sq1t)[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
    if SHARED_Q:
        q2 = q1
    else:
        q2 = tl.load(Q2 + b64 * sq2b + (h64 * sq2h + t64 * sq2t)[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
    if UPCAST:  # interpreter + bf16 only (see the module docstring); the values are exact in fp32
        q1 = q1.to(tl.float32)
        q2 = q2.to(tl.float32)
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
    if SPLIT:  # SPLIT_LEN is a multiple of BLOCK_N, so no tile straddles two splits
        k_lo = tl.program_id(2) * SPLIT_LEN
        k_hi = tl.minimum(kend, k_lo + SPLIT_LEN)
    else:
        k_lo = 0
        k_hi = kend
    k_mid = tl.maximum(tl.minimum(k_full, k_hi), k_lo)
    if DV_HALF > 0:  # noqa: SIM108 (compile-time branch) V as two halves: columns >= DV_HALF are V_HALF past va
        v_cols = tl.where(offs_dv < DV_HALF, offs_dv, offs_dv + (V_HALF - DV_HALF))
    else:
        v_cols = offs_dv
    for start_n in range(k_lo, k_mid, BLOCK_N):
        acc1, acc2, m1, m2, l1, l2 = _fwd_tile(
            acc1, acc2, m1, m2, l1, l2, q1, q2, start_n, k1_base, k2_base, v_base, sk1s, sk2s, svs,
            mask_base, mask_rows, sms, t_row, row_ok, shift, S, offs_d, d_ok, offs_dv, dv_ok, qk_scale, v_cols,
            False, CAUSAL, MASK_KIND, MASK_ROWS, SHARED_K, UPCAST, PREC, BLOCK_N,
        )  # fmt: skip
    for start_n in range(k_mid, k_hi, BLOCK_N):
        acc1, acc2, m1, m2, l1, l2 = _fwd_tile(
            acc1, acc2, m1, m2, l1, l2, q1, q2, start_n, k1_base, k2_base, v_base, sk1s, sk2s, svs,
            mask_base, mask_rows, sms, t_row, row_ok, shift, S, offs_d, d_ok, offs_dv, dv_ok, qk_scale, v_cols,
            True, CAUSAL, MASK_KIND, MASK_ROWS, SHARED_K, UPCAST, PREC, BLOCK_N,
        )  # fmt: skip

    # a fully masked row (l = 0) attends to nothing: output 0, and lse = +inf makes its backward P exactly 0
    ok1 = l1 > 0.0
    ok2 = l2 > 0.0
    l1 = tl.where(ok1, l1, 1.0)
    l2 = tl.where(ok2, l2, 1.0)
    o1 = acc1 / l1[:, None]
    o2 = acc2 / l2[:, None]
    row_off = (b * H + h_row) * T + t_row
    o_mask = row_ok[:, None] & dv_ok[None, :]
    if SPLIT:
        part = tl.program_id(2).to(tl.int64) * R + row_off
        p_ptr = part[:, None] * DV + offs_dv[None, :]
        tl.store(O1 + p_ptr, o1, mask=o_mask)
        tl.store(O2 + p_ptr, o2, mask=o_mask)
        tl.store(LSE1 + part, tl.where(ok1, m1 + tl.log2(l1), float("-inf")), mask=row_ok)
        tl.store(LSE2 + part, tl.where(ok2, m2 + tl.log2(l2), float("-inf")), mask=row_ok)
    else:
        out = o1 - lam[:, None] * o2  # float32 subtraction (docs/methods.md §0.2)
        o_ptr = row_off.to(tl.int64)[:, None] * DV + offs_dv[None, :]
        tl.store(OUT + o_ptr, out.to(OUT.dtype.element_ty), mask=o_mask)
        tl.store(LSE1 + row_off, tl.where(ok1, m1 + tl.log2(l1), float("inf")), mask=row_ok)
        tl.store(LSE2 + row_off, tl.where(ok2, m2 + tl.log2(l2), float("inf")), mask=row_ok)
        if SAVE_PARTS:
            tl.store(O1 + o_ptr, o1.to(O1.dtype.element_ty), mask=o_mask)
            tl.store(O2 + o_ptr, o2.to(O2.dtype.element_ty), mask=o_mask)


@triton.jit
def _combine_kernel(
    PO1, PO2, PL1, PL2, LAM, OUT, LSE1, LSE2,
    H, T, DV, R, NSPLIT,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # merge the key splits of the decoding forward, per map: O = Σ_s 2^(lse_s − lse) O_s, lse = log2 Σ_s 2^lse_s;
    # then O1 − λ·O2 in float32. A row that saw no key in any split keeps output 0 and lse +inf (see _fwd_kernel).
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
    Q1, K1, Q2, K2, V, LAM, MASK, DO, LSE1, LSE2, DELTA1, DELTA2,
    DK1, DK2, DV_, DQ1, DQ2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t,
    sk1b, sk1h, sk1s, sk2b, sk2h, sk2s,
    svb, svh, svs,
    smb, smh, smt, sms,
    H, HKV, T, S, D, DV, scale, qk_scale, N_BUCKET,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (key block, batch × kv head); it owns dK1, dK2, dV of its keys and visits every query head of
    # the GQA group, so they are accumulated in registers without atomics. ATOMIC_DQ (the default): also add
    # this key block's share of dQ1, dQ2 atomically into float32 buffers (FlashAttention-2's scheme: no second
    # pass that recomputes QKᵀ and dO·Vᵀ, at the price of atomics and run-to-run bit noise in dQ).
    # batch × kv head is the grid's fastest axis, so the first key blocks (when causal, those seen by the most
    # queries: the longest programs) of every head start first
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    rep = H // HKV
    loc_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < S
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    # addresses: 64-bit scalar offsets to this batch and KV head (below: each query head, and a mask's step),
    # 32-bit offsets within one head (_kernel_layout keeps each head's span below 2³¹ elements) or a mask tile.
    # No 64-bit vector lives across the loops (one did, and spilled)
    b64 = b.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    k_mask = n_ok[:, None] & d_ok[None, :]
    k1 = tl.load(K1 + b64 * sk1b + hkv64 * sk1h + (offs_n[:, None] * sk1s + offs_d[None, :]), mask=k_mask, other=0.0)
    if SHARED_K:
        k2 = k1
    else:
        k2 = tl.load(
            K2 + b64 * sk2b + hkv64 * sk2h + (offs_n[:, None] * sk2s + offs_d[None, :]), mask=k_mask, other=0.0
        )
    v = tl.load(
        V + b64 * svb + hkv64 * svh + (offs_n[:, None] * svs + offs_dv[None, :]),
        mask=n_ok[:, None] & dv_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        k1 = k1.to(tl.float32)
        k2 = k2.to(tl.float32)
        v = v.to(tl.float32)
    dk1 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
    dk2 = tl.full([BLOCK_N, BLOCK_D], 0.0, tl.float32)
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
            q_mask = m_ok[:, None] & d_ok[None, :]
            q1 = tl.load(q1_head + (offs_m[:, None] * sq1t + offs_d[None, :]), mask=q_mask, other=0.0)
            if SHARED_Q:
                q2 = q1
            else:
                q2 = tl.load(q2_head + (offs_m[:, None] * sq2t + offs_d[None, :]), mask=q_mask, other=0.0)
            do = tl.load(
                do_head + (offs_m[:, None] * DV + offs_dv[None, :]),
                mask=m_ok[:, None] & dv_ok[None, :],
                other=0.0,
            )
            if UPCAST:
                q1 = q1.to(tl.float32)
                q2 = q2.to(tl.float32)
                do = do.to(tl.float32)
            lse1 = tl.load(LSE1 + row_base + offs_m, mask=m_ok, other=float("inf"))
            lse2 = tl.load(LSE2 + row_base + offs_m, mask=m_ok, other=float("inf"))
            delta1 = tl.load(DELTA1 + row_base + offs_m, mask=m_ok, other=0.0)
            delta2 = tl.load(DELTA2 + row_base + offs_m, mask=m_ok, other=0.0)
            lam = tl.load(LAM + row_base + offs_m, mask=m_ok, other=0.0)[None, :]  # λ of each query (column)

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

            # dV = (P1 − λP2)ᵀ dO: the signed map multiplies dO once
            dv += tl.dot((p1 - lam * p2).to(DT).to(do.dtype), do, input_precision=PREC)
            # G = dO Vᵀ is dP1, and dP2 = −λ·G: one product for both maps
            g = tl.dot(v, tl.trans(do), input_precision=PREC)
            ds1 = (p1 * (g - delta1[None, :])).to(DT).to(q1.dtype)
            ds2 = ((p2 * (g - delta2[None, :])) * (-lam)).to(DT).to(q2.dtype)
            dk1 += tl.dot(ds1, q1, input_precision=PREC)
            if SHARED_K:
                dk1 += tl.dot(ds2, q2, input_precision=PREC)
            else:
                dk2 += tl.dot(ds2, q2, input_precision=PREC)
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
    dk_ptr = kv_head * D + (offs_n[:, None] * D + offs_d[None, :])
    tl.store(DK1 + dk_ptr, (dk1 * scale).to(DK1.dtype.element_ty), mask=k_mask)
    if not SHARED_K:
        tl.store(DK2 + dk_ptr, (dk2 * scale).to(DK2.dtype.element_ty), mask=k_mask)
    dv_ptr = kv_head * DV + (offs_n[:, None] * DV + offs_dv[None, :])
    tl.store(DV_ + dv_ptr, dv.to(DV_.dtype.element_ty), mask=n_ok[:, None] & dv_ok[None, :])


@triton.jit
def _bwd_dq_kernel(
    Q1, K1, Q2, K2, V, LAM, MASK, DO, LSE1, LSE2, DELTA1, DELTA2,
    DQ1, DQ2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t,
    sk1b, sk1h, sk1s, sk2b, sk2h, sk2s,
    svb, svh, svs,
    smb, smh, smt, sms,
    H, HKV, T, S, D, DV, scale, qk_scale, N_BUCKET,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, MASK_ROWS: tl.constexpr,
    SHARED_Q: tl.constexpr, SHARED_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (batch × query head, query block); it owns dQ1, dQ2 of its rows. Causal: the last query blocks
    # (the most keys) run first, as in the forward
    DT = Q1.dtype.element_ty
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - pid_m
    b = pid_bh // H
    h = pid_bh % H
    hkv = h // (H // HKV)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < T
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    # addresses: 64-bit scalar offsets to this batch and head (the mask: to this block's first row), 32-bit offsets
    # within one head (_kernel_layout keeps each head's span below 2³¹ elements) and within a mask tile
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    q_mask = m_ok[:, None] & d_ok[None, :]
    q1 = tl.load(Q1 + b64 * sq1b + h64 * sq1h + (offs_m[:, None] * sq1t + offs_d[None, :]), mask=q_mask, other=0.0)
    if SHARED_Q:
        q2 = q1
    else:
        q2 = tl.load(Q2 + b64 * sq2b + h64 * sq2h + (offs_m[:, None] * sq2t + offs_d[None, :]), mask=q_mask, other=0.0)
    row_base = (b * H + h) * T  # rows of [B, H, T] (32-bit); dO and dQ hold each row's DV or D elements
    row64 = tl.cast(row_base, tl.int64)
    do = tl.load(
        DO + row64 * DV + (offs_m[:, None] * DV + offs_dv[None, :]), mask=m_ok[:, None] & dv_ok[None, :], other=0.0
    )
    if UPCAST:
        q1 = q1.to(tl.float32)
        q2 = q2.to(tl.float32)
        do = do.to(tl.float32)
    lse1 = tl.load(LSE1 + row_base + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=m_ok, other=float("inf"))
    delta1 = tl.load(DELTA1 + row_base + offs_m, mask=m_ok, other=0.0)
    delta2 = tl.load(DELTA2 + row_base + offs_m, mask=m_ok, other=0.0)
    lam = tl.load(LAM + row_base + offs_m, mask=m_ok, other=0.0)[:, None]  # λ of each query row
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
    loc_m = tl.arange(0, BLOCK_M)
    for start_n in range(0, kend, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        k_mask = n_ok[:, None] & d_ok[None, :]
        k1 = tl.load(k1_base + offs_n[:, None] * sk1s + offs_d[None, :], mask=k_mask, other=0.0)
        if SHARED_K:  # noqa: SIM108
            k2 = k1
        else:
            k2 = tl.load(k2_base + offs_n[:, None] * sk2s + offs_d[None, :], mask=k_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * svs + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        if UPCAST:
            k1 = k1.to(tl.float32)
            k2 = k2.to(tl.float32)
            v = v.to(tl.float32)

        s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
        keep = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + shift)
        if MASK_KIND != 0:
            if MASK_ROWS:
                mptr = mask_base + (loc_m[:, None] * smt + offs_n[None, :] * sms)
                mval = tl.load(mptr, mask=m_ok[:, None] & n_ok[None, :], other=0)
            else:
                mval = tl.load(mask_base + offs_n * sms, mask=n_ok, other=0)[None, :]
            s1, s2 = _masked_scores(s1, s2, mval, MASK_KIND)
        p1 = tl.where(keep, tl.exp2(s1 - lse1[:, None]), 0.0)
        p2 = tl.where(keep, tl.exp2(s2 - lse2[:, None]), 0.0)
        g = tl.dot(do, tl.trans(v), input_precision=PREC)  # dP1; dP2 = −λ·G
        ds1 = p1 * (g - delta1[:, None])
        ds2 = (p2 * (g - delta2[:, None])) * (-lam)
        dq1 += tl.dot(ds1.to(DT).to(k1.dtype), k1, input_precision=PREC)
        if SHARED_Q:
            dq1 += tl.dot(ds2.to(DT).to(k2.dtype), k2, input_precision=PREC)
        else:
            dq2 += tl.dot(ds2.to(DT).to(k2.dtype), k2, input_precision=PREC)

    dq_ptr = row64 * D + (offs_m[:, None] * D + offs_d[None, :])
    tl.store(DQ1 + dq_ptr, (dq1 * scale).to(DQ1.dtype.element_ty), mask=q_mask)
    if not SHARED_Q:
        tl.store(DQ2 + dq_ptr, (dq2 * scale).to(DQ2.dtype.element_ty), mask=q_mask)


# --------------------------------------------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------------------------------------------


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are wrapped for use inside
# kernels too, and cost ~3 µs a call on the host (about half of a decoding step's launch overhead went there).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())  # the next power of two; tl.dot needs every dimension >= 16


# (BLOCK_M, BLOCK_N) per kernel and head-width class on a GPU (bf16/fp16), read off the ahead-of-time report for
# sm_90 (benchmarks/kernel_report.py; its registers, spills and dots per tile are in benchmarks/RESULTS.md), all on
# 8 warps, none spilling:
# * fwd: 128 query rows, so each of the two warpgroups owns 64 rows of every dot and none repeats another's QKᵀ
#   (64 rows on 8 warps did: 1.33x / 1.50x the FLOP ideal); BLOCK_N 64 for d = dv = 64, 32 for dv = 128. Shorter
#   blocks: fwd_mid (33–127 rows: 64-row tiles) and fwd_short (decoding, up to 32 rows: a tile of the row count);
#   "v1" on 32 keys there (64 spilled, with a mask or at 16 rows even without: ptxas held them to 128 registers).
# * dkdv_atomic (the default, single-pass backward): 128 keys per program, the 64 rows per warpgroup wgmma needs,
#   32 / 16 queries per step to keep dK1, dK2, dV in registers; dQᵀ = Kᵀ·dSᵀ has the head dim (64) as rows, so all
#   eight products per step are wgmma. Wide heads have none (their accumulators for 128 keys need more than 255
#   registers): they take dkdv + dq.
# * dkdv, dq (the deterministic backward): the same key tiles without dQ; dq on 128 query rows, so no warpgroup
#   repeats the recomputed QKᵀ and dO·Vᵀ.
# "v2": d + dv <= 128 (d = dv = 64); "v1": <= 192 (d = 64, dv = 128); "wide": larger heads.
_TILES = {
    "fwd": {"v2": (128, 64), "v1": (128, 32), "wide": (32, 32)},
    "fwd_mid": {"v2": (64, 64), "v1": (64, 32), "wide": (32, 32)},
    "fwd_short": {"v2": (64, 64), "v1": (64, 32), "wide": (32, 32)},
    "dkdv": {"v2": (32, 128), "v1": (16, 128), "wide": (32, 32)},
    "dkdv_atomic": {"v2": (32, 128), "v1": (16, 128)},
    "dq": {"v2": (128, 64), "v1": (128, 32), "wide": (32, 64)},
}

# Tiles with a user mask, where those of _TILES would spill, by mask class ("keys": key padding, one value per key;
# "rows": a per-row 4-D mask, bool or additive, [B, H|1, T, S], a mask tile loaded next to every score tile). On
# _TILES the forward spilled 12–284 bytes on sm_90 with a 4-D mask, and "v2" heads 16–32 with key padding when S is
# not a multiple of 16 (benchmarks/RESULTS.md). With a 4-D mask the forward takes half as many keys per step ("wide":
# half as many rows), the single-pass backward of "v2" heads 16 queries per step, the wide dK/dV kernel 16. The
# single-pass backward of "v1" heads spills with a mask tile at every tile and stage count tried (its dK1, dK2, dV
# accumulators fill the registers), so with a 4-D mask those heads take the deterministic two-kernel backward (no
# spills; 1.4x the backward FLOP ideal, not 1.0x).
_MASK_TILES = {
    "keys": {"fwd": {"v2": (128, 32)}, "fwd_mid": {"v2": (64, 32)}},
    "rows": {
        "fwd": {"v2": (128, 32), "v1": (128, 16), "wide": (16, 32)},
        "fwd_mid": {"v2": (64, 32), "wide": (16, 32)},
        "fwd_short": {"v2": (64, 16), "wide": (16, 32)},
        "dkdv_atomic": {"v2": (16, 128)},  # no "v1": the two-kernel backward
        "dkdv": {"wide": (16, 32)},
    },
}


# A forward split over keys (no gradient, too few programs for the SMs: decoding, and prefill of a few long
# prompts) stores float32 partial outputs instead of O1, O2: "v1" on 128-row tiles spilled 88–140 bytes on 32 keys.
_SPLIT_TILES = {"fwd": {"v1": (128, 16)}}


def _mask_class(consts: dict) -> str:
    """The mask class of a launch's constexprs: "none", "keys" (key padding) or "rows" (a per-row 4-D mask)."""
    return "none" if consts["MASK_KIND"] == 0 else "rows" if consts["MASK_ROWS"] else "keys"


# Alternatives the autotuner times against the default tiles on a GPU, as (BLOCK_M, BLOCK_N, num_warps,
# num_stages), for the kernels that dominate training: the forward and the single-pass backward, per mask class.
# Every one was compiled ahead of time for sm_90 with no spills and every dot a wgmma issued once
# (benchmarks/kernel_report.py compiles them all, with each kind of mask, and tests/ops/test_kernel_report.py holds
# them to it), so whichever wins is a clean kernel.
_DKDV_TUNING = {
    "v2": [(32, 128, 8, 1), (16, 128, 8, 2), (32, 64, 4, 2)],
    "v1": [(16, 128, 8, 1), (16, 64, 4, 1)],
}
_TUNING = {
    "none": {
        "fwd": {"v2": [(128, 64, 8, 3), (128, 32, 8, 2), (64, 32, 4, 2)], "v1": [(128, 32, 8, 3), (64, 16, 4, 2)]},
        "dkdv_atomic": _DKDV_TUNING,
    },
    "keys": {
        "fwd": {"v2": [(128, 32, 8, 3), (64, 32, 4, 2)], "v1": [(128, 32, 8, 3), (64, 16, 4, 2)]},
        "dkdv_atomic": _DKDV_TUNING,
    },
    "rows": {
        "fwd": {"v2": [(128, 32, 8, 3), (64, 16, 4, 2)], "v1": [(128, 16, 8, 1), (64, 16, 4, 2)]},
        "dkdv_atomic": {"v2": [(16, 128, 8, 1), (16, 64, 4, 2)]},
    },
}

#: Time the :data:`_TUNING` alternatives on a GPU (``triton.autotune``, once per kernel, head widths, causality,
#: masks, dtypes and power-of-two bucket of the sequence length) instead of taking the default tiles.
AUTOTUNE: bool = True


def _tunable(kind: str, d: int, dv: int, rows: int, fp32: bool, split: bool = False, mask: str = "none") -> bool:
    """Whether this launch is autotuned: a GPU, 16-bit inputs, a kernel, head-width class and mask class (see
    :func:`_mask_class`) with alternatives, and for the forward a training-size row count without key splits
    (decoding and short rows keep their heuristic tile)."""
    if not AUTOTUNE or INTERPRETED or BLOCK_OVERRIDE is not None or fp32 or split:
        return False
    return _width_class(d, dv) in _TUNING[mask].get(kind, {}) and (kind != "fwd" or rows >= 128)


def _candidates(
    kind: str, d: int, dv: int, rows: int, fp32: bool = False, split: bool = False, mask: str = "none"
) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) this launch may run with: the default first, then the
    autotuner's alternatives when it is tuned. ``mask``: the mask class (:func:`_mask_class`)."""
    default = (*_blocks(kind, d, dv, rows, fp32, mask, split), 2)
    if not _tunable(kind, d, dv, rows, fp32, split, mask):
        return [default]
    return [default, *_TUNING[mask][kind][_width_class(d, dv)]]


_AUTOTUNERS: dict[tuple, object] = {}


def _autotuner(kernel, kind: str, d: int, dv: int, mask: str = "none"):
    """The ``triton.autotune`` wrapper of ``kernel`` over this kind, width class and mask class's candidates (one
    per class, made on first use). The atomic backward's dQ buffers are zeroed before every timed run and the
    final one."""
    key = (kind, _width_class(d, dv), mask)
    if key not in _AUTOTUNERS:
        configs = [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in _candidates(kind, d, dv, rows=1 << 30, mask=mask)
        ]
        _AUTOTUNERS[key] = triton.autotune(
            configs,
            key=["N_BUCKET", "D", "DV", "CAUSAL", "MASK_KIND", "MASK_ROWS", "SHARED_Q", "SHARED_K"],
            reset_to_zero=["DQ1", "DQ2"] if kind == "dkdv_atomic" else None,
        )(kernel)
    return _AUTOTUNERS[key]


def _blocks(
    kind: str, d: int, dv: int, rows: int, fp32: bool = False, mask: str = "none", split: bool = False
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) per kernel: :data:`_TILES` on a GPU, or :data:`_MASK_TILES` where it has
    tiles for the mask class, or :data:`_SPLIT_TILES` for a key-split forward. Float32 inputs (IEEE dots, twice
    the bytes per tile) spill heavily at those sizes, so they get tiles half as long; a forward with fewer rows
    than the tile (decoding: rows = (H/Hkv)·T) gets a tile of its row count."""
    if BLOCK_OVERRIDE is not None:
        return (*BLOCK_OVERRIDE, 4)
    if INTERPRETED:
        return 16, 16, 4
    cls = _width_class(d, dv)
    if kind == "fwd" and rows < 128:
        kind = "fwd_short" if rows <= 32 else "fwd_mid"
    bm, bn = _MASK_TILES.get(mask, {}).get(kind, {}).get(cls) or _TILES[kind][cls]
    if split:
        bm, bn = _SPLIT_TILES.get(kind, {}).get(cls, (bm, bn))
    if fp32:
        bm, bn = max(16, bm // 2), max(16, bn // 2)
    if kind.startswith("fwd"):
        bm = min(bm, _pow2(rows))
    return bm, bn, 8


def _compile_options(kind: str, rows: int) -> dict:
    """Extra Triton compile options of a launch. Forwards of fewer than 128 rows (decoding, prefill and training
    blocks of short sequences: 8 warps on 16–64-row tiles) get ``maxnreg`` = 255: ptxas otherwise held some of
    them to 128 registers (two CTAs per SM) and spilled 16–80 bytes rather than use more
    (benchmarks/kernel_report.py, the short, prefill and decode rows)."""
    return {"maxnreg": 255} if kind == "fwd" and rows < 128 else {}


def _width_class(d: int, dv: int) -> str:
    """The head-width class of :data:`_TILES`: "v2" (d + dv <= 128, DIFF V2), "v1" (<= 192, DIFF V1), "wide"."""
    width = _pow2(d) + _pow2(dv)
    return "v2" if width <= 128 else "v1" if width <= 192 else "wide"


def _single_pass_fits(d: int, dv: int, mask: str = "none") -> bool:
    """Whether the one-pass (atomic dQ) backward has spill-free tiles for these head widths and mask class (not for
    "wide" heads, nor for "v1" heads with a per-row 4-D mask: :data:`_MASK_TILES`)."""
    if INTERPRETED or BLOCK_OVERRIDE is not None:
        return True
    return _width_class(d, dv) in _MASK_TILES.get(mask, {}).get("dkdv_atomic", _TILES["dkdv_atomic"])


def _num_splits(device: torch.device, programs: int, s: int, block_n: int) -> int:
    """Key splits for a forward without gradient: enough programs to fill the GPU about twice when there are
    fewer programs than SMs (decoding), each split at least one key tile long (four tiles, as before, left half
    the SMs idle at B = 1 below 2K keys)."""
    if SPLIT_OVERRIDE is not None:
        return max(1, SPLIT_OVERRIDE)
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if programs >= sms:
        return 1
    return max(1, min(_cdiv(2 * sms, programs), _cdiv(s, block_n), 128))


_SM_COUNT: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _launch(kernel, grid_of, args, consts, kind, d, dv, rows, key):
    """Launch with the autotuner where the launch is tuned (:func:`_tunable`; it skips configurations that run
    out of resources), else with the heuristic tiles; if the GPU runs out of shared memory or registers, halve
    BLOCK_N then BLOCK_M (down to 16) and remember what worked for this shape class."""
    fp32, mask = consts["PREC"] == "ieee", _mask_class(consts)
    if _tunable(kind, d, dv, rows, fp32, consts.get("SPLIT", False), mask):
        tuner = _autotuner(kernel, kind, d, dv, mask)
        tuner[lambda meta: grid_of(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **consts)
        return
    key = (*key, mask, consts.get("SPLIT", False))
    cached = None if BLOCK_OVERRIDE is not None else _LAUNCH_CACHE.get(key)
    bm, bn, warps = cached or _blocks(kind, d, dv, rows, fp32, mask, consts.get("SPLIT", False))
    while True:
        try:
            options = dict(num_warps=warps, num_stages=2, **_compile_options(kind, rows))
            kernel[grid_of(bm, bn)](*args, **consts, BLOCK_M=bm, BLOCK_N=bn, **options)
            if BLOCK_OVERRIDE is None:
                _LAUNCH_CACHE[key] = (bm, bn, warps)
            return
        except triton.runtime.errors.OutOfResources as err:
            if bn > 16:
                bn //= 2
            elif bm > 16:
                bm //= 2
            else:
                raise
            logger.info("diffattn triton %s: %s; retrying with BLOCK_M=%d, BLOCK_N=%d", kind, err, bm, bn)


_LAUNCH_CACHE: dict[tuple, tuple[int, int, int]] = {}


def _strides4(x: torch.Tensor | None) -> tuple[int, int, int]:
    # (batch, head, sequence) strides; the last dim is contiguous (checked by the caller)
    return (0, 0, 0) if x is None else (x.stride(0), x.stride(1), x.stride(2))


def _mask_args(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, int, bool, tuple[int, int, int, int]]:
    """(tensor, MASK_KIND, MASK_ROWS, strides): kind 0 none, 1 bool (read as uint8), 2 additive. Broadcast dims
    get stride 0, so a [B, 1, 1, S] key-padding mask is read per key and a 4-D mask is never expanded."""
    if mask is None:
        return None, 0, False, (0, 0, 0, 0)
    kind = 1 if mask.dtype == torch.bool else 2
    if kind == 1:
        mask = mask.view(torch.uint8)  # same bytes; Triton loads uint8 more portably than i1
    strides = tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(4))
    rows = mask.shape[1] != 1 or mask.shape[2] != 1
    return mask, kind, rows, strides


def _on_device(device: torch.device):
    """A CUDA device guard for ``device`` (Triton launches on the *current* device and its stream, so a tensor on
    another GPU than the current one would otherwise be read by a kernel running elsewhere); nothing off CUDA."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# What the kernels compute in 32 bits (everything else is 64-bit: batch and head offsets, a block's packed rows,
# the rows of a 4-D mask): row indices of [B, H, T], offsets within one head of Q, K, V and of the outputs, and
# within a mask row plus a block of mask rows. The host keeps each below 2³¹ (a strided view whose head spans more
# is copied contiguous; what still does not fit is a clear error).
_INT32_LIMIT = 2**31
_MASK_ROW_BLOCK = 128  # the most query rows of one block a mask tile spans in 32 bits (BLOCK_M <= 128)


def _head_span(x: torch.Tensor) -> int:
    """Elements from the first of one [batch, head] slice of a 4-D tensor to its last, plus one."""
    return (x.shape[2] - 1) * x.stride(2) + (x.shape[3] - 1) * x.stride(3) + 1


def _mask_span(mask: torch.Tensor) -> int:
    """Elements a mask tile's 32-bit offsets span: one row of keys plus a block of query rows (MASK_ROWS)."""
    return (mask.shape[3] - 1) * mask.stride(3) + (min(mask.shape[2], _MASK_ROW_BLOCK) - 1) * mask.stride(2) + 1


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernels read it: a contiguous last dim, and one head's span within 32-bit offsets (a strided
    view over more than 2³¹ elements per head, e.g. [B, S, H, d] transposed at millions of tokens, is copied)."""
    return x if x.stride(-1) == 1 and _head_span(x) < _INT32_LIMIT else x.contiguous()


_ALIGNED_MASK: list = [None]  # (weak reference to the last mask copied, its version, the copy)


def _mask_aligned(mask: torch.Tensor) -> bool:
    """Whether the kernels can read ``mask`` as it is: keys contiguous, every other stride (of a dim not broadcast)
    and the start a multiple of 16 elements, and its tiles within 32-bit offsets."""
    strides_ok = all(mask.stride(i) % 16 == 0 for i in range(3) if mask.shape[i] != 1)
    keys_ok = mask.shape[3] == 1 or mask.stride(3) == 1
    return strides_ok and keys_ok and mask.storage_offset() % 16 == 0 and _mask_span(mask) < _INT32_LIMIT


def _mask_for_kernels(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` as the kernels read it. A mask whose rows do not start at multiples of 16 elements (S not a multiple
    of 16, as transformers builds them for any other length) is copied into rows padded to a multiple of 16 (a view
    of the first S columns): Triton cannot vectorise its loads otherwise, and on sm_90 the forward then spilled
    hundreds of bytes (benchmarks/RESULTS.md). Called inside the ops at run time, like :func:`_causal_key_padding`;
    the copy is remembered for the last mask by identity and version counter, so the layers of a model, forward and
    backward, share one copy."""
    if mask is None or _mask_aligned(mask):
        return mask
    version = None if mask.is_inference() else mask._version
    cached = _ALIGNED_MASK[0]
    if version is not None and cached is not None and cached[0]() is mask and cached[1] == version:
        return cached[2]
    s = mask.shape[3]
    copy = torch.empty(*mask.shape[:3], _cdiv(s, 16) * 16, dtype=mask.dtype, device=mask.device)[..., :s]
    copy.copy_(mask)
    if version is not None:
        _ALIGNED_MASK[0] = (weakref.ref(mask), version, copy)
    return copy


def _check_offsets(q1, k1, q2, k2, v, mask, b, h, t, s, d, dv) -> None:
    """ValueError where an offset the kernels compute in 32 bits would overflow (see :data:`_INT32_LIMIT`)."""
    problems = []
    if b * h * t >= _INT32_LIMIT:
        problems.append(f"B·H·T = {b * h * t} query rows (the kernels index rows in 32 bits)")
    if max(t, s) * max(d, dv) >= _INT32_LIMIT:
        problems.append(f"sequence {max(t, s)} × head width {max(d, dv)} elements in one head")
    for name, x in (("q1", q1), ("k1", k1), ("q2", q2), ("k2", k2), ("v", v)):
        if x is not None and _head_span(x) >= _INT32_LIMIT:
            problems.append(f"{name} spans {_head_span(x)} elements in one head")
    if mask is not None and _mask_span(mask) >= _INT32_LIMIT:
        problems.append(f"the mask's tiles span {_mask_span(mask)} elements")
    if problems:
        raise ValueError(
            f"diffattn triton: {'; '.join(problems)}: beyond 2³¹ − 1, the kernels' 32-bit offsets within a head; "
            "use the chunked backend or split the batch"
        )


_CAUSAL_PADDING: list = [None]  # (weak reference to the last mask, its version, what it reduced to)


def _causal_key_padding(mask: torch.Tensor | None, t: int, s: int) -> torch.Tensor | None:
    """A [B, 1, T, S] bool mask that is exactly bottom-right causality ∧ key padding — what transformers builds for
    a padded batch (its SDPA path has no other way to say "causal and padded") — as its [B, 1, 1, S] key-padding
    row, so the kernels run causal and skip the tiles above the diagonal; None for any other mask.

    Called inside the forward and backward ops, at run time: a traced graph (torch.compile) cannot branch on the
    comparison. It costs one comparison per mask, not per layer: the model hands every layer the same mask
    tensor, remembered by identity and version counter (an edit through ``mask.data`` is not seen; inference-mode
    tensors have no version counter, so theirs is compared every call)."""
    if mask is None or mask.dtype != torch.bool or mask.shape[1] != 1 or mask.shape[2] != t or t == 1:
        return None
    version = None if mask.is_inference() else mask._version
    cached = _CAUSAL_PADDING[0]
    if version is not None and cached is not None and cached[0]() is mask and cached[1] == version:
        return cached[2]
    padding = mask[:, :, -1:, :]  # the last query sees every key that the padding lets through
    causal = torch.ones(t, s, dtype=torch.bool, device=mask.device).tril(s - t)
    result = padding.clone() if torch.equal(mask, causal & padding) else None  # a copy: not holding the mask
    if version is not None:
        _CAUSAL_PADDING[0] = (weakref.ref(mask), version, result)
    return result


_GRID_LIMIT = 65535  # CUDA's limit on the grid's y and z axes (x goes to 2³¹ − 1)


def _grid(*dims: int) -> tuple[int, ...]:
    """A launch grid, with a clear error where a CUDA limit would make the launch fail."""
    if any(n > _GRID_LIMIT for n in dims[1:]):
        raise ValueError(
            f"diffattn triton: grid {dims} exceeds CUDA's {_GRID_LIMIT} blocks on its second or third axis "
            "(a sequence of more than ~8M query rows per KV head or keys); use the chunked backend"
        )
    return dims


def _common(q1, k1, q2, k2, v, mask, causal):
    b, h, t, d = q1.shape
    hkv, s, dv = k1.shape[1], k1.shape[2], v.shape[3]
    if not causal:  # transformers' causal ∧ padding mask: run causal with the padding row (tile skipping)
        padding = _causal_key_padding(mask, t, s)
        if padding is not None:
            mask, causal = padding, True
    mask_t, mask_kind, mask_rows, mstrides = _mask_args(_mask_for_kernels(mask))
    _check_offsets(q1, k1, q2, k2, v, mask_t if mask_rows else None, b, h, t, s, d, dv)
    shared_q, shared_k = q2 is None, k2 is None
    strides = (
        *_strides4(q1), *_strides4(q1 if shared_q else q2),
        *_strides4(k1), *_strides4(k1 if shared_k else k2),
        *_strides4(v), *mstrides,
    )  # fmt: skip
    upcast = INTERPRETED and q1.dtype == torch.bfloat16
    consts = dict(
        CAUSAL=bool(causal),
        MASK_KIND=mask_kind,
        MASK_ROWS=mask_rows,
        SHARED_Q=shared_q,
        SHARED_K=shared_k,
        UPCAST=upcast,
        PREC="ieee" if q1.dtype == torch.float32 else "tf32",
        BLOCK_D=_pow2(d),
        BLOCK_DV=_pow2(dv),
    )
    return (b, h, hkv, t, s, d, dv), mask_t, strides, consts


# --------------------------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, with fake implementations) and their autograd formula
# --------------------------------------------------------------------------------------------------------------


def _fwd_impl(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor | None,
    k2: torch.Tensor | None,
    v: torch.Tensor,
    lam: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    save_parts: bool,
    v2: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, o1, o2, lse1, lse2). q2/k2 None = shared with q1/k1. lam: float32 [B, H, T]. lse in log2 units.
    o1/o2 (the per-map outputs, for the backward's Δ) are empty unless save_parts. v2: the second half of V's
    columns (V = [v | v2]; forward without gradient only): read in place when it lies in v's storage with v's
    shape and strides (DiffLlama's value heads j and j + Hkv), else concatenated. Decided here, at run time,
    because a traced graph (torch.compile, CUDA graphs) cannot look at storage. Launches on q1's device."""
    with _on_device(q1.device):
        return _fwd_run(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2)


def _fwd_run(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2):
    v_half = 0
    if v2 is not None:
        if save_parts:  # the backward differentiates one V; the caller concatenates when it needs gradients
            raise ValueError("diffattn triton: V in two halves is for a forward without gradient")
        v_half = _in_place_halves((v, v2))
        if not v_half:
            v = torch.cat([v, v2], dim=-1)
    (b, h, hkv, t, s, d, dv), mask_t, strides, consts = _common(q1, k1, q2, k2, v, mask, causal)
    if v_half:
        dv *= 2
        consts["BLOCK_DV"] = _pow2(dv)
    out = torch.empty(b, h, t, dv, device=q1.device, dtype=q1.dtype)
    parts_shape = (b, h, t, dv) if save_parts else (0,)
    o1 = torch.empty(parts_shape, device=q1.device, dtype=q1.dtype)
    o2 = torch.empty(parts_shape, device=q1.device, dtype=q1.dtype)
    lse1 = torch.empty(b, h, t, device=q1.device, dtype=torch.float32)
    lse2 = torch.empty_like(lse1)
    rows = (h // hkv) * t
    r_total = b * h * t
    fp32, mask_class = consts["PREC"] == "ieee", _mask_class(consts)
    bm, bn, _ = _blocks("fwd", d, dv, rows, fp32, mask_class)
    nsplit = 1 if save_parts else _num_splits(q1.device, _cdiv(rows, bm) * b * hkv, s, bn)
    if nsplit > 1:  # the split forward's own tiles (_SPLIT_TILES): whole tiles of them per split
        bn = max(bn, _blocks("fwd", d, dv, rows, fp32, mask_class, split=True)[1])
    split_len = _cdiv(_cdiv(s, nsplit), bn) * bn  # whole tiles per split
    nsplit = _cdiv(s, split_len)
    if nsplit > 1:  # per-split partial outputs, merged by _combine_kernel below
        po1 = torch.empty(nsplit, r_total, dv, device=q1.device, dtype=torch.float32)
        po2 = torch.empty_like(po1)
        pl1 = torch.empty(nsplit, r_total, device=q1.device, dtype=torch.float32)
        pl2 = torch.empty_like(pl1)
        targets = (po1, po2, pl1, pl2)
    else:
        targets = (o1, o2, lse1, lse2)
    args = (
        q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, lam, mask_t,
        out, *targets, *strides,
        h, hkv, t, s, d, dv, scale * _LOG2E, r_total, split_len, _pow2(max(t, s)), v_half,
    )  # fmt: skip
    key = ("fwd", q1.device.type, q1.dtype, consts["BLOCK_D"], consts["BLOCK_DV"], _pow2(min(rows, 64)))
    _launch(
        _fwd_kernel,
        lambda bm, bn: _grid(b * hkv, _cdiv(rows, bm), nsplit),
        args,
        dict(consts, SAVE_PARTS=save_parts, SPLIT=nsplit > 1, DV_HALF=dv // 2 if v_half else 0),
        "fwd",
        d,
        dv,
        rows,
        key,
    )
    if nsplit > 1:
        block_r = 16
        _combine_kernel[(_cdiv(r_total, block_r),)](
            po1, po2, pl1, pl2, lam, out, lse1, lse2, h, t, dv, r_total, nsplit,
            BLOCK_R=block_r, BLOCK_DV=consts["BLOCK_DV"],
        )  # fmt: skip
    return out, o1, o2, lse1, lse2


# _fwd_impl as a custom op: opaque to torch.compile (fake implementation below) and differentiable (the autograd
# formula at the end of this section). A forward that needs neither calls _fwd_impl directly: the dispatcher
# costs ~25 µs of host time a call, about half of a decoding step's launch overhead (benchmarks/host_overhead.py).
_fwd_op = torch.library.custom_op("diffattn::triton_diff_attn_fwd", mutates_args=())(_fwd_impl)


@_fwd_op.register_fake
def _fwd_fake(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2=None):
    b, h, t, _ = q1.shape
    dv = v.shape[3] + (0 if v2 is None else v2.shape[3])
    parts_shape = (b, h, t, dv) if save_parts else (0,)
    return (
        q1.new_empty(b, h, t, dv),
        q1.new_empty(parts_shape),
        q1.new_empty(parts_shape),
        q1.new_empty(b, h, t, dtype=torch.float32),
        q1.new_empty(b, h, t, dtype=torch.float32),
    )


def _bwd_impl(
    dout: torch.Tensor,
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor | None,
    k2: torch.Tensor | None,
    v: torch.Tensor,
    lam: torch.Tensor,
    mask: torch.Tensor | None,
    o1: torch.Tensor,
    o2: torch.Tensor,
    lse1: torch.Tensor,
    lse2: torch.Tensor,
    causal: bool,
    scale: float,
    atomic_dq: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq1, dk1, dq2, dk2, dv, dlam); dq2/dk2 are empty when q2/k2 are shared (their gradient is inside
    dq1/dk1). dlam: float32 [B, H, T]. ``atomic_dq`` False forces the deterministic two-kernel backward; True
    leaves the choice to this call, i.e. to when the backward runs (not the forward): the single-pass atomic one
    unless :data:`ATOMIC_DQ` is False, ``torch.use_deterministic_algorithms(True)`` is on, or it has no
    spill-free tiles for these heads and mask (:func:`_single_pass_fits`). Launches on q1's device."""
    with _on_device(q1.device):
        return _bwd_run(dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq)


# the backward as a custom op (opaque to torch.compile; fake implementation below)
_bwd_op = torch.library.custom_op("diffattn::triton_diff_attn_bwd", mutates_args=())(_bwd_impl)


def _bwd_run(dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq):
    (b, h, hkv, t, s, d, dv), mask_t, strides, consts = _common(q1, k1, q2, k2, v, mask, causal)
    dout = dout.contiguous()
    atomic = (
        atomic_dq
        and ATOMIC_DQ
        and not torch.are_deterministic_algorithms_enabled()
        and _single_pass_fits(d, dv, _mask_class(consts))
    )
    if atomic:  # float32 accumulators for the atomic adds (zeroed below), rounded to the input dtype at the end
        dq1 = torch.empty(q1.shape, device=q1.device, dtype=torch.float32)
        dq2 = torch.empty_like(dq1) if q2 is not None else dq1.new_empty(0)
    else:
        dq1 = torch.empty_like(q1, memory_format=torch.contiguous_format)
        dq2 = torch.empty_like(dq1) if q2 is not None else q1.new_empty(0)
    # preprocessing, one small kernel: Δ1, Δ2, dλ = −Δ2 per row, and the atomic path's dQ buffers zeroed
    delta1 = torch.empty(b, h, t, device=q1.device, dtype=torch.float32)
    delta2, dlam = torch.empty_like(delta1), torch.empty_like(delta1)
    rows, block_r = b * h * t, 16
    _bwd_preprocess_kernel[(_cdiv(rows, block_r),)](
        dout, o1, o2, delta1, delta2, dlam, dq1, dq1 if q2 is None else dq2, rows, d, dv,
        ZERO_DQ1=atomic, ZERO_DQ2=atomic and q2 is not None,
        BLOCK_R=block_r, BLOCK_D=consts["BLOCK_D"], BLOCK_DV=consts["BLOCK_DV"],
    )  # fmt: skip
    dk1 = torch.empty_like(k1, memory_format=torch.contiguous_format)
    dk2 = torch.empty_like(dk1) if k2 is not None else k1.new_empty(0)
    dvv = torch.empty_like(v, memory_format=torch.contiguous_format)
    common = (
        q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, lam, mask_t,
        dout, lse1, lse2, delta1, delta2,
    )  # fmt: skip
    sizes = (h, hkv, t, s, d, dv, scale, scale * _LOG2E, _pow2(max(t, s)))
    base_key = (q1.device.type, q1.dtype, consts["BLOCK_D"], consts["BLOCK_DV"], atomic)
    _launch(
        _bwd_dkdv_kernel,
        lambda bm, bn: _grid(b * hkv, _cdiv(s, bn)),
        (*common, dk1, dk1 if k2 is None else dk2, dvv, dq1, dq1 if q2 is None else dq2, *strides, *sizes),
        dict(consts, ATOMIC_DQ=atomic),
        "dkdv_atomic" if atomic else "dkdv",
        d,
        dv,
        t,
        ("dkdv", *base_key),
    )
    if atomic:
        dq1 = dq1.to(q1.dtype)
        dq2 = dq2.to(q1.dtype)
    else:
        _launch(
            _bwd_dq_kernel,
            lambda bm, bn: _grid(b * h, _cdiv(t, bm)),
            (*common, dq1, dq1 if q2 is None else dq2, *strides, *sizes),
            consts,
            "dq",
            d,
            dv,
            t,
            ("dq", *base_key),
        )
    return dq1, dk1, dq2, dk2, dvv, dlam


@_bwd_op.register_fake
def _bwd_fake(dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq):
    return (
        torch.empty_like(q1, memory_format=torch.contiguous_format),
        torch.empty_like(k1, memory_format=torch.contiguous_format),
        torch.empty_like(q1, memory_format=torch.contiguous_format) if q2 is not None else q1.new_empty(0),
        torch.empty_like(k1, memory_format=torch.contiguous_format) if k2 is not None else k1.new_empty(0),
        torch.empty_like(v, memory_format=torch.contiguous_format),
        lam.new_empty(lam.shape),
    )


def _setup_context(ctx, inputs, output):
    q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, _v2 = inputs
    _, o1, o2, lse1, lse2 = output
    ctx.save_for_backward(q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2)
    ctx.causal, ctx.scale, ctx.save_parts = causal, scale, save_parts
    # the atomic or deterministic backward is not chosen here but when the backward runs (_bwd_op), so that
    # torch.use_deterministic_algorithms(True) set between forward and backward is obeyed, as by PyTorch's own ops


def _backward(ctx, dout, _do1, _do2, _dlse1, _dlse2):
    # o1, o2, lse1, lse2 are internal outputs that nothing differentiates; their cotangents are ignored
    if not ctx.save_parts:
        raise RuntimeError("diffattn triton: backward through a forward that was run without saving for it")
    q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2 = ctx.saved_tensors
    dq1, dk1, dq2, dk2, dv, dlam = _bwd_op(
        dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, ctx.causal, ctx.scale, True
    )
    return (
        dq1,
        dk1,
        None if q2 is None else dq2,
        None if k2 is None else dk2,
        dv,
        dlam,
        None,
        None,
        None,
        None,
        None,
    )


torch.library.register_autograd("diffattn::triton_diff_attn_fwd", _backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------------------------
# Backend entry point
# --------------------------------------------------------------------------------------------------------------


def _in_place_halves(parts: tuple[torch.Tensor, ...]) -> int:
    """For V given as two halves (va, vb): the element offset from va to vb when the kernel can read both in
    place (equal shapes and strides, contiguous last dim, one storage, vb after va), else 0 (concatenate)."""
    if len(parts) != 2:
        return 0
    va, vb = parts
    if va.shape != vb.shape or va.stride() != vb.stride() or va.stride(-1) != 1:
        return 0
    if va.untyped_storage().data_ptr() != vb.untyped_storage().data_ptr():
        return 0
    offset = vb.storage_offset() - va.storage_offset()
    # the kernel adds the offset to the second half within a head's 32-bit offsets
    return offset if offset > 0 and offset + _head_span(va) < _INT32_LIMIT else 0


def diff_attention_triton(inp: DiffAttentionInputs) -> torch.Tensor:
    """The ``triton`` backend. ``inp`` has passed :func:`diffattn.ops._inputs.validate` and the support check
    of :mod:`diffattn.ops` (dtype, head dims, device)."""
    h = inp.num_heads
    leaves = (inp.q1, inp.k1, inp.q2, inp.k2, *inp.v_parts, inp.lam)
    need_grad = torch.is_grad_enabled() and any(x.requires_grad for x in leaves)
    # V as two halves goes to the forward as such when no gradient is needed (the kernel reads them in place
    # where it can); a training forward takes V whole, as its backward writes one dV
    halves = len(inp.v_parts) == 2 and not need_grad
    q1, k1, v = (_kernel_layout(x) for x in (inp.q1, inp.k1, inp.v_parts[0] if halves else inp.v))
    v2 = _kernel_layout(inp.v_parts[1]) if halves else None
    # identity, not equality: DAA/DiffQ pass the same K tensor to both maps, DiffK the same Q
    q2 = None if inp.q2 is inp.q1 else _kernel_layout(inp.q2)
    k2 = None if inp.shares_keys else _kernel_layout(inp.k2)
    # λ as float32 [B, H, T] (a scalar or per-head λ is broadcast); autograd carries dλ back through the
    # broadcast to its own shape and dtype
    lam4 = inp.lam.to(torch.float32).reshape((1, 1, 1, 1) if inp.lam.dim() == 0 else inp.lam.shape)
    lam = torch.broadcast_to(lam4, (inp.batch, h, inp.q_len, 1)).reshape(inp.batch, h, inp.q_len).contiguous()
    forward = _fwd_op if need_grad or torch.compiler.is_compiling() else _fwd_impl
    out, *_ = forward(q1, k1, q2, k2, v, lam, inp.attn_mask, inp.causal, inp.scale, need_grad, v2)
    return out
