"""Two-map attention over query chunks in PyTorch ops, with a hand-written backward (docs/methods.md §0, DIFF Eq. 1).

The FlashAttention idea — never hold the whole [T, S] score matrix — applied one query chunk at a time, but
with both maps of a chunk materialised together, which lets the differential structure save work that two
separate attention calls cannot:

* forward: ``O = (P1 − λ·P2) V`` — the *signed* map multiplies V once (one [c, S]×[S, dv] product instead of
  two). Matmul FLOPs equal those of a baseline with 2h heads of width d.
* backward: ``G = dO Vᵀ`` is shared by both maps (dP1 = G, dP2 = −λ·G, the paper's "dV and dP₂ reuse dP₁"),
  ``dV = (P1 − λP2)ᵀ dO`` is one product, and P1, P2 are recomputed from Q, K (nothing of size [T, S] is
  saved): again the baseline's matmul FLOPs.

Measured on a 2-core CPU (fp32, N = 2048, d = 64, causal): forward+backward 1.28× a same-size baseline on
PyTorch's fused flash kernel, against 1.86–1.97× for the best SDPA arrangement (``sdpa`` backend); see
``benchmarks/attention.py``. Causal chunks only visit keys up to their last query (bottom-right aligned).

Memory: a chunk's maps are [B, H, c, S] for c queries (c = 128 by default), linear in S; nothing of size
[T, S] is saved for the backward, which recomputes P1 and P2 chunk by chunk. Compute is float32 (float64
stays float64) whatever the input dtype. GQA is handled without repeating K/V: the n_rep query heads of a
group are folded into the rows of one matmul against their shared key head.
"""

from __future__ import annotations

import torch

from ._inputs import DiffAttentionInputs, fully_masked_rows, values_readable

DEFAULT_CHUNK = 128


def _grouped(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    # [B, H, c, x] -> [B, Hkv, n_rep·c, x]: query heads h·n_rep … (h+1)·n_rep−1 share key head h
    b, h, c, w = x.shape
    return x.reshape(b, num_kv_heads, (h // num_kv_heads) * c, w)


def _ungrouped(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, hkv, rc, w = x.shape
    return x.view(b, num_heads, rc * hkv // num_heads, w)


class _ChunkPlan:
    """Per-chunk key range, additive bias (causal and/or attn_mask) and fully masked rows, shared by forward and
    backward. Fully masked rows follow the rule of :mod:`diffattn.ops._inputs`, found once for all chunks (one
    reduction over the mask); a masked key of a row that keeps some key gets probability 0 from its bias as is
    (``-inf``, or an additive ``finfo.min``), so the bias is not rewritten."""

    def __init__(self, inp: DiffAttentionInputs, chunk: int, dtype: torch.dtype):
        self.t, self.s, self.chunk = inp.q_len, inp.kv_len, chunk
        self.causal, self.mask, self.dtype, self.device = inp.causal, inp.attn_mask, dtype, inp.q1.device
        fully = fully_masked_rows(inp)  # [B|1, H|1, T, 1] or None
        self.fully = _if_any(fully)

    def chunks(self):
        for i0 in range(0, self.t, self.chunk):
            i1 = min(self.t, i0 + self.chunk)
            # causal, bottom-right aligned: query i sees keys j <= i + S − T
            kend = i1 + self.s - self.t if self.causal else self.s
            yield i0, i1, kend, self._bias(i0, i1, kend)

    def _bias(self, i0: int, i1: int, kend: int):
        """Additive bias [B|1, H|1, c, kend] (or None) and a mask of fully masked rows (or None)."""
        bias = None
        if self.mask is not None:
            m = self.mask[..., :kend] if self.mask.shape[2] == 1 else self.mask[:, :, i0:i1, :kend]
            if m.dtype == torch.bool:
                bias = torch.zeros(m.shape, dtype=self.dtype, device=self.device).masked_fill_(~m, float("-inf"))
            else:
                bias = m.to(self.dtype)
        if self.causal and i1 - i0 > 1:  # the chunk's last row sees all kend keys, earlier rows fewer
            rows = torch.arange(i0, i1, device=self.device)[:, None] + (self.s - self.t)
            keep = torch.arange(kend, device=self.device)[None, :] <= rows  # [c, kend]
            causal = torch.zeros(keep.shape, dtype=self.dtype, device=self.device).masked_fill_(~keep, float("-inf"))
            bias = causal if bias is None else bias + causal
        return bias, _if_any(None if self.fully is None else self.fully[:, :, i0:i1])


def _if_any(rows: torch.Tensor | None) -> torch.Tensor | None:
    """``rows`` (a bool mask of fully masked rows) where any is True, else None: nothing to fill. Where values are not
    read on the host (:func:`~diffattn.ops._inputs.values_readable`: torch.compile, a CUDA graph's capture) kept as it
    is — the fill of no row is a no-op."""
    if rows is None or not values_readable() or bool(rows.any()):
        return rows
    return None


def _probs(q: torch.Tensor, k_t: torch.Tensor, scale: float, bias, fully_masked, hkv: int) -> torch.Tensor:
    """softmax(q kᵀ·s + bias) for one chunk; a fully masked row attends to nothing (zeros, not NaN, not the
    uniform row that all-equal ``finfo.min`` scores give)."""
    scores = _ungrouped(_grouped(q, hkv) @ k_t, q.shape[1]).mul_(scale)  # [B, H, c, kend]
    if bias is not None:
        scores = scores.add_(bias)
    p = torch.softmax(scores, dim=-1)
    if fully_masked is not None:
        p = p.masked_fill_(fully_masked, 0.0)
    return p


def _rows(lam: torch.Tensor, i0: int, i1: int) -> torch.Tensor:
    """λ for query rows [i0, i1): a per-token λ [B, H, T, 1] is sliced; a scalar or per-head λ broadcasts."""
    return lam[:, :, i0:i1] if lam.dim() == 4 and lam.shape[2] > 1 else lam


class _ChunkedDiffAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q1, k1, q2, k2, v, lam, inp: DiffAttentionInputs, chunk: int):
        # q2 / k2 None: the maps share Q (DiffK) or K (DIFF V2, DAA, DiffQ), passed once — torch.compile cannot trace
        # an autograd Function given one tensor twice — and their gradient is the sum of the two maps'
        ctx.shared = (q2 is None, k2 is None)
        q2, k2 = (q1 if q2 is None else q2), (k1 if k2 is None else k2)
        compute = torch.promote_types(q1.dtype, torch.float32)
        q1c, k1c, q2c, k2c, vc = (x.to(compute) for x in (q1, k1, q2, k2, v))
        lamc = lam.to(compute)
        hkv = k1.shape[1]
        plan = _ChunkPlan(inp, chunk, compute)
        out = torch.empty(*q1.shape[:3], v.shape[-1], dtype=compute, device=q1.device)  # [B, H, T, dv]
        k1t, k2t = k1c.transpose(-1, -2), k2c.transpose(-1, -2)
        for i0, i1, kend, (bias, fully) in plan.chunks():
            p1 = _probs(q1c[:, :, i0:i1], k1t[..., :kend], inp.scale, bias, fully, hkv)
            p2 = _probs(q2c[:, :, i0:i1], k2t[..., :kend], inp.scale, bias, fully, hkv)
            signed = p1.sub_(p2.mul_(_rows(lamc, i0, i1)))  # P1 − λ·P2
            out[:, :, i0:i1] = _ungrouped(_grouped(signed, hkv) @ vc[:, :, :kend], q1.shape[1])
        ctx.save_for_backward(q1c, k1c, q2c, k2c, vc, lamc)
        ctx.inp, ctx.chunk, ctx.in_dtypes = inp, chunk, (q1.dtype, lam.dtype)
        # under torch.compile handed over as a tensor of its own even where .to() would return the buffer the loop wrote
        # in place (fp32): under torch 2.11's AOTAutograd the backward of a Function returning that buffer received a
        # zero gradient (every gradient 0, silently; tests/ops/test_compile_dynamic.py), where torch 2.13's was right
        return out.to(q1.dtype, copy=torch.compiler.is_compiling())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q1, k1, q2, k2, v, lam = ctx.saved_tensors
        inp, compute = ctx.inp, q1.dtype
        h, hkv = q1.shape[1], k1.shape[1]
        dout = dout.to(compute)
        dq1, dq2 = torch.empty_like(q1), torch.empty_like(q2)
        dk1, dk2, dv = torch.zeros_like(k1), torch.zeros_like(k2), torch.zeros_like(v)
        dlam = torch.zeros_like(lam)
        per_token = lam.dim() == 4 and lam.shape[2] > 1  # [B, H, T, 1]: dλ is −Δ2 row by row
        k1t, k2t, vt = k1.transpose(-1, -2), k2.transpose(-1, -2), v.transpose(-1, -2)
        for i0, i1, kend, (bias, fully) in _ChunkPlan(inp, ctx.chunk, compute).chunks():
            qa, qb, do = q1[:, :, i0:i1], q2[:, :, i0:i1], dout[:, :, i0:i1]
            lam_rows = _rows(lam, i0, i1)
            p1 = _probs(qa, k1t[..., :kend], inp.scale, bias, fully, hkv)
            p2 = _probs(qb, k2t[..., :kend], inp.scale, bias, fully, hkv)
            g = _ungrouped(_grouped(do, hkv) @ vt[..., :kend], h)  # dO Vᵀ, shared by both maps
            signed_t = _grouped(p1 - lam_rows * p2, hkv).transpose(-1, -2)
            dv[:, :, :kend] += signed_t @ _grouped(do, hkv)
            d1 = (p1 * g).sum(-1, keepdim=True)  # rowsum(dP1 ⊙ P1) = dO·O1
            d2 = (p2 * g).sum(-1, keepdim=True)  # rowsum(G ⊙ P2)   = dO·O2
            if per_token:
                dlam[:, :, i0:i1] = -d2
            else:  # a scalar, per head [1, H, 1, 1], or per token with T = 1 [B, H, 1, 1]
                dlam -= d2.sum() if lam.dim() == 0 else d2.sum_to_size(lam.shape)
            ds1 = p1.mul_(g - d1).mul_(inp.scale)  # softmax backward of map 1
            ds2 = p2.mul_(g.sub_(d2)).mul_(-lam_rows * inp.scale)  # map 2, through −λ
            dq1[:, :, i0:i1] = _ungrouped(_grouped(ds1, hkv) @ k1[:, :, :kend], h)
            dq2[:, :, i0:i1] = _ungrouped(_grouped(ds2, hkv) @ k2[:, :, :kend], h)
            dk1[:, :, :kend] += _grouped(ds1, hkv).transpose(-1, -2) @ _grouped(qa, hkv)
            dk2[:, :, :kend] += _grouped(ds2, hkv).transpose(-1, -2) @ _grouped(qb, hkv)
        dtype, lam_dtype = ctx.in_dtypes
        shared_q, shared_k = ctx.shared
        dq1, dq2 = (dq1.add_(dq2), None) if shared_q else (dq1, dq2)
        dk1, dk2 = (dk1.add_(dk2), None) if shared_k else (dk1, dk2)
        grads = (None if g is None else g.to(dtype) for g in (dq1, dk1, dq2, dk2, dv))
        return (*grads, dlam.to(lam_dtype), None, None)


def diff_attention_chunked(inp: DiffAttentionInputs, chunk: int | None = None) -> torch.Tensor:
    """``chunk`` queries per step; ``None`` reads :data:`DEFAULT_CHUNK` at call time (tests lower it)."""
    chunk = chunk or DEFAULT_CHUNK
    q2 = None if inp.q2 is inp.q1 else inp.q2
    k2 = None if inp.k2 is inp.k1 else inp.k2
    return _ChunkedDiffAttention.apply(inp.q1, inp.k1, q2, k2, inp.v, inp.lam, inp, chunk)
