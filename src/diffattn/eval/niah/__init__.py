"""Multi-needle retrieval (DIFF Transformer §3.4, Table 2, Fig. 5; Dex §4.2; docs/evaluation.md §5).

Samples come from the seeded generator :func:`diffattn.data.make_needle_sample` (needle ``"The special magic {key}
number is: {7-digit number}."``, city keys, sentence-boundary insertion, the first queried needle at the requested
depth, the others and the N − R distractors at random depths). The model answers by greedy decoding; the score is
RULER's ``string_match_all`` (the fraction of queried numbers found in the output).

Two protocols:

* the (N, R) grid at one context length — default :data:`GRID`: R = 1 at N = 1, 2, 4, 6, 8 (so that N is the only
  thing that changes between cells: every cell is scored the same way, one queried needle, solved or not; N = 8 is
  Dex's cell), plus DIFF Table 2's own cells N = 2, 4, 6 with R = 2 (:data:`TABLE2_CELLS`; its N = 1, R = 1 cell is
  the first R = 1 cell); with the default grid, cells that do not fit the context are left out
  (``metadata["cells_left_out"]``), an explicit grid must fit whole; sample i of a cell puts its first queried
  needle at depth 0, 25, 50, 75, 100% in turn (:func:`.sampling.depths_in_turn`, each row's ``depths``: the
  protocol's five depths, docs/evaluation.md §5, Dex §4.2's; ``placed_depths``: where the needles went, a short
  haystack's sentence starts moving them; the report's table by depth, :func:`.tables.depth_table`, reads them with
  each row's per-prompt floors, ``heuristics_solved``), ``niah_grid_placement: random`` at a uniform random
  depth (every result before results version 10);
* the N = 8, R = 1 heatmap over context lengths × depths {0, 25, 50, 75, 100}% (DIFF Fig. 5); by default at 1/2,
  3/4 and all of the context where its needles fit (``metadata["heatmap_lengths_left_out"]`` names the others);
* optionally one multi-value cell (RULER's niah_multivalue, DiffLoRA Fig. 3 "MV"): one key with V values among N
  needles (the N − V others distractors with keys of their own), the question asking for all V; scored like a
  grid cell with V queried numbers (per-needle credit, solved = all V among the first V numbers; chance V/N and
  1/C(N, V)), kept apart from the grid (``"multivalue"``) so that the R = 1 cells stay like for like.

Per cell: ``accuracy`` (RULER string_match_all), ``strict_accuracy`` (per-needle credit: the queried numbers among the
first R numbers of the output), ``solved`` (prompts whose every queried needle is among the first R numbers; at
R = 1 the same as the strict score) and its floor: what the best heuristic that ignores the question scores on the
cell's own prompts (:mod:`diffattn.eval.needle_floors`; ``floor`` per needle, ``floor_solved`` prompts solved, each
heuristic's scores in ``heuristics``), which the tables, pictures and claims draw. ``chance`` = R/N and
``chance_solved`` = 1/C(N, R) (:func:`needle_chance`: writing R needles' numbers at random) stay for reference.
``r1_solved`` is the mean of ``solved`` over the R = 1 cells (``r1_cells`` names them).

Choices the papers leave open, stated in the metadata: the haystack (Shakespeare's test plays by default, or
RULER's filler), how a token length is met (a character window of the haystack, shrunk until the tokenized prompt
plus the answer fits), the number of new tokens (the answer's length + 4), and samples per cell (paper: 50; Dex:
20; default here 10 — raise it for real runs).

Uncertainty: every grid row and heatmap cell keeps its per-sample scores (``"scores"``) and a Wilson 95% interval
(``"ci"``; fractional scores of R > 1 count as partial successes); ``mean_accuracy_ci`` is Wilson's interval on the
pooled grid samples (every cell has the same number of samples, so the pooled mean is ``mean_accuracy``; Wilson
stays honest at 0 and 1, where a bootstrap of all-equal scores collapses to a point). Pairing: sample ``i`` of a
cell uses a seed drawn from ``seed``, the cell's name and ``i`` (:func:`.sampling.cell_seeds`), so two models
evaluated with the same options see the same samples — the same prompts where their tokenizers fit the same text into
the context, which ``metadata["samples_sha1"]`` (a fingerprint of every prompt) confirms — and paired comparisons of
their scores are valid; no two cells share a prompt's keys, numbers or depths.

A package, one concern per module: :mod:`.sampling` (prompts, scoring, run_niah), :mod:`.options` (the suite's
options, their checks, the protocol line), :mod:`.plots`, :mod:`.tables` (``compare``) and :mod:`.claims` (the cells
each claim row reads, their floors and comparisons); the heuristic floors are :mod:`diffattn.eval.needle_floors`.
"""

from __future__ import annotations

from ..common import Suite
from .claims import CLAIMS, MEASURES, cell_floor, pooled_floor, r1_chance, r1_solved
from .options import NiahOptions, _check, _preflight, check_needle_cells, needle_protocol, parse_grid, parse_multivalue
from .plots import plot_niah, plot_niah_grid_all, plot_niah_heatmaps_all
from .sampling import (
    DEPTHS,
    GRID,
    GRID_PLACEMENTS,
    TABLE2_CELLS,
    depths_in_turn,
    fit_sample,
    greedy_answer,
    needle_chance,
    run_niah,
)
from .tables import compare

__all__ = [
    "CLAIMS",
    "DEPTHS",
    "GRID",
    "GRID_PLACEMENTS",
    "LAMBDA0_REFERENCE",
    "MEASURES",
    "SUITE",
    "TABLE2_CELLS",
    "NiahOptions",
    "cell_floor",
    "check_needle_cells",
    "compare",
    "depths_in_turn",
    "fit_sample",
    "greedy_answer",
    "needle_chance",
    "needle_protocol",
    "parse_grid",
    "parse_multivalue",
    "plot_niah",
    "plot_niah_grid_all",
    "plot_niah_heatmaps_all",
    "pooled_floor",
    "r1_chance",
    "r1_solved",
    "run_niah",
]
LAMBDA0_REFERENCE = (
    "the same model's grid and multi-value cell with λ forced to 0 (adapters.base.forced_lambda): its trained "
    "weights without the λ term, on the same prompts (no heatmap)"
)


def _run_suite(model, tokenizer, o, folder, name):
    from ...adapters.base import forced_lambda, supports_forced_lambda

    options = dict(
        grid=o.niah_grid,
        grid_placement=o.niah_grid_placement,
        heatmap_needles=o.niah_needles,
        heatmap_samples=o.niah_heatmap_samples,
        multivalue=tuple(o.niah_multivalue) if o.niah_multivalue is not None else None,
        **o.needle_prompts(),
    )
    r = run_niah(model, tokenizer, heatmap_lengths=o.niah_heatmap_lengths, **options)
    if supports_forced_lambda(model):  # Dex: its own weights at λ = 0, what its λ term is compared with
        with forced_lambda(model, 0.0):
            own = run_niah(model, tokenizer, heatmap_lengths=[], **options)
        r["lambda0_reference"] = {
            **{k: own[k] for k in ("grid", "multivalue", "mean_accuracy", "mean_strict_accuracy", "r1_solved")},
            "metadata": {"what": LAMBDA0_REFERENCE},
        }
        r["metadata"]["lambda0_reference"] = LAMBDA0_REFERENCE
    # named by what it shows: the grid alone where no heatmap was asked for (niah_heatmap_lengths: [])
    picture = "niah_heatmap.png" if r["heatmap"]["lengths"] else "niah_grid.png"
    return r, {"niah": plot_niah(r, folder / picture).name}


SUITE = Suite(
    "niah",
    _run_suite,
    headline=lambda r: {
        "NIAH acc": r["mean_accuracy"],
        "NIAH strict": r.get("mean_strict_accuracy"),
        "NIAH R=1 solved": r.get("r1_solved"),
    },
    compare=compare,
    options=NiahOptions,
    check=_check,
    preflight=_preflight,
    protocol=needle_protocol,
    measures=MEASURES,
    claims=CLAIMS,
)
