"""The paper claims an experiment can check: the paper's figure, ours with 95% intervals, and a verdict.

A claim is checked only where the experiment has what it needs: a from-scratch DIFF model and a same-preset
baseline (DIFF Transformer claims), an adapter and its base model (Dex, DiffLoRA claims), and the evaluation
suite the claim is about. Every row reads reference → method (baseline → DIFF, base → adapter, LoRA → DiffLoRA)
and holds:

* ``ours``: each model's value with its 95% interval where one exists;
* ``difference``: new − reference with its 95% interval, and ``interval``: what kind of interval it is —
  a paired bootstrap (Student's t below 30 pairs) over the same samples (allocation: both models saw the same
  prompts; retrieval: Newcombe's paired interval on prompts solved), over the
  same text windows (per-window NLL, outliers, quantization), or — when both models were trained with at least
  two ``seeds`` (replicates ``NAME-sSEED``, :func:`seed_groups`) — a Welch t interval over the runs' values;
* ``verdict``: "agrees" / "disagrees" when the difference's interval excludes 0 on the claimed / the other side,
  "inconclusive" when it includes 0 or there is no interval (:func:`diffattn.eval.stats.verdict`). The interval's
  ends are rounded to the digits the row prints first, so a verdict never rests on a difference the reader
  cannot see.

Directions only: the papers' numbers come from billion-parameter models trained on billions of tokens, ours from
miniatures; a miniature can agree or disagree in direction, and a disagreement is reported as such. An interval
over samples of one trained model measures the uncertainty of the data only (another seed would train another
model); rows say so.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..eval.stats import (
    Difference,
    bootstrap_contrast,
    mean_se,
    minimum_detectable_difference,
    newcombe_paired_difference,
    normal_interval,
    paired_difference,
    t_interval,
    unpaired_difference,
    verdict,
    wilson_interval,
)
from ..models.architectures import ARCHITECTURES

NO_PER_SAMPLE = "none: the results hold no per-sample values (rerun the suite to get them)"
ONE_NUMBER = "none: the suite reports one number"


@dataclass
class Claim:
    source: str  # paper and figure/table
    claim: str
    paper: str  # the paper's figure
    ours: str  # "ref → new: metric value [95% CI] → value [95% CI]"
    difference: str  # "+0.021 [+0.010, +0.032]" (new − ref, 95% CI) or "–"
    interval: str  # what kind of interval the difference has (or why there is none)
    verdict: str  # agrees | disagrees | inconclusive
    claimed: str  # the direction of new − ref the paper claims: "higher" | "lower"
    ref: str  # reference model (or what plays its part)
    new: str
    metric: str
    ref_value: float | None = None
    ref_ci: list[float] | None = None
    new_value: float | None = None
    new_ci: list[float] | None = None
    diff_value: float | None = None
    diff_ci: list[float] | None = None
    note: str = ""  # e.g. "data uncertainty only, one seed"
    runs: str = "one run per model"  # "one run per model" or "N vs M seeds": what the verdict is a statement about
    detectable: float | None = None  # over seeds: the smallest |difference| detected with 80% power (Welch)
    ruled_out: float | None = None  # the 95% interval as an equivalence bound: no |difference| larger than this
    cells: str = ""  # which cells / settings of the suite the row reads (e.g. "R = 1 cells N = 1, 2, 4, 6")


# -- helpers -------------------------------------------------------------------------------------------------------
def seed_groups(config) -> dict[str, list[str]]:
    """Every model → the names of its replicate runs: a from-scratch model with ``seeds`` is the group of its
    ``NAME-sSEED`` replicates (``config.seed_groups()``); every other model (no seeds, pretrained, adapters) is a
    group of one. Claims compare groups: with at least two runs on both sides they use the spread over seeds."""
    groups = {g: list(names) for g, names in (config.seed_groups() if hasattr(config, "seed_groups") else {}).items()}
    grouped = {n for names in groups.values() for n in names}
    for name in config.model_names():
        if name not in grouped:
            groups.setdefault(name, [name])
    return groups


def _pairs(config) -> list[tuple[str, str]]:
    """(baseline, DIFF) from-scratch model groups with the same preset (a group: the replicates of one model); a
    DIFF V2 model is paired with the baseline too (the V1 paper's claims, applied to V2: the rows say so)."""
    kinds: dict[str, tuple[str, str]] = {}
    for m in config.models:
        kinds.setdefault(getattr(m, "group_name", m.name), (m.attention, m.preset))
    out = []
    for d, (attention, preset) in kinds.items():
        if ARCHITECTURES[attention].differential:
            for b, (other, other_preset) in kinds.items():
                if not ARCHITECTURES[other].differential and other_preset == preset:
                    out.append((b, d))
                    break
    return out


def _get(evals: dict, name: str, *path):
    node = evals.get(name)
    for key in path:
        if node is None:
            return None
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _ci(interval) -> list[float] | None:
    if interval is None:
        return None
    lo, hi = (float(x) for x in interval)
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


def _value(v: float | None, ci, d: int) -> str:
    if v is None:
        return "–"
    text = f"{v:.{d}f}"
    ci = _ci(ci)
    return f"{text} [{ci[0]:.{d}f}, {ci[1]:.{d}f}]" if ci else text


def _make(
    source: str,
    claim: str,
    paper: str,
    *,
    ref: str,
    new: str,
    metric: str,
    claimed: str,
    digits: int,
    ref_value=None,
    ref_ci=None,
    new_value=None,
    new_ci=None,
    diff: Difference | None = None,
    kind: str = "",
    note: str = "",
    ours: str | None = None,
) -> Claim:
    """A claim row; the verdict comes from ``diff``'s interval at the printed ``digits`` (no interval: inconclusive)."""
    d = digits
    if diff is not None and _ci(diff.interval) is not None:
        lo, hi = _ci(diff.interval)
        difference = f"{diff.estimate:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"
        v = "inconclusive" if round(diff.estimate, d) == 0 else verdict((lo, hi), claimed, digits=d)
        diff_value, diff_ci = float(diff.estimate), [lo, hi]
    else:
        if diff is not None:  # e.g. a single sample or window, or one run per model: no spread to measure
            kind = f"none: too few samples for an interval (n = {diff.n}); {kind}"
        diff_value = None if ref_value is None or new_value is None else float(new_value - ref_value)
        difference = "–" if diff_value is None else f"{diff_value:+.{d}f} (no interval)"
        v, diff_ci = "inconclusive", None
    if ours is None:
        ours = f"{ref} → {new}: {metric} {_value(ref_value, ref_ci, d)} → {_value(new_value, new_ci, d)}"
    return Claim(
        source=source,
        claim=claim,
        paper=paper,
        ours=ours,
        difference=difference,
        interval=kind,
        verdict=v,
        claimed=claimed,
        ref=ref,
        new=new,
        metric=metric,
        ref_value=None if ref_value is None else float(ref_value),
        ref_ci=_ci(ref_ci),
        new_value=None if new_value is None else float(new_value),
        new_ci=_ci(new_ci),
        diff_value=diff_value,
        diff_ci=diff_ci,
        note=note,
    )


def _paired_kind(diff: Difference, what: str) -> str:
    """ "<the interval paired_difference used> over the same <n> <what>" (a bootstrap, or t for few pairs)."""
    name = "paired t" if diff.method.startswith("paired t") else "paired bootstrap"
    return f"{name} over the same {diff.n} {what}"


def _same(a: dict | None, b: dict | None, *keys) -> bool:
    """Whether two results' metadata agree on ``keys`` (all present): the sign that their samples are paired."""
    if not a or not b:
        return False
    return all(a.get(k) is not None and a.get(k) == b.get(k) for k in keys)


# -- val loss / NLL ------------------------------------------------------------------------------------------------
def _per_token_windows(r: dict | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-window mean NLL, tokens) of a ``per_window`` {"nll": sums, "tokens": counts} record."""
    pw = (r or {}).get("per_window")
    if not pw or not pw.get("nll") or len(pw["nll"]) != len(pw.get("tokens", [])):
        return None
    tokens = np.asarray(pw["tokens"], dtype=float)
    if np.any(tokens <= 0):
        return None
    return np.asarray(pw["nll"], dtype=float) / tokens, tokens


def _loss_claim(source, claim, paper, ref, new, claimed, rows, evals, seed) -> Claim | None:
    """One run per model: the val losses have no interval; the ppl suite's per-window NLLs on the same tokens give
    a paired one (data uncertainty only)."""
    lr, ln = rows.get(ref, {}).get("val_loss"), rows.get(new, {}).get("val_loss")
    if not _finite(lr) or not _finite(ln):
        return None
    common = dict(ref=ref, new=new, claimed=claimed, digits=4)
    seeds_note = "one seed"
    pr, pn = _get(evals, ref, "ppl"), _get(evals, new, "ppl")
    wr, wn = _per_token_windows(pr), _per_token_windows(pn)
    paired = (
        wr is not None
        and wn is not None
        and _same(pr.get("metadata"), pn.get("metadata"), "tokens_sha1", "window", "stride")
        and np.array_equal(wr[1], wn[1])
    )
    val = f"val loss {lr:.4f} → {ln:.4f}"
    if paired:
        rv, rci = bootstrap_contrast([wr[0]], sample_weights=[wr[1]], seed=seed)
        nv, nci = bootstrap_contrast([wn[0]], sample_weights=[wn[1]], seed=seed)
        diff = paired_difference(wr[0], wn[0], weights=wr[1], seed=seed)
        return _make(
            source,
            claim,
            paper,
            metric="test NLL/token (ppl suite)",
            ref_value=rv,
            ref_ci=rci,
            new_value=nv,
            new_ci=nci,
            diff=diff,
            kind=_paired_kind(diff, "text windows (token-weighted)"),
            note=f"data uncertainty only, {seeds_note}; {val}",
            **common,
        )
    why = "no per-window NLL of the same text (ppl suite)" if wr is None or wn is None else "different token windows"
    return _make(
        source,
        claim,
        paper,
        metric="val loss",
        ref_value=lr,
        new_value=ln,
        kind=f"none: {seeds_note} and {why}",
        **common,
    )


# -- attention allocation ------------------------------------------------------------------------------------------
def _alloc_claim(source, claim, paper, ref, new, key, claimed, evals, seed) -> Claim | None:
    ar, an = _get(evals, ref, "alloc"), _get(evals, new, "alloc")
    if not ar or not an or key not in ar or key not in an:
        return None
    per_key = {"attention_to_answer": "answer", "attention_noise": "noise"}[key]
    metric = {"attention_to_answer": "attention to answer", "attention_noise": "attention noise"}[key]
    magnitude = all(f"{per_key}_magnitude" in p for p in (ar.get("per_sample") or []) + (an.get("per_sample") or []))
    if magnitude:  # shares of |a|: a signed map cannot meet the claim by cancelling + and − entries of one bucket
        per_key, metric = f"{per_key}_magnitude", f"{metric} (share of |attention|)"
    common = dict(ref=ref, new=new, metric=metric, claimed=claimed, digits=3)
    sr = [p[per_key] for p in ar.get("per_sample") or []]
    sn = [p[per_key] for p in an.get("per_sample") or []]
    if not sr or not sn:
        return _make(source, claim, paper, ref_value=ar[key], new_value=an[key], kind=NO_PER_SAMPLE, **common)
    (rm, rse), (nm, nse) = mean_se(sr), mean_se(sn)
    rci = normal_interval(rm, rse) if math.isfinite(rse) else None
    nci = normal_interval(nm, nse) if math.isfinite(nse) else None
    if len(sr) == len(sn) and _same(ar.get("metadata"), an.get("metadata"), "samples_sha1"):
        diff = paired_difference(sr, sn, seed=seed)
        kind = _paired_kind(diff, "samples; values ± 1.96 SE over samples")
    else:
        diff = unpaired_difference(sr, sn, method="welch")
        kind = f"Welch t over samples ({len(sr)} vs {len(sn)}; unpaired: different prompts); values ± 1.96 SE"
    note = "data uncertainty only, one seed; rows normalised by their sum of absolute values"
    if magnitude:
        note += f"; signed shares {ar[key]:.3f} → {an[key]:.3f}"
    return _make(
        source,
        claim,
        paper,
        ref_value=rm,
        ref_ci=rci,
        new_value=nm,
        new_ci=nci,
        diff=diff,
        kind=kind,
        note=note,
        **common,
    )


# -- needle retrieval ----------------------------------------------------------------------------------------------
def _like_for_like(r: dict | None) -> list[dict]:
    """The grid cells a retrieval claim reads: the R = 1 cells (one queried needle each, so every cell is scored
    alike: solved or not, chance 1/N), or every cell for results that have no R = 1 cell but N = 1."""
    grid = (r or {}).get("grid") or []
    r1 = [g for g in grid if g["R"] == 1]
    return r1 if len(r1) >= 1 else grid


def _cells_text(cells: list[dict]) -> str:
    if all(g["R"] == 1 for g in cells):
        return "R = 1 cells N = " + ", ".join(str(g["N"]) for g in cells)
    return "cells " + ", ".join(f"(N={g['N']}, R={g['R']})" for g in cells)


def _chance_text(cells: list[dict]) -> str:
    return "chance (copying a random needle) " + ", ".join(f"{1 / g['N']:.2f}" for g in cells)


def _grid_scores(r: dict, *, strict: bool = False, cells: list[dict] | None = None) -> list[list[float]] | None:
    key = "strict_scores" if strict else "scores"
    grid = (r.get("grid") or []) if cells is None else cells
    if not grid or any(not g.get(key) for g in grid):
        return None
    return [[float(s) for s in g[key]] for g in grid]


def _grid_solved(r: dict, cells: list[dict] | None = None) -> list[int] | None:
    """Every prompt of the cells (default: the whole grid), 1 if its strict score is 1 (the first R numbers of the
    output are the R queried ones) else 0, in a fixed order; None for results without strict scores."""
    grid = (r.get("grid") or []) if cells is None else cells
    if not grid or any(not g.get("strict_scores") for g in grid):
        return None
    return [int(score == 1.0) for g in grid for score in g["strict_scores"]]


def r1_solved(r: dict | None) -> float | None:
    """One run's like-for-like retrieval number: prompts solved over the R = 1 cells (older results: computed from
    their strict scores; None without them)."""
    if not r:
        return None
    if r.get("r1_solved") is not None:
        return r["r1_solved"]
    hits = _grid_solved(r, _like_for_like(r))
    return float(np.mean(hits)) if hits else None


def _niah_paired(rr: dict, rn: dict) -> bool:
    gr, gn = rr.get("grid") or [], rn.get("grid") or []
    return [(g["N"], g["R"], len(g.get("scores") or [])) for g in gr] == [
        (g["N"], g["R"], len(g.get("scores") or [])) for g in gn
    ] and _same(rr.get("metadata"), rn.get("metadata"), "samples_sha1")


def _niah_mean_claim(source, claim, paper, ref, new, evals, seed) -> Claim | None:
    rr, rn = _get(evals, ref, "niah"), _get(evals, new, "niah")
    if not rr or not rn or rr.get("mean_accuracy") is None or rn.get("mean_accuracy") is None:
        return None
    cells_r, cells_n = _like_for_like(rr), _like_for_like(rn)
    if [(g["N"], g["R"]) for g in cells_r] != [(g["N"], g["R"]) for g in cells_n]:
        cells_r, cells_n = rr.get("grid") or [], rn.get("grid") or []
    row = _niah_cells_claim(source, claim, paper, ref, new, rr, rn, cells_r, cells_n, seed)
    row.cells = _cells_text(cells_r)
    row.note += f"; {row.cells}; {_chance_text(cells_r)}"
    return row


def _niah_cells_claim(source, claim, paper, ref, new, rr, rn, cells_r, cells_n, seed) -> Claim:
    """Prompts solved over the given cells of two NIAH results (Newcombe paired when the prompts are the same)."""
    common = dict(ref=ref, new=new, metric="mean accuracy", claimed="higher", digits=3)
    cr, cn = _grid_scores(rr, cells=cells_r), _grid_scores(rn, cells=cells_n)
    if cr is None or cn is None:
        return _make(
            source,
            claim,
            paper,
            ref_value=rr["mean_accuracy"],
            new_value=rn["mean_accuracy"],
            kind=NO_PER_SAMPLE,
            **common,
        )
    hr, hn = _grid_solved(rr, cells_r), _grid_solved(rn, cells_n)
    if hr is not None and hn is not None and len(hr) == len(hn) and _niah_paired(rr, rn):
        # one binary trial per prompt (solved: its first R numbers are the R queried ones), paired across the two
        # models: Newcombe's interval, which stays honest when few pairs disagree
        diff = newcombe_paired_difference(hr, hn)
        return _make(
            source,
            claim,
            paper,
            ref=ref,
            new=new,
            metric="prompts solved (strict: the first R numbers are the queried ones)",
            claimed="higher",
            digits=3,
            ref_value=float(np.mean(hr)),
            ref_ci=wilson_interval(sum(hr), len(hr)),
            new_value=float(np.mean(hn)),
            new_ci=wilson_interval(sum(hn), len(hn)),
            diff=diff,
            kind=f"Newcombe paired score interval over the same {diff.n} prompts",
            note=(
                "data uncertainty only, one seed; RULER string_match_all mean accuracy "
                f"{rr['mean_accuracy']:.3f} → {rn['mean_accuracy']:.3f}"
            ),
        )
    k_r, k_n = len(cr), len(cn)
    pooled_r, pooled_n = [s for c in cr for s in c], [s for c in cn for s in c]
    rv, nv = float(np.mean(pooled_r)), float(np.mean(pooled_n))  # equal samples per cell: the mean of cell means
    rci, nci = wilson_interval(sum(pooled_r), len(pooled_r)), wilson_interval(sum(pooled_n), len(pooled_n))
    if _niah_paired(rr, rn):
        # equal samples per cell: the mean over all pairs is the difference of the means of cell means
        diff = paired_difference(pooled_r, pooled_n, seed=seed)
        kind = _paired_kind(diff, "samples (all grid cells)")
    else:
        est, ci = bootstrap_contrast(cn + cr, [1 / k_n] * k_n + [-1 / k_r] * k_r, seed=seed)
        diff = Difference(est, ci, "unpaired bootstrap within cells", sum(map(len, cr + cn)))
        kind = "unpaired bootstrap within grid cells (different prompts)"
    return _make(
        source,
        claim,
        paper,
        ref_value=rv,
        ref_ci=rci,
        new_value=nv,
        new_ci=nci,
        diff=diff,
        kind=kind,
        note="data uncertainty only, one seed",
        **common,
    )


def _niah_cell_claim(source, claim, paper, ref, new, n, r, evals, seed) -> Claim | None:
    """One (N, R) cell of the grid — a paper's own cell — scored as per-needle credit (strict) with a paired
    bootstrap over the same prompts; prompts solved beside it in the note."""
    rr, rn = _get(evals, ref, "niah"), _get(evals, new, "niah")
    gr = next((g for g in (rr or {}).get("grid") or [] if (g["N"], g["R"]) == (n, r)), None)
    gn = next((g for g in (rn or {}).get("grid") or [] if (g["N"], g["R"]) == (n, r)), None)
    if gr is None or gn is None or not gr.get("strict_scores") or not gn.get("strict_scores"):
        return None
    sr, sn = gr["strict_scores"], gn["strict_scores"]
    common = dict(ref=ref, new=new, metric=f"per-needle credit (strict) at N={n}, R={r}", claimed="higher", digits=3)
    solved = f"prompts solved {np.mean([s == 1 for s in sr]):.3f} → {np.mean([s == 1 for s in sn]):.3f}"
    note = f"data uncertainty only; cell N={n}, R={r}; {solved}; chance {1 / n:.2f} per needle"
    if len(sr) == len(sn) and _niah_paired(rr, rn):
        diff = paired_difference(sr, sn, seed=seed)
        kind = _paired_kind(diff, "prompts")
    else:
        diff = unpaired_difference(sr, sn, method="bootstrap", seed=seed)
        kind = "unpaired bootstrap (different prompts)"
    row = _make(
        source, claim, paper,
        ref_value=float(np.mean(sr)), ref_ci=wilson_interval(sum(sr), len(sr)),
        new_value=float(np.mean(sn)), new_ci=wilson_interval(sum(sn), len(sn)),
        diff=diff, kind=kind, note=note, **common,
    )  # fmt: skip
    row.cells = f"cell N={n}, R={r}"
    return row


def _niah_heatmap_claim(source, claim, paper, ref, new, evals, seed) -> Claim | None:
    """DIFF Fig. 5: the length × depth heatmap (N needles, R = 1), every cell pooled, strict scores where the
    results have them; Newcombe's paired interval over the same prompts."""
    rr, rn = _get(evals, ref, "niah"), _get(evals, new, "niah")
    hr, hn = (rr or {}).get("heatmap") or {}, (rn or {}).get("heatmap") or {}
    if not hr.get("lengths") or hr.get("lengths") != hn.get("lengths") or hr.get("N") != hn.get("N"):
        return None
    key = "strict_scores" if hr.get("strict_scores") and hn.get("strict_scores") else "scores"
    flat = lambda h: [int(s == 1.0) for row in h[key] for cell in row for s in cell]  # noqa: E731
    sr, sn = flat(hr), flat(hn)
    if not sr or len(sr) != len(sn) or not _niah_paired(rr, rn):
        return None
    diff = newcombe_paired_difference(sr, sn)
    row = _make(
        source, claim, paper, ref=ref, new=new, metric=f"heatmap prompts solved (N={hr['N']}, R=1)",
        claimed="higher", digits=3,
        ref_value=float(np.mean(sr)), ref_ci=wilson_interval(sum(sr), len(sr)),
        new_value=float(np.mean(sn)), new_ci=wilson_interval(sum(sn), len(sn)),
        diff=diff, kind=f"Newcombe paired score interval over the same {diff.n} prompts",
        note=f"data uncertainty only; lengths {hr['lengths']} × {len(hr['depths'])} depths, "
        f"{'strict' if key == 'strict_scores' else 'string_match_all'} scores; chance {1 / hr['N']:.2f}",
    )  # fmt: skip
    row.cells = f"heatmap N={hr['N']}, R=1, lengths {hr['lengths']}"
    return row


def _niah_gap_claim(source, claim, paper, ref, new, evals, seed) -> Claim | None:
    rr, rn = _get(evals, ref, "niah"), _get(evals, new, "niah")
    gr, gn = _like_for_like(rr), _like_for_like(rn)  # like with like: R = 1 cells, all-or-nothing at every N
    if len(gr) < 2 or [(g["N"], g["R"]) for g in gr] != [(g["N"], g["R"]) for g in gn]:
        return None
    lo = min(range(len(gr)), key=lambda i: gr[i]["N"])
    hi = max(range(len(gr)), key=lambda i: gr[i]["N"])
    n_lo, n_hi = gr[lo]["N"], gr[hi]["N"]
    common = dict(ref=f"N={n_lo}", new=f"N={n_hi}", metric=f"accuracy gap {new} − {ref}", claimed="higher", digits=2)
    gap_lo = gn[lo]["accuracy"] - gr[lo]["accuracy"]
    gap_hi = gn[hi]["accuracy"] - gr[hi]["accuracy"]
    cr, cn = _grid_scores(rr, strict=True, cells=gr), _grid_scores(rn, strict=True, cells=gn)
    scoring = "strict scores (first R numbers)"
    if cr is None or cn is None:
        cr, cn = _grid_scores(rr, cells=gr), _grid_scores(rn, cells=gn)
        scoring = "RULER string_match_all scores"
    if cr is None or cn is None:
        ours = f"{ref} → {new}: gap {gap_lo:+.2f} at N={n_lo} → {gap_hi:+.2f} at N={n_hi}"
        return _make(source, claim, paper, ref_value=gap_lo, new_value=gap_hi, kind=NO_PER_SAMPLE, ours=ours, **common)
    if _niah_paired(rr, rn):
        d_lo = np.asarray(cn[lo]) - np.asarray(cr[lo])
        d_hi = np.asarray(cn[hi]) - np.asarray(cr[hi])
        lo_v, lo_ci = bootstrap_contrast([d_lo], seed=seed)
        hi_v, hi_ci = bootstrap_contrast([d_hi], seed=seed)
        est, ci = bootstrap_contrast([d_hi, d_lo], [1.0, -1.0], seed=seed)
        kind = f"paired bootstrap within the two cells ({d_lo.size} + {d_hi.size} samples)"
    else:
        lo_v, lo_ci = bootstrap_contrast([cn[lo], cr[lo]], [1.0, -1.0], seed=seed)
        hi_v, hi_ci = bootstrap_contrast([cn[hi], cr[hi]], [1.0, -1.0], seed=seed)
        est, ci = bootstrap_contrast([cn[hi], cr[hi], cn[lo], cr[lo]], [1.0, -1.0, -1.0, 1.0], seed=seed)
        kind = "unpaired bootstrap within the two cells (different prompts)"
    diff = Difference(est, ci, kind, 0)
    ours = f"{ref} → {new}: gap {_value(lo_v, lo_ci, 2)} at N={n_lo} → {_value(hi_v, hi_ci, 2)} at N={n_hi}"
    row = _make(
        source,
        claim,
        paper,
        ref_value=lo_v,
        ref_ci=lo_ci,
        new_value=hi_v,
        new_ci=hi_ci,
        diff=diff,
        kind=f"{kind} of {scoring}; difference = gap at the largest N − gap at the smallest",
        ours=ours,
        note=f"data uncertainty only, one seed; {_cells_text(gr)}; {_chance_text(gr)}",
        **common,
    )
    row.cells = f"{_cells_text([gr[lo], gr[hi]])}"
    # the paper's claim is a gap in DIFF's favour that grows with N: growth that only undoes a deficit at small N
    # (the gap at the largest N not above zero) does not agree with it
    if row.verdict == "agrees" and (hi_ci is None or round(float(hi_ci[0]), 2) <= 0):
        row.verdict = "inconclusive"
        row.note += f"; the gap grows but {new} is not ahead at N={n_hi}"
    return row


# -- outliers, quantization, ICL order -----------------------------------------------------------------------------
def _outlier_claim(source, claim, paper, ref, new, which, label, evals, seed) -> Claim | None:
    orr, on = _get(evals, ref, "outliers"), _get(evals, new, "outliers")
    vr, vn = _get(evals, ref, "outliers", which, "top1"), _get(evals, new, "outliers", which, "top1")
    if vr is None or vn is None:
        return None
    common = dict(ref=ref, new=new, metric=f"top-1 {label}", claimed="lower", digits=2)
    wr = (orr.get("per_window") or {}).get(f"{which}_top1")
    wn = (on.get("per_window") or {}).get(f"{which}_top1")
    headline = f"{ref} → {new}: top-1 {label} {vr:.2f} → {vn:.2f}"
    if not wr or not wn:
        return _make(source, claim, paper, ref_value=vr, new_value=vn, kind=NO_PER_SAMPLE, ours=headline, **common)
    if len(wr) != len(wn) or not _same(orr.get("metadata"), on.get("metadata"), "tokens_sha1", "seq_len"):
        return _make(
            source,
            claim,
            paper,
            ref_value=vr,
            new_value=vn,
            ours=headline,
            kind="none: the two models saw different token windows (another tokenizer)",
            **common,
        )
    rm, rci = bootstrap_contrast([wr], seed=seed)
    nm, nci = bootstrap_contrast([wn], seed=seed)
    diff = paired_difference(wr, wn, seed=seed)
    ours = f"{headline}; mean per-window top-1 {_value(rm, rci, 2)} → {_value(nm, nci, 2)}"
    return _make(
        source,
        claim,
        paper,
        ref_value=rm,
        ref_ci=rci,
        new_value=nm,
        new_ci=nci,
        diff=diff,
        ours=ours,
        kind=_paired_kind(diff, "text windows, of the mean per-window top-1 (the overall top-1 has no interval)"),
        note="data uncertainty only, one seed",
        **common,
    )


def _quant_windows(r: dict | None):
    """(lowest width, per-window NLL/token at 16 bits and at the lowest width, tokens) or None."""
    rows = (r or {}).get("quantization") or []
    by_bits = {q["bits"]: q for q in rows}
    if 16 not in by_bits or min(by_bits) >= 16:
        return None
    low = min(by_bits)
    w16, wlo = _per_token_windows(by_bits[16]), _per_token_windows(by_bits[low])
    if w16 is None or wlo is None or not np.array_equal(w16[1], wlo[1]):
        return low, None
    return low, (w16[0], wlo[0], w16[1])


def _quant_drop(r: dict | None) -> float | None:
    rows = (r or {}).get("quantization") or []
    by_bits = {q["bits"]: q["nll"] for q in rows}
    if 16 not in by_bits or min(by_bits) >= 16:
        return None
    return by_bits[min(by_bits)] - by_bits[16]


def _quant_claim(source, claim, paper, ref, new, evals, seed) -> Claim | None:
    qr, qn = _get(evals, ref, "quant"), _get(evals, new, "quant")
    dr, dn = _quant_drop(qr), _quant_drop(qn)
    if dr is None or dn is None:
        return None
    wr, wn = _quant_windows(qr), _quant_windows(qn)
    metric = f"NLL increase at {min(wr[0], wn[0])} bits"
    common = dict(ref=ref, new=new, metric=metric, claimed="lower", digits=4)
    if wr[1] is None or wn[1] is None:
        return _make(source, claim, paper, ref_value=dr, new_value=dn, kind=NO_PER_SAMPLE, **common)
    (r16, rlo, tok_r), (n16, nlo, tok_n) = wr[1], wn[1]
    if (
        wr[0] != wn[0]
        or not np.array_equal(tok_r, tok_n)
        or not _same(qr.get("metadata"), qn.get("metadata"), "tokens_sha1", "seq_len")
    ):
        return _make(
            source,
            claim,
            paper,
            ref_value=dr,
            new_value=dn,
            kind="none: the two models saw different token windows or widths",
            **common,
        )
    ref_d = paired_difference(r16, rlo, weights=tok_r, seed=seed)
    new_d = paired_difference(n16, nlo, weights=tok_n, seed=seed)
    diff = paired_difference(rlo - r16, nlo - n16, weights=tok_r, seed=seed)
    return _make(
        source,
        claim,
        paper,
        ref_value=ref_d.estimate,
        ref_ci=ref_d.interval,
        new_value=new_d.estimate,
        new_ci=new_d.interval,
        diff=diff,
        kind=_paired_kind(diff, "text windows (token-weighted)"),
        note="data uncertainty only, one seed; perplexity stands in for the paper's HellaSwag",
        **common,
    )


def _icl_shots_claim(source, claim, paper, ref, new, evals, seed) -> Claim | None:
    """DIFF Fig. 6: many-shot accuracy at the largest shot count both models ran, paired over the same draws
    (the same demonstrations and test items); a row whose models are both at chance says so."""
    mr, mn = _get(evals, ref, "icl", "many_shot"), _get(evals, new, "icl", "many_shot")
    if not mr or not mn:
        return None
    common_shots = sorted(set(mr["shots"]) & set(mn["shots"]))
    if not common_shots:
        return None
    k = common_shots[-1]
    ar, an = mr["accuracy"][mr["shots"].index(k)], mn["accuracy"][mn["shots"].index(k)]
    labels = len(mr.get("labels") or []) or 1
    chance = 1 / labels
    diff = paired_difference(ar, an, seed=seed) if len(ar) == len(an) else unpaired_difference(ar, an)
    note = f"data uncertainty only; {k} shots, {len(ar)} draws; chance {chance:.2f} (1 / {labels} labels)"
    if max(np.mean(ar), np.mean(an)) <= chance:
        note += "; both models at or below chance: this scale cannot test the claim"
    row = _make(
        source, claim, paper, ref=ref, new=new, metric=f"accuracy at {k} shots", claimed="higher", digits=3,
        ref_value=float(np.mean(ar)), new_value=float(np.mean(an)), diff=diff,
        kind=_paired_kind(diff, "draws of demonstrations") if len(ar) == len(an) else "Welch t over draws",
        note=note,
    )  # fmt: skip
    row.cells = f"{k} shots"
    return row


def _heads_claim(source, claim, paper, ref, new, key, claimed, evals) -> Claim | None:
    """A head statistic of the heads suite (e.g. linear CKA between head outputs, Dex Fig. 11b): one number per
    model (an average over layers and text windows), so one run has no interval."""
    vr, vn = _get(evals, ref, "heads", "summary", key), _get(evals, new, "heads", "summary", key)
    if not _finite(vr) or not _finite(vn):
        return None
    return _make(
        source, claim, paper, ref=ref, new=new, metric=f"head {key} (mean over layers)", claimed=claimed, digits=3,
        ref_value=vr, new_value=vn, kind=ONE_NUMBER + " (mean over layers and windows)",
    )  # fmt: skip


def _icl_claim(source, claim, paper, ref, new, evals) -> Claim | None:
    mr = _get(evals, ref, "icl", "order_robustness", "arrangements", "random", "margin")
    mn = _get(evals, new, "icl", "order_robustness", "arrangements", "random", "margin")
    if mr is None or mn is None:
        return None
    return _make(
        source,
        claim,
        paper,
        ref=ref,
        new=new,
        metric="order margin (random)",
        claimed="lower",
        digits=3,
        ref_value=mr,
        new_value=mn,
        kind=ONE_NUMBER + " (best − worst over permutations)",
    )


# -- replicate seeds ----------------------------------------------------------------------------------------------
def _over_seeds(source, claim, paper, ref, new, ref_vals, new_vals, *, metric, claimed, digits) -> Claim:
    """Groups of replicate runs: each side's mean with its t interval, the difference with Welch's interval, and
    what the comparison could see: the smallest difference it detects with 80% power from the measured spread,
    and the interval read as an equivalence bound (no difference larger than its farther end)."""
    (rm, rci), (nm, nci) = t_interval(ref_vals), t_interval(new_vals)
    diff = unpaired_difference(ref_vals, new_vals, method="welch")
    sd_r, sd_n = float(np.std(ref_vals, ddof=1)), float(np.std(new_vals, ddof=1))
    mdd = minimum_detectable_difference(sd_r, len(ref_vals), sd_n, len(new_vals))
    ci = _ci(diff.interval)
    bound = max(abs(ci[0]), abs(ci[1])) if ci else None
    power = f"SD over seeds {sd_r:.{digits}f} / {sd_n:.{digits}f}; 80% power to detect |difference| ≥ {mdd:.{digits}f}"
    if bound is not None:
        power += f"; the interval rules out |difference| > {bound:.{digits}f}"
    row = _make(
        source,
        claim,
        paper,
        ref=ref,
        new=new,
        metric=f"{metric} (mean over seeds)",
        claimed=claimed,
        digits=digits,
        ref_value=rm,
        ref_ci=rci,
        new_value=nm,
        new_ci=nci,
        diff=diff,
        kind=f"Welch t over seeds ({len(ref_vals)} vs {len(new_vals)} runs): spread over training runs",
        note=f"seeds: run-to-run variation included; {power}",
    )
    row.runs, row.detectable, row.ruled_out = f"{len(ref_vals)} vs {len(new_vals)} seeds", mdd, bound
    return row


def _ahead_at_largest_n(row: Claim | None, groups, base: str, diff: str, evals) -> Claim | None:
    """Over seeds, the gap claim agrees only when DIFF is also ahead at the largest N (Welch over the runs'
    accuracies there), as :func:`_niah_gap_claim` requires of one run."""
    if row is None or row.verdict != "agrees" or "over seeds" not in row.interval:
        return row

    def at_largest(name):
        grid = _like_for_like(_get(evals, name, "niah"))
        if not grid:
            return None
        hi = max(grid, key=lambda g: g["N"])
        return _first(hi.get("strict_accuracy"), hi.get("accuracy"))

    rv = [v for v in map(at_largest, groups.get(base, [base])) if _finite(v)]
    nv = [v for v in map(at_largest, groups.get(diff, [diff])) if _finite(v)]
    ahead = unpaired_difference(rv, nv, method="welch")
    if verdict(_ci(ahead.interval) or (-math.inf, math.inf), "higher", digits=2) != "agrees":
        row.verdict = "inconclusive"
        row.note += f"; the gap grows but {diff} is not ahead at the largest N over seeds ({ahead.estimate:+.2f})"
    return row


def _cell_value(r: dict | None, n: int, rr: int) -> float | None:
    """One run's per-needle credit (strict) in the (N, R) cell, None when the grid lacks it."""
    g = next((g for g in (r or {}).get("grid") or [] if (g["N"], g["R"]) == (n, rr)), None)
    return None if g is None else _first(g.get("strict_accuracy"), g.get("accuracy"))


def _heatmap_solved(r: dict | None) -> float | None:
    h = (r or {}).get("heatmap") or {}
    scores = h.get("strict_scores") or h.get("scores")
    if not h.get("lengths") or not scores:
        return None
    return float(np.mean([s == 1.0 for row in scores for cell in row for s in cell]))


def _icl_at_largest(m: dict | None) -> float | None:
    return None if not m or not m.get("mean") else m["mean"][-1]


def _first(*values):
    """The first value that is not None (e.g. a newer metric, then the one older results have)."""
    return next((v for v in values if v is not None), None)


def _grid_growth(r: dict | None) -> float | None:
    """Accuracy at the largest N minus at the smallest N of a NIAH grid's like-for-like (R = 1) cells (one run's
    part of the gap's growth)."""
    grid = _like_for_like(r)
    if len(grid) < 2:
        return None
    lo, hi = min(grid, key=lambda g: g["N"]), max(grid, key=lambda g: g["N"])
    key = "strict_accuracy" if "strict_accuracy" in lo and "strict_accuracy" in hi else "accuracy"
    return hi[key] - lo[key]


def _dispatch(groups, ref, new, per_run, single, **spec) -> Claim | None:
    """A claim between two models or two groups of replicates: with at least two runs with a value on both sides,
    the spread over seeds (``per_run(name)`` gives one run's value); otherwise ``single(ref_run, new_run)`` on the
    first run of each group (intervals over samples: data uncertainty only)."""
    ref_runs, new_runs = groups.get(ref, [ref]), groups.get(new, [new])
    if len(ref_runs) >= 2 and len(new_runs) >= 2:
        rv = [v for v in map(per_run, ref_runs) if _finite(v)]
        nv = [v for v in map(per_run, new_runs) if _finite(v)]
        if len(rv) >= 2 and len(nv) >= 2:
            return _over_seeds(spec.pop("source"), spec.pop("claim"), spec.pop("paper"), ref, new, rv, nv, **spec)
    return single(ref_runs[0], new_runs[0])


# -- the claims ----------------------------------------------------------------------------------------------------
def paper_claims(config, rows: dict[str, dict], evals: dict[str, dict], *, groups=None, seed: int = 0) -> list[Claim]:
    """Every claim the experiment can check (see the module doc). ``rows``: the report's model rows (``val_loss``);
    ``evals``: {model: {suite: results}}; ``groups``: replicate runs per model (default :func:`seed_groups`);
    ``seed``: of every bootstrap (deterministic)."""
    groups = seed_groups(config) if groups is None else groups
    claims: list[Claim | None] = []

    def loss(source, claim, paper, ref, new, claimed):
        return _dispatch(
            groups,
            ref,
            new,
            lambda n: rows.get(n, {}).get("val_loss"),
            lambda r, n: _loss_claim(source, claim, paper, r, n, claimed, rows, evals, seed),
            source=source, claim=claim, paper=paper, metric="val loss", claimed=claimed, digits=4,
        )  # fmt: skip

    def alloc(source, claim, paper, ref, new, key, claimed):
        metric = {"attention_to_answer": "attention to answer", "attention_noise": "attention noise"}[key]
        return _dispatch(
            groups,
            ref,
            new,
            lambda n: _first(_get(evals, n, "alloc", f"{key}_magnitude"), _get(evals, n, "alloc", key)),
            lambda r, n: _alloc_claim(source, claim, paper, r, n, key, claimed, evals, seed),
            source=source, claim=claim, paper=paper, metric=f"{metric} (share of |attention|)", claimed=claimed,
            digits=3,
        )  # fmt: skip

    def niah_mean(source, claim, paper, ref, new):
        return _dispatch(
            groups,
            ref,
            new,
            lambda n: r1_solved(_get(evals, n, "niah")),
            lambda r, n: _niah_mean_claim(source, claim, paper, r, n, evals, seed),
            source=source, claim=claim, paper=paper, metric="prompts solved over the R = 1 cells", claimed="higher",
            digits=3,
        )  # fmt: skip

    def pair_claim(base, diff, source, claim, paper, per_run, single, **spec):
        """A DIFF claim of one (baseline, DIFF) pair: over seeds ``per_run(run)``; with one run each
        ``single(source, claim, paper, ref_run, new_run)`` (see :func:`_dispatch`)."""
        return _dispatch(
            groups, base, diff, per_run, lambda r, n: single(source, claim, paper, r, n),
            source=source, claim=claim, paper=paper, **spec,
        )  # fmt: skip

    claims_labels = {getattr(m, "group_name", m.name): ARCHITECTURES[m.attention].claims_label for m in config.models}
    for base, diff in _pairs(config):
        first = len(claims)
        claims += [
            loss(
                "DIFF Transformer Fig. 3–4",
                "lower language-modelling loss than a same-size Transformer",
                "DIFF needs ~62–65% of the parameters or tokens for the same loss",
                base, diff, "lower",
            ),
            alloc(
                "DIFF Transformer Table 3",
                "more attention to the answer",
                "answer 0.03 → 0.27–0.40",
                base, diff, "attention_to_answer", "higher",
            ),
            alloc(
                "DIFF Transformer Table 3",
                "less attention noise",
                "noise 0.51 → 0.01–0.02",
                base, diff, "attention_noise", "lower",
            ),
            niah_mean(
                "DIFF Transformer Table 2",
                "better multi-needle retrieval",
                "N=6, R=2: 0.35 (Transformer) vs 0.85 (DIFF)",
                base, diff,
            ),
        ]  # fmt: skip
        pair = functools.partial(pair_claim, base, diff)

        claims += [
            pair(
                "DIFF Transformer Table 2", "better retrieval in the paper's own cell", "N=6, R=2: 0.35 vs 0.85",
                lambda n: _cell_value(_get(evals, n, "niah"), 6, 2),
                lambda *a: _niah_cell_claim(*a, 6, 2, evals, seed),
                metric="per-needle credit at N=6, R=2", claimed="higher", digits=3,
            ),
            pair(
                "DIFF Transformer Fig. 5", "better retrieval across context lengths and depths",
                "DIFF near-perfect across 4K–64K and all depths; the Transformer degrades",
                lambda n: _heatmap_solved(_get(evals, n, "niah")),
                lambda *a: _niah_heatmap_claim(*a, evals, seed),
                metric="heatmap prompts solved", claimed="higher", digits=3,
            ),
            pair(
                "DIFF Transformer Fig. 6", "better many-shot in-context learning",
                "+5.2 to +21.6 points at 64K-token prompts",
                lambda n: _icl_at_largest(_get(evals, n, "icl", "many_shot")),
                lambda *a: _icl_shots_claim(*a, evals, seed),
                metric="accuracy at the largest shot count", claimed="higher", digits=3,
            ),
        ]  # fmt: skip
        gap = pair(
            "DIFF Transformer Table 2", "the retrieval gap grows with the number of needles N",
            "gap 0.00 at N=1 → 0.07, 0.22, 0.50 at N=2, 4, 6",
            lambda n: _grid_growth(_get(evals, n, "niah")),
            lambda *a: _niah_gap_claim(*a, evals, seed),
            claimed="higher", digits=2,
            metric="accuracy at the largest N − at the smallest N (difference = growth of the gap)",
        )  # fmt: skip
        claims.append(_ahead_at_largest_n(gap, groups, base, diff, evals))
        for which, label, claim, paper in (
            ("attention_logits", "|logit|", "smaller attention-logit outliers", "top-1 |logit| 318.0 vs 38.8"),
            ("hidden_states", "|hidden|", "smaller hidden-state outliers", "top-1 |hidden| 3608.6 vs 1688.2"),
        ):
            claims.append(
                pair(
                    "DIFF Transformer Table 5", claim, paper,
                    lambda n, w=which: _get(evals, n, "outliers", w, "top1"),
                    lambda s, c, p, r, n, w=which, lb=label: _outlier_claim(s, c, p, r, n, w, lb, evals, seed),
                    metric=f"top-1 {label}", claimed="lower", digits=2,
                )
            )  # fmt: skip
        claims += [
            pair(
                "DIFF Transformer Fig. 8", "degrades less when attention logits go to low bits",
                "at 4 bits DIFF keeps most of its accuracy, the Transformer loses much more",
                lambda n: _quant_drop(_get(evals, n, "quant")),
                lambda *a: _quant_claim(*a, evals, seed),
                metric="NLL increase at the lowest width", claimed="lower", digits=4,
            ),
            pair(
                "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
                "TREC margin 19.0 vs 4.0 (random order)",
                lambda n: _get(evals, n, "icl", "order_robustness", "arrangements", "random", "margin"),
                lambda *a: _icl_claim(*a, evals),
                metric="order margin (random)", claimed="lower", digits=3,
            ),
        ]  # fmt: skip
        if claims_labels[diff]:  # the DIFF V1 paper's claims measured on another architecture: the source says so
            claims[first:] = [c and replace(c, source=f"{c.source} ({claims_labels[diff]})") for c in claims[first:]]
    from ..adapters.registry import get_method

    for a in config.adapters:  # each method's own paper claims (its registry entry)
        for pc in get_method(a.method).paper_claims:
            if pc.reference == "base":
                references = [a.base]
            elif pc.reference == "lambda0":  # the model's own effective attention at λ = 0, as a pseudo-model
                reference = f"{a.name} at λ = 0"
                own = _get(evals, a.name, "alloc", "lambda0_reference")
                if own is None:
                    continue
                evals = {**evals, reference: {"alloc": {**own, "metadata": _get(evals, a.name, "alloc", "metadata")}}}
                references = [reference]
            else:  # another method trained on the same base (DiffLoRA against LoRA)
                references = [x.name for x in config.adapters if x.method == pc.reference and x.base == a.base]
            for ref in references:
                if pc.measure == "loss":
                    claims.append(loss(pc.source, pc.claim, pc.paper, ref, a.name, pc.claimed))
                elif pc.measure == "niah":
                    claims.append(niah_mean(pc.source, pc.claim, pc.paper, ref, a.name))
                elif pc.measure.startswith("heads:"):
                    key = pc.measure.removeprefix("heads:")
                    claims.append(_heads_claim(pc.source, pc.claim, pc.paper, ref, a.name, key, pc.claimed, evals))
                else:
                    key = pc.measure.removeprefix("alloc:")
                    claims.append(alloc(pc.source, pc.claim, pc.paper, ref, a.name, key, pc.claimed))
    return [c for c in claims if c is not None]


# The seed-to-seed spread of the claims' metrics, measured on this project's CPU (pooled within-model SD over the
# replicate runs of the committed multi-seed experiments, results/mini-scratch and results/mini-scratch-v2: 3 seeds
# per model, 7 models, df 10). A single-run report quotes it, so a reader sees when a difference between two single
# runs is smaller than what a second seed would move. Rebuilt from the seed experiments as they land.
SEED_SPREAD = {
    "validation loss (75% retrieval mix)": 0.086,
    "strict retrieval accuracy": 0.21,
    "attention to the answer (|a| share)": 0.11,
    "attention noise (|a| share)": 0.13,
    "top-1 |attention logit|": 7.2,
    "top-1 |hidden state|": 121.0,
}
SEED_SPREAD_SOURCE = "results/mini-scratch and results/mini-scratch-v2 (quick models, 3 seeds each)"


def claims_scope(config, rows: dict[str, dict] | None = None, evals: dict[str, dict] | None = None) -> str:
    """A paragraph, in plain words, on what this experiment's scale can and cannot show."""
    rows, evals = rows or {}, evals or {}
    presets = sorted({m.preset for m in config.models})
    steps = sorted({r["steps"] for r in rows.values() if isinstance(r.get("steps"), int)})
    samples = config.eval.options.get("samples")
    tokens = config.eval.options.get("tokens")
    groups = seed_groups(config)
    seeds = max((len(g) for g in groups.values()), default=1)
    size = f"{'/'.join(presets)} preset models" if presets else "small models"
    trained = (
        f" trained for {steps[0]}–{steps[-1]} steps"
        if steps and steps[0] != steps[-1]
        else (f" trained for {steps[0]} steps" if steps else "")
    )
    measured = []
    if samples is not None:
        measured.append(
            f"{samples} sample{'s' if samples != 1 else ''} per retrieval cell and for attention allocation"
        )
    if tokens is not None:
        measured.append(f"{tokens} tokens for perplexity, outliers and quantization")
    measured_text = f" measured on {' and '.join(measured)}" if measured else ""
    return (
        f"What this can show: these are {size}{trained} (minutes of CPU, not the papers' billions of parameters and "
        f"tokens),{measured_text}. They can show the *direction* of a difference when it is large next to the "
        "sampling noise; they cannot reproduce the papers' magnitudes, and the papers' figures are there for "
        "orientation only. Each verdict reads the 95% interval of the difference (new − reference): "
        '"agrees" or "disagrees" only when the whole interval lies on one side of zero at the printed precision; '
        '"inconclusive" means the interval includes no difference — not that the models are equal; more samples '
        "or seeds narrow it. Intervals over samples or text windows of one trained model are data uncertainty only: "
        + (
            "each model was trained once (one seed), so run-to-run variation of training is not in them: every "
            "verdict is a statement about this one training draw. Measured seed-to-seed SD of these metrics on this "
            f"CPU ({SEED_SPREAD_SOURCE}): "
            + "; ".join(f"{k} {v:g}" for k, v in SEED_SPREAD.items())
            + ". A single-run difference smaller than about twice these is within what a second seed would move."
            if seeds < 2
            else f"training's run-to-run variation is not in them. Rows whose interval says 'seeds' use the spread "
            f"over up to {seeds} replicate runs instead, which includes it (few runs: wide intervals)."
        )
    )


def claims_markdown(claims: list[Claim], scope: str | None = None) -> list[str]:
    if not claims:
        return ["No paper claim applies to the models and suites of this experiment.", ""]
    lines = [
        "| source | claim | paper | ours (95% CI) | difference (95% CI) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    mark = {"agrees": "agrees", "disagrees": "**disagrees**", "inconclusive": "inconclusive"}
    for c in claims:
        extra = "; ".join(x for x in (c.interval, c.note) if x)
        diff = f"{c.difference}<br><small>{extra}</small>" if extra else c.difference
        said = mark[c.verdict] + f"<br><small>{c.runs}</small>"
        if c.verdict == "inconclusive" and c.ruled_out is not None:
            said += f"<br><small>no difference larger than {c.ruled_out:.3g}</small>"
        cells = [c.source, c.claim, c.paper, c.ours, diff, said]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")  # |logit| inside a cell
    lines += [
        "",
        "Differences are new − reference; a claim of *lower* agrees when the whole interval is below zero. "
        "Attention shares divide every head's row by its sum of absolute values (signed two-map and Dex maps can "
        "hold negative attention, reported apart as negative mass), so a bucket's share lies in [−1, 1]. "
        "Under each verdict: what it is a statement about — *one run per model* (a statement about that training "
        "draw only: a second seed can move it, see the spread below) or the seeds compared; over seeds, an "
        "inconclusive row says the largest difference its interval leaves open.",
    ]
    if scope:
        lines += ["", scope]
    return [*lines, ""]


def claims_json(claims: list[Claim]) -> list[dict]:
    return [asdict(c) for c in claims]
