"""The evidence committed under results/: every exported experiment's results.json follows the results schema and
its report's pictures are there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diffattn.experiments.report import EXPORT_MARKER
from diffattn.experiments.schema import validate_results

RESULTS = Path(__file__).resolve().parents[2] / "results"
EXPORTS = sorted(p.parent for p in RESULTS.glob(f"*/{EXPORT_MARKER}"))


def test_results_are_committed():
    assert EXPORTS, f"no exported experiment under {RESULTS}"


@pytest.mark.parametrize("folder", EXPORTS, ids=[p.name for p in EXPORTS])
def test_committed_results_follow_the_schema_and_the_report_is_complete(folder):
    results = json.loads((folder / "results.json").read_text())
    validate_results(results)
    report = (folder / "report.md").read_text()
    assert "## Paper claims" in report and "## Protocol" in report
    for picture in re.findall(r"\]\(([^)\s]+\.png)\)", report):
        assert (folder / picture).is_file(), picture
    assert all(c["verdict"] in ("agrees", "disagrees", "inconclusive") for c in results["claims"])
