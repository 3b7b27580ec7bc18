"""The last step of every SDPA route as one kernel: ``out = O1 − λ·O2`` in float32, rounded once to the output's dtype
(DIFF Transformer Eq. 1, docs/methods.md §0.2), and its backward in one more.

Why. The SDPA routes (:mod:`diffattn.ops.sdpa`) get O1 and O2 from PyTorch's attention and subtract them in PyTorch: two
casts to float32, a product, a difference and a cast back — five passes over [B, H, T, dv] and about as many in the
backward, each a kernel launch. Measured on the H200 of 2026-11-28 (torch 2.11.0+cu130, triton 3.6.0, cuDNN 9.19,
benchmarks/gpu-runs/h200-2026-11-28): DIFF V1 at d = 64 through ``cudnn+epilogue`` 1.84× the baseline forward+backward
(1.67× by GPU busy time) against ``cudnn``'s 2.05×, ``cudnn_maps+epilogue`` 2.17× against ``cudnn_maps``' 2.20×; at
d = 96 the kernel saved 0.54–0.84 ms a call (h200-2026-11-27b). Here the forward reads O1, O2 and λ once and writes the
output (6 bytes an element in bf16 against about 40); the backward reads the output's gradient and O2 and writes dO2 and
one float32 per row (dO1 is the gradient itself, no copy) — or, where O1 and O2 are the halves of one call's output
(:func:`subtract_pair`), that output's whole gradient, dO1 included. Whether that is faster on a GPU is measured (the
routes ``<route>+epilogue`` of :mod:`diffattn.ops.routes`), not assumed: none of them is chosen before the route sweep
has timed it.

With ``norm`` = (eps, scale) the forward also norms each row, DIFF Eq. 3's head without a gain:
``scale · y / sqrt(mean(y²) + eps)`` with y = O1 − λ·O2 (one row of dv values is one head, so a row's tile holds the
norm's whole group), and the backward applies the norm's gradient before the subtraction's, reading O1 back — the
layer's norm and its multiplier without the passes and launches of PyTorch's (the head norm of
:class:`diffattn.ops.HeadNorm`, where the route table switches it on).

Shapes: O1, O2 [B, H, T, dv], any strides with the last one 1 (the stacked routes hand over slices of one
[B, 2H, T, dv] output, V2's interleaved one views of [B, H, 2, T, dv]); λ 0-d, [1, H, 1, 1] or [B, H, T, 1]
(:func:`diffattn.ops._inputs.validate`'s forms), read through its strides; the output, and dO2, laid out in O1's
(O2's) dimension order, as PyTorch's element-wise ops lay theirs out (:func:`_output_like`). dλ is summed from the
per-row float32 products back to λ's own shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._inputs import interleaved_pair, wants_grad
from . import tuning
from .eager import choose, eager_twin
from .launch import _on_device
from .layout import _last_contiguous
from .tile_ops import _SUM  # not tl.sum: see tile_ops (the interpreter and an earlier triton import)

#: elements a program holds per tensor on a GPU (a memory-bound pass: enough to keep loads wide, few registers)
_TILE_ELEMENTS = 4096


@triton.jit
def _row_offsets(rows, H, T, SB, SH, ST):
    # the element offset of each (b, h, t) row of a [B, H, T, ·] tensor with strides SB, SH, ST, in 64 bits
    t = rows % T
    bh = rows // T
    return (bh // H).to(tl.int64) * SB + (bh % H).to(tl.int64) * SH + t.to(tl.int64) * ST


@triton.jit
def _rows_f32(X, rows, cols, tile, H, T, SB, SH, ST):
    # the rows' [BLOCK_R, BLOCK_DV] tile of a [B, H, T, dv] tensor (last stride 1), in float32; 0 outside
    return tl.load(X + _row_offsets(rows, H, T, SB, SH, ST)[:, None] + cols[None, :], mask=tile, other=0.0).to(
        tl.float32
    )


@triton.jit
def _lam_f32(LAM, rows, ok, H, T, SB, SH, ST):
    # λ of each row (strides 0 along what it is broadcast over), in float32
    return tl.load(LAM + _row_offsets(rows, H, T, SB, SH, ST), mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _program_rows(R, DV, BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr):
    # this program's rows of the flattened [B·H·T] and their columns: (rows, rows in range, columns, tile in range)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < R
    cols = tl.arange(0, BLOCK_DV)
    return rows, ok, cols, ok[:, None] & (cols < DV)[None, :]


@triton.jit
def _store_rows(X, rows, cols, tile, H, T, SB, SH, ST, value):
    # the rows' tile of a [B, H, T, dv] output with strides SB, SH, ST (last stride 1), in its dtype
    offsets = _row_offsets(rows, H, T, SB, SH, ST)[:, None] + cols[None, :]
    tl.store(X + offsets, value.to(X.dtype.element_ty), mask=tile)


@triton.jit
def _rows_f32_parts(XA, XB, rows, cols, tile, H, T, SB, SH, ST, D):
    # the rows' tile of [XA | XB], two [B, H, T, ·] tensors of one layout joined along the columns at D (the first D
    # columns XA's), in float32; 0 outside — a join no tensor holds (PARTS)
    offsets = _row_offsets(rows, H, T, SB, SH, ST)[:, None]
    first = (cols < D)[None, :]
    a = tl.load(XA + offsets + cols[None, :], mask=tile & first, other=0.0).to(tl.float32)
    return a + tl.load(XB + offsets + (cols - D)[None, :], mask=tile & ~first, other=0.0).to(tl.float32)


@triton.jit
def _store_rows_parts(XA, XB, rows, cols, tile, H, T, SB, SH, ST, D, value):
    # the rows' tile written into [XA | XB] joined at D, as _rows_f32_parts reads it
    offsets = _row_offsets(rows, H, T, SB, SH, ST)[:, None]
    first = (cols < D)[None, :]
    tl.store(XA + offsets + cols[None, :], value.to(XA.dtype.element_ty), mask=tile & first)
    tl.store(XB + offsets + (cols - D)[None, :], value.to(XB.dtype.element_ty), mask=tile & ~first)


@triton.jit
def _inverse_rms(y, DV, EPS):
    # 1 / sqrt(mean(y²) + eps) of each row (the padded columns hold 0 and add nothing), as torch's rms_norm
    return tl.math.rsqrt(tl.reduce(y * y, 1, _SUM) / DV + EPS)


@triton.jit
def _subtract_fwd_kernel(
    O1, O2, LAM, OUT, O1B, O2B,
    S1B, S1H, S1T, S2B, S2H, S2T, SLB, SLH, SLT, SOB, SOH, SOT,
    R, H, T, DV, EPS, SCALE, D,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, NORM: tl.constexpr, PARTS: tl.constexpr,
):  # fmt: skip
    # NORM: the head's norm too, SCALE · y / rms(y) with y = O1 − λ·O2 (DIFF Eq. 3 without a gain; one row is one
    # head's dv values, so the row's tile is the norm's group). PARTS: O1 is [O1 | O1B] and O2 [O2 | O2B], joined at
    # column D (two calls' outputs, each of V's slices: the sdpa_split route), read where they are
    rows, ok, cols, tile = _program_rows(R, DV, BLOCK_R, BLOCK_DV)
    if PARTS:
        o1 = _rows_f32_parts(O1, O1B, rows, cols, tile, H, T, S1B, S1H, S1T, D)
        o2 = _rows_f32_parts(O2, O2B, rows, cols, tile, H, T, S2B, S2H, S2T, D)
    else:
        o1 = _rows_f32(O1, rows, cols, tile, H, T, S1B, S1H, S1T)
        o2 = _rows_f32(O2, rows, cols, tile, H, T, S2B, S2H, S2T)
    out = o1 - _lam_f32(LAM, rows, ok, H, T, SLB, SLH, SLT)[:, None] * o2
    if NORM:
        out = out * (_inverse_rms(out, DV, EPS) * SCALE)[:, None]
    _store_rows(OUT, rows, cols, tile, H, T, SOB, SOH, SOT, out)


@triton.jit
def _subtract_bwd_kernel(
    G, O2, LAM, DO2, DLAM, DO1, O1, O2B, DO2B, DO1B, O1B,
    SGB, SGH, SGT, S2B, S2H, S2T, SLB, SLH, SLT, SDB, SDH, SDT, S1B, S1H, S1T, SOB, SOH, SOT,
    R, H, T, DV, EPS, SCALE, D,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, JOINED: tl.constexpr, NORM: tl.constexpr, PARTS: tl.constexpr,
):  # fmt: skip
    # dO2 = −λ·dy (float32, rounded once); the row's share of dλ, −Σ_c dy·O2, in float32. Without NORM dy is g, the
    # output's gradient; with it, the norm's backward: y = O1 − λ·O2 again (O1 read, not saved), u = y / rms(y),
    # dy = SCALE / rms(y) · (g − u · mean(g · u)), written to dO1. JOINED: O1 and O2 are the two halves of one call's
    # output, and dy is also written to dO1, the other half of that output's gradient (the join autograd would
    # otherwise make by a cat, reading g and dO2 again). PARTS: O1, O2, dO1 and dO2 are each two tensors joined at
    # column D, as the forward's (the B-suffixed ones the columns from D on)
    rows, ok, cols, tile = _program_rows(R, DV, BLOCK_R, BLOCK_DV)
    dy = _rows_f32(G, rows, cols, tile, H, T, SGB, SGH, SGT)
    lam = _lam_f32(LAM, rows, ok, H, T, SLB, SLH, SLT)[:, None]
    if PARTS:
        o2 = _rows_f32_parts(O2, O2B, rows, cols, tile, H, T, S2B, S2H, S2T, D)
    else:
        o2 = _rows_f32(O2, rows, cols, tile, H, T, S2B, S2H, S2T)
    if NORM:
        if PARTS:
            o1 = _rows_f32_parts(O1, O1B, rows, cols, tile, H, T, SOB, SOH, SOT, D)
        else:
            o1 = _rows_f32(O1, rows, cols, tile, H, T, SOB, SOH, SOT)
        y = o1 - lam * o2
        inv = _inverse_rms(y, DV, EPS)[:, None]
        u = y * inv
        dy = (SCALE * inv) * (dy - u * (tl.reduce(dy * u, 1, _SUM) / DV)[:, None])
    if PARTS:
        _store_rows_parts(DO2, DO2B, rows, cols, tile, H, T, SDB, SDH, SDT, D, -lam * dy)
    else:
        _store_rows(DO2, rows, cols, tile, H, T, SDB, SDH, SDT, -lam * dy)
    if (JOINED or NORM) and PARTS:
        _store_rows_parts(DO1, DO1B, rows, cols, tile, H, T, S1B, S1H, S1T, D, dy)
    elif JOINED or NORM:
        _store_rows(DO1, rows, cols, tile, H, T, S1B, S1H, S1T, dy)  # without NORM g itself: the round trip is exact
    tl.store(DLAM + rows, -tl.reduce(dy * o2, 1, _SUM), mask=ok)


def _tiles(dv: int) -> tuple[int, int, int]:
    """(rows per program, the padded row width, warps). Under the interpreter a few rows, so that tiny test shapes
    span several programs and a partly filled last one."""
    block_dv = max(16, triton.next_power_of_2(dv))
    if tuning.INTERPRETED:
        return 4, block_dv, 1
    return max(1, _TILE_ELEMENTS // block_dv), block_dv, 4


def _row_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """The b, h, t strides of a [B, H, T, ·] tensor, 0 along a dimension of size 1 (λ broadcast from it)."""
    # unrolled: ten calls a layer's forward and backward, where a generator cost ~2 µs each (host time, which a small
    # model's step is bound by)
    (sb, sh, st), (b, h, t) = x.stride()[:3], x.shape[:3]
    return sb if b > 1 else 0, sh if h > 1 else 0, st if t > 1 else 0


def _lam4(lam: torch.Tensor) -> torch.Tensor:
    return lam.reshape(1, 1, 1, 1) if lam.dim() == 0 else lam


def _output_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)``: dense, its dimensions in ``x``'s order (preserve_format infers that order for a strided
    view too), so with ``x``'s last stride 1 the last dimension stays innermost — the layout PyTorch's element-wise ops
    give. Why not contiguous [B, H, T, dv]: the model transposes the attention's output to [B, T, H·dv] next, free from
    the [B, T, H, dv] layout the SDPA kernels write and a copy from a contiguous one; and dO2 in O2's layout is what
    the SDPA routes hand SDPA's backward anyway (:mod:`diffattn.ops.sdpa`: PyTorch's cuDNN graph cache), so it is not
    copied there. The epilogue wrote contiguous [B, H, T, dv] until the second H200 lease found it faster per call and
    slower inside a model's step."""
    return torch.empty_like(x)


def _launch_subtract(kernel, grid_rows: int, args: tuple, dv: int, **consts) -> None:
    block_r, block_dv, warps = _tiles(dv)
    with _on_device(args[0].device):
        grid = (triton.cdiv(grid_rows, block_r),)
        kernel[grid](*args, BLOCK_R=block_r, BLOCK_DV=block_dv, num_warps=warps, **consts)


def _norm_args(norm_eps: float | None, norm_scale: float) -> tuple[float, float, dict]:
    """The kernels' EPS, SCALE and NORM for the head norm ``norm_eps`` (None: no norm)."""
    return (0.0, 1.0, {"NORM": False}) if norm_eps is None else (norm_eps, norm_scale, {"NORM": True})


def _subtract_impl(
    o1: torch.Tensor, o2: torch.Tensor, lam: torch.Tensor, norm_eps: float | None = None, norm_scale: float = 1.0
) -> torch.Tensor:
    o1, o2 = _last_contiguous(o1), _last_contiguous(o2)
    return _subtract_fwd_launch(o1, o2, lam, _output_like(o1), norm_eps, norm_scale)


def _subtract_fwd_launch(
    o1: torch.Tensor,
    o2: torch.Tensor,
    lam: torch.Tensor,
    out: torch.Tensor,
    norm_eps: float | None,
    norm_scale: float,
    parts: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``out`` [B, H, T, dv] written: O1 − λ·O2, normed where ``norm_eps`` is given. ``parts``: (O1B, O2B), the columns
    from O1's width on of O1 and O2 (two calls' outputs joined there by the kernel, :func:`subtract_pair_parts`)."""
    b, h, t, dv = out.shape
    lam4 = _lam4(lam)
    rows = b * h * t
    if rows:
        eps, scale, norm = _norm_args(norm_eps, norm_scale)
        o1b, o2b = parts or (o1, o2)
        strides = (*_row_strides(o1), *_row_strides(o2), *_row_strides(lam4), *_row_strides(out))
        args = (o1, o2, lam4, out, o1b, o2b, *strides, rows, h, t, dv, eps, scale, o1.shape[-1])
        _launch_subtract(_subtract_fwd_kernel, rows, args, dv, PARTS=parts is not None, **norm)
    return out


def _subtract_bwd_launch(
    g: torch.Tensor,
    o1: torch.Tensor | None,
    o2: torch.Tensor,
    lam: torch.Tensor,
    do2: torch.Tensor,
    do1: torch.Tensor | None,
    norm_eps: float | None = None,
    norm_scale: float = 1.0,
    parts: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """dO2 (and dO1 where given: g itself, or the norm's gradient) written in place; the per-row float32 shares of dλ
    returned. ``o1`` is read only with the norm (``norm_eps`` not None), which needs ``do1``. ``parts``: (O1B, O2B,
    dO1B, dO2B), the columns from O2's width on of O1, O2, dO1 and dO2 (:func:`subtract_pair_parts`; dO1 given)."""
    b, h, t, d = o2.shape
    dv = g.shape[-1]
    g, o2 = _last_contiguous(g), _last_contiguous(o2)
    dlam_rows = torch.empty((b, h, t), dtype=torch.float32, device=o2.device)
    lam4 = _lam4(lam)
    rows = b * h * t
    if rows:
        eps, scale, norm = _norm_args(norm_eps, norm_scale)
        joined = do1 is not None and norm_eps is None
        do1 = do1 if do1 is not None else do2  # not written without JOINED or NORM: dO2 stands in
        o1 = _last_contiguous(o1) if o1 is not None else o2  # not read without NORM: O2 stands in
        o1b, o2b, do1b, do2b = parts or (o1, o2, do1, do2)
        strides = (*_row_strides(g), *_row_strides(o2), *_row_strides(lam4), *_row_strides(do2), *_row_strides(do1),
                   *_row_strides(o1))  # fmt: skip
        args = (g, o2, lam4, do2, dlam_rows, do1, o1, o2b, do2b, do1b, o1b, *strides, rows, h, t, dv, eps, scale, d)
        _launch_subtract(_subtract_bwd_kernel, rows, args, dv, JOINED=joined, PARTS=parts is not None, **norm)
    return dlam_rows


def _subtract_bwd_impl(
    g: torch.Tensor,
    o1: torch.Tensor,
    o2: torch.Tensor,
    lam: torch.Tensor,
    norm_eps: float | None = None,
    norm_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dO1, dO2 and dλ's per-row shares. Without the norm O1 is not read and dO1 is g itself, which the caller takes
    (a custom op may not return its input): an empty tensor stands in."""
    do2 = _output_like(_last_contiguous(o2))
    if norm_eps is None:
        return g.new_empty(0), do2, _subtract_bwd_launch(g, None, o2, lam, do2, None)
    do1 = _output_like(_last_contiguous(o1))
    return do1, do2, _subtract_bwd_launch(g, o1, o2, lam, do2, do1, norm_eps, norm_scale)


def _pair(o: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """O1 and O2, views of one call's [B, 2H, T, dv] output: its query heads stacked (map 1's, then map 2's: DIFF V1's
    one call) or interleaved (map 1 and map 2 of head 0, then of head 1: DIFF V2's)."""
    return interleaved_pair(o, 1) if interleaved else o.chunk(2, dim=1)


def _pair_gradient(o: torch.Tensor) -> torch.Tensor:
    """An empty gradient for ``o``: dense, in ``o``'s dimension order (:func:`_output_like`) — contiguous where ``o``'s
    last stride is not 1, since the kernels write rows with the last stride 1."""
    return _output_like(o) if o.stride(-1) == 1 else torch.empty_like(o, memory_format=torch.contiguous_format)


def _subtract_pair_impl(
    o: torch.Tensor, lam: torch.Tensor, interleaved: bool, norm_eps: float | None = None, norm_scale: float = 1.0
) -> torch.Tensor:
    return _subtract_impl(*_pair(o, interleaved), lam, norm_eps, norm_scale)


def _subtract_pair_bwd_impl(
    g: torch.Tensor,
    o: torch.Tensor,
    lam: torch.Tensor,
    interleaved: bool,
    norm_eps: float | None = None,
    norm_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    # the whole output's gradient in o's layout (what the guard of diffattn.ops.sdpa wants for SDPA's backward), both
    # halves written by the one kernel: dy (g, without the norm) into dO1, −λ·dy into dO2
    do = _pair_gradient(o)
    do1, do2 = _pair(do, interleaved)
    o1, o2 = _pair(o, interleaved)
    return do, _subtract_bwd_launch(g, o1, o2, lam, do2, do1, norm_eps, norm_scale)


def _dense_like(x: torch.Tensor, width: int) -> torch.Tensor:
    """An empty tensor of ``x``'s shape with the last dimension ``width``, dense in ``x``'s dimension order (as
    :func:`_output_like` lays out ``x``'s own width)."""
    order = sorted(range(x.dim()), key=lambda i: (-x.stride(i), -i))  # outermost first; the last dimension last
    dense = x.new_empty([width if i == x.dim() - 1 else x.shape[i] for i in order])
    return dense.permute(*[order.index(i) for i in range(x.dim())])


def _parts_args(oa: torch.Tensor, ob: torch.Tensor, interleaved: bool):
    """(O1, O1B), (O2, O2B) of two calls' outputs [B, 2H, T, d] (each map's heads of V's two slices), and d."""
    (o1a, o2a), (o1b, o2b) = _pair(oa, interleaved), _pair(ob, interleaved)
    return (o1a, o1b), (o2a, o2b), oa.shape[-1]


def _subtract_parts_impl(
    oa: torch.Tensor,
    ob: torch.Tensor,
    lam: torch.Tensor,
    interleaved: bool,
    norm_eps: float | None = None,
    norm_scale: float = 1.0,
) -> torch.Tensor:
    (o1a, o1b), (o2a, o2b), d = _parts_args(oa, ob, interleaved)
    return _subtract_fwd_launch(o1a, o2a, lam, _dense_like(o1a, 2 * d), norm_eps, norm_scale, parts=(o1b, o2b))


def _subtract_parts_bwd_impl(
    g: torch.Tensor,
    oa: torch.Tensor,
    ob: torch.Tensor,
    lam: torch.Tensor,
    interleaved: bool,
    norm_eps: float | None = None,
    norm_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The two calls' output gradients, written by the one kernel (dO1's and dO2's columns of each slice), and dλ's
    per-row float32 shares. The gradients are the column halves of one buffer laid out as the two outputs joined
    (:func:`diffattn.ops.sdpa._joined`, in the outputs' dimension order): what the same two SDPA calls get from the
    route without the epilogue (`sdpa_split`, which guards the joined output) — PyTorch's cuDNN attention caches its
    backward under Q, K and V alone with the first gradient's strides, so two routes making the same calls must hand
    them gradients in one layout (found on the H200 of 2026-11-29: each half in its own output's layout, row stride d
    where `sdpa_split`'s is 2d, and `sdpa_split+epilogue` after `sdpa_split` in one process got dQ, dK, dV about 1.2
    off in relative error)."""
    (o1a, o1b), (o2a, o2b), d = _parts_args(oa, ob, interleaved)
    doa, dob = _dense_like(oa, 2 * d).split(d, dim=-1)
    (do1a, do1b), (do2a, do2b), _ = _parts_args(doa, dob, interleaved)
    parts = (o1b, o2b, do1b, do2b)
    return doa, dob, _subtract_bwd_launch(g, o1a, o2a, lam, do2a, do1a, norm_eps, norm_scale, parts=parts)


def parts_fit(oa: torch.Tensor, ob: torch.Tensor) -> bool:
    """Whether two calls' outputs can be read by the kernels as one joined along the columns
    (:func:`subtract_pair_parts`): the same shape, dtype, device and strides, the last stride 1 — as two calls of one
    kind give them."""
    return (
        oa.shape == ob.shape
        and oa.dtype == ob.dtype
        and oa.device == ob.device
        and oa.stride() == ob.stride()
        and oa.stride(-1) == 1
    )


def _parts_setup_context(ctx, inputs, output):
    oa, ob, lam, interleaved, norm_eps, norm_scale = inputs
    ctx.save_for_backward(oa, ob, lam)
    ctx.interleaved, ctx.norm = interleaved, (norm_eps, norm_scale)


def _parts_backward(ctx, g, bwd):
    oa, ob, lam = ctx.saved_tensors
    doa, dob, dlam_rows = bwd(g, oa, ob, lam, ctx.interleaved, *ctx.norm)
    return doa, dob, _lambda_grad(dlam_rows, lam), None, None, None


#: :func:`subtract_pair_parts` for eager training (no custom op of its own: under torch.compile the parts are joined
#: and handed to :func:`subtract_pair`'s)
_SubtractParts = eager_twin(
    "_SubtractParts", _subtract_parts_impl, _parts_setup_context, _parts_backward, _subtract_parts_bwd_impl
)


_subtract_op = torch.library.custom_op("diffattn::subtract_maps", mutates_args=())(_subtract_impl)
_subtract_bwd_op = torch.library.custom_op("diffattn::subtract_maps_bwd", mutates_args=())(_subtract_bwd_impl)
_subtract_pair_op = torch.library.custom_op("diffattn::subtract_pair", mutates_args=())(_subtract_pair_impl)
_subtract_pair_bwd_op = torch.library.custom_op("diffattn::subtract_pair_bwd", mutates_args=())(_subtract_pair_bwd_impl)


@_subtract_op.register_fake
def _subtract_fake(o1, o2, lam, norm_eps=None, norm_scale=1.0):
    return _output_like(_last_contiguous(o1))


@_subtract_bwd_op.register_fake
def _subtract_bwd_fake(g, o1, o2, lam, norm_eps=None, norm_scale=1.0):
    do1 = g.new_empty(0) if norm_eps is None else _output_like(_last_contiguous(o1))
    return do1, _output_like(_last_contiguous(o2)), o2.new_empty(o2.shape[:3], dtype=torch.float32)


@_subtract_pair_op.register_fake
def _subtract_pair_fake(o, lam, interleaved, norm_eps=None, norm_scale=1.0):
    return _subtract_fake(*_pair(o, interleaved), lam)


@_subtract_pair_bwd_op.register_fake
def _subtract_pair_bwd_fake(g, o, lam, interleaved, norm_eps=None, norm_scale=1.0):
    b, h2, t, _ = o.shape
    return _pair_gradient(o), o.new_empty((b, h2 // 2, t), dtype=torch.float32)


def _lambda_grad(dlam_rows: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """dλ from the per-row float32 shares: summed over what λ was broadcast along, in λ's own shape and dtype."""
    return dlam_rows.unsqueeze(-1).sum_to_size(_lam4(lam).shape).reshape(lam.shape).to(lam.dtype)


def _setup_context(ctx, inputs, output):
    o1, o2, lam, norm_eps, norm_scale = inputs
    # O1 is read back only by the norm's backward; saved either way (an SDPA call's output, which that call's own
    # backward keeps alive anyway)
    ctx.save_for_backward(o1, o2, lam)
    ctx.o1_dtype = o1.dtype
    ctx.norm = (norm_eps, norm_scale)


def _backward(ctx, g, bwd=None):
    # ``bwd``: the backward's implementation (default the custom op, what torch.compile sees; eager training calls
    # it directly)
    o1, o2, lam = ctx.saved_tensors
    do1, do2, dlam_rows = (bwd or _subtract_bwd_op)(g, o1, o2, lam, *ctx.norm)
    return g.to(ctx.o1_dtype) if ctx.norm[0] is None else do1, do2, _lambda_grad(dlam_rows, lam), None, None


torch.library.register_autograd("diffattn::subtract_maps", _backward, setup_context=_setup_context)


def _pair_setup_context(ctx, inputs, output):
    o, lam, interleaved, norm_eps, norm_scale = inputs
    ctx.save_for_backward(o, lam)
    ctx.interleaved = interleaved
    ctx.norm = (norm_eps, norm_scale)


def _pair_backward(ctx, g, bwd=None):
    o, lam = ctx.saved_tensors
    do, dlam_rows = (bwd or _subtract_pair_bwd_op)(g, o, lam, ctx.interleaved, *ctx.norm)
    return do, _lambda_grad(dlam_rows, lam), None, None, None


torch.library.register_autograd("diffattn::subtract_pair", _pair_backward, setup_context=_pair_setup_context)


_SubtractMaps = eager_twin("_SubtractMaps", _subtract_impl, _setup_context, _backward, _subtract_bwd_impl)
_SubtractPair = eager_twin(
    "_SubtractPair", _subtract_pair_impl, _pair_setup_context, _pair_backward, _subtract_pair_bwd_impl
)


def _norm_eps_scale(norm: tuple[float, float] | None) -> tuple[float | None, float]:
    """``norm`` as the custom ops' (norm_eps, norm_scale) arguments: (None, 1.0) for no norm."""
    if norm is None:
        return None, 1.0
    eps, scale = norm
    return float(eps), float(scale)


def subtract_pair(
    o: torch.Tensor, lam: torch.Tensor, layout: str, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """:func:`subtract_maps` of the two halves of one call's output ``o`` [B, 2H, T, dv], its query heads ``stacked``
    (DIFF V1's one call: map 1's H heads, then map 2's) or ``interleaved`` (DIFF V2's: map 1 and map 2 of each head).
    The same forward; the backward writes the gradient of ``o`` whole in its one kernel, dense in ``o``'s dimension
    order (``o``'s own strides for an SDPA call's output) — where cutting ``o`` into O1 and O2 for
    :func:`subtract_maps` has autograd join dO1 (the output's gradient) and dO2 by one more pass, a cat that reads both
    and writes them again (by bytes ≈ 0.02× the baseline for DIFF V1 at 16K tokens on an H200,
    benchmarks/RESULTS.md; a prediction until a GPU times it). ``norm`` as :func:`subtract_maps`'s."""
    if layout not in ("stacked", "interleaved"):
        raise ValueError(f"layout must be 'stacked' or 'interleaved', got {layout!r}")
    if o.dim() != 4 or o.shape[1] % 2:
        raise ValueError(f"o must be [B, 2H, T, dv] (an even head count), got shape {tuple(o.shape)}")
    run = choose(_subtract_pair_op, _SubtractPair, _subtract_pair_impl, wants_grad(o, lam))
    return run(o, lam, layout == "interleaved", *_norm_eps_scale(norm))


def subtract_pair_parts(
    parts: tuple[torch.Tensor, torch.Tensor], lam: torch.Tensor, layout: str, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """:func:`subtract_pair` of two calls' outputs joined along the columns, ``[oa | ob]`` — each [B, 2H, T, d], one per
    slice of V (the ``sdpa_split`` route at dv = 2d) — read where they are, without the join (a copy of both outputs
    forward), and their gradients written as the column halves of one buffer laid out as the join, the strides the
    same calls get from ``sdpa_split`` (:func:`_subtract_parts_bwd_impl`). The two must have one layout
    (:func:`parts_fit`); under torch.compile they are joined and handed to
    :func:`subtract_pair` (the compiler sees its custom op). ``norm`` as :func:`subtract_maps`'s."""
    oa, ob = parts
    if layout not in ("stacked", "interleaved"):
        raise ValueError(f"layout must be 'stacked' or 'interleaved', got {layout!r}")
    if oa.dim() != 4 or oa.shape[1] % 2 or not parts_fit(oa, ob):
        shapes = f"{tuple(oa.shape)} {tuple(oa.stride())}, {tuple(ob.shape)} {tuple(ob.stride())}"
        raise ValueError(f"parts must be two [B, 2H, T, d] tensors of one layout, got {shapes}")
    if torch.compiler.is_compiling():
        return subtract_pair(torch.cat([oa, ob], dim=-1), lam, layout, norm)
    run = choose(None, _SubtractParts, _subtract_parts_impl, wants_grad(oa, ob, lam))
    return run(oa, ob, lam, layout == "interleaved", *_norm_eps_scale(norm))


def subtract_maps(
    o1: torch.Tensor, o2: torch.Tensor, lam: torch.Tensor, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """``O1 − λ·O2`` in float32, in ``o1``'s dtype, by one kernel (module docstring); differentiable in all three.
    ``o1``, ``o2`` [B, H, T, dv] of one dtype, ``lam`` as :func:`diffattn.ops._inputs.validate` shapes it.
    ``norm`` = (eps, scale): the head's norm in the same kernel, ``scale · y / sqrt(mean(y²) + eps)`` over each row
    of dv values of y = O1 − λ·O2 (DIFF Eq. 3 without a gain: :class:`diffattn.ops.HeadNorm`), one rounding at the end.
    Under torch.compile the custom op (opaque to the tracer, with its fake implementation); in eager training an
    autograd Function (a third of the custom op's host time); without a gradient the kernel alone. Differentiable once:
    a second derivative (``create_graph=True``) raises, as through the ``triton`` backend and ``chunked``."""
    run = choose(_subtract_op, _SubtractMaps, _subtract_impl, wants_grad(o1, o2, lam))
    return run(o1, o2, lam, *_norm_eps_scale(norm))
