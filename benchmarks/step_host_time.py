"""The host's share of a training step, side by side, on the CPU: what a `small` model's step costs before any kernel
does work — the part that decides its time on a GPU, where that step is host-bound (the H200 of 2026-11-28: the
baseline's GPU busy 8.6 ms of its 40; DIFF's step 17 ms longer at 1.5 ms more GPU time). Issue 34's step target
(≤ 1.25x the baseline's wall time, below transformers' DiffLlama) is a target on this share. Runs without a GPU.

Usage: python benchmarks/step_host_time.py [--rounds 30] [--layers 8] [--tokens 16] [--triton-launcher]
                                           [--profile COLUMN]
       python benchmarks/step_host_time.py --decode [--dynamic] [--cache 64] [--tokens 4] ...

``--decode``: an eager decoding step instead (issue 37: "the decode path's fixed cost measured and cut"; issue 34:
"decode never slower than the two-call route"), which on the H200 of 2026-11-29 was all host: `small` decoded at 7.0 ms
a token eagerly against 0.40 in a CUDA graph, DIFF (auto) at 12.2 against DiffLlama's 10.9. As the GPU report's
decode section (:func:`diffattn.bench.gpu_report.decode_steps`), eagerly: bf16 weights, transformers' static cache
holding a ``--cache``-token prompt, ``--tokens`` tokens a step at the same positions, no gradient; ms per token
(``--dynamic``: transformers' dynamic cache instead, what ``generate()`` decodes against by default, cropped back to the
prompt before each step: :func:`diffattn.bench.gpu_report.dynamic_decoding`). Columns: the baseline, DiffLlama, DIFF
by ``sdpa_maps+epilogue`` (head norm in its kernel, the H200 table's first route for V1's unmasked d = 64 decoding
class) and the same without route plans (``…, no plans``: the op's whole path every call,
:mod:`diffattn.ops.call_plans`), ``sdpa_maps``, ``sdpa`` (what auto ran there on 2026-11-29: the static cache's mask
put the call in a class the table did not have), ``triton`` (its launches stubbed too), the op as one dispatch, and
DIFF V2 by ``sdpa``.

What is timed: forward + backward of the `small` preset's structure (8 layers, 8 query heads, 8 KV heads, its
vocabulary) at a tiny width (hidden 64: head width 8, DIFF's maps 8 and 16) and 16 tokens, under CPU autocast in
bf16 as the GPU step runs under CUDA's — so the kernels' own work is negligible and the time is dispatch, autograd
and Python. Columns, interleaved round by round (first column rotating, the garbage collector paused), median ms and
the median of the rounds' paired ratios to the baseline with a bootstrap interval:

* ``baseline`` (Llama), ``DiffLlama`` (transformers' own two calls a layer);
* ``DIFF cudnn`` and ``DIFF cudnn+epilogue``: the routes the H200 table runs for the small and the 16K V1 class
  (the device check skipped; the route's ``sdpa_kernel`` block and the gradient-layout guard of
  :mod:`diffattn.ops.sdpa`, which run on CUDA only, run here too);
* ``…+norm``: the head norm in the epilogue's kernel (:func:`diffattn.ops.fused_head_norm`), ``…+lambda``: λ by its
  kernels, each layer's (:func:`diffattn.ops.fused_lambda`); every other DIFF column computes every layer's λ at once
  in the model's forward (:func:`diffattn.models.diff_llama.layer_lambdas`), and ``…, λ per layer`` each layer's own
  by PyTorch's ops, as every column did before 2026-11-29;
* ``DIFF cudnn_direct+norm``: the same kernels as one autograd node (:mod:`diffattn.ops.direct`), cuDNN's ATen forward
  and backward each a stand-in that allocates what it returns (an output and its log-sum-exp; three gradients) —
  plain dispatches, where the SDPA routes' stand-in is an autograd Function (below): that column's lead over the
  others is read with that Function's own cost in mind (benchmarks/RESULTS.md, 2026-11-29);
* ``DIFF, op one dispatch``: the DIFF model (``auto``, its layer's own work: projections, RoPE, λ, the layout) with
  its op replaced by one stand-in dispatch each way, as the baseline's attention call is: what of DIFF's extra host
  time is the layer's and what is the op's (2026-11-29: 1.04× the baseline against the routes' 1.30–1.45×, so almost
  all of it is the op; λ's backward is not in it, the stand-in gives λ no gradient);
* the one-node columns (``cudnn_direct``, ``cudnn_shared_v``) run each layer's call plan from the warm-up step on, as a
  model does from its second step (:mod:`diffattn.ops.call_plans`: nothing before the node);
* ``DIFF cudnn_shared_v+norm+pairs``: the layer's heads in interleaved pairs (:func:`diffattn.ops.pairs_layout`: its
  projections' weight rows reordered each step) and the one node reading V once (no [V; V], no sum of its
  gradients), the ATen stand-ins as above;
* ``DIFF V2 …``: DIFF V2's model (docs/methods.md §5) through the route the H200 table runs for its small class
  (``sdpa_maps``), its 16K class (``sdpa+epilogue``) and ``cudnn_direct`` (one node reading K and V once,
  :mod:`diffattn.ops.direct`; 2026-11-30).

Every attention call (``scaled_dot_product_attention``, every column's) is one stand-in op each way that allocates its
output [B, T, H, dv]-laid-out as CUDA's kernels write it and computes nothing: one dispatch, as a fused GPU kernel is
one launch — where PyTorch's CPU SDPA would run its math fallback for DIFF's V wider than Q (a dozen ops a call that no
GPU runs). Triton launches are stubbed (their outputs are left unwritten: the numbers are garbage, the host work is
not), so a Triton launch's own host cost — Triton's Python launcher, tens of µs — is **not** in these times, unless
``--triton-launcher`` runs each launch through Triton's own launch path under a host-only driver
(:mod:`diffattn.bench.triton_host`: compiled for sm_90 on first use, bound and specialised by Triton every call, only
the generated C launcher stood in; one more column, ``… , launches stubbed``, runs ``cudnn_direct+norm`` — decoding:
``sdpa_maps+epilogue+norm`` — with the epilogue's launches stubbed, so that the launcher's cost is a paired difference;
2026-11-30); the launches are counted beside them (ATen kernels and Triton launches in one step, views and allocations
not counted), and a prediction for a GPU adds them at a stated cost. The check that λ is finite (a few ops and a read of
one number a call) runs on the CPU only and is skipped here, as on the GPU (until 2026-11-29 it was in the DIFF columns,
its ops counted as 8 kernels a step).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time

#: dispatches that launch no kernel on a GPU (views, metadata, allocations)
NO_KERNEL = {
    "view", "transpose", "expand", "detach", "split", "chunk", "unsqueeze", "squeeze", "permute", "alias",
    "_unsafe_view", "slice", "select", "unbind", "as_strided", "t", "reshape", "split_with_sizes", "unflatten",
    "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "_local_scalar_dense", "is_same_size",
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--decode",
        action="store_true",
        help="time an eager decoding step instead: one token a call against a static cache (bf16 weights, no grad)",
    )
    parser.add_argument("--cache", type=int, default=64, help="--decode: the prompt prefilled into the cache")
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="--decode against transformers' dynamic cache (generate()'s default: it grows a key every token)",
    )
    parser.add_argument(
        "--triton-launcher",
        action="store_true",
        help="Triton's own launch path run for real under a host-only driver (diffattn.bench.triton_host: each kernel "
        "compiled for sm_90 on first use, only the C launcher stood in) instead of each launch stubbed",
    )
    parser.add_argument(
        "--profile", metavar="COLUMN", help="instead of the table: cProfile COLUMN's steps (--rounds of them)"
    )
    args = parser.parse_args(argv)
    if args.triton_launcher:  # the kernels imported compiled, for the host-only driver to compile and "launch"
        os.environ.pop("TRITON_INTERPRET", None)
    else:  # the kernels' Python path without a GPU (their launches are stubbed below)
        os.environ["TRITON_INTERPRET"] = "1"
    with contextlib.ExitStack() as host_only:  # --triton-launcher's driver, Triton's own again on the way out
        return _table(args, parser, host_only)


def _table(args: argparse.Namespace, parser: argparse.ArgumentParser, host_only: contextlib.ExitStack) -> int:
    """The columns built, warmed up, counted and timed in interleaved rounds; the table printed."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from diffattn import ops
    from diffattn.bench import gc_paused, gpu_report, paired_ratio, rotated
    from diffattn.models.build import build_model
    from diffattn.ops import call_plans, direct, sdpa
    from diffattn.ops.triton import epilogue, launch, reparam

    torch.set_num_threads(1)
    triton_launches = [0]

    def stubbed_launch(*args, **kwargs):  # a launch's place: counted, nothing computed
        triton_launches[0] += 1

    if args.triton_launcher:
        from diffattn.bench.triton_host import host_only_triton
        from diffattn.ops.triton import tuning

        if tuning.INTERPRETED:  # main() called again in one process: triton.jit decided at the first import
            parser.error("--triton-launcher: the kernels were imported for the interpreter in this process")
        launch_count = host_only.enter_context(host_only_triton())
        ops._triton_device_reason_by_type = lambda device_type: None  # the Triton routes on CPU tensors, compiled

    class NoLaunch:  # kernels launched as kernel[grid](...)
        def __getitem__(self, grid):
            return stubbed_launch

    class LambdaNoLaunch(NoLaunch):  # λ's forward: a finite λ written (the CPU path checks it), out of the count
        def __getitem__(self, grid):
            def run(*a, **k):
                triton_launches[0] += 1
                with _disable_current_modes(), torch.no_grad():
                    a[4].fill_(0.5)

            return run

    # the check that λ is finite runs on the CPU only (on a GPU it would wait for the device every call): skipped, as
    # on the GPU the step stands for (its ops were counted as kernels, a `mul` among them, until 2026-11-29)
    from diffattn.ops import _inputs

    _inputs.check_lambda_finite = lambda lam: None
    if not args.triton_launcher:
        epilogue._launch_subtract = stubbed_launch
        reparam._lambda_fwd_kernel, reparam._lambda_bwd_kernel = LambdaNoLaunch(), NoLaunch()
    sdpa._cudnn_device_reason = lambda *a: None  # the cuDNN route runs on the CPU, its call the stand-in below
    # what the routes do on CUDA only, done here too: the cuDNN route's sdpa_kernel block (the stand-in ignores it)
    # and the guard that hands each call's gradient on in its output's layout (sdpa.GUARDED_DEVICES)
    sdpa.GUARDED_DEVICES = frozenset({"cpu", "cuda"})

    class OneCall(torch.autograd.Function):  # an attention call as one dispatch each way (module docstring)
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            b, h, t, _ = q.shape
            return q.new_empty(b, t, h, v.shape[-1]).transpose(1, 2)

        @staticmethod
        def backward(ctx, grad):  # the gradients reach the projections, as a real call's do
            return tuple(torch.empty_like(x) for x in ctx.saved_tensors)

    def stand_in(q, k, v, *args, **kwargs):
        if torch.is_autocast_enabled("cpu"):  # as SDPA under autocast: its inputs cast to the autocast dtype
            q, k, v = (x.to(torch.get_autocast_dtype("cpu")) for x in (q, k, v))
        return OneCall.apply(q, k, v)

    torch.nn.functional.scaled_dot_product_attention = stand_in

    def aten_forward(q, k, v, causal, scale):  # cuDNN's ATen forward: its output in Q's layout and its log-sum-exp
        b, h, t, _ = q.shape
        return q.new_empty(b, t, h, v.shape[-1]).transpose(1, 2), (q.new_empty(b, h, t, 1),), (t, t)

    def aten_backward(do, q, k, v, out, tensors, values, causal, scale):  # and its backward: three gradients
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    direct.ATTENTION_OPS = direct.AttentionOps(aten_forward, aten_backward, lambda *a: True)
    import diffattn.lambdas

    plain_lambda = diffattn.lambdas.reparameterized_lambda

    def lambda_by_kernel(*vectors):  # diffattn.lambdas takes the kernel on CUDA only: here as it would there
        return reparam.reparameterized_lambda_kernel(*vectors)

    class OpOneCall(torch.autograd.Function):  # the DIFF op as one dispatch each way (q [B, 2h, T, d] → [B, h, T, 2d])
        @staticmethod
        def forward(ctx, q, k, v, lam):
            ctx.save_for_backward(q, k, v)
            b, h, t, d = q.shape
            return q.new_empty(b, t, h // 2, 2 * d).transpose(1, 2)

        @staticmethod
        def backward(ctx, grad):
            return (*(torch.empty_like(x) for x in ctx.saved_tensors), None)

    def op_stand_in(q, k, v, lam, **kwargs):
        if torch.is_autocast_enabled("cpu"):
            q, k, v = (x.to(torch.get_autocast_dtype("cpu")) for x in (q, k, v))
        return OpOneCall.apply(q, k, v, lam)

    import diffattn.models.diff_llama as diff_llama

    real_op = diff_llama.diff_attention_stacked
    ONE_DISPATCH = "op one dispatch"
    MODEL, LAYER, KERNEL = "model", "layer", "kernel"  # λ: every layer's at once, each layer's own, by its kernel
    columns = {  # name: (attention, backend, norm in the epilogue, how λ is computed, DIFF V1's heads in pairs)
        "baseline": ("standard", None, None, MODEL, False),
        "DiffLlama": ("diff", None, None, MODEL, False),
        "DIFF cudnn": ("diff", "cudnn", None, MODEL, False),
        "DIFF cudnn+epilogue": ("diff", "cudnn+epilogue", False, MODEL, False),
        "DIFF cudnn+epilogue+norm": ("diff", "cudnn+epilogue", True, MODEL, False),
        "DIFF cudnn+epilogue+norm+lambda": ("diff", "cudnn+epilogue", True, KERNEL, False),
        "DIFF cudnn_direct+norm": ("diff", "cudnn_direct", True, MODEL, False),
        "DIFF cudnn_direct+norm, λ per layer": ("diff", "cudnn_direct", True, LAYER, False),
        "DIFF cudnn_shared_v+norm+pairs": ("diff", "cudnn_shared_v", True, MODEL, True),
        "DIFF, op one dispatch": ("diff", ONE_DISPATCH, None, MODEL, False),
        "DIFF V2 sdpa_maps": ("diff-v2", "sdpa_maps", None, MODEL, False),
        "DIFF V2 sdpa+epilogue": ("diff-v2", "sdpa+epilogue", None, MODEL, False),
        "DIFF V2 cudnn_direct": ("diff-v2", "cudnn_direct", None, MODEL, False),
    }

    NO_PLANS = "DIFF sdpa_maps+epilogue+norm, no plans"  # the column without route plans (diffattn.ops.call_plans)
    route_signature = call_plans.route_signature
    if args.decode:  # the eager decoding step's columns: the routes the H200 table runs for `small`'s decode classes
        columns = {
            "baseline": ("standard", None, None, MODEL, False),
            "DiffLlama": ("diff", None, None, MODEL, False),
            "DIFF sdpa_maps+epilogue+norm": ("diff", "sdpa_maps+epilogue", True, MODEL, False),
            NO_PLANS: ("diff", "sdpa_maps+epilogue", True, MODEL, False),
            "DIFF sdpa_maps": ("diff", "sdpa_maps", None, MODEL, False),
            "DIFF sdpa": ("diff", "sdpa", None, MODEL, False),
            "DIFF triton": ("diff", "triton", None, MODEL, False),
            "DIFF, op one dispatch": ("diff", ONE_DISPATCH, None, MODEL, False),
            "DIFF V2 sdpa": ("diff-v2", "sdpa", None, MODEL, False),
        }
        if not args.triton_launcher:  # the fused kernel's launches, stubbed as the others' are (decoding, combine)
            launch._launch = stubbed_launch
            launch._combine_kernel = launch._decode_vector_kernel = NoLaunch()

    def model_of(attention, backend, **overrides):
        return build_model("small", attention, backend=backend, seed=0, num_layers=args.layers, hidden_size=64,
                           intermediate_size=128, **overrides)  # fmt: skip

    def decode_step_of(attention, backend, norm, lam_by, pairs, plans=True):
        # as the GPU report's decode section (diffattn.bench.gpu_report.decode_steps), eagerly: bf16 weights, a
        # static cache holding the prompt, each run `--tokens` tokens at the same positions
        from transformers import StaticCache

        stand_in_op = backend == ONE_DISPATCH
        model = model_of(attention, "auto" if stand_in_op else backend, dtype=torch.bfloat16,
                         max_position_embeddings=args.cache + args.tokens).eval()  # fmt: skip
        ids = torch.randint(0, model.config.vocab_size, (1, args.cache), generator=torch.Generator().manual_seed(0))
        if args.dynamic:  # the GPU report's own (diffattn.bench.gpu_report.dynamic_decoding)
            with ops.fused_head_norm(norm):
                eager = gpu_report.dynamic_decoding(model, ids, args.tokens)
        else:
            cache = StaticCache(config=model.config, max_cache_len=args.cache + args.tokens)
            with ops.fused_head_norm(norm):
                _, eager, _, _ = gpu_report.decode_steps(model, cache, ids, args.tokens)

        def step():
            diff_llama.diff_attention_stacked = op_stand_in if stand_in_op else real_op
            with ops.fused_head_norm(norm):
                eager()

        def step_without_route_plans():  # the op's whole path every call, as before 2026-11-30
            call_plans.route_signature = lambda *a, **k: None
            try:
                step()
            finally:
                call_plans.route_signature = route_signature

        return step if plans else step_without_route_plans

    def step_of(attention, backend, norm, lam_by, pairs, plans=True):
        if args.decode:
            return decode_step_of(attention, backend, norm, lam_by, pairs, plans)
        stand_in_op = backend == ONE_DISPATCH
        model = model_of(attention, "auto" if stand_in_op else backend)
        ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0))

        def step():
            diff_llama.diff_attention_stacked = op_stand_in if stand_in_op else real_op
            diff_llama.reparameterized_lambda = lambda_by_kernel if lam_by == KERNEL else plain_lambda
            model.zero_grad(set_to_none=True)
            autocast = torch.autocast("cpu", dtype=torch.bfloat16)
            # λ per layer: by PyTorch's ops (the `+perlayer` column's switch) or by its kernel (λ's kernel forced:
            # each layer's too); else every layer's at once in the model's forward (diff_llama.layer_lambdas)
            per_layer = ops.lambda_per_layer(True if lam_by == LAYER else None)
            kernel = ops.fused_lambda(True if lam_by == KERNEL else None)
            with autocast, ops.fused_head_norm(norm), ops.pairs_layout(True if pairs else None), per_layer, kernel:
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()

        return step

    steps = {name: step_of(*spec, plans=name != NO_PLANS) for name, spec in columns.items()}
    if args.triton_launcher:  # the epilogue's launches stubbed in one column, its twin's: Triton's launcher paired
        twin = "DIFF sdpa_maps+epilogue+norm" if args.decode else "DIFF cudnn_direct+norm"
        real_launch, twin_step = epilogue._launch_subtract, step_of(*columns[twin])

        def without_launcher():
            epilogue._launch_subtract = stubbed_launch
            try:
                twin_step()
            finally:
                epilogue._launch_subtract = real_launch

        steps[f"{twin}, launches stubbed"] = without_launcher

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    kernels = {}
    for name, step in steps.items():  # warm-up, and one step counted
        step()
        triton_launches[0] = 0
        if args.triton_launcher:
            launch_count.reset()
        with Count() as count:
            step()
        aten = sum(n for op, n in count.ops.items() if op not in NO_KERNEL)
        kernels[name] = (aten, triton_launches[0] + (launch_count.launches if args.triton_launcher else 0))
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.rounds):
            steps[args.profile]()
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(30)  # where the host's time goes, by function
        stats.sort_stats("cumulative").print_stats("diffattn", 30)  # and the library's share, by call tree
        return 0
    samples = {name: [] for name in steps}
    names = list(steps)
    with gc_paused():
        for rnd in range(args.rounds):
            for name in rotated(names, rnd):
                start = time.perf_counter()
                steps[name]()
                samples[name].append(time.perf_counter() - start)
    per = args.tokens if args.decode else 1  # decode: per token
    base = statistics.median(samples["baseline"]) / per
    kind = "dynamic cache from" if args.dynamic else "static cache of"
    what = (
        f"host ms per decoded token (eager, {kind} {args.cache} + {args.tokens}, bf16 weights, no grad)"
        if args.decode
        else f"host ms per forward+backward ({args.tokens} tokens, CPU autocast bf16)"
    )
    launches = "through Triton's launcher, host-only" if args.triton_launcher else "stubbed"
    print(f"{what}, median of {args.rounds} interleaved rounds ({args.layers} layers, one thread; Triton launches "
          f"{launches}). ratio: the median of each round's ratio to that round's baseline, with a 95% bootstrap "
          "interval (2,000 resamples of the rounds)")  # fmt: skip
    print(f"{'column':48s} {'ms':>7s} {'+ms':>6s} {'ratio':>6s} {'95% interval':>14s} {'ATen kernels':>13s} "
          f"{'Triton':>7s}")  # fmt: skip
    for name in names:
        ms = 1e3 * statistics.median(samples[name]) / per
        ratio, low, high = paired_ratio(samples[name], samples["baseline"])
        aten, launched = kernels[name]
        print(f"{name:48s} {ms:7.2f} {ms - 1e3 * base:6.2f} {ratio:6.2f} {f'[{low:.2f}, {high:.2f}]':>14s} "
              f"{aten:13d} {launched:7d}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
