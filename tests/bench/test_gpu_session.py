"""benchmarks/gpu_session.sh, dry: the whole script run on the CPU with its Python replaced by a stand-in that parses
each step's command line with that step's own argument parser and does nothing else (pytest runs are only recorded).
A flag the step does not take, a step that no longer runs or one that runs out of order costs a lease its step; here
it costs a test. What each step measures is tested beside its module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# the stand-in for `python3`: records its argv, parses `-m MODULE ARGS` with MODULE's parser, writes what the script's
# conditions look for (each --json file, the sweep's route table, a switch decided on) so every step after them runs
STAND_IN = r"""
import argparse, json, os, sys
from pathlib import Path

argv = sys.argv[1:]
with open(os.environ["DRY_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\n")
if argv[:1] == ["-c"]:  # the versions line
    print("torch dry-run")
    sys.exit(0)
script, args = (argv[1], argv[2:]) if argv[:1] == ["-m"] else (argv[0], argv[1:])
if script == "pytest" or script.endswith("cudnn_grad_layout.py"):
    sys.exit(0)


class Parsed(Exception):
    pass


parse = argparse.ArgumentParser.parse_args


def parse_only(self, args=None, namespace=None):
    parsed = parse(self, args, namespace)
    raise Parsed(parsed)


argparse.ArgumentParser.parse_args = parse_only
if script == "diffattn":
    from diffattn.cli import build_parser as build
    main = lambda a: build().parse_args(a)
elif script.endswith("gpu_report.py"):
    from diffattn.bench.gpu_report import main
else:
    import importlib
    main = importlib.import_module(script).main
try:
    main([a for a in args if a != "-v"] if script == "diffattn" else args)
    sys.exit(f"{script}: its main did not parse its arguments")
except Parsed as done:
    parsed = vars(done.args[0])
for key in ("json",):
    if parsed.get(key):
        Path(parsed[key]).write_text("{}")
if script == "diffattn.bench.route_sweep":
    (Path(parsed["out"]) / "route_table.json").write_text("{}")
if script == "diffattn.bench.switches":
    print("fused_v_copies: on — dry run")
"""


def _dry_run(tmp_path, **env_more) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """benchmarks/gpu_session.sh run with the stand-in Python (and ``env_more`` in its environment): the finished
    process and every stand-in call's argv but the versions line's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'dry run GPU, 0, 0 MiB, 0 MHz'\n")
    stand_in = bin_dir / "python-dry"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_IN}")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    log, out = tmp_path / "argv.jsonl", tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(stand_in), "OUT": str(out),
           "BUDGET_S": "100000", "DRY_LOG": str(log), "PYTHONPATH": str(ROOT / "src"), **env_more}  # fmt: skip
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, [c for c in calls if not (c[:1] == ["-c"] and "import torch, triton, transformers" in c[1])]


@pytest.mark.heavy  # a dozen Python processes each importing torch
def test_every_step_of_the_gpu_script_runs_with_arguments_its_step_takes(tmp_path):
    done, _ = _dry_run(tmp_path)
    log = tmp_path / "argv.jsonl"
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "exit code" not in text and "skipped" not in text, text  # every step ran, none refused its arguments
    calls = [json.loads(line) for line in log.read_text().splitlines() if not line.startswith('["-c"')]
    ran = [c[1] if c[0] == "-m" else c[0] for c in calls]
    steps = ["diffattn.bench.route_sweep", "benchmarks/cudnn_grad_layout.py", "pytest", "diffattn", "diffattn",
             "diffattn.bench.call_kernels", "diffattn.bench.switches", "diffattn", "diffattn", "diffattn", "diffattn",
             "diffattn.bench.route_sweep", "diffattn", "diffattn", "benchmarks/gpu_report.py", "diffattn"]  # fmt: skip
    assert ran[: len(steps)] == steps, ran
    assert set(ran[len(steps) : -1]) == {"pytest"} and len(ran) - len(steps) - 1 > 2, ran  # one process per file
    assert ran[-1] == "diffattn.bench.targets" and calls[-1][-1] == "--write"
    # the train steps in their order, each told where to write: the graphed one with --cuda-graphs
    steps_written = [Path(c[c.index("--json") + 1]).name for c in calls if c[:2] == ["-m", "diffattn"]]
    assert steps_written == ["train.json", "train_host.json", "train_decided.json", "train_graphed.json",
                             "train_graphed_micro.json", "train_compiled.json", "train_830m.json",
                             "train_830m_4k.json", "train_kernel.json"]  # fmt: skip
    # paper-830m at 2K (batch 2) and 4K (batch 1) tokens: issue 34 asks both
    big = {Path(c[c.index("--json") + 1]).name: c for c in calls if any("train_830m" in a for a in c)}
    assert [(c[c.index("--seq-lens") + 1], c[c.index("--batch") + 1]) for c in big.values()] == [
        ("2048", "2"),
        ("4096", "1"),
    ]
    micro = [c for c in calls if any(a.endswith("train_graphed_micro.json") for a in c)]
    assert len(micro) == 1 and micro[0][micro[0].index("--cuda-graphs") + 1] == "micro"
    host = [c for c in calls if any(a.endswith("train_host.json") for a in c)]
    assert len(host) == 1 and "--host-profile" in host[0]
    graphed = [c for c in calls if any(a.endswith("train_graphed.json") for a in c)]
    assert len(graphed) == 1 and "--cuda-graphs" in graphed[0]
    compiled = [c for c in calls if any(a.endswith("train_compiled.json") for a in c)]
    assert len(compiled) == 1 and compiled[0][compiled[0].index("--compile-mode") + 1] == "reduce-overhead"
    kernel = [c for c in calls if any(a.endswith("train_kernel.json") for a in c)]
    assert len(kernel) == 1 and kernel[0][kernel[0].index("--backends") + 1] == "triton"


@pytest.mark.heavy  # a few Python processes each importing torch
def test_a_call_with_the_resweep_and_no_train_step_reads_the_switch_from_the_table_in_force(tmp_path):
    # STEPS=graphed,resweep (the next lease's first call): no switches.txt in OUT, so whether [V; V] by its kernels is
    # on is asked of the route table in force (the shipped entry has it on; the stand-in answers yes), and V1's
    # one-call routes are swept again with it
    done, calls = _dry_run(tmp_path, STEPS="graphed,resweep")
    assert done.returncode == 0, done.stdout + done.stderr
    asked = [c for c in calls if c[:1] == ["-c"] and "v_copies_in_kernel" in c[1]]
    swept = [c for c in calls if c[:2] == ["-m", "diffattn.bench.route_sweep"]]
    assert len(asked) == 1 and len(swept) == 1 and swept[0][swept[0].index("--plan") + 1] == "v_copies"


@pytest.mark.heavy  # a Python process importing torch (the targets)
def test_the_gpu_tests_of_the_files_asked_for_alone_in_their_order(tmp_path):
    # TEST_FILES: a lease's short call runs the gpu tests of what changed since its last run, not every file
    files = ["tests/ops/test_triton.py", "tests/ops/test_direct.py"]
    done, calls = _dry_run(tmp_path, STEPS="tests", TEST_FILES=",".join(files))
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [c[-1] for c in calls if c[:2] == ["-m", "pytest"]]
    assert ran == files, calls
