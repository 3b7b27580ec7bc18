"""The command line: help, info, presets, quickstart, the attention benchmark at a tiny size, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import diffattn
from diffattn.bench.attention import run_attention_benchmark, target_lines
from diffattn.cli import _asks_only_the_version, build_parser, main


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


def test_version_is_answered_without_loading_torch_as_argparse_would_answer_it(capsys):
    """``diffattn --version`` before the parser (whose help texts import torch and transformers) is built."""
    code = (
        "import sys\nfrom diffattn.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules or 'transformers' in sys.modules)"
    )
    for argv in (["--version"], ["-v", "--version"]):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        assert out.stdout.splitlines() == [f"diffattn {diffattn.__version__}", "0 False"], out.stderr
    for argv in ([], ["-v"], ["info", "--version"]):  # no version asked before a command: the parser answers
        assert not _asks_only_the_version(argv)
    with pytest.raises(SystemExit) as e:  # the parser's own version action, where the fast path does not answer
        build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"diffattn {diffattn.__version__}\n"


def test_cli_starts_without_loading_torch():
    code = "import sys, diffattn.cli; sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_package_names_resolve_lazily():
    import diffattn

    assert callable(diffattn.diff_attention) and "debug" in diffattn.PRESETS
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = diffattn.nope


def test_info_reports_every_backend_and_why(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "transformers" in out
    for name in ("auto", "reference", "sdpa", "chunked", "triton"):
        assert name in out
    assert "now: chunked" in out
    # why each backend is (un)usable, as the registry says it (TRITON_INTERPRET=1 set or not: its own reason either way)
    from diffattn.ops import backend_status

    for status in backend_status():
        assert " ".join(status.reason.split()) in " ".join(out.split()), status
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
    rows = json.loads(path.read_text())["rows"]
    base = [r for r in rows if r["impl"].startswith("baseline")]
    assert base and all(r["fwd_ratio"] == 1.0 for r in base)


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
    from diffattn.ops import BACKENDS

    for command in ("pretrain", "adapt"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert ", ".join(BACKENDS) in out.replace(", ", ",").replace(",", ", "), command
