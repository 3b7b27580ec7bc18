"""The ``diffattn`` command line. Each subcommand is a plain function taking parsed arguments."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import typing
from pathlib import Path

from . import __version__  # cheap: the package imports torch/transformers only on first use


def _positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    """A flag's positive integer (``--jobs``, ``bench --heads``, …): argparse names the flag in the error line."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"want a positive integer, got {text!r}")
    return value


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from .environment import environment
    from .ops import auto_backend, backend_status

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    env = environment()  # the record every training run and report keeps: one home for these facts
    print(f"diffattn      {__version__}")
    print(f"python        {env['python']}")
    print(f"torch         {env['torch']} ({env['threads']} threads)")
    print(f"transformers  {env['transformers']}")
    print(f"triton        {triton_version}")
    print(f"device        {env['device'] + (': ' + env['gpu'] if 'gpu' in env else '')}")
    # the instruction set torch's CPU kernels use decides the rounding: the same seed trains another model elsewhere
    print(f"cpu           {env['cpu']} (torch kernels: {env['cpu_capability']})")
    print("backends of diffattn.ops.diff_attention:")
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if here.type == "cpu":
        now = auto_backend(here)
    else:
        from .ops.routes import device_entry

        entry = device_entry(torch.cuda.current_device())
        now = (
            f"the route table's fastest of the routes it timed per call class, on this GPU {entry['date']} (some "
            "classes from earlier leases); else sdpa"
            if entry
            else "sdpa: the route table has no entry for this GPU and software (`make gpu-report` measures one)"
        )
    statuses = backend_status()
    width = max(len(s.name) for s in statuses)  # the epilogue routes' names are the longest
    print(f"  {'auto':<{width}} {'usable':<8} per call class the fastest correct route measured (now: {now})")
    for s in statuses:
        print(f"  {s.name:<{width}} {'usable' if s.usable else 'unusable':<8} {s.reason}")
    from .ops.routes import TABLE_FLAGS, table_flag

    index = torch.cuda.current_device() if here.type == "cuda" else None
    where = "this GPU's route table entry" if index is not None else "off CUDA: off"
    switches = ", ".join(f"{flag} {'on' if table_flag(flag, index) else 'off'}" for flag in TABLE_FLAGS)
    print(f"kernel switches of the DIFF layer ({where}): {switches}")
    from .adapters.registry import specs
    from .eval.suite import SUITE_TABLE

    print("adapter methods (diffattn adapt --method):")
    for spec in specs():
        merge = "merges" if spec.mergeable else "does not merge"
        lam = "λ(t) of Dex Eq. 4" if spec.annealed else ""
        print(f"  {spec.name:<10} {spec.kind:<8} {spec.display}; {merge}" + (f"; {lam}" if lam else ""))
    print(f"evaluation suites (diffattn eval --suite): {', '.join(SUITE_TABLE)}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from .models import PRESETS, describe_parameters
    from .train.config import DataConfig

    print(  # the counts read each preset's own vocabulary; pretrain's comes from the tokenizer it trains
        "parameter counts at each preset's vocabulary size; `diffattn pretrain` builds the model at its tokenizer's "
        f"(--vocab-size, default {DataConfig.vocab_size:,}), which adds or removes embedding rows"
    )
    for name, p in PRESETS.items():
        print(f"{name:<12} {p.description}")
        if not name.startswith("paper") or args.count_all:
            print("             " + describe_parameters(name).split(": ", 1)[1])
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from .bench.attention import format_table, rows_as_dicts, run_attention_benchmark, target_lines

    sizes = _positive_ints(args.sizes, "--sizes")
    levels = args.levels.split(",")
    if not set(levels) <= {"op", "module"}:
        raise ValueError(f"--levels must be a comma-separated subset of op,module; got {args.levels!r}")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    device = _bench_device(args.device)
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
        _write_json(args.json, {"device": device, "dtype": args.dtype, "rows": rows_as_dicts(rows)})
    return 0


def _write_json(path: str, record: dict) -> None:
    """A benchmark's ``--json``: a file (new or existing) through a temporary name and a rename, so an interrupted
    write never leaves half of it; anything else (``/dev/stdout``, a pipe, a symlink) written through as it is."""
    from .files import write_text_atomic

    text = json.dumps(record, indent=2)
    target = Path(path)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        with open(target, "w") as f:
            f.write(text)
    else:
        write_text_atomic(target, text)


def _bench_device(asked: str | None) -> str:
    import torch

    if asked is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked not in ("cpu", "cuda") and not asked.startswith("cuda:"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {asked!r}")
    if asked.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {asked}: CUDA is not available here (torch {torch.__version__}); use cpu")
    return asked


def cmd_bench_train_step(args: argparse.Namespace) -> int:
    import torch

    from .bench.train_step import (
        DTYPES,
        default_dtype,
        format_host,
        format_kernels,
        format_table,
        rows_as_dicts,
        run_train_step_benchmark,
        table_legend,
    )

    presets, seq_lens = args.presets.split(","), _positive_ints(args.seq_lens, "--seq-lens")
    device = _bench_device(args.device)
    dtype = args.dtype or default_dtype(device)
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(sorted(DTYPES))}, got {dtype!r}")
    print(
        f"train-step benchmark: device={device}, dtype={dtype}, batch={args.batch}, median of {args.reps}, "
        f"{torch.get_num_threads()} threads; one step = forward + backward + AdamW"
        + {"whole": ", the whole step one CUDA graph", "micro": ", forward and backward one CUDA graph"}.get(
            args.cuda_graphs, ""
        ),
        flush=True,
    )
    rows = run_train_step_benchmark(
        presets,
        seq_lens,
        batch=args.batch,
        reps=args.reps,
        device=device,
        progress=lambda m: print(f"  … {m}", file=sys.stderr, flush=True),
        dtype=dtype,
        compile_backend=args.compile,
        compile_mode=args.compile_mode,
        backends=tuple(filter(None, args.backends.split(","))),
        cuda_graphs=args.cuda_graphs or False,
        host_profile=args.host_profile,
    )
    print(format_table(rows))
    legend = table_legend(rows)
    if legend:
        print(legend)
    kernels = format_kernels(rows)  # CUDA: what each column's step is made of
    if kernels:
        print("\n" + kernels)
    host = format_host(rows)  # --host-profile: where each column's host time goes
    if host:
        print("\n" + host)
    if args.json:
        _write_json(args.json, {"device": device, "dtype": dtype, "rows": rows_as_dicts(rows)})
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import format_quickstart, quickstart_config_path, run_quickstart

    result = run_quickstart(new_tokens=args.new_tokens)  # seconds: backends against reference, generation
    print(format_quickstart(result))
    if not result.ok or args.check_only:
        return 0 if result.ok else 1
    print(f"\nrunning the quickstart experiment ({quickstart_config_path()}) into {args.root}/quickstart ...")
    args.experiment = str(quickstart_config_path())
    args.train_only = False
    args.jobs = 1  # one part after the other: the committed quickstart report was made so
    return cmd_run(args)


# the flags of _add_cadence_flags -> their train.* fields, the same in RunConfig and AdaptRunConfig
_CADENCE_FLAGS = {
    "warmup_steps": "train.warmup_steps",
    "eval_every": "train.eval_every",
    "save_every": "train.save_every",
    "log_every": "train.log_every",
    "seed": "train.seed",
    "precision": "train.precision",
}

# pretrain flag -> dotted RunConfig field
_PRETRAIN_FLAGS = {
    "preset": "model.preset",
    "attention": "model.attention",
    "backend": "model.backend",
    "data": "data.source",
    "vocab_size": "data.vocab_size",
    "seq_len": "data.seq_len",
    "retrieval_fraction": "data.retrieval_fraction",
    "packing": "data.packing",
    "max_steps": "train.max_steps",
    "batch_size": "train.global_batch_size",
    "grad_accum": "train.grad_accum",
    "lr": "train.lr",
    "schedule": "train.schedule",
    **_CADENCE_FLAGS,
    "fsdp": "train.fsdp",
    "compile": "train.compile",
    "cuda_graphs": "train.cuda_graphs",
}


def _parse_sets(items: list[str]) -> dict[str, object]:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects a.b=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def _starting_config(cls, args: argparse.Namespace, paired: dict | None = None):
    """The config the flags override: ``--config``'s file; on ``--resume`` without one, the run's own ``run.yaml``
    (a resume names only what it changes: ``diffattn adapt --out runs/dex --resume --max-steps 400``; it needed every
    original flag again, or was refused as changed: a user's review, 2026-12-03); else the defaults. ``paired``: the
    pairings a pretrain folder of ``standard/``, ``diff/``, … may hold, read from its first arm's ``run.yaml``."""
    from .files import RUN_CONFIG
    from .train.config import recorded_pairing

    if args.config or not args.resume:
        return cls.load(args.config) if args.config else cls()
    out = Path(args.out)
    if (out / RUN_CONFIG).is_file():
        print(f"resuming with the settings of {out / RUN_CONFIG}")
        return cls.load(out / RUN_CONFIG)
    paired = paired or {}
    every_arm = {arm for arms in paired.values() for arm in arms}
    present = [arm for arm in every_arm if (out / arm / RUN_CONFIG).is_file()]
    recorded = recorded_pairing(out) if paired else None
    for pairing, arms in paired.items():  # narrowest first: the first pairing that holds every arm present
        if present and (pairing == recorded if recorded in paired else set(present) <= set(arms)):
            first = out / next(arm for arm in arms if arm in present) / RUN_CONFIG
            # a folder from before its pairing was recorded: the narrowest guess, and how to say otherwise
            wider = [p for p in paired if p != pairing and set(arms) < set(paired[p])] if recorded is None else []
            hint = f"; an interrupted {' or '.join(wider)} run: pass --attention {wider[0]}" if wider else ""
            print(f"resuming the paired run ({pairing}: {', '.join(arms)}) with the settings of {first}{hint}")
            config = cls.load(first)
            config.model.attention = pairing
            return config
    return cls()  # nothing saved here: the trainer says there is nothing to resume


def cmd_pretrain(args: argparse.Namespace) -> int:
    import os

    from .train.config import PAIRED, RunConfig

    config = _starting_config(RunConfig, args, paired={"both": PAIRED["both"], "all": PAIRED["all"]})
    overrides = {
        field: getattr(args, flag) for flag, field in _PRETRAIN_FLAGS.items() if getattr(args, flag) is not None
    }
    config = config.with_overrides({**overrides, **_parse_sets(args.set)}).validate()
    # the trainer (transformers: seconds) only once the settings are known good: a bad flag is answered at once
    from .train import NonFiniteLossError, latest_checkpoint, pretrain, pretrain_paired
    from .train.paired import rate_text

    run = pretrain_paired if config.model.attention in PAIRED else pretrain
    try:
        result = run(config, args.out, resume=args.resume, overwrite=args.overwrite)
    except NonFiniteLossError as e:
        dirs = (
            [Path(args.out)]
            if config.model.attention not in PAIRED
            else [Path(args.out) / a for a in PAIRED[config.model.attention]]
        )
        kept = [str(c) for c in map(latest_checkpoint, dirs) if c is not None]
        print(
            f"diffattn: error: {e}; training stopped. Last good checkpoint: {', '.join(kept) or 'none yet'}",
            file=sys.stderr,
        )
        return 3
    if int(os.environ.get("RANK", "0")) == 0:
        summaries = result if config.model.attention in PAIRED else {config.model.attention: result}
        for attention, s in summaries.items():
            print(
                f"{attention:>8}: {s['parameters']:,} params, {s['steps']} steps, val loss "
                f"{s['final_val_loss']:.4f} (PPL {s['final_val_ppl']:.2f}), {rate_text(s['tokens_per_s'])} tokens/s"
            )
        print(f"outputs in {args.out}")
    return 0


# adapt flag -> dotted AdaptRunConfig field
_ADAPT_FLAGS = {
    "model": "model.name",
    "method": "method.name",
    "merge": "method.merge",
    "backend": "method.backend",
    "data": "data.source",
    "seq_len": "data.seq_len",
    "max_steps": "train.max_steps",
    "batch_size": "train.global_batch_size",
    "grad_accum": "train.grad_accum",
    "lr": "train.lr",
    **_CADENCE_FLAGS,
    "compile": "train.compile",
    "cuda_graphs": "train.cuda_graphs",
}


def cmd_adapt(args: argparse.Namespace) -> int:
    from .train.adapt_config import AdaptRunConfig

    config = _starting_config(AdaptRunConfig, args)
    overrides = {field: getattr(args, flag) for flag, field in _ADAPT_FLAGS.items() if getattr(args, flag) is not None}
    overrides.update(_parse_sets(args.set))
    if args.recipe == "paper":  # the paper's values, under what the command line sets explicitly
        from .models.pretrained import model_type_of
        from .train.recipes import paper_recipe

        chosen = config.with_overrides(overrides)
        recipe, source = paper_recipe(
            chosen.method.name,
            model_type_of(chosen.model.name),
            chosen.train.resolved_schedule_steps,
            given=set(overrides),
        )
        overrides = {**recipe, **overrides}
        shown = ", ".join(f"{k.split('.', 1)[1]}={overrides[k]}" for k in recipe)
        print(f"paper recipe of {chosen.method.name} ({source}): {shown}")
    config = config.with_overrides(overrides).validate()
    config.method_config()  # the method's options, checked before the trainer's import (transformers: seconds)
    from .train import NonFiniteLossError, latest_checkpoint
    from .train.adapt import adapt_pretrained

    try:
        s = adapt_pretrained(config, args.out, resume=args.resume, overwrite=args.overwrite)
    except NonFiniteLossError as e:
        kept = latest_checkpoint(Path(args.out))
        print(f"diffattn: error: {e}; training stopped. Last good checkpoint: {kept or 'none yet'}", file=sys.stderr)
        return 3
    before = "n/a (resumed)" if s["val_loss_before"] is None else f"{s['val_loss_before']:.4f}"
    print(
        f"{s['method']} on {s['model']}: {s['trainable_parameters']:,} of {s['total_parameters']:,} parameters "
        f"trained, {s['steps']} steps; val loss {before} -> {s['val_loss_after']:.4f}"
    )
    if s["lambda"] is not None:
        print("lambda per layer: " + " ".join(f"{v:.3g}" for v in s["lambda"]))
    for warning in s.get("warnings") or []:
        print(f"warning: {warning}")
    print(f"outputs in {args.out}")
    return 0


def _add_suite_options(p: argparse.ArgumentParser) -> None:
    """One flag per suite option (diffattn.eval.suite.option_specs): its field name with dashes, its default, its
    help; the suites' own options say which suite reads them."""
    from .eval.suite import option_specs

    for spec in option_specs():
        kind = spec.parse or (int if int in (typing.get_args(spec.kind) or (spec.kind,)) else str)
        help_text = spec.help if spec.owner is None else f"{spec.owner}: {spec.help}"
        if spec.default not in (None, ()) and "default" not in spec.help:  # the options class is its home
            help_text += f" (default {spec.default})"
        p.add_argument(spec.flag, dest=spec.name, type=kind, default=spec.default, help=help_text)


def cmd_eval(args: argparse.Namespace) -> int:
    from .eval.common import fmt
    from .eval.suite import (
        SUITE_TABLE,
        check_eval_folder,
        load_for_eval,
        option_specs,
        options_class,
        parse_suites,
        run_suites,
    )

    suites = parse_suites(args.suite)  # a bad name fails before the model loads
    check_eval_folder(Path(args.out))
    options = options_class()(**{spec.name: getattr(args, spec.name) for spec in option_specs()})
    options.validate(suites, style="flag")  # before the model loads
    model, tokenizer, description = load_for_eval(args.model, trust_remote_code=args.trust_remote_code)
    doc = run_suites(
        model,
        tokenizer,
        suites,
        args.out,
        options=options,
        name=args.name or args.model,
        description=description,
        style="flag",
    )
    print(f"{len(suites)} suite(s) on {description}: {args.out}/results.json")
    for suite, res in doc["suites"].items():
        line = ", ".join(f"{k} {fmt(v)}" for k, v in SUITE_TABLE[suite].headline(res).items() if v is not None)
        print(f"  {suite:<9} {line}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .experiments.report import export_report

    dest = export_report(args.experiment_dir, args.dest)
    print(f"exported {args.experiment_dir} (report, results, config, pictures) to {dest}")
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    from .experiments.report import EXPORT_MARKER, refresh_report
    from .files import file_sha256

    def digests(folder: Path) -> dict[str, str | None]:  # the export's files (its marker records the refresh itself)
        return {f.name: file_sha256(f) for f in folder.iterdir() if f.name != EXPORT_MARKER} if folder.is_dir() else {}

    for folder in map(Path, args.folders):
        before = digests(folder)
        report = refresh_report(folder)
        changed = sorted(name for name, digest in digests(folder).items() if before.get(name) != digest)
        print(
            f"refreshed {report}: rewrote {', '.join(changed)}"
            if changed
            else f"refreshed {report}: nothing changed (its verdicts and tables are already this version's)"
        )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .experiments import ExperimentConfig, run_experiment

    config = ExperimentConfig.load(args.experiment).with_overrides(_parse_sets(args.set))
    overwrite = True if args.overwrite == [] else set(args.overwrite or ())
    outcomes = run_experiment(config, args.root, overwrite=overwrite, evaluate=not args.train_only, jobs=args.jobs)
    for o in outcomes:
        print(f"{o.kind:<9} {o.name:<20} {o.state:<7} {o.seconds:8.1f} s")
    if args.train_only:
        print(f"trained; evaluate and report with: diffattn run {args.experiment} --root {args.root}")
    else:
        print(f"report: {args.root}/{config.name}/report.md")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one line naming what was wrong (no usage block before it), exit 2."""

    def error(self, message: str):
        if message.endswith("expected one argument"):  # argparse reads a value such as -1e-3 as another flag
            message += " (a value that starts with '-', such as a negative number, goes after '=': --lr=-1e-3)"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


REPORT_TO_HELP = (
    "where training reports loss, lr, grad norm and λ per layer besides metrics.jsonl: tensorboard (suggested; "
    "event files in each run's tensorboard/), or trackio, wandb (offline), mlflow, … when installed; default none"
)


def build_parser(only: typing.Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser. ``only``: the commands whose flags are built (``None``: every command); the others are listed
    with their one line and no flags, since some flags' choices and help texts import torch and transformers (seconds)
    and ``diffattn --help`` or ``diffattn info`` needs none of that (:func:`main` builds only the command it runs)."""
    parser = _Parser(
        prog="diffattn",
        description="Differential attention for language models: DIFF Transformer, Dex, DiffLoRA, DAA.",
    )
    parser.add_argument("--version", action="version", version=f"diffattn {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (line, add_flags) in COMMANDS.items():
        p = sub.add_parser(name, help=line, description=line[:1].upper() + line[1:] + ".")
        if only is None or name in only:
            add_flags(p)
    return parser


def _named_command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not a flag (the top-level flags take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment_dir", help="runs/NAME of a finished experiment")
    p.add_argument("dest", help="the destination folder, e.g. results/NAME (new, or an earlier export)")
    p.set_defaults(func=cmd_export)


def _refresh_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("folders", nargs="+", help="exported report folders (report.md + results.json), e.g. results/NAME")
    p.set_defaults(func=cmd_refresh)


def _presets_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count-all", action="store_true", help="also count the paper-size presets (meta device)")
    p.set_defaults(func=cmd_presets)


def _add_report_to(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report-to", dest="report_to", metavar="NAME[,NAME]", help=REPORT_TO_HELP)


def _add_run_folder_flags(p: argparse.ArgumentParser, sections: str) -> None:
    """The flags that say where a training run goes and what it starts from (pretrain and adapt)."""
    _add_report_to(p)
    p.add_argument("--out", required=True, help="run folder (refused if it exists, unless --resume/--overwrite)")
    p.add_argument("--config", help=f"run.yaml (sections {sections}); flags override it")


def _add_cadence_flags(p: argparse.ArgumentParser) -> None:
    """The training flags pretrain and adapt share, in their help's order: warm-up, how often to evaluate, save and
    log, the seed and the precision."""
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--save-every", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"])


def _add_resume_or_overwrite(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint, with its run.yaml's settings (without --config) "
        "and what the flags change (--max-steps: up to the schedule it planned, train.schedule_steps)",
    )
    mode.add_argument("--overwrite", action="store_true", help="delete --out and start again")


def _quickstart_flags(p: argparse.ArgumentParser) -> None:
    _add_report_to(p)
    p.add_argument("--new-tokens", type=int, default=8, help="tokens generated per debug model in the check")
    p.add_argument("--check-only", action="store_true", help="only the backend check (seconds)")
    p.add_argument("--root", default="runs", help="parent of runs/quickstart (default runs/)")
    p.add_argument("--set", action="append", default=[], metavar="A.B=VALUE", help="override the experiment")
    p.add_argument("--overwrite", nargs="*", metavar="NAME", help="redo these parts (no names: every part)")
    p.set_defaults(func=cmd_quickstart)


def _pretrain_flags(p: argparse.ArgumentParser) -> None:
    from .models.architectures import ARCHITECTURES
    from .ops import BACKENDS

    _add_run_folder_flags(p, "model, data, train")
    p.add_argument("--preset", help="model preset (see `diffattn presets`; default tiny)")
    p.add_argument(
        "--attention",
        choices=[*ARCHITECTURES, "both", "all"],
        help=f"both = paired standard and diff runs; all = every architecture ({', '.join(ARCHITECTURES)}); "
        "default diff (no baseline: `both` trains the Transformer beside it)",
    )
    p.add_argument("--backend", help=f"DIFF attention backend ({', '.join(BACKENDS)}; default auto)")
    p.add_argument("--data", help="'shakespeare', or a .txt/.jsonl/.json file or directory")
    p.add_argument("--vocab-size", type=int, help="BPE vocabulary (default 8192)")
    p.add_argument("--seq-len", type=int, help="training sequence length (default 512)")
    p.add_argument("--retrieval-fraction", type=float, help="share of retrieval practice sequences (default 0)")
    p.add_argument("--packing", action="store_const", const=True, help="documents apart, no cross-document attention")
    p.add_argument("--max-steps", type=int, help="optimiser steps (default 200)")
    p.add_argument("--batch-size", type=int, help="global batch in sequences (default 8)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per step (default 1)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 0.001)")
    p.add_argument("--schedule", choices=["linear", "cosine"], help="warmup, then decay (default linear)")
    _add_cadence_flags(p)
    p.add_argument("--fsdp", action="store_const", const=True, default=None, help="FSDP instead of DDP")
    _add_compile_flag(p)
    p.add_argument("--set", action="append", default=[], metavar="A.B=VALUE", help="any config field")
    _add_resume_or_overwrite(p)
    p.set_defaults(func=cmd_pretrain)


def _add_compile_flag(p) -> None:
    """``--compile [MODE]`` (``train.compile``) and ``--cuda-graphs`` (``train.cuda_graphs``) of the training
    commands: the two ways to take a small model's host-bound step on a GPU out of the host's hands."""
    from .cuda_graphs import COMPILE_MODES

    p.add_argument(
        "--compile",
        nargs="?",
        const="default",
        choices=COMPILE_MODES,
        metavar="MODE",
        help="the model's forward and backward through torch.compile (inductor; --set train.compile_backend=NAME "
        f"for another), MODE one of {', '.join(COMPILE_MODES)} (default: default); reduce-overhead replays them as "
        "CUDA graphs, for a small model's host-bound step on a GPU",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_const",
        const=True,
        default=None,
        help="one GPU: each micro-batch's forward and backward replayed from one CUDA graph after three eager steps "
        "(train.cuda_graphs; not with --compile, nor pretrain's --packing): the host-bound step without its launches",
    )


def _adapt_flags(p: argparse.ArgumentParser) -> None:
    from .adapters import method_names, specs  # the registry: every method's name comes from its entry
    from .models.pretrained import PRETRAINED
    from .ops import BACKENDS

    p.description = (
        f"Fine-tune a pretrained model with an adapter method ({', '.join(method_names('method'))}) "
        f"or a control ({', '.join(method_names('control'))})."
    )
    _add_run_folder_flags(p, "model, method, data, train")
    p.add_argument("--model", help=f"{', '.join(PRETRAINED)} or a local Hugging Face folder")
    p.add_argument("--method", help="a registered method or control (`diffattn info` lists them; default dex)")
    mergeable = ", ".join(s.name for s in specs() if s.mergeable)
    p.add_argument("--merge", action="store_const", const=True, default=None, help=f"also write merged/ ({mergeable})")
    p.add_argument("--backend", help=f"backend of the adapters' two-map attention op ({', '.join(BACKENDS)})")
    p.add_argument("--data", help="'shakespeare', or a .txt/.jsonl/.json file or directory")
    p.add_argument("--seq-len", type=int, help="training sequence length (default 256)")
    p.add_argument("--max-steps", type=int, help="optimiser steps (default 200)")
    p.add_argument("--batch-size", type=int, help="global batch in sequences (default 8)")
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-4)")
    _add_cadence_flags(p)
    _add_compile_flag(p)
    p.add_argument(
        "--recipe",
        choices=["ours", "paper"],
        default="ours",
        help="training recipe: ours (one for every method, default) or paper (each method's paper: lr, schedule, "
        "warm-up, weight decay; see diffattn.train.recipes); flags and --set override it",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="A.B=VALUE", help="any config field; method.X = method option X"
    )
    _add_resume_or_overwrite(p)
    p.set_defaults(func=cmd_adapt)


def _eval_flags(p: argparse.ArgumentParser) -> None:
    from .eval.suite import SUITE_TABLE

    p.add_argument("model", help="a diffattn run folder, a Hugging Face folder, or smollm2-135m")
    p.add_argument(
        "--suite",
        default=",".join(name for name, entry in SUITE_TABLE.items() if entry.default),
        help="comma-separated suites of the suite table (`diffattn info` lists them; default %(default)s)",
    )
    p.add_argument("--out", required=True, help="folder for results.json and the PNGs")
    p.add_argument("--name", help="the model's name in results and plots (default: the argument)")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a model folder with an auto_map run its own Python code (only for code you have read)",
    )
    _add_suite_options(p)
    p.set_defaults(func=cmd_eval)


def _run_flags(p: argparse.ArgumentParser) -> None:
    _add_report_to(p)
    p.add_argument("experiment", help="the experiment YAML (see diffattn.experiments.config)")
    p.add_argument("--root", default="runs", help="parent of the experiment's folder (default runs/)")
    p.add_argument(
        "--set", action="append", default=[], metavar="A.B=VALUE", help="override, e.g. models.0.preset=small"
    )
    p.add_argument("--overwrite", nargs="*", metavar="NAME", help="redo these parts (no names: every part)")
    p.add_argument(
        "--train-only", action="store_true", help="pretrain and adapt only; evaluate and report on a later run"
    )
    p.add_argument(
        "--jobs", type=_positive_int, default=1, metavar="N",
        help="train N from-scratch parts, and evaluate N models, at once, each in its own process with cores/N "
        "threads (default 1; adapters train one after the other, with every core: measured no faster in parallel); "
        "each one's output goes to the experiment's logs/NAME.log (logs/eval-NAME.log); Ctrl-C or a SIGTERM to this "
        "process stops the workers too (a rerun resumes training from their checkpoints)",
    )  # fmt: skip
    p.set_defaults(func=cmd_run)


def _bench_flags(p: argparse.ArgumentParser) -> None:
    from .cuda_graphs import COMPILE_MODES

    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    b = bench.add_parser("attention", help="DIFF attention per backend vs baseline SDPA and HF DiffLlama")
    b.add_argument(
        "--sizes", default="512,1024,2048,4096", help="comma-separated sequence lengths (default %(default)s)"
    )
    b.add_argument("--heads", type=_positive_int, default=4, help="DIFF heads h (baseline gets 2h); default 4")
    b.add_argument("--head-dim", type=_positive_int, default=64, help="head width d (default 64)")
    b.add_argument("--batch", type=_positive_int, default=1, help="sequences per call (default %(default)s)")
    b.add_argument(
        "--reps",
        type=_positive_int,
        default=5,
        help="repetitions, interleaved round-robin; the median is reported, and under each table the spread of the "
        "repetitions and auto timed against the route it ran: the run's noise (default %(default)s)",
    )
    b.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="(default %(default)s)"
    )
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    b.add_argument("--levels", default="op,module", help="op, module or both (default)")
    b.add_argument("--json", default=None, help="also write the rows to this JSON file")
    b.set_defaults(func=cmd_bench)
    b = bench.add_parser("train-step", help="training step time: DIFF vs baseline vs HF DiffLlama")
    b.add_argument("--presets", default="tiny,small", help="comma-separated model presets (default %(default)s)")
    b.add_argument("--seq-lens", default="512,1024", help="comma-separated sequence lengths (default %(default)s)")
    b.add_argument("--batch", type=_positive_int, default=2, help="sequences per step (default %(default)s)")
    b.add_argument(
        "--reps",
        type=_positive_int,
        default=5,
        help="timed steps per column, interleaved round-robin; the median is reported, each column's max - min on "
        "the row's `range` line (default %(default)s)",
    )
    b.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    b.add_argument(
        "--dtype",
        default=None,
        help="bf16 / fp16: mixed precision (autocast, float32 weights), as training runs on a GPU; fp32. "
        "Default: bf16 on CUDA, fp32 on CPU",
    )
    b.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="every model's forward through torch.compile (BACKEND, default inductor); compiled in the warm-up step",
    )
    b.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        metavar="MODE",
        help=f"with --compile: torch.compile's mode, one of {', '.join(COMPILE_MODES)}; reduce-overhead replays the "
        "compiled forward and backward as CUDA graphs (what `diffattn pretrain --compile reduce-overhead` runs)",
    )
    b.add_argument(
        "--cuda-graphs",
        nargs="?",
        const="whole",
        default=None,
        choices=("whole", "micro"),
        metavar="SCOPE",
        help="CUDA, bf16 or fp32: each column's step captured once as a CUDA graph and replayed, the step's GPU work "
        "without the host's launches (diffattn.cuda_graphs); SCOPE whole (default: forward, backward and AdamW) or "
        "micro (forward and backward, AdamW eager: what `diffattn pretrain --cuda-graphs` runs)",
    )
    b.add_argument(
        "--backends",
        default="",
        metavar="A,B",
        help="one more DIFF column per backend, forced (e.g. cudnn_maps,sdpa_maps,sdpa): the route for this model "
        "size by measurement, where most of auto's table was measured at 16K tokens; a backend that cannot run is a "
        "NaN column. A suffix runs a column with a route-table switch on: +norm (the head norm in the epilogue's "
        "kernel; after auto or an +epilogue route, e.g. cudnn+epilogue+norm), +lambda (λ by its Triton kernels; e.g. "
        "auto+norm+lambda), +pairs (DIFF V1's heads handed to the op in interleaved pairs, e.g. auto+pairs), "
        "+perlayer (each layer's own λ, where the model computes them at once: a comparison, e.g. auto+norm+perlayer). "
        "v2:BACKEND forces it in DIFF V2's model instead (e.g. v2:cudnn_direct; no suffix)",
    )
    b.add_argument(
        "--host-profile",
        action="store_true",
        help="one more step per column under the profiler's Python tracer, after the timing: where each column's "
        "host time goes (a small model's step on a GPU is host-bound); not with --cuda-graphs",
    )
    b.add_argument("--json", default=None, help="also write the rows to this JSON file")
    b.set_defaults(func=cmd_bench_train_step)


# Every command: the one line `diffattn --help` lists (written here, importing nothing: that listing must not wait
# for torch) and what adds its flags (which may import the tables their choices and help texts come from).
COMMANDS: dict[str, tuple[str, typing.Callable[[argparse.ArgumentParser], None]]] = {
    "quickstart": (
        "check the backends, then run the embedded quickstart experiment (about 10 minutes on a CPU)",
        _quickstart_flags,
    ),
    "pretrain": ("train a DIFF Transformer and/or its same-size baseline from scratch", _pretrain_flags),
    "adapt": (
        "fine-tune a pretrained model with an adapter method or a control (`diffattn adapt --help` lists them)",
        _adapt_flags,
    ),
    "eval": ("run evaluation suites on a model or run folder: results.json + pictures", _eval_flags),
    "run": ("run an experiment YAML: pretrain, adapt, evaluate, report (skips finished parts)", _run_flags),
    "export": ("copy an experiment's report, results and pictures (no checkpoints) elsewhere", _export_flags),
    "refresh": (
        "rewrite finished reports' claim verdicts and evaluation tables from their results.json with this "
        "version's claims engine (nothing is measured again)",
        _refresh_flags,
    ),
    "info": (
        "versions, device, and which attention backends are usable (and why not)",
        lambda p: p.set_defaults(func=cmd_info),
    ),
    "presets": ("list the model presets with baseline and DIFF parameter counts", _presets_flags),
    "bench": ("benchmarks that print ratios measured side by side", _bench_flags),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # Ctrl-C while the parser is built (its help texts import the suite and method tables): one line too
        command = _named_command(argv)
        parser = build_parser(only=() if command is None else (command,))
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print(f"{_line_start()}diffattn: interrupted", file=sys.stderr)
        return 130
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if getattr(args, "report_to", None) is None:
            return args.func(args)
        from .train.tracking import reporting

        with reporting(args.report_to):  # an integration that is not installed: one line, before any training
            return args.func(args)
    except KeyboardInterrupt:
        print(f"{_line_start()}diffattn: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one clear line; the traceback only with --verbose
        message, status = failure_line(e)
        if args.verbose:
            logging.getLogger("diffattn").exception("traceback of the failure below")
        print(f"{_line_start()}diffattn: error: {message}", file=sys.stderr, flush=True)
        return status


def _line_start() -> str:
    """A newline when a progress bar may have been left mid-line (training stopped on a NaN loss, an evaluation
    failed): on a terminal always (a bar's next redraw would overwrite the message), in a pipe or log when a tqdm bar
    is still open (its last text has no newline, and the message would be glued to it)."""
    try:
        from tqdm import tqdm

        open_bars = bool(getattr(tqdm, "_instances", None))
    except ImportError:  # pragma: no cover - tqdm is a dependency
        open_bars = False
    return "\n" if sys.stderr.isatty() or open_bars else ""


# errno values that are a fault of the machine, not of the input: exit status 1 (bad input: 2)
_MACHINE_FAULTS = {"ENOSPC", "EIO", "ENOMEM", "EDQUOT", "EROFS_DEVICE"}


def failure_line(e: BaseException) -> tuple[str, int]:
    """One line for any failure, and the exit status: 2 for bad input (what the user can fix: a value, a path, a
    file's contents), 1 for a fault of the machine (a full disk, an I/O error) or a failure of the library."""
    import errno

    from .experiments.runner import PartFailed
    from .files import NoSpaceError

    if isinstance(e, PartFailed) and e.__cause__ is not None:  # a worker's failure: the part and log, its cause's kind
        return _one_line(e), failure_line(e.__cause__)[1]
    if isinstance(e, ValueError):  # the library's own refusals, and JSON errors (ValueError subclasses)
        return _one_line(e) or type(e).__name__, 2
    if isinstance(e, NoSpaceError):  # already says what was written, where, and what is intact
        return e.strerror, 1
    if isinstance(e, OSError):
        name = errno.errorcode.get(e.errno or 0, "")
        # a copy's error carries the source as filename and the file being written as filename2 (shutil)
        path = e.filename2 if name in ("ENOSPC", "EDQUOT") and getattr(e, "filename2", None) else e.filename
        where = f": {path}" if path else ""
        what = e.strerror or str(e)
        if name == "ENOSPC":
            what = "no space left on the device (free some space and rerun: finished parts are kept)"
        return f"{what}{where}", 1 if name in _MACHINE_FAULTS else 2
    if isinstance(e, RecursionError):
        return "an input nests without end (a YAML alias that refers to itself?)", 2
    try:
        import yaml

        if isinstance(e, yaml.YAMLError):
            return f"not valid YAML: {str(e).splitlines()[0]}", 2
    except ImportError:  # pragma: no cover - yaml is a dependency
        pass
    return f"{type(e).__name__}: {_one_line(e)} (rerun with --verbose for the traceback)", 1


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (multi-line messages joined with '; ')."""
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
