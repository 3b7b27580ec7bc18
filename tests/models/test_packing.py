"""Sequence packing as transformers does it (``DataCollatorWithFlattening``: documents concatenated into one row,
``position_ids`` restarting at 0 per document, labels -100 at each document's first token): every model computes
the documents of a packed row as if each ran alone — logits, the loss, and every trainable parameter's gradient —
for the baseline, DIFF V1, DIFF V2 (under our op and under transformers' sdpa and eager) and adapted models
(Dex, DAA, DiffLoRA). transformers turns restarting position ids into a block-causal mask when no KV cache is in
use (``masking_utils.find_packed_sequence_indices``; the Trainer runs with ``use_cache=False``), and under
``attn_implementation="diffattn"`` our modules read the same boundaries as segment ids (docs/methods.md §0.2).

Tolerance (the rule of tests/ops/test_triton.py, :func:`assert_within_rounding`): the packed float32 result's
error against the float64 model run on each document separately is at most twice that of the float32 model run
on each document separately (under each implementation it has, the largest error) plus one float32 ulp of the
largest value."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DataCollatorWithFlattening

from diffattn import build_model
from diffattn.adapters import DAAConfig, DexConfig, DiffLoRAConfig, adapt, set_adapter_step
from diffattn.adapters import base as adapter_base
from diffattn.models import diff_llama, diff_v2
from diffattn.models.attention_interface import FUSED

from ..ops.rounding import assert_within_rounding
from ..tiny_models import VOCAB, tiny

DOC_LENGTHS = (5, 9, 4)  # three documents of one packed row, none a multiple of another


def _documents() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in DOC_LENGTHS]


def _adapted(config):
    model = adapt(tiny("llama"), config)
    set_adapter_step(model, 5)  # mid-annealing: λ(t) > 0, the second map in play
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # away from the identity initialisation, so the method changes the attention
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


MODELS = {
    "baseline": lambda: build_model("debug", "standard", seed=0),
    "diff-v1": lambda: build_model("debug", "diff", seed=0),
    "diff-v2": lambda: build_model("debug", "diff-v2", seed=0),
    "dex": lambda: _adapted(DexConfig(heads="all", init="identity", anneal_steps=10)),
    "daa": lambda: _adapted(DAAConfig(anneal_steps=10)),
    "difflora": lambda: _adapted(DiffLoRAConfig(rank=4, lambda_init=0.1)),
}
# (model, attn_implementation): the baseline is ordinary attention, which our fused op does not compute
CASES = [
    ("baseline", "sdpa"),
    ("baseline", "eager"),
    ("diff-v1", FUSED),
    ("diff-v1", "sdpa"),
    ("diff-v2", FUSED),
    ("diff-v2", "sdpa"),
    ("diff-v2", "eager"),
    ("dex", FUSED),
    ("daa", FUSED),
    ("daa", "sdpa"),
    ("difflora", FUSED),
]


def _with(model, implementation: str, dtype: torch.dtype):
    model = copy.deepcopy(model).to(dtype).eval()
    model.set_attn_implementation(implementation)
    return model


def _trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _separately(model, documents) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each document alone: (logits of all documents in row order, the token-weighted mean loss, the gradient of
    every trainable parameter of that loss, flattened)."""
    model.zero_grad()
    logits, total, count = [], 0.0, 0
    for doc in documents:
        ids = torch.tensor([doc])
        out = model(ids, labels=ids, use_cache=False)
        logits.append(out.logits.detach())
        total = total + out.loss * (len(doc) - 1)  # the loss is the mean over the document's next-token targets
        count += len(doc) - 1
    loss = total / count
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in _trainable(model)])
    return torch.cat(logits, dim=1), loss.detach(), grads


def _packed(model, documents) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The documents in one row by transformers' own collator, in one forward (as the Trainer runs it)."""
    batch = DataCollatorWithFlattening()([{"input_ids": doc} for doc in documents])
    model.zero_grad()
    out = model(**batch, use_cache=False)
    out.loss.backward()
    grads = torch.cat([p.grad.flatten() for p in _trainable(model)])
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize(("name", "implementation"), CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_a_packed_row_equals_its_documents_run_separately(name, implementation):
    documents = _documents()
    model = MODELS[name]()
    gold = _separately(_with(model, implementation, torch.float64), documents)
    got = _packed(_with(model, implementation, torch.float32), documents)
    yardsticks = [_separately(_with(model, impl, torch.float32), documents) for impl in {implementation, "eager"}]
    for i, part in enumerate(("logits", "loss", "gradients")):
        assert_within_rounding(f"{name} {part}", got[i], gold[i], [y[i] for y in yardsticks], torch.float32)


def test_the_packed_row_attends_across_documents_without_its_position_ids():
    """The test above can fail: the same row without restarting position ids (one long document) gives other
    logits for the second and third documents."""
    documents = _documents()
    model = _with(MODELS["diff-v2"](), FUSED, torch.float32)
    batch = DataCollatorWithFlattening()([{"input_ids": doc} for doc in documents])
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits
        one_document = model(batch["input_ids"], use_cache=False).logits
    first = DOC_LENGTHS[0]
    torch.testing.assert_close(packed[:, :first], one_document[:, :first])
    assert (packed[:, first:] - one_document[:, first:]).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["diff-v1", "diff-v2", "daa", "difflora"])
def test_under_diffattn_the_op_reads_the_documents_as_segment_ids_not_a_mask(name, monkeypatch):
    """Every call of the op in a packed forward gets the documents as segment ids (from the position ids, document
    starts at 0) and no [T, S] mask, so the fused kernel compares ids per tile (docs/methods.md §0.2)."""
    calls = []

    # DIFF's and DIFF V2's layers call the op on Q and K whole (diff_attention_stacked, diff_attention_pairs), the
    # adapters on the two maps
    def recording(real):
        def spy(*args, **kwargs):
            calls.append(kwargs)
            return real(*args, **kwargs)

        return spy

    for module, op in ((diff_llama, "diff_attention_stacked"), (diff_v2, "diff_attention_pairs"),
                       (adapter_base, "diff_attention")):  # fmt: skip
        monkeypatch.setattr(module, op, recording(getattr(module, op)))
    model = _with(MODELS[name](), FUSED, torch.float32)
    with torch.no_grad():
        model(**DataCollatorWithFlattening()([{"input_ids": doc} for doc in _documents()]), use_cache=False)
    documents = [i + 1 for i, n in enumerate(DOC_LENGTHS) for _ in range(n)]
    assert len(calls) == model.config.num_hidden_layers
    for call in calls:
        assert call["attn_mask"] is None and call["causal"] is True
        assert call["segment_ids"].tolist() == [documents]
