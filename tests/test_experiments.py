"""Declarative experiments (issue 7, first part): config parsing and overrides, a `debug` experiment end to end
(pretrain, adapt, evaluate, report), and a rerun that skips every finished part."""

from __future__ import annotations

import json
import random

import pytest

from diffattn.experiments import ExperimentConfig, run_experiment
from diffattn.experiments.schema import validate_results

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


def test_debug_experiment_end_to_end_then_a_rerun_skips_everything(corpus, tmp_path):
    config = ExperimentConfig.from_dict(_debug(corpus))
    outcomes = run_experiment(config, tmp_path)
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
    assert (out / "loss_curves.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    validate_results(results)
    assert {m["model"] for m in results["models"]} == {"baseline", "diff", "dex", "lora"}
    assert results["evaluations"]["diff"]["ppl"]["ppl"] > 0
    # the claims the experiment touches: DIFF vs baseline (loss, allocation) and Dex vs its base (allocation)
    sources = [c["source"] for c in results["claims"]]
    assert sources == ["DIFF Transformer Fig. 3–4", "DIFF Transformer Table 3", "Dex Table 2"]
    assert all(c["agrees"] in (True, False, None) and c["ours"] for c in results["claims"])
    assert "## Paper claims" in report and "| Dex Table 2 |" in report
    assert (out / "allocation_all.png").stat().st_size > 0
    again = run_experiment(config, tmp_path)
    assert all(o.state == "done" for o in again)
    # a longer budget for one model resumes it; changed settings are refused unless overwritten
    longer = config.with_overrides({"models.0.train": {"max_steps": 4}})
    states = {(o.kind, o.name): o.state for o in run_experiment(longer, tmp_path, report=False)}
    assert states[("pretrain", "baseline")] == "resume" and states[("pretrain", "diff")] == "done"
    changed = config.with_overrides({"models.1.model": {"lambda_init": 0.5}})
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
        (lambda d: d["models"][0].update(attention="both"), "attention must be standard or diff"),
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
        assert config.name == path.stem and config.models and config.eval.suites


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
    assert [c["source"] for c in results["claims"]] == ["Dex Table 2"]  # Dex vs its pretrained base


def test_zero_steps_and_a_foreign_folder_are_refused_before_anything_runs(corpus, tmp_path):
    d = _debug(corpus)
    d["train"]["max_steps"] = 0
    with pytest.raises(ValueError, match=r"train\.max_steps must be >= 1"):
        run_experiment(ExperimentConfig.from_dict(d), tmp_path)
    assert not (tmp_path / "debug-exp").exists()
    foreign = tmp_path / "other" / "debug-exp"
    foreign.mkdir(parents=True)
    (foreign / "run.yaml").write_text("model: {}\n")  # e.g. a pretraining run folder
    with pytest.raises(ValueError, match="not an experiment folder"):
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


def test_claims_call_a_difference_the_report_cannot_show_a_tie(corpus):
    from diffattn.experiments.claims import paper_claims

    config = ExperimentConfig.from_dict(_debug(corpus))
    rows = {"baseline": {"val_loss": 5.00001}, "diff": {"val_loss": 5.00002}}  # equal at the 4 digits printed

    def alloc(answer, noise):
        return {"alloc": {"attention_to_answer": answer, "attention_noise": noise}}

    evals = {"baseline": alloc(0.02, 0.5), "diff": alloc(0.05, 0.5), "dex": alloc(0.01, 0.4)}
    verdicts = {(c.source, c.claim.split()[0]): c.agrees for c in paper_claims(config, rows, evals)}
    assert verdicts[("DIFF Transformer Fig. 3–4", "lower")] is None
    assert verdicts[("DIFF Transformer Table 3", "more")] is True  # more to the answer, noise tied
    assert verdicts[("Dex Table 2", "Dex")] is False  # less to the answer than its base
