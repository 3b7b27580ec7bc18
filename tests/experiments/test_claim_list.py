"""Every claim of the four papers is a report row, a measurement made elsewhere or a stated "not testable here"
reason: the claim list (diffattn.experiments.claim_list) is walked against the rows paper_claims makes for an
experiment with every kind of model and every suite, both ways; and every numbered table and figure of the papers
that reports a result is covered by an entry, as docs/paper-tables.md lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diffattn.experiments import ExperimentConfig
from diffattn.experiments.claim_list import (
    PAPER_CLAIM_LIST,
    PAPER_NON_RESULTS,
    PAPER_TABLES_AND_FIGURES,
    PAPERS,
    ClaimEntry,
    measured_elsewhere_markdown,
    not_testable_markdown,
    paper_tables_markdown,
)
from diffattn.experiments.claims import paper_claims

from .conftest import ALL_SUITES

DOC = Path(__file__).resolve().parents[2] / "docs" / "paper-tables.md"


def _evals(measured: dict) -> dict:
    """The same measured results for every model of the walk (which rows are made does not depend on the values)."""
    import copy

    suites = measured.get("suites", measured)
    names = ["baseline", "diff", "diffv2", "dex", "daa", "attn", "difflora", "lora"]
    return {name: copy.deepcopy(suites) for name in names}


def test_every_claim_of_the_papers_is_a_row_or_a_stated_reason(measured):
    config = ExperimentConfig.from_dict(
        {
            "name": "all-claims",
            "data": {"source": "shakespeare", "seq_len": 64},
            "models": [
                {"name": "baseline", "preset": "debug", "attention": "standard"},
                {"name": "diff", "preset": "debug", "attention": "diff"},
                {"name": "diffv2", "preset": "debug", "attention": "diff-v2"},  # the V1 claims "applied to V2"
            ],
            "adapters": [
                {"name": m, "base": "baseline", "method": method}
                for m, method in [
                    ("dex", "dex"),
                    ("daa", "daa"),
                    ("attn", "attn-ft"),
                    ("difflora", "difflora"),
                    ("lora", "lora"),
                ]
            ],
            "eval": {"suites": ALL_SUITES},
        }
    )
    rows = {name: {"val_loss": 3.0 + 0.01 * i} for i, name in enumerate(["baseline", "diff", "diffv2", "dex", "daa",
                                                                         "attn", "difflora", "lora"])}  # fmt: skip
    claims = paper_claims(config, rows, _evals(measured))
    # a DIFF V1 claim read on DIFF V2 is the V1 entry's row with the architecture's label: the entry covers it
    from diffattn.models.architectures import ARCHITECTURES

    applied = f" ({ARCHITECTURES['diff-v2'].claims_label})"
    assert any(c.new == "diffv2" and c.source.endswith(applied) for c in claims), "no row applies DIFF's claims to V2"
    made = {c.source.removesuffix(applied) for c in claims}
    listed = {e.row for e in PAPER_CLAIM_LIST if e.row}
    assert listed - made == set(), "claims in the list that no report row checks"
    assert made - listed == set(), "report rows missing from the claim list"
    reasons = [e for e in PAPER_CLAIM_LIST if e.not_testable]
    assert reasons and all(len(e.not_testable) > 20 for e in reasons)
    assert {e.paper for e in PAPER_CLAIM_LIST} == {"DIFF Transformer", "Dex", "DiffLoRA", "DAA"}
    table = not_testable_markdown({"Dex"})
    assert table[0] == "### Not testable here" and all("DIFF Transformer |" not in line for line in table)
    # the Dex row against λ = 0 compares Dex with its own projection, not with the base
    lam0 = next(c for c in claims if c.source == "Dex Table 2 (vs λ = 0)")
    assert (lam0.ref, lam0.new) == ("dex at λ = 0", "dex") and "paired" in lam0.interval
    cka = next(c for c in claims if c.source == "Dex Fig. 11b")
    assert cka.claimed == "lower" and cka.ref == "baseline"


def test_a_claim_entry_is_a_row_or_a_reason_not_both_nor_neither():
    with pytest.raises(ValueError, match="either a report row or not testable"):
        ClaimEntry("Dex", "x")
    with pytest.raises(ValueError, match="either a report row or not testable"):
        ClaimEntry("Dex", "x", row="Dex Table 2", not_testable="because")
    with pytest.raises(ValueError, match="exactly one of row, not_testable, measured_in"):
        ClaimEntry("Dex", "x", not_testable="because", measured_in="benchmarks/RESULTS.md")
    with pytest.raises(TypeError, match="refs is a tuple"):
        ClaimEntry("Dex", "x", row="Dex Table 2", refs="Table 2")  # a string, not ("Table 2",)
    assert ClaimEntry("Dex", "x", measured_in="benchmarks/RESULTS.md", refs=("Fig. 12",)).measured_in


def test_every_table_and_figure_of_the_papers_is_covered_by_a_claim_entry():
    """Every numbered table and figure that reports a result is named by some entry's refs; every ref names one of
    them (of the entry's own paper); the diagrams and configuration tables are listed apart, never as a ref."""
    results = {(i.paper, i.item) for i in PAPER_TABLES_AND_FIGURES}
    apart = {(i.paper, i.item) for i in PAPER_NON_RESULTS}
    assert len(results) == len(PAPER_TABLES_AND_FIGURES) and len(apart) == len(PAPER_NON_RESULTS), "listed twice"
    assert not results & apart, "an item is both a result and not one"
    assert {i.paper for i in PAPER_TABLES_AND_FIGURES} == set(PAPERS)
    for i in (*PAPER_TABLES_AND_FIGURES, *PAPER_NON_RESULTS):
        assert re.fullmatch(r"(Table|Fig\.) \d+|App\. [A-Z]", i.item), i.item
        assert i.shows and "\n" not in i.shows
    refs = {(e.paper, r) for e in PAPER_CLAIM_LIST for r in e.refs}
    assert all(e.refs for e in PAPER_CLAIM_LIST), [e.claim for e in PAPER_CLAIM_LIST if not e.refs]
    assert refs - results == set(), "refs that name no table or figure of the entry's paper (or a non-result)"
    assert results - refs == set(), "tables and figures no claim entry covers"
    # every entry states its row, its reason or where it is measured
    for e in PAPER_CLAIM_LIST:
        assert len(e.row or e.not_testable or e.measured_in) > 10, e.claim


def test_measured_claims_are_printed_after_the_not_testable_ones():
    measured = [e for e in PAPER_CLAIM_LIST if e.measured_in]
    assert {e.paper for e in measured} >= {"DIFF Transformer", "DAA"}  # Table 7's throughput, DAA's Table 4 FLOPs
    table = not_testable_markdown({"DIFF Transformer"})
    assert table[0] == "### Not testable here" and "### Measured elsewhere" in table
    assert table[table.index("### Measured elsewhere") :] == measured_elsewhere_markdown({"DIFF Transformer"})
    assert any("benchmarks/gpu-runs/h100-2026-11-26/README.md" in line for line in table)
    cells = [line for line in not_testable_markdown() if line.startswith("| ")]
    assert all(line.replace("\\|", "").count("|") == 4 for line in cells), "a | in a cell splits the table"


def test_docs_paper_tables_lists_every_table_and_figure():
    """docs/paper-tables.md names every item of both lists under its paper and no other, and is the generator's
    output (`python -m diffattn.experiments.claim_list > docs/paper-tables.md` rewrites it)."""
    doc = DOC.read_text()
    sections = dict(re.findall(r"^## (.+)\n((?:(?!^## ).*\n?)*)", doc, flags=re.M))
    for i in PAPER_TABLES_AND_FIGURES:
        assert f"\n| {i.item} | " in sections[i.paper], f"{i.paper} {i.item} missing from {DOC.name}"
    listed = {(paper, item) for paper in PAPERS for item in re.findall(r"^\| ([^|]+?) \| ", sections[paper], re.M)}
    listed -= {(paper, "item") for paper in PAPERS}  # the header rows
    assert listed == {(i.paper, i.item) for i in PAPER_TABLES_AND_FIGURES}
    for i in PAPER_NON_RESULTS:
        assert f"- {i.paper} {i.item}: " in sections["Not results"], f"{i.paper} {i.item} missing from {DOC.name}"
    assert doc == paper_tables_markdown(), f"{DOC} is stale: python -m diffattn.experiments.claim_list > {DOC}"
