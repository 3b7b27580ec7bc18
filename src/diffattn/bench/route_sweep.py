"""The route sweep: every route of DIFF attention (DIFF Transformer Eq. 1, docs/methods.md §0) on every call class,
checked against a float64 reference and timed against the same-size SDPA baseline on the same inputs, interleaved —
and the route table ``backend="auto"`` reads (:mod:`diffattn.ops.routes`) written from it.

Each route runs in a worker process of its own (``python -m diffattn.bench.route_sweep --worker``) over every class,
one job at a time; a job is announced in the results file before it starts, so a worker that dies (an illegal memory
access poisons the CUDA context; a kernel can hang) costs one row — "crashed: ..." or "timed out" — and a fresh
worker goes on with the next job. Tuning candidates of the fused kernel are routes of their own here
(``triton[dkdv_atomic 16x64 w4 s1]``: that tile forced alone), so a candidate that crashes is a row too.

Per job:

* **correct** — fresh random inputs at a boundary shape (T = S = 333, not a multiple of any tile; decode: T = 1),
  the class's dtype and mask; the output and every gradient (train) against :func:`diffattn.ops.diff_attention`'s
  ``reference`` backend on the same inputs in float64, as ‖x − ref‖ / ‖ref‖. The yardstick is the error, on the
  same inputs, of an independent formulation in the class's dtype through PyTorch's own kernels (one SDPA call per
  map and slice of V — the official code's route); a route passes at up to :data:`TOLERANCE` times it. NaN fails.
  A scalar λ's gradient (DIFF V1) is one number, whose yardstick error is one random draw: it is held to at least
  the scale of that draw, the unit roundoff times ‖dO ⊙ O2‖ (:func:`check`).
* **speed** — the class's shape (:data:`SHAPES`: batch·N = 16K tokens at N = 4096, d_model 2048; decode: one query
  against 8192 cached keys, batch 4), median milliseconds of forward+backward (train) or forward (infer, decode)
  over interleaved rounds against the baseline: SDPA with 2h heads of width d and the same mask (default dispatch).

Inputs (:func:`make_problem`, :data:`INPUTS`): as the models hand them to the op — Q, K, V views of the projections
of 2h heads (K and V read from the KV cache, contiguous, for ``infer`` and ``decode``), cut into the two maps as the
DIFF and DIFF V2 layers cut them, and the output's gradient in the order a model's backward gives it; the baseline's
the same way. A route's copies (joining V's halves, its maps' gradients, a gradient in another layout than its
output's) are part of its time as they are in a model (tests/bench/test_sweep_layout.py checks the layouts against
the models).

The table entry lists, per class, the routes that passed, fastest first — the fused kernel's variants
(``triton[tma+btma]``: :data:`diffattn.ops.routes.TRITON_VARIANTS`) and its decoding routes (key splits ``triton[splits
N]``, decoding candidates ``triton[decode 16xBN wW sS]``, ``triton[decode vec xBN wW sS]``, either ``… splits N``:
:func:`diffattn.ops.routes.decoding_route`) among them, run by that name as auto runs them, so a variant or decoding
candidate that measured faster and correct on a class is what auto runs there. Forced training tiles (``triton[KIND
BMxBN wW sS]``) are rows, read to choose :mod:`diffattn.ops.triton.tuning`'s defaults; routes only measured for
comparison (transformers' two calls, the official four calls) are rows too, never table routes.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..ops.routes import (
    DIRECT,
    EAGER_ROUTES,
    SHARED_V,
    SHARED_V_SPLIT,
    TRITON_VARIANTS,
    V1_PAIRS,
    decoding_route,
    error_line,
    fused_route_bits,
    known_route,
    triton_variants,
)
from . import gc_paused
from .sweep_records import (
    COMPARISON_ROUTES,
    CURRENT,
    EARLIER_EXCESS,
    INPUTS,  # noqa: F401 (named here by the docstring and the tests)
    graph_ratio,
    is_current,
)

#: a route passes when its worst relative error is at most this times the yardstick's (a scalar λ's yardstick has a
#: floor: :func:`check`)
TOLERANCE = 4.0
COTANGENT_SEED_OFFSET = 0x9E3779B9  # the check's gradient is drawn from its seed plus this (not its inputs' seed)
CHECK_LEN = 333  # not a multiple of 16, 32, 64 or 128: every kernel has partial tiles
D_MODEL, TOKENS, SEQ, DECODE_CACHE, DECODE_BATCH = 2048, 16384, 4096, 8192, 4
#: a ``small`` class's shape: the `small` preset's attention call in the GPU report's train step (d_model 512, batch 4,
#: N = 1024; diffattn.ops.routes.SMALL_WORK): host-bound, where a route's host cost decides
SMALL_D_MODEL, SMALL_BATCH, SMALL_SEQ = 512, 4, 1024
JOB_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CallClass:
    # "v1" (K1, K2 apart; V of width 2d), "v1_pairs" (the same, Q and K in interleaved pairs) or "shared_k" (DIFF V2:
    # K1 is K2, V of width d)
    pair: str
    d: int
    dtype: str = "bf16"
    causal: bool = True
    mask: str = "none"  # none, padding, segments
    mode: str = "train"  # train, infer, decode
    size: str = ""  # "": the standard shape (batch·N = 16K); "small": the `small` step's (SMALL_D_MODEL …)

    def __post_init__(self):
        if self.size not in ("", "small") or (self.size == "small" and self.mode == "decode"):
            raise ValueError(f"size must be '' or 'small' (not with mode 'decode', which has no size): {self}")

    @property
    def dv(self) -> int:
        return 2 * self.d if self.pair in ("v1", V1_PAIRS) else self.d

    @classmethod
    def from_key(cls, key: str) -> CallClass:
        """The class of a route table key (:attr:`key`), e.g. ``"v1 d64 dv128 bf16 causal none train"``."""
        parts = key.split()
        try:
            pair, d, _, dtype, causal, mask, mode, *size = parts
            made = cls(pair, int(d.removeprefix("d")), dtype, causal == "causal", mask, mode, "".join(size))
        except ValueError as err:
            raise ValueError(f"not a call class key: {key!r} ({err})") from None
        if made.key != " ".join(parts):
            raise ValueError(f"not a call class key: {key!r} (read as {made.key!r})")
        return made

    @property
    def key(self) -> str:
        """The route table's key (:func:`diffattn.ops.routes.call_class` of these inputs)."""
        from ..ops.routes import class_key

        return class_key(
            self.pair, self.d, self.dv, self.dtype, self.causal, self.mask, self.mode, self.size == "small"
        )


def default_classes() -> list[CallClass]:
    """The classes a GPU run measures, most used first (a run out of time drops the last ones)."""
    out = []
    for d in (64, 128):
        for pair in ("v1", "shared_k"):
            out += [CallClass(pair, d, mode=m) for m in ("train", "infer", "decode")]
        if d == 64:  # the `small` train step's own calls (host-bound: routes order by host cost there)
            out += [CallClass(pair, d, size="small") for pair in ("v1", "shared_k")]
    for d in (64, 128):
        for pair in ("v1", "shared_k"):
            out += [CallClass(pair, d, mask=m, mode="train") for m in ("padding", "segments")]
            out += [CallClass(pair, d, mask="padding", mode="infer")]
            # decoding against transformers' static cache: its empty slots masked, one value per key (until
            # 2026-11-30 no class, so a model decoding so ran the safe default; now it reads the unmasked class
            # until this one is measured: diffattn.ops.routes.near_classes)
            out += [CallClass(pair, d, mask="padding", mode="decode")]
    # paper-830m's heads (d_model 1536 over 16 heads: d = 96), the train step at DIFF Table 7's size: without these
    # classes that step runs the safe default (the H200's paper-830m step of 2026-11-27 did)
    out += [CallClass(pair, 96) for pair in ("v1", "shared_k")]
    # DIFF V1 handed over in interleaved pairs (the official DIFF code's layout), where cudnn_shared_v reads V once for
    # both maps: trained, at both widths; then its forward alone, as an evaluation without a KV cache runs it (the
    # layer hands that layout over only without a cache, so never decoding: diffattn.models.diff_llama). Read with
    # care: pairs_faster compares these with the stacked `v1 … infer` class, which is timed on K and V from the cache
    # (a prefill's layout), not on the projections' views a stacked call without a cache gets — no class times that
    out += [CallClass(V1_PAIRS, 64), CallClass(V1_PAIRS, 128)]
    out += [CallClass(V1_PAIRS, 64, mode="infer"), CallClass(V1_PAIRS, 128, mode="infer")]
    return out


#: the order in which a sweep measures the table routes (a lease's budget may end before the last): those that may be
#: fastest first, each fused-epilogue variant beside its own route (the pair is the comparison that decides it), the
#: fused kernel last (2.5–11× the baseline on both GPUs so far); ``cudnn_direct`` beside ``cudnn+epilogue``, whose
#: kernels it runs as one autograd node, and ``cudnn_shared_v`` (the same node, V read once) before both
SWEEP_ORDER = (
    "cudnn_maps", "cudnn_maps+epilogue", "cudnn", SHARED_V, SHARED_V_SPLIT, "cudnn+epilogue", DIRECT, "sdpa",
    "sdpa+epilogue", "sdpa_split", "sdpa_split+epilogue", "sdpa_maps", "sdpa_maps+epilogue", "triton",
)  # fmt: skip
#: routes of one pair's classes only: cudnn_shared_v's node reads V once for DIFF V1 in interleaved pairs, and
#: elsewhere runs cudnn+epilogue
_PAIR_ROUTES = {V1_PAIRS: (SHARED_V, SHARED_V_SPLIT)}
#: what is asked of the pairs is whether reading V once beats the stacked layout's fastest routes: those are measured
#: beside their own routes there (joining the pairs' views), and no others — and for the forward alone the stacked
#: forward's first route on both GPUs (cudnn_maps+epilogue: 1.84x on the H200 of 2026-11-28)
_BESIDE_PAIRS = ("cudnn+epilogue", "sdpa_split+epilogue", "cudnn_maps", "sdpa_maps+epilogue", "sdpa")
_BESIDE_PAIRS_INFER = ("cudnn_maps+epilogue",)
#: routes the other pairs' classes are not measured with: sdpa_split needs dv > d (not DIFF V2's heads); the padded
#: one-call sdpa with the epilogue is left out for V1 (it lost to cudnn_maps on both GPUs by more than the epilogue
#: costs). cudnn_direct is measured on both: with K shared (DIFF V2) its one node reads K and V once through cuDNN's
#: grouped heads (diffattn.ops.direct, layout keys_shared)
_NOT_FOR = {"v1": {"sdpa+epilogue"}, "shared_k": {"sdpa_split", "sdpa_split+epilogue"}}


def routes_for(cls: CallClass) -> list[str]:
    """The table routes of a class, in :data:`SWEEP_ORDER` — ``cudnn_direct`` on training classes without a mask
    only: elsewhere it runs ``cudnn+epilogue``, already measured (:mod:`diffattn.ops.direct`)."""
    if cls.pair in _PAIR_ROUTES:
        beside = {*_BESIDE_PAIRS, *(_BESIDE_PAIRS_INFER if cls.mode == "infer" else ())}
        return [route for route in SWEEP_ORDER if route in {*_PAIR_ROUTES[cls.pair], *beside}]
    others = {route for routes in _PAIR_ROUTES.values() for route in routes} | _NOT_FOR[cls.pair]
    direct = cls.mode == "train" and cls.mask == "none"
    return [route for route in SWEEP_ORDER if route not in others and (direct or route != DIRECT)]


def comparison_routes(cls: CallClass) -> list[str]:
    """Routes measured beside the table's, never chosen (V1 without a mask)."""
    return list(COMPARISON_ROUTES) if cls.pair == "v1" and cls.mask == "none" else []


def candidate_routes() -> list[tuple[str, CallClass]]:
    """Each tuning candidate of the fused kernel's training forward and both backwards (no mask), forced alone, on
    the train class of its head widths: ``triton[KIND BMxBN wW sS]``; the forward by TMA tiles (``triton[tma]``:
    DIFF V1's and V2's heads, forward alone and trained) and the two-kernel backward so, its dK/dV kernel plain or
    warp-specialised (``triton[btma]``, ``triton[bws]``, and each with the forward's: ``triton[tma+btma]``,
    ``triton[tma+bws]``), the single-pass backward (``triton[atomic]``) and, for wide heads, the split dK/dV kernel
    (``triton[split]``) and the forward by column blocks (``triton[cols]``) on their default tiles; then the decoding
    forward on its candidate tiles (:func:`decode_tile_routes`), and of V1 and DIFF V2 heads at d = 64 on more key
    splits than its heuristic takes (``triton[splits N]``, :data:`DECODE_SPLITS`)."""
    from ..ops.triton import tuning

    out = []
    for cls_name, pair, d in (("v1", "v1", 64), ("v2", "shared_k", 64), ("wide", "v1", 128)):
        # the forward by TMA tiles alone, then trained; the backward by TMA tiles, alone and with the forward's
        for variant, modes in TMA_ROUTES:
            kinds = [kind for name in variant.split("+") for kind in TRITON_VARIANTS[name][1]]
            if all(cls_name in tuning._TILES[kind] for kind in kinds):
                out += [(f"triton[{variant}]", CallClass(pair, d, mode=mode)) for mode in modes]
        if cls_name != "wide":  # wide heads have no single-pass backward
            out.append(("triton[atomic]", CallClass(pair, d)))  # the single-pass backward on its default tile
        if cls_name in tuning._TILES["dk"]:  # the dK/dV kernel split in two, on larger tiles
            out.append(("triton[split]", CallClass(pair, d)))
        if cls_name in tuning._TILES["fwd_cols"]:  # the forward by column blocks, on wgmma-sized tiles
            out.append(("triton[cols]", CallClass(pair, d)))
        # the default (two-kernel) backward's tiles first: the profile put 81% of a step in the backward
        for kind in ("dkdv", "dq", "dv", "dk", "fwd", "fwd_cols", "dkdv_atomic"):
            for bm, bn, w, s in tuning._TUNING["none"].get(kind, {}).get(cls_name, []):
                out.append((f"triton[{kind} {bm}x{bn} w{w} s{s}]", CallClass(pair, d)))
    return out + decode_tile_routes() + split_routes()


#: the decoding classes issue 37's kernel plan times the fused kernel on: V1's and DIFF V2's heads at d = 64, V1's at
#: d = 128 (one of each head-width class of :data:`diffattn.ops.triton.tuning.DECODE_TILES`)
DECODE_CLASSES = (CallClass("v1", 64, mode="decode"), CallClass("shared_k", 64, mode="decode"),
                  CallClass("v1", 128, mode="decode"))  # fmt: skip


def decode_tile_routes() -> list[tuple[str, CallClass]]:
    """The decoding forward of V1 and DIFF V2 heads at d = 64 and V1's at d = 128, one class after another (V1 at
    d = 64, issue 37's decode target, first; the sweep runs a route on all its classes in one worker, in the order
    of the route's first appearance (:func:`worker_batches`), so V1's routes come in the first workers with the other
    classes' jobs of the same names beside them): on each of its candidate tiles (``triton[decode 16xBN wW sS]``,
    :data:`diffattn.ops.triton.tuning.DECODE_TILES`) and by vector products on each of its candidates (``triton[decode
    vec xBN wW sS]``, :data:`diffattn.ops.triton.tuning.DECODE_VECTORS`), on the heuristic's splits; then the tiles on
    :data:`DECODE_TILE_SPLITS` and the vector candidates on :data:`DECODE_VECTOR_SPLITS` (``… splits N``)."""
    from ..ops.triton import tuning

    out = []
    for cls in DECODE_CLASSES:
        width = tuning._width_class(cls.d, cls.dv)
        tiles = [f"16x{bn} w{w} s{st}" for bn, w, st in tuning.DECODE_TILES[width]]
        vectors = [f"vec x{bn} w{w} s{st}" for bn, w, st in tuning.DECODE_VECTORS[width]]
        out += [(f"triton[decode {t}]", cls) for t in tiles + vectors]
        out += [(f"triton[decode {t} splits {n}]", cls) for n in DECODE_TILE_SPLITS for t in tiles]
        out += [(f"triton[decode {t} splits {n}]", cls) for n in DECODE_VECTOR_SPLITS for t in vectors]
    return out


def split_routes() -> list[tuple[str, CallClass]]:
    """The decoding forward of V1 and DIFF V2 heads at d = 64 on each of :data:`DECODE_SPLITS` key splits
    (``triton[splits N]``)."""
    return [(f"triton[splits {n}]", CallClass(pair, 64, mode="decode")) for pair in ("v1", "shared_k")
            for n in DECODE_SPLITS]  # fmt: skip


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ---- inputs ------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    """One call's inputs, laid out as the models hand them over (:func:`make_problem`): ``leaves`` are the tensors
    gradients are taken for — a model's projections (Q, K, V of 2h heads of width d) and its λ — and ``views`` makes
    from them ``heads``, the model's Q, K, V as [B, heads, N, d] views, and ``diff``, the DIFF op's keyword arguments
    (q1, k1, q2, k2, v, lam, mask arguments) cut from those heads as the model cuts them; the baseline's (q, k, v)
    are views of its own ``base_leaves``."""

    leaves: list[torch.Tensor]
    views: Callable[[list[torch.Tensor]], tuple[tuple[torch.Tensor, ...], dict]]
    base: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    base_leaves: list[torch.Tensor]
    base_mask: torch.Tensor | None  # the class's mask as one bool [B, 1, T, S], causality folded in; None: none
    causal: bool  # is_causal for an SDPA call with base_mask
    heads: tuple[torch.Tensor, ...] = field(init=False)
    diff: dict = field(init=False)

    def __post_init__(self):
        self.heads, self.diff = self.views(self.leaves)


def model_heads(leaf: torch.Tensor, heads: int, cached: bool) -> torch.Tensor:
    """[B, H, N, d] heads as a Llama-layout model hands them to attention (what the sweep's timings must see, for the
    layout decides what a route copies): ``cached`` — K and V read from transformers' KV cache (inference:
    prefill and decode), which stores them contiguous, ``leaf`` [B, H, N, d] as it is; otherwise — Q always, K and V
    in training (no cache) — ``leaf`` is a projection's output [B, N, H·d], viewed as [B, N, H, d] and transposed,
    so that a gradient not laid out [B, N, H, d] is copied on its way back into it, as in a model."""
    return leaf if cached else leaf.unflatten(-1, (heads, -1)).transpose(1, 2)


def model_cotangent(shape: torch.Size, device, dtype, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random gradient for an attention output of ``shape`` [B, H, T, dv] in the layout a model's backward hands it
    over:
    [B, T, H, dv] in memory, transposed — every model here (and transformers' SDPA integration) joins the heads by
    ``transpose(1, 2)`` and a reshape or ``contiguous()`` before the output projection, whose gradient is contiguous."""
    b, h, t, dv = shape
    if generator is not None:  # a seeded draw (the check's: one seed, one gradient), made on the CPU's generator
        return torch.randn(b, t, h, dv, generator=generator).to(device=device, dtype=dtype).transpose(1, 2)
    return torch.randn(b, t, h, dv, device=device, dtype=dtype).transpose(1, 2)


def make_problem(cls: CallClass, *, batch: int, heads: int, t: int, s: int, device, dtype, seed: int) -> Problem:
    """``heads`` DIFF heads (v1: h heads of two maps and V of width 2d; shared_k: DIFF V2's 2h head pairs on 2h
    K/V heads, λ per head and token), the mask of the class, and the same-size baseline (2h heads of width d) — each
    tensor in the layout and with the views the models make (diffattn.models.diff_llama, diff_v2; tested against
    them): Q of 2h heads split into the two maps (v1: [map 1; map 2], by one ``chunk``; DIFF V2: pairs interleaved,
    every other head), K likewise (v1), V of v1 as its two halves of heads ([va | vb] is a DIFF head's V), λ of
    DIFF V2 a [B, T, H] projection transposed; K and V through the KV cache (:func:`model_heads`) for ``infer`` and
    ``decode`` — but DIFF V1 in pairs, which the layer hands over only without a cache: projections' views there."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    train = cls.mode == "train"
    cached = not train and cls.pair != V1_PAIRS

    def rnd(*shape, grad=train):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)

    def heads_leaf(n, h, d, kv: bool):  # [B, H, N, d] in the cache, [B, N, H·d] from a projection
        return rnd(batch, h, n, d) if kv and cached else rnd(batch, n, h * d)

    def view(leaf, h, kv: bool):
        return model_heads(leaf, h, kv and cached)

    from ..ops import interleaved_pair

    if cls.pair == "v1":
        h = heads  # DIFF heads; the model's Q, K, V have 2h heads of width d (dv = 2d: V's halves of heads)
        q, k = heads_leaf(t, 2 * h, cls.d, False), heads_leaf(s, 2 * h, cls.d, True)
        v = heads_leaf(s, 2 * h, cls.dv // 2, True)
        lam = torch.tensor(0.5, device=device).requires_grad_(train)

        def cut(q, k, v, lam):  # diffattn.models.diff_llama: one chunk per tensor
            (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
            return {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v.chunk(2, dim=1), "lam": lam}

    elif cls.pair == V1_PAIRS:
        h = heads  # the official DIFF code's layout: Q, K of 2h heads in interleaved pairs, V of h heads of width 2d
        q, k, v = heads_leaf(t, 2 * h, cls.d, False), heads_leaf(s, 2 * h, cls.d, True), heads_leaf(s, h, cls.dv, True)
        lam = torch.tensor(0.5, device=device).requires_grad_(train)

        def cut(q, k, v, lam):  # diffattn.ops.diff_attention_pairs with K in pairs
            (q1, q2), (k1, k2) = interleaved_pair(q, 1), interleaved_pair(k, 1)
            return {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v, "lam": lam}

    else:
        h = 2 * heads  # DIFF V2: h heads, 2h query heads (the pairs interleaved) on h K/V heads
        q, k, v = heads_leaf(t, 2 * h, cls.d, False), heads_leaf(s, h, cls.d, True), heads_leaf(s, h, cls.dv, True)
        lam = torch.rand(batch, t, h, generator=g).to(device).requires_grad_(train)  # sigmoid(x·w_λ): [B, T, H]

        def cut(q, k, v, lam):  # diffattn.models.diff_v2.v2_attention: the query heads' pairs; K and V once
            q1, q2 = interleaved_pair(q, 1)
            return {"q1": q1, "k1": k, "q2": q2, "k2": k, "v": v, "lam": lam.transpose(1, 2)}

    causal = cls.causal and t > 1  # T = 1 sees every key (bottom-right alignment)
    extra = {"causal": cls.causal}
    base_mask = None
    if cls.mask == "padding":  # the second half of the batch has its last eighth of keys padded
        keep = torch.ones(batch, s, dtype=torch.bool, device=device)
        keep[batch // 2 :, s - max(1, s // 8) :] = False
        extra["attn_mask"] = keep
        base_mask = keep[:, None, None, :]
    elif cls.mask == "segments":  # four documents per row
        seg = (torch.arange(s, device=device) * 4 // s).to(torch.int32).expand(batch, s).contiguous()
        extra["segment_ids"] = seg
        base_mask = seg[:, None, s - t :, None] == seg[:, None, None, :]
    if base_mask is not None and causal:
        from ..ops import causal_keep_mask

        base_mask = base_mask & causal_keep_mask(t, s, device)
    base_leaves = [heads_leaf(t, 2 * heads, cls.d, False), heads_leaf(s, 2 * heads, cls.d, True),
                   heads_leaf(s, 2 * heads, cls.d, True)]  # fmt: skip
    base = tuple(view(x, 2 * heads, kv) for x, kv in zip(base_leaves, (False, True, True), strict=True))
    q_heads, k_heads, v_heads = {"v1": (2 * h, 2 * h, 2 * h), V1_PAIRS: (2 * h, 2 * h, h)}.get(cls.pair, (2 * h, h, h))

    def views(leaves):
        q, k, v, lam = leaves
        model = (view(q, q_heads, False), view(k, k_heads, True), view(v, v_heads, True))
        return model, {**cut(*model, lam), **extra}

    return Problem([q, k, v, lam], views, base, base_leaves, base_mask, causal and base_mask is None)


def whole_v(diff: dict) -> torch.Tensor:
    """The op's V as one tensor: v1's two halves of heads joined side by side ([va | vb], each DIFF head's V)."""
    v = diff["v"]
    return torch.cat(v, dim=-1) if isinstance(v, tuple) else v


def _sdpa_per_map(q, k, v_parts, mask, causal, scale):
    return torch.cat(
        [F.scaled_dot_product_attention(q, k, vp, attn_mask=mask, is_causal=causal, scale=scale) for vp in v_parts], -1
    )


def official_four_calls(p: Problem) -> torch.Tensor:
    """The official DIFF code's route (one SDPA call per map and slice of V as wide as Q), with the class's mask; the
    yardstick's formulation, and a comparison row."""
    a = p.diff
    d = a["q1"].shape[-1]
    mask, causal = p.base_mask, p.causal  # the class's mask, as the baseline has it
    scale = 1 / math.sqrt(d)
    k1, k2, v = a["k1"], a["k2"], a["v"]
    parts = v if isinstance(v, tuple) else v.split(d, dim=-1)  # v1's V comes as its two halves already
    o1 = _sdpa_per_map(a["q1"], k1, parts, mask, causal, scale)
    o2 = _sdpa_per_map(a["q2"], k2, parts, mask, causal, scale)
    lam = a["lam"]
    lam = lam[..., None] if lam.dim() == 3 else lam
    return (o1.float() - lam.float() * o2.float()).to(o1.dtype)


def hf_two_calls(p: Problem) -> torch.Tensor:
    """transformers' DiffLlama route (``DiffLlamaAttention.forward`` through ``sdpa_attention_forward``, transformers
    5.x): both maps' query heads in the model's one Q over its one K (the tensors the maps are cut from), one SDPA call
    per half of V, that half repeated for both maps' heads, each call's output made [B, T, 2h, d] contiguous as
    transformers' SDPA integration returns it; the two side by side, split into the maps along the heads, and
    O1 − λ·O2 in the model's dtype — returned [B, h, T, 2d] as the op returns it (a view: [B, T, h, 2d] in memory)."""
    a = p.diff
    q, k, v = p.heads
    scale = 1 / math.sqrt(q.shape[-1])
    outs = [
        F.scaled_dot_product_attention(
            q, k, half.repeat(1, 2, 1, 1), attn_mask=p.base_mask, is_causal=p.causal, scale=scale
        )
        .transpose(1, 2)
        .contiguous()
        for half in v.chunk(2, dim=1)
    ]
    o1, o2 = torch.cat(outs, dim=-1).chunk(2, dim=2)
    return (o1 - a["lam"] * o2).transpose(1, 2)


def route_fn(route: str, extra: dict[str, Callable]) -> Callable[[Problem], torch.Tensor]:
    """What one call of ``route`` on a problem computes."""
    if route in extra:
        return extra[route]
    if route == "official_four_calls":
        return official_four_calls
    if route == "hf_two_calls":
        return hf_two_calls
    # a variant or decoding route by its own name (the op runs its choices for its own calls, as auto runs a route the
    # table names), a forced training tile as ``triton``
    backend = "triton" if route.startswith("triton") and fused_route_bits(route) is None else route
    return lambda p: op_call(p, backend)


def op_call(p: Problem, backend: str) -> torch.Tensor:
    """The op on a problem as the models call it, on their Q and K as they are: DIFF V2's layer (K1 is K2) with the
    query heads' pairs interleaved, and DIFF V1 in the official code's layout (Q and K in pairs, V of half their
    heads) by :func:`diffattn.ops.diff_attention_pairs`; DIFF's layer with both maps' heads stacked and V's two halves
    as heads (:func:`diffattn.ops.diff_attention_stacked`)."""
    from ..ops import diff_attention_pairs, diff_attention_stacked

    q, k, v = p.heads
    options = {name: x for name, x in p.diff.items() if name not in ("q1", "k1", "q2", "k2", "v", "lam")}
    if p.diff["k1"] is p.diff["k2"] or k.shape[1] == 2 * v.shape[1]:
        return diff_attention_pairs(q, k, v, p.diff["lam"], backend=backend, **options)
    return diff_attention_stacked(q, k, v, p.diff["lam"], backend=backend, **options)


#: The kernel plan's routes of the fused kernel by TMA tiles (:data:`~diffattn.ops.routes.TRITON_VARIANTS` joined by
#: "+") and the modes each is timed in, in order: the forward alone (its target is read on the forward without
#: gradient) and trained
TMA_ROUTES = (
    ("tma", ("infer", "train")),
    ("btma", ("train",)),
    ("tma+btma", ("train",)),
    ("bws", ("train",)),
    ("tma+bws", ("train",)),
)

#: Key splits of the decoding forward the sweep times as routes of their own (``triton[splits N]``), beside the
#: heuristic's (:func:`diffattn.ops.triton.tuning._num_splits`: the GPU filled about twice, 5 splits for the sweep's
#: decode class, 64 programs of one row on 132 SMs). On the H200 of 2026-11-28 that decoding call took 0.272 ms
#: replayed from a CUDA graph against the baseline's 0.071 (3.8x, issue 37 asks 1.5x), where its bytes, every cached
#: key and value read once, are the baseline's: each program walks ~1,640 keys in 52 tiles one after another. 4 and
#: 8: last waves nearly full (256 and 512 programs: the default launch fits one CTA per SM, 132 at a time; the
#: decoding candidates two), where the heuristic's 320 leave a last wave of 56 (RESULTS.md, 2026-11-30, "The decoding
#: forward on tiles of its own"). The host rounds a split to whole tiles, so a count may run as fewer splits (40 as
#: 37 at the sweep's decode class)
DECODE_SPLITS = (4, 8, 10, 20, 40)
#: the key splits each decoding candidate tile (:func:`decode_tile_routes`) is also timed on, beside the heuristic's:
#: one wave of two CTAs per SM for the sweep's decode class
DECODE_TILE_SPLITS = (4,)
#: the key splits each decoding candidate by vector products is also timed on: one program a row and split at 3–4
#: CTAs per SM (117–168 registers on sm_90 at 4 warps), so more programs than the tiles' one wave of two: 512 and
#: 1,024 for the sweep's decode class (the heuristic's 320 fill 132 SMs' 396–528 slots below one wave)
DECODE_VECTOR_SPLITS = (8, 16)


def force_candidate(route: str) -> None:
    """``triton[KIND BMxBN wW sS]``: that launch kind runs that tile alone (autotuning over one configuration);
    every other launch kind its default tile. Nothing for a route the op runs by its name (:func:`route_fn`), as
    auto will where the table lists it: a variant route (``triton[NAME]``, ``triton[A+B]``) and a decoding route —
    ``triton[splits N]``, a forward without gradient split over N key ranges (:data:`DECODE_SPLITS`); ``triton[decode
    16xBN wW sS]``, every decoding launch on that candidate of :data:`diffattn.ops.triton.tuning.DECODE_TILES`;
    ``triton[decode vec xBN wW sS]``, every decoding launch of one query row a KV head by vector products on that
    candidate of :data:`diffattn.ops.triton.tuning.DECODE_VECTORS` (either ``… splits N``:
    :func:`diffattn.ops.routes.decoding_route`) — whose name is checked here, whole, so that a misspelt one is a
    ValueError before anything runs."""
    if not route.startswith("triton[") or triton_variants(route) is not None:
        return
    from ..ops.triton import tuning

    inner = route[len("triton[") : -1]
    if inner.split()[:1] in (["splits"], ["decode"]):  # run by name; refused here whole if malformed
        tuning.check_decoding(decoding_route(inner))
        return

    kind, tile, warps, stages = inner.split()
    bm, bn = (int(x) for x in tile.split("x"))
    cand = (bm, bn, int(warps[1:]), int(stages[1:]))
    original = tuning._candidates

    def candidates(k, *args, **kwargs):
        return [cand] if k == kind else original(k, *args, **kwargs)[:1]

    tuning._candidates = candidates
    tuning.AUTOTUNE = True
    for flag, kinds in TRITON_VARIANTS.values():  # a kind only one variant launches: that variant
        if kind in kinds:
            setattr(tuning, flag, True)


# ---- checking and timing -----------------------------------------------------------------------------------------


def _outputs(fn: Callable[[Problem], torch.Tensor], p: Problem, cotangent: torch.Tensor | None) -> list[torch.Tensor]:
    out = fn(p)
    if cotangent is None:
        return [out.detach()]
    grads = torch.autograd.grad(out, p.leaves, cotangent, allow_unused=True)
    return [out.detach(), *(g if g is not None else torch.zeros_like(x) for g, x in zip(grads, p.leaves, strict=True))]


def _rel(x: torch.Tensor, ref: torch.Tensor, scale: float | None = None) -> float:
    """‖x − ref‖ / ‖ref‖ (or / ``scale``); infinite where x is not finite."""
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).norm() / max(scale or float(ref.norm()), 1e-30))


def check(route: str, fn, cls: CallClass, device, dtype, seed: int) -> dict:
    """Worst relative error of the output and each gradient against float64, and the yardstick's."""
    t = 1 if cls.mode == "decode" else CHECK_LEN
    heads = 4
    p = make_problem(cls, batch=2, heads=heads, t=t, s=CHECK_LEN, device=device, dtype=dtype, seed=seed)
    ref_p = _upcast(p)
    from ..ops import diff_attention

    train = cls.mode == "train"
    # the gradient from a seed of its own: from make_problem's it would repeat Q's values (both draw randn first), and
    # a route reading Q where dO belongs would pass
    cot_seed = torch.Generator().manual_seed(seed + COTANGENT_SEED_OFFSET)
    cot = model_cotangent((*p.diff["q1"].shape[:2], t, cls.dv), device, dtype, cot_seed)
    ref = _outputs(lambda q: diff_attention(**q.diff, backend="reference"), ref_p, cot.double() if train else None)
    got = _outputs(fn, p, cot if train else None)
    yard = _outputs(official_four_calls, p, cot if train else None)
    names = ["out", "dq", "dk", "dv", "dlam"]  # the leaves': the model's Q, K, V of 2h heads and λ
    # a scalar λ's gradient is one sum over B·H·T·dv products that cancel: relative to itself its rounding error is
    # unbounded (the H100 run of 2026-11-26 saw 1e-2 to 1.7e-1 for every route and the yardstick alike), so it is
    # measured against the size of its terms, ‖dO‖·‖O‖ (Cauchy–Schwarz), like every other error here a norm ratio
    scale = {"dlam": float(cot.double().norm() * ref[0].double().norm())} if p.diff["lam"].numel() == 1 else {}
    errors = {n: _rel(g, r, scale.get(n)) for n, g, r in zip(names, got, ref, strict=False)}
    yardstick = {n: _rel(g, r, scale.get(n)) for n, g, r in zip(names, yard, ref, strict=False)}
    if scale and train:
        # ... and as one number its yardstick is one draw of a rounding error, which spans two orders of magnitude
        # from one input to the next (on a CPU, bf16: 6e-8 to 8e-6 of ‖dO‖·‖O‖ over 30 seeds): transformers' own two
        # calls erred 27x its draw on one seed, the fused kernel 4.5x on another (and on the H200 of 2026-11-28,
        # where the test's report cut off the failing error: every other was within its bound). A rule against the
        # draw alone fails any route rounding independently of it on about one input in six at 4x. Its floor is
        # the scale of the draw instead: the unit roundoff times ‖dO ⊙ O2‖, the error that rounding O2 (A2·V) once
        # to the class's dtype puts into Σ dO·O2 (O2 in float64 from the reference with λ = 0 and λ = 1); a dλ wrong
        # by a term of its own size (Σ dO·O added) errs by 10-30 times that
        yardstick["dlam"] = max(yardstick["dlam"], _scalar_lambda_rounding(ref_p, cot, dtype) / scale["dlam"])

    worst = max(errors.values())
    worst_yard = max(yardstick.values())
    ok = all(errors[n] <= TOLERANCE * max(yardstick[n], 1e-7) for n in errors)
    return {"max_err": worst, "yardstick": worst_yard, "correct": bool(ok), "errors": errors, "yardsticks": yardstick}


def _scalar_lambda_rounding(ref_p: Problem, cot: torch.Tensor, dtype: torch.dtype) -> float:
    """u·‖dO ⊙ O2‖: the size of the error that rounding the second map's output O2 = A2·V to ``dtype`` (unit
    roundoff u) puts into a scalar λ's gradient −Σ dO·O2 — O2 in float64 as O(λ = 0) − O(λ = 1) from the reference."""
    from ..ops import diff_attention

    lam = ref_p.diff["lam"].detach()
    with torch.no_grad():
        o1 = diff_attention(**{**ref_p.diff, "lam": torch.zeros_like(lam)}, backend="reference")
        o1_minus_o2 = diff_attention(**{**ref_p.diff, "lam": torch.ones_like(lam)}, backend="reference")
    unit_roundoff = torch.finfo(dtype).eps / 2
    return float(unit_roundoff * (cot.double() * (o1 - o1_minus_o2)).norm())


def _upcast(p: Problem) -> Problem:
    """The same problem in float64: its leaves cast, the same views made of them."""
    up = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x for x in p.leaves]
    return Problem(up, p.views, p.base, p.base_leaves, p.base_mask, p.causal)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved_ms(
    fns: dict[str, Callable[[], object]], device, rounds: int = 10, min_sample_ms: float = 20.0, min_calls: int = 4
):
    """Median milliseconds per call of each function, timed in interleaved rounds, after a warm-up of three calls
    each. Each sample is at least ``min_calls`` calls back to back (and enough to take ``min_sample_ms``, at most 50)
    between two synchronisations, so that the host's work for a call overlaps the GPU's work on the one before, as it
    does between a model's layers: a sample of one call also timed the host's lead-in, which the GPU waits for (on
    the H200 of 2026-11-28 wall time minus GPU busy time was 0.17 ms a call for the baseline and 0.32–0.96 ms for the
    DIFF routes at 16K tokens, where every route's GPU work is longer than its host work). At 16K tokens a sample
    is now 4 calls, not 1: about 0.4 s more a sweep job (route and baseline, 10 rounds)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    _sync(device)
    inner = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        _sync(device)
        enough = math.ceil(min_sample_ms / max(1e-3, 1e3 * (time.perf_counter() - start)))
        inner[name] = max(min_calls, min(50, enough))
    samples: dict[str, list[float]] = {n: [] for n in fns}
    with gc_paused():
        for _ in range(rounds):
            for name, fn in fns.items():
                _sync(device)
                start = time.perf_counter()
                for _ in range(inner[name]):
                    fn()
                _sync(device)
                samples[name].append(1e3 * (time.perf_counter() - start) / inner[name])
    return {n: statistics.median(v) for n, v in samples.items()}


def shape_of(cls: CallClass, scale: str = "gpu") -> dict:
    """The timed shape: batch·N = 16K tokens at N = 4096 and d_model 2048 (DIFF heads: d_model / 2d); decode one
    query against 8192 keys, batch 4; a ``small`` class the `small` step's call (:data:`SMALL_D_MODEL` …).
    ``scale="tiny"``: a CPU stand-in for tests."""
    if scale == "tiny":
        return {"batch": 1, "heads": 2, "t": 1 if cls.mode == "decode" else 64, "s": 64}
    if cls.size == "small":
        return {"batch": SMALL_BATCH, "heads": SMALL_D_MODEL // (2 * cls.d), "t": SMALL_SEQ, "s": SMALL_SEQ}
    heads = D_MODEL // (2 * cls.d)
    if cls.mode == "decode":
        return {"batch": DECODE_BATCH, "heads": heads, "t": 1, "s": DECODE_CACHE}
    return {"batch": TOKENS // SEQ, "heads": heads, "t": SEQ, "s": SEQ}


def baseline_call(p: Problem) -> Callable[[], torch.Tensor]:
    """The same-size baseline's forward on ``p``: SDPA over its 2h heads of width d, the class's mask, default
    dispatch."""
    qb, kb, vb = p.base
    return lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=p.base_mask, is_causal=p.causal)


def with_backward(call: Callable[[], torch.Tensor], leaves: list[torch.Tensor], train: bool) -> Callable[[], None]:
    """``call`` as one timed job: for ``train`` with its backward, a fixed random cotangent in a model's layout
    (:func:`model_cotangent`; drawn at the first call, a warm-up) into every leaf that needs a gradient; otherwise
    under ``torch.no_grad``."""
    cotangent: list[torch.Tensor] = []

    def forward_backward():
        out = call()
        if not cotangent:
            cotangent.append(model_cotangent(out.shape, out.device, out.dtype))
        torch.autograd.grad(out, [x for x in leaves if x.requires_grad], cotangent[0], allow_unused=True)

    def forward():
        with torch.no_grad():
            call()

    return forward_backward if train else forward


def time_route(fn, cls: CallClass, device, dtype, scale: str) -> dict:
    """Milliseconds of the route and the baseline, interleaved on one problem; and TFLOP/s by the stated FLOP model."""
    from .attention import attention_flops

    shape = shape_of(cls, scale)
    p = make_problem(cls, **shape, device=device, dtype=dtype, seed=1)
    train = cls.mode == "train"
    base = with_backward(baseline_call(p), p.base_leaves, train)
    route = with_backward(lambda: fn(p), p.leaves, train)

    ms = interleaved_ms({"route": route, "base": base}, device)
    graphed = {}
    if cls.mode == "decode":  # what is host work in a decoding call's time: its GPU time alone, replayed as a graph
        graphed = {k: graphed_ms(f, device) for k, f in (("graph_ms", route), ("base_graph_ms", base))}
    kind = "diff"
    h = p.diff["q1"].shape[1]
    flops = attention_flops(shape["batch"], h, shape["t"], shape["s"], cls.d, cls.dv, causal=cls.causal, kind=kind)
    work = flops["fwd_bwd"] if train else flops["fwd"]
    return {"ms": ms["route"], "base_ms": ms["base"], "ratio": ms["route"] / ms["base"],
            "tflops": work / (ms["route"] * 1e9), "shape": shape, **graphed}  # fmt: skip


def graphed_ms(fn: Callable[[], object], device) -> float | None:
    """Median milliseconds of ``fn`` captured once as a CUDA graph and replayed (interleaved rounds as
    :func:`interleaved_ms`): the GPU's time without the host's — what a decoding step costs under CUDA graphs
    (transformers' static cache with ``torch.compile``), against the eager time that a host-bound call mostly is
    (issue 37: "what is in 0.30 ms"). None off CUDA, or where the call cannot be captured (a host sync in it)."""
    if torch.device(device).type != "cuda":
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks before a capture
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return interleaved_ms({"graph": graph.replay}, device)["graph"]
    except Exception:  # not capturable: the eager time stands alone
        return None


def matmul_tflops(device) -> float:
    """The GPU's bf16 matmul rate, measured: an 8192³ product on random data."""
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = interleaved_ms({"mm": lambda: a @ b}, device, rounds=10)["mm"]
    return 2 * n**3 / (ms * 1e9)


# ---- the worker --------------------------------------------------------------------------------------------------


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _fatal(text: str) -> bool:
    """Whether a worker must stop after this error: the CUDA context is unusable, or any CUDA error at all (a fresh
    worker costs seconds; a wrong row costs a wrong table)."""
    from ..ops import poisons_cuda_context

    return poisons_cuda_context(text) or "CUDA error" in text


def switches_on(device: str) -> dict:
    """``{"switches": [...]}``: the route table's switches on for ``device`` while a route is timed (the entry the
    process reads: ``DIFFATTN_ROUTE_TABLE``, or forced), where any is — so a record says what ran (a route timed
    with [V; V] by its kernels is not the same measurement as without); empty where none is."""
    from ..ops.routes import TABLE_FLAGS, table_flag

    where = torch.device(device)
    index = (where.index or 0) if where.type == "cuda" else None
    on = [flag for flag in TABLE_FLAGS if table_flag(flag, index)]
    return {"switches": on} if on else {}


def run_worker(
    route: str, jobs: list[dict], results: Path, device: str, scale: str, extra_module: str | None, warm: bool = False
) -> int:
    """Run ``route`` on each job's class in order, appending a "start" and a result record per job. Exits 3 after an
    error that leaves the CUDA context unusable (the parent starts a fresh worker for the rest). ``warm``: only
    compile (one call at the checked and at the timed shape, nothing timed), so a later timed worker finds its
    kernels in Triton's cache."""
    extra = importlib.import_module(extra_module).ROUTES if extra_module else {}
    force_candidate(route)
    fn = route_fn(route, extra)
    if warm:
        for job in jobs:
            cls = CallClass(**job["cls"])
            try:
                dtype = DTYPES[cls.dtype]
                check(route, fn, cls, device, dtype, seed=0)
                p = make_problem(cls, **shape_of(cls, scale), device=device, dtype=dtype, seed=1)
                out = fn(p)
                if cls.mode == "train":
                    out.float().sum().backward()
                _sync(device)
            except Exception as err:
                if _fatal(error_line(err)):
                    return 3
        return 0
    for job in jobs:
        cls = CallClass(**job["cls"])
        _append(results, {"event": "start", "route": route, "class": cls.key})
        record = {"event": "done", "route": route, "class": cls.key, "cls": asdict(cls), **CURRENT,
                  **switches_on(device)}  # fmt: skip
        try:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            dtype = DTYPES[cls.dtype]
            record.update(check(route, fn, cls, device, dtype, seed=job.get("seed", 0)))
            record.update(time_route(fn, cls, device, dtype, scale))
            record["status"] = "ok"
        except torch.OutOfMemoryError as err:
            record.update(status=f"out of memory: {error_line(err)}")
        except Exception as err:
            text = error_line(err)
            record.update(status=f"error: {text}")
            if _fatal(text):
                record["status"] = f"crashed: {text}"
                _append(results, record)
                return 3
        _append(results, record)
        if device == "cuda":
            torch.cuda.empty_cache()
    return 0


# ---- the parent --------------------------------------------------------------------------------------------------


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a dying worker
    return out


def sweep(
    plan: list[tuple[str, CallClass]],
    out: Path,
    *,
    device: str = "cuda",
    scale: str = "gpu",
    budget_s: float = 300.0,
    job_timeout_s: float = JOB_TIMEOUT_S,
    extra_module: str | None = None,
    progress: Callable[[str], None] = print,
    warm_s: float = 0.0,
    first: frozenset = frozenset(),
    again: frozenset[tuple[str, str]] = frozenset(),
) -> list[dict]:
    """Every (route, class) of ``plan``, each route in worker processes of its own, in plan order of routes; a
    worker that dies or overruns costs one row and a fresh worker takes the rest. ``first``: class keys, and (route,
    class key) jobs, that run in a round of their own before the rest (:func:`first_round`); ``again``: (route,
    class) jobs measured before, in a last round (:func:`worker_batches`). Returns one record per job (status "ok",
    "error: …", "crashed: …", "timed out", or "skipped: budget spent")."""
    out.mkdir(parents=True, exist_ok=True)
    results = out / "routes.jsonl"
    set_aside(results)  # an earlier sweep's raw rows into this folder (a first call of the same lease): kept
    deadline = time.monotonic() + budget_s
    batches = worker_batches(plan, first, again)
    if warm_s > 0:
        warm_budget = min(warm_s, budget_s / 2)  # paid from the same budget as the jobs
        reach = max(0, int((budget_s - warm_budget) / SECONDS_PER_JOB))
        warm_compiles(batches, out, device, scale, extra_module, warm_budget, progress, reach)
    records: dict[tuple[str, str], dict] = {}
    for route, classes in batches:
        pending = list(classes)
        while pending:
            left = deadline - time.monotonic()
            if left <= 5:
                for cls in pending:
                    records[(route, cls.key)] = {"route": route, "class": cls.key, "cls": asdict(cls),
                                                 "status": "skipped: budget spent"}  # fmt: skip
                break
            jobs = out / "jobs.json"
            jobs.write_text(json.dumps([{"cls": asdict(c)} for c in pending]))
            cmd = [sys.executable, "-m", "diffattn.bench.route_sweep", "--worker", route, "--jobs", str(jobs),
                   "--results", str(results), "--device", device, "--scale", scale]  # fmt: skip
            if extra_module:
                cmd += ["--extra-routes", extra_module]
            progress(f"routes: {route} on {len(pending)} classes ({left:.0f} s left)")
            stderr_path = out / "worker.stderr"
            with open(stderr_path, "w") as err_file:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file)
                killed = _wait(proc, results, route, job_timeout_s, deadline)
            keys = {c.key for c in pending}  # this worker's: a route's first-round worker wrote records of its own
            ours = [r for r in read_records(results) if r["route"] == route and r["class"] in keys]
            done = {r["class"]: r for r in ours if r.get("event") == "done"}
            started = [r["class"] for r in ours if r.get("event") == "start"]
            for key, r in done.items():
                records[(route, key)] = r
            still = [c for c in pending if c.key not in done]
            if not still:
                break
            # the job that started and never finished is the one the worker died (or hung) on
            culprit = next((c for c in still if c.key in started), None)
            if killed == "deadline":  # the sweep's budget ended mid-job: not the route's fault (the H200 run of
                # 2026-11-27 recorded such a job "timed out", which barred a correct route from its class)
                for cls in still:
                    records[(route, cls.key)] = {"route": route, "class": cls.key, "cls": asdict(cls),
                                                 "status": "skipped: budget spent"}  # fmt: skip
                break
            if culprit is None and len(still) < len(pending):
                pending = still  # it stopped itself after a recorded crash: a fresh worker takes the rest
                continue
            if culprit is None:  # died before its first job: the route itself cannot start
                why = _last_line(stderr_path) or _exit_text(proc.returncode)
                for cls in still:
                    records[(route, cls.key)] = {"route": route, "class": cls.key, "cls": asdict(cls),
                                                 "status": f"crashed: {why}"}  # fmt: skip
                break
            status = "timed out" if killed else f"crashed: {_last_line(stderr_path) or _exit_text(proc.returncode)}"
            records[(route, culprit.key)] = {"route": route, "class": culprit.key, "cls": asdict(culprit),
                                             "status": status}  # fmt: skip
            progress(f"routes: {route} on {culprit.key}: {status}")
            pending = [c for c in still if c is not culprit]
    for scratch in (out / "jobs.json", out / "worker.stderr"):  # ours, each worker's; the records keep what matters
        scratch.unlink(missing_ok=True)
    return [records[(route, cls.key)] for route, cls in plan if (route, cls.key) in records]


def worker_batches(
    plan: list[tuple[str, CallClass]],
    first: frozenset = frozenset(),
    again: frozenset[tuple[str, str]] = frozenset(),
) -> list[tuple[str, list[CallClass]]]:
    """The sweep's workers in order: (route, its classes), one per route and round, routes in order of first
    appearance in ``plan`` (a worker runs a route on all its classes: one process start per route, not per job).
    Three rounds, each empty without what names it: the jobs of the classes ``first`` names (new to the table) and
    the jobs it names as (route, class key) (:func:`first_round`), then
    the rest but those ``again`` names as (route, class key) — what the earlier entry lacks, or has without a figure
    the table now orders by (:func:`_measured_fully`) — then those, measured again only when everything else has
    been. Why: a class new to the table (the `small` step's, 2026-11-27) is read from another class's order until
    measured, and a lease that reaches it only after every other unmeasured job of each route may end first; and a
    route's remeasurements in the same worker as its missing jobs came before other routes' missing ones (the H200's
    second lease, 2026-11-27: `cudnn_maps` on 24 classes, 20 of them measured before)."""

    def round_of(route: str, cls: CallClass) -> int:
        return 0 if cls.key in first or (route, cls.key) in first else 2 if (route, cls.key) in again else 1

    batches: list[tuple[str, list[CallClass]]] = []
    for this_round in range(3):
        grouped: dict[str, list[CallClass]] = {}
        for route, cls in plan:
            if round_of(route, cls) == this_round:
                grouped.setdefault(route, []).append(cls)
        batches += grouped.items()
    return batches


WARM_PROCESSES = 8
#: seconds a job takes in a sweep, worker starts included: the H200's second lease ran 38 jobs in 12 workers in 174 s
SECONDS_PER_JOB = 4.5


def warm_work(batches, reach: int) -> list[tuple[str, CallClass]]:
    """The Triton (route, class) pairs among the first ``reach`` jobs in sweep order: the ones worth compiling ahead.
    Why not all: the H200's second lease compiled 56 pairs in 78 s of its 300 and ran 4 of them."""
    jobs = [(route, cls) for route, classes in batches for cls in classes][:reach]
    return [(route, cls) for route, cls in jobs if route.startswith("triton")]


def warm_compiles(batches, out: Path, device, scale, extra_module, timeout_s: float, progress, reach: int) -> None:
    """Compile the Triton routes' kernels that the sweep will reach (:func:`warm_work`) before anything is timed:
    split over up to :data:`WARM_PROCESSES` worker processes at once (compiling is CPU work; Triton's cache is shared
    between processes), killed at ``timeout_s``. Nothing here is recorded: the timed workers meet any error again,
    and a kernel not compiled here compiles in its own worker when reached."""
    work = warm_work(batches, reach)
    if not work:
        return
    progress(f"routes: compiling {len(work)} Triton (route, class) pairs in {WARM_PROCESSES} processes")
    procs = []
    for i in range(WARM_PROCESSES):
        mine = work[i::WARM_PROCESSES]
        routes = {}
        for route, cls in mine:
            routes.setdefault(route, []).append(cls)
        for route, classes in routes.items():
            jobs = out / f"warm-{i}-{len(procs)}.json"
            jobs.write_text(json.dumps([{"cls": asdict(c)} for c in classes]))
            cmd = [sys.executable, "-m", "diffattn.bench.route_sweep", "--worker", route, "--warm", "--jobs",
                   str(jobs), "--results", os.devnull, "--device", device, "--scale", scale]  # fmt: skip
            if extra_module:
                cmd += ["--extra-routes", extra_module]
            procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), jobs))
    deadline = time.monotonic() + timeout_s
    for proc, _ in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for _, jobs in procs:
        jobs.unlink()
    progress(f"routes: compiled (or gave up) in {timeout_s - max(0.0, deadline - time.monotonic()):.0f} s")


def _wait(proc: subprocess.Popen, results: Path, route: str, job_timeout_s: float, deadline: float) -> str | None:
    """Wait for the worker; kill it when one job runs past ``job_timeout_s`` ("job") or the sweep's deadline comes
    first ("deadline"). None: it exited by itself."""
    last_count, last_change = -1, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.2)
        count = sum(1 for r in read_records(results) if r["route"] == route)
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        why = "job" if now - last_change > job_timeout_s else "deadline" if now > deadline else None
        if why:
            proc.kill()
            proc.wait()
            return why
    return None


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    meaningful = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (meaningful or lines or [""])[-1][:300]


def order_key(r: dict) -> tuple[int, float]:
    """Where a correct record's route goes in its class's order, fastest first: by its ratio to the baseline, and for
    a decoding call by its CUDA-graph ratio where it has one, ahead of routes timed eagerly only. Why: an eager
    decoding call is host time, which for the same route and call moved 2.2x between two H200 leases (`cudnn_maps`
    0.218 → 0.481 ms, V1 d = 64) and put a route measured in one lease ahead of one measured in the other; its graph
    time is the GPU's and what a static cache with CUDA graphs pays.

    A record timed before today's protocol (:func:`~diffattn.bench.sweep_records.is_current`: other inputs, or one
    call a sample) is ranked by its eager ratio less :data:`~diffattn.bench.sweep_records.EARLIER_EXCESS`, the most by
    which it may read high: while a lease has timed a class again only in part, a route timed again early passes an
    older one only where it is faster even by the older one's best case, and an older route that was slow stays
    behind the current ones it never beat (ranking every older record first, as this did until 2026-11-29, put the
    two routes that lease left untimed — the slowest of V1's training class, 2.8-2.9x — ahead of `cudnn_direct`'s
    1.66x). A graph ratio holds no host time: it is taken as it is."""
    graphed = graph_ratio(r)
    if graphed is not None:
        return (0, graphed)
    return (1, r["ratio"] - (0.0 if is_current(r) else EARLIER_EXCESS))


def eager_order_key(r: dict) -> tuple[int, float]:
    """Where a correct decoding record's route goes in its class's eager order (the entry's
    :data:`~diffattn.ops.routes.EAGER_ROUTES`, read by a decoding call run eagerly): by its eager ratio to the baseline
    timed beside it — host time included, which is what such a call pays — an older record's less
    :data:`~diffattn.bench.sweep_records.EARLIER_EXCESS`, as :func:`order_key` ranks a record without a graph time.
    The ratio, not the time: eager host time moved 2.2x between two H200 leases for one route and call
    (:func:`order_key`), and the baseline timed in the same run moves with it."""
    return (1, r["ratio"] - (0.0 if is_current(r) else EARLIER_EXCESS))


def class_routes(records: list[dict], key=order_key) -> dict[str, list[str]]:
    """Per class, the table routes of ``records`` that passed, fastest first (by ``key``: :func:`order_key`); the fused
    kernel's variants by name, forced tiles not (they are not routes)."""
    routes: dict[str, list[tuple[tuple[int, float], str]]] = {}
    for r in records:
        if r.get("status") == "ok" and r.get("correct") and known_route(r["route"]) and math.isfinite(r["ms"]):
            routes.setdefault(r["class"], []).append((key(r), r["route"]))
    return {k: [name for _, name in sorted(v)] for k, v in routes.items()}


def eager_decode_routes(records: list[dict]) -> dict[str, list[str]]:
    """Per decoding class, the routes of :func:`class_routes` in their eager order (:func:`eager_order_key`)."""
    return class_routes([r for r in records if r["class"].endswith(" decode")], eager_order_key)


def table_entry(records: list[dict], identity: dict, date: str) -> dict:
    """The route table entry of a sweep: per class the table routes that passed, fastest first; every record kept
    as a measurement (the README's speed table is made from them)."""
    measured = [{k: r.get(k) for k in ("class", "route", "status", "correct", "max_err", "yardstick", "ms",
                                          "base_ms", "ratio", "tflops", "graph_ms", "base_graph_ms", "inputs",
                                          "sampling")
                 if k in r} for r in records]  # fmt: skip
    for m, r in zip(measured, records, strict=True):
        if r.get("measured"):  # kept from an earlier run of this device and software (with_earlier_measurements)
            m["measured"] = r["measured"]
    return {**identity, "date": date, "shape": f"batch·N = {TOKENS}, N = {SEQ}, d_model {D_MODEL}; decode: batch "
            f"{DECODE_BATCH}, one query against {DECODE_CACHE} keys; small: batch {SMALL_BATCH}, N = {SMALL_SEQ}, "
            f"d_model {SMALL_D_MODEL}",
            "routes": class_routes(records), EAGER_ROUTES: eager_decode_routes(records),
            "measurements": measured}  # fmt: skip


def merge_entry(table_path: Path, entry: dict, into: Path) -> dict:
    """The table at ``table_path`` with ``entry`` replacing any entry of the same device and software, written to
    ``into`` (a temporary name, then a rename)."""
    from ..files import write_text_atomic
    from ..ops.routes import MATCH_KEYS, STEP_FIRST, TABLE_FLAGS, TABLE_FORMAT, check_table

    entries = []
    if table_path.exists():
        try:
            entries = check_table(json.loads(table_path.read_text()))
        except ValueError:
            entries = []
    same = [e for e in entries if all(e[k] == entry[k] for k in MATCH_KEYS)]
    # the kernel switches and first routes a step decided for this device and software (diffattn.bench.switches) stay
    # with it: a sweep measures calls, not the step that decides them
    carried = {key: e[key] for e in same for key in (*TABLE_FLAGS, STEP_FIRST) if key in e and key not in entry}
    entry = {**entry, **carried}
    entries = [e for e in entries if e not in same] + [entry]
    table = {"format": TABLE_FORMAT, "entries": entries}
    check_table(table)
    write_text_atomic(into, json.dumps(finite_json(table), indent=1) + "\n")
    return table


def finite_json(x):
    """JSON without NaN (not JSON): NaN and infinities become null, in dicts, lists and tuples all the way down."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite_json(v) for v in x]
    return x


def to_markdown(records: list[dict], entry: dict, matmul: float | None) -> str:
    """The sweep as markdown: per class, each route's time, ratio to the baseline, TFLOP/s (and its share of the
    measured matmul rate), error against float64 and the yardstick's, and the table's choice."""
    lines = [f"Route sweep on {entry['device']} (sm_{entry['capability'].replace('.', '')}), torch {entry['torch']}, "
             f"triton {entry['triton']}, cuDNN {entry['cudnn']}, {entry['date']}. {entry['shape']}. Ratios to the "
             "same-size SDPA baseline (2h heads of width d, same mask, default dispatch) measured in the same "
             "process, interleaved.", ""]  # fmt: skip
    if matmul:
        lines += [f"Measured bf16 matmul rate (8192³): {matmul:.0f} TFLOP/s.", ""]
    head = (
        "| class | route | ms (baseline's) | × base | TFLOP/s | % of matmul | err vs fp64 | yardstick | status "
        "| auto's order |"
    )
    lines += [head,
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        order = entry["routes"].get(r["class"], [])
        rank = str(order.index(r["route"]) + 1) if r["route"] in order else "—"
        share = f"{100 * r['tflops'] / matmul:.0f}%" if matmul and r.get("tflops") else "—"
        lines.append("| " + " | ".join([
            r["class"], r["route"], _ms_cell(r), _f(r.get("ratio"), ".2f"), _f(r.get("tflops"), ".0f"),
            share, _f(r.get("max_err"), ".1e"), _f(r.get("yardstick"), ".1e"),
            _status_cell(r), rank,
        ]) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _ms_cell(r: dict) -> str:
    """A record's milliseconds and the baseline's timed beside it (its ratio's denominator), with both CUDA-graph
    replay times where measured (decode). Why the baseline's: two rows' milliseconds come from different samples, and
    where a call is host-bound (the ``small`` classes, decoding) the host's state moves both a row's time and its
    baseline's by tens of percent between rows (the H200 of 2026-11-29: the same baseline at 0.27 ms in one row and
    0.41 in another), so rows compare by their ratios, not by their milliseconds."""
    cell = _f(r.get("ms"), ".3f")
    if r.get("base_ms") is not None:
        cell += f" (base {r['base_ms']:.3f})"
    if r.get("graph_ms") is not None:
        cell += f" (graph {r['graph_ms']:.3f}, base {_f(r.get('base_graph_ms'), '.3f')})"
    return cell


def _status_cell(r: dict) -> str:
    """A record's status for routes.md: ok (with the date where kept from an earlier run, and the table's switches
    that were on while it was timed: :func:`switches_on`), WRONG, or why not."""
    if r.get("status") != "ok":
        return r.get("status", "")
    if not r.get("correct"):
        return "WRONG"
    notes = [r["measured"]] if r.get("measured") else []
    notes += r.get("switches", [])
    return f"ok ({', '.join(notes)})" if notes else "ok"


def _f(x, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


README_BEGIN = "<!-- route table: begin (written by diffattn.bench.route_sweep.readme_table; do not edit) -->"
README_END = "<!-- route table: end -->"


#: the README's columns: the table routes, then the comparison routes
README_COLUMNS = ("cudnn", "cudnn_maps", "sdpa", "sdpa_split", "sdpa_maps", "triton", *COMPARISON_ROUTES)


def readme_table(entries: list[dict]) -> str:
    """The README's GPU speed tables, one per route table entry (newest first), made from each entry's
    measurements (the one home of those numbers): per call class, auto's route and each route's ratio to the
    same-size baseline. Columns: :data:`README_COLUMNS`, then any other route an entry measured (the fused-epilogue
    variants once a GPU has timed them)."""
    lines = [README_BEGIN]
    for entry in sorted(entries, key=lambda e: e["date"], reverse=True):
        measured = {m["route"] for m in entry["measurements"] if m.get("status") == "ok"}
        columns = [*README_COLUMNS, *(r for r in SWEEP_ORDER if r in measured and r not in README_COLUMNS)]
        head = ["call class", "auto runs", "base ms", *columns]
        ratio = {(m["class"], m["route"]): m for m in entry["measurements"]}
        sm = entry["capability"].replace(".", "")
        dates = sorted({m["measured"] for m in entry["measurements"] if m.get("measured")})
        kept = f" (cells marked † kept from the run of {', '.join(dates)}, same device and software)" if dates else ""
        lines += ["", f"**{entry['device']}** (sm_{sm}), torch {entry['torch']}, triton {entry['triton']}, cuDNN "
                  f"{entry['cudnn']}, measured {entry['date']}{kept}; {entry['shape']}; ratio of each route's time "
                  "(forward+backward for `train`, forward for `infer` and `decode`) to the same-size SDPA baseline "
                  "with the same mask, measured in the same process; for `decode`, where measured, the same replayed "
                  "from a CUDA graph (graph), which orders the routes before eager times do. ✗: wrong against "
                  "float64 or failed; —: not measured.", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
        for cls, order in entry["routes"].items():
            cells = []
            for col in columns:
                m = ratio.get((cls, col))
                if m is None or m.get("status", "").startswith("skipped"):
                    cells.append("—")
                elif m.get("status") != "ok" or not m.get("correct"):
                    cells.append("✗")
                else:
                    graphed = graph_ratio(m)
                    cell = f"{m['ratio']:.2f}×" + (f" (graph {graphed:.2f}×)" if graphed is not None else "")
                    cell += "†" if m.get("measured") else ""
                    cells.append(f"**{cell}**" if col == order[0] else cell)
            base = ratio[(cls, order[0])]["base_ms"]
            lines.append("| " + " | ".join([f"`{cls}`", f"`{order[0]}`", f"{base:.3f}", *cells]) + " |")
    return "\n".join([*lines, "", README_END])


def write_readme_table(readme: Path, table: Path) -> bool:
    """Replace the route-table block of ``readme`` with :func:`readme_table` of ``table``'s entries (temporary name,
    then a rename); False where the block is already current."""
    from ..files import write_text_atomic
    from ..ops.routes import check_table

    text = readme.read_text()
    begin, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    block = readme_table(check_table(json.loads(table.read_text())))
    if text[begin:end] == block:
        return False
    write_text_atomic(readme, text[:begin] + block + text[end:])
    return True


def default_plan(candidates: bool = True) -> list[tuple[str, CallClass]]:
    """The table routes on every class, then the fused kernel's tuning candidates, then the comparison routes: a
    run out of time loses the last ones."""
    plan = [(route, cls) for cls in default_classes() for route in routes_for(cls)]
    if candidates:
        plan += candidate_routes()
    return plan + [(route, cls) for cls in default_classes() for route in comparison_routes(cls)]


def kernel_plan() -> list[tuple[str, CallClass]]:
    """Issue 37's measurements alone: the fused kernel on its default tiles, then each of its tuning candidates and
    variants, on the train class of each head width, and its decoding forward on its candidate tiles and on more key
    splits (``--plan kernel``: the whole plan rarely reaches them in one lease, as the table's routes come first)."""
    defaults = [("triton", CallClass(pair, d)) for pair, d in (("v1", 64), ("shared_k", 64), ("v1", 128))]
    decoding = [("triton", cls) for cls in DECODE_CLASSES]
    # the default forward alone, beside which the forward by TMA tiles (triton[tma]) is read
    forwards = [("triton", CallClass(pair, 64, mode="infer")) for pair in ("v1", "shared_k")]
    # the decoding tiles and key splits right after (one call each, seconds a job), ahead of the training candidates'
    # many jobs
    decode = decode_tile_routes() + split_routes()
    return defaults + decoding + decode + forwards + [job for job in candidate_routes() if job not in decode]


def decode_plan() -> list[tuple[str, CallClass]]:
    """Issue 37's decoding target alone (``--plan decode``: seconds a job, for what a lease has left): the fused
    kernel's decoding forward on its default tiles, then on each candidate tile and on more key splits — the first
    jobs of :func:`kernel_plan` without its training ones."""
    return [job for job in kernel_plan() if job[1].mode == "decode"]


#: the routes that build DIFF V1's [V; V] from V's halves (:func:`diffattn.ops.sdpa.v_twice`), timed again by
#: ``--plan v_copies`` on V1's training classes once ``fused_v_copies`` is on
V_TWICE_ROUTES = ("cudnn+epilogue", "sdpa_split+epilogue", "cudnn", "sdpa_split", "sdpa+epilogue", "sdpa")
#   (the table's first routes of V1's d = 64 and d = 128 training classes first: a short budget times them)


def v_copies_plan() -> list[tuple[str, CallClass]]:
    """The routes of :data:`V_TWICE_ROUTES` on DIFF V1's training classes at d = 64 and 128 (issue 34's two V1
    targets): what a lease times again, in the same folder, after its kernels step turned ``fused_v_copies`` on in
    the run's table (``benchmarks/gpu_session.sh``), so that the targets read the routes as they now run."""
    return [(route, CallClass("v1", d)) for d in (64, 128) for route in V_TWICE_ROUTES]


def _measured_ok(entry: dict | None) -> dict[tuple[str, str], dict]:
    """(route, class) → the entry's measurement, for those that ran correct."""
    ok = {}
    for m in (entry or {}).get("measurements", []):
        if m.get("status") == "ok" and m.get("correct"):
            ok[(m["route"], m["class"])] = m
    return ok


def _measured_fully(entry: dict | None) -> dict[tuple[str, str], dict]:
    """:func:`_measured_ok` less the records timed on other inputs than :data:`INPUTS` (what a model pays was not in
    their time) or sampled otherwise (:data:`~diffattn.bench.sweep_records.SAMPLING`: the host's lead-in was) and
    the decoding records timed before graph times were (no ``graph_ms`` key: the table orders decoding by that time,
    :func:`order_key`): a sweep times them again as missing. A record whose capture was tried and failed
    (``graph_ms`` None) counts as measured: timing it again would fail again."""
    return {
        k: m
        for k, m in _measured_ok(entry).items()
        if is_current(m) and (not k[1].endswith(" decode") or "graph_ms" in m)
    }


def unmeasured_first(plan: list[tuple[str, CallClass]], earlier: dict | None) -> list[tuple[str, CallClass]]:
    """``plan`` with the jobs the earlier entry has no complete measurement of (:func:`_measured_fully`) first —
    those of classes it has no measurement of at all (:func:`new_classes`) before the others, each route by route in
    :data:`SWEEP_ORDER`, then plan order — then the rest: a lease too short for the whole sweep (ten minutes measure
    about four routes on every class) adds what is missing instead of measuring the same routes again — the H200
    run of 2026-11-27 never reached the fused kernel."""
    done = _measured_fully(earlier)
    known = _measured_classes(earlier)
    todo = [j for j in plan if (j[0], j[1].key) not in done]
    # route by route in SWEEP_ORDER (the sweep runs a route on all its classes in one worker): a route the earlier
    # entry lacks on its first class comes before one it lacks only on later classes; the rest keep plan order
    todo.sort(key=lambda j: (j[1].key in known, SWEEP_ORDER.index(j[0]) if j[0] in SWEEP_ORDER else len(SWEEP_ORDER)))
    return todo + [j for j in plan if (j[0], j[1].key) in done]


def new_classes(plan: list[tuple[str, CallClass]], earlier: dict | None) -> frozenset[str]:
    """The classes of ``plan`` the earlier entry has no correct measurement of (none without an earlier entry: then
    every class is new, and one round does them all)."""
    if not earlier:
        return frozenset()
    known = _measured_classes(earlier)
    return frozenset(cls.key for _, cls in plan if cls.key not in known)


def first_round(plan: list[tuple[str, CallClass]], earlier: dict | None) -> frozenset:
    """What the sweep's first round of workers times (:func:`worker_batches`' ``first``): the classes new to the
    earlier entry (:func:`new_classes`), and the table routes' jobs on the call classes issues 34's and 37's targets
    are read on (:data:`diffattn.bench.targets.TARGETS`: the four training classes, V1's forward and its decoding)
    that the entry lacks in full (:func:`_measured_fully`) — so that a lease too short for the whole sweep (about 65
    jobs in five minutes, of some 300) times those first: after the inputs changed (:data:`INPUTS`), every job of
    the entry is missing, and route by route the sweep would time two routes on every class and not reach DIFF V2's
    or the fused kernel."""
    from .targets import TARGETS  # here, not at the top: targets reads this module

    done = _measured_fully(earlier)
    target_classes = {t.where for t in TARGETS if t.kind in ("route", "kernel", "kernel_decode")}
    jobs = {(route, cls.key) for route, cls in plan if cls.key in target_classes and route in routes_for(cls)}
    return new_classes(plan, earlier) | frozenset(jobs - set(done))


def _measured_classes(entry: dict | None) -> set[str]:
    """The classes the entry has a correct measurement of, on any route."""
    return {cls for _, cls in _measured_ok(entry)}


def with_earlier_measurements(records: list[dict], earlier: dict | None) -> list[dict]:
    """This run's records, where a job was skipped for the budget (or not planned) and the earlier entry of the same
    device and software measured it correct, that measurement instead, marked with its date (``measured``). Each
    ratio is to the baseline measured in its own process either way."""
    kept = _measured_ok(earlier)
    out, seen = [], set()
    for r in records:
        key = (r["route"], r["class"])
        seen.add(key)
        if r.get("status", "").startswith("skipped") and key in kept:
            r = {**kept[key], "measured": kept[key].get("measured", earlier["date"])}
        out.append(r)
    out += [{**m, "measured": m.get("measured", earlier["date"])} for key, m in kept.items() if key not in seen]
    return out


def set_aside(path: Path) -> Path | None:
    """An earlier run's file at ``path`` renamed to the first free ``<stem>-<n><suffix>`` beside it (returned), so that
    writing ``path`` anew loses nothing; None where there is none."""
    if not path.exists():
        return None
    n = 1
    while (aside := path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        n += 1
    path.rename(aside)
    return aside


def run(out: Path, budget_s: float, progress: Callable[[str], None] = print, plan=None, **kw) -> dict:
    """The whole sweep on this GPU: records, the table entry merged into a copy of the table it extends
    (``out/route_table.json``), and ``out/routes.md``. The table extended is ``out/route_table.json`` itself where an
    earlier call of the same lease wrote one there — its entry is the earlier measurements this sweep keeps and
    extends, with what a step decided in it (:func:`merge_entry`) — else the shipped one; an earlier ``routes.md`` and
    ``routes.jsonl`` are set aside (:func:`set_aside`), not overwritten."""
    from ..files import write_text_atomic
    from ..ops.routes import ROUTE_TABLE, device_identity, entry_for, load_entries

    start = time.monotonic()
    identity = kw.pop("identity", None) or device_identity()
    own = out / "route_table.json"
    table_path = kw.pop("table_path", None) or (own if own.exists() else ROUTE_TABLE)
    load_entries.cache_clear()  # the table as it is now: an earlier run in this process may have written it
    device = kw.get("device", "cuda")
    matmul = matmul_tflops(device) if device == "cuda" else None
    earlier = entry_for(identity, str(table_path))  # the newest entry of this device and software, or None
    plan = unmeasured_first(plan or default_plan(), earlier)
    kw.setdefault("first", first_round(plan, earlier))
    kw.setdefault("again", frozenset(_measured_fully(earlier)))
    if earlier:
        progress(f"routes: the table has an entry for this device and software of {earlier['date']}: what it lacks "
                 "is measured first, and what this run's budget leaves out is kept from it")  # fmt: skip
    records = sweep(plan, out, budget_s=budget_s - (time.monotonic() - start), progress=progress, **kw)
    records = with_earlier_measurements(records, earlier)
    entry = table_entry(records, identity, datetime.date.today().isoformat())
    entry["matmul_tflops"] = matmul
    merge_entry(table_path, entry, own)
    set_aside(out / "routes.md")
    write_text_atomic(out / "routes.md", to_markdown(records, entry, matmul))
    return {"records": records, "entry": entry, "matmul_tflops": matmul}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help="(internal) run this route over --jobs, appending to --results")
    parser.add_argument("--warm", action="store_true", help="(internal) with --worker: compile only")
    parser.add_argument("--jobs", type=Path)
    parser.add_argument("--results", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="gpu", choices=("gpu", "tiny"))
    parser.add_argument("--extra-routes", help="(tests) a module whose ROUTES maps extra route names to functions")
    parser.add_argument("--out", type=Path, default=Path("benchmarks") / "gpu-report")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--warm-s", type=float, default=120.0, help="at most this long compiling Triton kernels first")
    parser.add_argument(
        "--plan",
        choices=("all", "kernel", "decode", "v_copies"),
        default="all",
        help="all: every route on every class, then the fused kernel's candidates; kernel: only the fused kernel "
        "and its candidates on the train classes (issue 37); decode: only its decoding forward, on its default and "
        "candidate tiles and more key splits (seconds a job); v_copies: V1's one-call routes on its train classes "
        "again (after fused_v_copies went on); the rest of the table entry kept from earlier",
    )
    parser.add_argument(
        "--write-readme",
        type=Path,
        metavar="README",
        help="only rewrite README's speed tables from the shipped route table (no GPU needed)",
    )
    args = parser.parse_args(argv)
    if args.write_readme:
        from ..ops.routes import ROUTE_TABLE

        changed = write_readme_table(args.write_readme, ROUTE_TABLE)
        print(f"{args.write_readme}: speed tables {'rewritten' if changed else 'already current'}")
        return 0
    if args.worker:
        jobs = json.loads(args.jobs.read_text())
        return run_worker(args.worker, jobs, args.results, args.device, args.scale, args.extra_routes, args.warm)
    if not torch.cuda.is_available():
        print(f"route sweep: needs a CUDA device, and torch {torch.__version__} sees none here", file=sys.stderr)
        return 2
    plan = {"kernel": kernel_plan, "decode": decode_plan, "v_copies": v_copies_plan}.get(args.plan, lambda: None)()
    result = run(args.out, args.budget_s, progress=lambda m: print(m, file=sys.stderr, flush=True),
                 plan=plan, warm_s=args.warm_s)  # fmt: skip
    print(to_markdown(result["records"], result["entry"], result["matmul_tflops"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
