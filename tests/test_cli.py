"""The command line: help, info, presets, quickstart, the attention benchmark at a tiny size, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import diffattn
from diffattn.bench.attention import run_attention_benchmark, target_lines
from diffattn.cli import COMMANDS, _named_command, build_parser, main


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("quickstart", "info", "presets", "bench"):
        assert cmd in out


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "diffattn.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("diffattn ")


def test_version_and_help_are_answered_without_loading_torch(capsys):
    """``diffattn --help``, ``--version`` and a command that needs neither are answered without importing torch or
    transformers (seconds): main builds only the named command's flags, whose help texts import the method and suite
    tables."""
    argvs = (["--version"], ["-v", "--version"], ["--help"], ["export", "--help"])
    code = (
        "import sys\nfrom diffattn.cli import main\n"
        f"for argv in {argvs!r}:\n"
        "    try:\n        main(argv)\n    except SystemExit as e:\n"
        "        print('exit', e.code, 'torch' in sys.modules or 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.startswith(f"diffattn {diffattn.__version__}\nexit 0 False\n"), out.stderr
    assert [line for line in out.stdout.splitlines() if line.startswith("exit")] == ["exit 0 False"] * 4, out.stdout
    with pytest.raises(SystemExit) as e:  # the full parser answers the same
        build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"diffattn {diffattn.__version__}\n"


def test_the_command_listing_is_the_same_whichever_commands_are_built():
    """A command built without its flags is listed with the same line as when built in full, and main builds the
    command argv names (past the top-level flags)."""
    full, bare = build_parser().format_help(), build_parser(only=()).format_help()
    assert full == bare and all(name in bare for name in COMMANDS)
    assert _named_command(["-v", "adapt", "--model", "x"]) == "adapt" and _named_command(["--help"]) is None
    args = build_parser(only=("presets",)).parse_args(["-v", "presets", "--count-all"])
    assert args.count_all and args.verbose
    with pytest.raises(SystemExit):  # an unbuilt command has no flags
        build_parser(only=("info",)).parse_args(["presets", "--count-all"])


def test_package_names_resolve_lazily():
    import diffattn

    assert callable(diffattn.diff_attention) and "debug" in diffattn.PRESETS
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = diffattn.nope


def test_info_reports_every_backend_and_why(capsys, monkeypatch):
    import transformers

    with monkeypatch.context() as hidden:  # info reads transformers' version without importing it (3 s of 6)
        hidden.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
        assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"transformers  {transformers.__version__}\n" in out and "(torch kernels: " in out  # the rounding's ISA
    assert "torch" in out
    for name in ("auto", "reference", "sdpa", "chunked", "triton"):
        assert name in out
    assert "now: chunked" in out
    # why each backend is (un)usable, as the registry says it (TRITON_INTERPRET=1 set or not: its own reason either way)
    from diffattn.ops import backend_status

    for status in backend_status():
        assert " ".join(status.reason.split()) in " ".join(out.split()), status
    # a cuDNN route with the epilogue says cuDNN needs CUDA, not how the epilogue's Triton kernel runs on a CPU
    assert {s.name: s.reason for s in backend_status("cpu")}[
        "cudnn+epilogue"
    ] == "device cpu: cuDNN attention runs on CUDA"
    # one column for the verdict, however long a backend's name ("sdpa_split+epilogue")
    rows = out.split("backends of diffattn.ops.diff_attention:\n")[1].split("kernel switches")[0].splitlines()
    assert len(rows) == len(backend_status()) + 1
    assert len({row.index(" usable " if " usable " in row else " unusable ") for row in rows}) == 1
    # the route table's switches of the DIFF layer's kernels: off off CUDA, unless forced
    want = "kernel switches of the DIFF layer (off CUDA: off): fused_head_norm off, fused_lambda off, fused_v_copies"
    assert want + " off" in out
    from diffattn.ops import fused_head_norm

    with fused_head_norm(True):
        assert main(["info"]) == 0
    assert "fused_head_norm on, fused_lambda off, fused_v_copies off" in capsys.readouterr().out


def test_presets_prints_counts(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "debug" in out and "paper-3b" in out and "baseline 90,432 params" in out
    assert "builds the model at its tokenizer's (--vocab-size, default 8,192)" in out  # why pretrain's count differs


def test_quickstart_checks_pass_and_generates(capsys):
    assert main(["quickstart", "--new-tokens", "3", "--check-only"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "[FAIL]" not in out
    assert "op 'sdpa' vs reference" in out and "DIFF model logits, 'auto' vs reference" in out
    from diffattn.ops import backend_status

    checked = [s.name for s in backend_status() if s.usable and s.name != "reference"] + ["auto"]
    assert out.count("[ok]") == 2 * len(checked)  # every usable backend and auto: op and model each


def test_bench_attention_tiny_run_writes_ratios(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "attention",
                "--sizes",
                "32",
                "--reps",
                "1",
                "--heads",
                "1",
                "--head-dim",
                "8",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "HF DiffLlamaAttention" in out and "diff reference" in out and "diff auto" in out
    assert "GFLOP/s fwd" in out  # a CPU's rates, not 0.00 TFLOP/s
    assert "(--reps 1): this run measured nothing of its noise" in out
    rows = json.loads(path.read_text())["rows"]
    base = [r for r in rows if r["impl"].startswith("baseline")]
    assert base and all(r["fwd_ratio"] == 1.0 for r in base)


def test_under_the_table_the_runs_noise_auto_against_the_route_it_ran_and_the_spread():
    """auto read 1.6x faster than chunked, the very route it ran, on a busy 2-core CPU with 5 repetitions: the table
    now says what such a run's noise is, the same computation timed twice and the repetitions' spread."""
    from diffattn.bench.attention import BASELINE, Row, format_table, noise_lines

    def row(impl, fwd, fwd_bwd, spread, runs=""):
        r = Row("op", 128, impl, fwd, fwd_bwd, fwd_tflops=2.0, fwd_bwd_tflops=1.5)
        r.fwd_spread = r.fwd_bwd_spread = spread
        r.runs = r.runs_fwd = runs
        return r

    rows = [
        row(BASELINE, 0.4, 1.4, 0.1),
        row("diff chunked", 1.1, 2.8, 0.4),
        row("diff auto", 0.7, 2.4, 0.2, "chunked"),
    ]
    lines = noise_lines(rows)
    assert lines[0] == (
        "noise, N=128: diff auto ran chunked, so one computation was timed twice: fwd 0.70 vs 1.10 ms (1.57x), "
        "fwd+bwd 2.40 vs 2.80 ms (1.17x); ratios nearer 1 than these are this run's noise"
    )
    assert lines[1] == (
        "spread of the repetitions, (max - min) / median, fwd: 20% for the median row, up to 40% (diff chunked, N=128)"
    )
    assert len(lines) == 3  # fwd+bwd's; no decode line (not timed)
    # a route that was not a row of its own (auto ran sdpa, not timed forced): nothing to compare it with
    assert not any(line.startswith("noise") for line in noise_lines([row("diff auto", 0.7, 2.4, 0.2, "sdpa")]))
    assert "TFLOP/s fwd" in format_table(rows)  # rates of 1 TFLOP/s and more stay in TFLOP/s
    # on CUDA the forward (under no_grad) is another call class: each column is paired with its own route's row
    rows[2].runs_fwd = "sdpa"
    rows.append(row("diff sdpa", 0.9, 3.0, 0.1))
    assert noise_lines(rows)[0].startswith(
        "noise, N=128: diff auto ran sdpa (fwd) and chunked (fwd+bwd), so one computation was timed twice: "
        "fwd 0.70 vs 0.90 ms (1.29x), fwd+bwd 2.40 vs 2.80 ms (1.17x)"
    )


def test_an_auto_row_names_the_route_it_ran_once_it_has_run(monkeypatch):
    """On CUDA a route that fails at run time hands over to the next, and auto names the next from then on: the
    route an auto row reports (and its noise twin) is asked after the row has run, not before (it named the route
    that failed)."""
    import diffattn.ops
    from diffattn.bench import attention

    from .helpers import record_backends

    ran = record_backends(monkeypatch, attention)
    # a stand-in for a table route that failed on its first call: auto names it before and its successor after
    monkeypatch.setattr(
        diffattn.ops, "auto_backend", lambda device, inp=None: "reference" if "auto" in ran else "chunked"
    )
    rows = run_attention_benchmark([16], heads=1, head_dim=8, reps=1, levels=("op",), backends=["reference", "auto"])
    assert {(r.impl, r.runs_fwd, r.runs) for r in rows if r.impl.endswith(" auto")} == {
        ("diff auto", "reference", "reference"),
        ("diff-v2 auto", "reference", "reference"),
    }


def test_target_lines_report_met_and_missed():
    rows = run_attention_benchmark([16], heads=1, head_dim=8, reps=1, levels=("op",), backends=["reference", "auto"])
    lines = target_lines(rows, seq_len=16)
    assert len(lines) == 2 and all(("met" in line) or ("MISSED" in line) for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "attention", "--sizes", "9x"], "--sizes must be comma-separated positive integers"),
        (["bench", "attention", "--sizes", "0"], "--sizes must be"),
        (["bench", "attention", "--levels", "kernel"], "--levels must be"),
    ],
)
def test_bad_cli_input_is_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unknown_subcommand_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train-everything"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_eval_needle_options_parse(monkeypatch):
    from diffattn.cli import build_parser

    args = build_parser().parse_args(
        [
            "eval",
            "m",
            "--out",
            "o",
            "--niah-digits",
            "2",
            "--niah-heatmap-lengths",
            "none",
            "--niah-heatmap-samples",
            "3",
        ]
    )
    assert (args.niah_digits, args.niah_heatmap_lengths, args.niah_heatmap_samples) == (2, (), 3)
    assert build_parser().parse_args(
        ["eval", "m", "--out", "o", "--niah-heatmap-lengths", "64,128"]
    ).niah_heatmap_lengths == (
        64,
        128,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "m", "--out", "o", "--niah-heatmap-lengths", "0"])


def test_the_training_commands_help_lists_every_backend(capsys):
    """pretrain's and adapt's help list every backend; the flags' helps give their defaults, each as its home has it
    (the run configs' dataclasses, the evaluation options class)."""
    import argparse
    import dataclasses

    from diffattn.eval.suite import option_specs
    from diffattn.ops import BACKENDS
    from diffattn.train.adapt_config import AdaptMethodSection
    from diffattn.train.config import DataConfig, ModelConfig, TrainConfig

    for command in ("pretrain", "adapt"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert ", ".join(BACKENDS) in out.replace(", ", ",").replace(",", ", "), command
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    helps = {c: {o: a.help or "" for a in commands[c]._actions for o in a.option_strings} for c in commands}
    homes = {"--preset": ModelConfig, "--attention": ModelConfig, "--backend": ModelConfig, "--vocab-size": DataConfig,
             "--seq-len": DataConfig, "--retrieval-fraction": DataConfig, "--max-steps": TrainConfig,
             "--batch-size": (TrainConfig, "global_batch_size"), "--grad-accum": TrainConfig, "--lr": TrainConfig,
             "--schedule": TrainConfig}  # fmt: skip
    for flag, home in homes.items():
        cls, field = home if isinstance(home, tuple) else (home, flag[2:].replace("-", "_"))
        default = {f.name: f.default for f in dataclasses.fields(cls)}[field]
        said = f"default {default:g}" if isinstance(default, float) else f"default {default}"
        assert said in helps["pretrain"][flag], (flag, said)
    assert "default dex" in helps["adapt"]["--method"] and AdaptMethodSection.name == "dex"
    for spec in option_specs():  # eval: from the options class, where the help text does not say it itself
        if spec.default not in (None, ()) and "default" not in spec.help:
            assert helps["eval"][spec.flag].endswith(f"(default {spec.default})"), spec.flag
