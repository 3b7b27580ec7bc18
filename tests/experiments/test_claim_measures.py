"""Each claim row reads the quantity its words name (a helper's audit, 2026-12-01): no fallback to another score
under the same words, a floor of the row's own quantity, and no "agrees" from a model that ignores the task."""

from __future__ import annotations

import numpy as np
import pytest

from diffattn.adapters.registry import PaperClaim
from diffattn.eval.measures import Run
from diffattn.eval.stats import crossed_paired_difference
from diffattn.experiments.claims import check_claim, measure


def _niah(cells, *, strict=True, sha="same", rng=None):
    rng = rng or np.random.default_rng(0)
    grid = []
    for n, r, p in cells:
        sc = [float(x) for x in rng.random(40) < p]
        g = {"N": n, "R": r, "accuracy": float(np.mean(sc)), "scores": sc, "floor": r / n, "floor_solved": 0.5 / n}
        if strict:
            g["strict_scores"] = sc
        grid.append(g)
    return {"niah": {"grid": grid, "mean_accuracy": 0.9, "metadata": {"samples_sha1": sha}}}


def test_prompts_solved_rows_never_fall_back_to_a_lenient_score_and_name_the_floor_they_are_tested_against():
    from diffattn.eval.niah import MEASURES

    cells = [(1, 1, 1.0), (2, 2, 0.3), (4, 2, 0.2), (6, 2, 0.1)]
    rng = np.random.default_rng(1)
    ref, new = Run("a", {}, _niah(cells, rng=rng)), Run("b", {}, _niah(cells, rng=rng, sha="other"))
    row = MEASURES["niah"].compare(ref, new, 0)
    assert row.metric.startswith("prompts solved") and "unpaired bootstrap over seeds" in row.kind  # cells share them
    assert row.ref_value == MEASURES["niah"].per_run(ref)  # the quantity the rows over seeds read
    # the floor in the note is prompts solved's, each cell's and the pooled one the verdict is tested against
    pooled = MEASURES["niah"].chance(ref)
    assert f"floor (best heuristic without the skill) of prompts solved 0.25, 0.12, 0.08; pooled {pooled:.2f}" in (
        row.note
    )
    lenient = Run("c", {}, _niah(cells, strict=False))
    assert MEASURES["niah"].compare(ref, lenient, 0) is None  # no strict scores: no prompts solved to read


def test_retrieval_rows_give_their_prompts_to_rows_over_seeds_only_where_they_are_independent_items():
    """``Measure.per_item`` (docs/evaluation.md §13.4): each prompt's value, whose mean is the run's value; pooled
    cells only where each cell drew its prompts from seeds of its own, and never without the prompts' hash."""
    from diffattn.eval.niah import MEASURES
    from diffattn.eval.niah.sampling import PER_CELL_SEEDS

    cells = [(1, 1, 1.0), (2, 1, 0.6), (4, 2, 0.2), (6, 2, 0.1)]
    old = Run("a", {}, _niah(cells))
    results = _niah(cells)
    results["niah"]["metadata"]["prompt_seeds"] = PER_CELL_SEEDS
    for g in results["niah"]["grid"]:
        g["strict_accuracy"] = g["accuracy"]  # R = 2 cells' hits here are 0/1: credit and solved alike
    new = Run("b", {}, results)
    for name in ("niah", "niah:r1", "niah:paper_cell"):
        key, values = MEASURES[name].per_item(new)
        assert np.mean(values) == pytest.approx(MEASURES[name].per_run(new)) and key[0] == "same"
    # cells that share seeds: a seed's prompts over the cells are one item (their mean is still the run's value)
    key, values = MEASURES["niah"].per_item(old)
    assert key[-1] == "seeds" and len(values) == 40 and np.mean(values) == pytest.approx(MEASURES["niah"].per_run(old))
    for name, res in (("niah:heatmap", _heatmap([[1, 0, 1], [0, 0, 1]], per_cell=False)),
                      ("niah:multivalue", {"niah": {**results["niah"], "multivalue": {**results["niah"]["grid"][2],
                                                                                       "V": 2}}})):  # fmt: skip
        key, values = MEASURES[name].per_item(Run("c", {}, res))
        assert np.mean(values) == pytest.approx(MEASURES[name].per_run(Run("c", {}, res))) and key[0] == "same"
    del results["niah"]["metadata"]["samples_sha1"]
    assert MEASURES["niah:paper_cell"].per_item(new) is None and MEASURES["niah:multivalue"].per_item(new) is None


def test_the_top1_row_names_the_per_window_statistic_its_verdict_reads():
    from diffattn.eval.outliers import OUTLIER_MEASURES

    def run(name, windows, top1, values=None):
        r = {"attention_logits": {"top1": top1, "values": values}, "per_window": {"attention_logits_top1": windows},
             "metadata": {"tokens_sha1": "t", "seq_len": 64}}  # fmt: skip
        return Run(name, {}, {"outliers": r})

    row = OUTLIER_MEASURES["outliers:attention_logits"].compare(run("a", [20, 21, 22], 300), run("b", [25] * 3, 40), 0)
    assert row.metric == "mean per-window top-1 |logit|" and "top-1 |logit| 300.00 → 40.00" in row.ours
    assert "pool" not in row.note  # results without the pools' sizes say nothing of them
    # DIFF V2's maxima are over twice the Transformer's logits (four maps where it has two): the note says so
    twice = OUTLIER_MEASURES["outliers:attention_logits"].compare(
        run("a", [20, 21, 22], 30, 66_048), run("v2", [25] * 3, 40, 132_096), 0
    )
    assert "v2's maxima are over 2× as many values as a's (a larger pool, a larger maximum)" in twice.note


def test_an_allocation_share_is_labelled_of_attention_only_where_it_is():
    from diffattn.eval.allocation import MEASURES

    signed = {"attention_to_answer": 0.05, "attention_noise": 0.5}
    both = {**signed, "attention_to_answer_magnitude": 0.06}
    m = MEASURES["alloc:attention_to_answer"]
    a, b = Run("a", {}, {"alloc": signed}), Run("b", {}, {"alloc": {**signed, "attention_to_answer": -0.1}})
    assert m.compare(a, b, 0).metric == "attention to answer (signed share)"
    c, d = Run("c", {}, {"alloc": both}), Run("d", {}, {"alloc": both})
    assert m.compare(c, d, 0).metric == "attention to answer (share of |attention|)"
    assert (
        m.metric_for([c, d]) is None
        and "signed where" in m.metric_for([a, c])
        and "(signed share)" in (m.metric_for([a, b]))
    )


def test_mqar_and_allocation_rows_give_their_samples_to_rows_over_seeds_and_the_slope_pairs_sample_k_across_configs():
    """``Measure.per_item`` (docs/evaluation.md §13.4) of the MQAR and allocation rows: values whose mean is the run's
    value, named by what drew the samples. Sample k of every MQAR configuration comes from one seed (the same first
    keys), so the slope's items are each sample's weighted contribution over the configurations, and the single-run
    interval reads their paired differences: a sample solved at every pair count adds nothing to the slope."""
    from diffattn.eval.allocation import MEASURES as ALLOC
    from diffattn.eval.mqar import MEASURES as MQAR

    def mqar(name, outcomes):  # outcomes[k]: sample k's 0/1 at 2, 4 and 8 pairs
        rows = [{"seq_len": 128, "pairs": p, "samples": len(outcomes), "floor": 0.1,
                 "accuracy": float(np.mean([o[c] for o in outcomes])), "per_sample": [float(o[c]) for o in outcomes]}
                for c, p in enumerate((2, 4, 8))]  # fmt: skip
        return Run(name, {}, {"mqar": {"mqar": rows, "metadata": {"seed": 0, "token_offset": 5}}})

    a = mqar("a", [(1, 1, 1)] * 10 + [(1, 0, 0)] * 10 + [(0, 0, 0)] * 10)
    b = mqar("b", [(1, 1, 1)] * 10 + [(1, 0, 1)] * 10 + [(0, 0, 0)] * 10)
    for name in ("mqar:accuracy", "mqar:slope"):
        key, values = MQAR[name].per_item(a)
        assert np.mean(values) == pytest.approx(MQAR[name].per_run(a)) and key[:2] == (0, 5)
    slope = MQAR["mqar:slope"].compare(a, b, 0)
    d = [0.0] * 10 + [0.5] * 10 + [0.0] * 10  # b − a per sample, slope weights −1/2, 0, 1/2 over log2(pairs)
    assert slope.diff.estimate == pytest.approx(np.mean(d)) and "paired contributions" in slope.kind
    assert slope.diff.interval[1] - slope.diff.interval[0] == pytest.approx(2 * 1.959964 * np.std(d, ddof=1) / 30**0.5,
                                                                            rel=1e-4)  # fmt: skip
    b.suites["mqar"]["metadata"]["seed"] = 1  # other samples: no pairs, and the row says why
    assert MQAR["mqar:slope"].compare(a, b, 0).kind == "none: the two models saw different samples"

    per_sample = [{"answer": 0.1 * i, "answer_magnitude": 0.2 * i} for i in range(4)]
    signed = {"attention_to_answer": 0.15, "per_sample": per_sample, "metadata": {"samples_sha1": "p"}}
    both = {**signed, "attention_to_answer_magnitude": 0.3}
    m = ALLOC["alloc:attention_to_answer"]
    for res in (signed, both):
        key, values = m.per_item(Run("r", {}, {"alloc": res}))
        assert np.mean(values) == pytest.approx(m.per_run(Run("r", {}, {"alloc": res}))) and key[0] == "p"
    assert m.per_item(Run("r", {}, {"alloc": {**both, "metadata": {}}})) is None


def test_a_flatter_mqar_slope_agrees_only_from_a_model_ahead_at_the_largest_pair_count():
    rng = np.random.default_rng(0)

    def run(name, accs):
        rows = []
        for p, acc in zip((2, 4, 8), accs, strict=True):
            per = [float(x) for x in rng.random(200) < acc]
            rows.append({"seq_len": 128, "pairs": p, "samples": 200, "floor": 0.1, "accuracy": float(np.mean(per)),
                         "per_sample": per})  # fmt: skip
        return Run(name, {}, {"mqar": {"mqar": rows, "metadata": {"seed": 0, "token_offset": 0}}})

    spec = PaperClaim("s", "c", "p", "mqar:slope", "higher", "baseline")
    steep, flat_low, flat_high = (0.95, 0.7, 0.45), (0.3, 0.3, 0.3), (0.95, 0.9, 0.85)
    runs = {"t": run("t", steep), "low": run("low", flat_low), "high": run("high", flat_high)}
    row = check_claim(spec, "t", "low", runs, {}, 0)
    assert row.diff_ci[0] > 0 and row.verdict == "inconclusive" and "not ahead at the largest pair count" in row.note
    assert check_claim(spec, "t", "high", runs, {}, 0).verdict == "agrees"
    runs |= {f"t{i}": run(f"t{i}", steep) for i in range(3)} | {f"l{i}": run(f"l{i}", flat_low) for i in range(3)}
    row = check_claim(spec, "t", "l", runs, {"t": ["t0", "t1", "t2"], "l": ["l0", "l1", "l2"]}, 0)
    assert row.verdict == "inconclusive" and "not ahead at the largest pair count over seeds" in row.note


def test_an_order_margin_row_with_a_model_at_the_floor_cannot_agree():
    def run(name, margin, mean):
        order = {"labels": ["a", "b", "c", "d"], "arrangements": {"random": {"margin": margin, "mean": mean}},
                 "metadata": {"test_label_counts": {"a": 14, "b": 2, "c": 2, "d": 2}}}  # fmt: skip
        return Run(name, {}, {"icl": {"order_robustness": order}})

    spec = PaperClaim("s", "c", "p", "icl:order_margin", "lower", "baseline")
    groups = {"t": ["t0", "t1", "t2"], "d": ["d0", "d1", "d2"]}
    runs = {f"t{i}": run(f"t{i}", 0.15 + 0.01 * i, 0.85) for i in range(3)}
    constant = {f"d{i}": run(f"d{i}", 0.0 + 0.001 * i, 0.70) for i in range(3)}  # a constant label scores 0.70
    row = check_claim(spec, "t", "d", runs | constant, groups, 0)
    assert row.verdict == "inconclusive" and "d0 is at the floor" in row.note
    assert "mean accuracy over the permutations 0.850 → 0.700" in row.note
    skilled = {f"d{i}": run(f"d{i}", 0.0 + 0.001 * i, 0.95) for i in range(3)}
    assert check_claim(spec, "t", "d", runs | skilled, groups, 0).verdict == "agrees"


def test_the_order_margin_row_has_no_interval_over_the_test_items_which_would_be_biased():
    """A percentile bootstrap over the test items (tried 2026-12-01) repeats the upward bias the items' noise gives a
    best − worst range instead of correcting it: two models whose true per-permutation accuracies do not depend on
    order at all, one at 0.5 and one at 0.97, have ranges of about 0.28 and 0.10 from noise alone (3 standard errors
    of 30 items), and the bootstrap called the second the more robust. The single-run row stays one number, saying
    why, whatever the results hold, with both sides' mean accuracies beside it."""
    from diffattn.eval.icl import MEASURES

    rng = np.random.default_rng(0)

    def run(name, accuracy):  # 10 permutations of 30 items, each hit drawn afresh: no order effect, only noise
        hits = [list((rng.random(30) < accuracy).astype(int)) for _ in range(10)]
        accs = [float(np.mean(h)) for h in hits]
        random = {"accuracies": accs, "hits": hits, "margin": max(accs) - min(accs), "mean": float(np.mean(accs))}
        return Run(name, {}, {"icl": {"order_robustness": {"arrangements": {"random": random}}}})

    ref, new = run("t", 0.5), run("d", 0.97)
    row = MEASURES["icl:order_margin"].compare(ref, new, 0)
    assert row.new_value < row.ref_value - 0.1  # the noise alone makes the more accurate model look more robust
    assert row.diff is None and row.ref_ci is None and "a bootstrap over the items would be biased" in row.kind
    assert row.note.startswith("mean accuracy over the permutations 0.450 → 0.967")  # read the margins beside it


def test_dex_fig10_reads_the_heatmap_and_the_r1_cells_row_is_ours():
    from diffattn.adapters import get_method

    rows = {c.source: c.measure for c in get_method("dex").paper_claims if c.reference == "base"}
    assert rows["Dex §4.2, Fig. 10"] == "niah:heatmap"
    assert rows["Dex §4.2 (ours: R = 1 cells across N)"] == "niah:r1_else_n2"


def test_the_heatmap_row_reads_strict_scores_only():
    """A heatmap without strict scores (older results) gives no row: its lenient scores (the queried number anywhere
    in the output) are solved by a model writing every needle's number, and the floor is of strict prompts solved."""
    from diffattn.eval.niah import MEASURES

    def run(name, strict):
        scores = [[[1.0, 0.0, 1.0]] * 2]  # one length × two depths × three prompts
        h = {"lengths": [64], "depths": [0.0, 1.0], "N": 4, "scores": scores}
        if strict:
            h["strict_scores"] = [[[1.0, 0.0, 0.0]] * 2]
        return Run(name, {}, {"niah": {"grid": [], "heatmap": h, "metadata": {"samples_sha1": "s"}}})

    m = MEASURES["niah:heatmap"]
    assert m.per_run(run("a", True)) == 1 / 3 and m.compare(run("a", True), run("b", True), 0) is not None
    assert m.per_run(run("a", False)) is None and m.compare(run("a", False), run("b", False), 0) is None


def test_the_gap_and_paper_cell_rows_read_strict_credit_only():
    """The needle gap and the paper's own cell read strict credit, single-run and over seeds; results without it
    give no value (they fell back to lenient credit under the same words and strict floors)."""
    from diffattn.eval.niah import MEASURES

    strict, lenient = _niah([(1, 1, 1.0), (6, 2, 0.5), (8, 1, 0.5)]), _niah([(1, 1, 1.0), (6, 2, 0.5), (8, 1, 0.5)],
                                                                            strict=False)  # fmt: skip
    for g in strict["niah"]["grid"]:
        g["strict_accuracy"] = g["accuracy"]
    a, b, c = Run("a", {}, strict), Run("b", {}, strict), Run("c", {}, lenient)
    gap, cell = MEASURES["niah:gap"], MEASURES["niah:paper_cell"]
    assert gap.per_run(a) is not None and gap.compare(a, b, 0) is not None and cell.per_run(a) is not None
    assert gap.per_run(c) is None and gap.compare(c, c, 0) is None and cell.per_run(c) is None


def _heatmap(outcomes, lengths=3, *, per_cell=True):
    """A heatmap result with the same per-prompt outcomes at every length (what one seed per depth and sample gave)."""
    heat = [[list(map(float, depth)) for depth in outcomes] for _ in range(lengths)]
    metadata = {"samples_sha1": "same", **({"prompt_seeds": "per cell"} if per_cell else {})}
    h = {"lengths": list(range(64, 64 + 32 * lengths, 32)), "depths": [0.0, 0.5], "N": 4, "R": 1,
         "strict_scores": heat, "scores": heat, "heuristics": []}  # fmt: skip
    return {"niah": {"grid": [], "heatmap": h, "mean_accuracy": 0.5, "metadata": metadata}}


def test_the_needle_gap_resamples_a_seeds_prompt_in_both_cells_together_where_they_share_seeds():
    """The gap's growth is a difference of two cells; where sample i of both came from one seed (older results) a
    seed's two prompts are one draw: a model that solves or misses a seed's prompt at both N has grown by exactly 0,
    which resampling each cell on its own does not see. Its items over seeds: prompt k at the largest N less at the
    smallest."""
    from diffattn.eval.niah import MEASURES
    from diffattn.eval.niah.sampling import PER_CELL_SEEDS

    def run(name, p, *, per_cell):
        res = _niah([(2, 1, p), (8, 1, p)], rng=np.random.default_rng(int(p * 10)))
        lo, hi = res["niah"]["grid"]
        hi["strict_scores"] = hi["scores"] = list(lo["strict_scores"])  # each seed solved at both N or at neither
        for g in (lo, hi):
            g["strict_accuracy"] = g["accuracy"] = float(np.mean(g["strict_scores"]))
        if per_cell:
            res["niah"]["metadata"]["prompt_seeds"] = PER_CELL_SEEDS
        return Run(name, {}, res)

    gap = MEASURES["niah:gap"]
    shared, independent = (gap.compare(run("a", 0.3, per_cell=c), run("b", 0.7, per_cell=c), 0) for c in (False, True))
    assert "over the 40 seeds" in shared.kind and shared.diff.interval == (0.0, 0.0)
    assert "within the two cells" in independent.kind and independent.diff.interval[1] > 0.1
    key, values = gap.per_item(run("a", 0.3, per_cell=False))
    assert key == ("same", (2, 8)) and np.mean(values) == gap.per_run(run("a", 0.3, per_cell=False)) == 0.0


def test_pooled_retrieval_tests_resample_a_seeds_prompts_together_where_cells_share_seeds():
    """Results before per-cell seeds drew sample i of every length (and of every grid cell) from one seed: near copies
    of one prompt. An exact McNemar test over the pooled cells counted each copy as another prompt (audit 2026-12-01:
    three lengths, an interval about √3 too narrow); a bootstrap over the seeds does not. Per-cell seeds: McNemar."""
    from diffattn.eval.niah import MEASURES
    from diffattn.eval.niah.sampling import cell_seeds

    ref = [[0] * 20, [0] * 20]
    new = [[1] * 4 + [0] * 16, [1] * 3 + [0] * 17]  # 7 of 40 prompts won, none lost: McNemar over 40 (0.016)
    row = lambda per_cell: MEASURES["niah:heatmap"].compare(  # noqa: E731
        Run("a", {}, _heatmap(ref, per_cell=per_cell)), Run("b", {}, _heatmap(new, per_cell=per_cell)), 0
    )
    independent, shared = row(True), row(False)
    assert independent.diff.interval[0] > 0 and "McNemar interval over the same 120 prompts" in independent.kind
    assert shared.diff.estimate == independent.diff.estimate and "bootstrap over 40 seeds" in shared.kind
    # the far ends of the exact interval and the seeds' bootstrap: never narrower than either
    assert (
        shared.diff.interval[0]
        <= independent.diff.interval[0]
        <= independent.diff.interval[1]
        <= (shared.diff.interval[1])
    )
    assert (
        shared.diff.interval[1] - shared.diff.interval[0] > independent.diff.interval[1] - independent.diff.interval[0]
    )
    # the grid: R = 1 cells sharing seeds, resampled by seed too
    rng = np.random.default_rng(3)
    cells = [(2, 1, 0.5), (4, 1, 0.5), (6, 1, 0.5)]
    a, b = _niah(cells, rng=rng), _niah(cells, rng=rng)
    assert "bootstrap over 40 seeds" in MEASURES["niah:r1"].compare(Run("a", {}, a), Run("b", {}, b), 0).kind
    for r in (a, b):
        r["niah"]["metadata"]["prompt_seeds"] = "per cell"
    assert "McNemar" in MEASURES["niah:r1"].compare(Run("a", {}, a), Run("b", {}, b), 0).kind
    # new results: every cell's own seeds, the same for every model
    seeds = [cell_seeds(0, f"heatmap length={n} depth=0.25", 5) for n in (64, 96)] + [cell_seeds(0, "grid N=2 R=1", 5)]
    assert len({s for cell in seeds for s in cell}) == 15 and cell_seeds(0, "grid N=2 R=1", 5) == seeds[2]


def test_the_many_shot_interval_counts_the_test_items_as_well_as_the_draws():
    """Three draws that agree exactly gave a zero-width t interval over the draws, so 3 items of 30 won "agreed";
    the items are a draw too (audit 2026-12-01): the two-way t over draws × items does not reject (t = 1.8)."""
    from diffattn.eval.icl import MEASURES

    ref_items, new_items = [0] * 30, [1] * 3 + [0] * 27

    def run(name, items, hits=True):
        m = {"shots": [8], "accuracy": [[float(np.mean(items))] * 3], "labels": ["a", "b"], "metadata": {}}
        return Run(name, {}, {"icl": {"many_shot": {**m, **({"hits": [[items] * 3]} if hits else {})}}})

    row = MEASURES["icl:many_shot"].compare(run("a", ref_items), run("b", new_items), 0)
    assert row.diff.estimate == pytest.approx(0.1) and row.diff.interval[0] < 0 < row.diff.interval[1]
    assert "two-way t over 3 draws × 30 items" in row.kind
    old = MEASURES["icl:many_shot"].compare(run("a", ref_items, False), run("b", new_items, False), 0)
    assert old.diff.interval[0] > 0 and "the items as fixed" in old.kind  # results without hits say what they read


def test_the_many_shot_row_averages_the_curve_as_the_paper_does():
    """DIFF Fig. 6's +5.2 to +21.6 points are average gains over the curve, 1 shot to the longest prompts; the row
    read the largest shot count alone (audit 2026-12-01). It averages the shot counts both models ran, each alike,
    with each shot count's own draws in the interval; chance is the heuristics' floor averaged the same way; over
    seeds, runs with other shot counts cannot agree."""
    from diffattn.eval.icl import MEASURES

    rng = np.random.default_rng(0)

    def run(name, accuracy_by_shots, shots=(1, 4, 16)):
        hits = [[list((rng.random(30) < a).astype(int)) for _ in range(3)] for a in accuracy_by_shots]
        acc = [[float(np.mean(d)) for d in h] for h in hits]
        floor = [0.5 + 0.05 * i for i in range(len(shots))]  # the heuristics gain with the shots
        m = {"shots": list(shots), "accuracy": acc, "mean": [float(np.mean(a)) for a in acc], "hits": hits,
             "labels": ["a", "b"], "floor": floor, "heuristics": {"constant": floor},
             "metadata": {"redraws": 0}}  # fmt: skip
        return Run(name, {}, {"icl": {"many_shot": m}})

    ref, new = run("a", [0.5, 0.6, 0.7]), run("b", [0.6, 0.8, 0.9])
    row = MEASURES["icl:many_shot"].compare(ref, new, 0)
    curve = lambda r: np.mean(r.results("icl", "many_shot")["hits"])  # noqa: E731
    assert row.diff.estimate == pytest.approx(curve(new) - curve(ref))
    assert row.metric == "accuracy (mean over the shot counts)" and row.cells == "3 shot counts (1 to 16)"
    assert "over 3 shot counts × 3 draws each × 30 items" in row.kind
    assert "chance 0.55 (the best heuristic, constant" in row.note
    assert MEASURES["icl:many_shot"].chance(ref) == pytest.approx(0.55)
    assert MEASURES["icl:many_shot"].per_run(new) == pytest.approx(curve(new))
    # a model that ran fewer shot counts: the row averages the ones both ran
    short = run("c", [0.6, 0.8], shots=(1, 4))
    row = MEASURES["icl:many_shot"].compare(ref, short, 0)
    assert row.cells == "2 shot counts (1 to 4)" and row.chance == pytest.approx(0.525)  # the floor at 1 and 4 shots
    # each model's interval counts the items as the difference's does (not a t over its draws alone)
    hits = np.array(ref.results("icl", "many_shot")["hits"][:2])
    crossed = crossed_paired_difference(np.zeros(hits.shape), hits, strata_name="shot counts")
    assert row.ref_ci == pytest.approx(crossed.interval) and row.ref_value == pytest.approx(hits.mean())
    spec = PaperClaim("s", "c", "p", "icl:many_shot", "higher", "baseline")
    groups = {"base": ["a0", "a1", "a2"], "new": ["b0", "b1", "b2"]}
    runs = {f"a{i}": run(f"a{i}", [0.5, 0.6, 0.7]) for i in range(3)} | {
        f"b{i}": run(f"b{i}", [0.9] * 3) for i in range(3)
    }
    row = check_claim(spec, "base", "new", runs, groups, 0)
    assert row.verdict == "agrees" and row.metric.startswith("accuracy (mean over the shot counts)")
    # the same draws and items in every run: counted once beside the seeds, the draws crossed with the items
    assert "3 vs 3 runs × 3 shot counts × 3 draws × 30 items, shared" in row.interval
    key, table = MEASURES["icl:many_shot"].per_item(new)
    assert key[1] == (1, 4, 16) and table.shape == (3, 3, 30)
    assert table.mean() == pytest.approx(MEASURES["icl:many_shot"].per_run(new))
    runs["b2"] = run("b2", [0.9] * 4, shots=(1, 4, 16, 64))
    row = check_claim(spec, "base", "new", runs, groups, 0)
    assert row.verdict == "inconclusive" and "the runs' shot counts differ" in row.note
    assert row.metric.startswith("accuracy (mean over each run's own shot counts)")
    # nor can they disagree, both sides above chance: the other points are no comparison either way
    runs |= {f"a{i}": run(f"a{i}", [0.95] * 3) for i in range(3)} | {f"b{i}": run(f"b{i}", [0.8] * 3) for i in range(2)}
    runs["b2"] = run("b2", [0.8] * 4, (1, 4, 16, 64))
    row = check_claim(spec, "base", "new", runs, groups, 0)
    assert row.diff_ci[1] < 0 and row.verdict == "inconclusive" and "reach chance" not in row.note
    assert "the runs' shot counts differ" in row.note


def test_the_head_cka_row_counts_the_layers_where_it_is_lower_beside_the_mean():
    """Dex Fig. 11b says "lower CKA than the base in most layers"; the row reads the mean over layers and says in how
    many layers the new model is lower (audit 2026-12-01)."""
    from diffattn.eval.heads import MEASURES

    def run(name, per_layer):
        layers = {str(i): {"cka": v} for i, v in enumerate(per_layer)}
        return Run(name, {}, {"heads": {"layers": layers, "summary": {"cka": float(np.mean(per_layer))}}})

    row = MEASURES["heads:cka"].compare(run("base", [0.5, 0.5, 0.5, 0.5]), run("dex", [0.1, 0.6, 0.6, 0.4]), 0)
    assert row.note == "dex lower in 2 of 4 layers" and row.new_value < row.ref_value


def test_the_order_variance_row_reads_the_orders_without_the_items_noise():
    """The order margin's bias (the test above) is the items' noise; the order-variance row removes it: two models
    without any order effect, at 0.5 and 0.97, read inconclusive where their margins differ by 0.2, and a model whose
    orders matter reads as less robust than one whose orders do not, from one run and over seeds."""
    from diffattn.eval.icl import MEASURES

    rng = np.random.default_rng(0)
    difficulty = rng.normal(0, 1, 200)

    def run(name, logit, order_sd, items=30, orders=10, meta=None):  # orders × items, logistic item and order effects
        p = 1 / (1 + np.exp(-(logit + difficulty[:items] + rng.normal(0, order_sd, (orders, 1)))))
        hits = (rng.random(p.shape) < p).astype(int).tolist()
        accs = [float(np.mean(h)) for h in hits]
        random = {"accuracies": accs, "hits": hits, "margin": max(accs) - min(accs), "mean": float(np.mean(accs))}
        return Run(name, {}, {"icl": {"order_robustness": {"arrangements": {"random": random}, "metadata": meta}}})

    spec = PaperClaim("s", "c", "p", "icl:order_variance", "lower", "baseline")
    flat = {"t": run("t", 0.0, 0.0), "d": run("d", 3.5, 0.0)}
    assert MEASURES["icl:order_margin"].compare(flat["t"], flat["d"], 0).new_value < flat["t"].results(
        "icl", "order_robustness", "arrangements", "random", "margin") - 0.1  # fmt: skip
    row = check_claim(spec, "t", "d", flat, {}, 0)
    assert row.verdict == "inconclusive" and row.metric.startswith("order variance") and "margins" in row.note
    assert row.diff_ci[0] < 0 < row.diff_ci[1] and "modified large-sample" in row.interval
    ordered = {"t": run("t", 0.0, 1.0, items=200), "d": run("d", 0.0, 0.0, items=200)}
    row = check_claim(spec, "t", "d", ordered, {}, 0)
    assert row.verdict == "agrees" and row.ref_value > 100 and abs(row.new_value) < 20  # points²
    seeds = {f"t{i}": run(f"t{i}", 0.0, 1.0, items=200) for i in range(3)}
    seeds |= {f"d{i}": run(f"d{i}", 0.0, 0.0, items=200) for i in range(3)}
    groups = {"t": ["t0", "t1", "t2"], "d": ["d0", "d1", "d2"]}
    row = check_claim(spec, "t", "d", seeds, groups, 0)  # results without the orders' record: Welch over the runs
    assert row.verdict == "agrees" and "mean accuracy over the permutations" in row.note
    assert row.interval.startswith("Welch t over seeds")
    # the seeds scored on the same orders and items: their mean hits compared once (Welch would miss the orders'
    # sampling, shared by every run)
    meta = {"permutation_seeds": list(range(10)), "seed": 0, "test_size": 200}
    seeds = {f"t{i}": run(f"t{i}", 0.0, 1.0, items=200, meta=meta) for i in range(3)}
    seeds |= {f"d{i}": run(f"d{i}", 0.0, 0.0, items=200, meta=meta) for i in range(3)}
    row = check_claim(spec, "t", "d", seeds, groups, 0)
    assert row.verdict == "agrees" and "seeds' mean hits on the same 10 orders" in row.metric
    assert row.interval.startswith("modified large-sample") and row.runs == "3 vs 3 seeds"
    no_hits = Run("old", {}, {"icl": {"order_robustness": {"arrangements": {"random": {"margin": 0.1, "mean": 0.5}}}}})
    assert MEASURES["icl:order_variance"].compare(no_hits, flat["d"], 0) is None
    assert MEASURES["icl:order_variance"].compare(run("two", 0.0, 0.0, orders=2), flat["d"], 0) is None  # too few
    # DIFF Fig. 7's other half, demonstrations alternating by class (the larger effect: 56.7 vs 13.4 points), has rows
    # of its own reading that arrangement (it was measured and never read: an audit, 2026-12-03)
    by_class = {k: Run(k, {}, {"icl": {"order_robustness": {"arrangements": {
        "by_class": r.results("icl", "order_robustness", "arrangements", "random"),
        "random": {"margin": 0.0, "mean": 0.5}}}}}) for k, r in ordered.items()}  # fmt: skip
    spec = PaperClaim("s", "c", "p", "icl:order_variance_by_class", "lower", "baseline")
    row = check_claim(spec, "t", "d", by_class, {}, 0)
    assert row.verdict == "agrees" and row.metric.startswith("order variance (by class;") and row.ref_value > 100
    margin = MEASURES["icl:order_margin_by_class"].compare(by_class["t"], by_class["d"], 0)
    assert margin.metric == "order margin (by class)" and margin.ref_value == ordered["t"].results(
        "icl", "order_robustness", "arrangements", "random", "margin")  # fmt: skip
    assert MEASURES["icl:order_margin"].compare(by_class["t"], by_class["d"], 0).ref_value == 0.0  # random's own


def test_a_quantization_row_with_logits_worth_nothing_cannot_test_the_claim():
    """DIFF Fig. 8's drop at low bits means robustness only where the logits are worth something: a model that
    scores as well with uniform maps (every logit equal) loses little at 4 bits because it uses its logits little."""
    rng = np.random.default_rng(0)
    tokens = [64] * 8

    def run(name, nll16, drop, worth):  # per-window summed NLL at 16 and 4 bits and with uniform maps
        base = nll16 + rng.normal(0, 0.05, 8)
        row = lambda b, per_token: {"bits": b, "nll": float(np.mean(per_token)),  # noqa: E731
                                    "per_window": {"nll": list(per_token * 64), "tokens": tokens}}  # fmt: skip
        quant = {"quantization": [row(16, base), row(4, base + drop + rng.normal(0, 0.002, 8))],
                 "uniform": row(0, base + worth + rng.normal(0, 0.002, 8)),
                 "metadata": {"tokens_sha1": "same text", "seq_len": 64}}  # fmt: skip
        return Run(name, {}, {"quant": quant})

    spec = PaperClaim("s", "c", "p", "quant:drop", "lower", "baseline")
    runs = {"t": run("t", 4.0, 0.05, 1.0), "d": run("d", 4.0, 0.01, 0.8)}
    row = check_claim(spec, "t", "d", runs, {}, 0)
    assert row.verdict == "agrees" and "what the logits are worth (uniform maps − 16-bit NLL/token) 1.0" in row.note
    runs["d"] = run("d", 4.0, 0.001, 0.0)  # uniform maps score as well as the model's own
    row = check_claim(spec, "t", "d", runs, {}, 0)
    assert row.verdict == "inconclusive" and "d's attention logits are worth nothing" in row.note
    seeds = {f"t{i}": run(f"t{i}", 4.0, 0.05, 1.0) for i in range(3)}
    seeds |= {f"d{i}": run(f"d{i}", 4.0, 0.01, 0.8) for i in range(3)}
    row = check_claim(spec, "t", "d", seeds, {"t": ["t0", "t1", "t2"], "d": ["d0", "d1", "d2"]}, 0)
    assert row.runs == "3 vs 3 seeds" and "16-bit NLL/token, mean over seeds) 1.0" in row.note
    assert "seeds × items (3 vs 3 runs × 8 shared items" in row.interval  # the same windows: counted once
    # windows of unequal length: each window's share of the tokens scales its item, so their mean is the weighted drop
    counts = [64] * 7 + [10]
    row = lambda b, nll: {"bits": b, "nll": sum(nll) / sum(counts), "per_window": {"nll": nll, "tokens": counts}}  # noqa: E731
    quant = {"quantization": [row(16, [100.0] * 8), row(4, [110.0] * 7 + [105.0])], "metadata": {"tokens_sha1": "x"}}
    m, uneven = measure("quant:drop"), Run("u", {}, {"quant": quant})
    assert np.mean(m.per_item(uneven)[1]) == pytest.approx(m.per_run(uneven)) == pytest.approx(75 / 458)
