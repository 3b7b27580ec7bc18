"""What a paper claim can read of a suite's results: a suite's named :class:`Measure` s and what comparing two models
with one gives (:class:`Comparison`), which :mod:`diffattn.experiments.claims` turns into a claim row with a verdict.

A measure gives one run's value (``per_run``: what a comparison over replicate seeds averages) and the comparison
of two runs (``compare``: each model's value with its 95% interval where the results allow one, and the difference
with its interval — paired when both models saw the same samples; docs/evaluation.md §13.2 on the intervals).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..paper_claim import PaperClaim  # noqa: F401  (re-exported: suites' claims are data of their entry)
from .stats import Difference, seeds_items_difference, unpaired_difference

NO_PER_SAMPLE = "none: the results hold no per-sample values (rerun the suite to get them)"
#: the key of a run's row that holds the share of its training rows that were text (not synthetic retrieval or MQAR
#: rows): diffattn.experiments.claims.paper_claims adds it from the experiment's data sections
TEXT_SHARE = "train_text_share"
#: the model-row column of a pretraining run's validation cross-entropy under the training text's token frequencies
#: (diffattn.train.data.unigram_nll): a text loss not below it is no language modelling
UNIGRAM_FLOOR = "val_unigram_nll"
ONE_NUMBER = "none: the suite reports one number"


@dataclass(frozen=True)
class Run:
    """One evaluated model as a measure sees it: its name, its report row (``val_loss``, …) and its suites'
    results by suite name."""

    name: str
    row: dict = field(default_factory=dict)
    suites: dict = field(default_factory=dict)

    def results(self, suite: str, *path):
        """``suites[suite][path[0]][path[1]]…``, or None where any step is missing."""
        node = self.suites.get(suite)
        for key in path:
            if node is None:
                return None
            node = node.get(key) if isinstance(node, dict) else None
        return node


@dataclass
class Comparison:
    """Two runs compared on a measure: the values, their intervals and the difference new − reference (``diff``;
    None: no interval), with what kind of interval it is (``kind``) and notes for the reader. ``ours`` replaces the
    default "ref → new: metric a → b" text; ``ref``/``new`` relabel the two sides (e.g. two cells of one pair);
    ``veto``: why an "agrees" verdict would not be the paper's claim (then it reads "inconclusive"); ``chance``: the
    chance level of what this comparison read, where it differs from the measure's per-run one (e.g. the shot counts
    both runs ran)."""

    metric: str
    ref_value: float | None = None
    ref_ci: object = None
    new_value: float | None = None
    new_ci: object = None
    diff: Difference | None = None
    kind: str = ""
    note: str = ""
    ours: str | None = None
    cells: str = ""
    ref: str | None = None
    new: str | None = None
    veto: str | None = None
    chance: float | None = None


@dataclass(frozen=True)
class Measure:
    """A named result a claim can read. ``metric``: its words in a row over seeds; ``digits``: the precision rows
    print (verdicts are read at it); ``per_run(run) -> value | None``; ``compare(ref, new, seed) -> Comparison |
    None`` (None: the results lack what it needs); ``seeds_veto(ref_runs, new_runs) -> reason | None``: over seeds,
    why an "agrees" would not be the claim; ``at_lambda0(run) -> suites | None``: the model's own results with λ
    forced to 0, where the suite measures them (a claim's ``lambda0`` reference); ``chance(run) -> level | None``:
    what a model without the skill scores on the measure (copying a random needle, guessing a label): a row whose two
    sides both reach down to it cannot test the claim (:func:`diffattn.experiments.claims.check_claim`)."""

    metric: str
    digits: int
    per_run: Callable
    compare: Callable
    seeds_veto: Callable | None = None
    # untestable(runs) -> reason | None: why no verdict either way can be read (e.g. every model at the floor where
    # the claim is decided); unlike ``chance``, for measures whose value is not a score with a floor of its own
    untestable: Callable | None = None
    # seeds_untestable(ref_runs, new_runs) -> reason | None: over seeds only, why the runs' values cannot be compared
    # either way (e.g. each run's value read over other points than the other side's; one pair's ``compare`` reads
    # the points both have)
    seeds_untestable: Callable | None = None
    # seeds_note(ref_runs, new_runs) -> text | None: what a row over seeds adds to its note (the single-run
    # comparison says it in its own note; e.g. where the attention went, averaged over the seeds)
    seeds_note: Callable | None = None
    # seeds_compare(ref_runs, new_runs, seed) -> Comparison | None: over seeds, the comparison where Welch over the
    # runs' values would miss a source of chance every run shares (e.g. the same few orders of the demonstrations);
    # None (or absent): Welch over the runs' ``per_run`` values
    seeds_compare: Callable | None = None
    # per_item(run) -> (identity, values) | None: the run's value on each test item (its mean is ``per_run``'s value)
    # and what names the items (e.g. the text windows' token hash): over seeds, where every run of both sides names
    # the same items, the row counts the items once beside the seeds (stats.seeds_items_difference) instead of Welch
    # over the runs' values, which misses which items were drawn
    per_item: Callable | None = None
    # what the strata of ``per_item``'s runs × strata × draws × items values are called in a row's words (ICL: the
    # shot counts)
    item_strata: str = "strata"
    # over seeds, the measure read instead where every run of both sides has its per-item values on the same items
    # (:func:`over_seeds_measure`; e.g. the validation loss, which keeps no per-window values, reads the ppl suite's
    # per-window NLL on the same tokens, as its single-run comparison does)
    seeds_measure: Measure | None = None
    # metric_for(runs) -> words: a row over seeds' words for these runs, where the results decide what was read
    # (e.g. the cells a grid has); None or absent: ``metric``
    metric_for: Callable | None = None
    at_lambda0: Callable | None = None
    chance: Callable | None = None


def clears_floor(low: float, floor: float, digits: int) -> bool:
    """The one rule every floor test reads (a claim row at chance, a gap or a slope between models at the floor): a
    value clears its floor when the lower end of its 95% interval (or the value, where there is none) is above the
    floor at the digits its row prints; one that the printed precision cannot tell from the floor has not."""
    return round(float(low), digits) > round(float(floor), digits)


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def first(*values):
    """The first value that is not None (e.g. a newer metric, then the one older results have)."""
    return next((v for v in values if v is not None), None)


def interval(ci) -> list[float] | None:
    """A 95% interval as two finite floats, or None."""
    if ci is None:
        return None
    lo, hi = (float(x) for x in ci)
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


def value_text(v: float | None, ci, digits: int) -> str:
    """A value with its interval as a row prints it: ``0.123 [0.100, 0.150]``."""
    if v is None:
        return "–"
    text = f"{v:.{digits}f}"
    ci = interval(ci)
    return f"{text} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else text


def paired_kind(diff: Difference, what: str) -> str:
    """ "<the interval paired_difference used> over the same <n> <what>" (a bootstrap, or t for few pairs)."""
    name = "paired t" if diff.method.startswith("paired t") else "paired bootstrap"
    return f"{name} over the same {diff.n} {what}"


def same_metadata(a: dict | None, b: dict | None, *keys) -> bool:
    """Whether two results' metadata agree on ``keys`` (all present): the sign that their samples are paired."""
    if not a or not b:
        return False
    return all(a.get(k) is not None and a.get(k) == b.get(k) for k in keys)


def shared_items(m: Measure, ref_runs: list[Run], new_runs: list[Run]):
    """Both sides' runs × items tables (runs × strata × draws × items where the measure's items are crossed with
    draws) where every run has the measure's per-item values on the same items (``Measure.per_item``: the same
    identity and shape), else None."""
    if m.per_item is None:
        return None
    per = [m.per_item(r) for r in ref_runs + new_runs]
    if any(p is None for p in per) or len({(p[0], np.shape(p[1])) for p in per}) != 1 or np.size(per[0][1]) < 2:
        return None
    ref, new = per[: len(ref_runs)], per[len(ref_runs) :]
    return np.array([p[1] for p in ref], dtype=float), np.array([p[1] for p in new], dtype=float)


def over_seeds_measure(m: Measure, ref_runs: list[Run], new_runs: list[Run]) -> Measure:
    """The measure a row over seeds reads: ``m.seeds_measure`` where every run of both sides has its per-item values
    on the same items (:func:`shared_items`), else ``m``."""
    alt = m.seeds_measure
    return alt if alt is not None and shared_items(alt, ref_runs, new_runs) is not None else m


def seeds_difference(m: Measure, ref_runs: list[Run], new_runs: list[Run]) -> Difference | None:
    """``new − ref`` of a measure over replicate runs, the interval every row over seeds reads: the test items counted
    once beside the seeds where every run read the same ones (:func:`shared_items`,
    :func:`~diffattn.eval.stats.seeds_items_difference`), else Welch over the runs' values; None with fewer than two
    runs with a value a side. The measure is the one such a row reads (:func:`over_seeds_measure`)."""
    m = over_seeds_measure(m, ref_runs, new_runs)
    items = shared_items(m, ref_runs, new_runs)
    if items is not None:
        return seeds_items_difference(*items, strata_name=m.item_strata)
    rv = [v for v in map(m.per_run, ref_runs) if finite(v)]
    nv = [v for v in map(m.per_run, new_runs) if finite(v)]
    return unpaired_difference(rv, nv, method="welch") if len(rv) >= 2 and len(nv) >= 2 else None
