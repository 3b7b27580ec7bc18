"""Where one DIFF attention call's time goes on a GPU, kernel by kernel, route beside route (DIFF Transformer Eq. 1).

Why (issue 34): on the H200 (2026-11-27, two leases) DIFF V1 at d = 64 trains at 1.92–1.93× the SDPA baseline
through its fastest route, ``cudnn_maps``, where one cuDNN call over both maps' query heads stacked against [K1; K2]
with V twice — the inputs made beforehand, nothing around the call — did 1.50× (``../shared/gpu/h200-2026-11-26.md``,
its last table); issue 34's target is 1.55×. The gap, about 0.4× of the baseline (≈ 0.6 ms a call at the sweep's
shape), is everything a route does around cuDNN: the subtraction O1 − λ·O2 and its backward, V's halves joined,
the two maps' dV summed, or cuDNN's own kernels being slower on half the heads. A time cannot say which; the
kernels can. This runs, on the route sweep's inputs at its standard shape (:mod:`diffattn.bench.route_sweep`):

* ``baseline`` — SDPA over 2h heads of width d (default dispatch), as the sweep's ratios are taken against;
* ``cuDNN floor`` (V1 classes) — that one stacked cuDNN call over inputs made before it (leaves: the model's Q
  [B, 2h, T, d] and K [B, 2h, S, d], both maps' heads already, and V [B, 2h, S, 2d]), whose output is O1 and O2
  side by side, not subtracted: what the routes can approach, not a route; for V1 in interleaved pairs, the one cuDNN
  call over the model's Q and K as they are and V [B, h, S, 2d] once (cuDNN's grouped heads: ``cudnn_shared_v``'s
  call, through cuDNN's ATen op);
* each route asked for (``--routes``; by default :data:`DEFAULT_ROUTES`), through :func:`diffattn.ops.diff_attention`,
  or one of the route sweep's comparison routes (``hf_two_calls``: transformers' DiffLlama; ``official_four_calls``);
  a route named with a suffix of :data:`diffattn.bench.train_step.FUSED` runs with that route-table switch forced on
  (``cudnn+epilogue+vcopies``: [V; V] by its kernels, :mod:`diffattn.ops.triton.vcopies`), which
  :mod:`diffattn.bench.switches` decides from the GPU busy times of it and its plain twin.

For each: the median time per call (forward+backward for ``train``, forward otherwise) in interleaved rounds, its
ratio to the baseline, and a :func:`diffattn.bench.kernels.profile_gpu` of a few calls: the kernels by name with ms
and launches per call. A route that fails is one line and no column. Needs CUDA; ``benchmarks/gpu_session.sh`` runs
it as its ``kernels`` step (``kernels.json``).

Usage: python -m diffattn.bench.call_kernels [--class KEY ...] [--routes a,b] [--calls 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..ops.routes import SHARED_V, SHARED_V_SPLIT, V1_PAIRS, error_line
from .kernels import LAUNCH_CALLS, calls_of, format_kernel_table, profile_gpu, profile_host
from .route_sweep import (
    DTYPES,
    CallClass,
    Problem,
    baseline_call,
    interleaved_ms,
    make_problem,
    route_fn,
    shape_of,
    whole_v,
    with_backward,
)
from .train_step import split_fused, switches_forced

#: what the gaps are about: the V1 and DIFF V2 training calls at d = 64 at the sweep's shape (issue 34's targets:
#: 1.55x and 2.3x; measured 1.93x and 2.42x), and V1's decoding call (issue 37: "what is in 0.30 ms"; on the H200 of
#: 2026-11-28 the fused kernel's was 0.272 ms replayed from a CUDA graph, 0.702 eager, the baseline's 0.071)
DEFAULT_CLASSES = (
    "v1 d64 dv128 bf16 causal none train",
    "shared_k d64 dv64 bf16 causal none train",
    "v1 d64 dv128 bf16 causal none decode",
    "v1 d128 dv256 bf16 causal none train",
    # DIFF V1 in interleaved pairs, V read once (cudnn_shared_v, its floor): never run on a GPU, so last — a crash
    # there ends this process after the other classes' rows (each written as it is done)
    "v1_pairs d64 dv128 bf16 causal none train",
)
#: a class's own routes where it has them (else its pair's, :data:`DEFAULT_ROUTES`): V1 at d = 128, whose fastest
#: route on the H200 (2026-11-28, 2.51x against issue 34's 2.3x) and cuDNN's one call, each with [V; V] by its kernels
CLASS_ROUTES = {
    "v1 d128 dv256 bf16 causal none train": (
        "sdpa_split+epilogue",
        "cudnn+epilogue",
        "sdpa_split+epilogue+vcopies",
        "cudnn+epilogue+vcopies",
    ),
}
#: per pair, the routes beside the baseline: the fastest ones of the H200's table, the epilogue variants after them
#: and what has never run on a GPU ([V; V] by its kernels) last, so that a crash there ends this process after the
#: others' rows
DEFAULT_ROUTES = {
    # hf: transformers' DiffLlama
    "v1": (
        "cudnn_maps",
        "cudnn",
        "sdpa_maps",
        "hf_two_calls",
        "cudnn_maps+epilogue",
        "cudnn+epilogue",
        "cudnn+epilogue+vcopies",
    ),
    "shared_k": ("sdpa", "cudnn_maps", "sdpa_maps", "sdpa+epilogue"),
    # DIFF V1 in interleaved pairs: V read once by cuDNN's grouped heads, against the stacked layout's fastest route
    # (which joins the pairs' views here)
    V1_PAIRS: ("cudnn+epilogue", SHARED_V, SHARED_V_SPLIT),
}
#: a decoding class's routes: the fused kernel (its key-split forward and the combine) beside the table's fastest —
#: and, on a GPU, the route the device's table lists first for the class where it is another (:func:`decode_routes`:
#: after a decode sweep, its fastest decoding candidate, ``triton[decode vec …]``: issue 37 asks what is in its time)
DECODE_ROUTES = ("triton", "sdpa_maps", "sdpa_maps+epilogue", "cudnn_maps")


def decode_routes(key: str, device: str) -> tuple[str, ...]:
    """:data:`DECODE_ROUTES`, and the route the route table lists first for decoding class ``key`` on CUDA ``device``
    where it is not among them (the table this process reads: the sweep's own in the GPU script); off CUDA, the
    fixed ones."""
    where = torch.device(device)
    if where.type != "cuda":
        return DECODE_ROUTES
    from ..ops.routes import SAFE_DEFAULT, listed_routes

    first = listed_routes(where.index or 0, key)[0]
    return DECODE_ROUTES + (() if first in DECODE_ROUTES or first == SAFE_DEFAULT else (first,))


FLOOR = "cuDNN floor"


def columns_for(cls: CallClass, p: Problem, routes: tuple[str, ...]) -> dict[str, Callable[[], None]]:
    """The functions timed and profiled, by column: ``baseline``, :data:`FLOOR` (V1 classes without a mask) and each
    route."""
    train = cls.mode == "train"
    columns = {"baseline": with_backward(baseline_call(p), p.base_leaves, train)}
    if cls.pair == V1_PAIRS and cls.mask == "none":
        # the model's Q and K in pairs and V of half their heads, as they are: cuDNN's ATen op directly (SDPA's API
        # cannot give K and V two head counts), its grouped heads reading V's head j for query heads 2j and 2j + 1
        q, k, v = (x.detach().requires_grad_(train) for x in p.heads)

        def shared_floor():
            return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, train, 0.0, p.causal, False)[0]

        columns[FLOOR] = with_backward(shared_floor, [q, k, v], train)
    if cls.pair == "v1" and cls.mask == "none":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # the model's Q and K are both maps' heads stacked already (the maps are chunks of them): as they are; V,
        # each DIFF head's [va | vb] once for each map's heads, made beforehand (a copy the model would pay)
        q, k = (x.detach().requires_grad_(train) for x in p.heads[:2])
        v = torch.cat([whole_v(p.diff)] * 2, 1).detach().requires_grad_(train)

        def floor():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=p.causal)

        columns[FLOOR] = with_backward(floor, [q, k, v], train)
    for route in routes:
        base, fused = split_fused(route)
        fn = route_fn(base, {})

        def call(fn=fn, fused=fused):
            with switches_forced(fused):
                return fn(p)

        columns[route] = with_backward(call, p.leaves, train)
    return columns


def run(key: str, routes: tuple[str, ...] | None = None, calls: int = 5, device: str = "cuda", scale: str = "gpu",
        progress: Callable[[str], None] = print) -> dict:  # fmt: skip
    """One class (a route table key) and ``routes`` (default: its own of :data:`CLASS_ROUTES`, else
    :data:`DEFAULT_ROUTES` of its pair; for decoding :func:`decode_routes`). Per column: ``ms`` (median per call,
    interleaved), ``ratio`` to the baseline, ``gpu_ms`` (busy per call) and ``kernels`` (per call); ``failed``: column
    → error line. For a decoding class also ``host_ms`` (the host's time per call under the profiler, until the call
    returned) and ``host`` (where it went: :func:`diffattn.bench.kernels.profile_host`): an eager decoding call of
    every DIFF route was host-bound on the H200 (2026-11-29: ``triton`` 0.50 ms a call against 0.27 of GPU time,
    ``sdpa_maps`` 0.50 against 0.15; the baseline 0.073 against 0.070), and issue 37 asks what is in that time.
    ``scale="tiny"`` and a CPU device: the columns run, nothing is profiled on the GPU (tests)."""
    cls = CallClass.from_key(key)
    if routes is None:
        routes = decode_routes(key, device) if cls.mode == "decode" else CLASS_ROUTES.get(key, DEFAULT_ROUTES[cls.pair])
    shape = shape_of(cls, scale)
    p = make_problem(cls, **shape, device=device, dtype=DTYPES[cls.dtype], seed=1)
    columns, failed = {}, {}
    for name, fn in columns_for(cls, p, routes).items():
        try:  # the first calls compile and warm up; a route that cannot run is a line, not the end
            for _ in range(3):
                fn()
            columns[name] = fn
        except Exception as err:
            failed[name] = error_line(err)
            progress(f"{name}: failed: {failed[name]}")
    ms = interleaved_ms(columns, device)
    out = {"class": key, "shape": shape, "calls": calls, "columns": {}, "failed": failed}
    for name, fn in columns.items():
        column = {"ms": ms[name], "ratio": ms[name] / ms["baseline"]}
        if torch.device(device).type == "cuda":
            try:
                profiled = profile_gpu(fn, calls)
            except Exception as err:  # the kernels are an aid to reading the times, not the times
                profiled = None
                progress(f"{name}: not profiled: {error_line(err)}")
            if profiled is not None:
                column["gpu_ms"], column["kernels"] = profiled
        if cls.mode == "decode":
            try:
                column["host_ms"], column["host"] = profile_host(fn, calls)
            except Exception as err:  # an aid to reading the times, as the kernels are
                progress(f"{name}: host not profiled: {error_line(err)}")
        out["columns"][name] = column
    return out


def format_result(result: dict) -> str:
    """The times and ratios, one line per column, then the kernel table (where profiled)."""
    lines = [f"one call of {result['class']} at {result['shape']}: ms per call (ratio to the baseline, GPU busy ms)"]
    for name, c in result["columns"].items():
        busy = f", gpu {c['gpu_ms']:.3f}" if "gpu_ms" in c else ""
        lines.append(f"  {name:<24} {c['ms']:8.3f} ms  ({c['ratio']:.2f}x{busy})")
    lines += [f"  {name:<24} failed: {why}" for name, why in result["failed"].items()]
    tables = {name: c["kernels"] for name, c in result["columns"].items() if "kernels" in c}
    if tables:
        title = f"kernels per call, ms (launches), mean of {result['calls']} profiled calls"
        lines += ["", format_kernel_table(title, tables)]
    hosts = {name: c["host"] for name, c in result["columns"].items() if "host" in c}
    if hosts:
        lines += ["", "host per call under the profiler (its Python tracer adds its own time): ms, kernel launches"]
        lines += [f"  {name:<24} {result['columns'][name]['host_ms']:8.3f} ms  {calls_of(table, LAUNCH_CALLS):4.0f}"
                  for name, table in hosts.items()]  # fmt: skip
        title = f"host time per call, self ms (calls), rows by the most beyond the baseline, {result['calls']} calls"
        lines += ["", format_kernel_table(title, hosts, what="host", beyond_first=True)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--class", dest="keys", action="append", help=f"a route table class, repeatable (default: {DEFAULT_CLASSES})"
    )
    parser.add_argument("--routes", help="comma-separated diff_attention backends (default: per pair, DEFAULT_ROUTES)")
    parser.add_argument("--calls", type=int, default=5, help="calls per profile (the table is per call)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"call kernels: needs a CUDA device, and torch {torch.__version__} sees none here", file=sys.stderr)
        return 2
    routes = tuple(filter(None, args.routes.split(","))) if args.routes else None
    results = []
    for key in args.keys or DEFAULT_CLASSES:
        results.append(run(key, routes, args.calls, progress=lambda m: print(m, file=sys.stderr, flush=True)))
        print(format_result(results[-1]) + "\n", flush=True)
        if args.json:  # after each class: a later one that crashes the process keeps the earlier ones
            from ..files import write_text_atomic  # never a half-written file in place of the classes measured

            write_text_atomic(args.json, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
