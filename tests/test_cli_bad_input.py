"""One clear message for every bad input: a table of bad command lines, each of which must end
with exit code 2 and one line on stderr naming what was wrong (and what is allowed), no traceback, and every file
that existed before unchanged (checksums over the whole fixture folder).

The cases are refused before any training or evaluation starts, so the table runs in seconds. ``{model}`` is a
saved `debug` DIFF model with its tokenizer, ``{corpus}`` a small text corpus, ``{exp}`` a valid experiment file;
the other placeholders are the bad files made by :func:`world`."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from diffattn import build_model
from diffattn.cli import main
from diffattn.experiments.report import EXPORT_MARKER, export_report
from diffattn.files import LOCK, MARKER, mark

CASES = [
    # ---- pretrain
    ("pretrain --attention diff", r"the following arguments are required: --out"),
    (
        "pretrain --out {new} --attention triple",
        r"invalid choice: 'triple' \(choose from 'standard', 'diff', 'diff-v2', 'both', 'all'\) "
        r"\(see diffattn pretrain --help",
    ),
    ("pretrain --out {new} --preset nope", r"unknown preset 'nope'; allowed: debug, quick"),
    ("pretrain --out {new} --set model.preset=null", r"model.preset must be a string, got None"),
    ("pretrain --out {new} --data /no/such/corpus.txt", r"does not exist"),
    ("pretrain --out {new} --data {binary}", r"is not text"),
    ("pretrain --out {new} --data {tiny_corpus}", r"too small"),
    ("pretrain --out {new} --max-steps 0", r"train.max_steps must be >= 1"),
    ("pretrain --out {new} --lr -1", r"train.lr must be > 0"),
    ("pretrain --out {new} --lr nan", r"train.lr must be > 0"),
    ("pretrain --out {new} --batch-size 0", r"train.global_batch_size must be >= 1"),
    # the optimiser's settings before anything is written (torch refused a beta at the first step, after run.yaml)
    ("pretrain --out {new} --set train.beta2=1.5", r"train.beta2 must be in \[0, 1\)"),
    # every arm of a paired run is checked before the first trains (the baseline trained whole, then DIFF failed)
    (
        "pretrain --out {new} --attention both --data {corpus} --set model.overrides.num_kv_heads=1",
        r"even num_kv_heads",
    ),
    ("pretrain --out {new} --max-steps abc", r"argument --max-steps: invalid int value: 'abc'"),
    ("pretrain --out {new} --config /no/such.yaml", r"config file '/no/such.yaml' does not exist"),
    ("pretrain --out {new} --config {bad_yaml}", r"is not valid YAML"),
    ("pretrain --out {new} --config {list_yaml}", r"must hold a mapping"),
    ("pretrain --out {new} --set train.nope=1", r"unknown.*nope"),
    ("pretrain --out {new} --set train.lr", r"--set expects a.b=value"),
    ("pretrain --out {new} --resume --overwrite", r"not allowed with argument"),
    ("pretrain --out {a_file} --data {corpus}", r"is a file"),
    ("pretrain --out {decoy} --overwrite --data {corpus}", r"did not make it"),
    # a marker alone licenses no deletion: empty, garbage, copied from another run, an earlier version's (no
    # identity), or another kind's (a whole experiment); a folder a running process holds is refused, naming it
    (
        "pretrain --out {planted} --overwrite --data {corpus}",
        r"refuses to delete .*\.diffattn file is not one diffattn",
    ),
    ("pretrain --out {garbage_marker} --overwrite --data {corpus}", r"\.diffattn file is not one diffattn wrote"),
    ("pretrain --out {copied_marker} --overwrite --data {corpus}", r"do not name the same run \(a copied"),
    ("pretrain --out {old_run} --overwrite --data {corpus}", r"records no identity, so nothing proves"),
    ("pretrain --out {root}/demo --overwrite --data {corpus}", r"it is a diffattn experiment folder, not a run"),
    (
        "pretrain --out {busy} --data {corpus}",
        r"'.*busy' is in use by diffattn process \d+ on .* \(diffattn pretrain\)",
    ),
    ("pretrain --out {busy} --overwrite --data {corpus}", r"is in use by diffattn process \d+"),
    ("pretrain --out {busy} --resume --data {corpus}", r"is in use by diffattn process \d+"),
    ("pretrain --out . --overwrite --data {corpus}", r"working folder"),
    ("pretrain --out {new} --resume --data {corpus}", r"nothing to resume"),
    ("pretrain --out {single_run} --attention both --data {corpus}", r"holds a single run"),
    ("pretrain --out {new} --retrieval-fraction 1.5", r"retrieval_fraction must be in \[0, 1\)"),
    (
        "pretrain --out {new} --lr -1e-3",
        r"argument --lr: expected one argument \(a value that starts with '-'.*--lr=-1e-3",
    ),
    ("pretrain --out {new} --lr=-1e-3", r"train\.lr must be > 0"),
    ("bench attention --heads 0", r"argument --heads: want a positive integer, got '0'"),
    ("pretrain --out {new} --set data.mqar_pairs=[0]", r"data.mqar_pairs must be None or a list of ints >= 1"),
    ("pretrain --out {new} --seq-len 64 --set data.mqar_pairs=[4,17]", r"mqar_pairs 17 does not fit data.seq_len 64"),
    ("pretrain --out {new} --set data.mqar_vocab=2", r"data.mqar_vocab must be None or an int >= 4"),
    ("pretrain --out {new} --backend nope", r"backend"),
    ("pretrain --out {new} --grad-accum 3 --batch-size 8 --data {corpus}", r"must be divisible"),
    ("pretrain --out {new} --fsdp --data {corpus}", r"--fsdp\) needs CUDA"),
    ("pretrain --out {new} --compile fast", r"argument --compile: invalid choice: 'fast'"),
    ("adapt --out {new} --set train.compile=fast", r"train.compile must be null \(eager\) or a torch.compile mode"),
    ("pretrain --out {new} --cuda-graphs", r"train\.cuda_graphs replays CUDA graphs: this run's device is cpu"),
    ("pretrain --out {new} --cuda-graphs --packing", r"train\.cuda_graphs with data\.packing"),
    ("adapt --out {new} --cuda-graphs --compile", r"train\.cuda_graphs with train\.compile: choose one"),
    # ---- adapt
    ("adapt --out {new} --model gemma3-270m", r"unknown pretrained model 'gemma3-270m': give one of smollm2-135m"),
    ("adapt --out {new} --model /no/such/folder", r"does not exist"),
    ("adapt --out {new} --model {no_weights} --data {corpus}", r"no weights"),
    ("adapt --out {new} --model {no_tokenizer} --data {corpus}", r"no tokenizer"),
    ("adapt --out {new} --method nope", r"method.name must be one of dex.*got 'nope'"),
    ("adapt --out {new} --method difflora --set method.rank=-1", r"rank must be"),
    ("adapt --out {new} --method dex --set method.nope=1", r"unknown.*nope"),
    ("adapt --out {new} --method daa --merge", r"--merge applies to dex and diffv only"),
    ("adapt --out {model} --model {model} --data {corpus}", r"overlap"),
    ("adapt --out {new} --model {model} --method daa --recipe paper --max-steps 40", r"warms up for 500 steps"),
    ("adapt --out {new} --recipe best", r"invalid choice: 'best'"),
    ("adapt --out {new} --model {adapted} --data {corpus}", r"adapting an adapted model is not supported"),
    # ---- eval
    ("eval /no/such/model --out {new}", r"does not exist"),
    ("eval {model} --out {new} --suite ppl,nope", r"unknown suite.*nope"),
    ("eval {model} --out {new} --samples 0", r"--samples must be >= 1"),
    ("eval {model} --out {new} --tokens -5", r"--tokens must be >= 1"),
    ("eval {model} --out {new} --niah-grid 2x3", r"NxR cells with 1 <= R <= N"),
    ("eval {model} --out {new} --niah-multivalue 8x1", r"--niah-multivalue wants one NxV cell with 2 <= V <= N"),
    ("eval {model} --out {new} --niah-multivalue 8x4,6x2", r"--niah-multivalue wants one NxV cell"),
    (
        "eval {model} --out {new} --niah-grid-placement middle",
        r"--niah-grid-placement: unknown placement .middle.; choose",
    ),
    ("eval {model} --out {new} --niah-digits 0", r"--niah-digits must be between 1 and 12"),
    ("eval {model} --out {new} --suite icl --icl-dataset nope", r"unknown ICL dataset 'nope'"),
    ("eval {model} --out {new} --suite icl --icl-context-tokens 4", r"--icl-context-tokens must be >= 8"),
    ("eval {model} --out {a_file}", r"is a file"),
    ("eval {model} --out {decoy}", r"did not write"),
    ("eval {no_weights} --out {new}", r"no weights"),
    ("eval {model} --out {new} --suite ppl --text /no/such.txt", r"does not exist"),
    # ---- run
    ("run /no/such.yaml", r"does not exist"),
    ("run {bad_yaml}", r"is not valid YAML"),
    ("run {list_yaml}", r"must be a mapping"),
    ("run {exp_bad_eval_option}", r"unknown key\(s\) nope in eval.options"),
    ("run {exp_bad_adapter_option}", r"adapters\[d\]: DiffLoRAConfig.rank must be >= 1"),
    ("run {exp} --root {root} --overwrite nope", r"--overwrite names no part.*nope"),
    ("run {exp} --root {root} --set models.9.preset=small", r"is not an item of the list"),
    ("run {exp_same_name} --root {root}", r"holds the experiment"),
    ("run {exp} --root {root} --overwrite t", r"demo/models/t cannot be redone: .*records no identity"),
    ("run {exp} --root {copied_root}", r"do not name the same experiment \(a copied marker\?\)"),
    # ---- bench, export
    ("bench attention --device cuda", r"CUDA is not available"),
    ("export {decoy} {new}", r"no report.md"),
    ("export {new} {decoy}", r"experiment folder .* does not exist"),
    ("export {finished_exp} {decoy}", r"not made by diffattn export"),
    ("export {linked_exp} {new}", r"report\.md is \(or lies under\) a symbolic link"),
    ("export {finished_exp} {edited_export}", r"would overwrite report\.md \(changed since diffattn export wrote it\)"),
    ("export {finished_exp} {planted_export}", r"\.diffattn-export file diffattn export did not write"),
    ("refresh {emptied_export}", r"emptied/results\.json is not a results file \(no config, models, evaluations\)"),
    ("refresh {damaged_export}", r"damaged/results\.json is not valid JSON \(Extra data.*\): the folder is damaged"),
]


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _experiment(corpus: Path, name: str, **extra) -> dict:
    return {
        "name": name,
        "data": {"source": str(corpus), "vocab_size": 300, "seq_len": 32},
        "train": {"max_steps": 2, "global_batch_size": 2, "eval_every": 2, "save_every": 2},
        "models": [{"name": "t", "preset": "debug", "attention": "standard"}],
        "eval": {"suites": ["ppl"], "options": {"tokens": 64, "text": "filler"}},
        **extra,
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    """Every file the table's command lines name, in one folder (checksummed around each case)."""
    root = tmp_path_factory.mktemp("world")
    files = {"new": root / "does-not-exist-yet", "root": root / "runs"}
    model = root / "model"
    build_model("debug", "diff", seed=0, vocab_size=len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    files["model"] = model
    no_weights = root / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((model / "config.json").read_text())
    tokenizer.save_pretrained(no_weights)
    files["no_weights"] = no_weights
    no_tokenizer = root / "no-tokenizer"
    build_model("debug", "standard", seed=0, vocab_size=len(tokenizer)).save_pretrained(no_tokenizer)
    files["no_tokenizer"] = no_tokenizer
    corpus = root / "corpus.txt"
    corpus.write_text(("The king and the queen walked by the river at night. " * 40 + "\n\n") * 30)
    files["corpus"] = corpus
    (root / "binary.txt").write_bytes(bytes(range(256)) * 64)  # a .txt name does not make it text
    files["binary"] = root / "binary.txt"
    (root / "tiny.txt").write_text("twenty characters!!\n")
    files["tiny_corpus"] = root / "tiny.txt"
    (root / "bad.yaml").write_text("model: {preset: debug\ntrain: [1, 2\n")
    files["bad_yaml"] = root / "bad.yaml"
    (root / "list.yaml").write_text("- 1\n- 2\n")
    files["list_yaml"] = root / "list.yaml"
    (root / "a-file").write_text("not a folder")
    files["a_file"] = root / "a-file"
    decoy = root / "thesis"
    decoy.mkdir()
    (decoy / "chapter.tex").write_text("\\chapter{One}")
    files["decoy"] = decoy
    single = root / "single-run"
    mark(single, "run", command="pretrain")
    (single / "run.yaml").write_text(yaml.safe_dump({"model": {"preset": "debug", "attention": "diff"}}))
    (single / "summary.json").write_text("{}")
    files["single_run"] = single
    adapted = root / "adapted-run"
    mark(adapted, "run", command="adapt")
    (adapted / "run.yaml").write_text(yaml.safe_dump({"model": {"name": str(model)}, "method": {"name": "dex"}}))
    (adapted / "summary.json").write_text(json.dumps({"method": "dex"}))
    (adapted / "adapter").mkdir()
    (adapted / "adapter" / "adapter_config.json").write_text("{}")
    files["adapted"] = adapted
    for key, extra in {
        "exp": {},
        "exp_bad_eval_option": {"eval": {"suites": ["ppl"], "options": {"nope": 1}}},
        "exp_bad_adapter_option": {
            "adapters": [{"name": "d", "base": "t", "method": "difflora", "options": {"rank": -1}}]
        },
    }.items():
        path = root / f"{key}.yaml"
        path.write_text(yaml.safe_dump(_experiment(corpus, "demo", **extra)))
        files[key] = path
    (root / "elsewhere").mkdir()
    other = root / "elsewhere" / "exp.yaml"
    other.write_text(yaml.safe_dump(_experiment(corpus, "demo")))
    files["exp_same_name"] = other
    demo = mark(files["root"] / "demo", "experiment", name="demo", source=str(files["exp"].resolve()))
    (demo / "experiment.yaml").write_text(files["exp"].read_text())
    finished = root / "runs" / "finished"
    mark(finished, "experiment", name="finished", source=None)
    (finished / "report.md").write_text("# report\n")
    (finished / "results.json").write_text("{}")
    files["finished_exp"] = finished
    # ---- marker and lock cases: someone's files beside a marker diffattn did not write (or not for them)
    for key, text in {
        "planted": "",
        "garbage_marker": "{not json",
        "copied_marker": (single / MARKER).read_text(),
    }.items():
        folder = root / key.replace("_", "-")
        folder.mkdir()
        (folder / MARKER).write_text(text)
        (folder / "precious.txt").write_text("mine")
        files[key] = folder
    old_run = root / "old-run"  # as an earlier version left a run: a marker without identity
    old_run.mkdir()
    (old_run / MARKER).write_text(json.dumps({"kind": "run", "command": "pretrain"}))
    (old_run / "run.yaml").write_text((single / "run.yaml").read_text())
    files["old_run"] = old_run
    part = files["root"] / "demo" / "models" / "t"  # an experiment's part left by an earlier version
    shutil.copytree(old_run, part)
    copied_root = root / "copied-root"  # an experiment folder whose marker is not its experiment.yaml's
    copied = mark(copied_root / "demo", "experiment", ident="a" * 32, name="demo", source=str(files["exp"].resolve()))
    (copied / "experiment.yaml").write_text(files["exp"].read_text() + "# diffattn-id: " + "b" * 32 + "\n")
    files["copied_root"] = copied_root
    busy = root / "busy"  # a run in progress elsewhere: its lock file held (here by this process, as another would)
    busy.mkdir()
    (busy / MARKER).write_text(json.dumps({"kind": "run", "id": "c" * 32, "command": "pretrain"}))
    lock = os.open(busy / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.write(
        lock, json.dumps({"pid": 4242, "host": "elsewhere", "since": "now", "command": "diffattn pretrain"}).encode()
    )
    files["busy"] = busy
    # ---- export cases
    linked = root / "runs" / "linked"
    linked.mkdir()
    (linked / "report.md").symlink_to(finished / "report.md")
    (linked / "results.json").write_text("{}")
    files["linked_exp"] = linked
    edited = export_report(finished, root / "exported")
    (edited / "report.md").write_text("# report\nmy own conclusions\n")
    files["edited_export"] = edited
    damaged = export_report(finished, root / "damaged")
    (damaged / "results.json").write_text((damaged / "results.json").read_text() + "x")
    files["damaged_export"] = damaged
    emptied = export_report(finished, root / "emptied")
    (emptied / "results.json").write_text("{}")
    files["emptied_export"] = emptied
    planted_export = root / "planted-export"
    planted_export.mkdir()
    (planted_export / EXPORT_MARKER).write_text("")
    (planted_export / "notes.md").write_text("mine")
    files["planted_export"] = planted_export
    yield root, files
    os.close(lock)


@pytest.mark.parametrize("command, message", CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_exit_2_one_line_and_nothing_changed(command, message, world, capsys, monkeypatch):
    root, files = world
    monkeypatch.chdir(root)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine
    argv = [part.format(**{k: str(v) for k, v in files.items()}) for part in command.split()]
    before = checksums(root)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert re.search(message, lines[0]), lines[0]
    assert checksums(root) == before
    assert not files["new"].exists()


def test_the_table_is_at_least_forty_cases():
    assert len(CASES) >= 40
