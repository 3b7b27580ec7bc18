"""A toy λ(t) method added as a contributor adds one — one new file (``toy_lambda_method.py``, ending with its
``register``) and one registration line (its import, here in a fixture) — reaches the conformance checks, the
inherited λ(t) options and checks, ``diffattn adapt`` (training, its options resolved and refused), save/load,
``diffattn info``, ``diffattn adapt --help`` and a report's protocol, with no other file changed."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

import diffattn
from diffattn.adapters import registry
from diffattn.cli import main

from . import conformance

MODULE = "tests.adapters.toy_lambda_method"


@pytest.fixture
def toy():
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)  # the registration line
    yield module
    registry.unregister(module.NAME)
    sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_toy_method_passes_every_conformance_check(toy, model_type, tmp_path):
    assert toy.NAME in registry.method_names("method")
    conformance.run_every_check(toy.NAME, model_type, tmp_path)


def test_the_toy_method_inherits_the_lambda_t_options_and_their_checks(toy):
    from diffattn.train.adapt_config import AdaptMethodSection, AdaptRunConfig, default_anneal_steps

    spec = registry.get_method(toy.NAME)
    assert spec.annealed  # derived from its config's base: the end-of-run λ check and `diffattn info` know it
    assert spec.options == ("gain_init", "lambda_init", "anneal", "anneal_steps")
    with pytest.raises(ValueError, match=r"ToyLambdaConfig\.anneal_steps must be >= 1"):
        toy.ToyLambdaConfig(anneal_steps=0)
    with pytest.raises(ValueError, match=r"ToyLambdaConfig\.lambda_init must be 'exponential' or a number"):
        toy.ToyLambdaConfig(lambda_init="linear")
    config = AdaptRunConfig(method=AdaptMethodSection(name=toy.NAME))
    config.train.max_steps = 30
    assert config.method_config().anneal_steps == default_anneal_steps(30) == 10  # T from the run's length
    config.train.schedule_steps = 100  # stopped part-way through a longer plan: T is the plan's, as its steps were
    assert config.method_config().anneal_steps == default_anneal_steps(100) == 20
    config.method.options = {"gain_init": 0.0}
    with pytest.raises(ValueError, match="ToyLambdaConfig would train nothing: with gain_init=0"):
        config.method_config()  # check_learnable, inherited, before anything is loaded


def test_the_toy_method_trains_saves_reloads_and_is_listed_and_reported(toy, base_dir, corpus_dir, tmp_path, capsys):
    from diffattn.experiments.report import _method_settings
    from diffattn.experiments.runner import PartOutcome

    out = tmp_path / "toy"
    args = ["adapt", "--model", str(base_dir), "--method", toy.NAME, "--data", str(corpus_dir), "--out", str(out)]
    args += ["--max-steps", "4", "--batch-size", "2", "--seq-len", "32", "--lr", "0.05", "--set", "train.lambda_lr=0.1"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == toy.NAME
    assert summary["method_config"] == {
        "gain_init": 1.0,
        "lambda_init": "exponential",
        "anneal": True,
        "anneal_steps": 2,
    }
    assert any(abs(v) > 0 for v in summary["lambda"])  # λ(t) at the end of the run
    model, _ = diffattn.load_adapted(out)
    assert diffattn.adapter_lambdas(model) == pytest.approx(summary["lambda"])  # reloaded as trained

    capsys.readouterr()
    assert main(["info"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(toy.NAME)]
    assert listed and "Toy λ(t); does not merge; λ(t) of Dex Eq. 4" in listed[0]
    with pytest.raises(SystemExit):  # the command's own help lists the registry's methods
        main(["adapt", "--help"])
    assert f", {toy.NAME}) or a control" in " ".join(capsys.readouterr().out.split())

    line = _method_settings([PartOutcome("adapt", "toy-run", out, "fresh", summary=summary)])
    assert line == [f"- toy-run ({toy.NAME}): gain_init 1.0, anneal_steps 2"]
