"""The host side of the fused kernel for two-map attention (DIFF Transformer Eq. 1, docs/methods.md §0), the
``triton`` backend of :func:`diffattn.ops.diff_attention`: the entry point, the forward and backward as
``torch.library`` custom ops with their autograd formula, the launches of the kernels of :mod:`.forward`,
:mod:`.backward` and :mod:`.decode` with the tiles :mod:`.tuning` picks, under a device guard.

* **Autograd and torch.compile.** Forward and backward are ``torch.library.custom_op`` s with fake (meta)
  implementations and a registered autograd formula, so the op traces under ``torch.compile``. A forward that needs
  neither calls the implementation directly (the dispatcher costs ~25 µs of host time a call).
* **The backward is chosen when it runs**, not at the forward: the single-pass atomic one unless
  :data:`.tuning.ATOMIC_DQ` is False, ``torch.use_deterministic_algorithms(True)`` is on, or its tiles would spill
  for these heads and mask; then the deterministic two-kernel one (its key-block kernel as two launches, dV then
  dK, for wide heads under :data:`.tuning.SPLIT_DKDV`).
* **Segments** (sequence packing): ``segment_ids`` [B, S] int32 reach the kernels as they are (``SEGMENTS``), and
  they compare them per tile: no [T, S] mask is formed.
* **Shared operands.** ``k1 is k2`` (DAA, DiffQ, DIFF V2) or ``q1 is q2`` (DiffK) reaches the kernels as
  ``SHARED_K`` / ``SHARED_Q``: the operand is loaded once and accumulates one gradient.
* **Launches** run under a device guard for the tensors' GPU (:func:`_on_device`: Triton launches on the current
  device); a launch that is not autotuned and runs out of shared memory or registers retries with smaller tiles.
  Tensors reach the kernels through :mod:`.layout` (strides, masks, 32-bit offsets in range).
"""

from __future__ import annotations

import contextlib
import logging

import torch
import triton
from torch import Tensor

from .._inputs import DiffAttentionInputs
from . import tuning
from .backward import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess_kernel
from .backward_tma import _bwd_dkdv_tma_kernel, _bwd_dq_tma_kernel
from .decode import _combine_kernel, _decode_vector_kernel
from .eager import choose, eager_twin
from .forward import _fwd_kernel
from .forward_tma import _fwd_tma_kernel
from .layout import (
    _causal_key_padding,
    _check_offsets,
    _in_place_halves,
    _kernel_layout,
    _mask_args,
    _mask_for_kernels,
    _strides4,
)
from .tuning import _cdiv, _pow2

logger = logging.getLogger(__name__)

_LOG2E = 1.4426950408889634  # softmax runs in base 2 (exp2 is the hardware instruction); scores are pre-scaled


def _launch(kernel, grid_of, args, consts, kind, d, dv, rows, key, variants=0):
    """Launch with the autotuner where the launch is tuned (:func:`_tunable`; it skips configurations that run
    out of resources), else with the heuristic tiles; if the GPU runs out of shared memory or registers, halve
    BLOCK_N then BLOCK_M (down to 16) and remember what worked for this shape class. The kernel of an error that
    escapes is kept in :data:`FAILED_KERNEL` (the exception itself crosses torch.library's custom-op boundary, which
    does not keep attributes), for :func:`diffattn.ops.diff_attention`'s one-line error. ``variants``: the call's
    (a decoding route's tile: :func:`.tuning._decode_tile`)."""
    global FAILED_KERNEL
    try:
        _launch_tiles(kernel, grid_of, args, consts, kind, d, dv, rows, key, variants)
    except Exception:
        FAILED_KERNEL = f"kernel {getattr(getattr(kernel, 'fn', kernel), '__name__', None) or kind} ({kind})"
        raise


#: the last kernel whose launch raised (compile error, launch error, out of resources), or None
FAILED_KERNEL: str | None = None


def _launch_tiles(kernel, grid_of, args, consts, kind, d, dv, rows, key, variants=0):
    fp32, mask = consts["PREC"] == "ieee", tuning._mask_class(consts)
    if tuning._tunable(kind, d, dv, rows, fp32, consts.get("SPLIT", False), mask):
        tuner = tuning._autotuner(kernel, kind, d, dv, mask)
        tuner[lambda meta: grid_of(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **consts)
        return
    split = consts.get("SPLIT", False)
    key = (*key, mask, split, tuning._decode_tile(kind, d, dv, rows, fp32, split, variants))
    cached = None if tuning.BLOCK_OVERRIDE is not None else _LAUNCH_CACHE.get(key)
    bm, bn, warps = cached or tuning._blocks(kind, d, dv, rows, fp32, mask, split, variants)
    while True:
        try:
            options = dict(num_warps=warps, **tuning._launch_options(kind, d, dv, rows, fp32, split, variants))
            kernel[grid_of(bm, bn)](*args, **consts, BLOCK_M=bm, BLOCK_N=bn, **options)
            if tuning.BLOCK_OVERRIDE is None:
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


def _on_device(device: torch.device):
    """A CUDA device guard for ``device`` (Triton launches on the *current* device and its stream, so a tensor on
    another GPU than the current one would otherwise be read by a kernel running elsewhere); nothing off CUDA."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


_GRID_LIMIT = 65535  # CUDA's limit on the grid's y and z axes (x goes to 2³¹ − 1)


def _grid(*dims: int) -> tuple[int, ...]:
    """A launch grid, with a clear error where a CUDA limit would make the launch fail."""
    if any(n > _GRID_LIMIT for n in dims[1:]):
        raise ValueError(
            f"diffattn triton: grid {dims} exceeds CUDA's {_GRID_LIMIT} blocks on its second or third axis "
            "(a sequence of more than ~8M query rows per KV head or keys); use the chunked backend"
        )
    return dims


def _common(q1, k1, q2, k2, v, mask, causal, segments=None):
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
    upcast = tuning.INTERPRETED and q1.dtype == torch.bfloat16
    consts = dict(
        CAUSAL=bool(causal),
        MASK_KIND=mask_kind,
        MASK_ROWS=mask_rows,
        SEGMENTS=segments is not None,
        SHARED_Q=shared_q,
        SHARED_K=shared_k,
        UPCAST=upcast,
        PREC="ieee" if q1.dtype == torch.float32 else "tf32",
        BLOCK_D=_pow2(d),
        BLOCK_DV=_pow2(dv),
    )
    return (b, h, hkv, t, s, d, dv), mask_t, strides, consts


def _fwd_impl(
    q1: Tensor, k1: Tensor, q2: Tensor | None, k2: Tensor | None, v: Tensor, lam: Tensor, mask: Tensor | None,
    causal: bool, scale: float, save_parts: bool, v2: Tensor | None = None, segments: Tensor | None = None,
    variants: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(out, o1, o2, lse1, lse2). q2/k2 None = shared with q1/k1. lam: float32 [B, H, T]. lse in log2 units.
    o1/o2 (the per-map outputs, for the backward's Δ) are empty unless save_parts. v2: the second half of V's
    columns (V = [v | v2]; forward without gradient only): read in place when it lies in v's storage with v's
    shape and strides (DiffLlama's value heads j and j + Hkv), else concatenated. Decided here, at run time,
    because a traced graph (torch.compile, CUDA graphs) cannot look at storage. segments: [B, S] int32 document
    ids (None: one document). variants: the variants this call switches on (:func:`.tuning._on`; its route's,
    ``triton[NAME]``). Launches on q1's device."""
    with _on_device(q1.device):
        return _fwd_run(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2, segments, variants)


def _fwd_run(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2, segments, variants):
    v_half = 0
    if v2 is not None:
        if save_parts:  # the backward differentiates one V; the caller concatenates when it needs gradients
            raise ValueError("diffattn triton: V in two halves is for a forward without gradient")
        v_half = _in_place_halves((v, v2))
        if not v_half:
            v = torch.cat([v, v2], dim=-1)
    (b, h, hkv, t, s, d, dv), mask_t, strides, consts = _common(q1, k1, q2, k2, v, mask, causal, segments)
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
    fp32, mask_class = consts["PREC"] == "ieee", tuning._mask_class(consts)
    # wide heads under tuning.FWD_COLUMNS: a program per half of V's columns (never with key splits)
    columns = tuning._fwd_columns(d, dv, mask_class, variants) if not v_half else 0
    kind = "fwd_cols" if columns else "fwd"
    bm, bn, _ = tuning._blocks(kind, d, dv, rows, fp32, mask_class)
    nsplit = 1 if save_parts or columns else tuning._num_splits(q1.device, _cdiv(rows, bm) * b * hkv, s, bn, variants)
    if nsplit > 1:  # the split forward's own tiles (_SPLIT_TILES): whole tiles of them per split
        bn = max(bn, tuning._blocks("fwd", d, dv, rows, fp32, mask_class, split=True, variants=variants)[1])
    vector = tuning._decode_vector(d, dv, rows, nsplit > 1, segments is not None, variants)
    if vector:  # one query row a program, by vector products (its route's or tuning.DECODE_VECTOR): whole tiles a split
        bn = vector[0]  # (keys within one such tile leave one split: it still runs, merged by the combine)
    split_len = _cdiv(_cdiv(s, nsplit), bn) * bn  # whole tiles per split
    nsplit = _cdiv(s, split_len)
    tma = nsplit == 1 and not vector and not v_half and not consts["SHARED_Q"]
    tma = tma and tuning._fwd_tma(d, dv, mask_class, variants)
    if tma and _tma_fits(q1, k1, q2, k2, v):  # the forward by TMA tiles (training, and inference without splits)
        sizes = (b, h, hkv, t, s, d, dv)
        _fwd_tma_launch(q1, k1, q2, k2, v, lam, out, o1, o2, lse1, lse2, strides, consts, sizes, scale, save_parts)
        return out, o1, o2, lse1, lse2
    if nsplit > 1 or vector:  # per-split partial outputs, merged by _combine_kernel below
        po1 = torch.empty(nsplit, r_total, dv, device=q1.device, dtype=torch.float32)
        po2 = torch.empty_like(po1)
        pl1 = torch.empty(nsplit, r_total, device=q1.device, dtype=torch.float32)
        pl2 = torch.empty_like(pl1)
        targets = (po1, po2, pl1, pl2)
    else:
        targets = (o1, o2, lse1, lse2)
    args = (
        q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, lam, mask_t, segments,
        out, *targets, *strides,
        h, hkv, t, s, d, dv, scale * _LOG2E, r_total, split_len, _pow2(max(t, s)), v_half,
    )  # fmt: skip
    if vector:
        _launch_vector(q1, k1, q2, k2, v, mask_t, targets, strides, consts, (b, h, hkv, s, d, dv), scale, r_total,
                       split_len, nsplit, v_half, vector)  # fmt: skip
    else:
        key = (kind, q1.device.type, q1.dtype, consts["BLOCK_D"], consts["BLOCK_DV"], _pow2(min(rows, 64)))
        fwd_consts = dict(consts, SAVE_PARTS=save_parts, SPLIT=nsplit > 1, DV_HALF=dv // 2 if v_half else 0)
        fwd_consts.update(COLUMNS=bool(columns), BLOCK_DV=columns or consts["BLOCK_DV"])
        _launch(
            _fwd_kernel,
            lambda bm, bn: _grid(b * hkv, _cdiv(rows, bm), nsplit if nsplit > 1 else _cdiv(dv, columns or dv)),
            args,
            fwd_consts,
            kind,
            d,
            dv,
            rows,
            key,
            variants,
        )
    if nsplit > 1 or vector:
        block_r = 16
        _combine_kernel[(_cdiv(r_total, block_r),)](
            po1, po2, pl1, pl2, lam, out, lse1, lse2, h, t, dv, r_total, nsplit,
            BLOCK_R=block_r, BLOCK_DV=consts["BLOCK_DV"],
        )  # fmt: skip
    return out, o1, o2, lse1, lse2


def _launch_vector(q1, k1, q2, k2, v, mask_t, targets, strides, consts, sizes, scale, r_total, split_len, nsplit,
                   v_half, tile) -> None:  # fmt: skip
    """The decoding forward by vector products (:func:`.decode._decode_vector_kernel`, :func:`.tuning._decode_vector`):
    one program per query row and key split, writing ``targets`` (the split buffers _combine_kernel merges). T = 1,
    so the strides of Q's and a 4-D mask's position axis are not passed."""
    global FAILED_KERNEL
    b, h, hkv, s, d, dv = sizes
    sq1b, sq1h, _, sq2b, sq2h, _, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, _, sms = strides
    block_n, warps, stages = tile
    try:
        _decode_vector_kernel[_grid(b * h, nsplit)](
            q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, mask_t, *targets,
            sq1b, sq1h, sq2b, sq2h, sk1b, sk1h, sk1s, sk2b, sk2h, sk2s, svb, svh, svs, smb, smh, sms,
            h, hkv, s, d, dv, scale * _LOG2E, r_total, split_len, v_half,
            MASK_KIND=consts["MASK_KIND"], SHARED_Q=consts["SHARED_Q"], SHARED_K=consts["SHARED_K"],
            DV_HALF=dv // 2 if v_half else 0, BLOCK_N=block_n, BLOCK_D=consts["BLOCK_D"],
            BLOCK_DV=consts["BLOCK_DV"], num_warps=warps, num_stages=stages,
        )  # fmt: skip
    except Exception:
        FAILED_KERNEL = "kernel _decode_vector_kernel (decode_vec)"
        raise


def _tma_fits(*tensors: Tensor | None) -> bool:
    """Whether tensors can be read through TMA descriptors (:mod:`.forward_tma`): 16-bit elements on a GPU (any
    float dtype on the CPU, where only the interpreter runs kernels), the last stride 1, every other stride and the
    data pointer 16-byte aligned. None (a shared operand) fits."""
    for x in tensors:
        if x is None:
            continue
        if x.is_cuda and x.element_size() != 2:
            return False
        per_16_bytes = 16 // x.element_size()
        if x.stride(-1) != 1 or any(st % per_16_bytes for st in x.stride()[:-1]) or x.data_ptr() % 16:
            return False
    return True


def _tma_consts(consts: dict) -> dict:
    """The constexprs of the default kernels' launch that the TMA kernels take too (they take no mask, segments or
    padded widths)."""
    return {name: consts[name] for name in ("CAUSAL", "SHARED_K", "UPCAST", "PREC", "BLOCK_D", "BLOCK_DV")}


def _fwd_tma_launch(q1, k1, q2, k2, v, lam, out, o1, o2, lse1, lse2, strides, consts, sizes, scale, save_parts):
    """The forward by TMA tiles (:mod:`.forward_tma`); O1 and O2 stored where ``save_parts``. Its descriptors are made
    on the device, in scratch memory Triton asks an allocator for: one is set where none is."""
    b, h, hkv, t, s, d, dv = sizes
    _ensure_allocator()
    args = (q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, lam, out, o1, o2, lse1, lse2,
            *strides[:15], h, hkv, t, s, scale * _LOG2E)  # fmt: skip
    tma_consts = dict(_tma_consts(consts), SAVE_PARTS=save_parts)
    key = ("fwd_tma", q1.device.type, q1.dtype, d, dv)
    _launch(_fwd_tma_kernel, lambda bm, bn: _grid(b * h, _cdiv(t, bm)), args, tma_consts, "fwd_tma", d, dv, t, key)


def _scratch(size: int, alignment: int, stream) -> Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def _ensure_allocator() -> None:
    """Triton's allocator for a kernel's scratch memory (device-made descriptors): ours, where the process has none
    (Triton's default raises), so a user's own allocator is kept."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _bwd_tma_launch(common, outputs, strides, consts, sizes, scale, variants) -> None:
    """The two-kernel backward by TMA tiles (:mod:`.backward_tma`), its dK/dV kernel warp-specialised under
    :data:`.tuning.BWD_WS` (or ``variants``): dK1, dK2, dV, then dQ1, dQ2 written into ``outputs`` (dK2 unused when K
    is shared).
    ``common``: the default kernels' leading arguments, of which these take all but the mask and segments."""
    q1, k1, q2, k2, v, lam, _mask, _segments, dout, lse1, lse2, delta1, delta2 = common
    dk1, dk2, dvv, dq1, dq2 = outputs
    b, h, t, s, d, dv = sizes
    _ensure_allocator()
    ws = tuning._on("BWD_WS", variants)
    head = (q1, k1, q2, k2, v, lam, dout, lse1, lse2, delta1, delta2)
    tail = (*strides[:15], h, t, s, scale, scale * _LOG2E)
    tma_consts = _tma_consts(consts)
    kind = "dkdv_ws" if ws else "dkdv_tma"
    key = (kind, q1.device.type, q1.dtype, d, dv)
    dkdv_args = (*head, dk1, dk1 if consts["SHARED_K"] else dk2, dvv, *tail)  # (dK2 is empty when K is shared)
    _launch(_bwd_dkdv_tma_kernel, lambda bm, bn: _grid(b * h, _cdiv(s, bn)), dkdv_args, dict(tma_consts, WS=ws), kind,
            d, dv, t, key)  # fmt: skip
    key = ("dq_tma", q1.device.type, q1.dtype, d, dv)
    dq_args = (*head, dq1, dq2, *tail)
    _launch(_bwd_dq_tma_kernel, lambda bm, bn: _grid(b * h, _cdiv(t, bm)), dq_args, tma_consts, "dq_tma", d, dv, t,
            key)  # fmt: skip


# _fwd_impl as a custom op: opaque to torch.compile (fake implementation below) and differentiable (the autograd
# formula at the end of this section). A forward that needs neither calls _fwd_impl directly: the dispatcher
# costs ~25 µs of host time a call, about half of a decoding step's launch overhead (benchmarks/host_overhead.py).
_fwd_op = torch.library.custom_op("diffattn::triton_diff_attn_fwd", mutates_args=())(_fwd_impl)


@_fwd_op.register_fake
def _fwd_fake(q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, v2=None, segments=None, variants=0):
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
    dout: Tensor, q1: Tensor, k1: Tensor, q2: Tensor | None, k2: Tensor | None, v: Tensor, lam: Tensor,
    mask: Tensor | None, o1: Tensor, o2: Tensor, lse1: Tensor, lse2: Tensor, causal: bool, scale: float,
    atomic_dq: bool, segments: Tensor | None = None, variants: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq1, dk1, dq2, dk2, dv, dlam); dq2/dk2 are empty when q2/k2 are shared (their gradient is inside
    dq1/dk1). dlam: float32 [B, H, T]. ``atomic_dq`` False forces the deterministic two-kernel backward; True
    leaves the choice to this call, i.e. to when the backward runs (not the forward): the single-pass atomic one
    unless :data:`.tuning.ATOMIC_DQ` is False, ``torch.use_deterministic_algorithms(True)`` is on, or it has no
    spill-free tiles for these heads and mask (:func:`.tuning._single_pass_fits`). ``variants``: as the forward's
    (:func:`_fwd_impl`). Launches on q1's device."""
    with _on_device(q1.device):
        return _bwd_run(
            dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq, segments, variants
        )


# the backward as a custom op (opaque to torch.compile; fake implementation below)
_bwd_op = torch.library.custom_op("diffattn::triton_diff_attn_bwd", mutates_args=())(_bwd_impl)


def _bwd_run(dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq, segments, variants):
    (b, h, hkv, t, s, d, dv), mask_t, strides, consts = _common(q1, k1, q2, k2, v, mask, causal, segments)
    dout = dout.contiguous()
    atomic = (
        atomic_dq
        and tuning._on("ATOMIC_DQ", variants)
        and not torch.are_deterministic_algorithms_enabled()
        and tuning._single_pass_fits(d, dv, tuning._mask_class(consts))
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
        q1, k1, q1 if q2 is None else q2, k1 if k2 is None else k2, v, lam, mask_t, segments,
        dout, lse1, lse2, delta1, delta2,
    )  # fmt: skip
    sizes = (h, hkv, t, s, d, dv, scale, scale * _LOG2E, _pow2(max(t, s)))
    base_key = (q1.device.type, q1.dtype, consts["BLOCK_D"], consts["BLOCK_DV"], atomic)
    mask_class = tuning._mask_class(consts)
    split = not atomic and tuning._split_dkdv(d, dv, mask_class, variants)
    tma = not atomic and h == hkv and not consts["SHARED_Q"] and not split
    if tma and tuning._bwd_tma(d, dv, mask_class, variants) and _tma_fits(q1, k1, q2, k2, v, dout):  # .backward_tma
        _bwd_tma_launch(common, (dk1, dk2, dvv, dq1, dq2), strides, consts, (b, h, t, s, d, dv), scale, variants)
        return dq1, dk1, dq2, dk2, dvv, dlam
    dkdv_args = (*common, dk1, dk1 if k2 is None else dk2, dvv, dq1, dq1 if q2 is None else dq2, *strides, *sizes)
    # the key-block kernel: dK1, dK2, dV (and the atomic path's dQ) in one launch, or dV then dK in two (wide heads)
    one_pass = ("dkdv_atomic" if atomic else "dkdv", True, True)  # (kind, WITH_DK, WITH_DV)
    passes = (("dv", False, True), ("dk", True, False)) if split else (one_pass,)
    for kind, with_dk, with_dv in passes:
        _launch(
            _bwd_dkdv_kernel,
            lambda bm, bn: _grid(b * hkv, _cdiv(s, bn)),
            dkdv_args,
            dict(consts, ATOMIC_DQ=atomic, WITH_DK=with_dk, WITH_DV=with_dv),
            kind,
            d,
            dv,
            t,
            (kind, *base_key),
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
def _bwd_fake(
    dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, causal, scale, atomic_dq, segments=None, variants=0
):
    return (
        torch.empty_like(q1, memory_format=torch.contiguous_format),
        torch.empty_like(k1, memory_format=torch.contiguous_format),
        torch.empty_like(q1, memory_format=torch.contiguous_format) if q2 is not None else q1.new_empty(0),
        torch.empty_like(k1, memory_format=torch.contiguous_format) if k2 is not None else k1.new_empty(0),
        torch.empty_like(v, memory_format=torch.contiguous_format),
        lam.new_empty(lam.shape),
    )


def _setup_context(ctx, inputs, output):
    q1, k1, q2, k2, v, lam, mask, causal, scale, save_parts, _v2, segments, variants = inputs
    _, o1, o2, lse1, lse2 = output
    ctx.save_for_backward(q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, segments)
    ctx.causal, ctx.scale, ctx.save_parts, ctx.variants = causal, scale, save_parts, variants
    # the atomic or deterministic backward is not chosen here but when the backward runs (_bwd_op), so that
    # torch.use_deterministic_algorithms(True) set between forward and backward is obeyed, as by PyTorch's own ops


def _backward(ctx, dout, _do1, _do2, _dlse1, _dlse2, bwd=None):
    # o1, o2, lse1, lse2 are internal outputs that nothing differentiates; their cotangents are ignored. ``bwd``: the
    # backward's implementation (default the custom op, what torch.compile sees; eager training calls it directly)
    if not ctx.save_parts:
        raise RuntimeError("diffattn triton: backward through a forward that was run without saving for it")
    q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, segments = ctx.saved_tensors
    dq1, dk1, dq2, dk2, dv, dlam = (bwd or _bwd_op)(
        dout, q1, k1, q2, k2, v, lam, mask, o1, o2, lse1, lse2, ctx.causal, ctx.scale, True, segments, ctx.variants
    )
    # no gradient for mask, causal, scale, save_parts, v2 (a forward without gradient only), segments, variants
    return dq1, dk1, None if q2 is None else dq2, None if k2 is None else dk2, dv, dlam, *(None,) * 7


torch.library.register_autograd("diffattn::triton_diff_attn_fwd", _backward, setup_context=_setup_context)


#: the custom op's forward and backward for eager training, without its dispatch (:mod:`.eager`): the custom op's
#: autograd path costs about 190 µs more host time a call on this project's CPU (the fused epilogue's measurement,
#: benchmarks/RESULTS.md), per layer and step of a host-bound training step; the same implementations, so the same
#: numbers, and torch.compile still sees the custom op
_EagerTraining = eager_twin("_EagerTraining", _fwd_impl, _setup_context, _backward, _bwd_impl)


def diff_attention_triton(inp: DiffAttentionInputs, variants: int = 0) -> torch.Tensor:
    """The ``triton`` backend. ``inp`` has passed :func:`diffattn.ops._inputs.validate` and the support check
    of :mod:`diffattn.ops` (dtype, head dims, device). ``variants``: the variants this call's forward and backward
    switch on (:func:`diffattn.ops.routes.variant_bits` of a route ``triton[NAME]``; 0: the settings of
    :mod:`.tuning` alone)."""
    h = inp.num_heads
    need_grad = inp.wants_grad
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
    # the custom op under torch.compile; eager training its autograd Function (a fraction of its host time); a
    # forward without gradient the kernels alone
    forward = choose(_fwd_op, _EagerTraining, _fwd_impl, need_grad)
    out, *_ = forward(
        q1, k1, q2, k2, v, lam, inp.attn_mask, inp.causal, inp.scale, need_grad, v2, inp.segment_ids, variants
    )
    return out
