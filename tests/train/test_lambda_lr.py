"""``train.lambda_lr``: the differential parameters of the λ(t) methods (λ_learn, and Dex's W_D, DAA's W_DAA,
DiffQ/K/V's W_D) train in an optimiser group of their own at that rate, never decayed, follow the same schedule, and
the rate is recorded in the run; with it λ can leave zero within a short budget."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from transformers import TrainerCallback

from diffattn import adapt
from diffattn.adapters import differential_parameter_names, get_method, trainable_parameters
from diffattn.cli import main
from diffattn.train.adapt import AdaptRunConfig, adapt_pretrained
from diffattn.train.adapt_config import DEFAULT_LAMBDA_LR
from diffattn.train.adapt_trainer import LAMBDA_GROUP

from ..helpers import adapt_config
from ..tiny_models import tiny


class Groups(TrainerCallback):
    """The optimiser's parameter groups (by parameter name) at the start of training and after every step."""

    def __init__(self):
        self.begin, self.steps = None, []

    def _snapshot(self, optimizer, model):
        names = {id(p): n for n, p in model.named_parameters()}
        return [
            {**{k: v for k, v in g.items() if k != "params"}, "names": {names[id(p)] for p in g["params"]}}
            for g in optimizer.param_groups
        ]

    def on_train_begin(self, args, state, control, optimizer=None, model=None, **kwargs):
        self.begin = self._snapshot(optimizer, model)

    def on_step_end(self, args, state, control, optimizer=None, model=None, **kwargs):
        self.steps.append(self._snapshot(optimizer, model))


LEARNED = ("dex_w_d", "dex_lambda.lambda_learn")  # Dex's differential parameters, per layer


def _lambda_group(groups):
    (group,) = [g for g in groups if any(n.endswith("lambda_learn") for n in g["names"])]
    return group


def test_the_lambda_learning_rate_reaches_the_optimiser_and_is_recorded_in_the_run(base_dir, corpus_dir, tmp_path):
    out = tmp_path / "dex"
    seen = Groups()
    sets = {"train.lambda_lr": 0.05, "train.weight_decay": 0.1, "train.warmup_steps": 1}
    summary = adapt_pretrained(adapt_config(base_dir, corpus_dir, "dex", steps=3, **sets), out, callbacks=[seen])
    group = _lambda_group(seen.begin)
    # exactly the differential parameters: every layer's λ_learn and W_D, and nothing else; never decayed
    assert group["group"] == LAMBDA_GROUP and group["weight_decay"] == 0.0
    assert group["names"] == {f"model.layers.{i}.self_attn.method.{p}" for i in (0, 1) for p in LEARNED}
    others = [g for g in seen.begin if g is not group]
    assert all(not (g["names"] & group["names"]) for g in others)
    assert any(g["weight_decay"] == 0.1 for g in others)  # the base weights still decay
    # its rate is lambda_lr; the schedule scales every group alike (step 0 of a 1-step warm-up: 0)
    assert group["initial_lr"] == 0.05 and all(g["initial_lr"] == 1e-2 for g in others)
    for groups in [seen.begin, *seen.steps]:
        lam = _lambda_group(groups)
        for g in groups:
            assert lam["lr"] * g["initial_lr"] == pytest.approx(g["lr"] * lam["initial_lr"], rel=1e-12, abs=1e-15)
    assert seen.steps[0][-1]["lr"] > 0
    # recorded: the option in run.yaml, the rate used in summary.json
    assert yaml.safe_load((out / "run.yaml").read_text())["train"]["lambda_lr"] == 0.05
    saved = json.loads((out / "summary.json").read_text())
    assert summary["lambda_lr"] == saved["lambda_lr"] == 0.05
    assert saved["lambda_lr_parameters"] == 2 * (2 * 16 * 16 + 1)  # per layer: W_D of 2 heads (d = 16) and λ_learn


def test_the_default_lambda_learning_rate_is_recorded_and_methods_without_a_lambda_term_have_none(
    base_dir, corpus_dir, tmp_path
):
    seen = Groups()
    summary = adapt_pretrained(adapt_config(base_dir, corpus_dir, "diffv", steps=2), tmp_path / "v", callbacks=[seen])
    assert summary["lambda_lr"] == DEFAULT_LAMBDA_LR and _lambda_group(seen.begin)["initial_lr"] == DEFAULT_LAMBDA_LR
    assert yaml.safe_load((tmp_path / "v" / "run.yaml").read_text())["train"]["lambda_lr"] is None
    seen = Groups()
    summary = adapt_pretrained(
        adapt_config(base_dir, corpus_dir, "difflora", steps=2, **{"method.rank": 4, "train.lambda_lr": 0.05}),
        tmp_path / "difflora",
        callbacks=[seen],
    )
    assert summary["lambda_lr"] is None and summary["lambda_lr_parameters"] == 0
    assert not any(g.get("group") == LAMBDA_GROUP for g in seen.begin)


def test_lambda_moves_more_with_its_own_learning_rate(base_dir, corpus_dir, tmp_path):
    moved = {}
    for lambda_lr in (1e-4, 1e-2):  # the shared lr, and a rate of its own
        sets = {"train.lr": 1e-4, "train.lambda_lr": lambda_lr, "method.anneal_steps": 1}
        summary = adapt_pretrained(
            adapt_config(base_dir, corpus_dir, "dex", steps=4, **sets), tmp_path / f"{lambda_lr}"
        )
        moved[lambda_lr] = max(abs(v) for v in summary["lambda"])
    assert moved[1e-4] < 1e-3 < 10 * moved[1e-4] < moved[1e-2]


def test_every_lambda_t_method_names_its_differential_parameters_from_its_registry_entry():
    from diffattn import DAAConfig, DexConfig, DiffKConfig, DiffLoRAConfig, DiffQConfig, DiffV2Config, DiffVConfig

    weights = {"dex": "dex_w_d", "daa": "daa_w", "diffq": "diff_w_d", "diffk": "diff_w_d", "diffv": "diffv_w_d"}
    configs = {
        "dex": DexConfig(heads="all", anneal_steps=2),
        "daa": DAAConfig(anneal_steps=2),
        "diffq": DiffQConfig(anneal_steps=2),
        "diffk": DiffKConfig(anneal_steps=2),
        "diffv": DiffVConfig(anneal_steps=2),
        "difflora": DiffLoRAConfig(learn_lambda=True),
        "diff-v2": DiffV2Config(),
    }
    for name, config in configs.items():
        model = adapt(tiny("llama"), config)
        trainable_parameters(model)
        names = differential_parameter_names(model)
        spec = get_method(name)
        if name in weights:
            assert spec.annealed and spec.differential_weights == (weights[name],)
            assert len(names) == 4 and {n.rsplit(".", 1)[1] for n in names} == {weights[name], "lambda_learn"}
        else:  # no λ(t) term: nothing gets the λ learning rate
            assert names == [] and not spec.differential_weights


@pytest.mark.parametrize("value", ["-1e-3", "0", "abc"])
def test_a_bad_lambda_learning_rate_is_one_clear_error(value, corpus_dir, tmp_path, capsys):
    out = tmp_path / "bad"
    args = ["adapt", "--data", str(corpus_dir), "--max-steps", "1", "--out", str(out)]
    assert main([*args, "--method", "daa", "--set", f"train.lambda_lr={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(r"train\.lambda_lr must be a learning rate > 0 \(or null for the default\), got", err), err
    assert len(err.splitlines()) == 1 and not out.exists()
    with pytest.raises(ValueError, match=r"train\.lambda_lr must be a learning rate > 0"):
        AdaptRunConfig().with_overrides({"train.lambda_lr": -0.01}).validate()


def test_lambda_learning_rate_from_the_command_line_and_an_experiment_file():
    assert AdaptRunConfig().with_overrides({"train.lambda_lr": "1e-2"}).validate().train.lambda_lr == 0.01
    config = AdaptRunConfig.from_dict({"train": {"max_steps": 40, "lambda_lr": 0.02}}).validate()
    assert config.train.lambda_lr == 0.02 and config.train.resolved_lambda_lr == 0.02
    assert AdaptRunConfig().train.lambda_lr is None and AdaptRunConfig().train.resolved_lambda_lr == DEFAULT_LAMBDA_LR
