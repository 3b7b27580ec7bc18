"""Per-method paper recipes: the values each paper states, chosen by model type, refused when a
fixed warm-up exceeds the run, and written into run.yaml by ``diffattn adapt --recipe paper`` under explicit flags."""

from __future__ import annotations

import pytest
import yaml

from diffattn.cli import main
from diffattn.models.pretrained import model_type_of
from diffattn.train.recipes import PAPER_RECIPES, paper_recipe


@pytest.mark.parametrize(
    "method, model_type, want",
    [
        ("dex", "llama", {"lr": 1e-4, "schedule": "cosine", "min_lr_ratio": 0.0, "warmup_steps": 30}),
        ("attn-ft", "qwen2", {"lr": 1e-4, "schedule": "cosine", "warmup_steps": 30}),
        ("full-ft", "llama", {"lr": 1e-5, "schedule": "cosine", "warmup_steps": 30}),
        ("daa", "gpt2", {"lr": 3e-5, "schedule": "cosine", "warmup_steps": 500, "weight_decay": 0.01}),
        ("diffq", "llama", {"lr": 1e-4, "schedule": "cosine", "warmup_steps": 500, "grad_clip": 1.0}),
        ("difflora", "llama", {"lr": 1e-4}),
        ("lora", "gemma3_text", {"lr": 1e-4}),
    ],
)
def test_paper_recipe_values(method, model_type, want):
    values, source = paper_recipe(method, model_type, max_steps=1000)
    assert {k.split(".", 1)[1]: v for k, v in values.items() if k.split(".", 1)[1] in want} == want
    assert source  # every recipe names where it comes from
    if method in ("difflora", "lora"):  # what the paper does not state stays ours
        assert set(values) == {"train.lr"}


def test_every_stated_recipe_covers_any_model_type_and_a_long_warmup_is_refused():
    # a paper recipe is optional (MethodSpec.paper_recipes; a toy method states none): each one stated names its
    # source and has a recipe for any other model type ("*"), which paper_recipe falls back on
    assert PAPER_RECIPES
    for method, by_type in PAPER_RECIPES.items():
        assert "*" in by_type and all(r.source for r in by_type.values()), method
        assert paper_recipe(method, "no-such-type", max_steps=1000)[1] == by_type["*"].source
    with pytest.raises(ValueError, match=r"warms up for 500 steps.*--max-steps > 500"):
        paper_recipe("daa", "llama", max_steps=40)
    values, _ = paper_recipe("daa", "llama", max_steps=40, given={"train.warmup_steps"})  # the user's warm-up wins
    assert "train.warmup_steps" not in values and values["train.lr"] == 1e-4
    assert model_type_of("smollm2-135m") == "llama" and model_type_of("/no/such") is None


def test_adapt_recipe_paper_writes_the_values_and_flags_win(base_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "dex"
    common = ["--model", str(base_dir), "--data", str(corpus_dir), "--seq-len", "32", "--batch-size", "2"]
    code = main(["adapt", "--out", str(out), "--method", "dex", "--max-steps", "2", "--recipe", "paper", *common,
                 "--lr", "5e-4", "--set", "method.heads=all"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "paper recipe of dex (Dex" in capsys.readouterr().out
    train = yaml.safe_load((out / "run.yaml").read_text())["train"]
    assert train["schedule"] == "cosine" and train["min_lr_ratio"] == 0.0 and train["warmup_steps"] == 0
    assert train["lr"] == 5e-4  # the explicit flag over the recipe's 1e-4
