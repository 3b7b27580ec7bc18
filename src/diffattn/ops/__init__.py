"""Two-map (differential) attention, the one primitive every method of this library reduces to.

    out = softmax(Q1 K1ᵀ·s + M) V − λ · softmax(Q2 K2ᵀ·s + M) V          (DIFF Transformer Eq. 1,
                                                                          docs/methods.md §0)

Public entry points:

* :func:`diff_attention` — the op, with a ``backend`` switch: ``reference`` (fp32 math), ``sdpa`` (PyTorch's fused
  attention, one call over both maps), ``cudnn`` (that call forced to cuDNN, V wider than Q and K), ``sdpa_split`` (one
  call per slice of V), ``sdpa_maps`` / ``cudnn_maps`` (one call per map, nothing concatenated), ``chunked`` (query
  chunks with a shared-product backward; the CPU's fastest where the maps read separate K), ``triton`` (one fused kernel
  for both maps, forward and backward: :mod:`diffattn.ops.triton`; ``triton[NAME]``: with its variants NAME switched on
  for the call, :data:`diffattn.ops.routes.TRITON_VARIANTS`), ``<route>+epilogue`` (an SDPA route whose subtraction
  O1 − λ·O2 is one Triton kernel: :mod:`diffattn.ops.triton.epilogue`), ``cudnn_direct`` (``cudnn+epilogue``'s
  kernels as one autograd node in training, less host work: :mod:`diffattn.ops.direct`), ``cudnn_shared_v`` and
  ``cudnn_shared_v_split`` (the same node for DIFF V1 in interleaved pairs, V read once by cuDNN's grouped heads:
  :func:`diff_attention_pairs`), ``auto`` (on CUDA the fastest correct route measured on this GPU model with this
  software: the route table, :mod:`diffattn.ops.routes`; on a CPU ``chunked`` where the maps read separate K and
  ``sdpa`` where they share it; elsewhere ``sdpa``).
* :func:`diff_attention_stacked` and :func:`diff_attention_pairs` — the op on Q and K handed over whole, in DIFF
  V1's layout (both maps' heads stacked, DiffLlama) or DIFF V2's (query heads in interleaved pairs on one K): the
  same function, whose one-call routes read the caller's tensors instead of copies joined from the two maps' cuts.
* :func:`diff_attention_maps` — the same computation through ``reference``, also returning both maps and the
  signed map A1 − λA2 for analysis.
* :func:`backend_status` — which backends are usable here, and why not.

Masks: every backend masks the same keys and gives a query row whose every key is masked the same answer — it
attends to nothing: output 0, no gradient to q1, k1, q2, k2, v or λ, and zero maps — for bool masks, ``-inf``
additive masks and additive masks at transformers' ``finfo(dtype).min``. The rule, with its threshold for
additive masks, is stated once, in :mod:`diffattn.ops._inputs`.

Sequence packing: ``segment_ids`` (each key's document, [B, S]) masks every key of another document. The fused
kernel compares them per tile and skips tiles with no document in common, never forming a [T, S] mask; the other
backends fold them into their mask (:func:`diffattn.ops._inputs.with_segment_mask`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _inputs, call_plans
from ._inputs import (
    DiffAttentionInputs,
    HeadNorm,
    causal_keep_mask,
    hidden_keys,
    interleaved_pair,
    packed_mask_segments,
    pairs_cut,
    segments_from_position_ids,
    stacked_cut,
    validate,
    with_packed_segments,
    with_segment_mask,
)
from .chunked import diff_attention_chunked
from .direct import diff_attention_cudnn_direct, diff_attention_cudnn_shared_v, diff_attention_cudnn_shared_v_split
from .reference import DiffAttentionMaps, diff_attention_reference, output_through_maps
from .routes import (
    DIRECT,
    EPILOGUE,
    EPILOGUE_ROUTES,
    FORCED_FLAGS,
    ONE_NODE_ROUTES,
    ORDER_MEMO,
    ROUTE_NAMES,
    SAFE_DEFAULT,
    SHARED_V,
    SHARED_V_SPLIT,
    TRITON_VARIANTS,
    call_class,
    decoding_eagerly,
    decoding_of,
    error_line,
    fused_route_bits,
    head_norm_in_epilogue,
    is_triton_route,
    poisons_cuda_context,
    read_class,
    runs_epilogue,
    table_routes,
    without_size,
)
from .sdpa import (
    cudnn_unsupported,
    diff_attention_cudnn,
    diff_attention_cudnn_maps,
    diff_attention_sdpa,
    diff_attention_sdpa_maps,
    diff_attention_sdpa_split,
    maps_unsupported,
    split_unsupported,
)

__all__ = [
    "BACKENDS",
    "BackendStatus",
    "DiffAttentionMaps",
    "HeadNorm",
    "auto_backend",
    "backend_status",
    "causal_keep_mask",
    "diff_attention",
    "diff_attention_maps",
    "diff_attention_pairs",
    "diff_attention_stacked",
    "fused_head_norm",
    "fused_lambda",
    "fused_v_copies",
    "hidden_keys",
    "interleaved_pair",
    "lambda_per_layer",
    "output_through_maps",
    "packed_mask_segments",
    "pairs_layout",
    "segments_from_position_ids",
    "triton_unsupported",
    "with_packed_segments",
]

logger = logging.getLogger(__name__)

#: what ``backend=`` takes (besides the fused kernel's variants, ``triton[NAME]``): ``auto`` and every route
BACKENDS = ("auto", *ROUTE_NAMES)


@dataclass(frozen=True)
class BackendStatus:
    name: str
    usable: bool
    reason: str


# What the fused Triton kernel accepts (diffattn/ops/triton/). Head dims are padded to a power of two
# >= 16 inside the kernel; beyond these widths the two fp32 accumulators per row no longer fit a tile.
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the widest value head the fused epilogue takes (one row of dv elements is one tile row of its kernels)
EPILOGUE_MAX_V_DIM = 1024
TRITON_MAX_HEAD_DIM = 128
TRITON_MAX_V_DIM = 256
_TRITON_MODULE = __name__ + ".triton.tuning"  # holds INTERPRETED; .triton.launch imports it with the kernels


def _triton_import_error() -> str | None:
    try:
        importlib.import_module("triton")
    except Exception as err:  # ImportError, or a broken install raising something else at import
        return f"triton is not importable ({type(err).__name__}: {err}); install it with `pip install triton`"
    return None


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _triton_device_reason(device: torch.device) -> str | None:
    """Why the Triton kernel cannot run on ``device`` (None if it can). ``triton.jit`` decides compiled vs
    interpreted when our kernel module is first imported, so that moment's mode is what counts afterwards."""
    return _triton_device_reason_by_type(device.type)


def _triton_device_reason_by_type(device_type: str) -> str | None:
    # cheap device checks first: a CPU without the interpreter needs no triton import to be refused
    if device_type == "cpu" and not _interpret_env():
        return (
            "device cpu: the Triton kernel runs on CUDA, or on CPU only under Triton's (slow) interpreter — "
            "set TRITON_INTERPRET=1 before first use"
        )
    if device_type == "cuda" and not torch.cuda.is_available():
        return "device cuda was asked for but CUDA is not available"
    if device_type not in ("cuda", "cpu"):
        return f"device {device_type} is not supported by the Triton kernel (CUDA, or CPU with TRITON_INTERPRET=1)"
    err = _triton_import_error()
    if err:
        return err
    loaded = sys.modules.get(_TRITON_MODULE)
    interpreted = loaded.INTERPRETED if loaded is not None else _interpret_env()
    if device_type == "cuda" and interpreted:
        return (
            "TRITON_INTERPRET=1 is set (or was when the kernels were first imported): they run in Triton's "
            "CPU interpreter; unset it in a fresh process for compiled CUDA kernels"
        )
    if device_type == "cpu" and not interpreted:
        return "device cpu: the kernels were already compiled for CUDA in this process (TRITON_INTERPRET was unset)"
    return None


# torch.compile cannot trace imports and sys.modules, so these run at trace time and their result is taken as a
# constant. This is what torch.compiler.assume_constant_result does; setting its flag directly avoids importing
# torch._dynamo (about 3 s) whenever diffattn.ops is imported.
_triton_device_reason_by_type._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _cuda_major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]


_cuda_major._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _triton_kernel_reasons(inp: DiffAttentionInputs, max_v_dim: int) -> list[str]:
    """What keeps any Triton kernel of this package from these inputs: the device, the dtype, bf16 below sm_80, and
    a value head wider than ``max_v_dim``."""
    reasons = []
    device_reason = _triton_device_reason(inp.q1.device)
    if device_reason:
        reasons.append(device_reason)
    if inp.q1.dtype not in TRITON_DTYPES:
        reasons.append(f"dtype {inp.q1.dtype} is not supported (float16, bfloat16, float32)")
    if inp.v_dim > max_v_dim:
        reasons.append(f"value head dim dv={inp.v_dim} is not supported (dv <= {max_v_dim})")
    if device_reason is None and inp.q1.device.type == "cuda" and inp.q1.dtype == torch.bfloat16:
        major = _cuda_major(inp.q1.device.index)
        if major < 8:
            reasons.append(f"bfloat16 needs a GPU of compute capability >= 8.0, this one is {major}.x")
    return reasons


def triton_unsupported(inp: DiffAttentionInputs) -> str | None:
    """Why the ``triton`` backend cannot run these inputs — naming each unsupported dtype, head dim, device or
    layout — or None if it can."""
    reasons = _triton_kernel_reasons(inp, TRITON_MAX_V_DIM)
    if inp.head_dim > TRITON_MAX_HEAD_DIM:
        reasons.append(f"head dim d={inp.head_dim} is not supported (d <= {TRITON_MAX_HEAD_DIM})")
    if inp.attn_mask is not None and inp.attn_mask.requires_grad:
        reasons.append("layout: an additive attn_mask that requires grad (the kernel gives the mask no gradient)")
    return "; ".join(reasons) or None


_LOGGED_FALLBACKS: set[str] = set()


def _log_auto_fallback(reason: str) -> bool:
    # once per distinct reason: auto runs in every layer of every step
    if reason not in _LOGGED_FALLBACKS:
        _LOGGED_FALLBACKS.add(reason)
        logger.info("diff_attention backend auto: %s", reason)
    return True


_log_auto_fallback._dynamo_marked_constant = True  # type: ignore[attr-defined]  # logs at trace time, no break


def _triton_status(device: torch.device) -> BackendStatus:
    reason = _triton_device_reason(device)
    if reason:
        return BackendStatus("triton", False, reason)
    mode = "Triton interpreter (slow, for tests)" if device.type == "cpu" else "compiled"
    return BackendStatus(
        "triton",
        True,
        f"fused two-map kernel, forward + backward ({mode}); fp16/bf16/fp32, d <= {TRITON_MAX_HEAD_DIM}, "
        f"dv <= {TRITON_MAX_V_DIM}",
    )


def _triton_impl(inp: DiffAttentionInputs, variants: int = 0) -> torch.Tensor:
    # imported on first use: triton.jit fixes compiled vs interpreted at import (see _triton_device_reason)
    from .triton.launch import diff_attention_triton

    return diff_attention_triton(inp, variants)


def backend_status(device: torch.device | str | None = None) -> list[BackendStatus]:
    """Usability of each concrete backend on ``device`` (default: CUDA if present, else CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    statuses = [
        BackendStatus("reference", True, "fp32 math on any device; materialises both [T, S] maps"),
        BackendStatus("sdpa", True, f"torch.nn.functional.scaled_dot_product_attention on {device.type}"),
        _cudnn_status(device),
        BackendStatus("sdpa_split", True, "one SDPA call per slice of V as wide as Q and K (DIFF V1: dv = 2d)"),
        BackendStatus("sdpa_maps", True, "one SDPA call per map (and slice of V as wide as Q), nothing concatenated"),
        _cudnn_status(
            device, "cudnn_maps", "one call per map forced to cuDNN attention, V whole, nothing concatenated"
        ),
        BackendStatus("chunked", True, "query chunks in PyTorch ops, shared dO·Vᵀ backward; fastest on CPU"),
        _triton_status(device),
    ]
    # an epilogue route runs where the Triton kernels and its route both can: the route's reason where it cannot (on
    # a CPU "cuDNN attention runs on CUDA", not how the epilogue's Triton kernel could run there), else the kernels'
    by_name = {status.name: status for status in statuses}
    kernels = _triton_device_reason(device)

    def why_not(route: str) -> str | None:
        return (None if by_name[route].usable else by_name[route].reason) or kernels

    for route in EPILOGUE_ROUTES:
        why = why_not(route)
        what = f"the {route} route with O1 − λ·O2 as one Triton kernel, forward and backward"
        statuses.append(BackendStatus(route + EPILOGUE, why is None, why or what))
    why = why_not("cudnn")
    what = "cudnn+epilogue's kernels as one autograd node in training (less host work), without a mask"
    statuses.append(BackendStatus(DIRECT, why is None, why or what))
    what = "DIFF V1 in interleaved pairs: one cuDNN call reading V once for both maps, and the epilogue, one node"
    statuses.append(BackendStatus(SHARED_V, why is None, why or what))
    what = "cudnn_shared_v with one cuDNN call per column slice of V as wide as Q (dv = 2d)"
    statuses.append(BackendStatus(SHARED_V_SPLIT, why is None, why or what))
    return statuses


_IMPLS: dict[str, Callable[[DiffAttentionInputs], torch.Tensor]] = {
    "reference": diff_attention_reference,
    "sdpa": diff_attention_sdpa,
    "cudnn": diff_attention_cudnn,
    "sdpa_split": diff_attention_sdpa_split,
    "sdpa_maps": diff_attention_sdpa_maps,
    "cudnn_maps": diff_attention_cudnn_maps,
    "chunked": diff_attention_chunked,
    "triton": _triton_impl,
}
_IMPLS.update({route + EPILOGUE: functools.partial(_IMPLS[route], fused_epilogue=True) for route in EPILOGUE_ROUTES})
_IMPLS[DIRECT] = diff_attention_cudnn_direct
_IMPLS[SHARED_V] = diff_attention_cudnn_shared_v
_IMPLS[SHARED_V_SPLIT] = diff_attention_cudnn_shared_v_split


def _impl(name: str) -> Callable[..., torch.Tensor]:
    """Route ``name``'s implementation: :data:`_IMPLS`'s, or for a variant or decoding route of the fused kernel
    (``triton[NAME]``, ``triton[decode vec x64 w4 s2 splits 8]``: :func:`diffattn.ops.routes.fused_route_bits`) the
    fused kernel with its choices, made once per name (a decoding candidate the kernels do not have: ValueError)."""
    impl = _IMPLS.get(name)
    if impl is None:
        variants = fused_route_bits(name)
        if variants is None:
            raise ValueError(f"no route {name!r}")
        from .triton.tuning import check_decoding  # imports Triton: only for a route of the fused kernel

        check_decoding(variants)
        impl = _IMPLS[name] = functools.partial(_triton_impl, variants=variants)
    return impl


def _cudnn_status(
    device: torch.device,
    name: str = "cudnn",
    what: str = "one SDPA call over both maps forced to cuDNN attention, V wider than Q and K",
) -> BackendStatus:
    if device.type != "cuda":
        return BackendStatus(name, False, f"device {device.type}: cuDNN attention runs on CUDA")
    if not torch.backends.cudnn.is_available():
        return BackendStatus(name, False, "this torch has no cuDNN")
    return BackendStatus(name, True, f"{what} (cuDNN {torch.backends.cudnn.version()})")


def epilogue_unsupported(inp: DiffAttentionInputs) -> str | None:
    """Why the fused epilogue (:mod:`diffattn.ops.triton.epilogue`) cannot take these inputs, or None."""
    reasons = _triton_kernel_reasons(inp, EPILOGUE_MAX_V_DIM)
    return "; ".join(f"fused epilogue: {r}" for r in reasons) or None


def route_unsupported(name: str, inp: DiffAttentionInputs) -> str | None:
    """Why route ``name`` cannot take these inputs, or None."""
    if name.endswith(EPILOGUE):
        reasons = [route_unsupported(name.removesuffix(EPILOGUE), inp), epilogue_unsupported(inp)]
        return "; ".join(r for r in reasons if r) or None
    if name in ONE_NODE_ROUTES:  # where the one node does not apply they run cudnn+epilogue: they take what it takes
        return route_unsupported("cudnn" + EPILOGUE, inp)
    if is_triton_route(name):
        return triton_unsupported(inp) or _decoding_unknown(name)
    if name in ("cudnn", "cudnn_maps"):
        return cudnn_unsupported(inp)
    if name == "sdpa_split":
        return split_unsupported(inp)
    if name == "sdpa_maps":
        return maps_unsupported(inp)
    return None


def _decoding_unknown(name: str) -> str | None:
    """Why fused-kernel route ``name`` names a decoding candidate the kernels do not have (a table measured before
    the candidate was dropped: :func:`diffattn.ops.triton.tuning.check_decoding`), or None: so that auto skips it
    before it runs — under torch.compile, where nothing is handed over at run time, as in eager mode."""
    variants = fused_route_bits(name)
    if not variants or decoding_of(variants)[0] is None:
        return None
    from .triton.tuning import check_decoding  # Triton is importable here: triton_unsupported said so

    try:
        check_decoding(variants)
    except ValueError as err:
        return str(err)
    return None


#: (route, call class without its size) → the error it raised at run time in this process: auto does not try it on
#: that class again
_FAILED_ROUTES: dict[tuple[str, str], str] = {}


def auto_routes(inp: DiffAttentionInputs, cls: str | None = None) -> list[str]:
    """The routes ``backend="auto"`` would try for ``inp``, in order, each usable for these inputs (the last one is
    always usable). CPU: ``chunked`` (measured 1.28× a same-size baseline forward+backward at N = 2048 against
    1.86–1.97× for ``sdpa``; the Triton interpreter is for tests only), except when both maps read the same K, where
    ``sdpa``'s one call over interleaved query heads measured 1.70–2.42× against 2.24–2.70× (benchmarks/RESULTS.md).
    CUDA: the route table's routes for this call class, fastest first (:mod:`diffattn.ops.routes`: measured on
    this GPU model with this software by ``make gpu-report``), then ``sdpa``; routes that cannot take the inputs,
    or failed at run time on this class before, are left out (the first time with one log line). ``cls``: the call
    class if the caller has it (:func:`diffattn.ops.routes.call_class`)."""
    device = inp.q1.device
    if device.type == "cpu":
        return ["sdpa" if inp.shares_keys else "chunked"]
    if device.type != "cuda":
        return ["sdpa"]
    return table_order(inp, cls)


def table_order(inp: DiffAttentionInputs, cls: str | None = None) -> list[str]:
    """The route table's routes for ``inp``'s call class that can take it, fastest first (the CUDA half of
    :func:`auto_routes`). Worked out once per call class and what else the routes' checks read — the device, GQA,
    a mask that needs a gradient, the routes failed so far — and remembered until :func:`diffattn.ops.routes.reset`:
    every layer of every step asks (on a 2-core CPU the checks of a class's ten listed routes cost ~29 µs a call, in a
    training step whose host time decides it). What a process does not change is taken as fixed: the GPU's compute
    capability, the Triton kernels compiled or interpreted (a test that fakes another machine resets)."""
    cls = cls or call_class(inp)
    compiling = torch.compiler.is_compiling()  # traced once anyway: no memo, and nothing of it in the graph's guards
    eager = decoding_eagerly(cls)  # a decoding call run eagerly reads its class's order by eager time
    if not compiling:
        key = (cls, inp.q1.device.type, inp.q1.device.index, inp.num_heads, inp.num_kv_heads,
               inp.attn_mask is not None and inp.attn_mask.requires_grad, tuple(_FAILED_ROUTES), eager)  # fmt: skip
        if key in ORDER_MEMO:
            return list(ORDER_MEMO[key])
    usable = []
    for name in table_routes(inp, cls, eager):
        reason = route_unsupported(name, inp) or _FAILED_ROUTES.get((name, without_size(cls)))
        if reason is None:
            usable.append(name)
        else:
            _log_auto_fallback(f"{name} skipped for {cls}: {reason}")
    order = usable or [SAFE_DEFAULT]
    if not compiling:
        ORDER_MEMO[key] = tuple(order)
    return order


def auto_backend(device: torch.device, inp: DiffAttentionInputs | None = None) -> str:
    """What ``backend="auto"`` runs first (:func:`auto_routes`). Without ``inp``: ``chunked`` on CPU, else ``sdpa``."""
    if inp is None:
        return "chunked" if device.type == "cpu" else SAFE_DEFAULT
    return auto_routes(inp)[0]


def route_choice_line(index: int | None, cls: str, names: list[str], eager: bool = False) -> str:
    """What auto runs for a call of class ``cls`` on CUDA device ``index``, in one line: the route, the order (by
    eager time: ``eager``, :func:`diffattn.ops.routes.decoding_eagerly`), and the table's class it was read from where
    that is not ``cls`` (:func:`diffattn.ops.routes.near_classes`)."""
    read = read_class(index, cls)
    source = "" if read == cls else f"; read from the table's {read!r}, which has no {cls!r}"
    order = "route order by eager time" if eager else "route order"
    return f"{cls} runs {names[0]} ({order}: {', '.join(names)}{source})"


def _run_auto(inp: DiffAttentionInputs, head_norm: HeadNorm | None = None) -> torch.Tensor:
    """Run the first of :func:`auto_routes`; on CUDA a route that raises (compile error, launch error, out of
    resources, a kernel cuDNN refuses) hands over to the next one with one log line naming the error, and is not
    tried again for this call class. Not under torch.compile (no try there: the first route runs) and not for an
    error that poisons the CUDA context (nothing after it could run). Out of memory is the caller's to see."""
    cls = call_class(inp) if inp.q1.device.type == "cuda" else None  # the class decides only on CUDA
    names = auto_routes(inp, cls)
    if cls is not None:
        _log_auto_fallback(route_choice_line(inp.q1.device.index, cls, names, decoding_eagerly(cls)))
    for i, name in enumerate(names):
        impl_inp = inp if is_triton_route(name) else with_segment_mask(inp)
        if i == len(names) - 1 or torch.compiler.is_compiling():
            return _call_route(name, impl_inp, head_norm)
        try:
            return _call_route(name, impl_inp, head_norm)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            text = error_line(err)
            if poisons_cuda_context(text):
                raise
            cls = cls or call_class(inp)  # a failure is rare: the class is computed here off CUDA
            # kept per class whatever the size: what fails to compile or launch depends on the widths, dtype and mask
            _FAILED_ROUTES[(name, without_size(cls))] = f"failed at run time ({text})"
            call_plans.forget()  # a plan may have been made of that route's node
            logger.warning(
                "diff_attention backend auto: route %s failed for %s (%s); using %s from now on",
                name,
                cls,
                text,
                names[i + 1],
            )
    raise AssertionError("unreachable: the last route runs without a try")


def _resolve(backend: str, inp: DiffAttentionInputs) -> str:
    """An explicit backend (not ``auto``: :func:`_run_auto`), refused in one line where it cannot take ``inp``."""
    if not isinstance(backend, str) or (backend not in BACKENDS and fused_route_bits(backend) is None):
        raise ValueError(
            f"backend must be one of {', '.join(BACKENDS)}, or triton[NAME] / triton[A+B] for the fused kernel's "
            f"variants {', '.join(TRITON_VARIANTS)}, or a decoding route triton[splits N] / triton[decode 16xBN wW "
            f"sS] / triton[decode vec xBN wW sS] (… splits N); got {backend!r}"
        )
    reason = route_unsupported(backend, inp)
    if reason:
        raise ValueError(f"backend {backend!r} is not usable: {reason}")
    return backend


def diff_attention(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    segment_ids: torch.Tensor | None = None,
    head_norm: HeadNorm | None = None,
) -> torch.Tensor:
    """Differential attention ``softmax(q1 k1ᵀ·s + M) v − lam · softmax(q2 k2ᵀ·s + M) v``.

    Args:
        q1, q2: queries of the two maps, ``[B, H, T, d]``.
        k1, k2: keys of the two maps, ``[B, Hkv, S, d]``; ``H % Hkv == 0`` (GQA).
        v: shared values ``[B, Hkv, S, dv]``; ``dv`` may differ from ``d``. Or a pair ``(va, vb)`` with
            ``V = [va | vb]`` along the feature axis: the triton backend reads two halves of one tensor in place
            (a forward without gradient: DiffLlama's decoding), the others concatenate them.
        lam: λ — a float, a scalar tensor, or one value per query head ``[H]``. Gradients flow into it.
        causal: causal mask, aligned bottom-right when ``T < S`` (decoding against a KV cache:
            query i sees keys ``j <= i + S − T``).
        attn_mask: optional extra mask, combined with ``causal``: 2-D ``[B, S]`` key padding (True/1 = real
            token) or 4-D broadcastable to ``[B, H, T, S]``; bool = may attend, float = additive. Which keys it
            masks (an additive value at or below ``finfo(dtype).min / 2`` does) and what a row with every key
            masked gives (0, and no gradient): the rule in :mod:`diffattn.ops._inputs`.
        scale: logit scale ``s``; default ``1/sqrt(d)``.
        segment_ids: optional ``[B, S]`` integer document of each key (sequence packing, e.g.
            :func:`segments_from_position_ids` of transformers' packed position ids): a query attends only to keys
            of its own document (query i is key i + S − T), combined with ``causal`` and ``attn_mask``. The
            triton backend reads them per tile without forming a [T, S] mask.
        head_norm: optional :class:`HeadNorm` (DIFF Eq. 3's RMSNorm without a gain and the multiplier after it),
            applied to the output by the op: inside the ``<route>+epilogue`` routes' one kernel where the route
            table switches that on for the device (:func:`diffattn.ops.routes.head_norm_in_epilogue`), else by
            PyTorch after the route. The same output either way within the rounding of its dtype.
        backend: ``"auto"`` (``chunked`` on CPU; on CUDA the route table's fastest route for this call class that
            takes the inputs, else ``sdpa``: :func:`auto_routes`),
            or any one of :data:`BACKENDS` by name, or a variant route of the fused kernel, ``triton[NAME]`` or
            ``triton[A+B]`` (:data:`diffattn.ops.routes.TRITON_VARIANTS`: e.g. ``"triton[tma+btma]"``, its forward
            and backward by TMA tiles), which the route table names where a GPU measured it fastest.

    Returns:
        ``[B, H, T, dv]`` in the dtype of ``q1``. λ and the subtraction are computed in float32. Under
        ``torch.autocast`` the op is one of autocast's lower-precision ops, like ``scaled_dot_product_attention``:
        q1, k1, q2, k2 and v are cast to the autocast dtype and the op runs as it would on those outside autocast
        (mixed-precision training, the trainer's default on a GPU, hands it Q and K in float32 from RoPE and V in
        bfloat16 from its projection). Differentiable once through ``chunked``, ``triton`` and the
        ``<route>+epilogue`` routes, whose backwards are kernels: a second derivative (``create_graph=True``, e.g. a
        gradient penalty) raises there; ``reference`` and the plain SDPA routes as far as PyTorch's kernels allow.

    Raises:
        ValueError: naming the argument, what was given and what is allowed.
    """
    return _validated_run(backend, lambda q1, k1, q2, k2, v: ((q1, k1, q2, k2, v), {}), (q1, k1, q2, k2, v), lam,
                          causal=causal, attn_mask=attn_mask, scale=scale, segment_ids=segment_ids,
                          head_norm=head_norm)  # fmt: skip


def diff_attention_pairs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    segment_ids: torch.Tensor | None = None,
    head_norm: HeadNorm | None = None,
) -> torch.Tensor:
    """Differential attention over query heads in interleaved pairs: ``q`` [B, 2H, T, d] holds map 1 and map 2 of
    head i at query heads 2i and 2i + 1, and ``v`` [B, Hkv, S, dv] serves both maps. ``k`` either serves both maps
    too, [B, Hkv, S, d] (DIFF V2, docs/methods.md §5), or is in pairs like ``q``, [B, 2Hkv, S, d]: map 1 and map 2 of
    key head j at 2j and 2j + 1 (DIFF V1 in the official DIFF code's layout, docs/methods.md §1: its Q and K viewed
    as 2H heads and V as H heads of width 2d; told apart by K having twice V's heads). The same as
    :func:`diff_attention` with ``q1, q2 = interleaved_pair(q, 1)`` and ``k1 = k2 = k`` — or ``k1, k2 =
    interleaved_pair(k, 1)`` — (every other argument as there), except that a route making one call over both maps'
    query heads reads ``q`` (and ``k``) as it is instead of stacking the maps into it again: DIFF V2's one-call
    routes, and for DIFF V1 ``cudnn_shared_v`` — one cuDNN call whose grouped heads read V's head j for both maps'
    query heads 2j and 2j + 1, with no [V; V] (:mod:`diffattn.ops.direct`).

    Returns:
        ``[B, H, T, dv]`` in the dtype of ``q``.
    """
    options = dict(causal=causal, attn_mask=attn_mask, scale=scale, segment_ids=segment_ids, head_norm=head_norm)
    return _planned("pairs", _pairs_whole, backend, q, k, v, lam, options)


def _planned(entry: str, whole, backend: str, q, k, v, lam, options: dict) -> torch.Tensor:
    """``whole(backend, q, k, v, lam, **options)`` — the op's whole path for the entry ``entry`` — or, where a call of
    the same signature went straight to one autograd node before, that node; or, where a call without gradient of the
    same signature (with its mask's layout) was decided before, the route it ran (:mod:`diffattn.ops.call_plans`)."""
    key = call_plans.signature(entry, backend, q, k, v, lam, **options)
    route_key = call_plans.route_signature(key, entry, backend, q, k, v, lam, **options)
    plan = call_plans.route_plan(route_key)
    if plan is not None:  # a call without gradient whose route was decided before (call_plans: route plans)
        out = _by_route_plan(plan, q, k, v, lam, options)
        if out is not None:
            return out
    if key is None:
        return call_plans.planned_route(route_key, (q, k, v, lam), options["attn_mask"],
                                        lambda: whole(backend, q, k, v, lam, **options))  # fmt: skip
    if call_plans.under_autocast(key):  # cast as the whole path casts (a no-op there then): the node's own inputs
        q, k, _, _, v = _autocast_inputs(q, k, q, k, v)
    out = call_plans.run(key, q, k, v, lam)
    if out is not None:
        return out
    return call_plans.planned_route(
        route_key, (q, k, v, lam), options["attn_mask"],
        lambda: call_plans.planned(key, (q, k, v, lam), lambda: whole(backend, q, k, v, lam, **options)),
    )  # fmt: skip


def _by_route_plan(plan, q, k, v, lam, options: dict) -> torch.Tensor | None:
    """The call by its route plan (:mod:`diffattn.ops.call_plans`): the remembered route on the inputs validate made
    before, made again from these tensors; None where the route raised (the plans forgotten: the whole path then
    answers it as it always does — auto's next route, or the error). Out of memory is the caller's to see."""
    _inputs.check_lambda_finite(lam)  # (through its module: the one name a benchmark replaces)
    inp = call_plans.plan_inputs(plan, q, k, v, lam, options["attn_mask"])
    try:
        return _call_route(plan.route, inp, options["head_norm"])
    except torch.OutOfMemoryError:
        raise
    except Exception:
        call_plans.forget()
        return None


def _pairs_whole(backend, q, k, v, lam, *, causal, attn_mask, scale, segment_ids, head_norm) -> torch.Tensor:
    """:func:`diff_attention_pairs`'s whole path."""
    k_in_pairs = all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in (k, v)) and k.shape[1] == 2 * v.shape[1]

    def arrange(q, k, _q, _k, v):
        return pairs_cut(q, k, v, k_in_pairs)

    _check_heads_in_twos("q", q, "[B, 2H, T, d], an even number of query heads in pairs")
    return _validated_run(backend, arrange, (q, k, q, k, v), lam, causal=causal, attn_mask=attn_mask, scale=scale,
                          segment_ids=segment_ids, head_norm=head_norm)  # fmt: skip


def diff_attention_stacked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    segment_ids: torch.Tensor | None = None,
    head_norm: HeadNorm | None = None,
) -> torch.Tensor:
    """Differential attention over both maps' heads stacked, as DIFF V1 lays them out (DiffLlama, docs/methods.md
    §1): ``q`` [B, 2H, T, d] holds map 1's H query heads, then map 2's; ``k`` [B, 2Hkv, S, d] map 1's key heads, then
    map 2's; ``v`` as in :func:`diff_attention` — or in this layout too, V's two column halves stacked as heads,
    [B, 2Hkv, S, dv/2] (DiffLlama's V: DIFF head j reads ``[v_j | v_(j + Hkv)]``), the pair ``v.chunk(2, dim=1)``.
    The same as :func:`diff_attention` with ``q1, q2 = q.chunk(2, dim=1)`` and ``k1, k2 = k.chunk(2, dim=1)`` (every
    other argument as there), except that a route making one call over both maps' query heads (``sdpa``, ``cudnn``,
    ``sdpa_split``) reads ``q`` and ``k`` as they are instead of concatenating the chunks back into copies of them — a
    copy of each forward and one of each gradient backward — and builds the V it needs for both maps' heads (V twice)
    from V's stacked halves in one copy, not by joining them and then doubling the join.

    Returns:
        ``[B, H, T, dv]`` in the dtype of ``q``.
    """
    options = dict(causal=causal, attn_mask=attn_mask, scale=scale, segment_ids=segment_ids, head_norm=head_norm)
    return _planned("stacked", _stacked_whole, backend, q, k, v, lam, options)


def _stacked_whole(backend, q, k, v, lam, *, causal, attn_mask, scale, segment_ids, head_norm) -> torch.Tensor:
    """:func:`diff_attention_stacked`'s whole path."""
    _check_heads_in_twos("q", q, "[B, 2H, T, d], map 1's query heads then map 2's")
    _check_heads_in_twos("k", k, "[B, 2Hkv, S, d], map 1's key heads then map 2's")
    v_heads = v.shape[1] if isinstance(v, torch.Tensor) and v.dim() == 4 else None  # None: a pair, or refused later
    halves_stacked = v_heads == k.shape[1]  # V's column halves stacked as heads, as DiffLlama has them

    def arrange(q, k, _q, _k, v):
        return stacked_cut(q, k, v, halves_stacked)

    if v_heads is not None and not halves_stacked and v_heads != k.shape[1] // 2:
        raise ValueError(
            f"v must be V [B, Hkv, S, dv] = [.., {k.shape[1] // 2}, ..] or its two column halves stacked as heads "
            f"[B, 2Hkv, S, dv/2] = [.., {k.shape[1]}, ..] (k holds both maps' 2Hkv = {k.shape[1]} key heads), got "
            f"{tuple(v.shape)}"
        )
    return _validated_run(backend, arrange, (q, k, q, k, v), lam, causal=causal, attn_mask=attn_mask, scale=scale,
                          segment_ids=segment_ids, head_norm=head_norm)  # fmt: skip


def _check_heads_in_twos(name: str, x, layout: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] % 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be {layout}, got {shape}")


def _validated_run(backend: str, arrange, tensors: tuple, lam, head_norm: HeadNorm | None = None, **options):
    """``arrange(*tensors)`` → ((q1, k1, q2, k2, v), the caller's whole tensors for :func:`validate`), validated and run
    on ``backend`` (then ``head_norm``, where given): under autocast with the tensors cast to its dtype first and
    autocast off inside, like ``scaled_dot_product_attention``."""
    if head_norm is not None and not isinstance(head_norm, HeadNorm):
        raise ValueError(f"head_norm must be a diffattn.ops.HeadNorm or None, got {type(head_norm).__name__}")
    first = tensors[0]
    # the meta device has no autocast (asking raises): a model counted there (FLOPs, shapes) runs the op as it is
    if isinstance(first, torch.Tensor) and first.device.type != "meta" and torch.is_autocast_enabled(first.device.type):
        if head_norm is not None:  # PyTorch's norm after a route runs under the caller's autocast, as a layer's did
            head_norm = _NormUnderAutocast(head_norm, first.device.type, torch.get_autocast_dtype(first.device.type))
        tensors = _autocast_inputs(*tensors)
        with torch.autocast(first.device.type, enabled=False):
            args, whole = arrange(*tensors)
            return _run(backend, validate(*args, lam, **whole, **options), head_norm)
    args, whole = arrange(*tensors)
    return _run(backend, validate(*args, lam, **whole, **options), head_norm)


def _run(backend: str, inp: DiffAttentionInputs, head_norm: HeadNorm | None = None) -> torch.Tensor:
    if backend == "auto":
        return _run_auto(inp, head_norm)
    name = _resolve(backend, inp)
    try:
        # only the fused kernel reads segments as such; every other backend takes them as a mask
        return _call_route(name, inp if is_triton_route(name) else with_segment_mask(inp), head_norm)
    except Exception as err:
        if not is_triton_route(name) and not runs_epilogue(name):
            raise
        if type(err).__module__.split(".")[0] != "triton":
            raise
        raise RuntimeError(_triton_build_error(err, name)) from err


@dataclass(frozen=True)
class _NormUnderAutocast:
    """A :class:`HeadNorm` whose PyTorch computation runs under the caller's autocast (the op runs with autocast off
    inside): the kernels and bits of the DIFF layer's own norm module under that autocast."""

    norm: HeadNorm
    device_type: str
    dtype: torch.dtype

    @property
    def eps(self) -> float:
        return self.norm.eps

    @property
    def scale(self) -> float:
        return self.norm.scale

    def apply(self, out: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.norm.apply(out)


def _call_route(name: str, inp: DiffAttentionInputs, head_norm: HeadNorm | None) -> torch.Tensor:
    """Route ``name`` on ``inp``, then ``head_norm``: inside an epilogue route's kernel where that is switched on for
    the device (:func:`diffattn.ops.routes.head_norm_in_epilogue`), else by PyTorch after the route."""
    call_plans.saw_route(name, inp)
    if head_norm is None:
        return _impl(name)(inp)
    if runs_epilogue(name) and head_norm_in_epilogue(inp.q1.device.index if inp.q1.is_cuda else None):
        return _impl(name)(inp, norm=(head_norm.eps, head_norm.scale))
    return head_norm.apply(_impl(name)(inp))


@contextlib.contextmanager
def _forced(flag: str, enabled: bool | None):
    before = FORCED_FLAGS[flag]
    FORCED_FLAGS[flag] = enabled
    try:
        yield
    finally:
        FORCED_FLAGS[flag] = before


def fused_head_norm(enabled: bool | None):
    """Within the block, the ``<route>+epilogue`` routes norm a :class:`HeadNorm` in their kernel (True) or leave it to
    PyTorch after them (False); None: as the route table says for the device (the default; see
    :func:`diffattn.ops.routes.table_flag`). For benchmarks that time both, and tests. Under torch.compile the
    setting at trace time is what the compiled code keeps."""
    return _forced("fused_head_norm", enabled)


def fused_v_copies(enabled: bool | None):
    """Within the block, the one-call routes build DIFF V1's [V; V] and its gradient by the kernels of
    :mod:`diffattn.ops.triton.vcopies` (True) or by PyTorch's copy (False), for calls above
    :data:`diffattn.ops.routes.SMALL_WORK`; None: as the route table says for the device (the default). As
    :func:`fused_head_norm`; eager only."""
    return _forced("fused_v_copies", enabled)


def fused_lambda(enabled: bool | None):
    """Within the block, DIFF's λ (Eq. 2) on CUDA is computed each layer's by the kernels of
    :mod:`diffattn.ops.triton.reparam` (True; on the CPU, True has the layers compute their own by PyTorch's ops) or
    by PyTorch (False: in a model's forward every layer's at once, :func:`diffattn.models.diff_llama.layer_lambdas`);
    None: as the route table says for the device (the default). As :func:`fused_head_norm`; eager only (under
    torch.compile PyTorch's ops, which it fuses itself)."""
    return _forced("fused_lambda", enabled)


def pairs_layout(enabled: bool | None):
    """Within the block, DIFF V1's layer (:mod:`diffattn.models.diff_llama`) hands the op its Q and K in interleaved
    pairs and V once where it runs without a KV cache, calls of any size (True), or both maps' heads stacked as
    DiffLlama has them (False); None: as the route table says for the device, for calls above
    :data:`~diffattn.ops.routes.SMALL_WORK` (the default: stacked off CUDA). As :func:`fused_head_norm`."""
    return _forced("heads_in_pairs", enabled)


def lambda_per_layer(enabled: bool | None):
    """Within the block (True), every DIFF V1 layer computes its own λ (Eq. 2) by PyTorch's ops, as before a model's
    forward computed them all at once (:func:`diffattn.models.diff_llama.layer_lambdas`): the same values, about 15
    more kernels a layer. For the benchmarks that time both (the `small` step's ``+perlayer`` column) and tests. As
    :func:`fused_head_norm`; False or None: at once wherever it applies."""
    return _forced("lambda_per_layer", enabled)


def _triton_build_error(err: BaseException, backend: str = "triton") -> str:
    """One line for a fused kernel that did not build or launch: the Triton version and the kernel."""
    import triton

    launched = sys.modules.get(__name__ + ".triton.launch")
    if is_triton_route(backend):
        kernel = getattr(launched, "FAILED_KERNEL", None) or "the fused kernel"
    else:
        kernel = "the fused epilogue (O1 − λ·O2)"
    return (
        f"backend {backend!r}: {kernel} did not compile or launch with triton {triton.__version__} "
        f"({error_line(err)}); backend='auto' runs another route"
    )


def _autocast_inputs(q1, k1, q2, k2, v):
    """q1, k1, q2, k2, v in the autocast dtype of q1's device (floating tensors only; the same tensor stays one
    tensor, so a shared K or Q is still recognised)."""
    dtype = torch.get_autocast_dtype(q1.device.type)
    cast: dict[int, torch.Tensor] = {}

    def to(x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == dtype:
            return x
        if id(x) not in cast:
            cast[id(x)] = x.to(dtype)
        return cast[id(x)]

    v = tuple(to(x) for x in v) if isinstance(v, (tuple, list)) else to(v)
    return to(q1), to(k1), to(q2), to(k2), v


def diff_attention_maps(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    segment_ids: torch.Tensor | None = None,
) -> DiffAttentionMaps:
    """:func:`diff_attention` through the ``reference`` backend, also returning ``attn1``, ``attn2`` and the
    signed map ``attn1 − λ·attn2`` (all float32 ``[B, H, T, S]``), for analysis and plots. A query row whose every
    key is masked (the rule in :mod:`diffattn.ops._inputs`) has all three maps 0 there, not a uniform row."""
    inp = validate(q1, k1, q2, k2, v, lam, causal=causal, attn_mask=attn_mask, scale=scale, segment_ids=segment_ids)
    return diff_attention_reference(with_segment_mask(inp), return_maps=True)
