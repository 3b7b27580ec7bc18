"""The ``diffattn`` command line. Each subcommand is a plain function taking parsed arguments."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys

import torch

from . import __version__


def cmd_info(args: argparse.Namespace) -> int:
    import transformers

    from .ops import auto_backend, backend_status

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    device = "cuda: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"diffattn      {__version__}")
    print(f"python        {platform.python_version()}")
    print(f"torch         {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"transformers  {transformers.__version__}")
    print(f"triton        {triton_version}")
    print(f"device        {device}")
    print("backends of diffattn.ops.diff_attention:")
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"  {'auto':<10} usable      picks the fastest backend for the device (now: {auto_backend(here)})")
    for s in backend_status():
        print(f"  {s.name:<10} {'usable' if s.usable else 'unusable':<11} {s.reason}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from .models import PRESETS, describe_parameters

    for name, p in PRESETS.items():
        print(f"{name:<12} {p.description}")
        if not name.startswith("paper") or args.count_all:
            print("             " + describe_parameters(name).split(": ", 1)[1])
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.attention import format_table, rows_as_dicts, run_attention_benchmark, target_lines

    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--sizes must be comma-separated positive integers, got {args.sizes!r}")
    levels = args.levels.split(",")
    if not set(levels) <= {"op", "module"}:
        raise ValueError(f"--levels must be a comma-separated subset of op,module; got {args.levels!r}")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(
        f"attention benchmark: device={device}, dtype={args.dtype}, batch={args.batch}, h={args.heads} DIFF "
        f"heads vs {2 * args.heads} baseline heads, d={args.head_dim}, causal, median of {args.reps}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    rows = run_attention_benchmark(
        sizes,
        heads=args.heads,
        head_dim=args.head_dim,
        batch=args.batch,
        reps=args.reps,
        device=device,
        dtype=dtype,
        levels=levels,
        progress=lambda m: print(f"  … {m}", file=sys.stderr, flush=True),
    )
    print(format_table(rows))
    for line in target_lines(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "dtype": args.dtype, "rows": rows_as_dicts(rows)}, f, indent=2)
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import format_quickstart, run_quickstart

    result = run_quickstart(new_tokens=args.new_tokens)
    print(format_quickstart(result))
    return 0 if result.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffattn",
        description="Differential attention for language models: DIFF Transformer, Dex, DiffLoRA, DAA.",
    )
    parser.add_argument("--version", action="version", version=f"diffattn {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("quickstart", help="build debug baseline/DIFF models, check backends, generate")
    p.add_argument("--new-tokens", type=int, default=8, help="tokens to generate per model (default 8)")
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("info", help="versions, device, and which attention backends are usable (and why not)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("presets", help="list the model presets with baseline and DIFF parameter counts")
    p.add_argument("--count-all", action="store_true", help="also count the paper-size presets (meta device)")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    b = bench.add_parser("attention", help="DIFF attention per backend vs baseline SDPA and HF DiffLlama")
    b.add_argument("--sizes", default="512,1024,2048,4096", help="comma-separated sequence lengths")
    b.add_argument("--heads", type=int, default=4, help="DIFF heads h (baseline gets 2h); default 4")
    b.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--reps", type=int, default=5, help="repetitions; the median is reported")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    b.add_argument("--levels", default="op,module", help="op, module or both (default)")
    b.add_argument("--json", default=None, help="also write the rows to this JSON file")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"diffattn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
