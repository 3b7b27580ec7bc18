"""Host (Python) time of one call of the ``triton`` backend, the kernel launches themselves left out: what a
decoding step pays per attention layer before the GPU does anything (issue 18: at ~50–100 µs a call, host work
alone breaks the decode target). Runs without a GPU.

Usage: python benchmarks/host_overhead.py [--calls 2000] [--rounds 7] [--batch 1] [--heads 16] [--kv-heads 8]
                                          [--kv-len 1024]

What is timed: ``diffattn.ops.triton.launch.diff_attention_triton`` on a DiffLlama decoding step's inputs (one
query per sequence, V as two halves of the value heads, λ a scalar) after ``validate``, with every kernel launch
replaced by a no-op — so the numbers are the library's own host work (argument checks, buffer allocation, tile
choice, the custom-op dispatch), not Triton's launcher or the GPU. Two routes, interleaved round by round on the
same inputs, median µs per call:

* ``direct`` — what the backend does for a forward without gradient: the implementation called directly;
* ``custom-op`` — the same forward through the ``torch.library`` custom op (the route a training forward and
  ``torch.compile`` take), i.e. the dispatcher's cost on top.

``validate`` (the argument checks every backend shares) is timed on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # the kernels' launch path as on a GPU (nothing is launched here)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and route")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16, help="DIFF heads (each has two query heads)")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--kv-len", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args(argv)

    import torch

    from diffattn.ops import _inputs
    from diffattn.ops.triton import launch, tuning

    class NoLaunch:  # kernels launched as kernel[grid](...)
        def __getitem__(self, grid):
            return lambda *a, **k: None

    launch._launch = lambda *a, **k: None
    launch._combine_kernel = launch._bwd_preprocess_kernel = NoLaunch()
    tuning.INTERPRETED = False

    b, h, hkv, s, d = args.batch, args.heads, args.kv_heads, args.kv_len, args.head_dim
    q = torch.randn(b, 2 * h, 1, d)
    k = torch.randn(b, 2 * hkv, s, d)
    v = torch.randn(b, 2 * hkv, s, d)
    lam = torch.tensor(0.5)

    def validate():
        return _inputs.validate(
            q[:, :h], k[:, :hkv], q[:, h:], k[:, hkv:], (v[:, :hkv], v[:, hkv:]), lam,
            causal=True, attn_mask=None, scale=None,
        )  # fmt: skip

    inp = validate()
    compiling = torch.compiler.is_compiling
    routes = {"validate": validate, "direct": lambda: launch.diff_attention_triton(inp)}
    routes["custom-op"] = routes["direct"]  # the same call, told it is being compiled: it takes the custom op
    samples: dict[str, list[float]] = {name: [] for name in routes}
    try:
        for _ in range(args.rounds):
            for name, fn in routes.items():
                torch.compiler.is_compiling = (lambda: True) if name == "custom-op" else compiling
                for _ in range(50):
                    fn()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                samples[name].append((time.perf_counter() - start) / args.calls * 1e6)
    finally:
        torch.compiler.is_compiling = compiling
    med = {name: statistics.median(xs) for name, xs in samples.items()}
    print(f"host µs per call (median of {args.rounds} rounds x {args.calls} calls; B={b}, H={h}, Hkv={hkv}, S={s})")
    for name, us in med.items():
        print(f"  {name:10s} {us:7.1f} µs")
    print(f"  custom-op / direct: {med['custom-op'] / med['direct']:.2f}x")
    print(f"  validate + direct: {med['validate'] + med['direct']:.1f} µs per attention layer and decoding step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
