"""``diffattn eval``: every suite end to end from a saved model folder, results.json and the
pictures, and one clear error (with no results.json left behind) for each kind of bad input."""

from __future__ import annotations

import json
import re

import pytest

from diffattn.cli import main

SMALL = [
    "--tokens",
    "160",
    "--samples",
    "1",
    "--context-tokens",
    "192",
    "--haystack",
    "filler",
    "--text",
    "filler",
    "--niah-grid",
    "1x1,2x2",
    "--niah-needles",
    "2",
]


def test_every_suite_writes_results_and_pictures(diff_folder, tmp_path, capsys):
    out = tmp_path / "eval"
    suites = "ppl,niah,alloc,icl,mqar,outliers,quant,heads"
    # chatterbot comes from PyPI with `make install`; the Debian data sets have their own (skippable) tests
    icl = ["--icl-dataset", "chatterbot", "--icl-draws", "1", "--icl-test-size", "4", "--mqar-samples", "2"]
    icl += ["--icl-max-chars", "40", "--icl-max-classes", "3", "--icl-context-tokens", "240", "--icl-permutations", "2"]
    code = main(["eval", str(diff_folder), "--suite", suites, "--out", str(out), "--window", "64", *SMALL, *icl])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "results.json").read_text())
    assert list(doc["suites"]) == suites.split(",")
    assert doc["suites"]["alloc"]["metadata"]["num_needles"] == 2  # the heatmap's N: one queried among distractors
    order = doc["suites"]["icl"]["order_robustness"]
    for part in (order, doc["suites"]["icl"]["many_shot"]):  # --icl-context-tokens bounds both ICL prompts
        assert (part["metadata"]["context_length"], part["metadata"]["context_source"]) == (240, "max_length argument")
    assert len(order["arrangements"]["random"]["accuracies"]) == 2
    assert doc["suites"]["heads"]["layers"]["0"]["lambda"] is not None  # our DIFF attention was installed on load
    pngs = ("ppl.png", "niah_heatmap.png", "allocation.png", "icl_accuracy.png", "icl_order.png", "head_distance.png")
    for png in pngs:
        assert (out / png).stat().st_size > 0
    assert not (out / ".partial").exists()
    printed = capsys.readouterr().out
    assert "PPL" in printed and "answer" in printed


@pytest.mark.parametrize(
    "args, message",
    [
        (["no/such/model"], "model 'no/such/model' does not exist"),
        (["{model}", "--suite", "ppl,nope"], "unknown suite.*nope.*choose from ppl, niah"),
        (["{model}", "--suite", "niah", "--context-tokens", "4096"], "--context-tokens=4096 exceeds .*256 positions"),
    ],
)
def test_bad_input_is_one_clear_error_and_the_earlier_results_survive(args, message, diff_folder, tmp_path, capsys):
    import re

    from diffattn.files import mark, new_id

    out = tmp_path / "eval"
    ident = new_id()
    mark(out, "eval", ident=ident)
    earlier = json.dumps({"suites": {"ppl": {}}, "metadata": {"results_version": 3, "diffattn_id": ident}})
    (out / "results.json").write_text(earlier)  # a finished evaluation: a failing rerun must not lose it
    args = [a.replace("{model}", str(diff_folder)) for a in args]
    code = main(["eval", *args, "--out", str(out)])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert (out / "results.json").read_text() == earlier and not (out / ".partial").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--suite", "ppl,icl", "--icl-dataset", "chatterbot", "--icl-max-chars", "40"],
                     r"icl for .* at 256 tokens \(the model's maximum context\): one round of 21 classes does not fit",
                     id="icl"),
        pytest.param(["--suite", "ppl,heads", "--window", "4096"],
                     r"--window needs 4096 tokens but .*'s maximum context is 256", id="window"),
        pytest.param(["--suite", "ppl,mqar", "--mqar-pairs", "64", "--mqar-length", "512", "--mqar-ar-hit", "0"],
                     r"MQAR at seq 512 \(--mqar-length\) needs 512 tokens", id="mqar"),
    ],
)  # fmt: skip
def test_a_suite_that_cannot_run_on_the_model_is_refused_before_the_first_suite_runs(
    args, message, diff_folder, tmp_path, monkeypatch, capsys
):
    """results.json is written when every suite succeeded, so a suite that cannot run on the loaded model (an ICL
    set whose one round overflows the context, a window or MQAR length past its positions) must fail before the
    others run: it failed at its own turn, and the finished suites were lost (a user's review, 2026-12-03)."""
    import dataclasses

    from diffattn.eval.suite import SUITE_TABLE

    ran = []
    entry = SUITE_TABLE["ppl"]
    monkeypatch.setitem(SUITE_TABLE, "ppl", dataclasses.replace(entry, run=lambda *a: ran.append(a) or entry.run(*a)))
    code = main(["eval", str(diff_folder), "--out", str(tmp_path / "eval"), "--tokens", "128", *args])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)
    assert ran == [] and not (tmp_path / "eval" / "results.json").exists()


def test_a_rerun_with_other_suites_removes_the_pictures_its_results_do_not_have(diff_folder, tmp_path):
    """An evaluation folder is replaced by a rerun: its results and pictures are the rerun's alone (an earlier
    alloc's picture stayed beside results without alloc: a user's review, 2026-12-03)."""
    out, small = tmp_path / "eval", ["--tokens", "128", "--window", "64", "--text", "filler"]
    assert main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *small]) == 0
    assert (out / "ppl.png").is_file()
    (out / "notes.txt").write_text("mine")  # not a picture of the evaluation's: left alone
    assert main(["eval", str(diff_folder), "--suite", "outliers", "--out", str(out), *small]) == 0
    assert list(json.loads((out / "results.json").read_text())["suites"]) == ["outliers"]
    assert not (out / "ppl.png").exists() and (out / "notes.txt").read_text() == "mine"


def test_eval_refuses_a_folder_of_someone_elses_files(diff_folder, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.json").write_text("my own notes")
    code = main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *SMALL])
    assert code == 2 and "diffattn eval did not write" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "my own notes" and sorted(p.name for p in out.iterdir()) == [
        "results.json"
    ]


def test_a_paired_run_folder_asks_which_model(tmp_path, capsys):
    for sub in ("standard", "diff"):
        (tmp_path / "run" / sub).mkdir(parents=True)
        (tmp_path / "run" / sub / "run.yaml").write_text("model: {}\n")
    assert main(["eval", str(tmp_path / "run"), "--out", str(tmp_path / "o")]) == 2
    assert "paired pretraining run: evaluate" in capsys.readouterr().err


def test_suites_measure_at_the_trained_length_unless_a_window_is_given(diff_folder, tmp_path):
    """A model trained at L is measured at L by outliers, quant, ppl and heads (issue: outliers at 4× the training
    length were out of distribution), and at an explicit window when one is given."""
    import shutil

    from diffattn.eval.suite import SuiteOptions, load_for_eval, run_suites

    run = tmp_path / "run"
    shutil.copytree(diff_folder, run / "final")
    (run / "run.yaml").write_text("data: {seq_len: 48}\n")
    model, tokenizer, _ = load_for_eval(run)
    suites = ["ppl", "outliers", "quant", "heads"]
    small = SuiteOptions(text="filler", tokens=200)
    doc = run_suites(model, tokenizer, suites, tmp_path / "a", options=small, name="m")
    s = doc["suites"]
    assert doc["metadata"]["trained_length"] == 48
    assert s["ppl"]["metadata"]["window"] == 48
    assert s["outliers"]["metadata"]["seq_len"] == s["quant"]["metadata"]["seq_len"] == 48
    assert s["heads"]["metadata"]["seq_len"] == 48
    assert max(s["quant"]["quantization"][0]["per_window"]["tokens"]) <= 48
    small.window = 32
    doc = run_suites(model, tokenizer, suites, tmp_path / "b", options=small, name="m")
    s = doc["suites"]
    assert s["ppl"]["metadata"]["window"] == s["outliers"]["metadata"]["seq_len"] == s["quant"]["metadata"]["seq_len"]
    assert s["ppl"]["metadata"]["window"] == 32
    # a final/ folder holding run.yaml (what a pretraining run writes) is a model, with its length recorded
    (run / "final" / "run.yaml").write_text("data: {seq_len: 40}\n")
    model, _, description = load_for_eval(run / "final")
    assert model.diffattn_trained_length == 40 and "pretrained model" in description


def test_a_results_file_without_an_identity_licenses_nothing(diff_folder, tmp_path, capsys):
    """issue 36 §2: a results.json that records no diffattn identity (an earlier version's, or a look-alike) does not
    license eval to replace the pictures beside it: refused, naming the folder, the user's ppl.png untouched."""
    out = tmp_path / "old"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"suites": {"ppl": {}}, "metadata": {"results_version": 4}}))
    (out / "ppl.png").write_bytes(b"the user's own picture")
    code = main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *SMALL])
    assert code == 2 and "records no diffattn identity" in capsys.readouterr().err
    assert (out / "ppl.png").read_bytes() == b"the user's own picture"


def test_a_second_eval_into_a_folder_in_use_is_refused_naming_the_first(diff_folder, tmp_path, capsys):
    """issue 36 §3: eval takes the folder's lock; a second one is refused while the first holds it, and nothing of
    the first's is touched."""
    import subprocess
    import sys

    out = tmp_path / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from diffattn.files import lock_folder; "
         f"lock_folder({str(out)!r}, command='diffattn eval'); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        code = main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *SMALL])
        assert code == 2 and f"in use by diffattn process {holder.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    assert main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *SMALL]) == 0  # free again
    assert main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), *SMALL]) == 0  # its own folder
