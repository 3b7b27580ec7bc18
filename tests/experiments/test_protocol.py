"""Experiments: seed replicates, the retrieval protocol options of pretraining and adapter data, and evaluation
prompts that cannot fit refused before any training."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from diffattn.experiments import ExperimentConfig, run_experiment
from diffattn.train import RunConfig
from diffattn.train.adapt import AdaptRunConfig

WORDS = ["the", "king", "queen", "sword", "crown", "night", "day", "river", "stone", "ghost", "crow", "bell"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol-corpus")
    rng = random.Random(1)
    for i in range(24):
        (root / f"d{i:02d}.txt").write_text(
            "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(14))
        )
    return root


def test_seeds_expand_into_one_named_replicate_per_seed_and_round_trip():
    config = ExperimentConfig.from_dict(
        {
            "name": "seeds",
            "models": [
                {"name": "transformer", "preset": "debug", "seeds": [0, 3]},
                {"name": "diff", "preset": "debug", "attention": "diff"},
            ],
        }
    )
    assert config.scratch_names() == ["transformer-s0", "transformer-s3", "diff"]
    assert [m.train["seed"] for m in config.models[:2]] == [0, 3]
    assert config.seed_groups() == {"transformer": ["transformer-s0", "transformer-s3"], "diff": ["diff"]}
    again = ExperimentConfig.from_dict(config.to_dict())  # the saved experiment.yaml is already expanded
    assert again.scratch_names() == config.scratch_names() and again.seed_groups() == config.seed_groups()


@pytest.mark.parametrize(
    ("model", "adapter", "match"),
    [
        ({"seeds": []}, None, "non-empty list of distinct ints"),
        ({"seeds": [1, 1]}, None, "non-empty list of distinct ints"),
        ({"seeds": [0], "train": {"seed": 2}}, None, "either seeds or train.seed"),
        ({"seeds": [0, 1]}, {"name": "dex", "base": "t", "method": "dex"}, "name one of t-s0, t-s1"),
    ],
)
def test_bad_seed_settings_are_one_clear_error(model, adapter, match):
    d = {"name": "x", "models": [{"name": "t", "preset": "debug", **model}]}
    if adapter:
        d["adapters"] = [adapter]
    with pytest.raises(ValueError, match=match):
        ExperimentConfig.from_dict(d)


def test_adapter_data_takes_the_retrieval_mix_fields_with_the_same_checks():
    config = AdaptRunConfig.from_dict(
        {"data": {"retrieval_fraction": 0.5, "needle_digits": 2, "needle_loss": "answer"}}
    )
    assert config.data.needle_digits == 2 and config.data.retrieval_fraction == 0.5
    for section in ({"needle_loss": "prompt"}, {"needle_digits": 0}, {"retrieval_fraction": 1.0}):
        with pytest.raises(ValueError, match=r"data\."):
            AdaptRunConfig.from_dict({"data": section}).validate()
        with pytest.raises(ValueError, match=r"data\."):
            RunConfig.from_dict({"data": section}).validate()


def test_needle_and_icl_prompts_that_cannot_fit_are_refused_before_any_training(corpus, tmp_path):
    d = {
        "name": "nofit",
        "data": {"source": str(corpus), "seq_len": 32, "vocab_size": 300, "val_sequences": 2},
        "train": {"max_steps": 2, "global_batch_size": 2, "eval_every": 2, "save_every": 2},
        "models": [{"name": "baseline", "preset": "debug"}],
        "eval": {"suites": ["niah"], "options": {"context_tokens": 40, "niah_grid": [[6, 2]], "samples": 50}},
    }
    with pytest.raises(
        ValueError, match=r"the needle prompts \(niah/alloc\) for baseline: could not fit a needle sample"
    ):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "nofit").exists()  # nothing trained, nothing written
    d["eval"]["options"] = {"context_tokens": 128, "niah_grid": [[12, 2]], "niah_digits": 1}
    with pytest.raises(ValueError, match="fewer distinct numbers than N=12"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    # an ICL set whose demonstrations cannot fit the training length (the suite's context) fails before training too
    d["eval"] = {"suites": ["icl"], "options": {"icl_dataset": "chatterbot"}}
    with pytest.raises(ValueError, match=r"icl for baseline at 32 tokens .*: not even one demonstration fits"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "nofit").exists()


def test_a_folder_from_an_older_version_is_refused_with_the_differences_or_rerun_when_asked(corpus, tmp_path):
    """A quickstart folder left by an older version of the experiment: its parts' settings differ from the YAML."""
    old = {
        "name": "quickstart-like",
        "data": {"source": str(corpus), "seq_len": 48, "vocab_size": 300, "val_sequences": 2},
        "train": {"max_steps": 2, "global_batch_size": 2, "eval_every": 2, "save_every": 2},
        "models": [{"name": "transformer", "preset": "debug"}],
        "eval": {"suites": ["ppl"], "options": {"tokens": 96, "window": 32, "text": "filler"}},
    }
    run_experiment(ExperimentConfig.from_dict(old), tmp_path)
    out = tmp_path / "quickstart-like"
    mine = out / "my-notes.txt"  # something the library did not make
    mine.write_text("keep me")
    new = {**old, "data": {**old["data"], "retrieval_fraction": 0.5, "needle_digits": 2, "mqar_fraction": 1.0}}
    before = (out / "models" / "transformer" / "summary.json").read_bytes()
    with pytest.raises(
        ValueError,
        match=r"other settings \(data\.mqar_fraction: 0\.5 -> 1\.0; data\.needle_digits: 7 -> 2; .*--overwrite",
    ):
        run_experiment(ExperimentConfig.from_dict(new), tmp_path)
    assert (out / "models" / "transformer" / "summary.json").read_bytes() == before  # nothing redone or deleted
    outcomes = run_experiment(ExperimentConfig.from_dict(new), tmp_path, overwrite=True)
    assert [(o.kind, o.state) for o in outcomes] == [("pretrain", "fresh"), ("eval", "fresh")]
    assert mine.read_text() == "keep me"
    # --overwrite NAME redoes that part even with unchanged settings (e.g. after a code default changed), and its
    # evaluation follows: a retrained model is never scored by the previous one's results
    summary = (out / "models" / "transformer" / "summary.json").read_bytes()
    outcomes = run_experiment(ExperimentConfig.from_dict(new), tmp_path, overwrite={"transformer"})
    assert [(o.kind, o.state) for o in outcomes] == [("pretrain", "fresh"), ("eval", "fresh")]
    assert (out / "models" / "transformer" / "summary.json").read_bytes() != summary
    assert [o.state for o in run_experiment(ExperimentConfig.from_dict(new), tmp_path)] == ["done", "done"]
    # a redo whose new settings fail the trainer's checks keeps the finished part
    summary = (out / "models" / "transformer" / "summary.json").read_bytes()
    bad = {**new, "train": {**new["train"], "global_batch_size": 4096}}
    with pytest.raises(ValueError, match="too small"):
        run_experiment(ExperimentConfig.from_dict(bad), tmp_path, overwrite={"transformer"})
    assert (out / "models" / "transformer" / "summary.json").read_bytes() == summary


def test_export_copies_the_evidence_and_never_replaces_a_folder_it_did_not_make(tmp_path):
    from diffattn.experiments.report import EXPORT_MARKER, export_report

    src = tmp_path / "runs" / "exp"
    (src / "eval" / "m").mkdir(parents=True)
    (src / "report.md").write_text("# r\n![a](a.png)\n![b](eval/m/b.png)\n")
    (src / "results.json").write_text("{}")
    (src / "a.png").write_bytes(b"a")
    (src / "eval" / "m" / "b.png").write_bytes(b"b")
    (src / "models").mkdir()
    (src / "models" / "weights.safetensors").write_bytes(b"w")
    dest = export_report(src, tmp_path / "results" / "exp")
    assert (dest / "eval" / "m" / "b.png").read_bytes() == b"b" and (dest / EXPORT_MARKER).is_file()
    assert not (dest / "models").exists()
    (src / "a.png").write_bytes(b"a2")
    export_report(src, dest)  # an earlier export is replaced
    assert (dest / "a.png").read_bytes() == b"a2"
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="not made by diffattn export"):
        export_report(src, foreign)
    assert (foreign / "notes.txt").read_text() == "keep" and len(list(foreign.iterdir())) == 1


def test_the_gap_claim_needs_diff_ahead_at_the_largest_n():
    """DIFF far behind at N = 1 and level at N = 4: the gap 'grows', but that is not the paper's claim."""
    from diffattn.adapters.registry import PaperClaim
    from diffattn.eval.measures import Run
    from diffattn.experiments.claims import check_claim

    gap = PaperClaim("s", "c", "p", "niah:gap", "higher", "baseline")

    def _niah_gap_claim(evals):
        return check_claim(gap, "base", "diff", {n: Run(n, {}, r) for n, r in evals.items()}, {}, 0)

    def niah(first, last):
        grid = [
            {"N": 1, "R": 1, "accuracy": sum(first) / 60, "scores": first, "strict_scores": first},
            {"N": 4, "R": 1, "accuracy": sum(last) / 60, "scores": last, "strict_scores": last},
        ]
        return {"niah": {"grid": grid, "metadata": {"samples_sha1": "same"}}}

    behind_then_level = {"base": niah([1.0] * 60, [0.0] * 60), "diff": niah([0.0] * 60, [0.0] * 59 + [1.0])}
    row = _niah_gap_claim(behind_then_level)
    assert row.diff_ci[0] > 0 and row.verdict == "inconclusive" and "not ahead at N=4" in row.note
    level_then_ahead = {"base": niah([1.0] * 60, [0.0] * 60), "diff": niah([1.0] * 60, [1.0] * 60)}
    assert _niah_gap_claim(level_then_ahead).verdict == "agrees"


def test_export_refuses_pictures_outside_the_experiment(tmp_path):
    from diffattn.experiments.report import export_report

    src = tmp_path / "exp"
    src.mkdir()
    (src / "report.md").write_text("![x](../secret.png)\n")
    (src / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="outside the experiment folder"):
        export_report(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["exp"]


def test_heatmap_lengths_that_cannot_fit_are_refused_before_training(corpus, tmp_path):
    d = {
        "name": "heat",
        "data": {"source": str(corpus), "seq_len": 32, "vocab_size": 300, "val_sequences": 2},
        "train": {"max_steps": 2, "global_batch_size": 2, "eval_every": 2, "save_every": 2},
        "models": [{"name": "baseline", "preset": "debug"}],
        "eval": {
            "suites": ["niah"],
            "options": {"context_tokens": 256, "niah_grid": [[1, 1]], "niah_needles": 4, "niah_heatmap_lengths": [24]},
        },
    }
    with pytest.raises(ValueError, match="could not fit a needle sample into 24 tokens"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "heat").exists()


def test_a_retrieval_or_icl_row_whose_models_are_both_at_chance_cannot_agree_or_disagree():
    """Both sides' intervals reaching chance (the R = 1 row reads N >= 2: here the N = 2 cell, floor 1/2 for results
    without simulated floors) make any verdict "inconclusive", with the reason in the note; one model clearly above
    chance keeps the verdict. The same rule over seeds, and for ICL."""
    from diffattn.adapters.registry import PaperClaim
    from diffattn.eval.measures import Run
    from diffattn.experiments.claims import check_claim

    solved = PaperClaim("s", "c", "p", "niah:r1", "higher", "baseline")

    def niah(n1, n2):  # per-prompt strict scores of the N = 1 and N = 2 cells (R = 1), 100 prompts each
        grid = [{"N": n, "R": 1, "accuracy": float(np.mean(sc)), "scores": sc, "strict_scores": sc}
                for n, sc in ((1, n1), (2, n2))]  # fmt: skip
        return {"niah": {"grid": grid, "mean_accuracy": float(np.mean([g["accuracy"] for g in grid])),
                         "metadata": {"samples_sha1": "same"}}}  # fmt: skip

    def claim(spec, evals, groups=None):
        return check_claim(spec, "base", "new", {n: Run(n, {}, r) for n, r in evals.items()}, groups or {}, 0)

    # both copy the one number at N = 1 (not read: its floor is 1) and guess at N = 2, the new model luckier on the
    # same prompts (0.40 vs 0.56): a clear paired difference, but of guessing
    guess = {"base": niah([1.0] * 100, [1.0] * 40 + [0.0] * 60), "new": niah([1.0] * 100, [1.0] * 56 + [0.0] * 44)}
    row = claim(solved, guess)
    assert row.diff_ci[0] > 0 and row.verdict == "inconclusive" and "reach chance (0.500," in row.note
    skilled = {**guess, "new": niah([1.0] * 100, [1.0] * 95 + [0.0] * 5)}
    assert claim(solved, skilled).verdict == "agrees"
    # over seeds: three runs a side, every run at chance on average (the mean's t interval reaches 0.75)
    seeds = {f"b{i}": niah([1.0] * 100, [1.0] * (45 + i) + [0.0] * (55 - i)) for i in range(3)}
    seeds |= {f"n{i}": niah([1.0] * 100, [1.0] * (52 + 3 * i) + [0.0] * (48 - 3 * i)) for i in range(3)}
    groups = {"base": ["b0", "b1", "b2"], "new": ["n0", "n1", "n2"]}
    row = claim(solved, seeds, groups)
    assert "3 vs 3" in row.runs and row.verdict == "inconclusive" and "reach chance" in row.note
    # uneven groups (three baselines, one new run): the first run of each is read, and the row names which
    row = claim(solved, seeds, {"base": ["b0", "b1", "b2"], "new": ["n0"]})
    assert row.runs == "one run per model: b0 and n0" and "of 3 vs 1 runs only b0 and n0 are compared" in row.note
    # ICL at the largest shot count, four labels (chance 0.25), both models' intervals over the draws reach it
    many_shot = PaperClaim("s", "c", "p", "icl:many_shot", "higher", "baseline")

    def icl(acc):
        return {"icl": {"many_shot": {"shots": [4], "accuracy": [acc], "labels": ["a", "b", "c", "d"]}}}

    row = claim(many_shot, {"base": icl([0.2, 0.22, 0.21, 0.2]), "new": icl([0.22, 0.30, 0.28, 0.26])})
    assert row.verdict == "inconclusive" and "reach chance (0.250," in row.note
    row = claim(many_shot, {"base": icl([0.2, 0.22, 0.21, 0.2]), "new": icl([0.8, 0.82, 0.81, 0.8])})
    assert row.verdict == "agrees" and "reach chance" not in row.note


def test_allocation_rows_whose_models_both_attend_as_uniform_attention_cannot_agree_or_disagree():
    """Attention to the answer at the share uniform attention gives it (the answer's tokens over the prompt's), and
    noise at uniform's noise share (mirrored: a claim of less noise), compare models that attend to nothing in
    particular: a tight paired difference of 0.002 read as a verdict (an audit, 2026-12-03). A model clearly off
    chance keeps its verdict; results written before the level was kept are read as before."""
    from diffattn.adapters.registry import PaperClaim
    from diffattn.eval.allocation import uniform_shares
    from diffattn.eval.measures import Run
    from diffattn.experiments.claims import check_claim

    buckets = ["bos"] + ["before"] * 120 + ["answer"] * 7 + ["after"] * 110 + ["query"] * 9
    uniform = uniform_shares(buckets)
    assert uniform == {"answer": 7 / 247, "noise": 230 / 247}
    spread = np.random.default_rng(0).normal(0, 0.01, 50)  # the prompts' own spread, shared by both models
    spread -= spread.mean()
    jitter = np.random.default_rng(1).normal(0, 1e-4, 50)

    def alloc(answer, noise, keep_level=True, own=0.0):
        level = {"uniform": uniform} if keep_level else {}
        samples = [{"answer_magnitude": answer + e + own * j, "noise_magnitude": noise - e + own * j, **level}
                   for e, j in zip(spread, jitter, strict=True)]  # fmt: skip
        mean = lambda k: float(np.mean([p[k] for p in samples]))  # noqa: E731
        return {"alloc": {"attention_to_answer": mean("answer_magnitude"), "attention_noise": mean("noise_magnitude"),
                          "attention_to_answer_magnitude": mean("answer_magnitude"),
                          "attention_noise_magnitude": mean("noise_magnitude"), "per_sample": samples,
                          "metadata": {"samples_sha1": "same"}}}  # fmt: skip

    def claim(measure, claimed, base, new):
        spec = PaperClaim("DIFF Transformer Table 3", "c", "p", measure, claimed, "baseline")
        return check_claim(spec, "base", "new", {"base": Run("base", {}, base), "new": Run("new", {}, new)}, {}, 0)

    # the new model 0.002 ahead on every prompt: a tight paired difference, both sides' intervals at chance
    near = {"base": alloc(0.028, 0.931), "new": alloc(0.030, 0.929, own=1.0)}
    row = claim("alloc:attention_to_answer", "higher", near["base"], near["new"])
    assert row.diff_ci[0] > 0 and row.verdict == "inconclusive" and "reach chance (0.028," in row.note
    row = claim("alloc:attention_noise", "lower", near["base"], near["new"])
    assert row.diff_ci[1] < 0 and row.verdict == "inconclusive" and "reach chance (0.931," in row.note
    skilled = alloc(0.30, 0.40)
    assert claim("alloc:attention_to_answer", "higher", near["base"], skilled).verdict == "agrees"
    assert claim("alloc:attention_noise", "lower", near["base"], skilled).verdict == "agrees"
    older = {k: alloc(0.028 + 0.002 * (k == "new"), 0.931, keep_level=False, own=k == "new") for k in ("base", "new")}
    assert claim("alloc:attention_to_answer", "higher", older["base"], older["new"]).verdict == "agrees"


def test_the_r1_row_reads_r1_cells_only_and_the_dex_daa_row_names_the_cells_it_falls_back_to():
    """niah:r1 (DIFF's "R = 1 across N" row) reads the R = 1 cells with N >= 2 and gives no row on a grid without
    them; niah:r1_else_n2 (Dex Fig. 10, DAA Table 2: the paper's cell is N = 8, R = 1) reads every cell with N >= 2
    there (a grid of N = 1 and Table 2's R = 2 cells), and its row over seeds names those cells, as its single-run
    row does, not the R = 1 cells it did not read; with R = 1 cells, both read them in the measure's own words."""
    from diffattn.adapters.registry import PaperClaim
    from diffattn.eval.measures import Run
    from diffattn.experiments.claims import check_claim

    rng = np.random.default_rng(1)

    def niah(cells):
        grid = []
        for n, r in cells:
            sc = [float(x) for x in rng.integers(0, 2, 20)]
            grid.append({"N": n, "R": r, "accuracy": float(np.mean(sc)), "scores": sc, "strict_scores": sc})
        return {"niah": {"grid": grid, "mean_accuracy": 0.5, "metadata": {"samples_sha1": "same"}}}

    groups = {"base": ["b0", "b1"], "new": ["n0", "n1"]}
    r1_words = "prompts solved over the R = 1 cells with N >= 2 (mean over seeds)"
    for measure in ("niah:r1", "niah:r1_else_n2"):
        spec = PaperClaim("s", "c", "p", measure, "higher", "baseline")
        for cells, words, single_cells in (
            (((1, 1), (2, 2), (4, 2)), "prompts solved over cells (N=2, R=2), (N=4, R=2) (the grid has no R = 1 cell",
             "cells (N=2, R=2), (N=4, R=2)"),
            (((1, 1), (2, 1), (4, 1), (4, 2)), r1_words, "R = 1 cells N = 2, 4"),
        ):  # fmt: skip
            runs = {name: Run(name, {}, niah(cells)) for name in ("b0", "b1", "n0", "n1")}
            row, single = check_claim(spec, "base", "new", runs, groups, 0), check_claim(spec, "b0", "n0", runs, {}, 0)
            if measure == "niah:r1" and cells[1][1] == 2:
                assert row is None and single is None
                continue
            assert row.runs == "2 vs 2 seeds" and words in row.ours, row.ours
            assert single.cells == single_cells


def test_the_report_says_where_a_run_stopped_inside_a_longer_schedule():
    from diffattn.experiments.report import _horizon_words

    assert _horizon_words(RunConfig.from_dict({"train": {"max_steps": 500}}).train) == ""
    t = RunConfig.from_dict({"train": {"max_steps": 500, "schedule_steps": 1500}}).validate().train
    assert _horizon_words(t) == (
        ", stopped at step 500 of a 1500-step schedule (150 warmup steps, then decay to 0.04·lr at its end)"
    )


def test_an_export_of_another_experiment_is_not_replaced(tmp_path):
    from diffattn.experiments.report import export_report

    sources = {}
    for name in ("tiny", "tiny3"):
        src = sources[name] = tmp_path / "runs" / name
        src.mkdir(parents=True)
        (src / "report.md").write_text(f"# Experiment `{name}`\n")
        (src / "results.json").write_text(json.dumps({"experiment": name}))
    dest = export_report(sources["tiny"], tmp_path / "results" / "tiny")
    export_report(sources["tiny"], dest)  # the same experiment again: replaced
    with pytest.raises(ValueError, match=r"holds the export of experiment 'tiny', not 'tiny3'"):
        export_report(sources["tiny3"], dest)
    assert (dest / "report.md").read_text() == "# Experiment `tiny`\n"
