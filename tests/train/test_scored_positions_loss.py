"""The scored-positions training loss (diffattn.train.trainer.scored_positions_loss): the model's own loss, token or
row average, with the vocabulary projection computed only where a label scores; and when a training batch takes it."""

from __future__ import annotations

import pytest
import torch

from diffattn.models.build import build_model
from diffattn.train import trainer as trainer_module
from diffattn.train.trainer import _row_average, scored_positions_loss
from tests.helpers import debug_config, losses
from tests.ops.rounding import assert_within_rounding

pytestmark = pytest.mark.usefixtures("tokenizer_cache")  # the end-to-end test trains tokenizers

ARCHITECTURES = ("standard", "diff", "diff-v2")


def _batch(vocab: int, rows: int = 4, length: int = 24, seed: int = 0) -> dict:
    """Random rows scoring about a tenth of their positions (MQAR-like), one row scoring none."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (rows, length), generator=g)
    labels = torch.full_like(input_ids, -100)
    scored = torch.rand(rows, length, generator=g) < 0.12
    scored[:, 0] = False
    scored[-1] = False
    scored[0, 5] = True
    labels[scored] = input_ids[scored]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": torch.ones_like(input_ids)}


def _own_loss(model, batch: dict, loss_average: str, num_items_in_batch=None) -> torch.Tensor:
    """What training computed before: the model's own forward on every position."""
    if loss_average == "row":
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        target = batch["labels"][:, 1:]
        per_token = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().transpose(1, 2), target, ignore_index=-100, reduction="none"
        )
        return _row_average(per_token, target != -100)
    extra = {} if num_items_in_batch is None else {"num_items_in_batch": num_items_in_batch}
    return model(**batch, **extra).loss


def _loss_and_grads(model, fn) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = fn()
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("attention", ARCHITECTURES)
@pytest.mark.parametrize(("loss_average", "num_items"), [("token", None), ("token", 7), ("row", None)])
def test_the_scored_positions_loss_is_the_models_own_within_rounding(attention, loss_average, num_items):
    model = build_model("debug", attention, seed=0).train()
    batch = _batch(model.config.vocab_size)
    gold_model = build_model("debug", attention, seed=0, dtype=torch.float64).train()
    gold, gold_grads = _loss_and_grads(gold_model, lambda: _own_loss(gold_model, batch, loss_average, num_items))
    plain, plain_grads = _loss_and_grads(model, lambda: _own_loss(model, batch, loss_average, num_items))
    got, got_grads = _loss_and_grads(model, lambda: scored_positions_loss(model, batch, loss_average, num_items))
    assert_within_rounding("loss", got, gold, [plain], torch.float32)
    assert len(got_grads) == len(gold_grads)
    for i, (g, gg, pg) in enumerate(zip(got_grads, gold_grads, plain_grads, strict=True)):
        assert_within_rounding(f"grad {i}", g, gg, [pg], torch.float32)


def test_a_sparse_batch_takes_it_and_a_text_batch_does_not(corpus_file, tmp_path, monkeypatch):
    """A run with answer-only needle rows calls it for its sparse batches (and trains to the same losses as with
    it switched off, within float noise over two steps); a text-only run never calls it."""
    calls = []
    real = trainer_module.scored_positions_loss
    monkeypatch.setattr(trainer_module, "scored_positions_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    sparse = debug_config(corpus_file, max_steps=2).with_overrides(
        {"data.retrieval_fraction": 0.95, "data.mqar_fraction": 1.0, "train.eval_every": 2, "train.save_every": 2}
    )
    trainer_module.pretrain(sparse, tmp_path / "on")
    assert calls
    monkeypatch.setattr(trainer_module, "SCORED_POSITIONS_SHARE", -1.0)  # every batch takes the model's own loss
    calls.clear()
    trainer_module.pretrain(sparse, tmp_path / "off")
    assert not calls
    on, off = losses(tmp_path / "on"), losses(tmp_path / "off")
    for step in on:
        assert on[step] == pytest.approx(off[step], rel=1e-4), step
    monkeypatch.setattr(trainer_module, "SCORED_POSITIONS_SHARE", 0.5)
    trainer_module.pretrain(debug_config(corpus_file, max_steps=2), tmp_path / "text")
    assert not calls
