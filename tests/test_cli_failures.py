"""Every failure of the command line is one line, with its exit status (2: bad input, 1: a fault of the machine or
an unexpected failure, the traceback only with --verbose), and nothing is written: corrupt model folders (garbage
or NaN config.json, a truncated tokenizer.json, a tensor of the wrong shape), unusable --out / --root paths, a full
disk, a YAML alias that refers to itself."""

from __future__ import annotations

import errno
import json
import pathlib
import shutil

import pytest

from diffattn import build_model
from diffattn.cli import failure_line, main


def _damaged(diff_folder, tmp_path, how: str):
    folder = tmp_path / how
    shutil.copytree(diff_folder, folder)
    if how == "garbage-config":
        (folder / "config.json").write_text("{garbage")
    elif how == "nan-config":
        config = json.loads((folder / "config.json").read_text())
        config["hidden_size"] = float("nan")
        (folder / "config.json").write_text(json.dumps(config))
    elif how == "truncated-tokenizer":
        text = (folder / "tokenizer.json").read_text()
        (folder / "tokenizer.json").write_text(text[: len(text) // 2])
    elif how == "wrong-shape":
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        name = next(k for k in tensors if "q_proj" in k)
        tensors[name] = tensors[name][:-1]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _one_line(capsys, code: int, status: int, pattern: str) -> None:
    import re

    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("diffattn: error:")]
    assert code == status, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize(
    "how, pattern",
    [
        ("garbage-config", r"garbage-config/config.json is not valid JSON"),
        ("nan-config", r"cannot load a model from .*nan-config.*hidden_size"),
        ("truncated-tokenizer", r"tokenizer.json is not valid JSON"),
        ("wrong-shape", r"cannot load a model from .*wrong-shape"),
    ],
)
def test_a_corrupt_diff_folder_is_one_line_naming_it(how, pattern, diff_folder, tmp_path, capsys):
    folder = _damaged(diff_folder, tmp_path, how)
    out = tmp_path / "eval"
    code = main(["eval", str(folder), "--suite", "ppl", "--out", str(out), "--tokens", "32", "--text", "filler"])
    _one_line(capsys, code, 2, pattern)
    assert not (out / "results.json").exists()


@pytest.mark.parametrize(
    "how, pattern",
    [
        ("nan-config", r"cannot load a model from .*nan-config.*hidden_size"),
        ("truncated-tokenizer", r"truncated-tokenizer/tokenizer.json is not valid JSON"),
        ("wrong-shape", r"cannot load a model from .*wrong-shape.*model.safetensors holds .*q_proj.weight of shape"),
    ],
)
def test_adapt_names_the_model_folder_it_cannot_load(how, pattern, diff_folder, corpus_file, tmp_path, capsys):
    """issue 36 §11: adapt printed the library's exception without naming the folder or file (eval named it)."""
    folder = _damaged(diff_folder, tmp_path, how)
    out = tmp_path / "adapted"
    code = main(["adapt", "--model", str(folder), "--method", "dex", "--data", str(corpus_file), "--max-steps", "1",
                 "--out", str(out)])  # fmt: skip
    _one_line(capsys, code, 2, pattern)
    assert not out.exists()


@pytest.mark.parametrize(
    "out, pattern",
    [
        ("/proc/diffattn-test/out", r"(No such file or directory|Permission denied|Read-only).*: /proc/diffattn-test"),
        ("{file}/sub", r"Not a directory: .*afile/sub"),
        ("{tmp}/" + "x" * 300, r"File name too long"),
    ],
)
def test_an_unusable_out_is_one_line_naming_it(out, pattern, diff_folder, tmp_path, capsys):
    (tmp_path / "afile").write_text("precious")
    out = out.replace("{file}", str(tmp_path / "afile")).replace("{tmp}", str(tmp_path))
    code = main(["eval", str(diff_folder), "--suite", "ppl", "--out", out, "--tokens", "32", "--text", "filler"])
    _one_line(capsys, code, 2, pattern)
    assert (tmp_path / "afile").read_text() == "precious"


def test_run_with_a_file_as_root_is_one_line(tmp_path, capsys):
    from importlib.resources import files

    (tmp_path / "afile").write_text("precious")
    experiment = str(files("diffattn") / "configs" / "quickstart.yaml")
    code = main(["run", experiment, "--root", str(tmp_path / "afile"), "--train-only"])
    _one_line(capsys, code, 2, r"Not a directory: .*afile")
    assert (tmp_path / "afile").read_text() == "precious"


def test_a_recursive_yaml_alias_is_one_line(tmp_path, capsys):
    config = tmp_path / "rec.yaml"
    config.write_text("model: &a\n  overrides: *a\n")
    code = main(["pretrain", "--config", str(config), "--out", str(tmp_path / "run")])
    _one_line(capsys, code, 2, r"nests without end")
    assert not (tmp_path / "run").exists()


def test_a_full_disk_is_a_fault_of_the_machine_and_an_unexpected_failure_names_itself(tmp_path, capsys, monkeypatch):
    import diffattn.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out"))

    monkeypatch.setattr(cli, "cmd_info", full)
    _one_line(capsys, main(["info"]), 1, r"no space left on the device.*: .*out")

    def bug(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli, "cmd_info", bug)
    _one_line(capsys, main(["info"]), 1, r"KeyError: 'oops' \(rerun with --verbose for the traceback\)")
    assert failure_line(ValueError("a\nb")) == ("a; b", 2)
    # a part that failed in a `--jobs` worker: named with its log, and as bad an input as its cause
    from diffattn.experiments.runner import PartFailed

    for cause, status in ((ValueError("data.seq_len=4096 exceeds the model's maximum"), 2), (KeyError("x"), 1)):
        try:
            raise PartFailed(f"pretrain diff failed: {cause} (its output: logs/diff.log)") from cause
        except PartFailed as e:
            assert failure_line(e) == (f"pretrain diff failed: {cause} (its output: logs/diff.log)", status)


def test_a_folder_asking_to_run_its_own_code_is_refused_unless_told(diff_folder, tmp_path, capsys, monkeypatch):
    """Loading never lets transformers ask [y/N] and run a folder's Python: an auto_map is refused with one line,
    nothing loaded; the explicit flag reaches transformers as trust_remote_code=True."""
    folder = tmp_path / "remote"
    shutil.copytree(diff_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('the folder code ran')\n")
    out = tmp_path / "eval"
    code = main(["eval", str(folder), "--suite", "ppl", "--out", str(out), "--tokens", "32", "--text", "filler"])
    _one_line(capsys, code, 2, r"asks to run its own Python code \(config.json: auto_map\)")
    assert not (out / "results.json").exists()

    import transformers

    seen = []

    def record(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise ValueError("stop here")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", record)
    main(["eval", str(folder), "--suite", "ppl", "--out", str(out), "--trust-remote-code"])
    main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out)])
    assert seen == [True, False]


@pytest.mark.parametrize("preset", [None, 3, ["debug"]])
def test_build_model_with_a_bad_preset_is_the_librarys_error_with_a_sentence(preset):
    with pytest.raises(ValueError, match=r"preset must be a preset name .* or a ModelPreset, got"):
        build_model(preset, "diff")


def test_a_planted_eval_marker_does_not_let_eval_replace_files(diff_folder, tmp_path, capsys):
    """An evaluation folder is ours when its results.json repeats its marker's identity: a hand-made {"kind": "eval"}
    marker beside someone's files does not let `diffattn eval` write results and pictures there; a folder an
    evaluation made is evaluated into again."""
    out = tmp_path / "theirs"
    out.mkdir()
    (out / ".diffattn").write_text('{"kind": "eval"}\n')
    (out / "ppl.png").write_text("my picture")
    args = ["--suite", "ppl", "--tokens", "32", "--text", "filler"]
    code = main(["eval", str(diff_folder), "--out", str(out), *args])
    _one_line(capsys, code, 2, r"holds files diffattn eval did not write")
    assert (out / "ppl.png").read_text() == "my picture" and not (out / "results.json").exists()
    ours = tmp_path / "ours"
    assert main(["eval", str(diff_folder), "--out", str(ours), *args]) == 0
    assert main(["eval", str(diff_folder), "--out", str(ours), *args]) == 0  # ours: evaluated again


@pytest.mark.parametrize("content", [[1, 2, 3], {"method": "dex", "config": [1, 2]}, "text"])
def test_an_adapter_config_of_the_wrong_shape_is_the_librarys_error(content, tmp_path):
    from diffattn import DexConfig, adapt, load_adapter, save_adapter

    from .tiny_models import tiny

    folder = save_adapter(adapt(tiny("llama"), DexConfig(heads="all")), tmp_path / "adapter")
    (folder / "adapter_config.json").write_text(json.dumps(content))
    with pytest.raises(ValueError, match="is not an adapter config"):
        load_adapter(tiny("llama"), folder)


def test_a_negative_size_override_is_one_line_before_anything_is_written(corpus_file, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["pretrain", "--preset", "debug", "--data", str(corpus_file), "--max-steps", "1", "--seq-len", "32",
                 "--out", str(run), "--set", "model.overrides.hidden_size=-4"])  # fmt: skip
    _one_line(capsys, code, 2, r"hidden_size must be a positive integer, got -4")
    assert not run.exists()


def test_a_damaged_results_json_of_an_experiment_is_named(tmp_path):
    from diffattn.experiments.runner import _read_json  # what _evaluated reads a model's results.json with

    (tmp_path / "results.json").write_text('{"suites": ')
    with pytest.raises(ValueError, match=r"results.json is not valid JSON .*rerun with --overwrite"):
        _read_json(tmp_path / "results.json")


def test_a_diff_folder_saved_by_a_newer_diffattn_is_one_line(diff_folder, tmp_path, capsys):
    folder = tmp_path / "newer"
    shutil.copytree(diff_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["diffattn"] = {"lambda_init": "exponential", "norm": "rms", "sliding_window": 64}
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "eval"
    code = main(["eval", str(folder), "--suite", "ppl", "--out", str(out), "--tokens", "32", "--text", "filler"])
    _one_line(capsys, code, 2, r"records option\(s\) sliding_window .*newer version.*upgrade diffattn")
    assert not (out / "results.json").exists()


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"format_version": 3}, r"adapter format 3, newer than this diffattn reads \(2\)"),
        ({"config": {"heads": "all", "gate_temperature": 2.0}}, r"records option\(s\) gate_temperature .*newer"),
    ],
)
def test_an_adapter_saved_by_a_newer_diffattn_is_refused_in_one_line(change, pattern, tmp_path):
    from diffattn import DexConfig, adapt, load_adapter, save_adapter

    from .tiny_models import tiny

    folder = save_adapter(adapt(tiny("llama"), DexConfig(heads="all")), tmp_path / "adapter")
    meta = json.loads((folder / "adapter_config.json").read_text())
    if "config" in change:
        change = {"config": {**meta["config"], **change["config"]}}
    (folder / "adapter_config.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(ValueError, match=pattern):
        load_adapter(tiny("llama"), folder)


def test_in_a_pipe_the_error_line_starts_a_line_of_its_own_after_an_open_progress_bar(capsys, monkeypatch):
    """issue 36 §13: piped, a failure's line was glued to the fragment a progress bar had left without a newline."""
    import sys

    from tqdm.auto import tqdm

    import diffattn.cli as cli

    bars = []

    def fails(args):
        bars.append(tqdm(total=10, desc="training", file=sys.stderr))
        bars[-1].update(3)
        raise ValueError("loss became NaN at step 3")

    monkeypatch.setattr(cli, "cmd_presets", fails)
    try:
        assert main(["presets"]) == 2
    finally:
        bars[-1].close()  # no open bar left for later tests
    err = capsys.readouterr().err
    assert "\ndiffattn: error: loss became NaN at step 3" in err and not err.startswith("diffattn: error")


def test_ctrl_c_while_the_parser_is_built_is_one_line(capsys, monkeypatch):
    """issue 36 §9: Ctrl-C in the first second (the parser's help texts import the suite and method tables, before
    the command's handler) printed a 30-line KeyboardInterrupt traceback."""
    import diffattn.cli as cli

    def interrupted(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["info"]) == 130
    assert capsys.readouterr().err.strip() == "diffattn: interrupted"


# ---------------------------------------------------------------- a full disk (issue 36 §10), simulated: no tmpfs here

TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4344"  # torch.save's own words


def test_writing_says_no_space_for_every_way_a_library_says_it(tmp_path, monkeypatch):
    from diffattn import files
    from diffattn.files import NoSpaceError, writing

    def attempt(error):
        with writing(tmp_path / "ckpt", "the step-4 checkpoint", "the ones before it are kept"):
            raise error

    for error in (
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("safetensors: I/O error: No space left on device (os error 28)"),
    ):
        with pytest.raises(NoSpaceError, match=r"while writing the step-4 checkpoint \(.*ckpt\).*ones before it"):
            attempt(error)
    # torch's generic write failure is a full disk only when the device is (nearly) full
    with pytest.raises(RuntimeError, match="inline_container") as plenty:
        attempt(RuntimeError(TORCH_FULL))
    assert not isinstance(plenty.value, NoSpaceError)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(NoSpaceError):
        attempt(RuntimeError(TORCH_FULL))
    with pytest.raises(KeyError):  # anything else passes through untouched
        attempt(KeyError("x"))


def test_a_full_disk_at_a_checkpoint_is_one_line_and_loses_nothing(corpus_file, tmp_path, capsys, monkeypatch):
    """The second checkpoint hits a full disk inside torch.save: one line naming it and the run folder, exit 1; the
    first checkpoint is intact and the partial one is gone; --resume after space is freed finishes the run."""
    import transformers

    from diffattn import files

    real = transformers.Trainer._save_checkpoint
    calls = []

    def fills_up(self, model, trial):
        calls.append(self.state.global_step)
        if len(calls) == 2:
            (pathlib.Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}").mkdir(parents=True)
            raise RuntimeError(TORCH_FULL)
        return real(self, model, trial)

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", fills_up)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    run = tmp_path / "run"
    args = ["pretrain", "--preset", "debug", "--data", str(corpus_file), "--max-steps", "2", "--save-every", "1",
            "--seq-len", "32", "--out", str(run)]  # fmt: skip
    code = main(args)
    _one_line(capsys, code, 1, r"no space left on the device while writing the step-2 checkpoint \(.*run.*\); "
              r"nothing finished was lost: the checkpoints before it are kept.*--resume")  # fmt: skip
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-1"]
    assert not list(run.rglob("checkpoint-2"))
    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", real)
    monkeypatch.undo()
    assert main([*args, "--resume"]) == 0 and (run / "final").is_dir()


def test_an_export_onto_a_full_disk_names_the_destination_and_changes_nothing(tmp_path, capsys, monkeypatch):
    from diffattn.experiments import report

    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "report.md").write_text("# report\n")
    (experiment / "results.json").write_text("{}")
    dest = tmp_path / "published"

    def full(src, dst, **kwargs):  # as shutil's copy reports it: the source as filename, the target as filename2
        raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))

    monkeypatch.setattr(report.shutil, "copy2", full)
    with pytest.raises(OSError) as caught:
        report.export_report(experiment, dest)
    line, status = failure_line(caught.value)
    assert status == 1 and str(dest) in line and "free space and export again" in line, line
    assert not dest.exists() and not list(tmp_path.glob(".published.export-*"))
    assert failure_line(OSError(errno.ENOSPC, "No space left on device", "/src/a", None, "/dst/a"))[0].endswith(
        "/dst/a"
    )


# ---------------------------------------------------------------- issue 36 §12, the rest


def test_eval_out_a_dangling_symlink_is_named(diff_folder, tmp_path, capsys):
    out = tmp_path / "link"
    out.symlink_to(tmp_path / "nowhere")
    code = main(["eval", str(diff_folder), "--suite", "ppl", "--out", str(out), "--tokens", "32", "--text", "filler"])
    _one_line(capsys, code, 2, r"--out '.*link' is a symbolic link to '.*nowhere', which does not exist")
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_named_pipe_as_data_is_named_as_what_it_is(tmp_path, capsys):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", "debug", "--data", str(fifo), "--max-steps", "1", "--seq-len", "32",
                 "--out", str(out)])  # fmt: skip
    _one_line(capsys, code, 2, r"corpus.txt' exists but is not a regular file or a folder \(a named pipe")
    assert not out.exists()


def test_adapting_an_adapted_model_says_so():
    from diffattn import DAAConfig, DexConfig, adapt

    from .tiny_models import tiny

    model = adapt(tiny("llama"), DexConfig(heads="all"))
    with pytest.raises(ValueError, match=r"this model has a dex adapter already; adapt a fresh base model"):
        adapt(model, DAAConfig())


def test_trained_parameter_names_on_a_peft_model_is_refused_with_the_how_to():
    peft = pytest.importorskip("peft")
    from diffattn import DexConfig, adapt
    from diffattn.adapters import trained_parameter_names

    from .tiny_models import tiny

    model = adapt(tiny("llama"), DexConfig(heads="all"))
    names = trained_parameter_names(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(target_modules=["gate_proj"]))
    with pytest.raises(
        ValueError, match=r"wrapped by PEFT; .*call diffattn.adapters.trained_parameter_names\(model\) before"
    ):
        trained_parameter_names(wrapped)
    assert names and all(n in dict(model.named_parameters()) for n in names)


INTERRUPT_DURING_IMPORT = """
import os, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (a background job starts with it ignored)

class SigintOnImport:  # a real SIGINT, delivered while diffattn.cli is being imported (before main runs)
    def find_spec(self, name, path=None, target=None):
        if name == "diffattn.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnImport())
sys.argv = ["diffattn", "info"]
{call}
"""


@pytest.mark.parametrize("call", ["from diffattn.console import main; sys.exit(main())", "import runpy; "
                                  "runpy.run_module('diffattn', run_name='__main__')"])  # fmt: skip
def test_ctrl_c_while_the_command_line_is_imported_is_one_line(call):
    """issue 36 §9, through a subprocess and a real SIGINT: the console script (pyproject.toml) and `python -m
    diffattn` import the command line under a guard, so an interrupt there is one line and exit status 130."""
    import subprocess
    import sys
    import tomllib

    scripts = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["diffattn"] == "diffattn.console:main"
    done = subprocess.run([sys.executable, "-c", INTERRUPT_DURING_IMPORT.format(call=call)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 130 and done.stderr.strip() == "diffattn: interrupted", done.stderr
    unguarded = subprocess.run([sys.executable, "-c", INTERRUPT_DURING_IMPORT.format(call="import diffattn.cli")],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "KeyboardInterrupt" in unguarded.stderr  # what the guard is for: the same interrupt, unguarded
