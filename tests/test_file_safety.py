"""Nothing lost, ever: ``--overwrite`` deletes only folders diffattn made and never the working
folder; an adapter run cannot write into its base; only finite, complete checkpoints are published, kept by rotation
and resumed from; ``metrics.jsonl`` holds each step once after a resume; a same-name experiment from another file is
refused. Each case checks that every pre-existing file is unchanged (checksums), not only that an error was raised."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from diffattn.experiments.runner import check_experiment_folder
from diffattn.files import MARKER, UnsafeDeleteError, check_removable, mark, publish_folder, write_text_atomic
from diffattn.train import NonFiniteLossError, RunFolderError, checkpoint_problem, latest_checkpoint, pretrain
from diffattn.train.adapt import adapt_pretrained
from diffattn.train.trainer import rotate_checkpoints

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
        check_removable(Path(where))
    assert (work / "notes.txt").read_text() == "keep me"


def test_overwrite_refuses_home_and_root_and_files(tmp_path):
    with pytest.raises(UnsafeDeleteError, match="home folder"):
        check_removable(Path.home())
    with pytest.raises(UnsafeDeleteError, match="root"):
        check_removable(Path("/"))
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(UnsafeDeleteError, match="is a file"):
        check_removable(f)


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


def _complete_run(corpus_file, run: Path, **train) -> None:
    pretrain(debug_config(corpus_file, save_every=4, keep_checkpoints=3, **train), run)


def test_a_truncated_optimizer_state_is_skipped_by_resume(corpus_file, tmp_path):
    run = tmp_path / "run"
    _complete_run(corpus_file, run)
    optimizer = run / "checkpoints" / "checkpoint-12" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])
    assert "optimizer.pt" in checkpoint_problem(optimizer.parent)
    assert latest_checkpoint(run).name == "checkpoint-8"
    # --resume falls back to checkpoint-8 (with a warning) and replays steps 9-12: each step logged once
    pretrain(debug_config(corpus_file, save_every=4, keep_checkpoints=3, max_steps=14), run, resume=True)
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 15))


def test_rotation_never_deletes_the_newest_complete_checkpoint(corpus_file, tmp_path):
    run = tmp_path / "run"
    _complete_run(corpus_file, run)  # checkpoints 4, 8, 12
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
        check_removable(link)
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
