"""What the icl suite's claim rows read: accuracy averaged over the shot counts and the order margins (DIFF Fig. 6-7,
Dex Table 3)."""

from __future__ import annotations

import json
from functools import partial

import numpy as np

from ..measures import ONE_NUMBER, Comparison, Measure, PaperClaim, Run, clears_floor, finite, paired_kind
from ..stats import (
    crossed_paired_difference,
    paired_difference,
    rows_variance,
    rows_variance_difference,
    t_interval,
    unpaired_difference,
)

# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------

SHOT_COUNTS = "shot counts"  # the strata of the many-shot curve's per-item hits, in rows' words


def _mean_at(m: dict, key: str, shots) -> float:
    """The mean of results ``m``'s per-shot-count list ``key`` over ``shots``, each shot count alike."""
    return float(np.mean([m[key][m["shots"].index(k)] for k in shots]))


def _curve_mean(m: dict | None) -> float | None:
    """The mean accuracy over the curve's shot counts, each shot count's mean over its draws weighted alike: what
    DIFF Fig. 6's "average accuracy improvement" averages."""
    return _mean_at(m, "mean", m["shots"]) if m and m.get("mean") else None


def _shots_words(shots) -> str:
    return f"{len(shots)} shot counts ({shots[0]} to {shots[-1]})" if len(shots) > 1 else f"{shots[0]} shots"


def _compare_shots(ref: Run, new: Run, seed: int) -> Comparison | None:
    """DIFF Fig. 6: many-shot accuracy averaged over the curve — the shot counts both models ran, alike — paired
    over the same draws (the same demonstrations and test items): a two-way t over shot counts × draws × test items
    where the results keep each item's hit (:func:`~diffattn.eval.stats.crossed_paired_difference`: each shot
    count's own draws, the same items in all), else over the draws' curve averages; chance is the measure's
    (:func:`_chance`)."""
    mr, mn = ref.results("icl", "many_shot"), new.results("icl", "many_shot")
    if not mr or not mn:
        return None
    shots = sorted(set(mr["shots"]) & set(mn["shots"]))
    if not shots:
        return None
    ar = np.array([mr["accuracy"][mr["shots"].index(k)] for k in shots])  # shot counts × draws
    an = np.array([mn["accuracy"][mn["shots"].index(k)] for k in shots])
    # each draw index's accuracy averaged over the curve: draw d of every shot count is seeded by (seed, shots, d),
    # so the same index is the same demonstrations in both models where their draws are the same
    cr, cn = ar.mean(axis=0), an.mean(axis=0)
    paired = ar.shape == an.shape and same_draws(mr, mn)
    hr, hn = _item_hits(mr, shots), _item_hits(mn, shots)
    if paired and hr is not None and hn is not None and np.shape(hr) == np.shape(hn):
        # the same draws scored on the same test items: both are chance draws (a t over the draws alone took the
        # test set as fixed, and 30-40 items carry a standard error of about 0.08 of their own)
        diff = crossed_paired_difference(hr, hn, strata_name=SHOT_COUNTS)
        kind = diff.method
    elif paired:
        diff = paired_difference(cr, cn, seed=seed)
        kind = paired_kind(diff, "draws of demonstrations") + " (results without per-item hits: the items as fixed)"
    else:
        diff, kind = unpaired_difference(cr, cn), "Welch t over draws (not the same draws)"
    note = (f"data uncertainty only; mean over {_shots_words(shots)}, {ar.shape[1]} draws each; "
            f"{_chance_words(mr, shots)}")  # fmt: skip
    if hr is not None and hn is not None:  # each model's curve mean with the items' spread too, as the difference has
        (rv, rci), (nv, nci) = ((d.estimate, d.interval) for d in (_crossed_mean(hr), _crossed_mean(hn)))
    else:  # each model's curve mean over the draws, t interval
        (rv, rci), (nv, nci) = t_interval(cr), t_interval(cn)
    return Comparison(
        _metric(shots), ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff, kind=kind, note=note,
        cells=_shots_words(shots), chance=max(_floor_over(mr, shots), _floor_over(mn, shots)),
    )  # fmt: skip


def _crossed_mean(hits):
    """One model's accuracy over shot counts × draws × items, with the crossed interval of
    :func:`~diffattn.eval.stats.crossed_paired_difference` (against zeros: the mean itself)."""
    return crossed_paired_difference(np.zeros(np.shape(hits)), hits, strata_name=SHOT_COUNTS)


def _metric(shots) -> str:
    return "accuracy (mean over the shot counts)" if len(shots) > 1 else f"accuracy at {shots[0]} shots"


def _item_hits(m: dict, shots) -> list | None:
    """Results ``m``'s hits at ``shots``: shot counts × draws × test items (None for results from before they were
    kept)."""
    hits = m.get("hits")
    return None if not hits else [hits[m["shots"].index(k)] for k in shots]


def _grids(runs: list[Run]) -> set[tuple]:
    return {tuple(m["shots"]) for m in (run.results("icl", "many_shot") for run in runs) if m and m.get("shots")}


def _shot_grids_differ(ref_runs: list[Run], new_runs: list[Run]) -> str | None:
    """Over seeds each run's value is the mean over its own curve: runs that ran other shot counts (another tokenizer
    or context) average other points, so no verdict compares like with like (one pair of runs compares the shot
    counts both ran)."""
    grids = _grids(ref_runs + new_runs)
    return f"the runs' shot counts differ ({' vs '.join(map(str, sorted(grids)))})" if len(grids) > 1 else None


def _seeds_metric(runs: list[Run]) -> str:
    grids = _grids(runs)
    return _metric(list(grids.pop())) if len(grids) == 1 else "accuracy (mean over each run's own shot counts)"


#: what two runs' metadata must share for their draws to be the same demonstrations and test items: the data, its
#: split and the seeds of the draws
SAME_DATA = ("dataset", "dataset_options", "seed", "test_size", "labels", "demo_pool_size", "draws")


def same_draws(mr: dict, mn: dict) -> bool:
    """Whether two many-shot results drew the same demonstrations and test items, so that their draws pair: the same
    data and seeds (:data:`SAME_DATA`), and the same draws kept — a draw that overflows the context is redrawn, which
    depends on the tokenizer: neither run redrew, or both redrew as often with the same label tokens and the same
    longest prompt (one tokenizer)."""
    a, b = mr.get("metadata") or {}, mn.get("metadata") or {}
    if any(a.get(key) != b.get(key) for key in SAME_DATA):
        return False
    if a.get("redraws") == 0 and b.get("redraws") == 0:
        return True
    return all(a.get(key) == b.get(key) for key in ("redraws", "label_tokens", "end_token", "max_prompt_tokens"))


def _draws_identity(m: dict) -> str:
    """What names a many-shot result's draws and test items: two results with the same string paired
    (:func:`same_draws`)."""
    meta = m.get("metadata") or {}
    keys = SAME_DATA if meta.get("redraws") == 0 else (*SAME_DATA, "redraws", "label_tokens", "end_token",
                                                           "max_prompt_tokens")  # fmt: skip
    return json.dumps({key: meta.get(key) for key in keys}, sort_keys=True, default=str)


def _curve_items(run: Run):
    """(what names the draws, test items and shot counts; every item's hit after every draw at every shot count, a
    shot counts × draws × items array whose mean is the run's :func:`_curve_mean`): what a row over seeds counts once
    beside the seeds (``Measure.per_item``, the draws crossed with the items); None for results without per-item
    hits or with draws of unequal size."""
    m = run.results("icl", "many_shot")
    hits = _item_hits(m, m["shots"]) if m and m.get("mean") else None
    if not hits:
        return None
    try:
        table = np.asarray(hits, dtype=float)
    except ValueError:  # ragged: draws of unequal size
        return None
    if table.ndim != 3:
        return None
    return (_draws_identity(m), tuple(m["shots"]), table.shape), table


def _chance(run: Run) -> float | None:
    """The accuracy a model without the skill reaches over the curve: the best heuristic's at each shot count,
    simulated on the run's own draws (:data:`~diffattn.eval.icl.many_shot.HEURISTICS`: a constant label, the
    demonstrations' majority, the last demonstration's), averaged as the accuracy is; 1 / labels for results from
    before 2026-12-01, which did not simulate it (too low where the test set's labels are unbalanced)."""
    m = run.results("icl", "many_shot")
    return _floor_over(m, m["shots"]) if m and (m.get("floor") or m.get("labels")) else None


def _floor_over(m: dict, shots) -> float:
    """The chance level of results ``m`` over ``shots``: the simulated floor averaged over them, else 1 / labels."""
    if m.get("floor"):
        return _mean_at(m, "floor", shots)
    return 1 / (len(m.get("labels") or []) or 1)


def _chance_words(m: dict, shots) -> str:
    """The chance level of results ``m`` over ``shots``, with where it comes from."""
    labels = len(m.get("labels") or []) or 1
    if not m.get("floor"):
        return f"chance {1 / labels:.2f} (1 / {labels} labels; no simulated floor in these results)"
    at = [m["shots"].index(k) for k in shots]
    floor = _floor_over(m, shots)
    best = {max(m["heuristics"], key=lambda h: m["heuristics"][h][i]) for i in at}
    which = f", {best.pop()}" if len(best) == 1 else " at each shot count"
    return f"chance {floor:.2f} (the best heuristic{which}; 1 / {labels} labels = {1 / labels:.2f})"


def _margin(run: Run, arrangement: str = "random") -> float | None:
    return run.results("icl", "order_robustness", "arrangements", arrangement, "margin")


def _compare_margin(ref: Run, new: Run, seed: int, arrangement: str = "random") -> Comparison | None:
    """DIFF Fig. 7: an arrangement's order margin, best − worst accuracy over the permutations: one number per run, no
    interval. The order results keep each permutation's item hits, but a range of noisy per-permutation accuracies is
    inflated by the items' noise, the more the nearer its accuracy is to 0.5, and a bootstrap over the items repeats
    that bias instead of correcting it (a review of 2026-12-01 simulated 10 permutations of 30 items: the bootstrap
    interval held the true range in 17% of draws, and called the more accurate of two order-insensitive models the
    more robust in 15%, not 2.5%). Rows over seeds compare the runs' margins. The order-variance row
    (:func:`_compare_order_variance`) reads the same hits without that bias."""
    mr, mn = _margin(ref, arrangement), _margin(new, arrangement)
    if mr is None or mn is None:
        return None
    beside = "" if _order_hits(ref, arrangement) is None or _order_hits(new, arrangement) is None else (
        "; the order-variance row reads the same orders without the items' noise"
    )  # fmt: skip
    return Comparison(
        order_margin_words(arrangement), ref_value=mr, new_value=mn,
        kind=ONE_NUMBER + f" (best − worst over permutations; a bootstrap over the items would be biased{beside})",
        note=_accuracies_beside([ref], [new], arrangement=arrangement) or "",
    )  # fmt: skip


def _accuracies_beside(
    ref_runs: list[Run], new_runs: list[Run], why: bool = True, arrangement: str = "random"
) -> str | None:
    """The two sides' mean accuracy over an arrangement's permutations, which a margin is read beside: the items' noise
    alone widens a best − worst range, the more the nearer the accuracy is to 0.5 (``why``: say so)."""
    means = [
        [
            m
            for m in (r.results("icl", "order_robustness", "arrangements", arrangement, "mean") for r in runs)
            if finite(m)
        ]
        for runs in (ref_runs, new_runs)
    ]
    if not all(means):
        return None
    text = f"mean accuracy over the permutations {np.mean(means[0]):.3f} → {np.mean(means[1]):.3f}"
    return text + " (the items' noise alone widens a margin, the more the nearer the accuracy is to 0.5)" * why


#: an order variance in points² (accuracy in points, 0-100): the squares of accuracies in [0, 1] are too small to read
POINTS2 = 1e4


#: the fewest orders an order-variance row reads: with 2 its interval held the truth in 90% of simulated draws, with 3
#: in 98% (benchmarks/order_variance_simulation.py)
MIN_ORDERS = 3


def _order_hits(run: Run, arrangement: str = "random") -> np.ndarray | None:
    """The permutations × test items table of 0/1 hits of an arrangement (None for results from before they were
    kept, or with fewer than :data:`MIN_ORDERS` orders or two items)."""
    hits = run.results("icl", "order_robustness", "arrangements", arrangement, "hits")
    table = None if not hits else np.asarray(hits, dtype=float)
    ok = table is not None and table.ndim == 2 and table.shape[0] >= MIN_ORDERS and table.shape[1] >= 2
    return table if ok else None


def _order_variance(run: Run, arrangement: str = "random") -> float | None:
    """The variance of an arrangement's orders' true accuracies with the test items' noise removed, in points²
    (:func:`~diffattn.eval.stats.rows_variance`: unbiased, so negative where the orders vary less than the items'
    noise alone would make them)."""
    table = _order_hits(run, arrangement)
    return None if table is None else rows_variance(table)[0] * POINTS2


def _logit_scale(table: np.ndarray, variance: float) -> str:
    """The table's order variance (:func:`rows_variance`'s estimate) divided by the items' mean p(1 − p), squared
    (each item's p its mean over the orders): about the variance of the orders' effect on the logit scale, where an
    accuracy near 0 or 1 no longer shrinks it."""
    slope = float(np.mean(table.mean(axis=0) * (1 - table.mean(axis=0))))
    return "–" if slope == 0 else f"{variance / slope**2:.3f}"


def _variance_row(hr: np.ndarray, hn: np.ndarray, metric: str, extra: list[str]) -> Comparison:
    """The order-variance comparison of two tables (one run's, or each side's mean over its seeds)."""
    (rv, rci), (nv, nci) = rows_variance(hr), rows_variance(hn)
    diff = rows_variance_difference(hr, hn, rows_name="orders")
    scale = lambda ci: tuple(v * POINTS2 for v in ci)  # noqa: E731
    diff = diff._replace(estimate=diff.estimate * POINTS2, interval=scale(diff.interval))
    logit = "on the logit scale (÷ the items' mean p(1 − p), squared) about "
    logit += f"{_logit_scale(hr, rv)} → {_logit_scale(hn, nv)}"
    note = "; ".join(t for t in (ORDER_VARIANCE_WORDS, *extra, logit) if t)
    return Comparison(
        metric, ref_value=rv * POINTS2, ref_ci=scale(rci), new_value=nv * POINTS2, new_ci=scale(nci), diff=diff,
        kind=diff.method, note=note,
    )  # fmt: skip


def _compare_order_variance(ref: Run, new: Run, seed: int, arrangement: str = "random") -> Comparison | None:
    """DIFF Fig. 7's robustness to order without the items' noise its margin carries: the variance of the accuracies
    the random orders would have on the whole item population, each model's from its permutations × items hits (two-way
    ANOVA: the orders' mean square less the order × item residual's), compared with the modified large-sample
    interval (:func:`~diffattn.eval.stats.rows_variance_difference`). It is on the accuracy scale, as the paper's
    margin: a model near 0 or 1 accuracy has less room to vary with the same sensitivity (logistic order sd 0.5 at
    accuracy 0.50 against 0.96: "agrees" in 40% of draws of 10 × 30, 82% of 10 × 100;
    ``benchmarks/order_variance_simulation.py``), so the note gives the
    accuracies and the logit-scale variance beside it. The margins go in the note too."""
    hr, hn = _order_hits(ref, arrangement), _order_hits(new, arrangement)
    if hr is None or hn is None:
        return None
    mr, mn = _margin(ref, arrangement), _margin(new, arrangement)
    margins = f"margins {mr:.3f} → {mn:.3f}" if finite(mr) and finite(mn) else ""
    beside = _accuracies_beside([ref], [new], why=False, arrangement=arrangement) or ""
    return _variance_row(hr, hn, order_variance_words(arrangement), [margins, beside])


#: what runs' order results must share for their orders and test items to be the same
SAME_ORDERS = ("dataset", "dataset_options", "seed", "test_size", "labels", "rounds", "permutation_seeds")


def _seeds_order_variance(
    ref_runs: list[Run], new_runs: list[Run], seed: int, arrangement: str = "random"
) -> Comparison | None:
    """Over seeds: every run is scored on the same few orders (the evaluation's seed, not the training's) and the same
    items, so Welch over the runs' variances misses their sampling — simulated, 3 vs 3 seeds sharing each order's
    effect: 15% false verdicts on each side. Each side's hits are averaged over its seeds and the two mean tables
    compared as one run's are: 1.2-2.6% false verdicts a side, 95-97% coverage, and more power
    (``benchmarks/order_variance_simulation.py``: 3 vs 3 seeds of 10 orders × 100 items).
    What it reads is the order variance of the seeds' mean accuracy. Runs on other orders: None (Welch)."""
    runs = ref_runs + new_runs
    tables = [_order_hits(run, arrangement) for run in runs]
    metas = [(run.results("icl", "order_robustness", "metadata") or {}) for run in runs]
    if any(t is None for t in tables) or len({t.shape for t in tables}) > 1 or not metas[0].get("permutation_seeds"):
        return None
    if any(m.get(key) != metas[0].get(key) for m in metas for key in SAME_ORDERS):
        return None
    hr, hn = np.mean(tables[: len(ref_runs)], axis=0), np.mean(tables[len(ref_runs) :], axis=0)
    orders = f"the {len(ref_runs)} vs {len(new_runs)} seeds' mean hits on the same {hr.shape[0]} orders and items"
    return _variance_row(hr, hn, f"{order_variance_words(arrangement)} of {orders}", [])


#: each arrangement of the demonstrations (icl.order.ARRANGEMENTS) in a row's words: DIFF Fig. 7 reads both
ARRANGEMENT_WORDS = {"random": "random", "by_class": "by class"}


def order_variance_words(arrangement: str = "random") -> str:
    return f"order variance ({ARRANGEMENT_WORDS[arrangement]}; points², the items' noise removed)"


def order_margin_words(arrangement: str = "random") -> str:
    return f"order margin ({ARRANGEMENT_WORDS[arrangement]})"


ORDER_VARIANCE = order_variance_words()
ORDER_VARIANCE_WORDS = (
    "the variance over orders of the accuracy each order would have on the whole item population, less the test "
    "items' noise (unbiased: negative where the orders vary less than that noise alone would make them); on the "
    "accuracy scale, as the paper's margin, so an accuracy near 0 or 1 leaves less room to vary"
)


def _order_floor(order: dict) -> float | None:
    """What a model that ignores the demonstrations scores on the order suite's test set: the most frequent label's
    share (a constant label; results from before test_label_counts were recorded: 1 / labels)."""
    meta = order.get("metadata") or {}
    counts = meta.get("test_label_counts")
    if counts and sum(counts.values()):
        return max(counts.values()) / sum(counts.values())
    labels = order.get("labels") or meta.get("labels")
    return 1 / len(labels) if labels else None


def _at_floor(what: str, arrangement: str = "random"):
    """A measure's ``untestable``: a model at the floor has ``what`` (its margin, its order variance) near 0 because it
    ignores the demonstrations (:func:`_margin_at_floor`)."""
    return lambda runs: _margin_at_floor(runs, what, arrangement)


def _margin_at_floor(runs: list[Run], what: str = "margin", arrangement: str = "random") -> str | None:
    """A model at the floor (its mean accuracy over the arrangement's permutations does not clear a constant
    label's) has a margin near 0 because it ignores the demonstrations, not because it is robust to their order: a row
    with one cannot test the claim, whichever side it is on."""
    for run in runs:
        order = run.results("icl", "order_robustness")
        arranged = ((order or {}).get("arrangements") or {}).get(arrangement)
        floor = None if not order else _order_floor(order)
        if arranged is None or floor is None:
            continue
        if not clears_floor(arranged["mean"], floor, 3):
            return (
                f"{run.name} is at the floor over the permutations (mean accuracy {arranged['mean']:.3f}, a constant "
                f"label scores {floor:.3f}): its {what} is that of ignoring the demonstrations"
            )
    return None


def _order_measures(arrangement: str) -> dict[str, Measure]:
    """The order margin and order variance rows of one arrangement (``icl:order_margin``, ``icl:order_variance`` for
    the random orders; ``…_by_class`` for the class-alternating ones)."""
    suffix = "" if arrangement == "random" else f"_{arrangement}"
    return {
        f"icl:order_margin{suffix}": Measure(
            order_margin_words(arrangement), 3, per_run=partial(_margin, arrangement=arrangement),
            compare=partial(_compare_margin, arrangement=arrangement), untestable=_at_floor("margin", arrangement),
            seeds_note=partial(_accuracies_beside, arrangement=arrangement),
        ),
        f"icl:order_variance{suffix}": Measure(
            order_variance_words(arrangement), 1, per_run=partial(_order_variance, arrangement=arrangement),
            compare=partial(_compare_order_variance, arrangement=arrangement),
            untestable=_at_floor("order variance", arrangement),
            seeds_note=partial(_accuracies_beside, why=False, arrangement=arrangement),
            seeds_compare=partial(_seeds_order_variance, arrangement=arrangement),
        ),
    }  # fmt: skip


MEASURES = {
    "icl:many_shot": Measure(
        "accuracy (mean over the shot counts)", 3, per_run=lambda run: _curve_mean(run.results("icl", "many_shot")),
        compare=_compare_shots, chance=_chance, seeds_untestable=_shot_grids_differ, metric_for=_seeds_metric,
        per_item=_curve_items, item_strata=SHOT_COUNTS,
    ),
    **{name: m for arrangement in ARRANGEMENT_WORDS for name, m in _order_measures(arrangement).items()},
}  # fmt: skip

# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 6", "better many-shot in-context learning",
        "+5.2 to +21.6 points (+0.052 to +0.216 as fractions), averaged over 1 shot to 64K-token prompts",
        "icl:many_shot", "higher", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
        "TREC margin 19.0 vs 4.0 points (0.190 vs 0.040 as fractions; random order)", "icl:order_margin", "lower",
        "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
        "TREC margin 19.0 vs 4.0 points over 10 random orders: an order variance of at most about 38 vs 1.7 points² "
        "(10 normal draws span 3.08 standard deviations on average; the margins carry the items' noise too)",
        "icl:order_variance", "lower", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations, arranged by class",
        "TREC margin 56.7 vs 13.4 points (0.567 vs 0.134 as fractions; demonstrations alternating by class)",
        "icl:order_margin_by_class", "lower", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations, arranged by class",
        "TREC margin 56.7 vs 13.4 points over 10 class-alternating orders: an order variance of at most about 339 vs "
        "19 points² (10 normal draws span 3.08 standard deviations on average)",
        "icl:order_variance_by_class", "lower", "baseline",
    ),
)  # fmt: skip
