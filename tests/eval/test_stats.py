"""The shared statistics (diffattn.eval.stats) on known values, and the verdict logic on synthetic numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from diffattn.eval.stats import (
    WELCH_EXACTLY,
    bootstrap_contrast,
    bootstrap_mean,
    mean_se,
    paired_difference,
    rows_variance,
    rows_variance_difference,
    seeds_items_difference,
    seeds_items_mean,
    t_interval,
    t_quantile,
    unpaired_difference,
    verdict,
    wilson_interval,
)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0, 50)
    assert lo == 0 and hi == pytest.approx(1.96**2 / (50 + 1.96**2))  # 0.0714: not empty at 0/n
    lo, hi = wilson_interval(25, 50)
    assert (lo, hi) == pytest.approx((0.3664, 0.6336), abs=1e-4)
    lo, hi = wilson_interval(50, 50)
    assert hi == 1 and lo == pytest.approx(1 - 1.96**2 / (50 + 1.96**2))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_mean_se_and_t_quantiles():
    m, se = mean_se([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert math.isnan(mean_se([5.0])[1])
    for df, want in ((1, 12.7062), (2, 4.3027), (10, 2.2281), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=1e-4)
    m, (lo, hi) = t_interval([1.0, 3.0])
    assert m == 2 and hi - m == m - lo == pytest.approx(12.7062, abs=1e-3)  # two seeds: very wide, honestly


def test_paired_bootstrap_is_deterministic_and_covers_the_mean():
    rng = np.random.default_rng(1)
    ref = rng.normal(0.0, 1.0, 60)
    new = ref + 0.5 + rng.normal(0.0, 0.1, 60)
    a = paired_difference(ref, new, seed=3)
    b = paired_difference(ref, new, seed=3)
    assert a == b and a.n == 60 and "paired" in a.method
    assert a.estimate == pytest.approx(float(np.mean(new - ref)))
    assert a.interval[0] < a.estimate < a.interval[1] and a.interval[0] > 0.4
    assert paired_difference(ref, new, seed=4).interval != a.interval  # another seed, another resample
    normal = paired_difference(ref, new, method="normal")
    assert normal.interval == pytest.approx(a.interval, abs=0.02)
    with pytest.raises(ValueError, match="paired samples must match"):
        paired_difference([1, 2], [1, 2, 3])


def test_weighted_and_stratified_bootstraps():
    # weighted mean = Σ w·x / Σ w (per-window NLL weighted by tokens)
    est, (lo, hi) = bootstrap_contrast([[1.0, 3.0]], sample_weights=[[3.0, 1.0]])
    assert est == pytest.approx(1.5) and 1.0 <= lo <= hi <= 3.0
    # strata: the mean of the cells' means, each cell resampled on its own
    est, (lo, hi) = bootstrap_mean([1, 1, 1, 0, 0, 0, 0, 0], strata=["a", "a", "a", "b", "b", "b", "b", "b"])
    assert est == pytest.approx(0.5) and lo == hi == pytest.approx(0.5)  # no spread within cells
    est, _ = bootstrap_contrast([[2.0, 2.0], [1.0, 1.0]], [1.0, -1.0])
    assert est == pytest.approx(1.0)
    # one value says nothing about spread: no zero-width interval from a bootstrap of one sample
    assert bootstrap_contrast([[0.7]]) == (0.7, (-math.inf, math.inf))
    assert paired_difference([0.1], [0.9]).interval == (-math.inf, math.inf)


def test_welch_interval_and_unpaired_bootstrap():
    ref, new = [5.0, 5.2, 4.9, 5.1], [4.0, 4.1, 3.9, 4.2]
    d = unpaired_difference(ref, new)
    assert d.estimate == pytest.approx(np.mean(new) - np.mean(ref)) and d.interval[1] < 0 and "Welch" in d.method
    one = unpaired_difference([5.0], [4.0])  # one run each: no spread, no interval
    assert one.interval == (-math.inf, math.inf) and verdict(one.interval, "lower") == "inconclusive"
    boot = unpaired_difference(ref, new, method="bootstrap", seed=0)
    assert boot.interval[1] < 0 and boot == unpaired_difference(ref, new, method="bootstrap", seed=0)


@pytest.mark.parametrize(
    "interval, claimed, want",
    [
        ((-0.1, 0.2), "higher", "inconclusive"),
        ((-0.1, 0.2), "lower", "inconclusive"),
        ((0.05, 0.2), "higher", "agrees"),
        ((0.05, 0.2), "lower", "disagrees"),
        ((-0.3, -0.01), "lower", "agrees"),
        ((-0.3, -0.01), "higher", "disagrees"),
        ((0.0, 0.3), "higher", "inconclusive"),  # touching 0 is not excluding it
        ((-math.inf, math.inf), "higher", "inconclusive"),
        ((math.nan, 1.0), "higher", "inconclusive"),
        (None, "lower", "inconclusive"),
    ],
)
def test_verdict(interval, claimed, want):
    assert verdict(interval, claimed) == want


def test_verdict_never_rests_on_a_difference_hidden_by_rounding():
    assert verdict((0.0002, 0.0004), "higher") == "agrees"
    assert verdict((0.0002, 0.0004), "higher", digits=3) == "inconclusive"  # prints as [0.000, 0.000]
    assert verdict((0.0006, 0.002), "higher", digits=3) == "agrees"
    with pytest.raises(ValueError, match="higher"):
        verdict((0.1, 0.2), "better")


def test_newcombe_paired_interval_is_honest_when_few_pairs_disagree():
    from diffattn.eval.stats import newcombe_paired_difference

    # 4 trials won by the new model, none by the reference, out of 40: McNemar's exact p = 0.125, so no verdict
    few = newcombe_paired_difference([0] * 40, [1] * 4 + [0] * 36)
    assert few.estimate == pytest.approx(0.1) and few.interval[0] < 0 < few.interval[1]
    assert verdict(few.interval, "higher") == "inconclusive"
    # swapping the models negates the difference and mirrors the interval
    ref = [1] * 8 + [1] * 5 + [0] * 4 + [0] * 6
    new = [1] * 8 + [0] * 5 + [1] * 4 + [0] * 6
    forward, backward = newcombe_paired_difference(ref, new), newcombe_paired_difference(new, ref)
    assert forward.estimate == pytest.approx(-1 / 23) == -backward.estimate
    assert forward.interval == pytest.approx((-backward.interval[1], -backward.interval[0]))
    # with no correlation (phi = 0: the reference never succeeds) it is Newcombe's square-and-add of two Wilson
    # intervals, computed here independently
    lo1, hi1 = wilson_interval(0, 40)
    lo2, hi2 = wilson_interval(4, 40)
    expected = (0.1 - math.hypot(0.1 - lo2, hi1 - 0.0), 0.1 + math.hypot(hi2 - 0.1, 0.0 - lo1))
    assert few.interval == pytest.approx(expected, abs=1e-5)  # z = 1.96 here, 1.959964 there
    clear = newcombe_paired_difference([1] * 20 + [0] * 20, [1] * 40)
    assert verdict(clear.interval, "higher") == "agrees" and verdict(clear.interval, "lower") == "disagrees"
    with pytest.raises(ValueError, match="binary"):
        newcombe_paired_difference([0.5], [1])


def test_few_pairs_use_student_t_and_identical_runs_give_no_interval():
    from diffattn.eval.stats import SMALL_SAMPLE

    ref = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    new = [x + d for x, d in zip(ref, [0.5, -0.2, 0.4, 0.1, 0.6, -0.1, 0.3, 0.2], strict=True)]
    small = paired_difference(ref, new)
    assert len(ref) < SMALL_SAMPLE and "paired t" in small.method
    d = np.asarray(new) - np.asarray(ref)
    half = t_quantile(0.975, 7) * d.std(ddof=1) / math.sqrt(8)
    assert small.interval == pytest.approx((d.mean() - half, d.mean() + half))
    same = unpaired_difference([0.5, 0.5], [0.7, 0.7])
    assert same.interval == (-math.inf, math.inf) and verdict(same.interval, "higher") == "inconclusive"


def test_power_and_minimum_detectable_difference_against_known_answers():
    """Textbook two-sample t answers (Cohen 1988, Table 2.4.1): d = 0.5 needs 64 runs per group, d = 1.0 needs 17,
    for 80% power at α = 0.05 two-sided; with 10 per group the detectable d is 1.325 (G*Power)."""
    from diffattn.eval.stats import minimum_detectable_difference, runs_for_power, welch_power

    assert runs_for_power(0.5, 1.0) == 64
    assert runs_for_power(1.0, 1.0) == 17
    assert minimum_detectable_difference(1.0, 10, 1.0, 10) == pytest.approx(1.3249, abs=2e-3)
    # scale-free: in units of the spread
    assert minimum_detectable_difference(0.065, 6, 0.065, 6) == pytest.approx(
        0.065 * minimum_detectable_difference(1.0, 6, 1.0, 6), rel=1e-6
    )
    assert welch_power(0.0, 1.0, 5, 1.0, 5) == pytest.approx(0.05, abs=1e-6)  # no effect: the test's level


def test_minimum_detectable_difference_has_its_power_on_synthetic_seed_data():
    """Simulated replicate runs at the computed MDE are detected by the Welch interval ~80% of the time."""
    from diffattn.eval.stats import minimum_detectable_difference, unpaired_difference

    rng = np.random.default_rng(0)
    sd_ref, sd_new, n = 0.06, 0.09, 5
    mde = minimum_detectable_difference(sd_ref, n, sd_new, n)
    sims = 3000
    hits = 0
    for _ in range(sims):
        ref = rng.normal(0.0, sd_ref, n)
        new = rng.normal(mde, sd_new, n)
        lo, hi = unpaired_difference(ref, new).interval
        hits += lo > 0 or hi < 0
    assert abs(hits / sims - 0.8) < 3 * math.sqrt(0.8 * 0.2 / sims) + 0.01  # Welch–Satterthwaite is approximate


def test_mcnemar_interval_excludes_zero_exactly_when_the_exact_test_rejects():
    from diffattn.eval.stats import mcnemar_exact_difference, mcnemar_exact_p, newcombe_paired_difference

    # the case: 18 concordant successes, 18 concordant failures, 4 : 0 discordant out of 40
    ref, new = [1] * 18 + [0] * 18 + [0] * 4, [1] * 18 + [0] * 18 + [1] * 4
    assert mcnemar_exact_p(ref, new) == pytest.approx(0.125)
    exact = mcnemar_exact_difference(ref, new)
    assert exact.estimate == pytest.approx(0.1) and exact.interval[0] < 0 < exact.interval[1]
    assert exact.interval == pytest.approx((-0.0203, 0.1), abs=5e-4)
    assert newcombe_paired_difference(ref, new).interval[0] > 0  # what the row used to read: "agrees"
    # over many random paired tables: the interval excludes 0 exactly when the test's p < 0.05, and the p-value is
    # scipy's two-sided exact binomial test of the discordant pairs
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(5, 60))
        r, q = rng.integers(0, 2, n), rng.integers(0, 2, n)
        d, p = mcnemar_exact_difference(r, q), mcnemar_exact_p(r, q)
        b, c = int(((r == 1) & (q == 0)).sum()), int(((r == 0) & (q == 1)).sum())
        if b + c:
            assert p == pytest.approx(scipy.stats.binomtest(c, b + c, 0.5).pvalue)
        assert (d.interval[0] > 0 or d.interval[1] < 0) == (p < 0.05)
        assert d.interval[0] <= d.estimate <= d.interval[1]
    assert mcnemar_exact_difference([1, 0], [1, 0]).interval == (0.0, 0.0)  # no discordant pair: no evidence
    with pytest.raises(ValueError, match="binary"):
        mcnemar_exact_difference([0.5], [1])


def test_the_crossed_interval_is_the_one_way_t_where_one_source_has_no_spread():
    """Draws × items: with no spread over items it is Student's t over the draws' means; with none over draws, over
    the items' means; with both it is wider than either alone (the items are a draw too)."""
    from diffattn.eval.stats import crossed_paired_difference, t_interval

    ref = np.zeros((3, 30))
    by_draw = np.array([[0.1] * 30, [0.2] * 30, [0.0] * 30])
    assert crossed_paired_difference(ref, by_draw).interval == pytest.approx(t_interval([0.1, 0.2, 0.0])[1])
    items = np.random.default_rng(0).integers(0, 2, 30).astype(float)
    by_item = np.tile(items, (3, 1))
    assert crossed_paired_difference(ref, by_item).interval == pytest.approx(t_interval(items)[1])
    both = crossed_paired_difference(ref, by_item + by_draw)
    assert both.interval[1] - both.interval[0] > t_interval(items)[1][1] - t_interval(items)[1][0]
    with pytest.raises(ValueError, match="draws × items"):
        crossed_paired_difference(ref, np.zeros((3, 29)))


def test_the_crossed_interval_over_strata_reads_each_strata_draws_and_the_items_across_all():
    """Strata × draws × items (a curve of shot counts, each with its own draws, the same test items): one stratum is
    the draws × items table; a fixed difference between strata is not chance (the interval of draws that agree
    within each stratum has no draw term, however far apart the strata), the draws within a stratum are."""
    from diffattn.eval.stats import crossed_paired_difference, t_interval

    rng = np.random.default_rng(0)
    table = rng.normal(size=(3, 30))
    one = crossed_paired_difference(np.zeros((1, 3, 30)), table[None])
    assert one.interval == pytest.approx(crossed_paired_difference(np.zeros((3, 30)), table).interval)
    items = rng.integers(0, 2, 30).astype(float)
    shifted = np.stack([np.tile(items, (3, 1)) + shift for shift in (0.0, 0.5, -0.3)])  # strata apart, draws agree
    d = crossed_paired_difference(np.zeros_like(shifted), shifted, strata_name="shot counts")
    assert d.estimate == pytest.approx(items.mean() + 0.2 / 3)
    assert d.interval == pytest.approx(np.add(t_interval(items)[1], 0.2 / 3))
    assert "over 3 shot counts × 3 draws each × 30 items" in d.method
    draws = rng.normal(size=(4, 5, 1)) * np.ones((4, 5, 30))  # the draws vary, the items do not
    d = crossed_paired_difference(np.zeros_like(draws), draws)
    terms = [float(np.var(s[:, 0], ddof=1)) / 5 / 4**2 for s in draws]  # each stratum's draw variance over K²
    df = sum(terms) ** 2 / sum(v**2 / 4 for v in terms)  # Welch–Satterthwaite, 4 df each
    assert d.interval[1] - d.estimate == pytest.approx(scipy.stats.t.ppf(0.975, df) * sum(terms) ** 0.5)


def _order_tables(rng, accuracy_logit: float, order_sd: float, sims: int, orders: int = 10, items: int = 30):
    """``sims`` orders × items tables of 0/1 hits: logistic item difficulty (sd 1) and order effects (sd
    ``order_sd``), and the true variance of the orders' accuracies over the item population (``true``)."""
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    logit = accuracy_logit + rng.normal(0, 1, (sims, 1, items)) + rng.normal(0, order_sd, (sims, orders, 1))
    population = sig(accuracy_logit + rng.normal(0, order_sd, (1000, 1)) + rng.normal(0, 1, (1, 2000))).mean(axis=1)
    return (rng.random(logit.shape) < sig(logit)).astype(int), float(np.var(population, ddof=1))


def test_the_orders_variance_removes_the_items_noise_and_its_interval_holds_the_truth():
    """What an order-robustness row reads (DIFF Fig. 7): the variance of the orders' true accuracies, not the spread
    of their noisy ones. Simulated, 10 orders × 30 items: two models with no order effect at all, at accuracy 0.5 and
    0.87, are told apart in about 2.5% of draws on each side (their ranges differ by about 0.08 from the items' noise
    alone); the interval holds the true difference where the orders matter, and with 200 items it finds a large one."""
    rng = np.random.default_rng(0)
    sims = 300
    flat_half, _ = _order_tables(rng, 0.0, 0.0, sims)
    flat_high, _ = _order_tables(rng, 2.2, 0.0, sims)
    ranges = lambda t: np.ptp(t.mean(axis=2), axis=1)  # noqa: E731
    assert ranges(flat_half).mean() - ranges(flat_high).mean() > 0.05  # the raw margins are biased by accuracy
    rows = [rows_variance_difference(a, b) for a, b in zip(flat_half, flat_high, strict=True)]
    assert abs(np.mean([r.estimate for r in rows])) < 0.001  # unbiased: both true variances are 0
    for side in (lambda lo, hi: hi < 0, lambda lo, hi: lo > 0):  # a false "more robust" either way: 2.5% each
        assert np.mean([side(*r.interval) for r in rows]) < 0.06
    sensitive, true_ref = _order_tables(rng, 0.0, 0.5, sims)
    robust, true_new = _order_tables(rng, 0.0, 0.1, sims)
    rows = [rows_variance_difference(a, b) for a, b in zip(sensitive, robust, strict=True)]
    assert np.mean([lo <= true_new - true_ref <= hi for lo, hi in (r.interval for r in rows)]) > 0.92
    est, (lo, hi) = rows_variance(sensitive[0])
    assert lo < est < hi and est == pytest.approx(rows_variance_difference(np.zeros((10, 30)), sensitive[0]).estimate)
    sensitive, _ = _order_tables(rng, 0.0, 1.0, 40, items=200)
    robust, _ = _order_tables(rng, 0.0, 0.2, 40, items=200)
    found = [rows_variance_difference(a, b).interval[1] < 0 for a, b in zip(sensitive, robust, strict=True)]
    assert np.mean(found) > 0.8
    with pytest.raises(ValueError, match="rows × items"):
        rows_variance([[1, 0, 1]])
    assert rows_variance(np.ones((10, 30)))[1] == (-math.inf, math.inf)  # a constant table: no width to read


def test_the_modified_large_sample_widths_are_the_chi_square_intervals():
    """G = 1 − df/χ²(0.975; df), H = df/χ²(0.025; df) − 1 (Graybill & Wang 1980), against values computed by hand."""
    from diffattn.eval.stats import _mls_interval, _mls_widths

    for df, (g, h) in {9: (0.5269, 2.3329), 261: (0.1516, 0.1965)}.items():
        assert _mls_widths(df, 0.95) == pytest.approx((g, h), abs=1e-4)
    # one positive term is the exact chi-square interval of its expectation
    lo, hi = _mls_interval(2.0, [(2.0, 9)], [], 0.95)
    chi2 = scipy.stats.chi2.ppf
    assert (lo, hi) == pytest.approx((2.0 * 9 / chi2(0.975, 9), 2.0 * 9 / chi2(0.025, 9)))


def test_seeds_items_counts_the_shared_items_once_and_is_welch_where_they_add_nothing():
    """Replicate runs scored on the same items (docs/evaluation.md §13.4): Welch over the runs' means misses which items
    were drawn; the seeds × items interval holds the truth in about 95% of draws where items dominate (Welch: about
    70%; benchmarks/seeds_items_simulation.py) and is Welch's where the items' differences do not vary."""
    rng = np.random.default_rng(3)
    holds = {"welch": 0, "seeds × items": 0}
    for _ in range(300):  # both models alike, so the truth is 0; a model × item interaction, little seed spread
        u = rng.normal(0, 1, 60)
        v = 0.5 * u + np.sqrt(0.75) * rng.normal(0, 1, 60)
        a, b = (e[None, :] + rng.normal(0, 0.02, (3, 1)) + rng.normal(0, 0.5, (3, 60)) for e in (u, v))
        welch = unpaired_difference(a.mean(axis=1), b.mean(axis=1), method="welch").interval
        for name, (lo, hi) in {"welch": welch, "seeds × items": seeds_items_difference(a, b).interval}.items():
            holds[name] += lo <= 0 <= hi
    assert holds["welch"] / 300 < 0.85 and holds["seeds × items"] / 300 > 0.92
    # every item moved alike (the items' differences constant): the item term is negative and dropped: Welch exactly
    a = rng.normal(0, 1, (3, 20))
    b = np.broadcast_to(a.mean(axis=0), (3, 20)) + rng.normal(0, 0.3, (3, 1)) + 0.5
    d = seeds_items_difference(a, b)
    welch = unpaired_difference(a.mean(axis=1), b.mean(axis=1), method="welch")
    assert d.estimate == pytest.approx(welch.estimate) and d.interval == pytest.approx(welch.interval)
    mean, ci = seeds_items_mean(np.broadcast_to(a.mean(axis=0), (3, 20)) + np.arange(3)[:, None])
    assert mean == pytest.approx(a.mean() + 1) and ci[0] < mean < ci[1]
    with pytest.raises(ValueError, match="the same items"):
        seeds_items_difference(a, a[:, :10])


def test_seeds_items_over_draws_crossed_with_items_is_the_two_way_formula_with_one_draw_and_counts_the_draws():
    """Runs × shot counts × draws × items (many-shot ICL, every run after the same draws): with one stratum and one
    draw it is the runs × items formula exactly; a shift that moves the draws, alike in every run, is a chance the
    runs share (their spread does not show it) and widens the interval past Welch's; a shift that moves every cell
    alike adds nothing: Welch's exactly."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(0, 1, (3, 20)), rng.normal(0, 1, (4, 20))
    two_way, as_cells = seeds_items_difference(a, b), seeds_items_difference(a[:, None, None], b[:, None, None])
    assert as_cells.interval == pytest.approx(two_way.interval, rel=1e-12) and as_cells.method == two_way.method
    assert seeds_items_mean(a[:, None, None])[1] == pytest.approx(seeds_items_mean(a)[1], rel=1e-12)
    x = rng.normal(0, 1, (3, 2, 5, 20))
    welch = unpaired_difference(x.mean(axis=(1, 2, 3)), (x + 0.5).mean(axis=(1, 2, 3)), method="welch")
    alike = seeds_items_difference(x, x + 0.5)
    assert alike.interval == pytest.approx(welch.interval) and alike.method.endswith(WELCH_EXACTLY)
    draws = seeds_items_difference(x, x + np.linspace(-1, 1, 5)[None, None, :, None])
    assert "3 vs 3 runs × 2 shot counts × 5 draws × 20 items" in seeds_items_difference(
        x, x, strata_name="shot counts").method  # fmt: skip
    assert draws.estimate == pytest.approx(0) and draws.interval[1] - draws.interval[0] > 2 * (welch.interval[1] - 0.5)
