"""The claims engine reads a committed experiment as the report that was committed with it: results/seeds-loss's
claim rows, regenerated from its results.json (its models' rows and evaluations), equal the rows it holds."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from diffattn.experiments.claims import paper_claims
from diffattn.experiments.config import ExperimentConfig

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_the_seeds_loss_claims_regenerate_as_committed():
    doc = json.loads((RESULTS / "seeds-loss" / "results.json").read_text())
    config = ExperimentConfig.from_dict(doc["config"])
    rows = {m["model"]: m for m in doc["models"]}
    claims = paper_claims(config, rows, doc["evaluations"], seed=config.seed)
    assert claims and json.loads(json.dumps([asdict(c) for c in claims])) == doc["claims"]
