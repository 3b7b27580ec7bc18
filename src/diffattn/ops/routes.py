"""Which route ``backend="auto"`` runs on CUDA: the route table, the one home of that decision.

Every route computes the same op (DIFF Transformer Eq. 1, docs/methods.md §0); they differ only in speed, and speed
is a property of the GPU and the software, so it is measured there, not argued here. The route sweep
(:mod:`diffattn.bench.route_sweep`, run by ``make gpu-report``) times every route of every call class on a GPU
against the same-size SDPA baseline, checks each against a float64 reference, and writes one *entry* of the table:
the device, the software versions, the date, and per call class the correct routes fastest first (plus every
measurement, which the README's speed table is made from). ``route_table.json`` beside this file is what the
repository ships; ``DIFFATTN_ROUTE_TABLE=path`` reads another one (the sweep's own, before it is shipped). The routes
are the backends of :func:`diffattn.ops.diff_attention` that run on CUDA (:data:`ROUTE_NAMES`) and the fused kernel's
variants by name (``triton[tma+btma]``: :data:`TRITON_VARIANTS`) and its decoding routes (``triton[decode vec x64 w4
s2 splits 8]``: :func:`decoding_route`), so a variant or decoding candidate the sweep measured correct and fastest on a
class runs there, and only there, without a change of code.

A call class (:func:`call_class`) is what decides the fastest route and can be read off the inputs without running
anything: both maps' keys (``v1``: K1, K2 apart; ``v1_pairs``: the same with Q and K handed over in interleaved pairs;
``shared_k``: K1 is K2 — DIFF V2, DAA, DiffQ), head widths d and dv,
dtype, causal or not, the mask (``none``, key ``padding``, a per-row ``mask4d``, ``segments``) and the mode (``train``:
a gradient will flow; ``infer``: no gradient, T > 1 — prefill with or without a KV cache; ``decode``: T = 1 against a
cache) and, for ``train`` and ``infer``, the size: a call of at most :data:`SMALL_WORK` (B·H·T·S·d: query–key products
per map times the head width) is ``small`` (the key ends in " small"). Why the size: the sweep measures at batch·N =
16K, N = 4096 (decode: a cache of 8192), where the GPU is the limit; a small model's step is host-bound, where a route's
host cost decides (the H200 of 2026-11-27 stepped the `small` model slower than transformers' DiffLlama with the route
chosen at 16K, at no more ops: benchmarks/RESULTS.md), so the sweep also measures the `small` step's own calls and a
small call reads their order. A table without a small class for a call reads the class without the size, and one
without a decoding call's class with a mask the same class without it (:func:`near_classes`). Where the
`small` training step measured another route faster for its small calls than the sweep's first (the entry's
:data:`STEP_FIRST`, written by :mod:`diffattn.bench.switches`: the step times them as the model makes them, with the
head norm the sweep's call leaves out), that route goes first for that class.

An entry is used only where everything it was measured with matches this process: device name and compute
capability, torch, triton and cuDNN versions. Another GPU's or other software's entry is ignored with one log line;
a file that cannot be read or does not follow the format is ignored with one line naming it and the problem. Where
no entry or no class matches: :data:`SAFE_DEFAULT` (``sdpa``), never the fused kernel.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from pathlib import Path

import torch

from ._inputs import DiffAttentionInputs, values_readable

logger = logging.getLogger(__name__)

#: the route of a CUDA call whose class the table does not list
SAFE_DEFAULT = "sdpa"
#: the table the repository ships, and the variable that names another
ROUTE_TABLE = Path(__file__).with_name("route_table.json")
ROUTE_TABLE_ENV = "DIFFATTN_ROUTE_TABLE"
TABLE_FORMAT = 1
#: what an entry must match, in this order (the first mismatch is the one logged)
MATCH_KEYS = ("device", "capability", "torch", "triton", "cudnn")

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def mask_class(inp: DiffAttentionInputs) -> str:
    """``segments``, ``none``, ``padding`` (one value per key: [B|1, 1, 1, S], at T = 1 too — a static KV cache's empty
    slots at decoding; until 2026-11-30 only with T > 1) or ``mask4d``."""
    if inp.segment_ids is not None:
        return "segments"
    mask = inp.attn_mask
    if mask is None:
        return "none"
    if mask.shape[1] == 1 and mask.shape[2] == 1:
        return "padding"
    return "mask4d"


#: the most work, B·H·T·S·d (H one map's query heads), of a ``small`` call, where the host's time for a call is
#: expected to exceed the GPU's: 4x the `small` step's DIFF V1 call (4·4·1024²·64 = 2^30; DIFF V2's 2^31), where on the
#: H200 (2026-11-27) such a call's GPU work (~0.05 ms forward+backward at its matmul rate) would be about a quarter of
#: its host work (~0.2 ms: two SDPA calls and the subtraction's ops, forward and backward) — an estimate, to be
#: replaced by the measured crossing: the H200's second lease (2026-11-27, torch 2.11.0+cu130) timed such calls alone
#: at 1.05–1.60 ms a route against the baseline's 0.27–0.51 ms, mostly host time and too noisy to place it
#: (benchmarks/gpu-runs/h200-2026-11-27b/README.md). Above it: the sweep's standard shapes (2^36–2^37), the paper-830m
#: step at 2,048 tokens (2·8·2048²·96 = 2^32.6), the `small` step at 4,096 tokens (2^34)
SMALL_WORK = 2**32
#: the end of a small call's class key
SMALL = " small"


def small_work(inp: DiffAttentionInputs) -> bool:
    """Whether the call does at most :data:`SMALL_WORK` (B·H·T·S·d): a ``small`` call, whose time is the host's."""
    return work_is_small(inp.batch, inp.num_heads, inp.q_len, inp.kv_len, inp.head_dim)


def work_is_small(b: int, h: int, t: int, s: int, d: int) -> bool:
    """:func:`small_work` of a call of ``b`` rows, ``h`` query heads a map, ``t`` queries, ``s`` keys, head width ``d``
    (a layer asks before it has the call's inputs)."""
    return b * h * t * s * d <= SMALL_WORK


#: the pair of a DIFF V1 call handed over in interleaved pairs (:attr:`DiffAttentionInputs.qk_pairs`): its own classes,
#: for what a route copies depends on the layout (``cudnn_shared_v`` runs on this layout only, the stacked routes
#: join the maps' views here)
V1_PAIRS = "v1_pairs"


def call_class(inp: DiffAttentionInputs, grad: bool | None = None) -> str:
    """The route table's key for this call, e.g. ``"v1 d64 dv128 bf16 causal none train"``, or ``"… train small"``
    for a call of at most :data:`SMALL_WORK` (module docstring). ``grad``: whether a gradient will
    flow (default: grad mode is on and some input requires grad)."""
    if grad is None:
        grad = inp.wants_grad
    mode = "train" if grad else "decode" if inp.q_len == 1 else "infer"
    pair = "shared_k" if inp.shares_keys else "v1" if inp.qk_pairs is None else V1_PAIRS
    small = mode != "decode" and small_work(inp)
    # one query row sees every key whether causal or not (bottom-right alignment): the same call, one class — a model
    # decoding with a mask hands the op causal=False, the mask holding causality (transformers' static cache)
    causal = inp.causal or inp.q_len == 1
    return class_key(pair, inp.head_dim, inp.v_dim, inp.q1.dtype, causal, mask_class(inp), mode, small)


def class_key(pair: str, d: int, dv: int, dtype: torch.dtype | str, causal: bool, mask: str, mode: str,
              small: bool) -> str:  # fmt: skip
    """A call class's key from its parts (:func:`call_class`; the sweep's :class:`diffattn.bench.route_sweep.CallClass`
    names its classes by it): ``dtype`` a torch dtype or its short name (``bf16``)."""
    if isinstance(dtype, torch.dtype):
        dtype = _DTYPES.get(dtype, str(dtype).removeprefix("torch."))
    return f"{pair} d{d} dv{dv} {dtype} {'causal' if causal else 'full'} {mask} {mode}" + (SMALL if small else "")


def software() -> dict[str, str]:
    """The versions a route's speed depends on, as an entry records them."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # not installed, or broken
        triton_version = "none"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch": torch.__version__, "triton": triton_version, "cudnn": str(cudnn)}


def device_identity(index: int | None = None) -> dict[str, str]:
    """What an entry is matched on: the device's name and compute capability and :func:`software`."""
    major, minor = torch.cuda.get_device_capability(index)
    return {"device": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}", **software()}


def _table_path() -> Path:
    return Path(os.environ.get(ROUTE_TABLE_ENV) or ROUTE_TABLE)


def check_table(data: object) -> list[dict]:
    """The entries of a route table file's parsed JSON; ValueError naming the first problem."""
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise ValueError(f'not a route table of format {TABLE_FORMAT} (a JSON object with "format": {TABLE_FORMAT})')
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ValueError('"entries" must be a list')
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {i} is not an object")
        for key in (*MATCH_KEYS, "date"):
            if not isinstance(entry.get(key), str):
                raise ValueError(f"entry {i} has no {key!r} string")
        routes = entry.get("routes")
        if not _class_orders(routes):
            raise ValueError(f"entry {i}: 'routes' must map each call class to a non-empty list of route names")
        eager = entry.get(EAGER_ROUTES, {})
        if not _class_orders(eager) or not set(eager) <= set(routes):
            raise ValueError(f"entry {i}: {EAGER_ROUTES!r} must map classes of 'routes' to a non-empty list of routes")
        routes = {**routes, **{f"{EAGER_ROUTES} {k}": v for k, v in eager.items()}}  # their names checked below too
        for flag in TABLE_FLAGS:
            if not isinstance(entry.get(flag, False), bool):
                raise ValueError(f"entry {i}: {flag!r} must be true or false")
        firsts = entry.get(STEP_FIRST, {})
        pairs = firsts.items() if isinstance(firsts, dict) else None
        if pairs is None or not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
            raise ValueError(f"entry {i}: {STEP_FIRST!r} must map call classes to a route name")
        unknown = {r for r in {r for v in routes.values() for r in v} | set(firsts.values()) if not known_route(r)}
        if unknown:
            raise ValueError(
                f"entry {i} names unknown routes {sorted(unknown)} (known: {', '.join(ROUTE_NAMES)}, "
                f"triton[NAME] or triton[A+B] of the fused kernel's variants {', '.join(TRITON_VARIANTS)}, and its "
                "decoding routes triton[splits N], triton[decode 16xBN wW sS], triton[decode vec xBN wW sS])"
            )
    return entries


def _class_orders(orders: object) -> bool:
    """Whether ``orders`` maps call classes to non-empty lists of route names (an entry's ``routes``)."""
    return isinstance(orders, dict) and all(
        isinstance(k, str) and isinstance(v, list) and v and all(isinstance(r, str) for r in v)
        for k, v in orders.items()
    )


#: the suffix of a route whose last step, O1 − λ·O2, is one Triton kernel (:mod:`diffattn.ops.triton.epilogue`)
#: instead of PyTorch's five element-wise passes
EPILOGUE = "+epilogue"
#: the SDPA routes that have that variant: those that measured fastest on some class, or may with it
EPILOGUE_ROUTES = ("sdpa", "cudnn", "sdpa_split", "sdpa_maps", "cudnn_maps")
#: the one cuDNN call and the epilogue as one autograd node (:mod:`diffattn.ops.direct`): ``cudnn+epilogue``'s
#: kernels with less host work — DIFF V1's maps stacked, or DIFF V2's query pairs over K and V read once
DIRECT = "cudnn_direct"
#: DIFF V1 with Q and K in interleaved pairs (:func:`diffattn.ops.diff_attention_pairs`): one cuDNN call whose grouped
#: heads read V's head j for both maps' query heads 2j and 2j + 1 — no [V; V] — and the epilogue, one autograd node
#: (:mod:`diffattn.ops.direct`)
SHARED_V = "cudnn_shared_v"
#: the same with one cuDNN call per column slice of V as wide as Q (DIFF V1's dv = 2d), as ``sdpa_split`` calls
SHARED_V_SPLIT = "cudnn_shared_v_split"
#: the one-node routes (:mod:`diffattn.ops.direct`): where their node does not apply they run ``cudnn+epilogue``
ONE_NODE_ROUTES = (DIRECT, SHARED_V, SHARED_V_SPLIT)
#: every concrete route a table may name: the backends of :func:`diffattn.ops.diff_attention` (its ``BACKENDS`` are
#: ``auto`` and these, in this order)
ROUTE_NAMES = (
    "reference", "sdpa", "cudnn", "sdpa_split", "sdpa_maps", "cudnn_maps", "chunked", "triton",
    *(route + EPILOGUE for route in EPILOGUE_ROUTES), *ONE_NODE_ROUTES,
)  # fmt: skip


def runs_epilogue(name: str) -> bool:
    """Whether route ``name`` does O1 − λ·O2 by the epilogue's kernel, which can norm the head too
    (:func:`head_norm_in_epilogue`): the ``<route>+epilogue`` routes and the one-node routes."""
    return name.endswith(EPILOGUE) or name in ONE_NODE_ROUTES


#: The fused kernel's variants (:mod:`diffattn.ops.triton.tuning`'s switches, each off for every call by default): a
#: route ``triton[NAME]``, or ``triton[A+B]`` for several, is the fused kernel with those switched on for its own calls
#: (forward and backward), so that a variant the sweep measured faster and correct on a class is what auto runs for
#: it — and nowhere else. Per name: the tuning switch, and the launch kinds only that variant runs (a tile forced for
#: one of them switches its variant on: :func:`diffattn.bench.route_sweep.force_candidate`). Each applies where its
#: kernels take the call and leaves the default kernels elsewhere (a variant's route runs every call the ``triton``
#: route does).
TRITON_VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "atomic": ("ATOMIC_DQ", ("dkdv_atomic",)),  # the single-pass backward
    "split": ("SPLIT_DKDV", ("dv", "dk")),  # the dK/dV kernel as a dV and a dK launch
    "cols": ("FWD_COLUMNS", ("fwd_cols",)),  # the forward by column blocks
    "tma": ("FWD_TMA", ("fwd_tma",)),  # the forward by TMA tiles
    "btma": ("BWD_TMA", ("dkdv_tma", "dq_tma")),  # the two-kernel backward by TMA tiles
    "bws": ("BWD_WS", ("dkdv_ws", "dq_tma")),  # the same, its dK/dV kernel warp-specialised
}
_VARIANT_PREFIX = "triton["


#: A fused-kernel route may also name what its forwards without gradient run (issue 37's decoding): ``triton[splits
#: N]``, split over N key ranges (the heuristic's count otherwise: :func:`diffattn.ops.triton.tuning._num_splits`);
#: ``triton[decode 16xBN wW sS]``, every decoding launch on that candidate tile of
#: :data:`diffattn.ops.triton.tuning.DECODE_TILES`; ``triton[decode vec xBN wW sS]``, every decoding launch of one
#: query row a KV head by vector products on that candidate of :data:`diffattn.ops.triton.tuning.DECODE_VECTORS`;
#: either with `` splits N``. The route sweep times each as a route of the decode classes, so the table lists one
#: where it measured correct and fastest and auto runs it for that class (the step from measured to default without
#: an edit of code). The call carries its choice in its ``variants`` int, above the variants' bits
#: (:func:`decoding_bits`, read back by :func:`decoding_of`).
DECODING_SHIFT = 8
assert len(TRITON_VARIANTS) <= DECODING_SHIFT, "the variants' bits would run into a decoding route's"
#: a decoding route's fields, in bits of its choice above two flags (a tile named; by vector products), in this order
#: and this many bits each: what a field may hold is below 2 to that power
_DECODING_FIELDS = {"block_n": 10, "warps": 5, "stages": 4, "splits": 12}
_NO_DECODING: tuple[None, bool, None] = (None, False, None)


def decoding_bits(tile: tuple[int, int, int] | None = None, vector: bool = False, splits: int | None = None) -> int:
    """A decoding route's choice as bits of a call's ``variants`` (above the variants' own, :data:`DECODING_SHIFT`):
    ``tile`` (BLOCK_N, warps, stages) of a decoding candidate or None, ``vector`` whether by vector products,
    ``splits`` the key splits or None (the heuristic's). ValueError for a field beyond its bits."""
    values = dict(zip(("block_n", "warps", "stages"), tile or (0, 0, 0), strict=True)) | {"splits": splits or 0}
    bits, shift = (1 | int(vector) << 1) if tile is not None else 0, 2
    for name, width in _DECODING_FIELDS.items():
        if not 0 <= values[name] < 1 << width:
            raise ValueError(f"a decoding route's {name} must be below {1 << width}, got {values[name]}")
        bits, shift = bits | values[name] << shift, shift + width
    return bits << DECODING_SHIFT


def decoding_of(variants: int) -> tuple[tuple[int, int, int] | None, bool, int | None]:
    """(tile, vector, splits) of a call's ``variants`` (:func:`decoding_bits`'s inverse; (None, False, None) for a call
    whose route names no decoding choice). Read at every launch, so kept per value (in a plain dict: dynamo, which
    may trace a route's checks, warns on a ``functools.cache`` wrapper)."""
    bits = variants >> DECODING_SHIFT
    if not bits:
        return _NO_DECODING
    choice = _DECODINGS.get(bits)
    if choice is None:
        fields, shift = {}, 2
        for name, width in _DECODING_FIELDS.items():
            fields[name], shift = (bits >> shift) & ((1 << width) - 1), shift + width
        tile = (fields["block_n"], fields["warps"], fields["stages"]) if bits & 1 else None
        choice = _DECODINGS[bits] = (tile, bool(bits & 2), fields["splits"] or None)
    return choice


_DECODINGS: dict[int, tuple[tuple[int, int, int] | None, bool, int | None]] = {}


def decoding_route(inner: str) -> int:
    """The :func:`decoding_bits` of a decoding route ``triton[<inner>]`` (``splits N``, ``decode 16xBN wW sS``,
    ``decode vec xBN wW sS``, the last two optionally with `` splits N``); ValueError naming the form for anything
    else, refused whole: one spelling a route (single spaces, numbers in ASCII digits without leading zeros), so a
    table never names one route twice. Whether the tile is a candidate of its head widths is the kernels' to check
    (:func:`diffattn.ops.triton.tuning.check_decoding`): this module does not import Triton."""
    words = inner.split(" ")
    if words[:1] == ["splits"]:
        if len(words) != 2 or not _count(words[1], "splits"):
            raise ValueError(f"triton[{inner}]: not triton[splits N] (1 <= N < {1 << _DECODING_FIELDS['splits']})")
        return decoding_bits(splits=int(words[1]))
    form = "triton[decode 16xBN wW sS] or triton[decode vec xBN wW sS] (… splits N)"
    if words[:1] != ["decode"]:
        raise ValueError(f"triton[{inner}]: not triton[splits N], {form}")
    vector = words[1:2] == ["vec"]
    words = words[2:] if vector else words[1:]
    tile, rest = words[:3], words[3:]
    well_formed = len(tile) == 3 and tile[0].count("x") == 1 and tile[1][:1] == "w" and tile[2][:1] == "s"
    rows, block_n = tile[0].split("x") if well_formed else ("", "")
    well_formed = (
        well_formed
        and rows == ("" if vector else "16")
        and _count(block_n, "block_n")
        and _count(tile[1][1:], "warps")
        and _count(tile[2][1:], "stages")
        and (not rest or (len(rest) == 2 and rest[0] == "splits" and _count(rest[1], "splits")))
    )
    if not well_formed:
        raise ValueError(f"triton[{inner}]: not {form}")
    splits = int(rest[1]) if rest else None
    return decoding_bits((int(block_n), int(tile[1][1:]), int(tile[2][1:])), vector, splits)


def _count(word: str, field: str) -> bool:
    """Whether ``word`` is a whole number from 1 to what :data:`_DECODING_FIELDS` ``[field]`` holds, in ASCII digits
    without a leading zero."""
    return word.isascii() and word.isdigit() and word[0] != "0" and int(word) < 1 << _DECODING_FIELDS[field]


def fused_route_bits(name: str) -> int | None:
    """The ``variants`` int the fused kernel runs a call of route ``name`` with: 0 for ``triton``, the variants' bits
    for ``triton[A+B]`` (:func:`variant_bits`), a decoding route's (:func:`decoding_route`); None for any other name
    (the route sweep's forced training tiles ``triton[KIND BMxBN wW sS]`` among them: autotuner settings, not
    routes). Asked on every call of auto, so kept per name (a plain dict, as :func:`decoding_of`)."""
    if name == "triton":
        return 0
    if not (name.startswith(_VARIANT_PREFIX) and name.endswith("]")):
        return None
    if name not in _FUSED_ROUTES:
        variants = triton_variants(name)
        try:
            bits = variant_bits(variants) if variants is not None else decoding_route(name[len(_VARIANT_PREFIX) : -1])
        except ValueError:
            bits = None
        _FUSED_ROUTES[name] = bits
    return _FUSED_ROUTES[name]


_FUSED_ROUTES: dict[str, int | None] = {}


def triton_variants(route: str) -> tuple[str, ...] | None:
    """The variants of :data:`TRITON_VARIANTS` route ``triton[A+B]`` names, in its order; None for any other name
    (``triton`` itself, a forced tile ``triton[KIND BMxBN wW sS]``, another route)."""
    if not (route.startswith(_VARIANT_PREFIX) and route.endswith("]")):
        return None
    names = tuple(route[len(_VARIANT_PREFIX) : -1].split("+"))
    return names if all(n in TRITON_VARIANTS for n in names) and len(set(names)) == len(names) else None


def variant_bits(names: tuple[str, ...]) -> int:
    """``names`` of :data:`TRITON_VARIANTS` as the bit mask a fused kernel's call carries (bit i: the i-th name)."""
    order = list(TRITON_VARIANTS)
    return sum(1 << order.index(name) for name in set(names))


def is_triton_route(name: str) -> bool:
    """``triton``, one of its variants' routes or a decoding route (:func:`fused_route_bits`): the fused kernel (which
    reads segments as such)."""
    return fused_route_bits(name) is not None


def known_route(name: str) -> bool:
    """Whether a route table may name ``name``: one of :data:`ROUTE_NAMES`, or a variant or decoding route of the fused
    kernel (:func:`fused_route_bits`)."""
    return name in ROUTE_NAMES or fused_route_bits(name) is not None


@functools.cache
def load_entries(path: str) -> tuple[dict, ...]:
    """The entries of the table at ``path``; none (with one warning naming the file and the problem) where it is
    missing, unreadable or malformed. Read once per path and process."""
    file = Path(path)
    if not file.exists():
        if file != ROUTE_TABLE:
            logger.warning("route table %s: no such file; auto uses %s on CUDA", file, SAFE_DEFAULT)
        return ()
    try:
        return tuple(check_table(json.loads(file.read_text())))
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        logger.warning("route table %s ignored: %s; auto uses %s on CUDA", file, err, SAFE_DEFAULT)
        return ()


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        logger.warning(message)


def entry_for(identity: dict[str, str], path: str) -> dict | None:
    """The newest entry of the table measured on this device with this software, or None (saying once why each
    entry for this device is not used)."""
    matching = []
    for entry in load_entries(path):
        if entry["device"] != identity["device"]:
            continue
        stale = next((k for k in MATCH_KEYS if entry[k] != identity[k]), None)
        if stale is None:
            matching.append(entry)
        else:
            _say_once(
                f"route table {path}: the entry for {entry['device']} of {entry['date']} was measured with {stale} "
                f"{entry[stale]}, this is {identity[stale]}: ignored (auto uses {SAFE_DEFAULT} where no entry "
                "matches; `make gpu-report` measures a new one)"
            )
    return max(matching, key=lambda e: e["date"]) if matching else None


@functools.cache
def device_entry(index: int) -> dict | None:
    """The table entry for CUDA device ``index`` under this process's software, or None. Read once per device (and
    per :func:`reset`)."""
    return entry_for(device_identity(index), str(_table_path()))


def listed_routes(index: int | None, cls: str, eager: bool = False) -> tuple[str, ...]:
    """The routes the table lists for call class ``cls`` on CUDA device ``index`` (None: the current one), fastest
    first, then :data:`SAFE_DEFAULT`; ``(SAFE_DEFAULT,)`` where no entry or class matches (a ``small`` class the
    table lacks: the class without the size). ``eager``: a decoding call run eagerly (:func:`decoding_eagerly`), which
    reads the class's order by eager time where the entry has one (:data:`EAGER_ROUTES`).

    torch.compile takes the result as a constant at trace time (the flag below). It must be this plain function of
    constants that carries the flag: on torch 2.11 dynamo ignores the flag on a ``functools.cache`` wrapper and traces
    into it, and the CUDA queries inside end a ``fullgraph`` trace ("torch.* op returned non-Tensor", H200 run of
    2026-11-27: every decode step of a diffattn model under ``torch.compile``)."""
    entry = device_entry(index if index is not None else torch.cuda.current_device())
    read = read_class(index, cls)
    routes = (entry.get(EAGER_ROUTES) or {}).get(read) if entry and eager else None
    routes = routes or (entry["routes"].get(read) if entry else None)
    if not routes:
        return (SAFE_DEFAULT,)
    routes = step_first_order(entry, cls, routes)
    return tuple(routes) + (() if SAFE_DEFAULT in routes else (SAFE_DEFAULT,))


#: an entry's decoding classes with their routes in the order of their eager times, ``{call class: [route, …]}``
#: (written by the sweep, :func:`diffattn.bench.route_sweep.eager_decode_routes`), where ``routes`` orders a decoding
#: class by its CUDA-graph time: what a decoding call pays depends on how it runs. Replayed from a graph (a static cache
#: under ``torch.compile(mode="reduce-overhead")``, :mod:`diffattn.cuda_graphs`) a call is its GPU time; run eagerly it
#: is its host time as well, which for `small` is all of it (the H200, 2026-11-29: 7.0 ms a token eagerly against 0.40
#: in a graph) and differs by route (V1 d = 64 at the sweep's 8K cache: ``sdpa_maps+epilogue`` first by graph time,
#: 0.149 ms, and 0.449 eagerly; ``cudnn_maps`` 0.301 and 0.339). A decoding call run eagerly reads this order
#: (:func:`decoding_eagerly`); traced or captured, the graph order.
EAGER_ROUTES = "eager_routes"


def decoding_eagerly(cls: str) -> bool:
    """Whether a call of class ``cls`` is a decoding call run eagerly: not traced by torch.compile, not captured into
    a CUDA graph (:func:`diffattn.ops._inputs.values_readable`, the one home of that question): the calls that read
    :data:`EAGER_ROUTES`."""
    return cls.endswith(" decode") and values_readable()


#: an entry's routes the `small` training step put first for its small calls' classes, ``{call class: route}``
#: (:mod:`diffattn.bench.switches`); kept by a later sweep of the same device and software, as the switches are
STEP_FIRST = "step_first"


def step_first_order(entry: dict, cls: str, routes: list[str]) -> list[str]:
    """``routes`` (the order the entry lists for class ``cls``, or for it at the standard size) with the route the step
    put first for ``cls`` (:data:`STEP_FIRST`) ahead of the others — where the sweep checked that route correct
    (:func:`checked_routes`); as they are otherwise."""
    first = (entry.get(STEP_FIRST) or {}).get(cls)
    if first is None or first not in checked_routes(entry, cls):
        return list(routes)
    return [first, *(r for r in routes if r != first)]


def checked_routes(entry: dict, cls: str) -> set[str]:
    """The routes ``entry`` lists as correct for class ``cls`` or for it at the standard size (a small class is the
    same computation on fewer tokens): those a step may put first for it."""
    return set(entry["routes"].get(cls, ())) | set(entry["routes"].get(without_size(cls), ()))


def read_class(index: int | None, cls: str) -> str:
    """The class of the table a call of class ``cls`` reads on CUDA device ``index``: its own where the table measured
    it, else the nearest the table has (:func:`near_classes`); ``cls`` where the table has none. A trace-time constant,
    as :func:`listed_routes`."""
    entry = device_entry(index if index is not None else torch.cuda.current_device())
    table = entry["routes"] if entry else {}
    return next((c for c in (cls, *near_classes(cls)) if c in table), cls)


#: the end of the class key of a decoding call with one mask value per key, and of the same call without the mask
PADDED_DECODE, UNMASKED_DECODE = " padding decode", " none decode"


def near_classes(cls: str) -> tuple[str, ...]:
    """The classes a call of class ``cls`` reads, nearest first, where the table lacks its own: a small call's class at
    the sweep's standard size (:func:`without_size`: the same computation on more tokens); a decoding call with one
    mask value per key — what a model decoding against transformers' static cache hands over, the cache's empty slots
    masked — the same decoding call without the mask (its work: the cache's keys and values, and S mask values more,
    a 64th of one map's keys at d = 64 in bf16). Until 2026-11-30 such a call read nothing and ran the safe default
    (the H200's static-cache decoding of 2026-11-29: ``sdpa``, which copies the whole cache every token)."""
    if cls.endswith(SMALL):
        return (without_size(cls),)
    if cls.endswith(PADDED_DECODE):
        return (cls.removesuffix(PADDED_DECODE) + UNMASKED_DECODE,)
    return ()


listed_routes._dynamo_marked_constant = True  # type: ignore[attr-defined]
read_class._dynamo_marked_constant = True  # type: ignore[attr-defined]


#: an entry's switches for work around the attention call in Triton kernels, each absent = false: nothing changes
#: what runs before a GPU has timed it (diffattn.bench.switches decides them from a run's measurements)
#: — ``fused_head_norm``: an ``<route>+epilogue`` route norms the head in its kernel (:class:`diffattn.ops.HeadNorm`);
#: ``fused_lambda``: DIFF's λ (Eq. 2) each layer's by one kernel each way (:mod:`diffattn.ops.triton.reparam`), where
#: it is otherwise every layer's at once by PyTorch's ops (:func:`diffattn.models.diff_llama.layer_lambdas`) — both
#: timed in the `small` step (train.json's ``+norm`` and ``+lambda`` columns); ``fused_v_copies``: a one-call route's
#: [V; V] and its gradient by one kernel each way for calls above :data:`SMALL_WORK`
#: (:mod:`diffattn.ops.triton.vcopies`), timed on one call at the sweep's standard shape (kernels.json's ``+vcopies``
#: column)
TABLE_FLAGS = ("fused_head_norm", "fused_lambda", "fused_v_copies")
#: a flag's answer where forced (:func:`diffattn.ops.fused_head_norm`, :func:`diffattn.ops.fused_lambda`,
#: :func:`diffattn.ops.fused_v_copies`: benchmarks and tests); None: the table's — and ``heads_in_pairs``, DIFF V1's
#: layer's layout forced (:func:`diffattn.ops.pairs_layout`), which the table decides per class (:func:`pairs_faster`),
#: and ``lambda_per_layer``, every DIFF V1 layer computing its own λ by PyTorch's ops where a model's forward would
#: compute them at once (:func:`diffattn.ops.lambda_per_layer`: a measurement's comparison, nothing a table decides)
FORCED_FLAGS: dict[str, bool | None] = dict.fromkeys((*TABLE_FLAGS, "heads_in_pairs", "lambda_per_layer"))


def table_flag(name: str, index: int | None) -> bool:
    """Switch ``name`` of :data:`TABLE_FLAGS` on CUDA device ``index`` (None: not a CUDA tensor, where nothing is
    measured: false): forced, else the device's entry's. A trace-time constant, as :func:`listed_routes`."""
    if FORCED_FLAGS[name] is not None:
        return bool(FORCED_FLAGS[name])
    if index is None:
        return False
    entry = device_entry(index)
    return bool(entry and entry.get(name, False))


table_flag._dynamo_marked_constant = True  # type: ignore[attr-defined]


def head_norm_in_epilogue(index: int | None) -> bool:
    """Whether an ``<route>+epilogue`` route norms the head in its kernel on CUDA device ``index``
    (:func:`table_flag` ``fused_head_norm``), or leaves the norm to PyTorch after it."""
    return table_flag("fused_head_norm", index)


def lambda_in_kernel(index: int | None) -> bool:
    """Whether DIFF's λ is computed each layer's by the kernels of :mod:`diffattn.ops.triton.reparam` on CUDA device
    ``index`` (:func:`table_flag` ``fused_lambda``), or by PyTorch's ops — every layer's at once in a model's forward
    (:func:`diffattn.models.diff_llama.layer_lambdas`)."""
    return table_flag("fused_lambda", index)


def v_copies_in_kernel(index: int | None) -> bool:
    """Whether a one-call route builds DIFF V1's [V; V] (and its gradient) by the kernels of
    :mod:`diffattn.ops.triton.vcopies` on CUDA device ``index`` (:func:`table_flag` ``fused_v_copies``; for calls above
    :data:`SMALL_WORK`), or by PyTorch's copy."""
    return table_flag("fused_v_copies", index)


#: how much faster a DIFF V1 class's first route must have measured with the heads in pairs than stacked for the layer
#: to hand them over so (:func:`pairs_faster`): the sweep's repeated timings of one route vary by about that
PAIRS_SLACK = 1.02
#: :func:`pairs_faster`'s answers, per device and class (forgotten by :func:`reset`)
PAIRS_MEMO: dict[tuple, bool] = {}


def pairs_faster(index: int | None, cls: str) -> bool:
    """Whether DIFF V1's layer hands the op its heads in interleaved pairs for a call of class ``cls`` (its key with
    the heads stacked, ``v1 …``) on CUDA device ``index`` (None: not CUDA, where nothing is measured: no): where the
    device's entry measured both layouts' classes and the first route of ``v1_pairs …`` (``cudnn_shared_v``, say)
    at a ratio to the baseline below the stacked class's first route's by more than :data:`PAIRS_SLACK` — the layout
    is the layer's choice, so it reads what the sweep measured for each (:mod:`diffattn.models.diff_llama`). A
    trace-time constant, as :func:`listed_routes`."""
    if index is None:
        return False
    key = (index, cls)
    if key not in PAIRS_MEMO:
        entry = device_entry(index)
        stacked = _first_ratio(entry, cls) if entry else math.inf
        in_pairs = _first_ratio(entry, V1_PAIRS + cls.removeprefix("v1")) if entry else math.inf
        PAIRS_MEMO[key] = math.isfinite(stacked) and in_pairs * PAIRS_SLACK < stacked
    return PAIRS_MEMO[key]


pairs_faster._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _first_ratio(entry: dict, cls: str) -> float:
    """The ratio to the baseline the entry measured for class ``cls``'s first listed route (its best correct record;
    inf where the class or the record is missing)."""
    listed = entry["routes"].get(cls)
    if not listed:
        return math.inf
    ratios = [m["ratio"] for m in entry.get("measurements", []) if m.get("class") == cls
              and m.get("route") == listed[0] and m.get("status") == "ok" and m.get("correct") is True
              and isinstance(m.get("ratio"), (int, float)) and math.isfinite(m["ratio"])]  # fmt: skip
    return min(ratios, default=math.inf)


def error_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (at most 300 characters) — what a route
    that failed is logged and recorded by."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"[:300]


def poisons_cuda_context(text: str) -> bool:
    """An error (its text) after which the CUDA context is unusable (every later kernel fails too): no route can be
    handed over to after it."""
    return any(m in text for m in ("illegal memory access", "device-side assert", "unspecified launch failure"))


def without_size(cls: str) -> str:
    """``cls`` at the sweep's standard size (a small call's class without its " small")."""
    return cls.removesuffix(SMALL)


def table_routes(inp: DiffAttentionInputs, cls: str | None = None, eager: bool = False) -> list[str]:
    """:func:`listed_routes` for this call's device and class (``cls``: its :func:`call_class`, where the caller has
    it; ``eager`` as there). (Which of them can run these inputs is :func:`diffattn.ops.auto_backend`'s to check.)"""
    return list(listed_routes(inp.q1.device.index, cls or call_class(inp), eager))


#: :func:`diffattn.ops.table_order`'s answers, per call class, device and what else its routes' checks read (kept here
#: so that :func:`reset` forgets them with the tables they were read from)
ORDER_MEMO: dict[tuple, tuple[str, ...]] = {}


#: how many times :func:`reset` has run: a call's plan (:mod:`diffattn.ops.call_plans`) is keyed by it, so none made
#: from the tables before a reset is used after it
TABLE_GENERATION = 0


def reset() -> None:
    """Forget the tables read, the orders read off them and the lines said, and start a new
    :data:`TABLE_GENERATION` (tests, or after writing a new table in this process)."""
    load_entries.cache_clear()
    device_entry.cache_clear()
    ORDER_MEMO.clear()
    PAIRS_MEMO.clear()
    _SAID.clear()
    global TABLE_GENERATION
    TABLE_GENERATION += 1
