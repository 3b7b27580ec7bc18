"""What the icl suite's claim rows read: accuracy at the largest shot count and the order margins (DIFF Fig. 6-7,
Dex Table 3)."""

from __future__ import annotations

from ..measures import ONE_NUMBER, Comparison, Measure, PaperClaim, Run, paired_kind
from ..stats import paired_difference, t_interval, unpaired_difference


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
def _at_largest(m: dict | None) -> float | None:
    return None if not m or not m.get("mean") else m["mean"][-1]


def _compare_shots(ref: Run, new: Run, seed: int) -> Comparison | None:
    """DIFF Fig. 6: many-shot accuracy at the largest shot count both models ran, paired over the same draws
    (the same demonstrations and test items); chance is the measure's (:func:`_chance`)."""
    mr, mn = ref.results("icl", "many_shot"), new.results("icl", "many_shot")
    if not mr or not mn:
        return None
    common_shots = sorted(set(mr["shots"]) & set(mn["shots"]))
    if not common_shots:
        return None
    k = common_shots[-1]
    ar, an = mr["accuracy"][mr["shots"].index(k)], mn["accuracy"][mn["shots"].index(k)]
    labels = len(mr.get("labels") or []) or 1
    diff = paired_difference(ar, an, seed=seed) if len(ar) == len(an) else unpaired_difference(ar, an)
    note = f"data uncertainty only; {k} shots, {len(ar)} draws; chance {1 / labels:.2f} (1 / {labels} labels)"
    (rv, rci), (nv, nci) = t_interval(ar), t_interval(an)  # each model's mean over the draws, t interval
    return Comparison(
        f"accuracy at {k} shots", ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff,
        kind=paired_kind(diff, "draws of demonstrations") if len(ar) == len(an) else "Welch t over draws",
        note=note, cells=f"{k} shots",
    )  # fmt: skip


def _chance(run: Run) -> float | None:
    """Guessing one of the labels: 1 / labels."""
    labels = run.results("icl", "many_shot", "labels")
    return 1 / len(labels) if labels else None


def _margin(run: Run) -> float | None:
    return run.results("icl", "order_robustness", "arrangements", "random", "margin")


def _compare_margin(ref: Run, new: Run, seed: int) -> Comparison | None:
    mr, mn = _margin(ref), _margin(new)
    if mr is None or mn is None:
        return None
    return Comparison(
        "order margin (random)", ref_value=mr, new_value=mn, kind=ONE_NUMBER + " (best − worst over permutations)"
    )


MEASURES = {
    "icl:many_shot": Measure(
        "accuracy at the largest shot count", 3, per_run=lambda run: _at_largest(run.results("icl", "many_shot")),
        compare=_compare_shots, chance=_chance,
    ),
    "icl:order_margin": Measure("order margin (random)", 3, per_run=_margin, compare=_compare_margin),
}  # fmt: skip

# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 6", "better many-shot in-context learning", "+5.2 to +21.6 points at 64K-token prompts",
        "icl:many_shot", "higher", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
        "TREC margin 19.0 vs 4.0 (random order)", "icl:order_margin", "lower", "baseline",
    ),
)  # fmt: skip
