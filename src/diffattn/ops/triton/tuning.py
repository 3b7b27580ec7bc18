"""Which tiles, which backward and how many key splits each launch of the fused kernel gets (DIFF Transformer
Eq. 1, docs/methods.md §0), and the settings that override those choices.

Tiles on a GPU: a default per kernel, head width and mask class (:data:`_TILES`, :data:`_MASK_TILES`), and for the
training forward and both backwards a few alternatives that ``triton.autotune`` times on first use of each shape class
(:data:`_TUNING`, :data:`AUTOTUNE`). Every one of them is compiled ahead of time for sm_90 by
``benchmarks/kernel_report.py`` (registers, spills, MMA kind and warp layout of every dot), without a mask, with key
padding and with bool and additive 4-D masks, and held by the tests to no spills and wgmma for every dot, issued once:
the forward takes 128-row tiles on 8 warps so no warpgroup repeats another's dots. The default tiles are timed by every
route sweep (the ``triton`` rows: H100 2026-11-26, H200 2026-11-27/28, torch 2.11.0+cu130, triton 3.6.0), and each
autotune candidate alone on the H100 of 2026-11-26 (benchmarks/gpu-runs/h100-2026-11-26/candidates/routes.md: the best,
DIFF V1's forward on 128 × 32 tiles and 8 warps, 2.44× the baseline forward+backward at d = 64 against the defaults'
2.61× and that class's fastest route's 2.16×; one V1 backward candidate on the single-pass scheme measured wrong there);
:data:`AUTOTUNE` stays off. A launch that is not autotuned and runs out of shared memory or registers retries with
smaller tiles (:func:`.launch._launch`). Under the interpreter every kernel takes 16 × 16 tiles, so tiny test shapes
span several, partly filled ones.

The backward's scheme (:data:`ATOMIC_DQ`, :func:`_single_pass_fits`) and the decoding forward's key splits
(:data:`SPLIT_OVERRIDE`, :func:`_num_splits`) are chosen here too; :mod:`.launch` reads the settings when it
launches, so a change takes effect on the next call. The variants' switches (:data:`ATOMIC_DQ`, :data:`SPLIT_DKDV`,
:data:`FWD_COLUMNS`, :data:`FWD_TMA`, :data:`BWD_TMA`, :data:`BWD_WS`) are on for a call where set here (for every
call) or where the call asks for them by its ``variants`` bits (a route ``triton[NAME]`` of the route table:
:data:`diffattn.ops.routes.TRITON_VARIANTS`, :func:`_on`). Above those bits a call may carry a decoding route's
choice — a decoding candidate and key splits (``triton[decode vec x64 w4 s2 splits 8]``:
:func:`diffattn.ops.routes.decoding_of`) — which :func:`_decode_tile`, :func:`_decode_vector` and :func:`_num_splits`
read where :data:`DECODE_TILE`, :data:`DECODE_VECTOR` and :data:`SPLIT_OVERRIDE` do not force one for every call.
"""

from __future__ import annotations

import torch
import triton

from ..routes import TRITON_VARIANTS, decoding_of

#: True when the kernels were built for Triton's interpreter: TRITON_INTERPRET=1 when this package was first imported
#: (:mod:`.launch` imports the kernel modules and this one together; triton.jit decides at decoration).
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

#: Backward dQ scheme. True (default) = one pass over key blocks that also adds its share of dQ1, dQ2 with atomic
#: float32 adds (FlashAttention-2): the FLOP ideal, every product a warpgroup MMA on sm_90. False = a second kernel
#: over query blocks that recomputes QKᵀ and dO·Vᵀ (1.4x the ideal) but is bit-for-bit deterministic; it is also
#: used under ``torch.use_deterministic_algorithms(True)``, for heads wider than d = 64, dv = 128 (whose dK1, dK2,
#: dV accumulators for 128 keys do not fit in registers) and for d = 64, dv = 128 with a per-row 4-D mask. Read,
#: like deterministic mode, when the backward runs. Default False, by measurement: on an H200 at B = 4, N = 4096,
#: d = 64, bf16 the two-kernel backward made forward+backward 6.06 ms against 9.24 ms with atomic dQ
#: (../shared/gpu/h200-2026-11-26.md) — the FLOP count said the opposite.
ATOMIC_DQ: bool = False

#: The two-kernel backward's dK/dV kernel as two launches over the same key blocks, dV alone then dK1, dK2 alone
#: (each recomputes P1, P2: 1.25x that kernel's FLOPs), so each can take tiles that the three accumulators together
#: leave no registers for (:data:`_TILES` "dv" and "dk": wide heads 32 x 128 and 16 x 128 on wgmma against "dkdv"'s
#: 32 x 32 on mma.sync; DIFF V1 heads 64 and 32 queries a step against 16). Off until a GPU measures it faster (the
#: route sweep's ``triton[split]`` and its tile candidates); heads with "dk" tiles only (``_split_dkdv``). Read when
#: the backward runs.
SPLIT_DKDV: bool = False

#: Wide heads' forward (without key splits) as one program per half of V's columns: both maps' scores and softmax
#: statistics recomputed by each (1.33x the forward's FLOPs at d = 128, dv = 256), its two float32 accumulators half
#: as wide, for the tiles of :data:`_TILES` "fwd_cols" against "fwd"'s 32 x 32 on mma.sync. Off until a GPU measures
#: it faster (the route sweep's ``triton[cols]`` and its tile candidates); heads with "fwd_cols" tiles only
#: (``_fwd_columns``). Read when the forward runs.
FWD_COLUMNS: bool = False

#: The forward by TMA tiles (:mod:`.forward_tma`: every tile one bulk tensor copy through a descriptor; training, and
#: inference without key splits) for the classes the targets are read on (no user mask or segments, Q1 and Q2 apart,
#: 16-bit inputs, head widths powers of two). Off until a GPU times it faster than the default forward (the route
#: sweep's ``triton[tma]``). Read when the forward runs.
FWD_TMA: bool = False

#: The deterministic two-kernel backward by TMA tiles (:mod:`.backward_tma`), and :data:`BWD_WS` the same with its
#: dK/dV kernel warp-specialised, for the same heads as :data:`FWD_TMA` with one query head per KV head: off until a
#: GPU times them faster than the default backward (the route sweep's ``triton[btma]`` and ``triton[bws]``;
#: ``triton[tma+btma]``, ``triton[tma+bws]`` with the forward's). Read when the backward runs; not with the
#: single-pass backward (:data:`ATOMIC_DQ`) or the split one (:data:`SPLIT_DKDV`).
BWD_TMA: bool = False
BWD_WS: bool = False

#: Time the :data:`_TUNING` alternatives on a GPU (``triton.autotune``, once per kernel, head widths, causality,
#: masks, dtypes and power-of-two bucket of the sequence length) instead of taking the default tiles. Off: on an H200
#: (../shared/gpu/h200-2026-11-26.md) autotuning the single-pass backward ran candidate (16, 64, 4, 1), which died
#: with an illegal memory access and poisoned the CUDA context — a candidate is only timed once it is proven
#: (the route sweep, diffattn.bench.route_sweep, runs each one alone in a process of its own). That candidate is
#: gone (Triton miscompiles its configuration: :data:`MISCOMPILED`).
AUTOTUNE: bool = False

#: Key splits of the forward when it needs no gradient (flash-decoding), or None for the heuristic: split only when
#: the row blocks × batch × KV heads leave most of the GPU idle, as in decoding with few sequences.
SPLIT_OVERRIDE: int | None = None

#: (BLOCK_M, BLOCK_N) forced for every kernel, or None for the heuristics. Under the interpreter the default is
#: 16 × 16, so tiny test shapes span several (and partial) tiles.
BLOCK_OVERRIDE: tuple[int, int] | None = None


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are wrapped for use inside
# kernels too, and cost ~3 µs a call on the host (about half of a decoding step's launch overhead went there).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())  # the next power of two; tl.dot needs every dimension >= 16


# (BLOCK_M, BLOCK_N) per kernel and head-width class on a GPU (bf16/fp16), read off the ahead-of-time report for
# sm_90 (benchmarks/kernel_report.py; its registers, spills and dots per tile are in benchmarks/RESULTS.md), all on
# 8 warps, none spilling:
# * fwd: 128 query rows, so each of the two warpgroups owns 64 rows of every dot and none repeats another's QKᵀ
#   (64 rows on 8 warps did: 1.33x / 1.50x the FLOP ideal); BLOCK_N 64 for d = dv = 64, 32 for dv = 128. Shorter
#   blocks: fwd_mid (33–127 rows: 64-row tiles) and fwd_short (decoding, up to 32 rows: a tile of the row count);
#   "v1" on 32 keys there (64 spilled, with a mask or at 16 rows even without: ptxas held them to 128 registers).
# * dkdv_atomic (the default, single-pass backward): 128 keys per program, the 64 rows per warpgroup wgmma needs,
#   32 / 16 queries per step to keep dK1, dK2, dV in registers; dQᵀ = Kᵀ·dSᵀ has the head dim (64) as rows, so all
#   eight products per step are wgmma. Wide heads have none (their accumulators for 128 keys need more than 255
#   registers): they take dkdv + dq.
# * dkdv, dq (the deterministic backward): the same key tiles without dQ; dq on 128 query rows, so no warpgroup
#   repeats the recomputed QKᵀ and dO·Vᵀ.
# "v2": d + dv <= 128 (d = dv = 64); "v1": <= 192 (d = 64, dv = 128); "wide": larger heads.
_TILES = {
    "fwd": {"v2": (128, 64), "v1": (128, 32), "wide": (32, 32)},
    "fwd_mid": {"v2": (64, 64), "v1": (64, 32), "wide": (32, 32)},
    "fwd_short": {"v2": (64, 64), "v1": (64, 32), "wide": (32, 32)},
    "dkdv": {"v2": (32, 128), "v1": (16, 128), "wide": (32, 32)},
    "dkdv_atomic": {"v2": (32, 128), "v1": (16, 128)},
    "dq": {"v2": (128, 64), "v1": (128, 32), "wide": (32, 64)},
    # the forward by halves of V's columns (FWD_COLUMNS)
    "fwd_cols": {"wide": (128, 32)},
    # the split dK/dV kernel (SPLIT_DKDV): the dV launch, then the dK launch
    "dv": {"wide": (32, 128), "v1": (64, 128)},
    "dk": {"wide": (16, 128), "v1": (32, 128)},
    # the forward by TMA tiles (FWD_TMA): 128 rows on 8 warps as the default forward, 64 keys a step
    "fwd_tma": {"v2": (128, 64), "v1": (128, 64)},
    # the two-kernel backward by TMA tiles (BWD_TMA): the default backward's tiles; its dK/dV kernel warp-specialised
    # (BWD_WS) on the same, launched on 4 warps and built on 12: a producer warp group and two consumers, each 64 of
    # the block's 128 keys
    "dkdv_tma": {"v2": (32, 128), "v1": (16, 128)},
    "dq_tma": {"v2": (128, 64), "v1": (128, 32)},
    "dkdv_ws": {"v2": (32, 128), "v1": (16, 128)},
}

# Tiles with a user mask, where those of _TILES would spill, by mask class ("keys": key padding, one value per key;
# "rows": a per-row 4-D mask, bool or additive, [B, H|1, T, S], a mask tile loaded next to every score tile). On
# _TILES the forward spilled 12–284 bytes on sm_90 with a 4-D mask, and "v2" heads 16–32 with key padding when S is
# not a multiple of 16 (benchmarks/RESULTS.md). With a 4-D mask the forward takes half as many keys per step ("wide":
# half as many rows), the single-pass backward of "v2" heads 16 queries per step, the wide dK/dV kernel 16. The
# single-pass backward of "v1" heads spills with a mask tile at every tile and stage count tried (its dK1, dK2, dV
# accumulators fill the registers), so with a 4-D mask those heads take the deterministic two-kernel backward (no
# spills; 1.4x the backward FLOP ideal, not 1.0x).
_MASK_TILES = {
    # the wide forward by column blocks takes 16 keys per step with every mask (at 32: 16–152 bytes spilled)
    "keys": {"fwd": {"v2": (128, 32)}, "fwd_mid": {"v2": (64, 32)}, "fwd_cols": {"wide": (128, 16)}},
    "rows": {
        "fwd": {"v2": (128, 32), "v1": (128, 16), "wide": (16, 32)},
        "fwd_mid": {"v2": (64, 32), "wide": (16, 32)},
        "fwd_short": {"v2": (64, 16), "wide": (16, 32)},
        "dkdv_atomic": {"v2": (16, 128)},  # no "v1": the two-kernel backward
        "dkdv": {"wide": (16, 32)},
        "dv": {"wide": (16, 128), "v1": (32, 128)},  # 32 x 128 / 64 x 128 spilled 188–212 / 8–136 bytes here
        "fwd_cols": {"wide": (128, 16)},
    },
    # segment ids (sequence packing, without a 4-D mask): a document id per key and per row, compared per tile. The
    # single-pass backward of "v2" heads spilled 8 bytes at 32 queries per step, so it takes 16; the wide dK/dV
    # kernel spilled 312 bytes at 32, so it takes 16
    "segments": {
        "fwd": {"v2": (128, 32)},
        "fwd_mid": {"v2": (64, 32)},
        "dkdv_atomic": {"v2": (16, 128), "v1": (16, 128)},
        "dkdv": {"wide": (16, 32)},
        "dv": {"wide": (16, 128)},  # 32 x 128 spilled 8 bytes with triton 3.6 (the split's dK spills 56 there at
        # every 16-query tile tried, clean with 3.9)
        "fwd_cols": {"wide": (128, 16)},  # 16 bytes spilled with triton 3.6 (48 at 32 keys), clean with 3.9
    },
}


# A forward split over keys (no gradient, too few programs for the SMs: decoding, and prefill of a few long
# prompts) stores float32 partial outputs instead of O1, O2: "v1" on 128-row tiles spilled 88–140 bytes on 32 keys.
_SPLIT_TILES = {"fwd": {"v1": (128, 16)}}

# The decoding forward's candidate launches (issue 37: 0.272 ms a call on the H200 of 2026-11-28 against the
# baseline's 0.071, 4 rows of one token against 8,192 keys), per head-width class: (BLOCK_N, num_warps, num_stages)
# on one 16-row tile. The default decoding launch (a split forward of at most 16 rows: the short forward's tile,
# 16 x 32 for "v1" on 8 warps) holds 142–147 registers a thread — one CTA per SM — and lays its 16 x 32 products
# over 8 warps with a quarter of its dot FLOPs duplicated (benchmarks/kernel_report.py, decode rows: 1,024 per key
# against 768), walking 52 key tiles one after another a program. These take 4 warps (two CTAs per SM at <= 255
# registers: 140–246 on sm_90 with triton 3.6 and 3.9, no spills with any mask class, decoding or a prefill of at
# most 16 rows: benchmarks/RESULTS.md, 2026-11-30) and up to 2x the keys a step —
# "v1" and "wide" first on their default's own tile, so that the warps' share and the tile's are told apart. Each
# runs where a route ``triton[decode 16xBN wW sS]`` is asked for or listed by the route table (a GPU timed it
# correct and fastest for that decode class: :func:`diffattn.ops.routes.decoding_route`), or for every call where
# forced (:data:`DECODE_TILE`); every one is run with its own tile at boundary shapes under the interpreter
# (tests/ops/test_tuning_candidates.py) and compiled for sm_90 by benchmarks/kernel_report.py.
DECODE_TILES: dict[str, list[tuple[int, int, int]]] = {
    # left out as spilling with either Triton or as close to it (255 registers): "v1" 16 x 128 (96 bytes with a
    # mask), 16 x 64 on 3 stages (16 bytes, triton 3.9); "v2" 16 x 128 on 3 stages (16 bytes with a 4-D mask, 16 rows
    # of a short prefill); "wide" 16 x 64 (56 bytes with segments, triton 3.6)
    "v1": [(32, 4, 2), (64, 4, 2)],
    "v2": [(64, 4, 2), (128, 4, 2)],
    "wide": [(32, 4, 2)],
}
#: the decoding rows: a split forward whose rows (query heads per KV head × T) fit one 16-row tile
DECODE_ROWS = 16
#: one of :data:`DECODE_TILES` forced on every decoding launch of its head-width class (a split forward of at most
#: :data:`DECODE_ROWS` rows with 16-bit inputs on a GPU), or None for the default tiles
DECODE_TILE: tuple[int, int, int] | None = None


# Candidates for the decoding forward by vector products (:func:`.decode._decode_vector_kernel`): a split forward
# whose launch has one query row a KV head (T = 1 without GQA, every preset's decoding), each program one row, its
# scores and P·V float32 sums over a [BLOCK_N, d] / [BLOCK_N, dv] tile in registers — (BLOCK_N, warps, stages) by
# head-width class. Each runs where a route ``triton[decode vec xBN wW sS]`` is asked for or listed by the route
# table, or for every call where forced (:data:`DECODE_VECTOR`); run with their own tiles at boundary shapes under
# the interpreter (tests/ops/test_tuning_candidates.py) and compiled for sm_90 by benchmarks/kernel_report.py
# (registers and spills: benchmarks/RESULTS.md, 2026-11-30, "The decoding forward by vector products").
DECODE_VECTORS: dict[str, list[tuple[int, int, int]]] = {
    "v1": [(64, 4, 2), (32, 4, 2), (64, 8, 2)],
    "v2": [(64, 4, 2), (128, 4, 2)],
    "wide": [(32, 4, 2), (32, 8, 2)],
}
#: one of :data:`DECODE_VECTORS` run for every decoding launch of one query row of its head-width class, or None
DECODE_VECTOR: tuple[int, int, int] | None = None


def _decode_vector(
    d: int, dv: int, rows: int, split: bool, segments: bool, variants: int = 0
) -> tuple[int, int, int] | None:
    """The vector candidate of this forward (:data:`DECODE_VECTOR`, else the one its route names in ``variants``:
    ``triton[decode vec xBN wW sS]``, :func:`diffattn.ops.routes.decoding_route`) where it is a decoding launch the
    candidate applies to — split over keys, one query row a KV head, no segment ids, a candidate of its own
    head-width class — else None. Any dtype: the kernel computes in float32 whatever it reads."""
    if not split or rows != 1 or segments:
        return None
    return _decoding_candidate(True, d, dv, variants)


def _decoding_candidate(vector: bool, d: int, dv: int, variants: int) -> tuple[int, int, int] | None:
    """The decoding candidate of one kind — by vector products (``vector``) or on a tile — for a launch of these head
    widths: the one forced for every call (:data:`DECODE_VECTOR`, :data:`DECODE_TILE`), else the one of that kind its
    route names in ``variants``; None unless it is a candidate of its own head-width class (:data:`DECODE_VECTORS`,
    :data:`DECODE_TILES`)."""
    forced = DECODE_VECTOR if vector else DECODE_TILE
    tile, tile_is_vector, _ = decoding_of(variants)
    candidate = forced if forced is not None else tile if tile_is_vector == vector else None
    table = DECODE_VECTORS if vector else DECODE_TILES
    return candidate if candidate in table.get(_width_class(d, dv), ()) else None


def _decoding_launch(kind: str, rows: int, fp32: bool, split: bool) -> bool:
    """Whether a launch is one a decoding candidate (:data:`DECODE_TILES`) may run: a forward split over keys, of at
    most :data:`DECODE_ROWS` rows, with 16-bit inputs."""
    return split and kind.startswith("fwd") and not fp32 and rows <= DECODE_ROWS


def _decode_tile(
    kind: str, d: int, dv: int, rows: int, fp32: bool, split: bool, variants: int = 0
) -> tuple[int, int, int] | None:
    """The decoding tile of this launch (:data:`DECODE_TILE`, else the one its route names in ``variants``:
    ``triton[decode 16xBN wW sS]``) where it is a decoding launch the tile applies to — a candidate of its own
    head-width class (another class's tile may spill here: :data:`DECODE_TILES`' note), tiles not forced or
    interpreted — else None."""
    if BLOCK_OVERRIDE is not None or INTERPRETED or not _decoding_launch(kind, rows, fp32, split):
        return None
    return _decoding_candidate(False, d, dv, variants)


def check_decoding(variants: int) -> None:
    """ValueError where the decoding candidate a route names in ``variants`` (:func:`diffattn.ops.routes.decoding_of`)
    is not one of :data:`DECODE_TILES` (or :data:`DECODE_VECTORS`, by vector products) of any head-width class: only a
    candidate proven under the interpreter and compiled for sm_90 runs, and a name the tables lost (a table measured
    before a candidate was dropped) is an error, not the default tiles under another name."""
    tile, vector, _ = decoding_of(variants)
    table, name = (DECODE_VECTORS, "DECODE_VECTORS") if vector else (DECODE_TILES, "DECODE_TILES")
    if tile is not None and all(tile not in tiles for tiles in table.values()):
        raise ValueError(f"{tile} (BLOCK_N, warps, stages) is not a decoding candidate of tuning.{name}")


def _mask_class(consts: dict) -> str:
    """The mask class of a launch's constexprs: "none", "keys" (key padding), "rows" (a per-row 4-D mask, with or
    without segments) or "segments" (segment ids, with or without key padding)."""
    kind = consts.get("MASK_KIND", 0)  # a kernel without the constexpr takes no mask (.forward_tma)
    if kind != 0 and consts["MASK_ROWS"]:
        return "rows"
    if consts.get("SEGMENTS"):
        return "segments"
    return "none" if kind == 0 else "keys"


# Alternatives the autotuner times against the default tiles on a GPU, as (BLOCK_M, BLOCK_N, num_warps,
# num_stages), for the kernels that dominate training: the forward and the backward (single-pass, and without a mask
# the two kernels), per mask class.
# Every one was compiled ahead of time for sm_90 with no spills and every dot a wgmma issued once
# (benchmarks/kernel_report.py compiles them all, with each kind of mask, and tests/ops/test_kernel_report.py holds
# them to it), so whichever wins is a clean kernel (with CI's Triton; triton 3.6 spills in a few backward ones,
# benchmarks/RESULTS.md). Each also runs under the interpreter with its own tiles at boundary shapes against the
# reference, every memory access checked against its tensors (tests/ops/test_tuning_candidates.py).
#
# No single-pass backward candidate may run one warpgroup (4 warps) with one stage (:data:`MISCOMPILED`). "v1"'s
# (16, 64, 4, 1) did, and on an H100 with triton 3.6 (torch 2.11's) that configuration dies with an illegal memory
# access: (16, 64), (32, 64) and (16, 128) tiles alike, bf16 and fp16, every shape tried; the same tiles on 2 stages
# or on 8 warps, and the deterministic dK/dV kernel on (16, 64, 4, 1), are correct. compute-sanitizer puts the fault
# in shared memory, at the wgmma of dQ2ᵀ = K2ᵀ·dS2ᵀ (backward.py; both its operands are read from shared memory); no
# global access is out of bounds, and under the interpreter the kernel is correct with those tiles at every boundary
# shape. The fault is in the code Triton generates for that configuration, not in the kernel's indexing, so the
# configuration is not a candidate (benchmarks/RESULTS.md, "triton 3.6").
_DKDV_TUNING = {
    "v2": [(32, 128, 8, 1), (16, 128, 8, 2), (32, 64, 4, 2)],
    "v1": [(16, 128, 8, 1)],
}

#: (kernel kind, num_warps, num_stages) that Triton compiles into a kernel that faults (see _DKDV_TUNING above):
#: never a tuning candidate (tests/ops/test_tuning_candidates.py checks every list against it).
MISCOMPILED: frozenset[tuple[str, int, int]] = frozenset({("dkdv_atomic", 4, 1)})
# The two-kernel backward (the default since the H200 run) — issue 37's lever, as the profile put 81% of a step in the
# backward: more query rows per dK/dV step (32 instead of 16 for "v1": twice the rows of every wgmma's K dimension)
# and longer key steps for dQ; for "wide" heads a 128-row dQ tile on two warpgroups (wgmma, against 32 x 64 on
# mma.sync). Compiled for sm_90 (triton 3.9) with no spills and every dot a wgmma issued once; the tiles tried that
# spilled (triton 3.9, bytes): dK/dV "v1" 64x64 w8 728, 32x64 w4 268, 64x128 w8 1996, 32x128 w8 s3 88; "v2" 64x128
# w8 208, 64x64 w4 640 / w8 228; "wide" 32x64 w8 852, 64x32 w8 136, 16x64 w8 320, 32x32 w4 556; dQ "v2" 128x128 w8
# 1000, 64x128 w8 188; "wide" 64x64 w8 316, 64x32 w4 16, 32x64 w4 96. With triton 3.6 (torch 2.11's) the "v1"
# dK/dV 32x128 w8 spills 40 bytes (the GPU decides). Not yet timed: the route sweep runs each alone.
_TWO_KERNEL_TUNING = {
    "dkdv": {"v1": [(32, 128, 8, 2)], "v2": [(32, 64, 4, 2), (16, 128, 8, 2)]},
    "dq": {"v1": [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2)], "v2": [(64, 64, 4, 2), (128, 32, 8, 2)],
           "wide": [(128, 32, 8, 2)]},
}  # fmt: skip
# The split dK/dV kernel (SPLIT_DKDV): the other tiles that compile clean. Wide heads (triton 3.9; spilled: dV
# 32x128 w8 s3 72, 64x64 w4 1132, 64x128 w8 760; dK 32x64 w4 560 / w8 280, 32x128 w8 172, 64x64 w8 940, 16x64 w4 52;
# dK 16x64 w8 is clean but repeats G on both warpgroups). DIFF V1 heads (d = 64, dv = 128; spilled: dK 64x128 w8
# 72, 64x64 w4 528, 32x64 w4 24 with triton 3.6). Not yet timed.
_SPLIT_TUNING = {
    "dv": {"wide": [(32, 64, 8, 2), (16, 128, 8, 2)], "v1": [(32, 128, 8, 2)]},
    "dk": {"wide": [(16, 128, 8, 3)]},
}
# The wide forward by column blocks (FWD_COLUMNS): 128 x 16 beside the default 128 x 32 (spilled, triton 3.9: 64 x 64
# w8 184, 64 x 32 w4 40, 128 x 64 w8 476; 64 x 32 w8 is clean but repeats QKᵀ on both warpgroups). Not yet timed.
_COLUMNS_TUNING = {"fwd_cols": {"wide": [(128, 16, 8, 2)]}}
_TUNING = {
    "none": {
        "fwd": {"v2": [(128, 64, 8, 3), (128, 32, 8, 2), (64, 32, 4, 2)], "v1": [(128, 32, 8, 3), (64, 16, 4, 2)]},
        "dkdv_atomic": _DKDV_TUNING,
        **_TWO_KERNEL_TUNING,
        **_SPLIT_TUNING,
        **_COLUMNS_TUNING,
    },
    "keys": {
        "fwd": {"v2": [(128, 32, 8, 3), (64, 32, 4, 2)], "v1": [(128, 32, 8, 3), (64, 16, 4, 2)]},
        "dkdv_atomic": _DKDV_TUNING,
    },
    "rows": {
        "fwd": {"v2": [(128, 32, 8, 3), (64, 16, 4, 2)], "v1": [(128, 16, 8, 1), (64, 16, 4, 2)]},
        "dkdv_atomic": {"v2": [(16, 128, 8, 1), (16, 64, 4, 2)]},
    },
    "segments": {  # (32, 128) for "v2" and (16, 64) on 4 warps for "v1" spilled 8–16 bytes
        "fwd": {"v2": [(128, 32, 8, 3), (64, 32, 4, 2)], "v1": [(128, 32, 8, 3), (64, 16, 4, 2)]},
        "dkdv_atomic": {"v2": [(32, 64, 4, 2)], "v1": [(16, 128, 8, 1)]},
    },
}


def _tunable(kind: str, d: int, dv: int, rows: int, fp32: bool, split: bool = False, mask: str = "none") -> bool:
    """Whether this launch is autotuned: a GPU, 16-bit inputs, a kernel, head-width class and mask class (see
    :func:`_mask_class`) with alternatives, and for the forward a training-size row count without key splits
    (decoding and short rows keep their heuristic tile)."""
    if not AUTOTUNE or INTERPRETED or BLOCK_OVERRIDE is not None or fp32 or split:
        return False
    return _width_class(d, dv) in _TUNING[mask].get(kind, {}) and (not kind.startswith("fwd") or rows >= 128)


def _candidates(
    kind: str, d: int, dv: int, rows: int, fp32: bool = False, split: bool = False, mask: str = "none"
) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) this launch may run with: the default first, then the
    autotuner's alternatives when it is tuned. ``mask``: the mask class (:func:`_mask_class`)."""
    default = (
        *_blocks(kind, d, dv, rows, fp32, mask, split),
        _launch_options(kind, d, dv, rows, fp32, split)["num_stages"],
    )
    if not _tunable(kind, d, dv, rows, fp32, split, mask):
        return [default]
    return [default, *_TUNING[mask][kind][_width_class(d, dv)]]


_AUTOTUNERS: dict[tuple, object] = {}


def _autotuner(kernel, kind: str, d: int, dv: int, mask: str = "none"):
    """The ``triton.autotune`` wrapper of ``kernel`` over this kind, width class and mask class's candidates (one
    per class, made on first use). The atomic backward's dQ buffers are zeroed before every timed run and the
    final one."""
    key = (kind, _width_class(d, dv), mask)
    if key not in _AUTOTUNERS:
        configs = [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in _candidates(kind, d, dv, rows=1 << 30, mask=mask)
        ]
        _AUTOTUNERS[key] = triton.autotune(
            configs,
            key=["N_BUCKET", "D", "DV", "CAUSAL", "MASK_KIND", "MASK_ROWS", "SEGMENTS", "SHARED_Q", "SHARED_K"],
            reset_to_zero=["DQ1", "DQ2"] if kind == "dkdv_atomic" else None,
        )(kernel)
    return _AUTOTUNERS[key]


def _blocks(
    kind: str,
    d: int,
    dv: int,
    rows: int,
    fp32: bool = False,
    mask: str = "none",
    split: bool = False,
    variants: int = 0,
) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) per kernel: :data:`_TILES` on a GPU, or :data:`_MASK_TILES` where it has
    tiles for the mask class, or :data:`_SPLIT_TILES` for a key-split forward. Float32 inputs (IEEE dots, twice
    the bytes per tile) spill heavily at those sizes, so they get tiles half as long; a forward with fewer rows
    than the tile (decoding: rows = (H/Hkv)·T) gets a tile of its row count; a decoding launch its candidate tile
    where one is forced or its route names one (``variants``: :func:`_decode_tile`)."""
    if BLOCK_OVERRIDE is not None:
        return (*BLOCK_OVERRIDE, 4)
    if INTERPRETED:
        return 16, 16, 4
    decode = _decode_tile(kind, d, dv, rows, fp32, split, variants)
    if decode is not None:
        return 16, decode[0], decode[1]
    cls = _width_class(d, dv)
    if kind == "fwd" and rows < 128:
        kind = "fwd_short" if rows <= 32 else "fwd_mid"
    bm, bn = _MASK_TILES.get(mask, {}).get(kind, {}).get(cls) or _TILES[kind][cls]
    if split:
        bm, bn = _SPLIT_TILES.get(kind, {}).get(cls, (bm, bn))
    if fp32:
        bm, bn = max(16, bm // 2), max(16, bn // 2)
    if kind.startswith("fwd"):
        bm = min(bm, _pow2(rows))
    # warp specialisation on sm_90 (triton 3.6, 3.9) partitions a kernel launched on one warp group, adding the
    # producer's and the second consumer's: on 8 warps it is silently not applied (benchmarks/kernel_report.py)
    return bm, bn, 4 if kind in WS_KINDS else 8


def _compile_options(kind: str, rows: int) -> dict:
    """Extra Triton compile options of a launch. Forwards of fewer than 128 rows (decoding, prefill and training
    blocks of short sequences: 8 warps on 16–64-row tiles) get ``maxnreg`` = 255: ptxas otherwise held some of
    them to 128 registers (two CTAs per SM) and spilled 16–80 bytes rather than use more
    (benchmarks/kernel_report.py, the short, prefill and decode rows)."""
    return {"maxnreg": 255} if kind == "fwd" and rows < 128 else {}


def _launch_options(
    kind: str, d: int, dv: int, rows: int, fp32: bool = False, split: bool = False, variants: int = 0
) -> dict:
    """``num_stages`` and the compile options (:func:`_compile_options`) of a launch on its heuristic tiles
    (:func:`_blocks`): 2 stages, or a decoding tile's own (:func:`_decode_tile`)."""
    decode = _decode_tile(kind, d, dv, rows, fp32, split, variants)
    return {"num_stages": 2 if decode is None else decode[2], **_compile_options(kind, rows)}


def _width_class(d: int, dv: int) -> str:
    """The head-width class of :data:`_TILES`: "v2" (d + dv <= 128, DIFF V2), "v1" (<= 192, DIFF V1), "wide"."""
    width = _pow2(d) + _pow2(dv)
    return "v2" if width <= 128 else "v1" if width <= 192 else "wide"


def _has_tiles(kind: str, d: int, dv: int, mask: str = "none") -> bool:
    """Whether launch ``kind`` has GPU tiles for these head widths and mask class: the mask class's own table for the
    kind where it has one (:data:`_MASK_TILES`: it then lists every width class the kind takes with that mask), else
    :data:`_TILES`."""
    return _width_class(d, dv) in _MASK_TILES.get(mask, {}).get(kind, _TILES[kind])


#: each switch's bits in a call's ``variants`` (:func:`diffattn.ops.routes.variant_bits`): the variants it switches on
_SWITCH_BITS: dict[str, int] = {
    switch: sum(1 << i for i, (other, _) in enumerate(TRITON_VARIANTS.values()) if other == switch)
    for switch, _ in TRITON_VARIANTS.values()
}


def _on(switch: str, variants: int = 0) -> bool:
    """Whether variant switch ``switch`` (e.g. ``"FWD_TMA"``) is on for a call: set here for every call, or asked
    for by the call's ``variants`` bits (its route, ``triton[NAME]``)."""
    return bool(globals()[switch]) or bool(variants & _SWITCH_BITS[switch])


def _single_pass_fits(d: int, dv: int, mask: str = "none") -> bool:
    """Whether the one-pass (atomic dQ) backward has spill-free tiles for these head widths and mask class (not for
    "wide" heads, nor for "v1" heads with a per-row 4-D mask: :data:`_MASK_TILES`)."""
    if INTERPRETED or BLOCK_OVERRIDE is not None:
        return True
    return _has_tiles("dkdv_atomic", d, dv, mask)


def _split_dkdv(d: int, dv: int, mask: str = "none", variants: int = 0) -> bool:
    """Whether the two-kernel backward's dK/dV kernel runs as a dV launch and a dK launch (:data:`SPLIT_DKDV`, or
    asked for by ``variants``): for heads of a class with "dk" tiles (the wide ones), and for any heads under forced
    tiles (the interpreter's tests)."""
    if not _on("SPLIT_DKDV", variants):
        return False
    if INTERPRETED or BLOCK_OVERRIDE is not None:
        return True
    return _has_tiles("dk", d, dv, mask)


def _fwd_columns(d: int, dv: int, mask: str = "none", variants: int = 0) -> int:
    """The width of V's column block each forward program takes under :data:`FWD_COLUMNS` (or asked for by
    ``variants``; half of V's padded width), or 0 for the whole width: for heads of a class with "fwd_cols" tiles (the
    wide ones), and for any heads wide enough to halve (32 columns or more) under forced tiles (the interpreter's
    tests)."""
    if not _on("FWD_COLUMNS", variants):
        return 0
    half = _pow2(dv) // 2
    if INTERPRETED or BLOCK_OVERRIDE is not None:
        return half if half >= 16 else 0
    return half if _has_tiles("fwd_cols", d, dv, mask) else 0


def _tma_heads(d: int, dv: int, mask: str, kinds: tuple[str, ...]) -> bool:
    """Whether heads of these widths and mask class can take the TMA kernels of launch ``kinds``: no user mask or
    segments, both widths powers of two of at least 16 (a descriptor's block is a whole row), a class with tiles for
    every kind on a GPU (any under the interpreter's forced tiles)."""
    if mask != "none" or d != _pow2(d) or dv != _pow2(dv):
        return False
    return INTERPRETED or BLOCK_OVERRIDE is not None or all(_has_tiles(k, d, dv, mask) for k in kinds)


def _fwd_tma(d: int, dv: int, mask: str = "none", variants: int = 0) -> bool:
    """Whether the forward runs by TMA tiles (:data:`FWD_TMA`, or asked for by ``variants``) for these head widths
    and mask class (:func:`_tma_heads`). Key splits, Q1 shared with Q2 and the tensors' layout are checked where the
    launch has them (:func:`.launch._tma_fits`)."""
    return _on("FWD_TMA", variants) and _tma_heads(d, dv, mask, ("fwd_tma",))


#: the launch kinds built warp-specialised: launched on one warp group (:func:`_blocks`)
WS_KINDS = frozenset({"dkdv_ws"})


def _bwd_tma(d: int, dv: int, mask: str = "none", variants: int = 0) -> bool:
    """Whether the two-kernel backward runs by TMA tiles (:data:`BWD_TMA` or :data:`BWD_WS`, or asked for by
    ``variants``) for these head widths and mask class (:func:`_tma_heads`, with the backward's tile tables). One
    query head per KV head, Q1 apart from Q2 and the layout are checked where the launch has the tensors."""
    ws = _on("BWD_WS", variants)
    return (ws or _on("BWD_TMA", variants)) and _tma_heads(d, dv, mask, ("dkdv_ws" if ws else "dkdv_tma", "dq_tma"))


def _num_splits(device: torch.device, programs: int, s: int, block_n: int, variants: int = 0) -> int:
    """Key splits for a forward without gradient: :data:`SPLIT_OVERRIDE` (every call), else none where there are as
    many programs as SMs or more, else the count the call's route names in ``variants`` (``triton[splits N]``,
    ``triton[decode … splits N]``), else enough programs to fill the GPU about twice (decoding), each split at least
    one key tile long (four tiles, as before, left half the SMs idle at B = 1 below 2K keys). A route's count was
    measured where the GPU was under-filled (the sweep's decode class: 64 programs on 132 SMs), so it applies there
    only: a large batch's decoding fills the GPU unsplit, as the heuristic has it. Off CUDA (the interpreter's tests)
    the route's count, else none."""
    if SPLIT_OVERRIDE is not None:
        return max(1, SPLIT_OVERRIDE)
    route = decoding_of(variants)[2]
    if device.type != "cuda":
        return route or 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if programs >= sms:
        return 1
    return route or max(1, min(_cdiv(2 * sms, programs), _cdiv(s, block_n), 128))


_SM_COUNT: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]
