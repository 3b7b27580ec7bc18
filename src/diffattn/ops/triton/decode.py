"""The decoding path of the fused kernel (flash-decoding), for a forward that needs no gradient and whose
programs would leave most of the GPU idle (few sequences, short T; DIFF Transformer Eq. 1, docs/methods.md §0).

The forward kernel (:mod:`.forward`, ``SPLIT``) then runs with one more grid axis over key ranges: each program
writes its rows' per-map outputs, normalised over its keys only, and their log-sum-exps to float32 buffers
``[splits, B·H·T, ...]``. ``_combine_kernel`` merges the splits, per map, and forms ``O1 − λ·O2`` in float32
(docs/methods.md §0.2). How many splits, and the tiles of a split forward, are :mod:`.tuning`'s choice
(``_num_splits``, ``_SPLIT_TILES``); the launch is :func:`.launch._fwd_run`'s.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
