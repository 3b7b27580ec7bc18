"""Nothing lost, ever: ``--overwrite`` deletes only folders diffattn provably made (a marker alone proves
nothing) and never the working folder; one run at a time writes into a folder (its lock); an adapter run cannot write
into its base; only finite, complete checkpoints are published, kept by rotation and resumed from, and a resume checks
them before it writes; ``metrics.jsonl`` holds each step once after a resume; a same-name experiment from another file
is refused; an export writes only its own files and follows no link. Each case checks that every pre-existing file
is unchanged (checksums), not only that an error was raised."""

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
from transformers import TrainerCallback

from diffattn.cli import main
from diffattn.experiments.report import EXPORT_MARKER, export_report
from diffattn.experiments.runner import check_experiment_folder, run_state
from diffattn.files import (
    LOCK,
    MARKER,
    RUN_CONFIG,
    FolderInUseError,
    UnsafeDeleteError,
    check_removable,
    empty_folder,
    lock_folder,
    lock_holder,
    mark,
    new_id,
    publish_folder,
    recorded_id,
    release_folder,
    save_record,
    write_text_atomic,
)
from diffattn.train import (
    NonFiniteLossError,
    RunConfig,
    RunFolderError,
    checkpoint_problem,
    latest_checkpoint,
    pretrain,
)
from diffattn.train.adapt import adapt_pretrained
from diffattn.train.trainer import check_run_dir, rotate_checkpoints, start_run_folder

from .helpers import adapt_config, debug_config

pytestmark = pytest.mark.usefixtures("tokenizer_cache")


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def decoy(tmp_path) -> Path:
    """A folder of someone's files that happens to be named as an output folder."""
    folder = tmp_path / "thesis"
    (folder / "chapters").mkdir(parents=True)
    (folder / "chapters" / "one.tex").write_text("\\chapter{One}")
    (folder / "data.csv").write_text("a,b\n1,2\n")
    return folder


# ---------------------------------------------------------------- what --overwrite may delete


def test_overwrite_refuses_a_folder_diffattn_did_not_make(corpus_file, decoy):
    before = checksums(decoy)
    with pytest.raises(UnsafeDeleteError, match="did not make it"):
        pretrain(debug_config(corpus_file, max_steps=2), decoy, overwrite=True)
    assert checksums(decoy) == before


@pytest.mark.parametrize("where", [".", ".."])
def test_overwrite_refuses_the_working_folder_and_its_parents(where, tmp_path, monkeypatch):
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("keep me")
    mark(work, "run")  # even a folder diffattn made is never deleted while it is the working folder
    monkeypatch.chdir(work)
    with pytest.raises(UnsafeDeleteError, match="working folder"):
        check_removable(Path(where), kind="run")
    assert (work / "notes.txt").read_text() == "keep me"


def test_overwrite_refuses_home_and_root_and_files(tmp_path):
    with pytest.raises(UnsafeDeleteError, match="home folder"):
        check_removable(Path.home(), kind="run")
    with pytest.raises(UnsafeDeleteError, match="root"):
        check_removable(Path("/"), kind="run")
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(UnsafeDeleteError, match="is a file"):
        check_removable(f, kind="run")


def test_overwrite_replaces_a_run_diffattn_made(corpus_file, tmp_path):
    run = tmp_path / "run"
    pretrain(debug_config(corpus_file, max_steps=2, save_every=2, eval_every=2), run)
    assert json.loads((run / MARKER).read_text())["kind"] == "run"
    (run / "stale.txt").write_text("from the first run")
    pretrain(debug_config(corpus_file, max_steps=2, save_every=2, eval_every=2), run, overwrite=True)
    assert not (run / "stale.txt").exists() and (run / "summary.json").is_file()


def test_out_naming_a_file_is_refused(corpus_file, tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\x00" * 10)
    with pytest.raises(RunFolderError, match="is a file"):
        pretrain(debug_config(corpus_file, max_steps=2), f)
    assert f.read_bytes() == b"\x00" * 10


@pytest.mark.parametrize("inside", [False, True])
def test_an_adapter_run_cannot_write_into_its_base(inside, base_dir, corpus_dir, tmp_path):
    import shutil

    base = tmp_path / "base-run"
    shutil.copytree(base_dir, base / "final")
    mark(base, "run")
    before = checksums(base)
    out = base / "final" / "dex" if inside else base  # the run inside the base, or the base inside the run
    with pytest.raises(RunFolderError, match="overlap"):
        adapt_pretrained(adapt_config(base / "final", corpus_dir, "dex"), out, overwrite=not inside)
    assert checksums(base) == before


# ---------------------------------------------------------------- checkpoints


class _PoisonAfterStep(TrainerCallback):
    """Makes the weights NaN at the end of step ``step``, after its (finite) loss was computed: the case where the
    loss is finite one step longer than the weights, and the step's checkpoint would hold NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))


def test_a_checkpoint_with_non_finite_weights_is_never_published(corpus_file, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"step 4 not saved: .*non-finite"):
        pretrain(debug_config(corpus_file, save_every=2), run, callbacks=[_PoisonAfterStep(4)])
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    good = latest_checkpoint(run)
    assert good.name == "checkpoint-2" and checkpoint_problem(good) is None


def _extendable(corpus_file, **train):
    """A 12-step run with checkpoints 4, 8, 12, planned over a 16-step schedule so a resume may extend it."""
    return debug_config(corpus_file, save_every=4, keep_checkpoints=3, schedule_steps=16, **train)


@pytest.fixture(scope="module")
def finished_run(corpus_file, tmp_path_factory) -> Path:
    """One finished run of :func:`_extendable`, trained once for the tests that damage, rotate or resume a copy."""
    run = tmp_path_factory.mktemp("finished") / "run"
    with pytest.MonkeyPatch.context() as patch:  # the tokenizer_cache fixture's cache, for a module's fixture
        patch.setenv("DIFFATTN_CACHE", str(tmp_path_factory.getbasetemp() / "tokenizer-cache"))
        pretrain(_extendable(corpus_file), run)
    return run


def _complete_run(finished_run: Path, run: Path) -> None:
    """A copy of the finished run at ``run``: the tests change what they are given."""
    shutil.copytree(finished_run, run, symlinks=True)


def test_a_truncated_optimizer_state_is_skipped_by_resume(corpus_file, finished_run, tmp_path):
    run = tmp_path / "run"
    _complete_run(finished_run, run)
    optimizer = run / "checkpoints" / "checkpoint-12" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])
    assert "optimizer.pt" in checkpoint_problem(optimizer.parent)
    assert latest_checkpoint(run).name == "checkpoint-8"
    # --resume falls back to checkpoint-8 (with a warning) and replays steps 9-12: each step logged once
    pretrain(_extendable(corpus_file, max_steps=14), run, resume=True)
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 15))


def test_rotation_never_deletes_the_newest_complete_checkpoint(finished_run, tmp_path):
    run = tmp_path / "run"
    _complete_run(finished_run, run)  # checkpoints 4, 8, 12
    for step in (16, 20):  # two newer folders, both corrupt (a crash, a full disk)
        bad = run / "checkpoints" / f"checkpoint-{step}"
        bad.mkdir()
        (bad / "trainer_state.json").write_text("{")
    deleted = rotate_checkpoints(run, keep=2)
    left = sorted((p.name for p in (run / "checkpoints").iterdir()), key=lambda n: int(n.split("-")[1]))
    assert left == ["checkpoint-12", "checkpoint-16", "checkpoint-20"]
    assert {p.name for p in deleted} == {"checkpoint-4", "checkpoint-8"}
    assert latest_checkpoint(run).name == "checkpoint-12"


# ---------------------------------------------------------------- atomic replacement, experiments


def test_publish_folder_puts_the_old_result_back_when_the_move_fails(tmp_path, monkeypatch):
    import diffattn.files as files

    final, new = tmp_path / "final", tmp_path / "final.tmp"
    final.mkdir()
    (final / "w").write_text("old")
    new.mkdir()
    real_replace, calls = os.replace, []

    def failing_second_replace(src, dst):
        calls.append(src)
        if len(calls) == 2:  # the new folder's move into place
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", failing_second_replace)
    with pytest.raises(OSError, match="disk full"):
        publish_folder(new, final)
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert (final / "w").read_text() == "old"


def test_overwrite_refuses_a_symbolic_link_and_atomic_files_are_world_readable(tmp_path):
    target = tmp_path / "real"
    mark(target, "run")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafeDeleteError, match="symbolic link"):
        check_removable(link, kind="run")
    old = os.umask(0o022)
    try:
        f = write_text_atomic(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    assert f.stat().st_mode & 0o777 == 0o644


def test_publish_folder_and_atomic_text_keep_the_old_result_until_the_new_one_is_in(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "w").write_text("old")
    new = tmp_path / "final.tmp"
    new.mkdir()
    (new / "w").write_text("new")
    publish_folder(new, final)
    assert (final / "w").read_text() == "new" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # the old copy is gone once replaced
    write_text_atomic(tmp_path / "results.json", "1")
    write_text_atomic(tmp_path / "results.json", "2")
    assert (tmp_path / "results.json").read_text() == "2" and len(os.listdir(tmp_path)) == 2


def test_a_same_name_experiment_from_another_file_is_refused(tmp_path):
    out = tmp_path / "runs" / "demo"
    mark(out, "experiment", name="demo", source="/a/first.yaml")
    (out / "report.md").write_text("the first experiment's report")
    check_experiment_folder(out, "demo", "/a/first.yaml")  # the same file again: fine
    with pytest.raises(ValueError, match=r"holds the experiment 'demo' from /a/first\.yaml; this one is from"):
        check_experiment_folder(out, "demo", "/b/second.yaml")
    someone = tmp_path / "runs" / "mine"
    someone.mkdir()
    (someone / "x.txt").write_text("x")
    with pytest.raises(ValueError, match="not made by diffattn run"):
        check_experiment_folder(someone, "mine", None)
    (someone / MARKER).write_text("1")  # a marker that is not ours in form counts as no kind, not a crash
    with pytest.raises(ValueError, match="not an experiment's"):
        check_experiment_folder(someone, "mine", None)


def test_a_checkpoint_after_a_non_finite_gradient_norm_is_never_published(corpus_file, tmp_path, monkeypatch):
    """The gradient norm of the step a checkpoint ends (clipping may keep the weights finite a while longer)."""
    from diffattn.train.trainer import DiffattnTrainer

    real = DiffattnTrainer._get_grad_norm

    def inf_at_step_4(self, model, grad_norm=None):
        value = real(self, model, grad_norm=grad_norm)
        self.last_grad_norm = float("inf") if self.state.global_step == 3 else value  # step 4 is being taken
        return value

    monkeypatch.setattr(DiffattnTrainer, "_get_grad_norm", inf_at_step_4)
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match="gradient norm became inf at step 4"):
        pretrain(debug_config(corpus_file, save_every=2), run)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]


# ---------------------------------------------------------------- what proves a folder is diffattn's (issue 29)


def _proven_run(folder: Path, corpus_file) -> Path:
    """A run folder as start_run_folder leaves it: a marker and a run.yaml naming the same identity."""
    ident = new_id()
    mark(folder, "run", ident=ident, command="pretrain")
    save_record(debug_config(corpus_file), folder / RUN_CONFIG, ident)
    (folder / "metrics.jsonl").write_text("{}\n")
    return folder


@pytest.mark.parametrize("how", ["empty", "garbage", "copied", "earlier version", "experiment", "edited run.yaml"])
def test_a_marker_alone_licenses_no_deletion(how, corpus_file, tmp_path):
    run = _proven_run(tmp_path / "run", corpus_file)
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter.tex").write_text("\\chapter{One}")
    message = {
        "empty": "not one diffattn wrote",
        "garbage": "not one diffattn wrote",
        "copied": r"do not name the same run \(a copied or hand-made marker\?\)",
        "earlier version": "records no identity",
        "experiment": "it is a diffattn experiment folder, not a run folder",
        "edited run.yaml": "do not name the same run",
    }[how]
    if how == "empty":
        (folder / MARKER).write_text("")
    elif how == "garbage":
        (folder / MARKER).write_text("\x00\x01 not json")
    elif how == "copied":  # the marker of a real run, and even a run.yaml of one (without its identity line)
        (folder / MARKER).write_text((run / MARKER).read_text())
        debug_config(corpus_file).save(folder / RUN_CONFIG)
    elif how == "earlier version":
        (folder / MARKER).write_text(json.dumps({"kind": "run", "command": "pretrain"}))
        debug_config(corpus_file).save(folder / RUN_CONFIG)
    elif how == "experiment":  # a whole experiment folder, given to pretrain --overwrite as its --out
        ident = new_id()
        save_record(debug_config(corpus_file), folder / "experiment.yaml", ident)
        mark(folder, "experiment", ident=ident, name="demo", source=None)
    else:  # a run whose run.yaml someone rewrote: nothing proves the folder is still only the run's
        folder = run
        debug_config(corpus_file).save(run / RUN_CONFIG)
    before = checksums(tmp_path)
    with pytest.raises(UnsafeDeleteError, match=message):
        check_removable(folder, kind="run")
    with pytest.raises(UnsafeDeleteError, match=message):
        pretrain(debug_config(corpus_file, max_steps=2), folder, overwrite=True)
    assert checksums(tmp_path) == before
    if how != "edited run.yaml":
        check_removable(run, kind="run")  # the real run: provably ours
        proof = _proven_run(tmp_path / "bookkeeping-only", corpus_file)
        for p in proof.iterdir():
            if p.name != MARKER:
                p.unlink()
        (proof / MARKER).write_text("")
        check_removable(proof, kind="run")  # a marker alone, of any form, and nothing else: nothing to lose


def test_an_earlier_versions_run_resumes_and_is_then_provably_ours(corpus_file, finished_run, tmp_path):
    run = tmp_path / "run"
    _complete_run(finished_run, run)
    (run / MARKER).write_text(json.dumps({"kind": "run", "command": "pretrain"}))  # as an earlier version wrote it
    _extendable(corpus_file).save(run / RUN_CONFIG)
    with pytest.raises(UnsafeDeleteError, match="records no identity"):
        check_removable(run, kind="run")
    pretrain(_extendable(corpus_file, max_steps=14), run, resume=True)
    check_removable(run, kind="run")  # resumed: its marker and run.yaml now name one identity
    ident = json.loads((run / MARKER).read_text())["id"]
    assert recorded_id(run / RUN_CONFIG) == ident
    assert yaml.safe_load((run / RUN_CONFIG).read_text())["train"]["max_steps"] == 14  # the comment is ignored
    pretrain(_extendable(corpus_file, max_steps=16), run, resume=True)
    assert json.loads((run / MARKER).read_text())["id"] == ident  # a resume keeps the run's identity


def test_overwrite_empties_the_folder_but_keeps_its_lock_file(corpus_file, tmp_path):
    run = _proven_run(tmp_path / "run", corpus_file)
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    lock_folder(run)
    try:
        empty_folder(run, kind="run")
        assert sorted(p.name for p in run.iterdir()) == [LOCK]
        assert lock_holder(run) is None  # still held by this process
    finally:
        release_folder(run)


def test_resume_with_an_unloadable_optimizer_state_changes_nothing(corpus_file, finished_run, tmp_path, capsys):
    """A whole zip archive (so checkpoint_problem's checksums pass) that is no optimizer state: refused by
    --resume before run.yaml is rewritten or metrics.jsonl cut, with one line and exit 2."""
    import zipfile

    run = tmp_path / "run"
    _complete_run(finished_run, run)
    for step in (4, 8, 12):
        with zipfile.ZipFile(run / "checkpoints" / f"checkpoint-{step}" / "optimizer.pt", "w") as z:
            z.writestr("junk", "not an optimizer state")
    before = checksums(tmp_path)
    capsys.readouterr()  # the first run's progress bars
    code = main(["pretrain", "--out", str(run), "--resume", "--max-steps", "14"])  # the settings: run.yaml's
    said = capsys.readouterr()
    assert f"resuming with the settings of {run / RUN_CONFIG}" in said.out
    err = said.err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"cannot resume .* from checkpoint-12: optimizer\.pt cannot be loaded .*nothing was changed", err)
    assert checksums(tmp_path) == before


def test_a_resume_without_config_starts_from_the_runs_own_settings(corpus_file, tmp_path, capsys):
    """``--resume`` without ``--config`` needed every original flag again (or was refused as changed): it now reads
    the folder's run.yaml, or a paired folder's first arm's with the pairing its arms name."""
    import argparse

    from diffattn.cli import _starting_config
    from diffattn.train.config import PAIRED

    pairings = {"both": PAIRED["both"], "all": PAIRED["all"]}
    saved = debug_config(corpus_file, max_steps=5)

    def start(out, *, resume=True, config=None):
        return _starting_config(RunConfig, argparse.Namespace(config=config, resume=resume, out=str(out)), pairings)

    (tmp_path / "single").mkdir()
    saved.save(tmp_path / "single" / RUN_CONFIG)
    assert start(tmp_path / "single") == saved
    assert start(tmp_path / "single", resume=False) == RunConfig()  # a new run starts from the defaults
    for arm in ("standard", "diff"):
        (tmp_path / "pair" / arm).mkdir(parents=True)
        saved.with_overrides({"model.attention": arm}).save(tmp_path / "pair" / arm / RUN_CONFIG)
    assert start(tmp_path / "pair") == saved.with_overrides({"model.attention": "both"})
    (tmp_path / "pair" / "diff-v2").mkdir()
    saved.with_overrides({"model.attention": "diff-v2"}).save(tmp_path / "pair" / "diff-v2" / RUN_CONFIG)
    assert start(tmp_path / "pair").model.attention == "all"  # an arm outside "both": the run of every architecture
    assert start(tmp_path / "empty") == RunConfig()  # nothing saved: the trainer says there is nothing to resume
    said = capsys.readouterr().out
    assert f"resuming with the settings of {tmp_path / 'single' / RUN_CONFIG}" in said
    assert "resuming the paired run (both: standard, diff) with the settings of" in said
    assert "; an interrupted all run: pass --attention all" in said  # the guess, and how to say otherwise
    # a folder that records its pairing (pretrain_paired writes pairing.json as it starts) is resumed as that, unguessed
    (tmp_path / "pair" / "diff-v2" / RUN_CONFIG).unlink()
    (tmp_path / "pair" / "pairing.json").write_text(json.dumps({"pairing": "all", "arms": list(PAIRED["all"])}))
    assert start(tmp_path / "pair").model.attention == "all"
    assert "an interrupted" not in capsys.readouterr().out


def test_a_paired_resume_starts_the_arms_the_interrupted_run_never_began(corpus_file, tmp_path, monkeypatch):
    """`--attention all --resume` on a run stopped before its diff-v2 arm began said "nothing to resume" there."""
    from diffattn.train import paired

    calls = []
    monkeypatch.setattr(paired, "pretrain", lambda cfg, out, resume, **kw: calls.append((out.name, resume)) or {})
    monkeypatch.setattr(paired, "write_comparison", lambda out, summaries: None)
    for arm in ("standard", "diff"):
        (tmp_path / "pair" / arm).mkdir(parents=True)
        debug_config(corpus_file).save(tmp_path / "pair" / arm / RUN_CONFIG)
    paired.pretrain_paired(debug_config(corpus_file, max_steps=12).with_overrides({"model.attention": "all"}),
                           tmp_path / "pair", resume=True)  # fmt: skip
    assert calls[:3] == [("standard", True), ("diff", True), ("diff-v2", False)]
    assert paired.recorded_pairing(tmp_path / "pair") == "all"  # what a later --resume reads
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "pairing.json").write_text("my notes")  # a file of that name the library did not write
    paired.pretrain_paired(debug_config(corpus_file), tmp_path / "mine")
    assert (tmp_path / "mine" / "pairing.json").read_text() == "my notes"


# ---------------------------------------------------------------- one run at a time in a folder


def test_a_second_run_into_a_locked_folder_is_refused_at_once_naming_the_first(corpus_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT)  # another run's lock (another open file: flock conflicts)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": 4242, "host": "gpu-7", "since": "09:00", "command": "diffattn pretrain"}).encode())
    try:
        before = checksums(tmp_path)
        named = r"in use by diffattn process 4242 on gpu-7 \(diffattn pretrain\), since 09:00"
        for kwargs in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(RunFolderError, match=named):
                check_run_dir(out, debug_config(corpus_file), **{"resume": False, "overwrite": False, **kwargs})
        # both runs checked the new folder before either wrote: the second is refused when it takes the lock
        with pytest.raises(FolderInUseError, match=named):
            start_run_folder(out, debug_config(corpus_file), overwrite=False, checkpoint=None, command="pretrain")
        assert checksums(tmp_path) == before
    finally:
        os.close(fd)
    assert lock_holder(out) is None


def test_a_fresh_run_refuses_a_folder_another_run_filled_after_its_check(corpus_file, tmp_path):
    out = tmp_path / "run"
    check_run_dir(out, debug_config(corpus_file), resume=False, overwrite=False)  # new: fine
    _proven_run(out, corpus_file)  # meanwhile another run started and finished there
    before = checksums(tmp_path)
    cfg = debug_config(corpus_file)
    try:
        with pytest.raises(RunFolderError, match="was filled by another run after it was checked"):
            start_run_folder(out, cfg, overwrite=False, checkpoint=None, command="pretrain", resume=False)
    finally:
        release_folder(out)
    assert {k: v for k, v in checksums(tmp_path).items() if not k.endswith(LOCK)} == before


def test_the_lock_is_released_when_its_process_is_killed(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from diffattn.files import lock_folder; lock_folder({str(out)!r}); print(1); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "1"
        assert f"diffattn process {holder.pid} on" in lock_holder(out)
        with pytest.raises(FolderInUseError, match=f"in use by diffattn process {holder.pid}"):
            lock_folder(out)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_holder(out) is None
    lock_folder(out)  # free again
    release_folder(out)


# ---------------------------------------------------------------- experiments


def test_an_experiment_part_that_is_not_provably_a_run_is_never_redone(corpus_file, tmp_path):
    part = tmp_path / "demo" / "models" / "t"
    part.mkdir(parents=True)
    (part / MARKER).write_text(json.dumps({"kind": "run"}))  # an earlier version's part
    debug_config(corpus_file).save(part / RUN_CONFIG)
    (part / "summary.json").write_text("{}")
    before = checksums(tmp_path)
    assert run_state(part, debug_config(corpus_file), overwrite=False) == "done"  # skipped: usable as it is
    with pytest.raises(ValueError, match=r"t cannot be redone: that would delete it, and .*records no identity"):
        run_state(part, debug_config(corpus_file), overwrite=True)
    assert checksums(tmp_path) == before
    _proven_run(part, corpus_file)
    assert run_state(part, debug_config(corpus_file), overwrite=True) == "fresh"


def test_an_experiment_folder_whose_marker_is_not_its_own_is_refused(tmp_path):
    out = tmp_path / "runs" / "demo"
    mark(out, "experiment", ident="a" * 32, name="demo", source="/a/first.yaml")
    (out / "experiment.yaml").write_text("name: demo\n# diffattn-id: " + "b" * 32 + "\n")
    before = checksums(tmp_path)
    with pytest.raises(ValueError, match=r"do not name the same experiment \(a copied marker\?\)"):
        check_experiment_folder(out, "demo", "/a/first.yaml")
    assert checksums(tmp_path) == before


# ---------------------------------------------------------------- export


def _experiment_folder(root: Path) -> Path:
    src = root / "runs" / "exp"
    (src / "eval" / "m").mkdir(parents=True)
    (src / "report.md").write_text("# r\n![a](a.png)\n![b](eval/m/b.png)\n")
    (src / "results.json").write_text("{}")
    (src / "experiment.yaml").write_text("name: exp\n")
    (src / "a.png").write_bytes(b"a")
    (src / "eval" / "m" / "b.png").write_bytes(b"b")
    return src


def test_export_writes_only_its_own_files(tmp_path):
    src = _experiment_folder(tmp_path)
    dest = export_report(src, tmp_path / "results" / "exp")
    (dest / "notes.md").write_text("what I make of it")  # the user's, beside the export
    (dest / "eval" / "m" / "mine.txt").write_text("mine")
    (src / "a.png").write_bytes(b"a2")
    (src / "report.md").write_text("# r\n![a](a.png)\n")  # b.png is no longer in the report
    export_report(src, dest)
    assert (dest / "notes.md").read_text() == "what I make of it" and (dest / "eval" / "m" / "mine.txt").is_file()
    assert (dest / "a.png").read_bytes() == b"a2" and not (dest / "eval" / "m" / "b.png").exists()
    # a file of the export changed by hand is never overwritten: refused, naming it, nothing touched
    (dest / "results.json").write_text('{"edited": true}')
    (src / "results.json").write_text('{"new": 1}')
    before = checksums(tmp_path)
    with pytest.raises(ValueError, match=r"would overwrite results\.json \(changed since diffattn export wrote it\)"):
        export_report(src, dest)
    assert checksums(tmp_path) == before
    # nor is a file at an exported name that the export did not write (b.png is linked again, and is the user's)
    (dest / "results.json").write_bytes((src / "results.json").read_bytes())  # the same contents: fine
    (dest / "eval" / "m" / "b.png").write_bytes(b"the user's own picture")
    (src / "report.md").write_text("# r\n![a](a.png)\n![b](eval/m/b.png)\n")
    with pytest.raises(ValueError, match=r"would overwrite eval/m/b\.png \(not written by diffattn export\)"):
        export_report(src, dest)
    assert (dest / "eval" / "m" / "b.png").read_bytes() == b"the user's own picture"
    assert sorted(p.name for p in tmp_path.joinpath("results").iterdir()) == ["exp"]  # no temporary copy left


def test_export_into_an_earlier_versions_export_keeps_the_users_files(tmp_path):
    """An earlier version's marker ("exported from SRC") recorded no checksums, so it licenses nothing: a file the
    new export would change (an old report the user may have annotated) is refused, rc 1, nothing touched; moved
    aside, the export goes ahead and keeps the user's other files."""
    from diffattn.cli import main

    src = _experiment_folder(tmp_path)
    dest = tmp_path / "results" / "exp"
    dest.mkdir(parents=True)
    (dest / EXPORT_MARKER).write_text(f"exported from {src}\n")  # as an earlier version wrote it
    (dest / "report.md").write_text("the earlier export's report, with the user's note appended")
    (dest / "notes.md").write_text("mine")
    before = checksums(tmp_path)
    with pytest.raises(
        ValueError, match=r"would overwrite report\.md \(written by an earlier diffattn export, which recorded"
    ):
        export_report(src, dest)
    assert main(["export", str(src), str(dest)]) == 2  # a refused request: one line, exit 2
    assert checksums(tmp_path) == before
    (dest / "report.md").rename(tmp_path / "old-report.md")  # the user moves it aside
    export_report(src, dest)
    assert (dest / "report.md").read_text() == (src / "report.md").read_text()
    assert (dest / "notes.md").read_text() == "mine"
    assert set(json.loads((dest / EXPORT_MARKER).read_text())["files"]) == {
        "report.md",
        "results.json",
        "experiment.yaml",
        "a.png",
        "eval/m/b.png",
    }


def test_export_follows_no_symbolic_link(tmp_path, caplog):
    src = _experiment_folder(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not evidence")
    (src / "a.png").unlink()
    (src / "a.png").symlink_to(secret)  # a picture that is a link out of the experiment folder
    shutil.rmtree(src / "eval")
    (tmp_path / "elsewhere" / "m").mkdir(parents=True)
    (tmp_path / "elsewhere" / "m" / "b.png").write_bytes(b"x")
    (src / "eval").symlink_to(tmp_path / "elsewhere")  # a folder on the way that is a link
    with caplog.at_level("WARNING", logger="diffattn.experiments.report"):
        dest = export_report(src, tmp_path / "results" / "exp")
    assert not (dest / "a.png").exists() and not (dest / "eval").exists()
    assert "a.png is (or lies under) a symbolic link" in caplog.text and "b.png is (or lies under)" in caplog.text
    assert (dest / "report.md").is_file()


def test_a_killed_exports_temporary_copy_is_removed_by_the_next_export(tmp_path):
    import subprocess
    import sys

    src = _experiment_folder(tmp_path)
    dest = tmp_path / "results" / "exp"
    script = (
        "import os, shutil, sys\n"
        "from diffattn.experiments import report\n"
        "real = shutil.copy2\n"
        "def copy_then_die(a, b, **kw):\n"
        "    real(a, b, **kw)\n"
        "    os._exit(9)  # killed in the middle of the copy: nothing cleans up\n"
        "report.shutil.copy2 = copy_then_die\n"
        "report.export_report(sys.argv[1], sys.argv[2])\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(src), str(dest)], check=False)
    assert killed.returncode == 9
    left = [p for p in dest.parent.iterdir() if p.name.startswith(".exp.export-")]
    assert len(left) == 1 and (left[0] / "report.md").is_file()
    old = dest.parent / ".exp.new-abcd1234"  # an earlier version's temporary copy, holding its export marker
    old.mkdir()
    (old / EXPORT_MARKER).write_text(f"exported from {src}\n")
    mine = dest.parent / ".exp.export-notes"  # named alike, but no marker of a copy: not the library's
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    export_report(src, dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == [".exp.export-notes", "exp"]
    assert (mine / "keep.txt").read_text() == "keep"


def test_overwrite_problem_is_the_one_rule_for_replacing_a_file(tmp_path):
    """files.overwrite_problem, which export, refresh and a run's report.md follow: a file is replaced only when its
    checksum is one the writer recorded, or it already holds the new contents."""
    import hashlib

    from diffattn.files import file_sha256, overwrite_problem

    f = tmp_path / "report.md"
    assert overwrite_problem(f, None) is None  # nothing there
    f.write_text("ours")
    ours = file_sha256(f)
    assert ours == hashlib.sha256(b"ours").hexdigest()
    assert overwrite_problem(f, [ours]) is None
    assert overwrite_problem(f, None, new_sha256=ours) is None  # the same contents: nothing is lost
    assert overwrite_problem(f, None) == "not written by diffattn"
    assert "earlier diffattn, which recorded no checksum" in overwrite_problem(f, [])
    f.write_text("ours, with the user's note")
    assert overwrite_problem(f, [ours], writer="diffattn export") == "changed since diffattn export wrote it"
    link = tmp_path / "link.md"
    link.symlink_to(f)
    assert overwrite_problem(link, [file_sha256(f)]) == "a link or a folder"


def _held_by_another(folder: Path) -> int:
    """Take ``folder``'s lock through a second open file, as another diffattn process would hold it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": 4242, "host": "gpu-7", "since": "09:00", "command": "diffattn x"}).encode())
    return fd


def test_export_refresh_and_run_take_the_folder_lock(tmp_path, monkeypatch):
    """issue 36, one lock helper for every writer: an export or refresh into a folder another process holds, and a
    run of an experiment another process is running, are refused naming the holder, nothing written."""
    from diffattn.experiments.config import ExperimentConfig
    from diffattn.experiments.report import refresh_report
    from diffattn.experiments.runner import run_experiment
    from diffattn.files import FolderInUseError

    src = _experiment_folder(tmp_path)
    dest = export_report(src, tmp_path / "results" / "exp")
    named = r"in use by diffattn process 4242 on gpu-7 \(diffattn x\)"
    fd = _held_by_another(dest)
    try:
        before = checksums(tmp_path)
        with pytest.raises(FolderInUseError, match=named):
            export_report(src, dest)
        with pytest.raises(FolderInUseError, match=named):
            refresh_report(dest)
        assert checksums(tmp_path) == before
    finally:
        os.close(fd)
    config = ExperimentConfig.from_dict(
        {
            "name": "locked",
            "data": {"source": "shakespeare", "seq_len": 32},
            "models": [{"name": "t", "preset": "debug"}],
            "eval": {"suites": ["ppl"]},
        }
    )
    fd = _held_by_another(tmp_path / "root" / "locked")
    try:
        with pytest.raises(FolderInUseError, match=named):
            run_experiment(config, tmp_path / "root", evaluate=False)
        assert [p.name for p in (tmp_path / "root" / "locked").iterdir()] == [LOCK]
    finally:
        os.close(fd)


def test_a_refused_export_into_a_new_folder_leaves_no_trace_of_its_lock(tmp_path):
    from diffattn.files import locked

    src = _experiment_folder(tmp_path)
    (src / "report.md").write_text("# r\n![x](../outside.png)\n")  # refused once the destination is locked
    with pytest.raises(ValueError, match="outside the experiment folder"):
        export_report(src, tmp_path / "results" / "new")
    assert not (tmp_path / "results" / "new").exists()
    with locked(tmp_path / "kept"):  # a folder that gets contents keeps them (not the lock file)
        (tmp_path / "kept" / "a.txt").write_text("a")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["a.txt"]


def test_a_run_extended_and_stopped_before_its_new_end_resumes_not_done(corpus_file, finished_run, tmp_path):
    """A larger max_steps rewrites run.yaml when the run resumes; stopped before the new end, its summary.json is
    still the shorter run's. Found when a 500 → 1,500-step MQAR readout skipped three such runs as "done"."""
    part = tmp_path / "demo" / "models" / "t"
    part.mkdir(parents=True)
    longer = debug_config(corpus_file, max_steps=12)
    longer.save(part / RUN_CONFIG)  # the extension started …
    (part / "summary.json").write_text(json.dumps({"steps": 4}))  # … and the summary is the 4-step run's
    assert run_state(part, longer, overwrite=False) == "resume"
    (part / "summary.json").write_text(json.dumps({"steps": 12}))
    assert run_state(part, longer, overwrite=False) == "done"
    # asked for fewer steps than it has: refused (the trainer would keep the longer run, and the report would give
    # it the smaller budget); an unfinished run past the new budget resumes, where the trainer changes nothing
    with pytest.raises(ValueError, match=r"finished at step 12 and the experiment now asks for max_steps 8"):
        run_state(part, debug_config(corpus_file, max_steps=8), overwrite=False)
    (part / "summary.json").unlink()
    assert run_state(part, debug_config(corpus_file, max_steps=8), overwrite=False) == "resume"
    # a finished run past whose schedule more steps are asked for (planned over 16, 20 asked) is refused, named
    _complete_run(finished_run, tmp_path / "finished")
    with pytest.raises(ValueError, match=r"train schedule: 16 steps, warm-up 2 -> 20 steps.*--overwrite to redo it"):
        run_state(tmp_path / "finished", debug_config(corpus_file, max_steps=20), overwrite=False)
