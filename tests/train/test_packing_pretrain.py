"""``diffattn pretrain --packing`` (``data.packing: true``): documents kept apart and flattened per batch by
transformers' ``DataCollatorWithFlattening`` (diffattn.data.packing) — no padding reaches the model, position ids
restart at every document, the label of each document's first token is -100, no attention crosses a document
(the training loss of a batch equals its documents' losses computed separately), and the choice is recorded in
run.yaml and summary.json. Without the flag the run packs as before (concatenate-and-chunk)."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from diffattn.cli import main
from diffattn.data.packing import IGNORE_INDEX, FlatteningCollator, pack_separate_documents
from diffattn.train.data import PackedDataset, prepare_data

from ..helpers import debug_config
from ..ops.rounding import assert_within_rounding

pytestmark = pytest.mark.usefixtures("tokenizer_cache")


@pytest.fixture(scope="module")
def short_documents(corpus_file, tmp_path_factory):
    """The test corpus re-cut into ~400 documents of 20–150 characters, so rows hold several documents."""
    text = " ".join(json.loads(line)["text"] for line in corpus_file.read_text().splitlines())
    rng, docs, at = random.Random(0), [], 0
    while at < len(text) and len(docs) < 400:
        n = rng.randint(20, 150)
        docs.append(text[at : at + n])
        at += n
    path = tmp_path_factory.mktemp("short-docs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def test_separate_documents_fill_rows_and_restart_positions():
    packed = pack_separate_documents([[5, 6, 7], [8] * 9, [9, 9]], 8, sep_id=1, pad_id=0)
    # pieces (a document and its separator, cut at 8 tokens): [5 6 7 1], [8 × 8], [8 1], [9 9 1]
    real = packed.attention_mask.bool()
    rows = [ids[mask].tolist() for ids, mask in zip(packed.input_ids, real, strict=True)]
    positions = [p[mask].tolist() for p, mask in zip(packed.position_ids, real, strict=True)]
    assert rows == [[5, 6, 7, 1], [8] * 8, [8, 1, 9, 9, 1]]
    assert positions == [[0, 1, 2, 3], list(range(8)), [0, 1, 0, 1, 2]]
    assert packed.num_tokens == 17 and (packed.labels[~real] == IGNORE_INDEX).all()


def test_the_collator_flattens_without_padding_and_restarts_positions(short_documents):
    data = prepare_data(debug_config(short_documents).with_overrides({"data.packing": True}))
    rows = [PackedDataset(data.train)[i] for i in range(4)]
    batch = FlatteningCollator()(rows)
    real = torch.cat([r["input_ids"][r["attention_mask"].bool()] for r in rows])
    assert batch["input_ids"].shape == (1, real.numel()) and torch.equal(batch["input_ids"][0], real)
    starts = batch["position_ids"][0] == 0
    assert starts.sum() > len(rows)  # several documents per row
    assert (batch["labels"][0][starts] == IGNORE_INDEX).all() and (batch["labels"][0][~starts] != IGNORE_INDEX).all()
    assert set(batch) == {"input_ids", "labels", "position_ids"}  # no attention mask: nothing is padded


def test_pretrain_with_packing_runs_records_it_and_attends_within_documents(short_documents, tmp_path):
    config = debug_config(short_documents, max_steps=2, save_every=2, eval_every=2)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config.to_dict()))
    run = tmp_path / "run"
    assert main(["pretrain", "--config", str(tmp_path / "run.yaml"), "--out", str(run), "--packing"]) == 0
    assert yaml.safe_load((run / "run.yaml").read_text())["data"]["packing"] is True
    assert json.loads((run / "summary.json").read_text())["data"]["packing"] is True

    model = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    data = prepare_data(config.with_overrides({"data.packing": True}))
    batch = FlatteningCollator()([PackedDataset(data.train)[i] for i in range(4)])
    model.config.use_cache = False  # as the Trainer trains (TrainingArguments.use_cache)

    def separately(m):
        starts = [*(batch["position_ids"][0] == 0).nonzero().flatten().tolist(), batch["input_ids"].shape[1]]
        total, count = 0.0, 0
        for a, b in itertools.pairwise(starts):
            ids = batch["input_ids"][:, a:b]
            if b - a > 1:
                total += m(ids, labels=ids).loss.double() * (b - a - 1)
                count += b - a - 1
        return total / count

    with torch.no_grad():
        packed = model(**batch).loss
        gold = separately(model.double())
        model.float()
        plain = separately(model)
    assert_within_rounding("packed loss", packed, gold, [plain], torch.float32)
    with torch.no_grad():  # the same tokens as one document give another loss: the comparison can fail
        assert abs(model(batch["input_ids"], labels=batch["labels"]).loss - packed) > 1e-3


def test_the_default_run_still_concatenates_and_chunks(short_documents):
    data = prepare_data(debug_config(short_documents))
    assert data.train.position_ids is None and data.info["packing"] is False
    assert int(data.train.attention_mask[:-1].sum()) == data.train.attention_mask[:-1].numel()  # full rows
