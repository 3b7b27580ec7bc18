"""DIFF V1's value heads twice over, ``[V; V]``, for the one-call routes (docs/methods.md §0; DIFF Transformer Eq. 1),
by one Triton kernel each way.

What. A route that makes one SDPA call over both maps' query heads stacked (``sdpa``, ``cudnn``, ``sdpa_split``) hands
that call keys ``[K1; K2]`` (2Hkv heads) and so needs a value head per key head: ``[V; V]`` [B, 2Hkv, S, 2w], where
DIFF head j's V is ``[v_j | v_(j + Hkv)]``, the column halves DiffLlama keeps as two heads of width w
(:func:`diffattn.ops._inputs.v_from_halves` with ``copies=2``, whose layout this keeps). The forward reads each half
once and writes the four places it goes; the backward reads the two copies' gradients and writes V's gradient in V's
own layout — dv_j = dV_j[:w] + dV_(j + Hkv)[:w], dv_(j + Hkv) = dV_j[w:] + dV_(j + Hkv)[w:] — in float32, one
rounding (as PyTorch's sum of the two copies).

Why. PyTorch builds [V; V] from the halves by one generic strided copy, and its backward by a sum over the copies
and one more copy into V's layout: on the H200 of 2026-11-28 those kernels took 0.29 + 0.15 ms of ``cudnn+epilogue``'s
4.02 ms of GPU time at batch·N = 16K, d = 64 (``benchmarks/gpu-runs/h200-2026-11-28/kernels.json``) — ~1.2 TB/s by
the tensors' sizes, where the GPU moves ~4.8 — and issue 34's 1.55x is 0.28 ms below that route. Whether these kernels
are faster is measured on a GPU before the route table switches them on (:func:`diffattn.ops.routes.v_copies_in_kernel`,
``"fused_v_copies"``), and they are used for calls above :data:`diffattn.ops.routes.SMALL_WORK` only: a small call's
time is the host's, where a Triton launch's own cost is not known to be below a copy's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._inputs import heads_inside_tokens
from . import tuning
from .launch import _on_device
from .layout import _last_contiguous


@triton.jit
def _tile(X, base, rows, cols, stride_s, ok):
    return tl.load(X + base + rows[:, None] * stride_s + cols[None, :], mask=ok)


@triton.jit
def _program(HKV, S, W, BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr):
    # this program's batch row b and DIFF head j (grid axis 1), its BLOCK_S keys (axis 0), a half's BLOCK_W columns and
    # which of them exist (64-bit offsets: a cache's V may pass 2³¹ elements)
    bh = tl.program_id(1)
    rows = (tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    cols = tl.arange(0, BLOCK_W)
    ok = (rows < S)[:, None] & (cols < W)[None, :]
    return (bh // HKV).to(tl.int64), (bh % HKV).to(tl.int64), rows, cols, ok


@triton.jit
def _v_twice_fwd_kernel(
    V, OUT_A, OUT_B, HKV, S, W, svb, svh, svs, sab, sah, sas, sbb, sbh, sbs,
    BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # one program: DIFF head j's halves v_j, v_(j + Hkv) over BLOCK_S keys of one batch row, v_j written to heads j and
    # j + Hkv of OUT_A, v_(j + Hkv) to the same heads of OUT_B — the two column halves of [V; V] (OUT_B = OUT_A + W),
    # or two tensors of their own (the V slices of the sdpa_split route)
    b, j, rows, cols, ok = _program(HKV, S, W, BLOCK_S, BLOCK_W)
    va = _tile(V, b * svb + j * svh, rows, cols, svs, ok)
    vb = _tile(V, b * svb + (j + HKV) * svh, rows, cols, svs, ok)
    for copy in tl.static_range(2):
        head = j + copy * HKV
        tl.store(OUT_A + b * sab + head * sah + rows[:, None] * sas + cols[None, :], va, mask=ok)
        tl.store(OUT_B + b * sbb + head * sbh + rows[:, None] * sbs + cols[None, :], vb, mask=ok)


@triton.jit
def _v_twice_bwd_kernel(
    G_A, G_B, DV, HKV, S, W, sab, sah, sas, sbb, sbh, sbs, sdb, sdh, sds,
    BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    # one program: the gradients of DIFF head j's halves over BLOCK_S keys, each half's two copies (heads j and j + Hkv
    # of G_A for v_j, of G_B for v_(j + Hkv)) summed in float32
    b, j, rows, cols, ok = _program(HKV, S, W, BLOCK_S, BLOCK_W)
    da = _tile(G_A, b * sab + j * sah, rows, cols, sas, ok).to(tl.float32)
    da += _tile(G_A, b * sab + (j + HKV) * sah, rows, cols, sas, ok).to(tl.float32)
    db = _tile(G_B, b * sbb + j * sbh, rows, cols, sbs, ok).to(tl.float32)
    db += _tile(G_B, b * sbb + (j + HKV) * sbh, rows, cols, sbs, ok).to(tl.float32)
    at = rows[:, None] * sds + cols[None, :]
    out_type = DV.dtype.element_ty
    tl.store(DV + b * sdb + j * sdh + at, da.to(out_type), mask=ok)
    tl.store(DV + b * sdb + (j + HKV) * sdh + at, db.to(out_type), mask=ok)


#: elements of one half a program moves (a tile of BLOCK_S keys × the half's padded width)
_TILE_ELEMENTS = 4096


def _launch(kernel, tensors: tuple[torch.Tensor, ...], hkv: int, s: int, w: int) -> None:
    """``kernel`` over ``tensors`` (each [B, ·, S, ·], last stride 1; the b, h, s strides of all but the first are
    the kernel's, after the first's own where it has them: the forward reads V, the backward writes dV last)."""
    block_w = max(16, triton.next_power_of_2(w))
    block_s = 4 if tuning.INTERPRETED else max(1, _TILE_ELEMENTS // block_w)  # a few rows: tests span programs
    strides = [st for x in tensors for st in x.stride()[:3]]
    with _on_device(tensors[0].device):
        grid = (triton.cdiv(s, block_s), tensors[0].shape[0] * hkv)
        kernel[grid](*tensors, hkv, s, w, *strides, BLOCK_S=block_s, BLOCK_W=block_w,
                     num_warps=1 if tuning.INTERPRETED else 4)  # fmt: skip


def _like(v: torch.Tensor, width: int) -> torch.Tensor:
    """An empty [B, 2Hkv, S, width] in the layout :func:`diffattn.ops._inputs.v_from_halves` gives [V; V]: tokens
    outside heads where ``v`` has them so (a projection's view), contiguous otherwise (a cache's)."""
    b, two_hkv, s, _ = v.shape
    if heads_inside_tokens(v):
        return v.new_empty(b, s, two_hkv, width).transpose(1, 2)
    return v.new_empty(b, two_hkv, s, width)


def _twice_like(v: torch.Tensor) -> torch.Tensor:
    """An empty [V; V] [B, 2Hkv, S, 2w] for ``v``'s halves, laid out as PyTorch's copy lays it (:func:`_like`)."""
    return _like(v, 2 * v.shape[-1])


def _v_twice_impl(v: torch.Tensor, slices: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[V; V] from V's halves ``v``, or (``slices``) its two column halves as tensors of their own, by the forward
    kernel."""
    v = _last_contiguous(v)
    _, two_hkv, s, w = v.shape
    if slices:
        out = a, b = _like(v, w), _like(v, w)
    else:
        out = _twice_like(v)
        a, b = out, out[..., w:]
    if a.numel():
        _launch(_v_twice_fwd_kernel, (v, a, b), two_hkv // 2, s, w)
    return out


def _v_twice_bwd_impl(g_a: torch.Tensor, g_b: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """V's gradient written into ``dv`` (empty, V's shape) from the gradients of its halves' copies: ``g_a`` of v_j's
    (heads j and j + Hkv), ``g_b`` of v_(j + Hkv)'s; ``dv`` returned."""
    _, two_hkv, s, w = dv.shape
    if dv.numel():
        _launch(_v_twice_bwd_kernel, (_last_contiguous(g_a), _last_contiguous(g_b), dv), two_hkv // 2, s, w)
    return dv


def _grad_layout(v: torch.Tensor) -> tuple:
    # V's gradient in V's own layout (its dimension order, dense: what empty_like gives), so it flows on to the
    # projection with no copy — the layout kept, not V (which nothing else needs alive)
    like = torch.empty_like(v, device="meta")
    return like.shape, like.stride(), v.dtype, v.device


def _empty_grad(layout: tuple) -> torch.Tensor:
    shape, stride, dtype, device = layout
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


class _VTwice(torch.autograd.Function):
    """:func:`_v_twice_impl` (whole or in slices) with V's gradient from the copies' by the backward kernel."""

    @staticmethod
    def forward(ctx, v, slices):
        ctx.grad_layout, ctx.slices = _grad_layout(v), slices
        return _v_twice_impl(v, slices)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's gradient has no graph: a second derivative raises
    def backward(ctx, *grads):  # slices: a slice without a gradient arrives as zeros (materialize_grads)
        w = ctx.grad_layout[0][-1]
        g_a, g_b = grads if ctx.slices else (grads[0][..., :w], grads[0][..., w:])
        return _v_twice_bwd_impl(g_a, g_b, _empty_grad(ctx.grad_layout)), None


def _v_twice(v: torch.Tensor, slices: bool):
    if v.dim() != 4 or v.shape[1] % 2:
        raise ValueError(f"v must be [B, 2Hkv, S, w] (an even head count), got shape {tuple(v.shape)}")
    if torch.is_grad_enabled() and v.requires_grad:
        return _VTwice.apply(v, slices)
    return _v_twice_impl(v, slices)


def v_twice_from_halves(v: torch.Tensor) -> torch.Tensor:
    """``v_from_halves(v, copies=2)`` (the same values and layout) by the kernels of this module; differentiable once,
    in eager mode (under torch.compile the caller takes PyTorch's ops, which inductor fuses itself). ``v``: DiffLlama's
    V [B, 2Hkv, S, w], its last dimension dense."""
    return _v_twice(v, slices=False)


def v_twice_slices(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[V; V]'s two column halves as tensors of their own, ``[va; va]`` and ``[vb; vb]`` ([B, 2Hkv, S, w] each: the V
    slices the ``sdpa_split`` route calls SDPA with at dv = 2d), by the same kernels: their gradients are summed into
    V's from the two tensors as they come, where slicing [V; V] has autograd join them into one first (a copy of both).
    The values of ``v_from_halves(v, copies=2).split(w, dim=-1)``; differentiable once, in eager mode."""
    return _v_twice(v, slices=True)
