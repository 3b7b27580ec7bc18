"""The paper claims an experiment can check: the paper's figure, ours with 95% intervals, and a verdict.

Claims are data (:class:`~diffattn.paper_claim.PaperClaim`: a source, the paper's figure, a measure a suite
names, a reference and a direction): the DIFF Transformer claims in the suite that measures them (``Suite.claims``,
gathered by :func:`claim_table`), each method's in its registry entry. This module is the engine that checks them:
it finds the pairs each claim compares, reads the measure (``Suite.measures`` in :mod:`diffattn.eval`) and turns
the comparison into a row with a verdict.

A claim is checked only where the experiment has what it needs: a from-scratch DIFF model and a same-preset
baseline (DIFF Transformer claims), an adapter and its base model (Dex, DiffLoRA claims), and the evaluation
suite the claim is about. Every row reads reference → method (baseline → DIFF, base → adapter, LoRA → DiffLoRA)
and holds:

* ``ours``: each model's value with its 95% interval where one exists;
* ``difference``: new − reference with its 95% interval, and ``interval``: what kind of interval it is —
  a paired bootstrap (Student's t below 30 pairs) over the same samples (allocation: both models saw the same
  prompts; retrieval: the exact McNemar interval on prompts solved), over the
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

from dataclasses import asdict, dataclass, replace

import numpy as np

from ..adapters.registry import get_method
from ..eval.measures import (
    TEXT_SHARE,
    Measure,
    PaperClaim,
    Run,
    clears_floor,
    finite,
    interval,
    over_seeds_measure,
    shared_items,
    value_text,
)
from ..eval.stats import (
    NO_SPREAD,
    WELCH_EXACTLY,
    Difference,
    minimum_detectable_difference,
    seeds_items_difference,
    seeds_items_mean,
    t_interval,
    unpaired_difference,
    verdict,
)
from ..models.architectures import ARCHITECTURES
from ..models.presets import get_preset


def claim_table() -> list[PaperClaim]:
    """The DIFF Transformer claims checked for every from-scratch differential model against its same-preset
    standard model: each suite's own (``Suite.claims``, in the suite table's order), then those registered here."""
    from ..eval.suite import SUITE_TABLE

    return [*(c for suite in SUITE_TABLE.values() for c in suite.claims), *_REGISTERED]


_REGISTERED: list[PaperClaim] = []  # claims added with register_claims (a suite's own go in its Suite entry)


def register_claims(*claims: PaperClaim) -> None:
    """Add claims that every from-scratch differential model is checked for against its baseline, outside any
    suite (a suite's own claims go in its ``Suite(claims=...)`` entry, a method's in its registry entry)."""
    for c in claims:
        if c.reference != "baseline":
            raise ValueError(f"{c.source}: claims of the table compare with the 'baseline'; got {c.reference!r}")
    _REGISTERED.extend(claims)


def unregister_claims(*claims: PaperClaim) -> None:
    """Remove claims added with :func:`register_claims`."""
    for c in claims:
        _REGISTERED.remove(c)


def measure(name: str) -> Measure:
    """The measure ``name`` of the suite table (one clear error naming the known ones)."""
    from ..eval.suite import SUITE_TABLE

    known = {n: m for suite in SUITE_TABLE.values() for n, m in suite.measures.items()}
    if name not in known:
        raise ValueError(f"no suite measures {name!r}; the suites' measures: {', '.join(known)}")
    return known[name]


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


# -- pairs -------------------------------------------------------------------------------------------------------
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
    DIFF V2 model is paired with the baseline too (the V1 paper's claims, applied to V2: the rows say so). Every
    same-preset baseline is a reference: a second one (the Transformer with half the heads, DIFF Table 6's
    control) gets its own rows, baseline by baseline."""
    kinds: dict[str, tuple[str, str]] = {}
    for m in config.models:
        kinds.setdefault(getattr(m, "group_name", m.name), (m.attention, m.preset))
    baselines = [(b, p) for b, (a, p) in kinds.items() if not ARCHITECTURES[a].differential]
    out = []
    for b, preset in baselines:
        for d, (attention, other_preset) in kinds.items():
            if ARCHITECTURES[attention].differential and other_preset == preset:
                out.append((b, d))
    return out


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
    if diff is not None and interval(diff.interval) is not None:
        lo, hi = interval(diff.interval)
        difference = f"{diff.estimate:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"
        v = "inconclusive" if round(diff.estimate, d) == 0 else verdict((lo, hi), claimed, digits=d)
        diff_value, diff_ci = float(diff.estimate), [lo, hi]
    else:
        if diff is not None:  # e.g. a single sample or window, or one run per model: no spread to measure
            why = "no spread to read a width from" if "no spread" in diff.method else "too few samples for an interval"
            kind = f"none: {why} (n = {diff.n}); {kind}"
        diff_value = None if ref_value is None or new_value is None else float(new_value - ref_value)
        difference = "–" if diff_value is None else f"{diff_value:+.{d}f} (no interval)"
        v, diff_ci = "inconclusive", None
    if ours is None:
        ours = f"{ref} → {new}: {metric} {value_text(ref_value, ref_ci, d)} → {value_text(new_value, new_ci, d)}"
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
        ref_ci=interval(ref_ci),
        new_value=None if new_value is None else float(new_value),
        new_ci=interval(new_ci),
        diff_value=diff_value,
        diff_ci=diff_ci,
        note=note,
    )


def _row(spec: PaperClaim, m: Measure, ref: str, new: str, c) -> Claim:
    """The claim row of one comparison of two runs."""
    row = _make(
        spec.source, spec.claim, spec.paper, ref=c.ref or ref, new=c.new or new, metric=c.metric,
        claimed=spec.claimed, digits=m.digits, ref_value=c.ref_value, ref_ci=c.ref_ci, new_value=c.new_value,
        new_ci=c.new_ci, diff=c.diff, kind=c.kind, note=c.note, ours=c.ours,
    )  # fmt: skip
    row.cells = c.cells
    if c.veto and row.verdict == "agrees":
        row.verdict = "inconclusive"
        row.note += f"; {c.veto}"
    return row


def check_claim(spec: PaperClaim, ref: str, new: str, runs: dict[str, Run], groups, seed: int) -> Claim | None:
    """One claim between two models or two groups of replicates: with at least two runs with a value on both
    sides, the spread over seeds; otherwise the measure's comparison of the first run of each group (intervals over
    samples: data uncertainty only). None where the results lack what the measure needs."""
    m = measure(spec.measure)
    run = lambda name: runs.get(name) or Run(name)  # noqa: E731
    ref_runs, new_runs = [run(n) for n in groups.get(ref, [ref])], [run(n) for n in groups.get(new, [new])]
    if len(ref_runs) >= 2 and len(new_runs) >= 2:
        m = over_seeds_measure(m, ref_runs, new_runs)
        rv = [v for v in map(m.per_run, ref_runs) if finite(v)]
        nv = [v for v in map(m.per_run, new_runs) if finite(v)]
        if len(rv) >= 2 and len(nv) >= 2:
            words = m.metric_for(ref_runs + new_runs) if m.metric_for else None
            shared = m.seeds_compare(ref_runs, new_runs, seed) if m.seeds_compare else None
            items = shared_items(m, ref_runs, new_runs) if shared is None else None
            if shared is not None:  # the measure's own comparison over seeds (a chance all runs share counted once)
                row = _row(spec, m, ref, new, shared)
                row.runs = f"{len(rv)} vs {len(nv)} seeds"
            elif items is not None:
                row = _over_seeds(spec, m, ref, new, rv, nv, metric=words or m.metric, items=items)
            else:
                row = _over_seeds(spec, m, ref, new, rv, nv, metric=words or m.metric)
            extra = m.seeds_note(ref_runs, new_runs) if m.seeds_note else None
            if extra:
                row.note += f"; {extra}"
            veto = m.seeds_veto(ref_runs, new_runs, new) if m.seeds_veto and row.verdict == "agrees" else None
            if veto:
                row.verdict = "inconclusive"
                row.note += f"; {veto}"
            seeds_reason = m.seeds_untestable(ref_runs, new_runs) if m.seeds_untestable else None
            row = _untestable(_untestable_at_chance(row, m, ref_runs + new_runs), m, ref_runs + new_runs)
            return _untestable(row, m, [], seeds_reason) if seeds_reason else row
    c = m.compare(ref_runs[0], new_runs[0], seed)
    if c is None:
        return None
    runs = [ref_runs[0], new_runs[0]]
    row = _untestable(_untestable_at_chance(_row(spec, m, ref, new, c), m, runs, c.chance), m, runs)
    if len(ref_runs) > 1 or len(new_runs) > 1:  # a group's other runs are left out: said (a review, 2026-12-03)
        row.runs = f"one run per model: {runs[0].name} and {runs[1].name}"
        row.note += (
            f"; of {len(ref_runs)} vs {len(new_runs)} runs only {runs[0].name} and {runs[1].name} are compared "
            "(over seeds needs two runs with a value on each side)"
        )
    return row


def _untestable(row: Claim, m: Measure, runs: list[Run], reason: str | None = None) -> Claim:
    """The measure's own reason why the runs cannot test the claim (``Measure.untestable``, or ``reason``, e.g.
    ``Measure.seeds_untestable``'s): no verdict either way."""
    reason = reason or (m.untestable(runs) if m.untestable else None)
    if reason and row.verdict != "inconclusive":
        row.verdict = "inconclusive"
        row.note += f"; {reason}: the comparison cannot test the claim"
    elif reason:
        row.note += f"; {reason}"
    return row


def _untestable_at_chance(row: Claim, m: Measure, runs: list[Run], level: float | None = None) -> Claim:
    """A row whose two sides both reach down to the measure's chance level (the lower end of each 95% interval, or
    the value where there is none, at or below it at the printed digits) compares two models that do not have the
    skill: whichever is ahead, the difference says nothing about the claim, so the verdict is "inconclusive" and
    the note says why. ``level``: the comparison's own chance level (:attr:`Comparison.chance`: of what it read),
    else the runs' (``Measure.chance``; the higher). A claim of a lower value (attention noise: a model with the
    skill puts less than uniform attention there) reads it mirrored: a side reaches chance when the upper end of its
    interval is at or above the level (the lower of the runs')."""
    per_run = [c for c in (m.chance(run) for run in runs) if finite(c)] if m.chance else []
    levels = [level] if finite(level) else per_run
    if not levels or row.ref_value is None or row.new_value is None:
        return row
    below = row.claimed == "lower"
    level, d = (min(levels) if below else max(levels)), m.digits

    def reaches_chance(value: float, ci) -> bool:
        if below:  # mirrored: −value clears −level
            return not clears_floor(-(interval(ci)[1] if interval(ci) else value), -level, d)
        return not clears_floor(interval(ci)[0] if interval(ci) else value, level, d)

    if reaches_chance(row.ref_value, row.ref_ci) and reaches_chance(row.new_value, row.new_ci):
        row.verdict = "inconclusive"
        row.note += (
            f"; both models' {'intervals' if row.ref_ci and row.new_ci else 'values'} reach chance "
            f"({level:.{d}f}, what a model without the skill scores on the cells read): the comparison cannot test "
            "the claim"
        )
    return row


def _over_seeds(spec: PaperClaim, m: Measure, ref, new, ref_vals, new_vals, *, metric: str, items=None) -> Claim:
    """Groups of replicate runs: each side's mean with its t interval, the difference with Welch's interval, and
    what the comparison could see: the smallest difference it detects with 80% power from the measured spread,
    and the interval read as an equivalence bound (no difference larger than its farther end). ``items``: both
    sides' runs × items tables where every run read the same test items
    (:func:`~diffattn.eval.measures.shared_items`): the means and the difference then count the items once beside
    the seeds (:func:`~diffattn.eval.stats.seeds_items_difference`; Welch's power figures stay the seeds' own)."""
    digits = m.digits
    if items is None:
        (rm, rci), (nm, nci) = t_interval(ref_vals), t_interval(new_vals)
        diff = unpaired_difference(ref_vals, new_vals, method="welch")
        kind = f"Welch t over seeds ({len(ref_vals)} vs {len(new_vals)} runs): spread over training runs"
    else:
        (rm, rci), (nm, nci) = seeds_items_mean(items[0]), seeds_items_mean(items[1])
        diff = seeds_items_difference(*items, strata_name=m.item_strata)
        welch = diff.method.endswith((WELCH_EXACTLY, NO_SPREAD))
        kind = diff.method + ("" if welch else ": spread over training runs and test items")
    sd_r, sd_n = float(np.std(ref_vals, ddof=1)), float(np.std(new_vals, ddof=1))
    mdd = minimum_detectable_difference(sd_r, len(ref_vals), sd_n, len(new_vals))
    ci = interval(diff.interval)
    bound = max(abs(ci[0]), abs(ci[1])) if ci else None
    power = f"SD over seeds {sd_r:.{digits}f} / {sd_n:.{digits}f}; 80% power to detect |difference| ≥ {mdd:.{digits}f}"
    if bound is not None:
        power += f"; the interval rules out |difference| > {bound:.{digits}f}"
    row = _make(
        spec.source,
        spec.claim,
        spec.paper,
        ref=ref,
        new=new,
        metric=f"{metric} (mean over seeds)",
        claimed=spec.claimed,
        digits=digits,
        ref_value=rm,
        ref_ci=rci,
        new_value=nm,
        new_ci=nci,
        diff=diff,
        kind=kind,
        note=f"seeds: run-to-run variation included; {power}",
    )
    row.runs, row.detectable, row.ruled_out = f"{len(ref_vals)} vs {len(new_vals)} seeds", mdd, bound
    return row


# -- the claims ----------------------------------------------------------------------------------------------------
def paper_claims(config, rows: dict[str, dict], evals: dict[str, dict], *, groups=None, seed: int = 0) -> list[Claim]:
    """Every claim the experiment can check (see the module doc). ``rows``: the report's model rows (``val_loss``);
    ``evals``: {model: {suite: results}}; ``groups``: replicate runs per model (default :func:`seed_groups`);
    ``seed``: of every bootstrap (deterministic)."""
    groups = seed_groups(config) if groups is None else groups
    # from-scratch models only: an adapter's language modelling is its pretraining's, whatever rows adapted it
    text_share = {m.name: _text_share(config.data) for m in config.models}
    runs = {
        n: Run(n, {**rows.get(n, {}), **({TEXT_SHARE: text_share[n]} if n in text_share else {})}, evals.get(n) or {})
        for n in {*rows, *evals}
    }
    claims: list[Claim | None] = []
    labels = {getattr(m, "group_name", m.name): ARCHITECTURES[m.attention].claims_label for m in config.models}
    fewer = _fewer_heads(config)
    for base, diff in _pairs(config):
        made = [check_claim(spec, base, diff, runs, groups, seed) for spec in claim_table()]
        if labels[diff]:  # the DIFF V1 paper's claims measured on another architecture: the source says so
            made = [c and replace(c, source=f"{c.source} ({labels[diff]})") for c in made]
        if base in fewer:  # the paper's figures are mostly the full-heads Transformer's: the source says whose
            made = [c and replace(c, source=f"{c.source} (vs {fewer[base]})") for c in made]
        claims += made
    for a in config.adapters:  # each method's own paper claims (its registry entry)
        practice = _needle_practice(config, a)
        for spec in get_method(a.method).paper_claims:
            for ref in _references(spec, a, config, runs):
                row = check_claim(spec, ref, a.name, runs, groups, seed)
                if row is not None and practice and spec.measure.startswith(("niah", "alloc")):
                    row.note += f"; {practice}"
                claims.append(row)
    return [c for c in claims if c is not None]


def _fewer_heads(config) -> dict[str, str]:
    """The standard models with fewer heads than their preset's (DIFF Table 6's halved-heads control), by group, with
    the words a claim source adds: its rows quote the paper's figures, which (but for Table 6's AR-Hit row) are
    against the full-heads Transformer; the source says which Transformer the row's is."""
    out = {}
    for m in config.models:
        heads = (m.model.get("overrides") or {}).get("num_heads")
        full = get_preset(m.preset).num_heads
        if not ARCHITECTURES[m.attention].differential and heads and heads < full:
            out[m.group_name] = f"DIFF Table 6's control: a Transformer with {heads} of {full} heads"
    return out


def _text_share(data: dict) -> float:
    """The share of a data section's training rows that are text: all but the retrieval practice mix's."""
    return 1.0 - float(data.get("retrieval_fraction") or 0.0)


def _needle_practice(config, a) -> str | None:
    """The label of an adapter trained on needle rows in the evaluation's own template (the retrieval practice mix):
    its retrieval and allocation rows measure learning the format as much as the method (the papers adapt on
    generic text)."""
    data = config.adapter_data(a)
    fraction, mqar = float(data.get("retrieval_fraction") or 0.0), float(data.get("mqar_fraction", 0.5))
    needle_share = fraction * (1 - mqar)
    if needle_share <= 0:
        return None
    return (
        f"adapted on needle rows in the evaluation's own template ({needle_share:.0%} of its rows): the difference "
        "includes learning the format, not only the method (the papers adapt on generic text)"
    )


def _references(spec: PaperClaim, a, config, runs: dict[str, Run]) -> list[str]:
    """What adapter ``a`` is compared with for ``spec``: its base, the model's own results at λ = 0 (added to
    ``runs`` as a model of its own), or the controls of another method trained on the same base."""
    if spec.reference == "base":
        return [a.base]
    if spec.reference == "lambda0":
        at_lambda0 = measure(spec.measure).at_lambda0
        if at_lambda0 is None:
            raise ValueError(f"{spec.source}: the measure {spec.measure!r} has no λ = 0 reading")
        own = at_lambda0(runs.get(a.name) or Run(a.name))
        if own is None:
            return []
        name = f"{a.name} at λ = 0"
        runs[name] = Run(name, {}, own)
        return [name]
    # a control is like for like only on the same base *and* the same adaptation data: an experiment may train
    # each method twice (on the practice mix and on text alone), and the text arm is not the mix arm's control
    data = config.adapter_data(a)
    return [
        x.name
        for x in config.adapters
        if x.method == spec.reference and x.base == a.base and config.adapter_data(x) == data
    ]


# The seed-to-seed spread of the claims' metrics, measured on this project's CPU (pooled within-model SD over the
# replicate runs of results/mini-scratch-v2-rerun, the placement-fixed protocol (its grid's queried needle at random
# depths, as before results version 10): 3 seeds per model, 3 models, df 6; the
# earlier pooling over mini-scratch and mini-scratch-v2 mixed the pre-fix exports). A single-run report quotes it, so
# a reader sees when a difference between two single runs is smaller than what a second seed would move.
# tests/experiments/test_results.py recomputes it from the export SEED_SPREAD_SOURCE names.
# Each is the quantity a single-run row reads (until 2026-12-01 the outliers' were the overall top-1's, 4.3 and 180,
# while the rows read the mean per-window top-1, whose spread is 4.2 and 5.7).
SEED_SPREAD = {
    "test NLL/token (ppl suite)": 0.071,
    "validation loss (75% retrieval mix)": 0.080,
    "strict retrieval accuracy": 0.20,
    "attention to the answer (|a| share)": 0.086,
    "attention noise (|a| share)": 0.054,
    "mean per-window top-1 |attention logit|": 4.2,
    "mean per-window top-1 |hidden state|": 5.7,
    "NLL increase at the lowest logit width": 0.0068,
}
SEED_SPREAD_SOURCE = "results/mini-scratch-v2-rerun (quick models, 3 seeds per arm)"


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
    measured_text = f", measured on {' and '.join(measured)}" if measured else ""
    return (
        f"What this can show: these are {size}{trained} (minutes of CPU, not the papers' billions of parameters and "
        f"tokens){measured_text}. They can show the *direction* of a difference when it is large next to the "
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
