"""The statistics every evaluation and the paper-claims table share, written once.

* :func:`wilson_interval` — the score interval of a binomial proportion (Wilson 1927, *JASA* 22: 209–212); unlike
  the normal "Wald" interval it stays inside [0, 1] and is not empty at 0/n or n/n.
* :func:`mcnemar_exact_difference` — the difference of two proportions on paired binary outcomes with the exact
  interval that matches McNemar's exact test (Clopper–Pearson on the discordant pairs), what retrieval rows use.
* :func:`mean_se` — the mean and its standard error (sample standard deviation / √n).
* :func:`bootstrap_contrast` — the percentile bootstrap (Efron & Tibshirani 1993, ch. 13) of a weighted sum of
  group means, resampling within each group; the building block of the three below.
* :func:`paired_difference` — the mean of ``new − ref`` over the *same* samples: percentile bootstrap over the
  pairs (default) or the normal interval mean ± z·SE of the differences.
* :func:`unpaired_difference` — the difference of two independent means (e.g. models trained with different
  seeds): Welch's t interval (Welch 1947, *Biometrika* 34: 28–35) with the Welch–Satterthwaite degrees of
  freedom, or an unpaired bootstrap. With two values per side the interval is wide: that is the honest answer.
* :func:`rows_variance`, :func:`rows_variance_difference` — the variance of the true row means of a rows × items
  table (e.g. accuracy under each order of the demonstrations, items a sample) with the items' noise removed (two-way
  ANOVA mean squares), and the difference of two, with modified large-sample intervals (Graybill & Wang 1980).
* :func:`verdict` — "agrees" / "disagrees" only when the interval excludes 0, in the claimed direction or
  against it; "inconclusive" otherwise (the interval includes "no difference").
* :func:`welch_power`, :func:`minimum_detectable_difference`, :func:`runs_for_power` — what a comparison of two
  groups of replicate runs could detect: the two-sided Welch t test's power at a true difference (noncentral t),
  the smallest difference it detects with 80% power given the measured spread, and the runs per group that a
  given difference needs. An "inconclusive" over seeds says which differences it rules out.

Every bootstrap is deterministic: a seeded ``numpy.random.Generator`` (``seed=0`` by default).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

VERDICTS = ("agrees", "disagrees", "inconclusive")


class Difference(NamedTuple):
    """A difference ``new − ref`` (or any contrast) with its interval."""

    estimate: float
    interval: tuple[float, float]
    method: str  # what the interval is, in words
    n: int  # samples (pairs) or values behind it


def _scipy_stats():
    """scipy.stats, imported on first use: over a second that a command line that only parses its flags (``diffattn
    eval --help``) need not pay."""
    import scipy.stats

    return scipy.stats


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def _array(values, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0:
        raise ValueError(f"{what}: no values")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what}: values must be finite")
    return a


# -- proportions and means ----------------------------------------------------------------------------------------
def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval (Wilson 1927) of a proportion ``successes / n`` at normal quantile ``z``.

    ``successes`` may be fractional (e.g. the sum of partial retrieval scores): the interval then treats the mean
    score as a proportion over ``n`` trials, exact for 0/1 scores. ``n = 0`` gives the uninformative (0, 1)."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} / {n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_se(values) -> tuple[float, float]:
    """``(mean, standard error)``: SE = sample standard deviation (ddof = 1) / √n; NaN for a single value."""
    a = _array(values, "mean_se")
    if a.size < 2:
        return float(a[0]), math.nan
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(a.size))


def normal_interval(mean: float, se: float, level: float = 0.95) -> tuple[float, float]:
    """mean ± z·SE (NaN ends when the SE is undefined)."""
    z = _z(level)
    return (mean - z * se, mean + z * se)


# -- Student's t ---------------------------------------------------------------------------------------------------
def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    return float(_scipy_stats().t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``df`` may be fractional, as Welch's)."""
    if not 0 < p < 1 or not df > 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    return float(_scipy_stats().t.ppf(p, df))


# -- paired proportions ----------------------------------------------------------------------------------------------
def newcombe_paired_difference(ref_hits, new_hits, level: float = 0.95) -> Difference:
    """``p_new − p_ref`` of paired binary outcomes (the same trials seen by two models) and Newcombe's hybrid score
    interval (Newcombe 1998, "Improved confidence intervals for the difference between binomial proportions based
    on paired data", method 10: Wilson intervals of both proportions combined with the phi correlation).

    It does *not* behave like McNemar's test when pairs agree on successes: 40 trials with 18 concordant successes,
    18 concordant failures and 4 : 0 discordant pairs give [+0.009, +0.186] while McNemar's exact test gives
    p = 0.125 — the concordant successes narrow the Wilson intervals it combines. Where the question is "does one
    model win the trials they disagree on", use :func:`mcnemar_exact_difference`."""
    ref, new = _array(ref_hits, "newcombe"), _array(new_hits, "newcombe")
    if ref.size != new.size:
        raise ValueError(f"paired outcomes must match: {ref.size} reference vs {new.size} new")
    if not np.isin(ref, (0, 1)).all() or not np.isin(new, (0, 1)).all():
        raise ValueError("Newcombe's interval needs binary outcomes (0 or 1)")
    n = ref.size
    a = float(((ref == 1) & (new == 1)).sum())
    b = float(((ref == 1) & (new == 0)).sum())
    c = float(((ref == 0) & (new == 1)).sum())
    d = float(n - a - b - c)
    z = _z(level)
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    denominator = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denominator) if denominator > 0 else 0.0
    theta = p2 - p1
    lower = theta - math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    upper = theta + math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    pct = f"{100 * level:g}%"
    return Difference(theta, (lower, upper), f"Newcombe paired score interval over {n} trials ({pct})", int(n))


def mcnemar_exact_difference(ref_hits, new_hits, level: float = 0.95) -> Difference:
    """``p_new − p_ref`` of paired binary outcomes with the exact interval that matches McNemar's exact test.

    Only the m discordant pairs carry evidence: given m, the number c the new model wins is Binomial(m, π), and
    ``p_new − p_ref = (c − b) / n = m (2π − 1) / n``. The equal-tailed Clopper–Pearson interval of π (Clopper &
    Pearson 1934) maps to the interval of the difference; it excludes 0 exactly when the two-sided exact McNemar test
    (twice the smaller binomial tail) rejects at ``1 − level``. Concordant pairs, successes or failures, only scale
    it through n: the 40 trials above (18 + 18 concordant, 4 : 0 discordant) give [−0.020, +0.100] (p = 0.125).
    The interval is conditional on m, the number of prompts the two disagree on: when one side wins all of them its
    far end is the estimate itself. With no discordant pair it is [0, 0]: no evidence either way ("inconclusive")."""
    ref, new = _array(ref_hits, "mcnemar"), _array(new_hits, "mcnemar")
    if ref.size != new.size:
        raise ValueError(f"paired outcomes must match: {ref.size} reference vs {new.size} new")
    if not np.isin(ref, (0, 1)).all() or not np.isin(new, (0, 1)).all():
        raise ValueError("McNemar's interval needs binary outcomes (0 or 1)")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n = ref.size
    b = int(((ref == 1) & (new == 0)).sum())
    c = int(((ref == 0) & (new == 1)).sum())
    m = b + c
    alpha = 1 - level
    if m == 0:
        lo_pi = hi_pi = 0.5
    else:
        lo_pi = float(_scipy_stats().beta.ppf(alpha / 2, c, m - c + 1)) if c > 0 else 0.0
        hi_pi = float(_scipy_stats().beta.ppf(1 - alpha / 2, c + 1, m - c)) if c < m else 1.0
    interval = (m * (2 * lo_pi - 1) / n, m * (2 * hi_pi - 1) / n)
    pct = f"{100 * level:g}%"
    method = f"exact McNemar, conditional on the {m} discordant of {n} paired trials (Clopper–Pearson, {pct})"
    return Difference((c - b) / n, interval, method, int(n))


def mcnemar_exact_p(ref_hits, new_hits) -> float:
    """Two-sided exact McNemar p-value: twice the smaller binomial tail of the discordant pairs (capped at 1)."""
    ref, new = _array(ref_hits, "mcnemar"), _array(new_hits, "mcnemar")
    b = int(((ref == 1) & (new == 0)).sum())
    c = int(((ref == 0) & (new == 1)).sum())
    if b + c == 0:
        return 1.0
    tail = float(_scipy_stats().binom.cdf(min(b, c), b + c, 0.5))
    return min(1.0, 2 * tail)


# -- bootstrap -----------------------------------------------------------------------------------------------------
def bootstrap_contrast(
    groups,
    weights=None,
    *,
    sample_weights=None,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
) -> tuple[float, tuple[float, float]]:
    """Percentile bootstrap of ``Σ_g weights[g] · mean(groups[g])``, resampling each group on its own.

    ``groups``: a list of 1-D arrays (independent strata: grid cells, two models' samples, ...); ``weights``: one
    number per group (default 1 each). ``sample_weights`` (optional, one array per group) turns each group's mean
    into a weighted mean Σ wᵢxᵢ / Σ wᵢ (e.g. per-window NLL weighted by the window's token count). Returns
    ``(estimate, (lo, hi))``, deterministic for a given ``seed``. A group of a single value says nothing about its
    spread, so the interval is then (−inf, inf) (a bootstrap of one value would give a zero-width interval)."""
    arrays = [_array(g, "bootstrap_contrast") for g in groups]
    weights = [1.0] * len(arrays) if weights is None else [float(w) for w in weights]
    if len(weights) != len(arrays):
        raise ValueError(f"{len(weights)} weights for {len(arrays)} groups")
    sws = [None] * len(arrays) if sample_weights is None else [_array(w, "sample_weights") for w in sample_weights]
    if any(w is not None and w.size != a.size for w, a in zip(sws, arrays, strict=True)):
        raise ValueError("sample_weights must have one weight per value")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    estimate = 0.0
    boots = np.zeros(n_boot)
    for a, w, sw in zip(arrays, weights, sws, strict=True):
        idx = rng.integers(0, a.size, size=(n_boot, a.size))
        if sw is None:
            estimate += w * float(a.mean())
            boots += w * a[idx].mean(axis=1)
        else:
            estimate += w * float((a * sw).sum() / sw.sum())
            boots += w * (a[idx] * sw[idx]).sum(axis=1) / sw[idx].sum(axis=1)
    if any(a.size < 2 and w != 0 for a, w in zip(arrays, weights, strict=True)):
        return estimate, (-math.inf, math.inf)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return estimate, (float(lo), float(hi))


def bootstrap_mean(values, *, strata=None, seed: int = 0, n_boot: int = 2000, level: float = 0.95):
    """Percentile-bootstrap interval of a mean; with ``strata`` (a label per value) the mean of the strata's means,
    resampled within each stratum (e.g. NIAH's mean accuracy over grid cells). Returns ``(estimate, (lo, hi))``."""
    a = _array(values, "bootstrap_mean")
    if strata is None:
        return bootstrap_contrast([a], seed=seed, n_boot=n_boot, level=level)
    labels = list(strata)
    if len(labels) != a.size:
        raise ValueError("strata must give one label per value")
    keys = list(dict.fromkeys(labels))
    groups = [a[[i for i, s in enumerate(labels) if s == k]] for k in keys]
    return bootstrap_contrast(groups, [1 / len(groups)] * len(groups), seed=seed, n_boot=n_boot, level=level)


# -- differences ---------------------------------------------------------------------------------------------------
def _weighted_mean_se(d: np.ndarray, weights) -> tuple[float, float]:
    """Mean of ``d`` and its standard error; with ``weights``, the weighted mean and its linearised SE."""
    if weights is None:
        return mean_se(d)
    w = _array(weights, "weights")
    est = float((w * d).sum() / w.sum())
    n = d.size
    se = math.sqrt((w**2 * (d - est) ** 2).sum() / w.sum() ** 2 * n / (n - 1)) if n > 1 else math.nan
    return est, se


SMALL_SAMPLE = 30  # below this many pairs, paired_difference uses Student's t instead of the percentile bootstrap


def paired_difference(
    ref_values,
    new_values,
    *,
    method: str = "bootstrap",
    weights=None,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
) -> Difference:
    """Mean of ``new − ref`` over paired samples (the same samples seen by two models) and its interval.

    ``method="bootstrap"``: percentile bootstrap over the pairs (seeded, deterministic), or Student's t on the
    paired differences below :data:`SMALL_SAMPLE` pairs, where the bootstrap is too narrow; ``"t"``: always t;
    ``"normal"``: mean ± z·SE of the paired differences. ``weights`` (one per pair, optional) make it a weighted
    mean (e.g. tokens per window); the t and normal intervals then use the linearised SE."""
    ref, new = _array(ref_values, "paired_difference"), _array(new_values, "paired_difference")
    if ref.size != new.size:
        raise ValueError(f"paired samples must match: {ref.size} reference vs {new.size} new values")
    d = new - ref
    pct = f"{100 * level:g}%"
    if method == "bootstrap" and d.size < SMALL_SAMPLE:
        method = "t"  # a percentile bootstrap of few pairs covers too little (n = 8: ~89% for a 95% interval)
    if method == "t":
        est, se = _weighted_mean_se(d, weights)
        if d.size < 2 or not math.isfinite(se):
            return Difference(est, (-math.inf, math.inf), f"too few pairs ({d.size}) for an interval", int(d.size))
        q = t_quantile(0.5 + level / 2, d.size - 1)
        return Difference(est, (est - q * se, est + q * se), f"paired t over {d.size} samples ({pct})", int(d.size))
    if method == "bootstrap":
        sw = None if weights is None else [weights]
        est, ci = bootstrap_contrast([d], sample_weights=sw, seed=seed, n_boot=n_boot, level=level)
        return Difference(est, ci, f"paired percentile bootstrap over {d.size} samples ({pct})", int(d.size))
    if method == "normal":
        est, se = _weighted_mean_se(d, weights)
        return Difference(
            est, normal_interval(est, se, level), f"paired mean ± z·SE over {d.size} samples ({pct})", int(d.size)
        )
    raise ValueError(f"method must be 'bootstrap' or 'normal', got {method!r}")


def mean_interval(values, *, weights=None, seed: int = 0, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """One model's mean over its samples (e.g. per-window NLL, token-weighted) with the interval
    :func:`paired_difference` gives a difference: a percentile bootstrap, or Student's t below :data:`SMALL_SAMPLE`
    samples, where a percentile bootstrap covers too little."""
    a = _array(values, "mean_interval")
    d = paired_difference(np.zeros_like(a), a, weights=weights, seed=seed, level=level)
    return d.estimate, d.interval


def unpaired_difference(
    ref_values,
    new_values,
    *,
    method: str = "welch",
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
) -> Difference:
    """``mean(new) − mean(ref)`` of two independent samples (e.g. replicate seeds of two models) and its interval.

    ``method="welch"``: Welch's t interval, df by Welch–Satterthwaite; it needs at least two values per side
    (otherwise the interval is (−inf, inf): one run per model says nothing about run-to-run spread).
    ``"bootstrap"``: percentile bootstrap resampling each side on its own."""
    ref, new = _array(ref_values, "unpaired_difference"), _array(new_values, "unpaired_difference")
    est = float(new.mean() - ref.mean())
    pct = f"{100 * level:g}%"
    if method == "bootstrap":
        est, ci = bootstrap_contrast([new, ref], [1.0, -1.0], seed=seed, n_boot=n_boot, level=level)
        return Difference(
            est, ci, f"unpaired percentile bootstrap, {new.size} vs {ref.size} values ({pct})", int(new.size + ref.size)
        )
    if method != "welch":
        raise ValueError(f"method must be 'welch' or 'bootstrap', got {method!r}")
    what = f"Welch t interval, {ref.size} vs {new.size} values ({pct})"
    if ref.size < 2 or new.size < 2:
        return Difference(est, (-math.inf, math.inf), what, int(new.size + ref.size))
    vr, vn = ref.var(ddof=1) / ref.size, new.var(ddof=1) / new.size
    se = math.sqrt(vr + vn)
    if se == 0:  # identical runs on both sides: no spread measured, so no interval (not a zero-width one)
        return Difference(est, (-math.inf, math.inf), what + "; no spread between runs", int(new.size + ref.size))
    df = (vr + vn) ** 2 / (vr**2 / (ref.size - 1) + vn**2 / (new.size - 1))
    t = t_quantile(0.5 + level / 2, df)
    return Difference(est, (est - t * se, est + t * se), what, int(new.size + ref.size))


def t_interval(values, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Mean and Student's t interval (n − 1 df) of independent values, e.g. one metric over seeds."""
    a = _array(values, "t_interval")
    if a.size < 2:
        return float(a[0]), (-math.inf, math.inf)
    m, se = mean_se(a)
    t = t_quantile(0.5 + level / 2, a.size - 1)
    return m, (m - t * se, m + t * se)


def _crossed_terms(x: np.ndarray) -> list[tuple[float, int]]:
    """The variance terms of a strata × draws × items array's grand mean, each with its df, in a fixed order (each
    stratum's draws, then the items; none for one draw or one item): ``MS_D/(D·I)`` per stratum over K² — the
    variance of its draws' means over D — and ``MS_I/(D·I)`` — the variance of the items' means over every stratum
    and draw, over I (:func:`crossed_paired_difference`). Leading axes (e.g. runs) give each term per leading index,
    as arrays."""
    strata, draws, items = x.shape[-3:]
    terms = []
    if draws >= 2:
        per_stratum = np.var(x.mean(axis=-1), axis=-1, ddof=1) / draws / strata**2  # [..., strata]
        terms += [(per_stratum[..., k], draws - 1) for k in range(strata)]
    if items >= 2:
        terms.append((np.var(x.mean(axis=(-3, -2)), axis=-1, ddof=1) / items, items - 1))
    return [(float(v) if np.ndim(v) == 0 else v, df) for v, df in terms]


def crossed_paired_difference(ref_values, new_values, level: float = 0.95, strata_name: str = "strata") -> Difference:
    """Mean of ``new − ref`` over a draws × items table of paired values (two models scored on the same test items
    after the same draws of demonstrations), with a t interval whose variance counts both sources of chance: the
    draws and the items, crossed (each draw is scored on every item). A strata × draws × items array — e.g. one
    draws × items table per shot count, each shot count with draws of its own and the same test items in all
    (``strata_name``: what the method's words call the strata) — gives the mean of the strata's means: the draws
    vary within their stratum, the items across all of them.

    The two-way random-effects variance of the grand mean of the differences x[d, i] is
    ``σ²_D/D + σ²_I/I + σ²_E/(D·I) = (MS_D + MS_I − MS_E)/(D·I)`` with the mean squares of draws, items and their
    residual. The −MS_E term is dropped, so the variance is ``(MS_D + MS_I)/(D·I)``: never below the true one (by
    σ²_E/(D·I) above it) and never negative, with Welch–Satterthwaite's df of the two terms. In one stratum, with no
    spread over items it is Student's t over the draws' means; with no spread over draws, Student's t over the items'
    means — the one-way intervals it replaces (a t over draws alone ignored which test items were drawn); with one
    draw (per stratum) the draws' spread cannot be read, and the method says the interval lacks it. Over K strata the
    draw term is each stratum's ``MS_D/(D·I)`` summed over K² (the strata's fixed differences are not chance; their
    draws are) and the item term reads the items' means over every stratum and draw."""
    ref, new = np.asarray(ref_values, dtype=float), np.asarray(new_values, dtype=float)
    if ref.shape != new.shape or ref.ndim not in (2, 3) or ref.size == 0:
        raise ValueError(f"crossed_paired_difference wants two draws × items tables (or strata × draws × items "
                         f"arrays) of one shape, got {ref.shape} and {new.shape}")  # fmt: skip
    x = new - ref
    strata = x.shape[0] if x.ndim == 3 else 1
    x = x.reshape(strata, *x.shape[-2:])
    _, draws, items = x.shape
    mean = float(x.mean())  # equal draws and items per stratum: the mean of the strata's means
    if x.size < 2:
        return Difference(mean, (-math.inf, math.inf), "one value: no interval", int(x.size))
    terms = _crossed_terms(x)
    var = sum(v for v, _ in terms)
    method = f"two-way t over {draws} draws × {items} items (paired; crossed draws and items)"
    if strata > 1:
        method = (f"two-way t over {strata} {strata_name} × {draws} draws each × {items} items (paired; draws "
                  "within each, crossed with the items)")  # fmt: skip
    if draws < 2:  # no spread over draws to read: the interval is the items' alone
        method += "; one draw: the draws' spread is not in the interval"
    if var == 0:
        return Difference(mean, (mean, mean), method, int(x.size))
    df = var**2 / sum(v**2 / f for v, f in terms if v > 0)
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return Difference(mean, (mean - half, mean + half), method, int(x.size))


def _runs_cells(table, name: str) -> np.ndarray:
    """A runs × items table, or a runs × strata × draws × items array (the draws crossed with the items within each
    stratum, the items the same in all), as runs × strata × draws × items."""
    x = np.asarray(table, dtype=float)
    if x.ndim == 2:
        x = x[:, None, None, :]
    if x.ndim != 4 or x.shape[0] < 2 or x.size == 0:
        raise ValueError(f"{name} wants runs × items tables (or runs × strata × draws × items arrays) of at least 2 "
                         f"runs, got {np.shape(table)}")  # fmt: skip
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} wants finite values")
    return x


def _seeds_cells_terms(sides) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
    """The variance terms of ``Σ sign·(grand mean)`` over ``sides`` = [(runs × strata × draws × items, sign)] that
    share their draws and items: (the runs' terms, one per side — the variance of its runs' means over the runs,
    Welch's —, the shared cells' terms). The cells' terms are :func:`_crossed_terms` of the sides' signed table of
    cell means over the runs, less each side's run-by-cell noise in them (already in its runs' term): each term of
    a run's residual table (less its own mean and the side's cell means) averaged over the runs, over n − 1
    (the residual lost 1/n of it to the cell means) and, as a negative term, with (n − 1) × the term's df."""
    runs, cells = [], _crossed_terms(sum(sign * x.mean(axis=0) for x, sign in sides))
    for x, _ in sides:
        n = x.shape[0]
        run_means = x.mean(axis=(1, 2, 3))
        runs.append((float(np.var(run_means, ddof=1)) / n, n - 1))
        resid = x - x.mean(axis=0)[None] - (run_means - x.mean())[:, None, None, None]
        cells += [(-float(np.mean(v)) / (n - 1), (n - 1) * df) for v, df in _crossed_terms(resid)]
    return runs, cells


def _seeds_cells_interval(estimate: float, runs, cells, level: float) -> tuple[tuple[float, float], bool]:
    """The t interval of the runs' terms plus the cells' where these add a positive variance (else the runs' alone:
    Welch's), and whether the cells' were kept. The df: Satterthwaite's over the runs' terms and the cells' sum,
    whose own df is Satterthwaite's over its terms (the negative ones too), at least 1: a sum near 0 of mean squares
    with few df each (3 draws a shot count: 2) has less than one, and with it a t quantile in the hundreds on the
    whole variance (an accuracy's interval ±175), where the runs' terms it barely adds to are well estimated."""
    cells_var = sum(v for v, _ in cells)
    kept = cells_var > 0
    var = sum(v for v, _ in runs) + (cells_var if kept else 0.0)
    if var == 0:
        return (-math.inf, math.inf), kept
    spread = sum(v**2 / f for v, f in runs if v != 0)
    if kept:
        cells_df = max(1.0, cells_var**2 / sum(v**2 / f for v, f in cells if v != 0))
        spread += cells_var**2 / cells_df
    df = var**2 / spread
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return (estimate - half, estimate + half), kept


def _cells_words(x: np.ndarray, strata_name: str) -> str:
    strata, draws, items = x.shape[1:]
    if strata == draws == 1:
        return f"{items} shared items"
    return f"{strata} {strata_name} × {draws} draws × {items} items, shared"


WELCH_EXACTLY = "; the items add nothing beyond the seeds' spread: Welch's interval"  # its method's words then
NO_SPREAD = "; no spread between runs or items"  # every value the same: no width to read (its method's words then)


def seeds_items_difference(ref_table, new_table, level: float = 0.95, strata_name: str = "strata") -> Difference:
    """``new − ref`` of two groups of replicate runs (training seeds) scored on the same test items: two runs ×
    items tables with the same items in the same columns (each side its own runs), the difference of their grand
    means with a t interval whose variance counts both sources of chance. Welch over the runs' means counts the
    seeds only: every run read the same items, so which items were drawn is a chance the runs share, and the item ×
    model interaction is not in the runs' spread.

    With run r's value on item i ``μ + s_r + u_i + e_ri`` on each side (the items' effects u and v of the two models
    correlated any way), the grand means' difference has variance ``σ²_s/n + σ²_t/m + σ²(u − v)/I + σ²_e/(nI) +
    σ²_f/(mI)``. Welch's two terms (the runs' means' variances over n and m) hold all but σ²(u − v)/I; the items'
    differences of means ``d_i`` have a variance over the items of ``σ²(u − v) + σ²_e/n + σ²_f/m``, and each side's
    two-way residual mean square estimates its σ²_e, so the item term is ``(s²_d − MS_E/n − MS_F/m)/I``, truncated at
    0: the variance is never below Welch's, and is Welch's exactly where the items add nothing. Its df: Satterthwaite's
    over Welch's two terms and the item term, whose own df is Satterthwaite's over its three mean squares, the
    residuals' with their negative signs (the item term alone would claim I − 1 where its residual share leaves far
    fewer: 2.3 of 15 in one export's 16 windows), at least 1 (:func:`_seeds_cells_interval`).
    ``benchmarks/seeds_items_simulation.py`` measures its coverage.

    Runs × strata × draws × items arrays (many-shot ICL: each shot count's draws of demonstrations, the same test
    items in all, every run scored after the same draws) read the same way with the draws crossed with the items:
    the cells' terms are :func:`crossed_paired_difference`'s of the table of differences of the runs' means, less
    each side's run-by-cell noise in them (:func:`_seeds_cells_terms`); on runs × 1 × 1 × items it is the formula
    above exactly. ``strata_name``: what the method's words call the strata."""
    ref, new = _runs_cells(ref_table, "seeds_items_difference"), _runs_cells(new_table, "seeds_items_difference")
    if ref.shape[1:] != new.shape[1:]:
        raise ValueError(f"seeds_items_difference wants the same items (and strata and draws) on both sides, got "
                         f"{np.shape(ref_table)} and {np.shape(new_table)}")  # fmt: skip
    n, m = ref.shape[0], new.shape[0]
    estimate = float(new.mean() - ref.mean())
    runs, cells = _seeds_cells_terms([(ref, -1.0), (new, 1.0)])
    ci, kept = _seeds_cells_interval(estimate, runs, cells, level)
    method = f"two-way t over seeds × items ({n} vs {m} runs × {_cells_words(ref, strata_name)}; items counted once)"
    if not math.isfinite(ci[0]):  # no spread at all to read a width from, as Welch's interval says of exact agreement
        method += NO_SPREAD
    elif not kept:
        method += WELCH_EXACTLY
    return Difference(estimate, ci, method, n + m)


def seeds_items_mean(table, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """One group's grand mean over a runs × items table (or runs × strata × draws × items array) with the t interval
    of :func:`seeds_items_difference`'s variance for one side: the runs' means' variance over the runs plus the
    items' (and draws') terms of the cell means less the run-by-cell noise in them, dropped where not positive. A
    table without any spread has the interval of its mean alone, as Student's t of equal values has."""
    x = _runs_cells(table, "seeds_items_mean")
    mean = float(x.mean())
    runs, cells = _seeds_cells_terms([(x, 1.0)])
    ci, _ = _seeds_cells_interval(mean, runs, cells, level)
    return mean, ci if math.isfinite(ci[0]) else (mean, mean)


# -- a variance component and its difference ------------------------------------------------------------------------
def _rows_terms(table) -> tuple[float, list[tuple[float, int]], list[tuple[float, int]]]:
    """The between-rows variance component of a rows × items table and the mean-square terms it is made of:
    ``(MS_rows − MS_resid)/I`` as (estimate, [(MS_rows/I, rows − 1)], [(MS_resid/I, (rows − 1)(items − 1))])."""
    x = np.asarray(table, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"a rows × items table of finite values with at least 2 of each is needed, got {x.shape}")
    rows, items = x.shape
    row_means, item_means, grand = x.mean(axis=1), x.mean(axis=0), x.mean()
    ms_rows = items * float(np.sum((row_means - grand) ** 2)) / (rows - 1)
    resid_df = (rows - 1) * (items - 1)
    ms_resid = float(np.sum((x - row_means[:, None] - item_means[None, :] + grand) ** 2)) / resid_df
    return (ms_rows - ms_resid) / items, [(ms_rows / items, rows - 1)], [(ms_resid / items, resid_df)]


@functools.lru_cache(maxsize=256)
def _mls_widths(df: int, level: float) -> tuple[float, float]:
    """(G, H) of :func:`_mls_interval` for a term with ``df`` degrees of freedom."""
    a = (1 - level) / 2
    return 1 - df / float(_scipy_stats().chi2.ppf(1 - a, df)), df / float(_scipy_stats().chi2.ppf(a, df)) - 1


def _mls_interval(estimate: float, positive, negative, level: float) -> tuple[float, float]:
    """The modified large-sample interval of a difference of scaled mean squares (Graybill & Wang 1980, *JASA* 75:
    869–873; Ting, Burdick, Graybill, Jeyaratnam & Lu 1990, *J. Stat. Comput. Simul.* 35: 135–143), cross terms
    dropped (at 9 and 261 df that moves the lower end in and the upper end out, by under a point of coverage in
    simulation: review of 2026-12-02): each term ``c·MS`` with ``df`` degrees of freedom widens the lower end by
    ``G·c·MS`` when it adds and by ``H·c·MS`` when it subtracts (the upper end the other way round), where ``G = 1 −
    df/χ²(1 − α/2; df)`` and ``H = df/χ²(α/2; df) − 1`` are the exact chi-square interval's one-term widths."""
    widths = lambda df: _mls_widths(df, level)  # noqa: E731
    low = sum((widths(df)[0] * t) ** 2 for t, df in positive) + sum((widths(df)[1] * t) ** 2 for t, df in negative)
    high = sum((widths(df)[1] * t) ** 2 for t, df in positive) + sum((widths(df)[0] * t) ** 2 for t, df in negative)
    return estimate - math.sqrt(low), estimate + math.sqrt(high)


def rows_variance(table, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """The variance of the rows' true means in a rows × items table whose items are a sample (e.g. one accuracy per
    order of the demonstrations, each item's hit under every order), with the items' noise removed: the two-way
    ANOVA estimate ``(MS_rows − MS_resid)/I`` — unbiased, so negative where the rows vary less than the items' noise
    alone would make them — and its modified large-sample interval (:func:`_mls_interval`). The spread of the rows'
    observed means (or their range) is not this: it adds the item × row noise, the more the nearer a 0/1 outcome's
    rate is to 0.5. A constant table (every item solved, or failed, under every row) has no interval: (−∞, ∞)."""
    estimate, positive, negative = _rows_terms(table)
    if positive[0][0] == 0 and negative[0][0] == 0:  # no spread at all to read a width from ([0, 0] would claim one)
        return estimate, (-math.inf, math.inf)
    return estimate, _mls_interval(estimate, positive, negative, level)


def rows_variance_difference(ref_table, new_table, level: float = 0.95, rows_name: str = "rows") -> Difference:
    """``new − ref`` of two tables' :func:`rows_variance`, with the modified large-sample interval of the four mean
    squares taken as independent: its 95% interval held the true difference in 96-98% of simulated pairs of 10
    orders × 30-200 items (logistic item and order effects, accuracies 0.5-0.96), and with no order effect in either
    model it excluded 0 on each side in 1.9-2.3% of draws whatever the two accuracies
    (``benchmarks/order_variance_simulation.py``; a review's 4,000 draws a cell agree; a smaller version is
    ``tests/eval/test_stats.py``). Two models scored on the same orders and items are not independent: with order
    effects correlated 0.8 between them the interval held the truth in 97.5% (the review), conservative. With 2 rows
    a side it is not: 90% (3 rows: 98%). ``rows_name``: what the method's words call the rows."""
    est_r, pos_r, neg_r = _rows_terms(ref_table)
    est_n, pos_n, neg_n = _rows_terms(new_table)
    estimate = est_n - est_r
    lo, hi = _mls_interval(estimate, pos_n + neg_r, neg_n + pos_r, level)
    (rows_r, items_r), (rows_n, items_n) = np.shape(ref_table), np.shape(new_table)
    method = (f"modified large-sample interval of two-way ANOVA mean squares ({rows_r} {rows_name} × {items_r} items "
              f"and {rows_n} × {items_n})")  # fmt: skip
    return Difference(float(estimate), (float(lo), float(hi)), method, int(rows_r + rows_n))


# -- power over replicate runs --------------------------------------------------------------------------------------
def welch_power(difference: float, sd_ref: float, n_ref: int, sd_new: float, n_new: int, alpha: float = 0.05) -> float:
    """Power of the two-sided Welch t test at level ``alpha`` when the true ``new − ref`` is ``difference`` and
    the groups have standard deviations ``sd_*`` over ``n_*`` runs (Welch–Satterthwaite df, noncentral t)."""
    if n_ref < 2 or n_new < 2:
        raise ValueError(f"power needs at least two runs per group, got {n_ref} and {n_new}")
    vr, vn = sd_ref**2 / n_ref, sd_new**2 / n_new
    se = math.sqrt(vr + vn)
    if se == 0:
        return 1.0 if difference != 0 else alpha
    df = (vr + vn) ** 2 / (vr**2 / (n_ref - 1) + vn**2 / (n_new - 1)) if vr + vn > 0 else n_ref + n_new - 2
    t = t_quantile(1 - alpha / 2, df)
    nc = abs(difference) / se
    return float(_scipy_stats().nct.sf(t, df, nc) + _scipy_stats().nct.cdf(-t, df, nc))


def minimum_detectable_difference(
    sd_ref: float, n_ref: int, sd_new: float, n_new: int, power: float = 0.8, alpha: float = 0.05
) -> float:
    """The smallest |new − ref| that the Welch test of these groups detects with ``power`` (80%): the effect size
    a comparison with this spread and these run counts can rule out when it finds none."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    se = math.sqrt(sd_ref**2 / n_ref + sd_new**2 / n_new)
    if se == 0:
        return 0.0
    lo, hi = 0.0, se
    while welch_power(hi, sd_ref, n_ref, sd_new, n_new, alpha) < power:
        hi *= 2
    for _ in range(60):  # bisection: power grows with the difference
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if welch_power(mid, sd_ref, n_ref, sd_new, n_new, alpha) < power else (lo, mid)
    return hi


def runs_for_power(
    difference: float, sd_ref: float, sd_new: float | None = None, power: float = 0.8, alpha: float = 0.05,
    max_runs: int = 1000,
) -> int | None:  # fmt: skip
    """The fewest runs per group (equal groups) for which the Welch test detects ``difference`` with ``power``;
    None when even ``max_runs`` do not."""
    sd_new = sd_ref if sd_new is None else sd_new
    for n in range(2, max_runs + 1):
        if welch_power(difference, sd_ref, n, sd_new, n, alpha) >= power:
            return n
    return None


# -- verdicts ------------------------------------------------------------------------------------------------------
def verdict(interval, claimed: str, *, digits: int | None = None) -> str:
    """What an interval of ``new − ref`` says about a claimed direction (``"higher"`` or ``"lower"``).

    "agrees": the whole interval lies on the claimed side of 0; "disagrees": on the other side; "inconclusive":
    it includes 0 (or is missing / not finite). With ``digits``, the interval's ends are first rounded to the
    precision a report prints, so a verdict never rests on a difference the reader cannot see."""
    if claimed not in ("higher", "lower"):
        raise ValueError(f"claimed must be 'higher' or 'lower', got {claimed!r}")
    if interval is None:
        return "inconclusive"
    lo, hi = (float(x) for x in interval)
    if math.isnan(lo) or math.isnan(hi):
        return "inconclusive"
    if digits is not None:
        lo, hi = round(lo, digits), round(hi, digits)
    if lo > 0:
        side = "higher"
    elif hi < 0:
        side = "lower"
    else:
        return "inconclusive"
    return "agrees" if side == claimed else "disagrees"
