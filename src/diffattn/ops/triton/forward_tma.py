"""The fused kernel's forward by tensor-memory-accelerator (TMA) tiles: a candidate for issue 37 (the fused kernel at
FlashAttention speed), off by default (:data:`.tuning.FWD_TMA`) until a GPU has timed it against the default forward
(:mod:`.forward`).

The same arithmetic as :mod:`.forward` (DIFF Transformer Eq. 1, docs/methods.md §0) — both maps' online softmax against
each key tile, two float32 accumulators, ``O = O1 − λ·O2`` in float32 and one rounding, log-sum-exps in log2 units —
for the classes issue 37's targets are read on: no user mask, no segments, no key splits (training, and inference
where the heuristic does not split), Q1 and Q2 apart (K shared or not), 16-bit inputs on a GPU, head widths powers of
two (:func:`.tuning._fwd_tma`). What differs is how tiles reach the tensor cores: every tile is one
``cp.async.bulk.tensor`` issued by one thread through a tensor descriptor (made on the device per program, over one
head's [T|S, d] rows), where :mod:`.forward` forms a pointer per element and every thread issues its share of
``cp.async``. Rows past the end read as zeros and stores past it are dropped by the hardware, so no bounds mask is
formed on loads or stores; 64 keys a step (the default forward's V1 tiles take 32).

Not warp-specialised: Triton 3.6 and 3.9 build ``tl.range(..., warp_specialize=True)`` on sm_90 (documented for
Blackwell only) from a launch on 4 warps, for a kernel's only loop, and then give this kernel's two consumer warp groups
the same rows — each computed the whole 64-row tile, and stored it — or, on 128-row tiles, split one map's accumulator
and not the other's, or spilled (benchmarks/RESULTS.md). The backward's dK/dV kernel is split cleanly and keeps it
(:mod:`.backward_tma`).

Why a separate kernel and not a constexpr of :mod:`.forward`: a descriptor covers whole rows of one head, where that
kernel packs the rows of all query heads of a KV group into one tile (GQA) and forms masks a descriptor cannot
express (a 4-D mask's rows, segments). Here a program is one query head's block of rows, its KV head
``h // (H / Hkv)``. Causal tiles run in FlashAttention's two phases (whole tiles, then the diagonal), the row blocks
longest first, as there.

Addresses: descriptors need 16-byte-aligned bases and strides, and a last stride of 1 (checked on the host by
:func:`.launch._tma_fits`, which sends everything else to :mod:`.forward`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .forward import _normalised, _online_softmax
from .tile_ops import _row_block_longest_first


@triton.jit
def _head_rows(BASE, rows, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    # one head's [rows, BLOCK_W] matrix at BASE (rows row_stride elements apart) as a descriptor of
    # [BLOCK_ROWS, BLOCK_W] tiles: rows past the end load as zeros, stores past it are dropped (also .backward_tma's)
    return tl.make_tensor_descriptor(BASE, shape=[rows, BLOCK_W], strides=[row_stride, 1],
                                     block_shape=[BLOCK_ROWS, BLOCK_W])  # fmt: skip


@triton.jit
def _key_tiles(k1_desc, k2_desc, v_desc, start_n, SHARED_K: tl.constexpr, UPCAST: tl.constexpr):
    # the key tile at start_n of K1, K2 (K1 itself where SHARED_K) and V, through their descriptors (also the TMA
    # backward's dQ kernel's)
    k1 = k1_desc.load([start_n, 0])
    if SHARED_K:  # noqa: SIM108 (compile-time branch)
        k2 = k1
    else:
        k2 = k2_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])
    if UPCAST:  # the interpreter with bf16 inputs (see diffattn.ops.triton): exact in float32
        k1, k2, v = k1.to(tl.float32), k2.to(tl.float32), v.to(tl.float32)
    return k1, k2, v


@triton.jit
def _tma_tile(
    acc1, acc2, m1, m2, l1, l2, q1, q2, k1_desc, k2_desc, v_desc, start_n, t_row, shift, S, qk_scale,
    DT: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, SHARED_K: tl.constexpr, UPCAST: tl.constexpr,
    PREC: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # one key tile: both maps' scores, their online-softmax updates against the one V tile. MASKED: the diagonal
    # and the last partial tile (keys past S read as zeros, so they are hidden here, as are those past the diagonal).
    # DT: the input dtype, which probabilities are rounded to before the P·V product (as in .forward)
    k1, k2, v = _key_tiles(k1_desc, k2_desc, v_desc, start_n, SHARED_K, UPCAST)
    s1 = tl.dot(q1, tl.trans(k1), input_precision=PREC) * qk_scale  # [BM, BN], log2 units
    s2 = tl.dot(q2, tl.trans(k2), input_precision=PREC) * qk_scale
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = (offs_n < S)[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= t_row[:, None] + shift)
        s1 = tl.where(keep, s1, float("-inf"))
        s2 = tl.where(keep, s2, float("-inf"))
    acc1, m1, l1 = _online_softmax(acc1, m1, l1, s1, v, DT, PREC)
    acc2, m2, l2 = _online_softmax(acc2, m2, l2, s2, v, DT, PREC)
    return acc1, acc2, m1, m2, l1, l2


@triton.jit
def _fwd_tma_kernel(
    Q1, K1, Q2, K2, V, LAM, OUT, O1, O2, LSE1, LSE2,
    sq1b, sq1h, sq1t, sq2b, sq2h, sq2t, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs,
    H, HKV, T, S, qk_scale,
    CAUSAL: tl.constexpr, SHARED_K: tl.constexpr, SAVE_PARTS: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # program = (batch × query head, block of query rows); BLOCK_D, BLOCK_DV are the heads' widths themselves
    # (powers of two: a descriptor's block is the whole row). OUT, O1, O2: [B, H, T, DV] contiguous; LSE1, LSE2 and
    # LAM: [B, H, T] float32
    pid_bh = tl.program_id(0)
    pid_m = _row_block_longest_first(CAUSAL)
    b = pid_bh // H
    h = pid_bh % H
    hkv = h // (H // HKV)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    hkv64 = hkv.to(tl.int64)
    row0 = pid_m * BLOCK_M
    t_row = row0 + tl.arange(0, BLOCK_M)
    row_ok = t_row < T

    # one head's rows as a [T|S, width] matrix each
    q1_desc = _head_rows(Q1 + b64 * sq1b + h64 * sq1h, T, sq1t, BLOCK_M, BLOCK_D)
    q2_desc = _head_rows(Q2 + b64 * sq2b + h64 * sq2h, T, sq2t, BLOCK_M, BLOCK_D)
    k1_desc = _head_rows(K1 + b64 * sk1b + hkv64 * sk1h, S, sk1s, BLOCK_N, BLOCK_D)
    k2_desc = _head_rows(K2 + b64 * sk2b + hkv64 * sk2h, S, sk2s, BLOCK_N, BLOCK_D)
    v_desc = _head_rows(V + b64 * svb + hkv64 * svh, S, svs, BLOCK_N, BLOCK_DV)
    DT = Q1.dtype.element_ty  # the input dtype (UPCAST loads it as float32 under the interpreter)
    head_rows = (b64 * H + h64) * T  # this head's first row of OUT, O1, O2, LSE1, LSE2 and LAM
    q1 = q1_desc.load([row0, 0])
    q2 = q2_desc.load([row0, 0])
    if UPCAST:
        q1, q2 = q1.to(tl.float32), q2.to(tl.float32)
    lam = tl.load(LAM + head_rows + t_row, mask=row_ok, other=0.0)

    # causal, bottom-right aligned: row t sees keys j <= t + S − T. Keys below k_full are seen by every row of the
    # block and lie inside [0, S): no mask formed there (as in .forward)
    shift = S - T
    if CAUSAL:
        kend = tl.minimum(tl.minimum(row0 + BLOCK_M, T) + shift, S)
        k_full = tl.minimum(row0 + 1 + shift, S) // BLOCK_N * BLOCK_N
    else:
        kend = S
        k_full = S // BLOCK_N * BLOCK_N

    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.full([BLOCK_M], 0.0, tl.float32)
    l2 = tl.full([BLOCK_M], 0.0, tl.float32)
    acc1 = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    acc2 = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    # FlashAttention's two phases: the tiles every row sees whole, then the diagonal and boundary tiles
    for start_n in range(0, k_full, BLOCK_N):
        acc1, acc2, m1, m2, l1, l2 = _tma_tile(acc1, acc2, m1, m2, l1, l2, q1, q2, k1_desc, k2_desc, v_desc,
            start_n, t_row, shift, S, qk_scale, DT, False, CAUSAL, SHARED_K, UPCAST, PREC, BLOCK_N)  # fmt: skip
    for start_n in range(k_full, kend, BLOCK_N):
        acc1, acc2, m1, m2, l1, l2 = _tma_tile(acc1, acc2, m1, m2, l1, l2, q1, q2, k1_desc, k2_desc, v_desc,
            start_n, t_row, shift, S, qk_scale, DT, True, CAUSAL, SHARED_K, UPCAST, PREC, BLOCK_N)  # fmt: skip

    # every real row sees a key (no user mask, T <= S when causal); l = 0 only in rows past T, which are not stored
    o1, lse1 = _normalised(acc1, m1, l1, float("inf"))
    o2, lse2 = _normalised(acc2, m2, l2, float("inf"))
    out = o1 - lam[:, None] * o2  # float32 subtraction (docs/methods.md §0.2)
    o_rows = head_rows * BLOCK_DV  # OUT, O1, O2: this head's rows, dense
    _head_rows(OUT + o_rows, T, BLOCK_DV, BLOCK_M, BLOCK_DV).store([row0, 0], out.to(OUT.dtype.element_ty))
    tl.store(LSE1 + head_rows + t_row, lse1, mask=row_ok)
    tl.store(LSE2 + head_rows + t_row, lse2, mask=row_ok)
    if SAVE_PARTS:
        _head_rows(O1 + o_rows, T, BLOCK_DV, BLOCK_M, BLOCK_DV).store([row0, 0], o1.to(O1.dtype.element_ty))
        _head_rows(O2 + o_rows, T, BLOCK_DV, BLOCK_M, BLOCK_DV).store([row0, 0], o2.to(O2.dtype.element_ty))
