"""Every tile the fused Triton kernels can run with on a GPU, run with that very tile (not the interpreter's 16 × 16)
at boundary shapes, against the float64 reference: forward output and every gradient (dq1, dk1, dq2, dk2, dv, dλ).

What is covered (read off :mod:`diffattn.ops.triton.tuning`, so a tile added there is tested here): for each head-width
class ("v2": d = dv = 64 with K shared, as DIFF V2; "v1": d = 64, dv = 128; "wide": d = 128, dv = 256) and each
mask class (none, key padding, a per-row 4-D mask — bool on one shape, additive on the other — and segment ids):

* the default tiles of :data:`~diffattn.ops.triton.tuning._TILES` / ``_MASK_TILES`` that a GPU picks: the training
  forward at >= 128 packed rows, at 33–127 (``fwd_mid``) and at <= 32 (``fwd_short``, clamped to the row count as
  a GPU clamps it); the backward's single-pass kernel (where it has tiles for the class) and the deterministic dK/dV
  + dQ kernels, both run on the same forward; for the classes with tiles for it, the two-kernel backward with its
  dK/dV kernel split into a dV and a dK launch (``split``, :data:`~diffattn.ops.triton.tuning.SPLIT_DKDV`), and the
  training forward by blocks of V's columns (``cols``, :data:`~diffattn.ops.triton.tuning.FWD_COLUMNS`); for the
  classes with tiles for them and no mask, the forward and the two-kernel backward by TMA tiles, the latter's dK/dV
  kernel plain or warp-specialised (``tma``, ``btma``, ``bws``: :data:`~diffattn.ops.triton.tuning.FWD_TMA` and the
  others; the backward's on one query head per KV head, the only heads it takes);
* every alternative of :data:`~diffattn.ops.triton.tuning._TUNING` (training forward, both backwards), forced
  alone, the other kernels on their default tiles.

Shapes: GQA (2 query heads per KV head; 16 or 4 where one key block must still pack more rows than a tile), causal
with T < S (bottom-right), T and S not multiples of any tile (T = 67 or 131, S = tile + 9, ...: at least two
tiles, the last partial), and a second shape with a single, partial key block. Under the interpreter, tiles are
what matter (``num_warps`` and ``num_stages`` do not exist there), so candidates that share a tile share a test,
whose id names the tile and every (warps, stages) with it; with CUDA each configuration runs compiled.

Out-of-bounds access: every tensor a kernel launch receives — inputs, outputs and the launch path's own buffers
(log-sum-exps, Δ, the float32 dQ accumulators) — is copied, with its strides, into a larger buffer poisoned around
it (NaN; int ids 2³⁰; bool masks 0xA5) before the launch and copied back after, and under the interpreter every
load, store and atomic the kernel issues is checked against those tensors' addresses (:class:`_Bounds`): an access
outside all of them fails the launch, naming the kernel and the nearest argument. (The poison alone would miss a
write of what is already there, e.g. an atomic add of 0 past the last row; with CUDA it is what remains: a changed
guard fails the launch, a read of one brings NaN into the results.) Shown to work by dropping the dQ atomic's row
mask, and the forward's key mask on boundary tiles, in a copy of the kernels: every case that runs them failed.

Tolerance: :func:`tests.ops.rounding.assert_within_rounding`, as in tests/ops/test_triton.py: twice plain PyTorch's
own error in the same dtype on this machine (six yardsticks: three summation orders, autograd's and
FlashAttention's backward formula) plus one ulp of the largest value. No absolute constant. Under the interpreter
every ``tl.dot`` is numpy's matmul, whose BLAS may sum in another order than PyTorch's (on this machine its error at
256 terms, the widest heads' dO·Vᵀ, is ~1.7x PyTorch's, and its error depends on the product's shape: a 32 x 64
tile rounds up to ~4x worse than the bare 11 x 13 product of a one-block shape): two more yardsticks do the same math
with numpy's arithmetic, on bare and on tile-sized (zero-padded) products (:func:`_interpreter_yardstick`), and one
more rounds P as the kernels that ran do — each backward kernel recomputing P from scores formed on its own tiles
against the log-sum-exps the forward formed on its tiles (:func:`_tiled_yardstick`; without it, the dK/dV kernel's
128-key tile put dV 1.6x past the rule on one boundary case, by exactly this mechanism), and one more against the
log-sum-exps the kernels' forward itself returned, once those are held to float64 by the same rule: P = exp2(s − lse)
carries the lse's rounding into every term of dV's sum (on an AMD EPYC one case's dV was 2.6x past every other
yardstick from an lse 2 ulps off; with the kernel's lse, numpy gives the kernel's dV bit for bit).
"""

from __future__ import annotations

import dataclasses
import inspect
import zlib
from typing import ClassVar

import numpy as np
import pytest
import torch

from diffattn.ops import diff_attention
from diffattn.ops._inputs import validate
from diffattn.ops.routes import TRITON_VARIANTS

from .interpreter import import_kernels, keep_interpreting
from .rounding import assert_within_rounding
from .test_triton import plain_pytorch  # the yardstick (importing it sets TRITON_INTERPRET around the kernels)

_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if _CUDA else "cpu"
DTYPE = torch.bfloat16 if _CUDA else torch.float32  # the interpreter: float32 (numpy BLAS); the tiles are the GPU's

launch = import_kernels()  # interpreted without CUDA (tests/ops/interpreter.py)
from diffattn.ops.triton import tuning  # noqa: E402
from diffattn.ops.triton.eager import eager_twin  # noqa: E402

WIDTHS = {  # head-width class -> (d, dv, K shared by both maps)
    "v2": (64, 64, True),
    "v1": (64, 128, False),
    "wide": (128, 256, False),
}
MASKS = ("none", "keys", "rows", "segments")
FWD_REGIMES = ("fwd", "fwd_mid", "fwd_short")  # the training forward at >= 128, 33–127 and <= 32 packed rows
# case kind -> launch kind of the forward by TMA tiles (FWD_TMA), and the launch kinds of the two-kernel backward by
# TMA tiles (BWD_TMA, BWD_WS): the table of the variants (routes.TRITON_VARIANTS, with their flags)
TMA_KINDS = {"tma": TRITON_VARIANTS["tma"][1][0]}
BWD_TMA_KINDS = {name: TRITON_VARIANTS[name][1] for name in ("btma", "bws")}


@dataclasses.dataclass(frozen=True)
class Case:
    """One tile of one kernel (``kind``) for a width and mask class; ``configs``: the (num_warps, num_stages) it is
    compiled with on a GPU; ``default``: the GPU's default tile (then the backward cases run both backwards)."""

    # "fwd", "fwd_mid", "fwd_short" (the forward by row regime), "bwd" (defaults), "split" (defaults of the split
    # backward), "cols" (defaults of the forward by column blocks), "tma" (of the forward by TMA tiles), "btma",
    # "bws" (of the two-kernel backward so, its dK/dV kernel plain or warp-specialised), "dkdv_atomic", "dkdv", "dq",
    # "dv", "dk", "fwd_cols"
    kind: str
    width: str
    mask: str
    tile: tuple[int, int] | None  # None: whatever tuning._blocks gives on a GPU (the default cases)
    configs: tuple[tuple[int, int], ...] = ((8, 2),)
    default: bool = True

    @property
    def id(self) -> str:
        tile = "default" if self.tile is None else f"{self.tile[0]}x{self.tile[1]}"
        configs = ",".join(f"w{w}s{s}" for w, s in self.configs)
        return f"{self.kind}-{self.width}-{self.mask}-{tile}" + ("" if self.default else f"-{configs}")


def _table_tile(kind: str, width: str, mask: str) -> tuple[int, int] | None:
    """The default tile of _TILES / _MASK_TILES, as tuning._blocks reads them (None: no such kernel)."""
    table = tuning._MASK_TILES.get(mask, {}).get(kind, {}).get(width) or tuning._TILES.get(kind, {}).get(width)
    return tuple(table) if table else None


def _cases() -> list[Case]:
    cases = []
    for mask in MASKS:
        for width in WIDTHS:
            cases += [Case(regime, width, mask, None) for regime in FWD_REGIMES]
            cases.append(Case("bwd", width, mask, None))
            if _table_tile("dk", width, mask):
                cases.append(Case("split", width, mask, None))
            if _table_tile("fwd_cols", width, mask):
                cases.append(Case("cols", width, mask, None))
            for variant, kind in TMA_KINDS.items():  # the forward by TMA tiles (no mask)
                if mask == "none" and _table_tile(kind, width, mask):
                    cases.append(Case(variant, width, mask, None))
            for variant, kinds in BWD_TMA_KINDS.items():  # and the two-kernel backward so
                if mask == "none" and all(_table_tile(kind, width, mask) for kind in kinds):
                    cases.append(Case(variant, width, mask, None))
            for kind in ("fwd", "dkdv_atomic", "dkdv", "dq", "dv", "dk", "fwd_cols"):
                by_tile: dict[tuple[int, int], list[tuple[int, int]]] = {}
                for bm, bn, warps, stages in tuning._TUNING[mask].get(kind, {}).get(width, []):
                    by_tile.setdefault((bm, bn), []).append((warps, stages))
                for tile, configs in by_tile.items():
                    cases.append(Case(kind, width, mask, tile, tuple(configs), default=False))
    return cases


CASES = _cases()


# ------------------------------------------------------------------------------------------------------------
# shapes: (B, H, HKV, T, S) per case and shape name
# ------------------------------------------------------------------------------------------------------------


def _shape(case: Case, which: str) -> tuple[int, int, int, int, int]:
    """``which`` "tiles": at least two tiles of the case's kernel along rows and keys, the last of each partial, T < S;
    "one-block": a single, partial key block (S < every BLOCK_N), the rows still in the case's regime."""
    if case.kind in BWD_TMA_KINDS:  # one query head per KV head (the only heads it takes): 2 or 1 blocks each way
        return (1, 2, 2, 131, 137) if which == "tiles" else (2, 2, 2, 11, 13)
    if which == "one-block":
        if case.kind in ("fwd", "fwd_mid", "fwd_short"):  # 16, 4 or 2 query heads per KV head: 160, 40, 20 rows
            heads = {"fwd": 16, "fwd_mid": 4, "fwd_short": 2}[case.kind]
            return 2, heads, 1, 10, 13
        return 2, 2, 1, 11, 13
    if case.kind in TMA_KINDS:  # one head's rows a program: two 128-row (three 64-row) tiles, the last partial
        return 1, 2, 1, 131, 137
    if case.kind in ("fwd", "fwd_cols"):
        return 1, 2, 1, 67, 75  # 134 rows: 128- and 64-row tiles, the last partial; 75 keys: 16/32/64-key tiles
    if case.kind == "fwd_mid":
        return 1, 2, 1, 35, 75  # 70 rows
    if case.kind == "fwd_short":
        return 1, 2, 1, 13, 75  # 26 rows (a 32-row tile), several key tiles
    if case.kind in ("dkdv_atomic", "dkdv", "dv", "dk"):
        return 1, 2, 1, 67, case.tile[1] + 9  # 16/32-query steps, two key blocks, the last partial
    if case.kind == "dq":
        return 1, 2, 1, case.tile[0] + 9, case.tile[0] + 17  # two row tiles, the last partial; T < S (causal)
    return 1, 2, 1, 131, 137  # the defaults: dQ's 128-row tiles and dK/dV's 128-key blocks, two of each


# ------------------------------------------------------------------------------------------------------------
# launches with forced tiles, every tensor argument inside a poisoned buffer
# ------------------------------------------------------------------------------------------------------------

_GUARD = 64  # poisoned elements before and after each tensor's span (a multiple of 16: alignments are kept)


def _poison(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    return 0xA5 if dtype == torch.uint8 else 2**30


class _Relocated:
    """``x`` copied into a buffer with ``_GUARD`` poisoned elements on either side of its span and its own strides
    (elements of the span outside ``x``, e.g. a mask's padded row ends, stay poisoned too)."""

    def __init__(self, x: torch.Tensor):
        self.x = x
        span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True))
        self.buf = torch.full((span + 2 * _GUARD,), _poison(x.dtype), dtype=x.dtype, device=x.device)
        self.view = self.buf.as_strided(x.shape, x.stride(), _GUARD)
        self.view.copy_(x)
        self.outside = torch.ones(self.buf.shape, dtype=torch.bool, device=x.device)
        self.outside.as_strided(x.shape, x.stride(), _GUARD).fill_(False)
        start = self.view.data_ptr()
        self.bytes = (start, start + span * x.element_size())  # the addresses the kernel may touch

    def poison_intact(self) -> bool:
        rest = self.buf[self.outside]
        if rest.dtype.is_floating_point:
            return bool(torch.isnan(rest).all())
        return bool((rest == _poison(rest.dtype)).all())


class _Bounds:
    """Under the interpreter, every load, store and atomic a kernel issues (its masked-in lanes) is checked against
    the byte ranges of the launch's tensor arguments: an access outside all of them raises, naming the nearest
    argument and the distance. (Poison alone would miss a write of the value already there, e.g. an atomic add of
    0 past the last row.) Active only during a launch of :func:`_forced_launch`."""

    ranges: ClassVar[list[tuple[int, int, str]]] = []  # (first byte, end byte, argument) of the launch running
    kernel: ClassVar[str] = ""

    @classmethod
    def check(cls, what: str, ptrs, mask, dtype_bytes: int) -> None:
        if not cls.ranges:
            return
        addr = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        if mask is not None:
            addr = addr[np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape).ravel()]
        inside = np.zeros(addr.shape, dtype=bool)
        for start, end, _ in cls.ranges:
            inside |= (addr >= start) & (addr + dtype_bytes <= end)
        if not inside.all():
            bad = int(addr[~inside][0])
            start, end, name = min(cls.ranges, key=lambda r: min(abs(bad - r[0]), abs(bad - r[1])))
            where = (
                f"{(bad - end) // dtype_bytes} elements past the end"
                if bad >= end
                else f"{(start - bad) // dtype_bytes} elements before"
            )
            raise AssertionError(
                f"{cls.kernel}: {what} by {int((~inside).sum())} lanes outside every argument, e.g. {where} of {name}"
            )


def _install_bounds_check(monkeypatch) -> None:
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder

    def size(ptrs) -> int:
        return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize

    def wrap(name, what, ptr_arg, mask_arg):
        original = getattr(builder, name)

        def checked(self, *args, **kwargs):  # keywords: e.g. a tensor descriptor's load passes its cache policy
            ptrs = args[ptr_arg]
            _Bounds.check(what, ptrs, None if mask_arg is None else args[mask_arg], size(ptrs))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(builder, name, checked)

    wrap("create_load", "load", 0, None)
    wrap("create_store", "store", 0, None)
    wrap("create_masked_load", "load", 0, 1)
    wrap("create_masked_store", "store", 0, 2)
    wrap("create_atomic_rmw", "atomic", 1, 3)


def _forced_launch(case: Case, config: tuple[int, int], ran: list):
    """A stand-in for launch._launch: the case's tile and configuration for its kernel, the GPU's default tiles
    (tuning._blocks, 2 stages) for the others; every tensor argument relocated into a poisoned buffer."""
    forced_kind = {"fwd_mid": "fwd", "fwd_short": "fwd"}.get(case.kind, case.kind)

    def run(kernel, grid_of, args, consts, kind, d, dv, rows, key, variants=0):
        mask = tuning._mask_class(consts)
        bm, bn, warps = tuning._blocks(kind, d, dv, rows, False, mask, consts.get("SPLIT", False), variants)
        stages = 2
        if kind == "fwd":  # the row regime the GPU would be in: the case's shapes are made for it
            regime = "fwd" if rows >= 128 else "fwd_mid" if rows > 32 else "fwd_short"
            assert case.kind not in FWD_REGIMES or regime == case.kind, (case.id, rows)
        if case.tile is not None and kind == forced_kind:
            (bm, bn), (warps, stages) = case.tile, config
        ran.append((kind, bm, bn))
        options = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        _checked_call(kernel, grid_of(bm, bn), args, {**consts, **options}, f"({bm}x{bn})")

    return run


def _checked_call(kernel, grid, args, kwargs, label: str) -> None:
    """``kernel[grid](*args, **kwargs)`` with every tensor argument relocated into a poisoned buffer, every access
    checked against them (:class:`_Bounds`, under the interpreter), the poison checked after and outputs copied
    back."""
    fn = getattr(kernel, "fn", kernel)  # a JITFunction, or the interpreter's wrapper of one
    names = list(inspect.signature(fn).parameters)
    moved: dict[int, _Relocated] = {}  # by id: an argument passed twice (shared K, Q) stays one tensor
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel() and id(a) not in moved:
            moved[id(a)] = _Relocated(a)
    new_args = [moved[id(a)].view if id(a) in moved else a for a in args]
    _Bounds.kernel = f"{fn.__name__} {label}"
    _Bounds.ranges = [(*moved[id(a)].bytes, names[i]) for i, a in enumerate(args) if id(a) in moved]
    try:
        kernel[grid](*new_args, **kwargs)
    finally:
        _Bounds.ranges = []
    for i, a in enumerate(args):
        if id(a) in moved:
            r = moved.pop(id(a))
            assert r.poison_intact(), f"{fn.__name__} {label} wrote outside argument {names[i]}"
            if not torch.equal(r.view, a):  # an output (an input copied back would bump autograd's version)
                a.copy_(r.view)


# ------------------------------------------------------------------------------------------------------------
# inputs, reference, yardstick
# ------------------------------------------------------------------------------------------------------------


def _inputs(case: Case, shape, which: str, seed: int):
    b, h, hkv, t, s = shape
    d, dv, shared_k = WIDTHS[case.width]
    g = torch.Generator().manual_seed(seed)
    q1, q2 = (torch.randn(b, h, t, d, generator=g) for _ in range(2))
    k1, k2 = (torch.randn(b, hkv, s, d, generator=g) for _ in range(2))
    v = torch.randn(b, hkv, s, dv, generator=g)
    lam = torch.rand(b, h, t, generator=g)  # λ per head and token: dλ is checked per row
    mask = segments = None
    if case.mask == "keys":
        mask = torch.ones(b, s, dtype=torch.bool)
        mask[0, :5] = False  # left padding: under causality with T < S the first queries see no key at all
    elif case.mask == "rows":
        keep = torch.rand(b, 1, t, s, generator=g) > 0.25
        keep[:, :, 0] = False  # a row that sees nothing
        if which == "tiles":
            mask = keep
        else:  # additive, in the inputs' dtype, with the masking floor
            mask = torch.randn(b, 1, t, s, generator=g).masked_fill(~keep, torch.finfo(DTYPE).min)
    elif case.mask == "segments":
        cuts = torch.sort(torch.randint(1, s, (b, 3), generator=g)).values
        segments = (torch.arange(s)[None, :, None] >= cuts[:, None, :]).sum(-1).to(torch.int32)
    cot = torch.randn(b, h, t, dv, generator=g)
    tensors = [x.to(DEVICE) for x in (q1, k1, q2, k2, v, lam, cot)]
    mask = None if mask is None else mask.to(DEVICE)
    segments = None if segments is None else segments.to(DEVICE)
    return tensors, mask, segments, shared_k


def _segment_keep(segments: torch.Tensor, t: int) -> torch.Tensor:
    """The [B, 1, T, S] bool mask of segment ids (query t is key t + S − T): the yardstick takes masks only."""
    s = segments.shape[1]
    return (segments[:, None, s - t :, None] == segments[:, None, None, :]).to(segments.device)


def _numpy_matmul(a: torch.Tensor, b: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """``a @ b`` by numpy's matmul; ``pad``: with the rows of ``a`` and the columns of ``b`` zero-padded to a multiple
    of ``pad`` first (the result is the same, up to the order numpy's BLAS sums in, which depends on the shape)."""
    m, n = a.shape[-2], b.shape[-1]
    if pad:
        a = torch.nn.functional.pad(a, (0, 0, 0, -m % pad))
        b = torch.nn.functional.pad(b, (0, -n % pad))
    return torch.from_numpy(np.matmul(a.detach().numpy(), b.detach().numpy()))[..., :m, :n]


_LOG2E = 1.4426950408889634  # the kernels' scores are in log2 units (scale · log2 e)


def _interpreter_yardstick(q1, k1, q2, k2, v, lam, keep, bias, scale, cot, pad) -> list[torch.Tensor]:
    """Plain attention math in the inputs' dtype with numpy's arithmetic, the interpreter's: every matrix product
    through numpy's matmul (``tl.dot``), the row sums Δ_i = rowsum(dO ∘ O_i) through numpy's sum (``tl.reduce``),
    in the kernels' backward formulas (FlashAttention's dS = P ∘ (dP − Δ), G = dO·Vᵀ once for both maps, λ applied
    after the difference). Where a row sees one key, G − Δ is 0 up to the two summation orders of the same dv
    products, so dQ there is rounding alone, and the orders are numpy's (at 256 terms its matmul errs ~1.7x
    PyTorch's on this machine). ``pad``: every product on operands
    zero-padded to multiples of that many rows and columns, as a kernel's tiles pad a short block: numpy's matmul
    rounds small products (e.g. 16 x 16, or the 11 x 13 of a one-block shape) up to ~4x more accurately than those
    of 32 x 64 and more, so a kernel on 64-key tiles rounds as the padded products do, not as the bare ones.
    [out, dq1, dk1, dq2, dk2, dv, dλ]; dk, dv summed over each KV head's query heads."""
    rep = q1.shape[1] // k1.shape[1]
    k1r, k2r, vr = (x.repeat_interleave(rep, dim=1) for x in (k1, k2, v))
    lam_ = lam[..., None].to(q1.dtype)

    def attend(q, k):
        s_ = _numpy_matmul(q, k.transpose(-1, -2), pad) * scale
        if bias is not None:
            s_ = s_ + bias
        s_ = s_.masked_fill(~keep, float("-inf"))
        empty = torch.isneginf(s_).all(-1, keepdim=True)
        p = torch.softmax(s_.masked_fill(empty, 0.0), -1).masked_fill(empty | ~keep, 0.0)
        return p, _numpy_matmul(p, vr, pad)

    (p1, o1), (p2, o2) = attend(q1, k1r), attend(q2, k2r)
    out = o1 - lam_ * o2
    # the kernels' formulas: G = dO·Vᵀ serves both maps (dP1 = G, dP2 = −λG), dV = (P1 − λP2)ᵀ dO
    g = _numpy_matmul(cot, vr.transpose(-1, -2), pad)
    grads = []
    for p, o, sign, q, k in ((p1, o1, 1.0, q1, k1r), (p2, o2, -lam_, q2, k2r)):
        delta = torch.from_numpy(np.sum((cot * o).numpy(), axis=-1, keepdims=True))  # as the interpreter sums
        ds = p * (g - delta) * sign
        grads += [_numpy_matmul(ds, k, pad) * scale, _numpy_matmul(ds.transpose(-1, -2), q, pad) * scale]
    dv = _numpy_matmul((p1 - lam_ * p2).transpose(-1, -2), cot, pad)

    def per_kv_head(x):
        return x.unflatten(1, (k1.shape[1], rep)).sum(2)

    dlam = -(cot * o2).sum(-1)
    return [out, grads[0], per_kv_head(grads[1]), grads[2], per_kv_head(grads[3]), per_kv_head(dv), dlam]


def _yardstick_inputs(shape, tensors, mask, segments, shared_k):
    """A case's tensors in the inputs' dtype, validated, and what every yardstick attends by: ``keep`` (causality, a
    bool mask or an additive one's unmasked entries, segments; [B, H, T, S]) and ``bias`` (an additive mask, or
    None). Returns (q1, k1, q2, k2 — k1 where shared —, v, cot, validated inputs, keep, bias)."""
    b, h, _, t, s = shape
    q1, k1, q2, k2, v, lam, cot = (x.to(DTYPE) for x in tensors)
    k2 = k1 if shared_k else k2
    inp = validate(q1, k1, q2, k2, v, lam, causal=True, attn_mask=mask, scale=None)
    keep = torch.ones(t, s, dtype=torch.bool).tril(s - t).expand(b, h, t, s)
    bias = None
    if inp.attn_mask is not None and inp.attn_mask.dtype == torch.bool:
        keep = keep & inp.attn_mask
    elif inp.attn_mask is not None:
        keep = keep & (inp.attn_mask > torch.finfo(DTYPE).min / 2)
        bias = inp.attn_mask
    if segments is not None:
        keep = keep & _segment_keep(segments, t)
    return q1, k1, q2, k2, v, cot, inp, keep, bias


def _in_leaf_order(out, dq1, dk1, dq2, dk2, dv, dlam, shared_k) -> list[torch.Tensor]:
    """A yardstick's results in the order of the case's leaves (a shared K has one gradient, both maps' sum)."""
    if shared_k:
        return [out, dq1, dk1 + dk2, dq2, dv, dlam]
    return [out, dq1, dk1, dq2, dk2, dv, dlam]


def _numpy_yardstick(shape, tensors, mask, segments, shared_k, pad) -> list[torch.Tensor]:
    """:func:`_interpreter_yardstick` on this case's inputs and mask, its gradients in the order of the leaves."""
    b, h, _, t, _ = shape
    q1, k1, q2, k2, v, cot, inp, keep, bias = _yardstick_inputs(shape, tensors, mask, segments, shared_k)
    results = _interpreter_yardstick(
        q1, k1, q2, k2, v, inp.lam.expand(b, h, t, 1)[..., 0], keep, bias, inp.scale, cot, pad
    )
    return _in_leaf_order(*results, shared_k)


def _tile_products(x: torch.Tensor, y: torch.Tensor, x_rows: int, y_rows: int) -> torch.Tensor:
    """``x @ yᵀ`` per (batch, head) slice as a kernel's tiles form it under the interpreter: ``x`` zero-padded to a
    multiple of ``x_rows`` rows, ``y`` to ``y_rows``, one 2-D numpy matmul with ``yᵀ`` a transposed view, cropped.
    numpy rounds such a product by its shape and layout (a 128-row tile times a transposed 16-row one: up to 3x worse
    than at 32 rows, measured on 13 x 64 · 64 x 11 products)."""
    m, n = x.shape[-2], y.shape[-2]
    xp = torch.nn.functional.pad(x, (0, 0, 0, -m % x_rows)).detach().numpy()
    yp = torch.nn.functional.pad(y, (0, 0, 0, -n % y_rows)).detach().numpy()
    out = np.empty((*xp.shape[:-2], xp.shape[-2], yp.shape[-2]), dtype=xp.dtype)
    for i in np.ndindex(*xp.shape[:-2]):
        out[i] = np.matmul(xp[i], yp[i].T)
    return torch.from_numpy(out)[..., :m, :n]


def _tile_accumulated(x: torch.Tensor, y: torch.Tensor, x_rows: int, inner: int, group: int) -> torch.Tensor:
    """``x @ y`` [B, H, M, K] @ [B, H, K, N] summed over each ``group`` of consecutive heads, as a kernel accumulates it
    under the interpreter: one float32 accumulator per block of ``x_rows`` rows, a group's heads added in order, each
    head's product taken over the inner dimension's blocks of ``inner`` in order by numpy — both zero-padded to whole
    blocks, ``y``'s columns to a power of two (the kernel's BLOCK_DV). The dK/dV kernel forms dV so (a key block's
    signed map times dO, one query block at a time, the KV group's query heads one after another into one
    accumulator), and numpy rounds a product by its shape (:func:`_tile_products`). [B, H / group, M, N]."""
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    xp = torch.nn.functional.pad(x, (0, -k % inner, 0, -m % x_rows)).detach().numpy()
    yp = torch.nn.functional.pad(y, (0, (1 << (n - 1).bit_length()) - n, 0, -k % inner)).detach().numpy()
    b, h = xp.shape[:2]
    out = np.zeros((b, h // group, xp.shape[-2], yp.shape[-1]), dtype=xp.dtype)
    for i, j in np.ndindex(b, h):
        acc = out[i, j // group]
        for r in range(0, xp.shape[-2], x_rows):
            for c in range(0, xp.shape[-1], inner):
                a = np.ascontiguousarray(xp[i, j, r : r + x_rows, c : c + inner])
                acc[r : r + x_rows] += np.matmul(a, yp[i, j, c : c + inner])
    return torch.from_numpy(out)[..., :m, :n]


def _log2_scores(raw: torch.Tensor, inp, keep: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Products Q·Kᵀ as the kernels score them: in log2 units (scale · log2 e), an additive mask converted likewise,
    masked keys at −inf."""
    x = raw * (inp.scale * _LOG2E)
    if bias is not None:
        x = x + bias.float() * _LOG2E
    return x.masked_fill(~keep, float("-inf"))


def _log2_lse(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The log-sum-exps [..., T, 1] of log2 scores as the forward forms them (row max, then exp2 and a sum), +inf for
    a row that sees nothing."""
    m = scores.amax(-1, keepdim=True).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    total = torch.exp2(scores - m).sum(-1, keepdim=True)
    return torch.where(total > 0, m + torch.log2(total), torch.full_like(m, float("inf")))


def _tiled_yardstick(shape, tensors, mask, segments, shared_k, tiles: dict, lse=None) -> list[torch.Tensor]:
    """The kernels' own rounding of P, under the interpreter: the forward's log-sum-exps from scores formed on its
    tiles (``tiles["fwd"]``: query rows x keys), and each backward kernel recomputing P from scores formed on *its*
    tiles — the dK/dV kernel keys on rows (``tiles["dv"]``, ``tiles["dk"]``: queries x keys), dQ's queries on rows
    (``tiles["dq"]``) — against those log-sum-exps, in log2 units as the kernels compute. Two roundings of the same
    scores make P_bwd = exp2(s_bwd − lse_fwd) off by their difference, which dV sums over the rows: with the dK/dV
    kernel's 128-key tile, dV erred 5x more than every bare yardstick on a boundary case (segments in one key block)
    and exactly as much as this one. Products and row sums by numpy; [out, dq1, dk1, dq2, (dk2,) dv, dλ].

    ``lse``: the two maps' log-sum-exps (log2 units, [B, H, T]) to recompute P against instead of this function's own
    — the ones the kernels' forward formed, which :func:`_check` holds to float64 first. P = exp2(s − lse) loses what
    lse is off by, relative to P: one ulp of an lse near 8 is 0.33 ulp of P in every term of dV's sum (an AMD EPYC
    put dV 2.6x past every other yardstick on a one-block case by an lse 2 ulps off, correctly rounded within the
    rule; the same arithmetic with the kernel's lse gives the kernel's dV bit for bit)."""
    b, h, hkv, t, _ = shape
    q1, k1, q2, k2, v, cot, inp, keep, bias = _yardstick_inputs(shape, tensors, mask, segments, shared_k)
    rep = h // hkv

    def log2_scores(raw):
        return _log2_scores(raw, inp, keep, bias)

    def probs(scores, lse):
        return torch.exp2(scores - lse).masked_fill(~keep, 0.0)

    lam_ = inp.lam.expand(b, h, t, 1).to(DTYPE)
    vr = v.repeat_interleave(rep, dim=1)
    g = torch.from_numpy(np.matmul(cot.numpy(), vr.transpose(-1, -2).numpy()))  # G = dO·Vᵀ
    maps = []
    for q, k in ((q1, k1), (q2, k2)):
        kr = k.repeat_interleave(rep, dim=1)
        fwd = log2_scores(_tile_products(q, kr, *tiles["fwd"]))
        map_lse = _log2_lse(fwd, keep) if lse is None else lse[len(maps)].unsqueeze(-1)
        o = torch.from_numpy(np.matmul(probs(fwd, map_lse).numpy(), vr.numpy()))
        p_dv, p_dk = (probs(log2_scores(_tile_products(kr, q, bn, bm).transpose(-1, -2)), map_lse)
                      for bm, bn in (tiles["dv"], tiles["dk"]))  # fmt: skip
        p_dq = probs(log2_scores(_tile_products(q, kr, *tiles["dq"])), map_lse)
        delta = torch.from_numpy(np.sum((cot * o).numpy(), axis=-1, keepdims=True))
        maps.append((q, kr, o, p_dv, p_dk, p_dq, delta))
    (_, _, o1, pv1, _, _, _), (_, _, o2, pv2, _, _, _) = maps
    grads = []
    for (q, kr, _, _, p_dk, p_dq, delta), sign in zip(maps, (1.0, -lam_), strict=True):
        grads.append(torch.from_numpy(np.matmul((p_dq * (g - delta) * sign).numpy(), kr.numpy())) * inp.scale)
        ds_t = (p_dk * (g - delta) * sign).transpose(-1, -2)
        dk = torch.from_numpy(np.matmul(ds_t.numpy(), q.numpy())) * inp.scale
        grads.append(dk.unflatten(1, (hkv, rep)).sum(2))
    # dV by the dK/dV kernel's products and its order of accumulation
    dv = _tile_accumulated((pv1 - lam_ * pv2).transpose(-1, -2), cot, *reversed(tiles["dv"]), group=rep)
    out, dlam = o1 - lam_ * o2, -(cot * o2).sum(-1)
    dq1, dk1, dq2, dk2 = grads
    return _in_leaf_order(out, dq1, dk1, dq2, dk2, dv, dlam, shared_k)


def _assert_lse_within_rounding(label, shape, tensors, mask, segments, shared_k, tiles, lse) -> None:
    """The kernels' log-sum-exps (log2 units) against float64 by the rule of tests/ops/rounding.py: its yardsticks
    PyTorch's logsumexp in the inputs' dtype and :func:`_tiled_yardstick`'s own, on the forward's tiles; a row that
    sees no key holds +inf (the backward's P of it is then 0)."""
    q1, k1, q2, k2, _v, _cot, inp, keep, bias = _yardstick_inputs(shape, tensors, mask, segments, shared_k)
    rep = q1.shape[1] // k1.shape[1]
    seen = keep.any(-1)

    def natural_scores(x, b):  # ln units, masked keys at -inf
        return (x if b is None else x + b).masked_fill(~keep, float("-inf"))

    for i, (q, k) in enumerate(((q1, k1), (q2, k2))):
        kr = k.repeat_interleave(rep, dim=1)
        assert torch.isposinf(lse[i][~seen]).all(), f"{label}: lse{i + 1} of a row that sees nothing"
        gold = torch.logsumexp(natural_scores((q.double() @ kr.double().transpose(-1, -2)) * inp.scale,
                                              None if bias is None else bias.double()), -1) * _LOG2E  # fmt: skip
        plain = torch.logsumexp(natural_scores((q @ kr.transpose(-1, -2)) * inp.scale, bias), -1) * _LOG2E
        tiled = _log2_lse(_log2_scores(_tile_products(q, kr, *tiles["fwd"]), inp, keep, bias), keep).squeeze(-1)
        assert_within_rounding(f"{label}: lse{i + 1}", lse[i][seen], gold[seen], [plain[seen], tiled[seen]], DTYPE)


def _tiles_that_ran(ran: list, backward_from: int) -> dict:
    """(rows, keys) of the tiles each kernel ran with, for :func:`_tiled_yardstick`: the forward's, and "dv", "dk",
    "dq" from the kernels of the backward launched from ``ran[backward_from]`` on (the single-pass kernel all three)."""
    forwards = ("fwd", "fwd_cols", *TMA_KINDS.values())
    fwd = next((bm, bn) for kind, bm, bn in reversed(ran[:backward_from]) if kind in forwards)
    bwd = {kind.removesuffix("_tma").removesuffix("_ws"): (bm, bn) for kind, bm, bn in ran[backward_from:]}
    if "dkdv_atomic" in bwd:
        return {"fwd": fwd, "dv": bwd["dkdv_atomic"], "dk": bwd["dkdv_atomic"], "dq": bwd["dkdv_atomic"]}
    one = bwd.get("dkdv")
    return {"fwd": fwd, "dv": bwd.get("dv", one), "dk": bwd.get("dk", one), "dq": bwd["dq"]}


def _grads(out, leaves, cot):
    return [out.detach(), *torch.autograd.grad(out, leaves, cot.to(out.dtype), retain_graph=True)]


def _check(case: Case, which: str, config: tuple[int, int], monkeypatch) -> None:
    shape = _shape(case, which)
    seed = zlib.crc32(f"{case.id} {which}".encode())
    (q1, k1, q2, k2, v, lam, cot), mask, segments, shared_k = _inputs(case, shape, which, seed)
    t = shape[3]

    def leaves_of(dtype):
        xs = [x.to(dtype).detach().clone().requires_grad_(True) for x in (q1, k1, q2, k2, v)]
        lam_ = lam.detach().clone().requires_grad_(True)
        leaves = [xs[0], xs[1], xs[2], *([] if shared_k else [xs[3]]), xs[4], lam_]
        args = (xs[0], xs[1], xs[2], xs[1] if shared_k else xs[3], xs[4], lam_)
        return leaves, args

    # an additive mask in the inputs' dtype; the float64 reference reads it by the masking rule of its dtype
    low_mask = mask if mask is None or mask.dtype == torch.bool else mask.to(DTYPE)
    leaves, args = leaves_of(torch.float64)
    gold = _grads(diff_attention(*args, attn_mask=low_mask, segment_ids=segments, backend="reference"), leaves, cot)
    yard_mask = low_mask
    if segments is not None:
        yard_mask = _segment_keep(segments, t)
    plain = []
    for flash in (False, True):
        for order in (0, 1, 2):
            leaves, args = leaves_of(DTYPE)
            out = plain_pytorch(*args, attn_mask=yard_mask, flash_backward=flash, order=order)
            plain.append(_grads(out, leaves, cot))
    if not _CUDA:  # the interpreter's own arithmetic (numpy's), bare and at tile-sized products: two more yardsticks
        for pad in (0, 64):
            plain.append(_numpy_yardstick(shape, (q1, k1, q2, k2, v, lam, cot), low_mask, segments, shared_k, pad))

    # the split backward (its dK/dV kernel in two launches), the forward by column blocks
    split = case.kind in ("split", "dv", "dk")
    monkeypatch.setattr(tuning, "SPLIT_DKDV", split)
    monkeypatch.setattr(tuning, "FWD_COLUMNS", case.kind in ("cols", "fwd_cols"))
    monkeypatch.setattr(tuning, "FWD_TMA", case.kind == "tma")
    for variant in BWD_TMA_KINDS:
        monkeypatch.setattr(tuning, TRITON_VARIANTS[variant][0], case.kind == variant)
    ran: list[tuple[str, int, int]] = []
    monkeypatch.setattr(launch, "_launch", _forced_launch(case, config, ran))
    forwards = []  # what the kernels' forward returned: (out, o1, o2, lse1, lse2), read through a twin of the eager
    # training Function whose forward records them (the twin holds its functions, not their names in the module)
    real_forward = launch._fwd_impl
    recording = eager_twin("_EagerTraining", lambda *a: forwards.append(real_forward(*a)) or forwards[-1],
                           launch._setup_context, launch._backward, launch._bwd_impl)  # fmt: skip
    monkeypatch.setattr(launch, "_EagerTraining", recording)
    leaves, args = leaves_of(DTYPE)
    inp = validate(*args, causal=True, attn_mask=low_mask, scale=None, segment_ids=segments)
    out = launch.diff_attention_triton(inp)
    names = ["out", "dq1", "dk1", "dq2", *([] if shared_k else ["dk2"]), "dv", "dlam"]
    # single-pass where it has tiles; two-kernel (its dK/dV kernel split in two for the split cases)
    # the forward by TMA tiles: the default backward; the backward by TMA tiles: the two-kernel one
    two_kernel = ("dkdv", "dq", "split", "dv", "dk", *TMA_KINDS, *BWD_TMA_KINDS)
    backwards = [True, False] if case.kind == "bwd" else [False] if case.kind in two_kernel else [True]
    for atomic in backwards:
        monkeypatch.setattr(tuning, "ATOMIC_DQ", atomic)
        backward_from = len(ran)
        got = _grads(out, leaves, cot)
        label = f"{case.id} {which} {shape} w{config[0]}s{config[1]} {'atomic' if atomic else 'two-kernel'}"
        yardsticks = list(plain)
        if not _CUDA:  # and P rounded as the kernels that ran round it (their tiles' products, numpy's arithmetic)
            tensors = (q1, k1, q2, k2, v, lam, cot)
            tiles = _tiles_that_ran(ran, backward_from)
            yardsticks.append(_tiled_yardstick(shape, tensors, low_mask, segments, shared_k, tiles))
            # and against the log-sum-exps the kernels' forward formed, once they are held to float64 by the rule
            lse = forwards[-1][3:]
            _assert_lse_within_rounding(label, shape, tensors, low_mask, segments, shared_k, tiles, lse)
            yardsticks.append(_tiled_yardstick(shape, tensors, low_mask, segments, shared_k, tiles, lse=lse))
        for i, name in enumerate(names):
            assert_within_rounding(f"{label}: {name}", got[i], gold[i], [p[i] for p in yardsticks], DTYPE)
    if case.tile is not None:  # the tile under test ran
        kind = {"fwd_mid": "fwd", "fwd_short": "fwd"}.get(case.kind, case.kind)
        assert (kind, *case.tile) in ran, (case.id, ran)
    if case.kind == "bwd":  # both backwards ran: the single pass where a GPU has tiles for it, and the two kernels
        d, dv, _ = WIDTHS[case.width]
        single = {"dkdv_atomic"} if tuning._single_pass_fits(d, dv, case.mask) else set()
        assert {k for k, _, _ in ran} == {"fwd", "dkdv", "dq", *single}, (case.id, ran)
    if split:  # the split's two launches ran, and no one-pass dK/dV
        assert {k for k, _, _ in ran} == {"fwd", "dv", "dk", "dq"}, (case.id, ran)
    if case.kind == "cols":  # the forward by column blocks ran, and not the whole-width one
        assert {k for k, _, _ in ran} == {"fwd_cols", "dkdv", "dq"}, (case.id, ran)
    if case.kind in TMA_KINDS:  # the forward by TMA tiles ran, and not the default one
        assert {k for k, _, _ in ran} == {TMA_KINDS[case.kind], "dkdv", "dq"}, (case.id, ran)
    if case.kind in BWD_TMA_KINDS:  # the backward by TMA tiles ran, and not the default one
        assert {k for k, _, _ in ran} == {"fwd", *BWD_TMA_KINDS[case.kind]}, (case.id, ran)


@pytest.fixture(autouse=True)
def _gpu_tiles(monkeypatch):
    keep_interpreting(monkeypatch)
    if not _CUDA:
        _install_bounds_check(monkeypatch)
    # the GPU's choices (tiles, which backward fits), not the interpreter's 16 × 16 tiles
    monkeypatch.setattr(tuning, "INTERPRETED", False)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    monkeypatch.setattr(tuning, "AUTOTUNE", False)


#: what the default test run checks of the cases above (about 15% of their time; CI runs them all, marked heavy): the
#: default tiles — what runs unless autotuning is on — at several tiles of every kernel with no mask (partial tiles,
#: T < S, GQA: the shapes where an out-of-bounds access shows), in one block under a per-row mask with a row that
#: sees nothing, and the backward's own tiles for segments (_MASK_TILES) in one block; (kind or None = every kind,
#: mask, which)
REPRESENTATIVE = {(None, "none", "tiles"), (None, "rows", "one-block"), ("bwd", "segments", "one-block")}


def _boundary_params():
    for case in CASES:
        for which in ("tiles", "one-block"):
            representative = case.default and bool(
                {(None, case.mask, which), (case.kind, case.mask, which)} & REPRESENTATIVE
            )
            yield pytest.param(case, which, id=f"{case.id}-{which}", marks=() if representative else pytest.mark.heavy)


@pytest.mark.parametrize(("case", "which"), list(_boundary_params()))
def test_tile_matches_reference_at_boundary_shapes(case, which, monkeypatch):
    # on a GPU every (num_warps, num_stages) of the tile runs compiled; under the interpreter they are one program
    for config in case.configs if _CUDA else case.configs[:1]:
        _check(case, which, config, monkeypatch)


#: every decoding candidate (tuning.DECODE_TILES) of every head-width class, without a mask and with key padding;
#: the default run checks DIFF V1's first longer tile with padding (CI runs them all, marked heavy)
DECODE_CASES = [
    (width, tile, mask) for width in WIDTHS for tile in tuning.DECODE_TILES[width] for mask in ("none", "keys")
]
DECODE_REPRESENTATIVE = ("v1", (64, 4, 2), "keys")


@pytest.mark.parametrize(
    ("width", "tile", "mask"),
    [pytest.param(*c, id=f"{c[0]}-16x{c[1][0]}-w{c[1][1]}s{c[1][2]}-{c[2]}",
                  marks=() if c == DECODE_REPRESENTATIVE else pytest.mark.heavy) for c in DECODE_CASES],
)  # fmt: skip
def test_decoding_candidate_matches_reference_at_boundary_shapes(width, tile, mask, monkeypatch):
    # the decoding forward (a split forward of at most 16 rows) on each candidate tile, forced as a GPU run would
    # take it (tuning.DECODE_TILE), every tensor in a poisoned buffer and every access bounds-checked: one token and
    # three (rows 2 and 6 on one tile: two query heads per KV head), 5 tiles and 9 keys in 3 splits of two tiles, the
    # last split's last tile partial; with padding, batch 0's first split sees no key at all. (Without CUDA the host
    # plans its splits on float32's shorter tiles, and the kernel rounds each split up to whole tiles of its own:
    # the splits above, as a GPU's 16-bit launch plans them.) And 2 tiles and 9 keys asked in 8 splits: planned on
    # float32's tiles as 5 or 6, of which the kernel's rounding leaves the last 2 or 3 empty
    monkeypatch.setattr(tuning, "DECODE_TILE", tile)
    bn = tile[0]
    case = Case("decode", width, mask, None)
    for t, s, splits in ((1, 5 * bn + 9, 3), (3, 5 * bn + 9, 3), (1, 2 * bn + 9, 8)):
        monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", splits)
        shape = (2, 4, 2, t, s)
        seed = zlib.crc32(f"{case.id} {tile} {t} {s}".encode())
        (q1, k1, q2, k2, v, lam, cot), keys, _, shared_k = _inputs(case, shape, "tiles", seed)
        if keys is not None:
            keys[0, : 2 * bn] = False  # batch 0's first split (two tiles) padded whole
        args64 = [x.double() for x in (q1, k1, q2, k1 if shared_k else k2, v, lam)]
        gold = diff_attention(*args64, attn_mask=keys, backend="reference")
        args = [x.to(DTYPE) for x in (q1, k1, q2, k1 if shared_k else k2, v)] + [lam]
        yardsticks = [plain_pytorch(*args, attn_mask=keys, order=order).detach() for order in (0, 1, 2)]
        if not _CUDA:  # the interpreter's arithmetic (numpy's), bare and on tile-sized products
            tensors = (q1, k1, q2, k2, v, lam, cot)
            yardsticks += [_numpy_yardstick(shape, tensors, keys, None, shared_k, pad)[0] for pad in (0, bn)]
        ran: list[tuple[str, int, int]] = []
        monkeypatch.setattr(launch, "_launch", _forced_launch(case, tile[1:], ran))
        with torch.no_grad():
            out = launch.diff_attention_triton(validate(*args, causal=True, attn_mask=keys, scale=None))
        assert ran == [("fwd", 16, bn)], (case.id, tile, ran)  # the candidate ran, split
        assert_within_rounding(f"decode {width} {tile} {mask} {shape}", out, gold, yardsticks, DTYPE)


#: every decoding candidate by vector products (tuning.DECODE_VECTORS) of every head-width class, without a mask,
#: with key padding and with a per-row 4-D mask; the default run checks DIFF V1's first with padding (CI runs them
#: all, marked heavy)
VECTOR_CASES = [
    (width, tile, mask)
    for width in WIDTHS
    for tile in tuning.DECODE_VECTORS[width]
    for mask in ("none", "keys", "rows")
]
VECTOR_REPRESENTATIVE = ("v1", (64, 4, 2), "keys")


@pytest.mark.parametrize(
    ("width", "tile", "mask"),
    [pytest.param(*c, id=f"{c[0]}-vec{c[1][0]}-w{c[1][1]}s{c[1][2]}-{c[2]}",
                  marks=() if c == VECTOR_REPRESENTATIVE else pytest.mark.heavy) for c in VECTOR_CASES],
)  # fmt: skip
def test_decoding_vector_candidate_matches_reference_at_boundary_shapes(width, tile, mask, monkeypatch):
    # the decoding forward by vector products (tuning.DECODE_VECTOR) on each candidate, every tensor in a poisoned
    # buffer and every access bounds-checked: one token of 2 sequences × 4 heads (one query head per KV head, so one
    # row a program), 5 tiles and 9 keys in 3 splits, the last tile partial; 2 tiles and 9 keys asked in 8 splits
    # (the host plans whole tiles of the candidate's: 3 splits of one tile); with padding, batch 0's first split
    # sees no key (an empty split: log-sum-exp −inf, weight 0); with a 4-D mask, a row that sees nothing (its head's
    # row: a [B, H, 1, S] mask), bool on the first shape and additive on the second. DiffK's one Q for both maps on
    # the last. Where V is twice Q's width, on the last also with V as two halves of one tensor read in place
    # (DiffLlama's decoding), unrelocated: the kernel reads the second half at an offset from the first, which a
    # relocated copy of the first half alone would not hold. And under GQA (two query heads a KV head: rows packed
    # into a tile) it does not run
    monkeypatch.setattr(tuning, "DECODE_VECTOR", tile)
    bn = tile[0]
    case = Case("decode", width, mask, None)
    vector_ran: list[tuple] = []
    real = launch._decode_vector_kernel

    class Checked:  # launch._decode_vector_kernel[grid](...), bounds-checked and recorded
        fn = getattr(real, "fn", real)

        def __getitem__(self, grid):
            def call(*args, **kw):
                vector_ran.append((kw["BLOCK_N"], kw["num_warps"], kw["num_stages"], grid, kw["DV_HALF"]))
                if kw["DV_HALF"]:  # V's halves read in place: not relocatable one tensor at a time (above)
                    real[grid](*args, **kw)
                else:
                    _checked_call(real, grid, args, kw, f"(vec x{kw['BLOCK_N']})")

            return call

    monkeypatch.setattr(launch, "_decode_vector_kernel", Checked())
    for i, (s, splits, which) in enumerate(((5 * bn + 9, 3, "tiles"), (2 * bn + 9, 8, "one-block"))):
        monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", splits)
        shape = (2, 4, 4, 1, s)
        seed = zlib.crc32(f"{case.id} vec {tile} {s}".encode())
        (q1, k1, q2, k2, v, lam, _), keys, _, shared_k = _inputs(case, shape, which, seed)
        if mask == "keys":
            keys[0, : 2 * bn] = False  # batch 0's first split (two tiles) padded whole
        elif mask == "rows":  # a row per head (_inputs' rows are per position: at T = 1 it would hide every key)
            g = torch.Generator().manual_seed(seed)
            keep = torch.rand(2, 4, 1, s, generator=g) > 0.25
            keep[0, 1] = False  # a row that sees nothing
            noise = torch.randn(2, 4, 1, s, generator=g)
            keys = (keep if which == "tiles" else noise.masked_fill(~keep, torch.finfo(DTYPE).min)).to(DEVICE)
        if i == 1:
            q2 = q1  # DiffK: SHARED_Q
        args64 = [x.double() for x in (q1, k1, q2, k1 if shared_k else k2, v, lam)]
        gold_mask = keys.double() if keys is not None and keys.is_floating_point() else keys
        gold = diff_attention(*args64, attn_mask=gold_mask, backend="reference")
        args = [x.to(DTYPE) for x in (q1, k1, q2, k1 if shared_k else k2, v)] + [lam]
        yardsticks = [plain_pytorch(*args, attn_mask=keys, order=order).detach() for order in (0, 1, 2)]
        runs = [args]
        d, dv = args[0].shape[-1], args[4].shape[-1]
        if dv == 2 * d and i == 1:  # V as DiffLlama's two halves of heads in one tensor, read in place
            v_heads = torch.cat([args[4][..., :d], args[4][..., d:]], dim=1)  # [B, 2·Hkv, S, d]
            runs.append([*args[:4], (v_heads[:, :4], v_heads[:, 4:]), args[5]])
        for run in runs:
            fwd_ran: list[tuple] = []
            monkeypatch.setattr(launch, "_launch", _forced_launch(case, tile[1:], fwd_ran))
            vector_ran.clear()
            with torch.no_grad():
                out = launch.diff_attention_triton(validate(*run, causal=True, attn_mask=keys, scale=None))
            assert fwd_ran == [] and [r[:3] for r in vector_ran] == [tile], (case.id, tile, fwd_ran, vector_ran)
            split_len = _cdiv(_cdiv(s, splits), bn) * bn
            assert vector_ran[0][3] == (2 * 4, _cdiv(s, split_len)), vector_ran  # a program per row and split
            assert bool(vector_ran[0][4]) == (run is not args), vector_ran  # the halves read in place, or not
            assert_within_rounding(f"decode vec {width} {tile} {mask} {shape}", out, gold, yardsticks, DTYPE)
    # two query heads a KV head: the packed tile's forward runs, not this kernel
    (q1, k1, q2, k2, v, lam, _), keys, _, shared_k = _inputs(case, (2, 4, 2, 1, 2 * bn + 9), "tiles", 1)
    fwd_ran = []
    monkeypatch.setattr(launch, "_launch", _forced_launch(case, tile[1:], fwd_ran))
    vector_ran.clear()
    with torch.no_grad():
        launch.diff_attention_triton(validate(q1, k1, q2, k1 if shared_k else k2, v, lam, causal=True,
                                              attn_mask=keys, scale=None))  # fmt: skip
    assert vector_ran == [] and [k for k, _, _ in fwd_ran] == ["fwd"], (vector_ran, fwd_ran)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_every_candidate_and_default_tile_is_covered():
    # what the parametrisation above reads off the tables: each entry of _TUNING and each default of
    # _TILES / _MASK_TILES per width and mask class has a case (the default ones via tuning._blocks at run time)
    tuned = {
        (mask, kind, width, (bm, bn), (w, s))
        for mask, kinds in tuning._TUNING.items()
        for kind, widths in kinds.items()
        for width, configs in widths.items()
        for bm, bn, w, s in configs
    }
    covered = {(c.mask, c.kind, c.width, c.tile, cfg) for c in CASES if not c.default for cfg in c.configs}
    assert tuned == covered
    defaults = {(c.kind, c.width, c.mask) for c in CASES if c.default}
    split = {("split", w, m) for w in WIDTHS for m in MASKS if _table_tile("dk", w, m)}
    split |= {("cols", w, m) for w in WIDTHS for m in MASKS if _table_tile("fwd_cols", w, m)}
    tma = {(v, w, "none") for v, kind in TMA_KINDS.items() for w in WIDTHS if _table_tile(kind, w, "none")}
    tma |= {(v, w, "none") for v, kinds in BWD_TMA_KINDS.items() for w in WIDTHS
            if all(_table_tile(k, w, "none") for k in kinds)}  # fmt: skip
    # DIFF V1's and V2's heads, no mask
    assert tma == {(v, w, "none") for v in (*TMA_KINDS, *BWD_TMA_KINDS) for w in ("v1", "v2")}
    # the wide heads (and for the split, DIFF V1's), with every mask class
    want = {(k, "wide", m) for k in ("split", "cols") for m in MASKS} | {("split", "v1", m) for m in MASKS}
    assert split == want
    assert defaults == {(k, w, m) for k in (*FWD_REGIMES, "bwd") for w in WIDTHS for m in MASKS} | split | tma
    for width in WIDTHS:  # every default table entry is one a default case reaches
        for kind in ("fwd", "fwd_mid", "fwd_short", "dkdv", "dq"):
            assert all(_table_tile(kind, width, m) for m in MASKS), (kind, width)


def test_no_candidate_is_a_configuration_triton_miscompiles():
    # tuning.MISCOMPILED: one warpgroup on one stage faulted on an H100 (triton 3.6) in the single-pass backward
    for mask, kinds in tuning._TUNING.items():
        for kind, widths in kinds.items():
            for width, configs in widths.items():
                for _, _, warps, stages in configs:
                    assert (kind, warps, stages) not in tuning.MISCOMPILED, (mask, kind, width, warps, stages)
