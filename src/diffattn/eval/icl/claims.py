"""What the icl suite's claim rows read: accuracy at the largest shot count and the order margins (DIFF Fig. 6-7,
Dex Table 3)."""

from __future__ import annotations

import numpy as np

from ..measures import ONE_NUMBER, Comparison, Measure, PaperClaim, Run, clears_floor, paired_kind
from ..stats import crossed_paired_difference, paired_difference, t_interval, unpaired_difference


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
def _at_largest(m: dict | None) -> float | None:
    return None if not m or not m.get("mean") else m["mean"][-1]


def _compare_shots(ref: Run, new: Run, seed: int) -> Comparison | None:
    """DIFF Fig. 6: many-shot accuracy at the largest shot count both models ran, paired over the same draws
    (the same demonstrations and test items): a two-way t over draws × test items where the results keep each item's
    hit (:func:`~diffattn.eval.stats.crossed_paired_difference`), else over the draws; chance is the measure's
    (:func:`_chance`)."""
    mr, mn = ref.results("icl", "many_shot"), new.results("icl", "many_shot")
    if not mr or not mn:
        return None
    common_shots = sorted(set(mr["shots"]) & set(mn["shots"]))
    if not common_shots:
        return None
    k = common_shots[-1]
    ar, an = mr["accuracy"][mr["shots"].index(k)], mn["accuracy"][mn["shots"].index(k)]
    paired = len(ar) == len(an) and same_draws(mr, mn)
    hr, hn = _item_hits(mr, k), _item_hits(mn, k)
    if paired and hr is not None and hn is not None and np.shape(hr) == np.shape(hn):
        # the same draws scored on the same test items: both are chance draws (a t over the draws alone took the
        # test set as fixed, and 30-40 items carry a standard error of about 0.08 of their own)
        diff = crossed_paired_difference(hr, hn)
        kind = diff.method
    elif paired:
        diff = paired_difference(ar, an, seed=seed)
        kind = paired_kind(diff, "draws of demonstrations") + " (results without per-item hits: the items as fixed)"
    else:
        diff, kind = unpaired_difference(ar, an), "Welch t over draws (not the same draws)"
    note = f"data uncertainty only; {k} shots, {len(ar)} draws; {_chance_words(mr, k)}"
    (rv, rci), (nv, nci) = t_interval(ar), t_interval(an)  # each model's mean over the draws, t interval
    return Comparison(
        f"accuracy at {k} shots", ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff, kind=kind,
        note=note, cells=f"{k} shots",
    )  # fmt: skip


def _item_hits(m: dict, k: int) -> list[list[int]] | None:
    """Results ``m``'s per-draw, per-test-item hits at ``k`` shots (None for results from before they were kept)."""
    hits = m.get("hits")
    return None if not hits else hits[m["shots"].index(k)]


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


def _chance(run: Run) -> float | None:
    """The accuracy a model without the skill reaches at the largest shot count: the best heuristic's, simulated on
    the run's own draws (:data:`~diffattn.eval.icl.many_shot.HEURISTICS`: a constant label, the demonstrations'
    majority, the last demonstration's); 1 / labels for results from before 2026-12-01, which did not simulate it
    (too low where the test set's labels are unbalanced)."""
    m = run.results("icl", "many_shot")
    if m and m.get("floor"):
        return m["floor"][-1]
    labels = (m or {}).get("labels")
    return 1 / len(labels) if labels else None


def _chance_words(m: dict, k: int) -> str:
    """The chance level of results ``m`` at ``k`` shots, with where it comes from."""
    labels = len(m.get("labels") or []) or 1
    if not m.get("floor"):
        return f"chance {1 / labels:.2f} (1 / {labels} labels; no simulated floor in these results)"
    i = m["shots"].index(k)
    best = max(m["heuristics"], key=lambda h: m["heuristics"][h][i])
    return f"chance {m['floor'][i]:.2f} (the best heuristic, {best}; 1 / {labels} labels = {1 / labels:.2f})"


def _margin(run: Run) -> float | None:
    return run.results("icl", "order_robustness", "arrangements", "random", "margin")


def _compare_margin(ref: Run, new: Run, seed: int) -> Comparison | None:
    mr, mn = _margin(ref), _margin(new)
    if mr is None or mn is None:
        return None
    return Comparison(
        "order margin (random)", ref_value=mr, new_value=mn, kind=ONE_NUMBER + " (best − worst over permutations)"
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


def _margin_at_floor(runs: list[Run]) -> str | None:
    """A model at the floor (its mean accuracy over the random permutations does not clear a constant label's) has a
    margin near 0 because it ignores the demonstrations, not because it is robust to their order: a row with one
    cannot test the claim, whichever side it is on."""
    for run in runs:
        order = run.results("icl", "order_robustness")
        random = ((order or {}).get("arrangements") or {}).get("random")
        floor = None if not order else _order_floor(order)
        if random is None or floor is None:
            continue
        if not clears_floor(random["mean"], floor, 3):
            return (
                f"{run.name} is at the floor over the permutations (mean accuracy {random['mean']:.3f}, a constant "
                f"label scores {floor:.3f}): its margin is that of ignoring the demonstrations"
            )
    return None


MEASURES = {
    "icl:many_shot": Measure(
        "accuracy at the largest shot count", 3, per_run=lambda run: _at_largest(run.results("icl", "many_shot")),
        compare=_compare_shots, chance=_chance,
    ),
    "icl:order_margin": Measure(
        "order margin (random)", 3, per_run=_margin, compare=_compare_margin, untestable=_margin_at_floor
    ),
}  # fmt: skip

# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 6", "better many-shot in-context learning",
        "+5.2 to +21.6 points (+0.052 to +0.216 as fractions) at 64K-token prompts", "icl:many_shot", "higher",
        "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
        "TREC margin 19.0 vs 4.0 points (0.190 vs 0.040 as fractions; random order)", "icl:order_margin", "lower",
        "baseline",
    ),
)  # fmt: skip
