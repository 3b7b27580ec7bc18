"""DIFF Transformer's λ (Eq. 2, docs/methods.md §1), ``λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init``, as one kernel, and
its gradient in one more.

Why. PyTorch computes λ from the layer's four vectors (width d) in eight element-wise kernels (two products, two sums,
two exponentials, a difference, a sum) and its gradient in about seven more, each a launch and a dispatch of a few
dozen bytes' work: ~15 of the ~35 launches a DIFF layer adds to a Llama layer's training step (counted on the CPU,
benchmarks/RESULTS.md, 2026-11-28), where a `small` model's step is host-bound (the H200 of 2026-11-28: the
baseline's GPU busy 8.6 of its 40 ms). Here the forward reads the four vectors once and writes λ and the two
exponentials (saved for the backward); the backward reads dλ, the exponentials and the vectors and writes the four
gradients. Whether two Triton launches cost the host less than fifteen of PyTorch's is measured on a GPU before the
route table switches it on (:func:`diffattn.ops.routes.lambda_in_kernel`), not assumed.

Arithmetic: float32 throughout (the vectors as they are, widened), as :func:`diffattn.lambdas.reparameterized_lambda`;
the gradients rounded once to the vectors' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import tuning
from .launch import _on_device
from .tile_ops import _SUM  # not tl.sum: see tile_ops (the interpreter and an earlier triton import)


@triton.jit
def _vector_f32(X, cols, ok):
    return tl.load(X + cols, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _lambda_fwd_kernel(Q1, K1, Q2, K2, LAM, EXPS, D, INIT, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    e1 = tl.exp(tl.reduce(_vector_f32(Q1, cols, ok) * _vector_f32(K1, cols, ok), 0, _SUM))
    e2 = tl.exp(tl.reduce(_vector_f32(Q2, cols, ok) * _vector_f32(K2, cols, ok), 0, _SUM))
    tl.store(LAM, e1 - e2 + INIT)
    tl.store(EXPS, e1)
    tl.store(EXPS + 1, e2)


@triton.jit
def _lambda_bwd_kernel(G, EXPS, Q1, K1, Q2, K2, GRADS, D, BLOCK: tl.constexpr):
    # dλq1 = dλ·e1·λk1, dλk1 = dλ·e1·λq1, dλq2 = −dλ·e2·λk2, dλk2 = −dλ·e2·λq2; GRADS holds the four rows of [4, D]
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    g = tl.load(G).to(tl.float32)
    a = g * tl.load(EXPS)
    b = -g * tl.load(EXPS + 1)
    out_type = GRADS.dtype.element_ty
    tl.store(GRADS + cols, (a * _vector_f32(K1, cols, ok)).to(out_type), mask=ok)
    tl.store(GRADS + D + cols, (a * _vector_f32(Q1, cols, ok)).to(out_type), mask=ok)
    tl.store(GRADS + 2 * D + cols, (b * _vector_f32(K2, cols, ok)).to(out_type), mask=ok)
    tl.store(GRADS + 3 * D + cols, (b * _vector_f32(Q2, cols, ok)).to(out_type), mask=ok)


def _block(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _warps() -> int:
    return 1 if tuning.INTERPRETED else 4


def _lambda_fwd(q1, k1, q2, k2, init: float) -> tuple[torch.Tensor, torch.Tensor]:
    lam = torch.empty((), dtype=torch.float32, device=q1.device)
    exps = torch.empty(2, dtype=torch.float32, device=q1.device)
    with _on_device(q1.device):
        _lambda_fwd_kernel[(1,)](q1, k1, q2, k2, lam, exps, q1.numel(), init, BLOCK=_block(q1.numel()),
                                 num_warps=_warps())  # fmt: skip
    return lam, exps


def _lambda_bwd(g, exps, q1, k1, q2, k2) -> torch.Tensor:
    d = q1.numel()
    grads = torch.empty((4, d), dtype=q1.dtype, device=q1.device)
    with _on_device(q1.device):
        _lambda_bwd_kernel[(1,)](g, exps, q1, k1, q2, k2, grads, d, BLOCK=_block(d), num_warps=_warps())
    return grads


class _Lambda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q1, k1, q2, k2, init):
        lam, exps = _lambda_fwd(q1, k1, q2, k2, init)
        ctx.save_for_backward(exps, q1, k1, q2, k2)
        return lam

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel's gradients carry no graph: a second derivative raises
    def backward(ctx, g):
        exps, q1, k1, q2, k2 = ctx.saved_tensors
        dq1, dk1, dq2, dk2 = _lambda_bwd(g.contiguous(), exps, q1, k1, q2, k2).unbind(0)
        return dq1.view_as(q1), dk1.view_as(k1), dq2.view_as(q2), dk2.view_as(k2), None


def reparameterized_lambda_kernel(
    lambda_q1: torch.Tensor, lambda_k1: torch.Tensor, lambda_q2: torch.Tensor, lambda_k2: torch.Tensor, lambda_init
) -> torch.Tensor:
    """:func:`diffattn.lambdas.reparameterized_lambda` by the kernels (module docstring): a 0-d float32 tensor,
    differentiable once in the four vectors (contiguous, one dtype and device, the same number of elements)."""
    vectors = (lambda_q1, lambda_k1, lambda_q2, lambda_k2)
    if any(v.shape != lambda_q1.shape or v.dtype != lambda_q1.dtype or not v.is_contiguous() for v in vectors):
        raise ValueError(
            "the four λ vectors must be contiguous and of one shape and dtype, got "
            f"{[(tuple(v.shape), v.dtype, v.is_contiguous()) for v in vectors]}"
        )
    if torch.is_grad_enabled() and any(v.requires_grad for v in vectors):
        return _Lambda.apply(*vectors, float(lambda_init))
    return _lambda_fwd(*vectors, float(lambda_init))[0]
