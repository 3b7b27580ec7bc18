"""Constrained decoding over a shared demonstration prefix (the KV cache computed once per demonstration set and
rolled back per test item), the context length and the model's identity."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from ..common import (
    cache_keyword,
    forward_parameters,
    model_device,
    model_max_length,
    trained_length,
)
from ..icl_data import Pair
from .prompts import LabelTrie, PromptTokens


def _context_length(model, max_length: int | None) -> tuple[int, str]:
    """The prompt length the suite fills (the order-robustness set fills it) and where it comes from: ``max_length``,
    else the length the model was trained at where its run recorded it (as every other suite's window:
    :func:`~diffattn.eval.common.evaluation_window`; a model trained on 128 tokens measured at its 1,024 positions
    measures its length extrapolation as much as its in-context learning), else its maximum context."""
    return context_length(max_length, trained_length(model), model_max_length(model))


def context_length(max_length: int | None, trained: int | None, limit: int) -> tuple[int, str]:
    """:func:`_context_length`'s rule on numbers (the suite's preflight reads it before the model runs)."""
    if max_length is None:
        if trained is not None and trained < limit:
            return trained, "the length the model was trained at"
        return limit, "the model's maximum context"
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    if max_length > limit:
        raise ValueError(f"max_length {max_length} exceeds the model's maximum context of {limit} positions")
    return max_length, "max_length argument"


class _Runner:
    """Forwards on a KV cache: a shared demo prefix, then each test item and its trie steps."""

    def __init__(self, model, share_prefix: bool = True):
        self.model = model
        self.device = model_device(model)
        self.kwargs = {"logits_to_keep": 1} if "logits_to_keep" in forward_parameters(model) else {}
        self.cache_keyword = cache_keyword(model)
        self.share_prefix = share_prefix

    def forward(self, ids: Sequence[int], cache):
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, use_cache=True, **{self.cache_keyword: cache}, **self.kwargs)
        return out.logits[0, -1].float(), out.past_key_values

    def predict(self, trie: LabelTrie, prefix: list[int], queries: list[list[int]], bar=None) -> list[str]:
        preds: list[str] = []
        if not self.share_prefix:
            for query in queries:
                preds.append(self._one(trie, None, prefix + query))
                if bar is not None:
                    bar.update(1)
            return preds
        _, cache = self.forward(prefix, None)
        n = len(prefix)
        # sliding-window layers drop old states, so their rollback needs a copy (their crop refuses)
        sliding = getattr(cache, "is_sliding", False)
        sliding = any(sliding) if isinstance(sliding, (list, tuple)) else bool(sliding)
        croppable = bool(getattr(cache, "is_croppable", False)) and hasattr(cache, "crop") and not sliding
        snapshot = None if croppable else copy.deepcopy(cache)
        for query in queries:
            work = cache if croppable else copy.deepcopy(snapshot)
            preds.append(self._one(trie, work, query))
            if croppable:
                extra = cache.get_seq_length() - n
                if extra:
                    cache.crop(-extra)
            if bar is not None:
                bar.update(1)
        return preds

    def _one(self, trie: LabelTrie, cache, ids: list[int]) -> str:
        logits, cache = self.forward(ids, cache)
        state = {"cache": cache}

        def step(token: int) -> torch.Tensor:
            logits, state["cache"] = self.forward([token], state["cache"])
            return logits

        return trie.decode(logits, step)


class _LazyDemos:
    """The pool's demonstrations, tokenised on first use (a large pool is never tokenised whole)."""

    SAMPLE = 5000  # pool demos whose lengths estimate mean and std for the max-shots rule

    def __init__(self, tokens: PromptTokens, pool: Sequence[Pair]):
        self.tokens, self.pool = tokens, pool
        self.cache: dict[int, list[int]] = {}

    def __getitem__(self, indices: Sequence[int]) -> list[list[int]]:
        missing = sorted({int(i) for i in indices} - self.cache.keys())
        if missing:
            self.cache.update(zip(missing, self.tokens.demos([self.pool[i] for i in missing]), strict=True))
        return [self.cache[int(i)] for i in indices]

    def sample_lengths(self, seed: int) -> list[int]:
        n = len(self.pool)
        if n <= self.SAMPLE:
            indices = list(range(n))
        else:
            indices = [int(i) for i in np.random.default_rng([seed, 4]).choice(n, size=self.SAMPLE, replace=False)]
        return [len(ids) for ids in self[indices]]


def _model_info(model) -> dict:
    config = model.config
    return {
        "class": type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "name_or_path": str(getattr(config, "_name_or_path", "") or ""),
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }
