"""--report-to: training reports loss, learning rate, gradient norm and λ per layer to the trackers transformers'
Trainer knows (TensorBoard read back from its event file here); an integration that is not installed is one line
before any training; the final model folder gets a model card."""

from __future__ import annotations

import importlib.util

import pytest

from diffattn.cli import main
from diffattn.train import pretrain
from diffattn.train.tracking import parse_report_to, reporting

from ..helpers import debug_config

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed (pip install tensorboard)"
)


@needs_tensorboard
def test_tensorboard_gets_loss_lr_grad_norm_and_lambda_per_layer(corpus_file, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    with reporting("tensorboard"):
        summary = pretrain(debug_config(corpus_file, max_steps=4, eval_every=4, save_every=4), run)
    events = list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file in the run folder"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "train/loss",
        "train/learning_rate",
        "train/grad_norm",
        "train/lambda/layer_0",
        "train/lambda/layer_1",
    } <= tags
    assert len(acc.Scalars("train/loss")) == 4
    assert summary["report_to"] == ["tensorboard"]
    card = (run / "final" / "README.md").read_text()
    assert "library_name: transformers" in card and "budget: 4 steps" in card


def test_report_to_an_uninstalled_or_unknown_integration_is_one_line_before_training(corpus_file, tmp_path, capsys):
    missing = next((n for n in ("swanlab", "neptune", "clearml") if importlib.util.find_spec(n) is None), None)
    assert parse_report_to("none") == () and parse_report_to(None) == ()
    with pytest.raises(ValueError, match="unknown integration; choose from none, tensorboard"):
        parse_report_to("tensorbored")
    if missing is None:
        pytest.skip("every candidate integration is installed")
    run = tmp_path / "run"
    code = main(["pretrain", "--preset", "debug", "--data", str(corpus_file), "--max-steps", "2", "--seq-len", "32",
                 "--out", str(run), "--report-to", missing])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"the integration is not installed (pip install {missing})" in err
    assert not run.exists()
