"""``diffattn adapt``: every method and control trains end to end on a tiny local Hugging Face
folder, freezes what its paper froze, logs λ(t), and leaves a folder :func:`load_adapted` rebuilds the model from.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from transformers import TrainerCallback

from diffattn import load_adapter, load_pretrained
from diffattn.adapters.runs import load_adapted
from diffattn.cli import main
from diffattn.data import load_corpus
from diffattn.train.adapt import AdaptRunConfig, adapt_pretrained
from diffattn.train.adapt_config import default_anneal_steps
from diffattn.train.adapt_trainer import INACTIVE_LAMBDA, _lambda_warnings

from ..helpers import adapt_config, assert_follows_eager, frames_compiled, losses


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _val_ids(tokenizer, corpus_dir):
    text = load_corpus(corpus_dir).val[0]
    return tokenizer(text, return_tensors="pt").input_ids[:, :32]


def test_a_methods_new_weights_come_from_the_runs_seed_not_from_what_the_process_drew_before(
    base_dir, corpus_dir, tmp_path
):
    # LoRA's A (PEFT) is drawn from the global generator: a part trained after other parts in one process (an
    # experiment's adapters, one after the other) must start from the same weights as one trained first
    config = adapt_config(base_dir, corpus_dir, "lora", steps=1)
    summaries = []
    for i, drawn_before in enumerate((0, 1000)):
        torch.manual_seed(123)
        torch.randn(drawn_before)
        summaries.append(adapt_pretrained(config, tmp_path / f"run{i}"))
    assert summaries[0]["val_loss_before"] == summaries[1]["val_loss_before"]
    assert summaries[0]["val_loss_after"] == summaries[1]["val_loss_after"]


def test_dex_cli_run_logs_lambda_and_its_adapter_reloads(base_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "dex"
    code = main(
        [
            "adapt",
            "--model",
            str(base_dir),
            "--method",
            "dex",
            "--data",
            str(corpus_dir),
            "--seq-len",
            "32",
            "--max-steps",
            "4",
            "--batch-size",
            "2",
            "--lr",
            "1e-2",
            "--merge",
            "--set",
            "method.anneal_steps=3",
            "--set",
            "data.val_sequences=4",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "dex on" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["method"] == "dex"
    assert summary["method_config"]["selected"] is not None  # the entropy selection is recorded
    assert summary["val_loss_before"] > 0 and summary["val_loss_after"] > 0
    # λ(t) of Eq. 4 is logged per layer and follows the step: λ(0) = 0, then the annealing ramp
    lam = [e["lambda"] for e in _metrics(out) if "lambda" in e]
    assert len(lam) == 4 and all(len(v) == 2 for v in lam)
    assert lam[0] == [0.0, 0.0] and lam[1][0] != 0.0
    # the adapter folder rebuilds the trained model; merged/ is a plain Llama with the same logits
    model, tokenizer = load_pretrained(base_dir)
    adapted = load_adapter(model, out / "adapter")
    merged, _ = load_adapted(out, merged=True)
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert set(merged.state_dict()) == set(load_pretrained(base_dir)[0].state_dict())
    x = _val_ids(tokenizer, corpus_dir)
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, adapted(x).logits, atol=1e-5, rtol=1e-5)
        assert (adapted(x).logits - load_pretrained(base_dir)[0](x).logits).abs().max() > 1e-4
    # `diffattn eval` of the run reads adapter/: merged/ attends with the base's maps, not Dex's effective attention
    from diffattn.eval.suite import load_for_eval

    evaluated, _, description = load_for_eval(out)
    assert vars(evaluated)["_diffattn_adapter"].method == "dex"
    assert "adapter/ (its merged/ attends with the base's maps)" in description
    with torch.no_grad():
        torch.testing.assert_close(evaluated(x).logits, adapted(x).logits)


def _difflora_count(layers, d_model, q_width, k_width, rank):
    return layers * rank * (d_model + q_width + d_model + k_width)


@pytest.mark.parametrize(
    "method, sets",
    [
        ("daa", {}),
        ("diffq", {}),
        ("diffk", {}),
        ("diffv", {"method.merge": True}),
        ("difflora", {"method.rank": 4}),
        ("diff-v2", {}),
        ("lora", {"method.rank": 4}),
        ("attn-ft", {}),
        ("full-ft", {}),
    ],
)
def test_every_method_and_control_trains_and_reloads(method, sets, base_dir, corpus_dir, tmp_path):
    out = tmp_path / method
    seen = {}

    class Grab(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, model=None, **kwargs):
            seen["groups"] = [(g["weight_decay"], {id(p) for p in g["params"]}) for g in optimizer.param_groups]
            seen["names"] = {id(p): n for n, p in model.named_parameters()}

    summary = adapt_pretrained(adapt_config(base_dir, corpus_dir, method, **sets), out, callbacks=[Grab()])
    assert summary["steps"] == 3 and summary["val_loss_after"] < summary["val_loss_before"]
    base, tokenizer = load_pretrained(base_dir)
    total = sum(p.numel() for p in base.parameters())
    attention = sum(p.numel() for n, p in base.named_parameters() if ".self_attn." in n)
    expected = {
        "daa": attention + 2 * (4 * 16 * 16 + 1),
        "diffq": attention + 2 * (64 * 64 + 1),
        "diffk": attention + 2 * (64 * 64 + 1),
        "diffv": attention + 2 * (64 * 64 + 1),
        "difflora": _difflora_count(2, 64, 64, 32, 4),
        "diff-v2": attention + 2 * (64 * 64 + 64 * 4 + 4),  # W_Q2 and the gate (weights, bias) per layer
        "lora": _difflora_count(2, 64, 64, 32, 4),  # matched: LoRA on W_Q, W_K at DiffLoRA's rank
        "attn-ft": attention,
        "full-ft": total,
    }[method]
    assert summary["trainable_parameters"] == expected
    decayed = {seen["names"][i] for wd, ids in seen["groups"] if wd > 0 for i in ids}
    assert not any("lambda" in n for n in decayed)  # λ is never decayed
    model, _ = load_adapted(out)
    if not (out / "merged").is_dir():  # the merged form is asked for, never picked silently
        with pytest.raises(ValueError, match="has no merged/"):
            load_adapted(out, merged=True)
    x = _val_ids(tokenizer, corpus_dir)
    with torch.no_grad():
        assert torch.isfinite(model(x).logits).all()
        assert (model(x).logits - base(x).logits).abs().max() > 1e-4  # the trained weights came back
    if method == "diffv":  # --merge: a plain model with the adapter's logits, what `diffattn eval` reads (its maps)
        assert (out / "merged").is_dir() and type(model).__name__ == "LlamaForCausalLM"
        from diffattn.eval.suite import load_for_eval

        assert load_for_eval(out)[2].endswith(" merged/")
    for form in ("adapter", "merged", "final"):  # every folder gets a Hub model card with the run's facts
        if (out / form).is_dir():
            card = (out / form / "README.md").read_text()
            assert card.startswith("---\n") and "library_name: transformers" in card and f"method: `{method}`" in card
            assert "budget: 3 steps ×" in card and "## Loading" in card


def test_resume_continues_a_run_to_more_steps(base_dir, corpus_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.chdir(base_dir.parent)  # the base named relative to here: run.yaml records it absolute, so the run
    # is read from any directory (it recorded the relative name, read against the reader's directory)
    # planned over 4 steps (its learning rate and λ(t)'s annealing), stopped at 2, resumed to the plan's end
    planned = {"train.save_every": 2, "train.schedule_steps": 4}
    relative = adapt_config(base_dir, corpus_dir, "daa", steps=2, **planned, **{"model.name": base_dir.name})
    assert relative.method_config().anneal_steps == default_anneal_steps(4) == 2  # T of the planned run
    before = adapt_pretrained(relative, out)["val_loss_before"]
    assert yaml.safe_load((out / "run.yaml").read_text())["model"]["name"] == str(base_dir.resolve())
    # the experiment runner's rerun of the same config, named relative again, is the same run: done (it was refused,
    # the relative name against the absolute one: a second `diffattn quickstart` with its relative --root)
    from diffattn.experiments.runner import run_state

    assert run_state(out, relative, overwrite=False) == "done"
    monkeypatch.chdir(tmp_path)
    config = adapt_config(base_dir, corpus_dir, "daa", steps=4, **planned)
    summary = adapt_pretrained(config, out, resume=True)
    # the loss before training: the first start's step-0 evaluation, read back from metrics.jsonl (it was null)
    assert summary["steps"] == 4 and summary["val_loss_before"] == before is not None
    # stopped after its last checkpoint, before its summary: loaded, not stepped again, λ(t) where its steps left it
    (out / "summary.json").unlink()
    again = adapt_pretrained(config, out, resume=True)
    assert again["steps"] == 4 and again["lambda"] == pytest.approx(summary["lambda"], rel=1e-6)
    assert again["val_loss_after"] == pytest.approx(summary["val_loss_after"], rel=1e-6)
    assert again["tokens_per_s"] > 0  # the rate its steps logged (it read 0: no step ran in this process)
    # past its schedule's end, λ(t) would anneal again over a longer T and the rate warm up from its floor: refused
    with pytest.raises(ValueError, match=r"train schedule: 4 steps, warm-up 0 -> 6 steps, warm-up 1 \(steps 1-4"):
        beyond = adapt_config(base_dir, corpus_dir, "daa", steps=6, **{"train.save_every": 2})
        adapt_pretrained(beyond, out, resume=True)
    with pytest.raises(ValueError, match="differ from the saved run"):
        adapt_pretrained(adapt_config(base_dir, corpus_dir, "dex", steps=4), out, resume=True)


def test_adapting_past_the_length_a_diffattn_base_was_trained_at_warns(tmp_path):
    """A from-scratch base records its training length in final/run.yaml: an adapter trained at more positions
    also learns a longer context, said in the log and summary.json's warnings; a hub model records none."""
    from diffattn.train.adapt import _beyond_base_length, base_training_length

    final = tmp_path / "models" / "t" / "final"
    final.mkdir(parents=True)
    (final / "run.yaml").write_text("# diffattn run\ndata: {seq_len: 64}\ntrain: {max_steps: 3}\n")
    config = AdaptRunConfig().with_overrides({"model.name": str(final), "data.seq_len": 128})
    assert base_training_length(str(final)) == 64
    warning = _beyond_base_length(config)
    assert "data.seq_len=128 is longer than the 64 tokens" in warning and "positions 64-127 are new" in warning
    assert _beyond_base_length(config.with_overrides({"data.seq_len": 64})) is None
    (final / "run.yaml").write_text("data: {seq_len: 64}\nmethod: {name: dex}\n")  # an adapter run's: not a base's
    assert base_training_length(str(final)) is None
    assert base_training_length("smollm2-135m") is None and base_training_length(str(tmp_path / "none")) is None
    (final / "run.yaml").write_bytes(b"data: {seq_len: [64\n\xff")  # unreadable: no record, no crash
    assert base_training_length(str(final)) is None


def test_a_run_stopped_while_lambda_still_ramps_says_so():
    """λ(t)'s default T follows the planned schedule: a 50-step run of a 1,000-step plan anneals over 200 steps, so
    the λ it saves is a point on the ramp, and its summary says so; a whole run, or a T given, says nothing."""
    from diffattn.train.adapt import _ramp_warnings

    part = AdaptRunConfig().with_overrides({"method.name": "dex", "train.max_steps": 50, "train.schedule_steps": 1000})
    (warning,) = _ramp_warnings(part, part.method_config())
    assert "anneals over 200 steps of the 1000-step schedule and this run stops at step 50" in warning
    whole = part.with_overrides({"train.max_steps": 1000})
    given = part.with_overrides({"method.options.anneal_steps": 200})
    assert _ramp_warnings(whole, whole.method_config()) == _ramp_warnings(given, given.method_config()) == []


def test_resume_sees_a_changed_code_default_and_accepts_its_old_value_given(base_dir, corpus_dir, tmp_path):
    """run.yaml holds the options given; method_options.json the resolved ones. A run made when DAA's default
    placement was pre-RoPE (simulated by editing the saved file) must not resume as post-RoPE unannounced."""
    out = tmp_path / "run"
    longer = {"train.save_every": 2, "train.schedule_steps": 4}
    adapt_pretrained(adapt_config(base_dir, corpus_dir, "daa", steps=2, **longer), out)
    saved = json.loads((out / "method_options.json").read_text())
    assert saved["position"] == "post-rope"
    (out / "method_options.json").write_text(json.dumps({**saved, "position": "pre-rope"}))
    with pytest.raises(ValueError, match=r"resolve differently.*position: 'pre-rope' -> 'post-rope'"):
        adapt_pretrained(adapt_config(base_dir, corpus_dir, "daa", steps=4, **longer), out, resume=True)
    given = adapt_config(base_dir, corpus_dir, "daa", steps=4, **longer, **{"method.options.position": "pre-rope"})
    assert adapt_pretrained(given, out, resume=True)["method_config"]["position"] == "pre-rope"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "prefix-tuning"], "method.name must be one of dex, .*lora, attn-ft, full-ft"),
        (["--method", "daa", "--merge"], "--merge applies to dex and diffv only"),
        (["--method", "dex", "--set", "method.rnak=4"], "unknown option.*rnak.*allowed: heads"),
        (["--method", "dex", "--set", "method.heads=importance2"], "DexConfig.heads must be one of"),
        (["--model", "no-such-model"], "unknown pretrained model"),
        # 1 step: T = 1, so a zero W_D and λ_learn = 0 never get a gradient; refused before anything is loaded
        (["--method", "dex", "--set", "method.init=zero"], "init='zero' and anneal_steps=1.*Use init='identity'"),
        (["--method", "dex", "--set", "method.init=zero", "--set", "method.anneal=false"], "anneal=False"),
    ],
)
def test_bad_input_is_one_clear_error(args, message, corpus_dir, tmp_path, capsys):
    out = tmp_path / "bad"
    code = main(["adapt", "--data", str(corpus_dir), "--max-steps", "1", "--out", str(out), *args])
    assert code == 2
    import re

    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()  # nothing written on a failed start


def test_default_anneal_steps_is_twenty_percent_with_a_floor_of_min_10_and_half_the_run():
    got = {s: default_anneal_steps(s) for s in (1, 2, 3, 6, 20, 30, 50, 200, 1000)}
    assert got == {1: 1, 2: 1, 3: 1, 6: 3, 20: 10, 30: 10, 50: 10, 200: 40, 1000: 200}
    for method in ("dex", "daa", "diffq", "diffk", "diffv"):  # one default for every λ(t) method
        config = AdaptRunConfig().with_overrides({"method.name": method, "train.max_steps": 6})
        assert config.method_config().anneal_steps == 3
    explicit = AdaptRunConfig().with_overrides({"method.name": "dex", "method.anneal_steps": 5})
    assert explicit.method_config().anneal_steps == 5


def test_six_step_dex_run_really_adds_differential_attention(base_dir, corpus_dir, tmp_path):
    out = tmp_path / "dex"
    summary = adapt_pretrained(adapt_config(base_dir, corpus_dir, "dex", steps=6), out)
    assert summary["method_config"]["init"] == "identity" and summary["method_config"]["anneal_steps"] == 3
    assert len(summary["lambda"]) == 2 and all(v != 0.0 for v in summary["lambda"])  # λ = λ_learn (t = 5 > T)
    assert max(abs(v) for v in summary["lambda"]) >= INACTIVE_LAMBDA and summary["warnings"] == []
    assert json.loads((out / "summary.json").read_text())["warnings"] == []
    model, _ = load_pretrained(base_dir)
    adapted = load_adapter(model, out / "adapter")
    from diffattn.adapters import attention_modules

    for _, _, w in attention_modules(adapted):
        eye = torch.eye(w.method.dex_w_d.shape[-1]).expand_as(w.method.dex_w_d)
        assert (w.method.dex_w_d.detach() - eye).abs().max() > 1e-4  # W_D moved from its identity init
        assert float(w.method.dex_lambda().detach()) != 0.0
    # the old default (init="zero", and T = 20% of 6 steps = 1) trained nothing: now refused before any work
    old = adapt_config(base_dir, corpus_dir, "dex", steps=6, **{"method.init": "zero", "method.anneal_steps": 1})
    with pytest.raises(ValueError, match=r"init='zero' and anneal_steps=1, .*neither ever moves"):
        adapt_pretrained(old, tmp_path / "old")
    assert not (tmp_path / "old").exists()


def test_a_run_whose_lambda_stays_near_zero_says_so(base_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "dex"
    args = ["adapt", "--model", str(base_dir), "--method", "dex", "--data", str(corpus_dir), "--seq-len", "32"]
    args += ["--max-steps", "4", "--batch-size", "2", "--lr", "1e-6", "--set", "data.val_sequences=4"]
    args += ["--set", "train.lambda_lr=1e-6"]  # λ's own rate (default 1e-2) as low as the rest
    assert main([*args, "--out", str(out)]) == 0  # lr 1e-6: λ_learn moves ~1e-6 a step
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert max(abs(v) for v in summary["lambda"]) < INACTIVE_LAMBDA
    assert len(summary["warnings"]) == 1
    assert summary["warnings"][0].startswith("Dex contributes nothing: |λ| < 0.001 in every adapted layer")
    assert "warning: Dex contributes nothing" in printed


def test_lambda_warning_names_the_method_and_only_the_annealed_ones():
    assert "DiffV contributes nothing" in _lambda_warnings("diffv", [1e-4, -5e-4])[0]
    assert "DAA contributes nothing" in _lambda_warnings("daa", [0.0, 0.0])[0]
    assert _lambda_warnings("dex", [0.0, -2e-3]) == []  # one active layer is enough
    assert _lambda_warnings("difflora", [0.0]) == [] and _lambda_warnings("lora", None) == []


@pytest.mark.heavy  # ~8 s on 2 cores (five runs, two compiled): CI runs it after the default suite; the default suite's
# check that t is an input of the compiled forward: tests/ops/test_compile_dynamic.py (an adapted model traced whole)
def test_a_compiled_run_follows_the_eager_one_and_compiles_no_more_for_more_steps(base_dir, corpus_dir, tmp_path):
    """``train.compile`` in ``diffattn adapt``: λ(t) changes at every step while annealing (Dex Eq. 4, T = 4 here), and
    t reaches the compiled forward as a tensor (:class:`diffattn.adapters.base.AdapterState`), so a run of four steps
    compiles the frames a run of two does — as a Python number it compiled the model again at every step. The losses
    follow the eager run's within float32 rounding (the eager run with two micro-batches is the yardstick)."""

    def config(steps, **sets):
        sets = {"method.anneal_steps": 4, "train.log_every": 1, **sets}
        return adapt_config(base_dir, corpus_dir, "dex", steps=steps, **sets)

    compiled = {"train.compile": "default", "train.compile_backend": "aot_eager"}
    adapt_pretrained(config(4), tmp_path / "eager")
    adapt_pretrained(config(4, **{"train.grad_accum": 2}), tmp_path / "accum")
    short = frames_compiled(adapt_pretrained, config(2, **compiled), tmp_path / "short")
    longer = frames_compiled(adapt_pretrained, config(4, **compiled), tmp_path / "compiled")
    assert short >= 1 and longer == short
    eager, accum = losses(tmp_path / "eager"), losses(tmp_path / "accum")
    assert sorted(eager) == [1, 2, 3, 4]
    assert_follows_eager(losses(tmp_path / "compiled"), eager, accum, "dex, aot_eager")


@pytest.mark.parametrize("method, sets", [("dex", {"method.anneal_steps": 4}), ("difflora", {"method.rank": 4})])
def test_a_graphed_run_trains_as_the_eager_one(method, sets, base_dir, corpus_dir, tmp_path, monkeypatch):
    """``diffattn adapt --cuda-graphs``, CUDA's graph calls faked and each capture replayed by running it again
    (:func:`tests.fake_cuda.replaying_captures`): Dex while λ(t) anneals (its step a buffer the graph reads, moved in
    place each step) and DiffLoRA, three eager micro-steps and replays after — the losses and the validation loss
    after bit for bit an eager run's without attention masks (:func:`tests.helpers.rows_without_masks`)."""
    from diffattn.train import adapt as adapt_mod

    from ..fake_cuda import graphed_training_on_the_cpu
    from ..helpers import rows_without_masks

    config = adapt_config(base_dir, corpus_dir, method, steps=6, **sets)
    with monkeypatch.context() as m:
        m.setattr(adapt_mod, "PackedDataset", rows_without_masks(adapt_mod.PackedDataset))
        eager = adapt_pretrained(config, tmp_path / "eager")
    made = graphed_training_on_the_cpu(monkeypatch)
    graphed = adapt_pretrained(config.with_overrides({"train.cuda_graphs": True}), tmp_path / "graphed")
    (micro,) = made
    # six micro-steps: three warm-up calls, then replays, the batch with the data's last, padded row too (padded at
    # its end: its mask left out, as every batch's)
    assert micro.calls == 6 and micro.replays == 3 and micro.eager_calls == 0
    assert losses(tmp_path / "graphed") == losses(tmp_path / "eager")
    assert graphed["val_loss_after"] == eager["val_loss_after"]


def test_the_adapter_trainers_optimizer_is_parameter_groups(tmp_path):
    """diffattn.parameter_groups (a loop of one's own) and the AdapterTrainer of diffattn adapt give every
    parameter the same learning rate and weight decay: two spellings of one rule, checked against each other."""
    from transformers import TrainingArguments

    from diffattn import DexConfig, adapt, differential_parameter_names, no_decay_parameter_names, parameter_groups
    from diffattn.adapters import trainable_parameters
    from diffattn.train.adapt_trainer import AdapterTrainer

    from ..tiny_models import tiny

    model = adapt(tiny("gpt2"), DexConfig(heads="all", anneal_steps=4))
    trainable_parameters(model)
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-4, weight_decay=0.1, report_to=[])
    trainer = AdapterTrainer(model=model, args=args, run_dir=tmp_path, keep_checkpoints=1,
                             extra_no_decay=no_decay_parameter_names(model),
                             differential=differential_parameter_names(model), lambda_lr=1e-2)  # fmt: skip
    settings = lambda groups: {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}  # noqa: E731
    ours = settings(parameter_groups(model, lr=1e-4, lambda_lr=1e-2, weight_decay=0.1))
    assert settings(trainer.create_optimizer().param_groups) == ours
    assert {(1e-2, 0.0), (1e-4, 0.0), (1e-4, 0.1)} == set(ours.values())
