"""Shared fixtures of the evaluation tests: a small BPE tokenizer and three `debug` models —
a baseline, a DIFF model and a Dex-adapted baseline — with the tokenizer's vocabulary (random weights)."""

from __future__ import annotations

import random

import pytest

from diffattn import DexConfig, adapt, build_model, set_adapter_step
from diffattn.data import load_corpus, train_tokenizer

WORDS = ["the", "king", "queen", "sword", "crown", "night", "day", "river", "stone", "ghost", "crow", "bell"]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-corpus")
    rng = random.Random(0)
    for i in range(24):
        lines = [" ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(10)]
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
    return {"baseline": baseline, "diff": diff, "dex": dex.eval()}
