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


def _drawn_once(side_by_side):
    """report._side_by_side that draws its pictures once and then writes the same bytes and returns the same lines:
    the same evaluations draw the same pictures, and matplotlib is most of a refresh's time (the default run's
    budget)."""
    drawn = {}

    def replay(evals, staged: Path):
        if not drawn:
            drawn["lines"] = side_by_side(evals, staged)
            drawn["files"] = {f.relative_to(staged): f.read_bytes() for f in staged.rglob("*.png")}
        for name, data in drawn["files"].items():
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / name).write_bytes(data)
        return drawn["lines"]

    return replay


def _with_line(claims_section, line: list[str]):
    """report._claims_section with one more line, ``line[0]`` (the caller changes it): another version's verdicts."""

    def section(*args):
        lines, claims, scope = claims_section(*args)
        return [*lines, line[0], ""], claims, scope

    return section


def test_refresh_rewrites_only_the_verdicts_and_evaluation_tables_and_never_an_edited_file(
    tmp_path, monkeypatch, capsys
):
    """`diffattn refresh` on a copy of a committed export: the claim rows become this version's (results.json's
    claims equal the engine's from the same evaluations), the retrieval table prints this version's chance row, every
    other section is untouched, a second refresh changes nothing; notes outside the sections it rewrites are kept,
    and stay the user's, also when the verdicts change; an edit inside them is refused, left as it was."""
    from dataclasses import asdict

    from diffattn.cli import main
    from diffattn.experiments import report as report_module
    from diffattn.experiments.claims import paper_claims
    from diffattn.experiments.config import ExperimentConfig
    from diffattn.experiments.report import _check_export_destination, _exported_files, export_report, refresh_report
    from diffattn.files import file_sha256

    # the committed mini-scratch exported again, annotated outside the sections refresh rewrites, and refreshed by a
    # version whose verdicts read one line more: the export's own record of those sections licenses the rewrite
    folder = export_report(RESULTS / "mini-scratch", tmp_path / "mini-scratch")
    before = (folder / "report.md").read_text() + "\nan early note\n"  # outside the sections: kept by every refresh
    (folder / "report.md").write_text(before)
    verdict = ["A first verdict."]
    monkeypatch.setattr(report_module, "_claims_section", _with_line(report_module._claims_section, verdict))
    assert main(["refresh", str(folder)]) == 0
    doc = json.loads((folder / "results.json").read_text())
    validate_results(doc)
    config = ExperimentConfig.from_dict(doc["config"])
    rows = {m["model"]: m for m in doc["models"]}
    want = paper_claims(config, rows, doc["evaluations"], seed=config.seed)
    assert doc["claims"] == json.loads(json.dumps([asdict(c) for c in want]))
    after = (folder / "report.md").read_text()
    assert "A first verdict." in after and after != before
    assert "Verdicts refreshed by diffattn" in after and "reach chance" in after
    assert "| chance | 1.00 | 1.00 | 0.50 / 0.17 | 0.33 / 0.07 | 1.00 |" in after  # N=6, R=2: R/N and 1/C(6, 2)

    def kept(text):  # the sections refresh does not touch
        return text[text.index("## Protocol") : text.index("## Evaluations")], text[text.index("### Every model") :]

    assert kept(after) == kept(before)
    assert capsys.readouterr().out.endswith("report.md: rewrote report.md\n")  # its claims section only
    monkeypatch.setattr(report_module, "_side_by_side", _drawn_once(report_module._side_by_side))
    assert main(["refresh", str(folder)]) == 0  # says so when a refresh changes nothing (it said "refreshed")
    assert (folder / "report.md").read_text() == after and "nothing changed" in capsys.readouterr().out
    (folder / "report.md").write_text(after + "\nmy notes\n")  # outside the two sections: kept as written
    refresh_report(folder)
    assert (folder / "report.md").read_text() == after + "\nmy notes\n"
    # and still the user's: the refresh wrote it as it found it, so the record keeps the export's own text, and a
    # later export that would change the annotated report is refused, naming it (as refresh's wording says)
    owned = _exported_files(folder)
    assert file_sha256(folder / "report.md") not in owned["report.md"]
    with pytest.raises(ValueError, match=r"export to .* would overwrite report\.md \(changed since diffattn export"):
        _check_export_destination(folder, {"report.md": "another export's text"}, owned)
    # a later version whose verdicts differ: the claims section rewritten around the notes, which stay the user's
    verdict[0] = "A later verdict."
    refresh_report(folder)
    later = (folder / "report.md").read_text()
    assert "A later verdict." in later and kept(later.removesuffix("\nmy notes\n")) == kept(before)
    assert file_sha256(folder / "report.md") not in _exported_files(folder)["report.md"]
    verdict[0] = "Another verdict."
    marker = json.loads((folder / EXPORT_MARKER).read_text())  # one from before the sections were recorded:
    (folder / EXPORT_MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "report_sections"}))
    with pytest.raises(ValueError, match=r"refresh of .* would overwrite report\.md"):  # it licenses no rewrite
        refresh_report(folder)
    assert (folder / "report.md").read_text() == later
    (folder / EXPORT_MARKER).write_text(json.dumps(marker))
    refused = r"refresh of .* would overwrite report\.md \(changed since diffattn export wrote it\): undo the edit"
    evaluations = later.index("## Evaluations")
    for edited in (  # inside the claims section, and inside the evaluations tables: refresh would overwrite either
        later.replace("Verdicts refreshed by diffattn", "My own verdicts, refreshed by hand"),
        later[:evaluations] + later[evaluations:].replace("|", "¦", 3),
    ):
        (folder / "report.md").write_text(edited)
        with pytest.raises(ValueError, match=refused):
            refresh_report(folder)
        assert (folder / "report.md").read_text() == edited

    def saved_meanwhile(side_by_side):  # the user saves an edit inside the verdicts while the pictures are drawn
        def draw(evals, staged):
            (folder / "report.md").write_text(later.replace("A later verdict.", "MY HAND-WRITTEN VERDICT"))
            return side_by_side(evals, staged)

        return draw

    (folder / "report.md").write_text(later)
    monkeypatch.setattr(report_module, "_side_by_side", saved_meanwhile(report_module._side_by_side))
    with pytest.raises(ValueError, match=refused):
        refresh_report(folder)
    assert "MY HAND-WRITTEN VERDICT" in (folder / "report.md").read_text()
    (folder / EXPORT_MARKER).unlink()
    with pytest.raises(ValueError, match="not an exported report"):
        refresh_report(folder)


def test_the_seed_spread_single_run_reports_quote_is_the_committed_experiments_own():
    """claims.SEED_SPREAD (quoted under every single-run report) is the root mean square, over every arm of the
    experiments SEED_SPREAD_SOURCE names, of each metric's variance over that arm's seeds, at two significant digits:
    re-exporting those experiments without updating the constant fails here."""
    import math
    import statistics

    from diffattn.experiments.claims import SEED_SPREAD, SEED_SPREAD_SOURCE
    from diffattn.experiments.config import ExperimentConfig

    def top1(which):
        return lambda row, ev: statistics.fmean(ev["outliers"]["per_window"][f"{which}_top1"])

    def quant_drop(row, ev):
        nll = {q["bits"]: q["nll"] for q in ev["quant"]["quantization"]}
        return nll[min(nll)] - nll[16]

    columns = {  # SEED_SPREAD's label → the value a single-run row reads, from a model's row and evaluations
        "test NLL/token (ppl suite)": lambda row, ev: ev["ppl"]["nll"],
        "validation loss (75% retrieval mix)": lambda row, ev: row["val_loss"],
        "strict retrieval accuracy": lambda row, ev: row["NIAH strict"],
        "attention to the answer (|a| share)": lambda row, ev: row["|attn|→answer"],
        "attention noise (|a| share)": lambda row, ev: row["|attn| noise"],
        "mean per-window top-1 |attention logit|": top1("attention_logits"),
        "mean per-window top-1 |hidden state|": top1("hidden_states"),
        "NLL increase at the lowest logit width": quant_drop,
    }
    assert set(columns) == set(SEED_SPREAD)
    arms: list[list[tuple[dict, dict]]] = []  # each arm's replicates (row, evaluations), grouped as the claims are
    for folder in re.findall(r"results/([\w-]+)", SEED_SPREAD_SOURCE):
        doc = json.loads((RESULTS / folder / "results.json").read_text())
        rows = {r["model"]: r for r in doc["models"]}
        groups = ExperimentConfig.load(RESULTS / folder / "experiment.yaml").seed_groups()
        arms += [[(rows[name], doc["evaluations"][name]) for name in names] for names in groups.values()]
    assert arms and all(len(replicates) >= 2 for replicates in arms)
    for label, value in columns.items():
        variances = [statistics.variance([value(*r) for r in replicates]) for replicates in arms]
        spread = math.sqrt(statistics.fmean(variances))
        assert f"{SEED_SPREAD[label]:.2g}" == f"{spread:.2g}", (label, spread)
