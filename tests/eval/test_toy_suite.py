"""The contributor's trial for suites (issues 28, 35): a toy suite with its own option and its own claim, added by
one new file (tests/eval/toy_suite.py: the suite, its claim as data in it) and one registration line, shows its flag
in ``diffattn eval --help``, refuses a bad value of its option, runs from an experiment YAML with that option, and
its protocol sentence and claim row reach the report — no other file changed."""

from __future__ import annotations

import json

import pytest

from diffattn.cli import main
from diffattn.eval import suite as suite_module
from diffattn.experiments import ExperimentConfig, run_experiment

from . import toy_suite


@pytest.fixture
def toy():
    suite_module.register_suite(toy_suite.SUITE)  # the suite's registration line: its claim comes with it
    yield
    del suite_module.SUITE_TABLE["toy"]


def test_the_toy_option_is_a_flag_and_is_checked(toy, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--toy-repeats" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"eval\.options\.toy_repeats must be >= 1, got 0"):
        suite_module.SuiteOptions(toy_repeats=0).validate(["toy"], style="experiment")


def test_the_toy_suite_runs_from_an_experiment_and_its_claim_reaches_the_report(toy, corpus_dir, tmp_path):
    yaml = tmp_path / "toy.yaml"
    yaml.write_text(
        f"""
name: toy
data: {{source: {corpus_dir}, seq_len: 32, vocab_size: 300, val_sequences: 2}}
train: {{max_steps: 2, global_batch_size: 2, eval_every: 2, save_every: 2}}
models:
  - {{name: baseline, preset: debug, attention: standard}}
  - {{name: diff, preset: debug, attention: diff}}
eval:
  suites: [toy]
  options: {{toy_repeats: 3}}
"""
    )
    run_experiment(ExperimentConfig.load(yaml), tmp_path / "runs")
    out = tmp_path / "runs" / "toy"
    evaluated = json.loads((out / "eval" / "diff" / "results.json").read_text())
    assert evaluated["suites"]["toy"]["repeats"] == 3 and evaluated["metadata"]["options"]["toy_repeats"] == 3
    report = (out / "report.md").read_text()
    assert "- Toy: the toy text repeated 3 times." in report
    row = next(line for line in report.splitlines() if line.startswith("| Toy paper Fig. 1 |"))
    assert "baseline → diff: toy log-probability" in row
    doc = json.loads((out / "results.json").read_text())
    toy_rows = [c for c in doc["claims"] if c["source"] == "Toy paper Fig. 1"]
    assert len(toy_rows) == 1 and toy_rows[0]["ref"] == "baseline" and toy_rows[0]["new"] == "diff"
    score = {m: doc["evaluations"][m]["toy"]["score"] for m in ("baseline", "diff")}
    assert (toy_rows[0]["ref_value"], toy_rows[0]["new_value"]) == pytest.approx((score["baseline"], score["diff"]))
