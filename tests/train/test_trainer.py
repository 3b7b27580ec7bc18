"""Pretraining: config, a debug run end to end, kill-and-resume, paired runs, torchrun (2 CPU processes), faults.

All runs use the `debug` preset on a small local corpus cut from Shakespeare, a 512-token BPE vocabulary and
64-token sequences, so each run takes seconds. The tokenizer cache lives in a per-session temp folder.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from diffattn.train import (
    NonFiniteLossError,
    RunConfig,
    RunFolderError,
    checkpoint_problem,
    latest_checkpoint,
    pretrain,
    pretrain_paired,
    read_metrics,
)
from diffattn.train import data as train_data
from diffattn.train.trainer import lr_factor

from ..helpers import assert_follows_eager, debug_config, frames_compiled, losses

pytestmark = pytest.mark.usefixtures("tokenizer_cache")  # every test here trains tokenizers into a session cache


def test_config_yaml_roundtrip_and_overrides(tmp_path):
    cfg = RunConfig().with_overrides({"train.max_steps": 7, "model.preset": "debug", "data.seq_len": 32})
    cfg.save(tmp_path / "run.yaml")
    back = RunConfig.load(tmp_path / "run.yaml")
    assert back == cfg and back.train.max_steps == 7
    assert back.train.beta2 == 0.95 and back.train.weight_decay == 0.1 and back.train.min_lr_ratio == 0.04


def test_warmup_defaults_to_a_tenth_of_the_run():
    assert RunConfig().train.resolved_warmup_steps == 20
    short = RunConfig().with_overrides({"train.max_steps": 2}).validate()
    assert short.train.resolved_warmup_steps == 0
    with pytest.raises(ValueError, match="warmup_steps must be in"):
        RunConfig().with_overrides({"train.max_steps": 2, "train.warmup_steps": 5}).validate()
    # bounded by the planned schedule: a run may stop inside the warm-up of a longer one, as its implicit 10% may
    part = {"train.max_steps": 200, "train.schedule_steps": 4000}
    assert RunConfig().with_overrides({**part, "train.warmup_steps": 400}).validate().train.resolved_warmup_steps == 400


def _train(max_steps: int, **train) -> RunConfig:
    return RunConfig().with_overrides({"train.max_steps": max_steps, **{f"train.{k}": v for k, v in train.items()}})


@pytest.mark.parametrize(
    ("saved", "asked", "trained", "finished", "refused"),
    [
        pytest.param(_train(200), _train(400), 200, True, "200 steps, warm-up 20 -> 400 steps, warm-up 40", id="ext"),
        pytest.param(_train(200), _train(400), 0, False, None, id="no-step-taken"),
        pytest.param(_train(200), _train(100), 200, True, None, id="fewer-steps-than-taken"),
        # not finished (no summary.json): the trainer would take a step under the shorter plan
        pytest.param(_train(200), _train(100), 200, False, "200 steps, warm-up 20 -> 100 steps", id="unfinished"),
        pytest.param(_train(200, schedule_steps=400), _train(400), 200, True, None, id="to-the-planned-end"),
        pytest.param(_train(400), _train(200, schedule_steps=400), 100, False, None, id="stopped-part-way"),
        pytest.param(_train(400), _train(200), 100, False, "400 steps, warm-up 40 -> 200 steps", id="cut-short"),
        pytest.param(
            _train(200), _train(200, warmup_steps=30), 200, True, "warm-up 20 -> 200 steps, warm-up 30", id="wu"
        ),
        pytest.param(_train(200), _train(400, compile="default"), 0, False, None, id="run-time-settings"),
    ],
)
def test_a_resume_keeps_the_schedule_its_steps_followed(saved, asked, trained, finished, refused):
    from diffattn.train.config import resume_differences

    diff = resume_differences(saved, asked, trained_steps=trained, finished=finished)
    if refused is None:
        assert diff == []
    else:
        assert len(diff) == 1 and diff[0].startswith("train schedule: ") and refused in diff[0], diff
        assert f"steps 1-{trained} followed the first" in diff[0] and "train.schedule_steps" in diff[0]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train": {"max_step": 3}}, "unknown key.*train.max_step.*allowed in train"),
        ({"optimizer": {}}, "unknown key.*optimizer"),
        ({"train": {"max_steps": "ten"}}, "train.max_steps must be an integer"),
        ({"train": {"max_steps": 0}}, "train.max_steps must be >= 1"),
        ({"model": {"preset": "giant"}}, "unknown preset 'giant'"),
        ({"model": {"attention": "linear"}}, "model.attention must be one of"),
        ({"train": {"save_every": 5, "log_every": 2}}, "multiple of train.log_every"),
        ({"model": {"lambda_init": 1.5}}, r"model.lambda_init must be 'exponential' or a float in \(0, 1\)"),
        ({"train": {"beta1": -0.1}}, r"train.beta1 must be in \[0, 1\)"),
        ({"train": {"weight_decay": -0.1}}, r"train.weight_decay must be >= 0"),
        ({"train": {"grad_clip": float("nan")}}, r"train.grad_clip must be >= 0"),
        ({"train": {"keep_checkpoints": 0}}, r"train.keep_checkpoints must be >= 1"),
    ],
)
def test_bad_config_is_one_clear_error(data, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(data).validate()


# ---------------------------------------------------------------- a run end to end


def test_debug_run_outputs_metrics_checkpoint_and_loadable_final(corpus_file, tmp_path, capsys):
    run = tmp_path / "run"
    summary = pretrain(debug_config(corpus_file), run)
    printed = capsys.readouterr()
    # the terminal gets a progress bar, not a dict per logging step: those lines live in metrics.jsonl
    assert not [ln for ln in (printed.out + printed.err).splitlines() if ln.lstrip().startswith("{'")]
    records = read_metrics(run / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "lambda"):
        assert all(r.get(key) is not None for r in train[1:]), key
    assert len(train[0]["lambda"]) == 2  # one λ per DIFF layer
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [6, 12] and math.isclose(evals[0]["val_ppl"], math.exp(evals[0]["val_loss"]))
    # warmup then linear decay towards 4% of the peak
    lrs = [r["lr"] for r in train]
    assert max(lrs) == pytest.approx(3e-3, rel=0.05) and lrs[-1] < 0.3 * 3e-3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-12", "checkpoint-8"]
    assert checkpoint_problem(run / "checkpoints" / "checkpoint-12") is None
    assert not (run / ".staging").exists()
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    tok = AutoTokenizer.from_pretrained(run / "final")
    ids = tok("To be, or not to be", return_tensors="pt").input_ids
    assert torch.isfinite(model(ids).logits).all()
    assert (run / "final" / "run.yaml").is_file() and summary["parameters"] > 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 12


def test_a_checkpoint_is_evaluated_like_the_final_model(corpus_file, tmp_path):
    """Every pretraining checkpoint holds the run's tokenizer and run.yaml, so the evaluation loader reads it as it
    reads final/: the last checkpoint gives final/'s logits, at the training length, named as a checkpoint."""
    from diffattn.eval.suite import load_for_eval

    run = tmp_path / "run"
    config = debug_config(corpus_file)
    pretrain(config, run)
    last = run / "checkpoints" / "checkpoint-12"
    assert (last / "tokenizer.json").is_file() and (last / "run.yaml").read_text() == (run / "run.yaml").read_text()
    model, tok, description = load_for_eval(last)
    final, final_tok, _ = load_for_eval(run)
    assert tok.get_vocab() == final_tok.get_vocab() and "checkpoint of pretrain run" in description
    assert model.diffattn_trained_length == final.diffattn_trained_length == config.data.seq_len
    ids = tok("To be, or not to be", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, final(ids).logits)
    assert load_for_eval(run / "checkpoints" / "checkpoint-8")[1].get_vocab() == tok.get_vocab()


def test_a_saved_model_generates_like_any_hugging_face_model(corpus_file, tmp_path):
    """config.json has use_cache on, generation_config.json the tokenizer's eos/pad, so plain transformers'
    generate stops at the end of text: here the eos logit is made the largest, so it stops after 1 new token."""
    from transformers import GenerationConfig

    run = tmp_path / "run"
    pretrain(debug_config(corpus_file, max_steps=2, save_every=2, eval_every=2), run)
    tok = AutoTokenizer.from_pretrained(run / "final")
    assert json.loads((run / "final" / "config.json").read_text())["use_cache"] is True
    gen = GenerationConfig.from_pretrained(run / "final")
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    model = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    ids = tok("To be, or not", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=6, do_sample=False).shape[1] == ids.shape[1] + 6
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 50 * model.model.norm(model.model(ids).last_hidden_state[0, -1])
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 1 and out[0, -1] == tok.eos_token_id


def test_loss_decreases_over_50_steps(corpus_file, tmp_path):
    cfg = debug_config(corpus_file, max_steps=50, eval_every=50, save_every=50, warmup_steps=5)
    pretrain(cfg, tmp_path / "run")
    loss = losses(tmp_path / "run")
    first, last = sum(loss[s] for s in range(1, 6)) / 5, sum(loss[s] for s in range(46, 51)) / 5
    assert last < first - 0.5, (first, last)  # a model that learns nothing stays near ln(512) = 6.24


class _StopAt(TrainerCallback):
    """Simulates a killed process: raises right after step `step` (its checkpoint already published)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step + 1:
            raise KeyboardInterrupt(f"killed after step {self.step}")


def test_kill_and_resume_reaches_the_same_losses(corpus_file, tmp_path, caplog):
    cfg = debug_config(corpus_file)
    pretrain(cfg, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        pretrain(cfg, tmp_path / "killed", callbacks=[_StopAt(8)])
    assert latest_checkpoint(tmp_path / "killed").name == "checkpoint-8"
    with pytest.raises(RunFolderError, match="exists and is not empty"):
        pretrain(cfg, tmp_path / "killed")
    caplog.clear()
    pretrain(cfg, tmp_path / "killed", resume=True)
    # the tied lm_head is loaded with the embeddings it shares: transformers' Trainer said it was missing
    assert "missing keys" not in caplog.text
    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "killed")
    # CPU, fixed seed: the resumed steps match the uninterrupted run to float32 round-off
    for step in range(9, 13):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5, abs=1e-6), step


def test_a_run_stopped_after_its_last_checkpoint_resumes_without_another_step(corpus_file, tmp_path):
    """A run that saved its last checkpoint and stopped before its summary (a crash in the final evaluation or
    save): transformers' Trainer resumed it with one more step (a 2-step run ended at step 3). Now it is loaded,
    evaluated and saved as the finished run was."""
    cfg = debug_config(corpus_file, max_steps=2, save_every=2, eval_every=2)
    first = pretrain(cfg, tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()
    again = pretrain(cfg, tmp_path / "run", resume=True)
    assert again["steps"] == 2 and again["final_val_loss"] == pytest.approx(first["final_val_loss"], rel=1e-6)
    assert max(losses(tmp_path / "run")) == 2
    # no step ran in this process: its speed is the one the first process logged (it read 0 tokens/s)
    from types import SimpleNamespace

    from diffattn.train.trainer import MetricsCallback, training_throughput

    rates = [r["tokens_per_s"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "tokens_per_s" in r]
    assert rates and again["tokens_per_s"] == pytest.approx(sum(rates) / len(rates))
    metrics = MetricsCallback(tmp_path / "m.jsonl", 64)
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[metrics]))
    assert training_throughput(trainer, tmp_path / "nothing logged") is None
    # steps of this process: their own rate, from their step times alone (not the wall time of evaluations too)
    metrics.total_steps, metrics.total_seconds = 3, 2.0
    assert training_throughput(trainer, tmp_path / "run") == 96.0
    wall_rate = cfg.train.global_batch_size * cfg.data.seq_len * first["steps"] / first["wall_seconds"]
    assert first["tokens_per_s"] > wall_rate  # its evaluation and checkpoint at step 2 are not in the rate
    # a summary.json older than the newest checkpoint (an extension stopped after its checkpoint, before its
    # summary) is not the run's result: the checkpoint is (the older summary was returned as "finished")
    (tmp_path / "run" / "summary.json").write_text(json.dumps({**first, "steps": 1}))
    latest = pretrain(cfg, tmp_path / "run", resume=True)
    assert latest["steps"] == 2 and latest["final_val_loss"] == pytest.approx(first["final_val_loss"], rel=1e-6)


def test_gradient_accumulation_matches_the_full_batch(corpus_file, tmp_path):
    cfg = debug_config(corpus_file, max_steps=6, eval_every=6, save_every=6)
    pretrain(cfg, tmp_path / "full")
    pretrain(cfg.with_overrides({"train.grad_accum": 2}), tmp_path / "accum")  # 2 micro-batches of 4
    full, accum = losses(tmp_path / "full"), losses(tmp_path / "accum")
    for step in full:
        assert accum[step] == pytest.approx(full[step], rel=1e-5), step


@pytest.mark.heavy  # over 10 s on 2 cores (tests/durations.json); CI runs it
def test_row_loss_average_equals_token_average_on_full_text_rows_and_accumulates(corpus_file, tmp_path):
    """Text rows are full and fully scored, so the per-row mean of per-token losses is the token mean; with the
    retrieval mix the two differ, and row averaging still matches gradient accumulation."""
    cfg = debug_config(corpus_file, max_steps=3, eval_every=3, save_every=3)
    pretrain(cfg, tmp_path / "token")
    pretrain(cfg.with_overrides({"train.loss_average": "row"}), tmp_path / "row")
    token, row = losses(tmp_path / "token"), losses(tmp_path / "row")
    for step in token:
        assert row[step] == pytest.approx(token[step], rel=1e-5), step
    mixed = cfg.with_overrides(
        {"data.retrieval_fraction": 0.5, "data.needle_loss": "answer", "data.mqar_fraction": 0.0, "train.max_steps": 4}
    )
    mixed = mixed.with_overrides({"train.eval_every": 4, "train.save_every": 4})
    pretrain(mixed, tmp_path / "mixed-token")
    pretrain(mixed.with_overrides({"train.loss_average": "row"}), tmp_path / "mixed-row")
    pretrain(mixed.with_overrides({"train.loss_average": "row", "train.grad_accum": 2}), tmp_path / "mixed-accum")
    mt, mr, ma = (losses(tmp_path / n) for n in ("mixed-token", "mixed-row", "mixed-accum"))
    assert mt[4] != pytest.approx(mr[4], rel=1e-4)  # answer rows now weigh as much as text rows
    for step in mr:
        assert ma[step] == pytest.approx(mr[step], rel=1e-4), step


def test_the_unigram_floor_scores_the_validation_targets_by_the_training_frequencies():
    """Add-one frequencies of the training labels; the validation targets after each row's first, padding left out:
    a model that learnt only which tokens are common scores this."""
    from diffattn.data import PackedSequences

    def rows(labels):
        t = torch.tensor(labels)
        return PackedSequences(t.clamp(min=0), t, (t >= 0).long(), int((t >= 0).sum()))

    floor = train_data.unigram_nll(rows([[0, 1, 1, 2]]), rows([[3, 1, 2, -100]]), vocab_size=4)
    assert floor == pytest.approx(-(math.log(3 / 8) + math.log(2 / 8)) / 2)  # counts + 1: 2, 3, 2, 1 of 8


def test_max_text_sequences_caps_the_text_rows_and_sizes_the_mix_on_them(corpus_file, tmp_path):
    cfg = debug_config(corpus_file).with_overrides(
        {"data.retrieval_fraction": 0.5, "data.mqar_fraction": 0.0, "data.max_text_sequences": 20}
    )
    data = train_data.prepare_data(cfg)
    assert data.info["retrieval_mix_sequences"] == 20 and data.info["train_sequences"] == 40
    # the loss rows' floor: the validation rows under the text rows' token frequencies, below a uniform guess
    assert 0 < data.info["val_unigram_nll"] < math.log(data.info["vocab_size"])
    with pytest.raises(ValueError, match="max_text_sequences"):
        cfg.with_overrides({"data.max_text_sequences": 0}).validate()


def test_a_run_that_rereads_a_small_pool_says_so(corpus_file, tmp_path, caplog):
    """mqar-seeds read its 6,336-row MQAR pool 12.6 times and its Transformer memorised it (issue 35): the run's data
    summary records the passes and a run above REPEATED_DATA_PASSES warns once, naming the remedy."""
    cfg = debug_config(corpus_file).with_overrides(
        {"data.retrieval_fraction": 0.5, "data.mqar_fraction": 0.0, "data.max_text_sequences": 20}
    )
    rows, batch = 40, cfg.train.global_batch_size
    just_under = int(train_data.REPEATED_DATA_PASSES * rows / batch)  # steps × batch / rows <= the threshold
    with caplog.at_level("WARNING", logger=train_data.logger.name):
        data = train_data.prepare_data(cfg.with_overrides({"train.max_steps": just_under}))
    assert data.info["passes_over_data"] == pytest.approx(just_under * batch / rows, abs=0.01)
    assert "memorise" not in caplog.text
    with caplog.at_level("WARNING", logger=train_data.logger.name):
        data = train_data.prepare_data(cfg.with_overrides({"train.max_steps": just_under + 1}))
    assert data.info["passes_over_data"] > train_data.REPEATED_DATA_PASSES
    assert caplog.text.count("memorise") == 1 and "20 of them the retrieval practice mix" in caplog.text
    assert "data.max_text_sequences" in caplog.text


def test_resume_refuses_changed_settings(corpus_file, tmp_path):
    cfg = debug_config(corpus_file, max_steps=4)
    pretrain(cfg, tmp_path / "run")
    changed = cfg.with_overrides({"train.lr": 1e-2})
    with pytest.raises(RunFolderError, match=r"train.lr: 0.003 -> 0.01"):
        pretrain(changed, tmp_path / "run", resume=True)
    with pytest.raises(RunFolderError, match="nothing to resume"):
        pretrain(cfg, tmp_path / "elsewhere", resume=True)
    # the schedule is compared as planned: given as the length it defaulted to, the run is finished, not changed
    planned = cfg.with_overrides({"train.schedule_steps": 4})
    assert planned.train.schedule_plan == cfg.train.schedule_plan == "4 steps, warm-up 2"
    assert pretrain(planned, tmp_path / "run", resume=True)["steps"] == 4


def test_corrupt_or_partial_checkpoint_is_never_picked(corpus_file, tmp_path):
    run = tmp_path / "run"
    pretrain(debug_config(corpus_file), run)
    newest = run / "checkpoints" / "checkpoint-12"
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated write
    assert "unreadable" in checkpoint_problem(newest)
    partial = run / "checkpoints" / "checkpoint-16"
    partial.mkdir()
    (partial / "trainer_state.json").write_text("{")
    assert latest_checkpoint(run).name == "checkpoint-8"


class _PoisonWeights(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 5:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(corpus_file, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match="at step 6"):
        pretrain(debug_config(corpus_file, save_every=2, log_every=1), run, callbacks=[_PoisonWeights()])
    assert latest_checkpoint(run).name == "checkpoint-4"
    assert not (run / "checkpoints" / "checkpoint-6").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data.source": "/no/such/corpus.txt"}, "does not exist"),
        ({"data.seq_len": 300}, "data.seq_len=300 exceeds the model's maximum of 256"),
        ({"data.seq_len": 300}, r"lower it \(--seq-len 256, or data\.seq_len in the config\)"),
    ],
)
def test_bad_data_and_lengths_fail_clearly(corpus_file, tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        pretrain(debug_config(corpus_file).with_overrides(change), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # a failed start writes nothing, so the corrected rerun is not refused


def test_empty_corpus_fails_clearly(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(ValueError, match="empty"):
        pretrain(debug_config(empty), tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- paired runs and the retrieval mix


def test_paired_runs_share_data_order_and_write_comparison(corpus_file, tmp_path, monkeypatch):
    seen: list[int] = []
    original = train_data.PackedDataset.__getitem__
    monkeypatch.setattr(train_data.PackedDataset, "__getitem__", lambda self, i: (seen.append(i), original(self, i))[1])
    cfg = debug_config(corpus_file, max_steps=6, eval_every=6, save_every=6).with_overrides(
        {"data.retrieval_fraction": 0.25, "model.attention": "all"}
    )
    summaries = pretrain_paired(cfg, tmp_path / "pair")
    assert list(summaries) == ["standard", "diff", "diff-v2"]
    third = len(seen) // 3
    # identical sample order (train batches and evals) for the three models
    assert seen[:third] == seen[third : 2 * third] == seen[2 * third :]
    for name in ("comparison.md", "comparison.json", "loss_curves.png"):
        assert (tmp_path / "pair" / name).stat().st_size > 0
    table = json.loads((tmp_path / "pair" / "comparison.json").read_text())
    assert [r["model"] for r in table] == ["Transformer (baseline)", "DIFF Transformer", "DIFF Transformer V2"]
    assert all(abs(r["parameters"] - table[0]["parameters"]) / table[0]["parameters"] < 0.01 for r in table)
    assert summaries["diff-v2"]["parameters"] == table[2]["parameters"]
    assert summaries["diff"]["data"]["retrieval_mix_sequences"] > 0


# ---------------------------------------------------------------- scale-out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.heavy  # 9 s; the sharded and tensor-parallel two-process tests stay in the default run
def test_torchrun_two_cpu_processes_match_single_process(corpus_file, tmp_path):
    """DDP over two CPU processes (gloo). FSDP needs CUDA and is refused without it (tests/test_cli_bad_input.py),
    so what run.yaml records is what ran."""
    cfg = debug_config(corpus_file, max_steps=8, eval_every=8, save_every=8)
    pretrain(cfg, tmp_path / "single")
    cfg.save(tmp_path / "run.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "diffattn.cli",
        "pretrain",
        "--config",
        str(tmp_path / "run.yaml"),
        "--out",
        str(tmp_path / "ddp"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert sorted(ddp) == list(range(1, 9))
    # same global batch (8 = 2 processes × 4) and sample order; only the gradient reduction differs in
    # summation order, so the trajectories agree to float32 round-off (measured: 1.6e-7 for DDP and FSDP)
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-5), step
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "ddp" / "final") is not None
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["distributed"] == {"strategy": "ddp", "processes": 2}
    shutil.rmtree(tmp_path / "ddp")


def _tree(folder):
    """Every file under ``folder`` with its bytes (what a refused resume must leave as it was)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_bad_checkpoint_is_refused_before_anything_is_written_and_a_finished_run_is_left_alone(corpus_file, tmp_path):
    """issue 36 §5–7: --resume checks what it will read before it writes: a pickled rng_state (refused by
    weights_only), a weight of the wrong shape, a checkpoint cast to float16 — each refused, naming the file, with
    run.yaml and every other file byte-identical (before, run.yaml was rewritten, max_steps 4 → 6). A finished run
    resumed to the same budget trains nothing and changes nothing."""
    from safetensors.torch import load_file, save_file

    cfg = debug_config(corpus_file, max_steps=4, schedule_steps=6)  # a schedule it may be extended in
    cfg.train.save_every = 4
    run = tmp_path / "run"
    pretrain(cfg, run)
    before = _tree(run)
    assert pretrain(cfg, run, resume=True)["steps"] == 4  # finished at the budget: nothing trained
    assert _tree(run) == before
    longer = cfg.with_overrides({"train.max_steps": 6})
    ckpt = run / "checkpoints" / "checkpoint-4"
    weights = ckpt / "model.safetensors"
    original = weights.read_bytes()

    def refused(match):
        snapshot = _tree(run)
        with pytest.raises(RunFolderError, match=match):
            pretrain(longer, run, resume=True)
        assert _tree(run) == snapshot  # run.yaml included: max_steps still 4

    tensors = load_file(weights)
    save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}, weights)
    refused(r"checkpoint-4: model\.safetensors: .* is torch\.float16, the run trains torch\.float32")
    key = next(k for k, v in tensors.items() if v.dim() == 2)
    save_file({**tensors, key: tensors[key][:, :-1].contiguous()}, weights)
    refused(rf"model\.safetensors: {key} has shape")
    weights.write_bytes(original)
    rng = next(ckpt.glob("rng_state*.pth"))
    torch.save({"python": socket.socket}, rng)  # a pickle that names a class: weights_only refuses it
    refused(r"rng_state.*\.pth does not load as plain tensors")


def test_a_dangling_symlink_as_out_is_named(corpus_file, tmp_path):
    """issue 36 §12: --out a symbolic link to nowhere said only "File exists"."""
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    with pytest.raises(RunFolderError, match=r"is a symbolic link to .*nowhere', which does not exist"):
        pretrain(debug_config(corpus_file, max_steps=2), out)
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- the learning-rate schedule


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.04, 1.0])
@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_schedule_warms_up_from_the_first_step_then_decays_to_the_floor(decay, min_lr_ratio):
    # transformers' warmup_stable_decay started the warmup at min_lr_ratio: at 1 (a constant rate) no warmup at all
    factor = functools.partial(lr_factor, warmup_steps=10, decay_steps=90, decay=decay, min_lr_ratio=min_lr_ratio)
    assert factor(0) == pytest.approx(0.1) and factor(4) == pytest.approx(0.5) and factor(9) == factor(10) == 1.0
    assert factor(100) == pytest.approx(min_lr_ratio) and factor(500) == pytest.approx(min_lr_ratio)
    halfway = 0.5 * (1 + min_lr_ratio)  # linear and cosine both pass the midpoint halfway through the decay
    assert factor(55) == pytest.approx(halfway)
    rates = [factor(s) for s in range(101)]
    assert all(a <= b for a, b in itertools.pairwise(rates[:11]))  # warmup rises
    assert all(a >= b for a, b in itertools.pairwise(rates[10:]))  # decay never rises


def test_a_constant_rate_run_still_warms_up(corpus_file, tmp_path):
    cfg = debug_config(corpus_file, max_steps=8, eval_every=8, save_every=8, warmup_steps=4, min_lr_ratio=1.0)
    pretrain(cfg, tmp_path / "run")
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    peak = cfg.train.lr
    # the rate logged at step s (from 1) is the one that step used: s/4 of the peak during the warmup, then the peak
    assert lrs == pytest.approx([peak * min(1.0, s / 4) for s in range(1, 9)])


def test_a_run_can_stop_part_way_through_a_longer_schedule(corpus_file, tmp_path):
    # schedule_steps: a budget read inside one schedule trains as the first steps of the full run did
    full = debug_config(corpus_file, max_steps=8, eval_every=8, save_every=8, warmup_steps=2)
    part = debug_config(corpus_file, max_steps=4, eval_every=4, save_every=4, warmup_steps=2, schedule_steps=8)
    pretrain(full, tmp_path / "full")
    pretrain(part, tmp_path / "part")
    lr = {
        name: [r["lr"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r]
        for name in ("full", "part")
    }
    assert lr["part"] == lr["full"][:4] and lr["part"][-1] > full.train.lr * 0.5  # mid-decay, not at its floor
    assert losses(tmp_path / "part") == {s: v for s, v in losses(tmp_path / "full").items() if s <= 4}
    assert (
        part.train.resolved_warmup_steps == 2
        and RunConfig().with_overrides({"train.schedule_steps": 1000}).validate().train.resolved_warmup_steps == 100
    )  # the default warmup is 10% of the schedule
    with pytest.raises(ValueError, match="schedule_steps must be an integer >= max_steps"):
        debug_config(corpus_file, max_steps=8, schedule_steps=4)
    # resumed to the schedule's end, the part is the full run: the same rates and losses, step for step
    pretrain(part.with_overrides({"train.max_steps": 8}), tmp_path / "part", resume=True)
    assert [r["lr"] for r in read_metrics(tmp_path / "part" / "metrics.jsonl") if "loss" in r] == lr["full"]
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    # the full run's schedule ended at its step 8: two more steps would warm up again from a decayed rate
    with pytest.raises(RunFolderError, match=r"train schedule: 8 steps, warm-up 2 -> 10 steps, warm-up 2 \(steps 1-8"):
        pretrain(full.with_overrides({"train.max_steps": 10}), tmp_path / "full", resume=True)


@pytest.mark.heavy  # 15.6 s on the 2-core AMD EPYC of 2026-12-01 (9.8 of the record's s): with adapt's, CI's heavy run
def test_a_compiled_run_trains_like_the_eager_one_and_saves_plain_weights(corpus_file, tmp_path):
    """``train.compile``: Trainer runs the model through torch.compile (here ``aot_eager``: dynamo's graph and
    AOTAutograd's forward and backward, no generated code — what inductor starts from), and dynamo compiles it (its
    counters say so). The losses follow the eager run's within float32 rounding. The final model is saved without
    torch.compile's ``_orig_mod.`` prefix, and an eager run resumes from a compiled run's checkpoint (how the step runs
    is not a setting a resume compares)."""
    cfg = debug_config(corpus_file, max_steps=4, eval_every=4, save_every=2, schedule_steps=6)  # may go to 6
    assert frames_compiled(pretrain, cfg, tmp_path / "eager") == 0
    pretrain(cfg.with_overrides({"train.grad_accum": 2}), tmp_path / "accum")
    compiled = cfg.with_overrides({"train.compile": "default", "train.compile_backend": "aot_eager"})
    assert frames_compiled(pretrain, compiled.with_overrides({"train.max_steps": 2}), tmp_path / "compiled") >= 1
    assert frames_compiled(pretrain, compiled, tmp_path / "compiled", resume=True) >= 1
    eager, accum, got = losses(tmp_path / "eager"), losses(tmp_path / "accum"), losses(tmp_path / "compiled")
    assert sorted(eager) == [1, 2, 3, 4]
    assert_follows_eager(got, eager, accum, "aot_eager")
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "compiled" / "final")
    assert not any("_orig_mod" in name for name in final.state_dict())
    longer = cfg.with_overrides({"train.max_steps": 6})
    assert frames_compiled(pretrain, longer, tmp_path / "compiled", resume=True) == 0
    assert sorted(losses(tmp_path / "compiled")) == [1, 2, 3, 4, 5, 6]  # eager from step 5


@pytest.mark.heavy  # inductor generates and compiles C++ for each model: ~40 s on 2 cores
def test_every_architecture_trains_compiled_by_inductor_like_eager(corpus_file, tmp_path):
    """``train.compile: default`` with inductor itself (generated kernels, fused element-wise work) on the CPU: the
    baseline, DIFF and DIFF V2 are compiled, train, evaluate and save, their losses within float32 rounding of eager's
    (:func:`tests.helpers.assert_follows_eager`)."""
    for attention in ("standard", "diff", "diff-v2"):
        cfg = debug_config(corpus_file, max_steps=3, eval_every=3, save_every=3)
        cfg = cfg.with_overrides({"model.attention": attention})
        pretrain(cfg, tmp_path / f"{attention}-eager")
        pretrain(cfg.with_overrides({"train.grad_accum": 2}), tmp_path / f"{attention}-accum")
        inductor = cfg.with_overrides({"train.compile": "default"})
        assert frames_compiled(pretrain, inductor, tmp_path / f"{attention}-inductor") >= 1, attention
        eager, accum = losses(tmp_path / f"{attention}-eager"), losses(tmp_path / f"{attention}-accum")
        assert_follows_eager(losses(tmp_path / f"{attention}-inductor"), eager, accum, attention)


def test_compile_takes_torch_modes_only_in_pretrain_and_adapt():
    from diffattn.train.adapt_config import AdaptRunConfig

    for run_config in (RunConfig, AdaptRunConfig):
        config = run_config().with_overrides({"train.compile": "reduce-overhead"}).validate()
        assert config.train.compile == "reduce-overhead"
        with pytest.raises(ValueError, match=r"train\.compile must be null .* reduce-overhead"):
            run_config().with_overrides({"train.compile": "fast"}).validate()


def test_a_graphed_run_trains_as_the_eager_one(corpus_file, tmp_path, monkeypatch):
    """``train.cuda_graphs`` (``diffattn pretrain --cuda-graphs``), CUDA's graph calls faked and each capture replayed
    by running what it captured again (:func:`tests.fake_cuda.replaying_captures`): three eager micro-steps, one
    capture, replays from there, each micro-batch without its all-ones attention mask and with the loss's divisor a
    tensor among the graph's inputs, Trainer's clipping, AdamW and ``zero_grad`` around them — the losses and the
    final weights bit for bit an eager run's without attention masks (:func:`tests.helpers.rows_without_masks`), with
    two micro-batches a step."""
    from diffattn.train import trainer as trainer_mod

    from ..fake_cuda import graphed_training_on_the_cpu
    from ..helpers import rows_without_masks

    cfg = debug_config(corpus_file, max_steps=4, eval_every=4, save_every=4, grad_accum=2)
    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "PackedDataset", rows_without_masks(trainer_mod.PackedDataset))
        pretrain(cfg, tmp_path / "eager")
    made = graphed_training_on_the_cpu(monkeypatch)
    pretrain(cfg.with_overrides({"train.cuda_graphs": True}), tmp_path / "graphed")
    (micro,) = made
    assert micro.calls == 8 and micro.replays == 5 and micro.eager_calls == 0
    # no attention mask (SDPA's is_causal), the loss's divisor a tensor the graph reads
    assert sorted(micro.static) == sorted(["input_ids", "labels", trainer_mod.DiffattnTrainer.NUM_ITEMS])
    assert losses(tmp_path / "graphed") == losses(tmp_path / "eager")
    eager = AutoModelForCausalLM.from_pretrained(tmp_path / "eager" / "final").state_dict()
    graphed = AutoModelForCausalLM.from_pretrained(tmp_path / "graphed" / "final").state_dict()
    assert all(torch.equal(eager[k], graphed[k]) for k in eager)


def test_a_mask_padded_at_the_ends_only_is_left_out_of_a_graphed_step():
    # ones then zeros in every row: a causal model's scored positions are computed as without the mask
    from diffattn.train.trainer import right_padded

    assert right_padded(torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]]))
    assert not right_padded(torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))  # padded at the start
    assert not right_padded(torch.tensor([[1, 0, 1, 1]]))  # a hole
    assert not right_padded(torch.tensor([[2, 1, 0, 0]]))  # not a 0/1 mask


def test_graphs_are_refused_where_a_run_cannot_replay_them(corpus_file, monkeypatch):
    from types import SimpleNamespace

    from diffattn.train.adapt_config import AdaptRunConfig
    from diffattn.train.trainer import check_cuda_graphs

    def args(device, n_gpu=1):
        return SimpleNamespace(device=torch.device(device), n_gpu=n_gpu)

    cfg = debug_config(corpus_file, cuda_graphs=True)
    with pytest.raises(ValueError, match="this run's device is cpu"):
        check_cuda_graphs(cfg, args("cpu"))
    with pytest.raises(ValueError, match=r"this process sees 2, which Trainer would drive by nn\.DataParallel"):
        check_cuda_graphs(cfg, args("cuda", n_gpu=2))
    check_cuda_graphs(cfg, args("cuda"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="runs on one GPU: this run has 2 processes"):
        check_cuda_graphs(cfg, args("cuda"))
    check_cuda_graphs(debug_config(corpus_file), args("cpu"))  # off: nothing to check
    with pytest.raises(ValueError, match=r"train\.cuda_graphs with train\.compile: choose one"):
        cfg.with_overrides({"train.compile": "default"}).validate()
    with pytest.raises(ValueError, match=r"train\.cuda_graphs with data\.packing"):
        cfg.with_overrides({"data.packing": True}).validate()
    with pytest.raises(ValueError, match=r"train\.cuda_graphs with train\.compile"):  # adapt's config too
        AdaptRunConfig().with_overrides({"train.cuda_graphs": True, "train.compile": "default"}).validate()


@pytest.mark.gpu
def test_gpu_a_graphed_run_trains_as_the_eager_one(tmp_path):
    """``diffattn pretrain --cuda-graphs`` on a GPU (bf16): DIFF's losses within 4x the eager run's own difference
    from itself with two micro-batches a step (:func:`tests.helpers.assert_follows_eager`: the graph replays the eager
    step's kernels, whose sums cuDNN's backward may order otherwise each run); both runs' tokens/s printed (a reading
    beside the test, not a claim: `make gpu-report`'s step is where speed is measured)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import random

    words = ["the", "a", "king", "queen", "sword", "crown", "night", "day", "speak", "hath", "thou", "art", "love"]
    rng = random.Random(0)
    corpus = tmp_path / "corpus.jsonl"  # (no data package on the GPU machine: text made here)
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=400))}) + "\n" for _ in range(60)))
    cfg = debug_config(corpus, max_steps=12, eval_every=12, save_every=12)
    pretrain(cfg, tmp_path / "eager")
    pretrain(cfg.with_overrides({"train.grad_accum": 2}), tmp_path / "accum")
    graphed = pretrain(cfg.with_overrides({"train.cuda_graphs": True}), tmp_path / "graphed")
    assert_follows_eager(losses(tmp_path / "graphed"), losses(tmp_path / "eager"), losses(tmp_path / "accum"), "graphs")
    eager = json.loads((tmp_path / "eager" / "summary.json").read_text())
    print(f"tokens/s: eager {eager['tokens_per_s']:.0f}, graphed {graphed['tokens_per_s']:.0f}")


def test_weight_decay_spares_every_norm_gain_the_diff_layers_add():
    """Trainer's rule knows norms by nn.LayerNorm or by name; a DIFF head norm's gain (rms_affine: an nn.RMSNorm
    named groupnorm) and DiffLoRA's norm_gain are neither, and were decayed while the model's other gains were not."""
    from diffattn import parameter_groups
    from diffattn.adapters import DiffLoRAConfig, adapt, trainable_parameters
    from diffattn.models import build_model
    from diffattn.models.decay import decayed_parameter_names

    from ..tiny_models import tiny

    model = build_model("debug", "diff", backend="reference", norm="rms_affine", num_layers=1)
    decayed = set(decayed_parameter_names(model))
    names = {n for n, _ in model.named_parameters()}
    norms = {n for n in names if "norm" in n}
    assert "model.layers.0.self_attn.groupnorm.weight" in norms and not decayed & norms
    # the λ vectors follow the general rule in pretraining (docs/methods.md §7), as do the projections
    assert {"model.layers.0.self_attn.lambda_q1", "model.layers.0.self_attn.q_proj.weight"} <= decayed
    adapted = adapt(tiny("llama"), DiffLoRAConfig(rank=2, group_norm=True, group_norm_gain=True))
    trainable_parameters(adapted)
    groups = {g["name"]: g for g in parameter_groups(adapted, lr=1e-4, lambda_lr=1e-2, weight_decay=0.1)}
    gains = [p for n, p in adapted.named_parameters() if n.endswith("norm_gain")]
    assert gains and all(any(p is q for q in groups["no_decay"]["params"]) for p in gains)
