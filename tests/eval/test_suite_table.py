"""The suite table: a toy suite defined in this file alone (a module's ``Suite`` entry, added to the table as its
one line in ``eval/suite.py`` would) runs under ``diffattn eval``, prints its headline, and fills its column and its
section of an experiment report — no other file changed."""

from __future__ import annotations

import json

import pytest
import torch

from diffattn import build_model
from diffattn.cli import main
from diffattn.eval import suite as suite_module
from diffattn.eval.common import Suite


def _run_toy(model, tok, options, folder, name):
    ids = tok("to be or not to be", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    return {"max_logit": float(logits.abs().max()), "tokens": ids.shape[1]}, {}


@pytest.fixture
def toy_suite():
    entry = Suite(
        "toy",
        _run_toy,
        headline=lambda r: {"toy max |logit|": r["max_logit"]},
        compare=lambda results, out: ["toy section: " + ", ".join(sorted(results)), ""],
    )
    suite_module.SUITE_TABLE["toy"] = entry
    yield entry
    del suite_module.SUITE_TABLE["toy"]


def test_a_suite_in_the_table_runs_prints_and_reports(toy_suite, tokenizer, tmp_path, capsys):
    folder = tmp_path / "model"
    build_model("debug", "standard", seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "eval"
    assert main(["eval", str(folder), "--suite", "toy,ppl", "--out", str(out), "--tokens", "64", "--window", "32"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert set(doc["suites"]) == {"toy", "ppl"} and doc["suites"]["toy"]["tokens"] > 0
    assert "toy max |logit|" in capsys.readouterr().out  # its headline is the CLI's summary line
    from diffattn.experiments.report import _side_by_side

    lines = _side_by_side({"a": doc["suites"], "b": doc["suites"]}, tmp_path)
    assert "toy section: a, b" in lines


def test_an_unknown_suite_is_refused_with_the_table():
    with pytest.raises(ValueError, match=r"unknown suite.*nope.*choose from ppl, niah"):
        suite_module.parse_suites("nope")


def test_every_suites_claims_read_its_own_measures_against_the_baseline():
    """A suite carries the DIFF Transformer claims its measures check (Suite.claims): each names one of that
    suite's measures and compares with the baseline, and the claims engine's table is exactly theirs, in order."""
    from diffattn.eval.suite import SUITE_TABLE
    from diffattn.experiments.claims import claim_table

    carried = []
    for suite in SUITE_TABLE.values():
        for c in suite.claims:
            assert c.measure in suite.measures, (suite.name, c.measure)
            assert c.reference == "baseline", c.source
        carried += suite.claims
    assert carried and claim_table() == carried
