"""Many-shot in-context learning and its robustness to demonstration order (DIFF Transformer §3.5, Fig. 6–7 and
App. F; Dex Table 3; protocol of Bertsch et al. 2024, "In-Context Learning with Long-Context Models";
docs/evaluation.md §7).

**Prompt** (docs/evaluation.md §7.2): every demonstration is ``"{x_prefix}{text}\\n{y_prefix}{label}"``, the
demonstrations are joined by ``"\\n==\\n"``, then the test item follows with an empty label:
``demo_1 + "\\n==\\n" + … + demo_k + "\\n==\\n" + "{x_prefix}{text}\\n{y_prefix}"``. Defaults:
``x_prefix="Input: "``, ``y_prefix="Label: "`` (:class:`PromptFormat`).

**Constrained decoding** (Ratner et al. 2023, as used by Bertsch et al. and DIFF): the model may only emit one of
the data set's label strings. The labels are tokenised in the form they take in the prompt (see *tokenisation*
below) and put in a token trie (:class:`LabelTrie`). Decoding is greedy over the allowed next tokens only (the
argmax of the logits restricted to the current node's children) and stops at the shortest unique prefix: once
only one label remains below the node, that label is the prediction. A label whose tokens are a strict prefix of
another's (``"cat"`` vs ``"cats"`` when ``" cats"`` is ``" cat" + "s"``) ends with the first token of the
separator (the token that follows every label in the demonstrations), which competes with the longer labels'
next tokens. Each trie step is **one forward of one token on the KV cache** of the prompt; moreover the cache of
the demonstrations (everything before the test item) is computed once per demonstration set and shared by all
test items (rolled back with ``Cache.crop``, or copied where a cache cannot be cropped, e.g. sliding-window
layers) — numerically the same as one full forward per test item (``share_prefix=False`` does that instead).
Accuracy is the exact-match rate of the decoded label, in [0, 1] (the papers print percentages).

**Tokenisation.** The prompt is tokenised piece by piece (the tokenizer's own BOS, if it adds one; each
demonstration; each separator; the test item), so every demonstration's label has exactly the tokens the
decoder may emit. The label tokens are ``tokens(y_prefix + label)`` minus the longest prefix of
``tokens(y_prefix)`` they all share: with BPE the trailing space of ``"Label: "`` merges into the label's first
token (``" noun"``), so the test item's prompt ends at ``"Label:"`` and the space is part of the label — the
usual treatment of a target delimiter. Tokenizers that add a prefix space to every encoded string
(SentencePiece "dummy prefix") are handled by encoding each piece after a newline and dropping the newline's
tokens. Whether the decoded prompt reproduces the prompt string exactly is checked and recorded
(``metadata["tokenization_round_trip"]``).

**Many-shot accuracy** (:func:`run_icl`). A fixed test set (``test_size`` items, a seeded sample) and a demo pool
(the rest, disjoint). Shot counts default to 1, 2, 4, … up to the most that fit the context
(``max_position_embeddings``, or ``max_length``), plus that maximum. The maximum is computed from the tokenised
lengths: the largest k with ``BOS + k·(mean demo + separator) + 3·sqrt(k)·std(demo) + longest test item +
longest label ≤ context``, capped at the pool size (mean and std over the pool, or over a seeded sample of 5,000
demos of a larger pool, which is tokenised lazily); a draw that still overflows is redrawn (seeded; counted in
``metadata["redraws"]``). For every shot count, ``draws`` (default 10) demo sets are drawn uniformly without
replacement from the pool, seeded by ``(seed, shots, draw)``; the mean and the population std (ddof 0) over draws
are reported. The label set of the decoder is every label of the data set, whether or not a draw shows it.

**Order robustness** (:func:`run_order_robustness`, DIFF Fig. 7). One demo set is fixed: ``rounds`` examples per
class (a seeded sample per class; by default as many rounds as fit the context), and it is permuted with
``permutations`` (default 10) seeds in two arrangements: ``"random"`` (a uniform permutation) and ``"by_class"``
("alternately arranged by class": ``rounds`` rounds, each containing every class once, in one seeded class order
repeated in every round — the strictly alternating reading of the paper; which example of a class goes into
which round is seeded too). The margin is best − worst accuracy over the permutations (:func:`order_margin`;
paper TREC margins in points: Transformer 19.0 vs DIFF 4.0 random, 56.7 vs 13.4 by class).

Choices the papers left open, all recorded in each result's ``"metadata"``: the prefixes, the test-set size
(default 100; Dex Table 3's granularity suggests ~45), the shot grid, the context-fitting rule, the trie end
token, the prefix-cache sharing, the class order of the by-class arrangement, the std convention. The data sets
(:mod:`.icl_data`) replace TREC/Banking-77/Clinic-150, which live on a hub this project may not use.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from .common import (
    Suite,
    cache_keyword,
    figure,
    forward_parameters,
    group_colors,
    int_list,
    model_device,
    model_max_length,
    option,
    save_figure,
)
from .icl_data import DATASETS, Pair, load_icl_dataset, validate_pairs
from .measures import ONE_NUMBER, Comparison, Measure, PaperClaim, Run, paired_kind
from .stats import paired_difference, t_interval, unpaired_difference

ARRANGEMENTS = ("random", "by_class")


# ----------------------------------------------------------------------------------------------------------------
# prompt strings


@dataclass(frozen=True)
class PromptFormat:
    """The demonstration template ``"{x_prefix}{text}\\n{y_prefix}{label}"`` and the separator between demos."""

    x_prefix: str = "Input: "
    y_prefix: str = "Label: "
    separator: str = "\n==\n"

    def __post_init__(self):
        for name in ("x_prefix", "y_prefix", "separator"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"PromptFormat.{name} must be a string")
        if not self.separator:
            raise ValueError("PromptFormat.separator must not be empty: it ends every label in the prompt")

    def demo(self, text: str, label: str) -> str:
        return f"{self.x_prefix}{text}\n{self.y_prefix}{label}"

    def query(self, text: str) -> str:
        return self.demo(text, "")


def build_prompt(demos: Sequence[Pair], text: str, fmt: PromptFormat | None = None) -> str:
    """The prompt string: the demos joined by the separator, then the test item with an empty label."""
    fmt = fmt or PromptFormat()
    return fmt.separator.join([fmt.demo(t, y) for t, y in demos] + [fmt.query(text)])


# ----------------------------------------------------------------------------------------------------------------
# the label trie and constrained greedy decoding


class _Node:
    __slots__ = ("children", "labels", "terminal")

    def __init__(self):
        self.children: dict[int, _Node] = {}
        self.labels: set[str] = set()
        self.terminal: str | None = None


class LabelTrie:
    """A token trie over the labels' token sequences, for constrained greedy decoding.

    Args:
        sequences: label → its non-empty token ids (as they follow the prompt).
        end_token: the token that follows a label in the prompt (the separator's first token); needed only when
            one label's tokens are a strict prefix of another's, where it stands for "the label ends here".
    """

    def __init__(self, sequences: Mapping[str, Sequence[int]], end_token: int | None = None):
        if len(sequences) < 2:
            raise ValueError(f"constrained decoding needs at least 2 labels, got {list(sequences)}")
        self.root = _Node()
        self.end_token = end_token
        self.sequences = {label: [int(t) for t in seq] for label, seq in sequences.items()}
        for label, seq in self.sequences.items():
            if not seq:
                raise ValueError(f"label {label!r} has no tokens")
            node = self.root
            node.labels.add(label)
            for token in seq:
                node = node.children.setdefault(token, _Node())
                node.labels.add(label)
            if node.terminal is not None:
                raise ValueError(f"labels {node.terminal!r} and {label!r} have the same tokens {seq}")
            node.terminal = label
        self._check(self.root)

    def _check(self, node: _Node) -> None:
        if node.terminal is not None and node.children:
            if self.end_token is None:
                longer = sorted(node.labels - {node.terminal})
                raise ValueError(
                    f"label {node.terminal!r} is a token prefix of {longer}: an end_token is needed to tell them apart"
                )
            if self.end_token in node.children:
                raise ValueError(f"end_token {self.end_token} is also a label token after {node.terminal!r}")
        for child in node.children.values():
            self._check(child)

    @property
    def max_depth(self) -> int:
        return max(len(s) for s in self.sequences.values()) + 1

    def allowed(self, node: _Node) -> list[int]:
        """The tokens the decoder may emit at ``node`` (sorted; the end token where a label ends inside)."""
        tokens = sorted(node.children)
        if node.terminal is not None and node.children:
            tokens.append(int(self.end_token))
        return tokens

    def decode(self, logits: torch.Tensor, step: Callable[[int], torch.Tensor]) -> str:
        """Greedy constrained decoding from the prompt's next-token ``logits`` ([vocab]).

        ``step(token)`` feeds one token and returns the next logits; it is called once per trie level that still
        leaves a choice (never for a token after which only one label remains). Returns the label.
        """
        node = self.root
        while len(node.labels) > 1:
            allowed = self.allowed(node)
            scores = logits.float().reshape(-1)[torch.tensor(allowed, device=logits.device)]
            token = allowed[int(torch.argmax(scores))]  # ties: the smallest token id
            if token not in node.children:  # the end token: the label ending here
                return node.terminal  # type: ignore[return-value]
            node = node.children[token]
            if len(node.labels) > 1:
                logits = step(token)
        return next(iter(node.labels))


# ----------------------------------------------------------------------------------------------------------------
# tokenisation of prompts in pieces


def _ids(tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


class PromptTokens:
    """Tokenises demonstrations, separators and test items so that labels have exactly the decoder's tokens."""

    def __init__(self, tokenizer, fmt: PromptFormat, labels: Sequence[str]):
        self.tokenizer, self.fmt = tokenizer, fmt
        self.labels = sorted(set(labels))
        with_special = list(tokenizer("a")["input_ids"])
        without = list(tokenizer("a", add_special_tokens=False)["input_ids"])
        n = len(without)
        starts = [i for i in range(len(with_special) - n + 1) if with_special[i : i + n] == without]
        self.bos = with_special[: starts[0]] if starts else []
        # Tokenizers that prepend a space to every encoded string (SentencePiece's dummy prefix) would put a space
        # at every piece boundary: then each piece is encoded after a newline whose tokens are dropped.
        probe = ["ab", "a", "b"]
        ab, a, b = _ids(tokenizer, probe)
        self.anchor: list[int] | None = None
        if _decode(tokenizer, a + b) != "ab" and _decode(tokenizer, ab) == "ab":
            self.anchor = _ids(tokenizer, ["\n"])[0]
        y_alone = self.encode([fmt.y_prefix])[0]
        y_full = dict(zip(self.labels, self.encode([fmt.y_prefix + label for label in self.labels]), strict=True))
        head = len(y_alone)
        for seq in y_full.values():
            common = 0
            while common < min(head, len(seq)) and seq[common] == y_alone[common]:
                common += 1
            head = common
        self.head = y_alone[:head]
        self.label_ids = {label: seq[head:] for label, seq in y_full.items()}
        empty = [label for label, seq in self.label_ids.items() if not seq]
        if empty:
            raise ValueError(f"labels {empty} tokenise to nothing after y_prefix {fmt.y_prefix!r}")
        self.sep = self.encode([fmt.separator])[0]
        if not self.sep:
            raise ValueError(f"the separator {fmt.separator!r} tokenises to nothing")
        self.trie = LabelTrie(self.label_ids, end_token=self.sep[0])

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self.anchor is None:
            return _ids(self.tokenizer, texts)
        out = []
        for text, ids in zip(texts, _ids(self.tokenizer, ["\n" + t for t in texts]), strict=True):
            k = len(self.anchor)
            out.append(ids[k:] if ids[:k] == self.anchor else _ids(self.tokenizer, [text])[0])
        return out

    def queries(self, texts: Sequence[str]) -> list[list[int]]:
        """Test items: ``x_prefix + text + "\\n"`` then the y_prefix tokens shared by all labels."""
        return [ids + self.head for ids in self.encode([f"{self.fmt.x_prefix}{t}\n" for t in texts])]

    def demos(self, pairs: Sequence[Pair]) -> list[list[int]]:
        queries = self.queries([t for t, _ in pairs])
        return [q + self.label_ids[y] for q, (_, y) in zip(queries, pairs, strict=True)]

    def prefix(self, demo_ids: Sequence[Sequence[int]]) -> list[int]:
        """BOS + demo_1 + sep + … + demo_k + sep: everything before the test item."""
        out = list(self.bos)
        for ids in demo_ids:
            out += list(ids) + self.sep
        return out

    def round_trip(self, demos: Sequence[Pair], text: str, label: str) -> bool:
        """Whether the pieces decode to exactly ``build_prompt(demos, text) + label``."""
        ids = self.prefix(self.demos(demos))[len(self.bos) :] + self.queries([text])[0] + self.label_ids[label]
        return _decode(self.tokenizer, ids) == build_prompt(demos, text, self.fmt) + label


# ----------------------------------------------------------------------------------------------------------------
# running the model


def _context_length(model, max_length: int | None) -> tuple[int, str]:
    limit = model_max_length(model)
    if max_length is None:
        return limit, "config.max_position_embeddings"
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


def _dataset_pairs(dataset, dataset_options: Mapping | None, seed: int) -> tuple[list[Pair], str]:
    options = dict(dataset_options or {})
    options.setdefault("seed", seed)
    name = dataset if isinstance(dataset, str) else "custom"
    pairs = load_icl_dataset(dataset, **options)
    return validate_pairs(pairs, what=name), name


def _split(pairs: list[Pair], test_size: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    if not isinstance(test_size, int) or test_size < 1:
        raise ValueError(f"test_size must be a positive integer, got {test_size!r}")
    if len(pairs) <= test_size:
        raise ValueError(f"the data set has {len(pairs)} examples: too few for {test_size} test items and a demo pool")
    order = np.random.default_rng([seed, 0]).permutation(len(pairs))
    return [pairs[i] for i in order[:test_size]], [pairs[i] for i in order[test_size:]]


def max_shots(demo_lengths: Sequence[int], budget: int, sep_len: int, pool_size: int | None = None) -> int:
    """The most demos that fit ``budget`` tokens: largest k with k·(mean + sep) + 3·sqrt(k)·std ≤ budget.

    ``demo_lengths`` may be a sample of the pool; k is capped at ``pool_size`` (default: the number of lengths).
    """
    lengths = np.asarray(demo_lengths, dtype=float)
    if lengths.size == 0:
        return 0
    cap = lengths.size if pool_size is None else pool_size
    mean, std = float(lengths.mean()) + sep_len, float(lengths.std())
    k = 0
    while k < cap and (k + 1) * mean + 3.0 * math.sqrt(k + 1) * std <= budget:
        k += 1
    return k


def default_shot_grid(k_max: int) -> list[int]:
    """1, 2, 4, … ≤ k_max, plus k_max."""
    grid = [2**i for i in range(int(math.log2(k_max)) + 1)] if k_max >= 1 else []
    if k_max >= 1 and grid[-1] != k_max:
        grid.append(k_max)
    return grid


class _Setup(NamedTuple):
    """What both ICL runs start from: the data, its split, the prompt's tokens and the context budget."""

    pairs: list[Pair]
    name: str
    fmt: PromptFormat
    labels: list[str]
    tokens: PromptTokens
    test: list[Pair]
    pool: list[Pair]
    context: int
    context_source: str
    test_queries: list
    pool_demos: _LazyDemos
    budget: int  # tokens left for the demonstrations


def _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length) -> _Setup:
    context, context_source = _context_length(model, max_length)
    pairs, name = _dataset_pairs(dataset, dataset_options, seed)
    fmt = prompt or PromptFormat()
    labels = sorted({y for _, y in pairs})
    tokens = PromptTokens(tokenizer, fmt, labels)
    test, pool = _split(pairs, test_size, seed)
    test_queries = tokens.queries([t for t, _ in test])
    pool_demos = _LazyDemos(tokens, pool)
    longest_label = max(len(s) for s in tokens.label_ids.values())
    budget = context - len(tokens.bos) - max(len(q) for q in test_queries) - longest_label
    return _Setup(
        pairs, name, fmt, labels, tokens, test, pool, context, context_source, test_queries, pool_demos, budget
    )


def _base_metadata(setup: _Setup, dataset_options, seed, model) -> dict:
    name, pairs, labels, fmt, tokens, test, pool = (
        setup.name,
        setup.pairs,
        setup.labels,
        setup.fmt,
        setup.tokens,
        setup.test,
        setup.pool,
    )
    round_trip = bool(tokens.round_trip(pool[:1], test[0][0], test[0][1]))
    if not round_trip:
        warnings.warn("the tokenised prompt does not decode back to the prompt string exactly", stacklevel=3)
    return {
        "dataset": name,
        "dataset_options": {k: str(v) if isinstance(v, Path) else v for k, v in dict(dataset_options or {}).items()},
        "num_examples": len(pairs),
        "num_classes": len(labels),
        "labels": labels,
        "test_size": len(test),
        "test_set": "a seeded uniform sample of the data set (numpy default_rng([seed, 0])), fixed for every run",
        "demo_pool_size": len(pool),
        "prompt": {
            **asdict(fmt),
            "demo_template": "{x_prefix}{text}\\n{y_prefix}{label}",
            "layout": "demos joined by the separator, then the separator and the test item with an empty label",
        },
        "tokenization": (
            "piecewise (BOS, demos, separators, test item); label tokens = tokens(y_prefix + label) minus the "
            "longest prefix of tokens(y_prefix) they all share"
            + ("; each piece encoded after a newline whose tokens are dropped (dummy prefix)" if tokens.anchor else "")
        ),
        "tokenization_round_trip": round_trip,
        "label_tokens": {label: len(seq) for label, seq in tokens.label_ids.items()},
        "end_token": int(tokens.trie.end_token),
        "decoding": (
            "constrained greedy over a token trie of the labels (argmax over the allowed next tokens), stopping at "
            "the shortest unique prefix; one single-token forward on the KV cache per trie step; the separator's "
            "first token ends a label that is a token prefix of another"
        ),
        "accuracy": "exact label match, in [0, 1]",
        "context_length": setup.context,
        "context_source": setup.context_source,
        "seed": seed,
        "model": _model_info(model),
    }


def _check_fit(n: int, context: int, what: str) -> None:
    if n > context:
        raise ValueError(f"{what} needs {n} tokens, more than the context of {context}")


@contextmanager
def _test_set_scorer(
    model, setup: _Setup, share_prefix: bool, prefixes: int, desc: str, progress: bool
) -> Iterator[Callable[[list[int]], float]]:
    """Yields ``accuracy(prefix)``: the share of the test items whose label the model decodes after this
    demonstration prefix (in eval mode, without gradients, one progress bar over ``prefixes`` prefixes); the
    model's training mode is restored afterwards."""
    runner = _Runner(model, share_prefix)
    was_training = model.training
    model.eval()
    gold = [y for _, y in setup.test]
    bar = tqdm(total=prefixes * len(setup.test), desc=desc, disable=not progress)

    def accuracy(prefix: list[int]) -> float:
        preds = runner.predict(setup.tokens.trie, prefix, setup.test_queries, bar)
        return float(np.mean([p == g for p, g in zip(preds, gold, strict=True)]))

    try:
        with torch.inference_mode():
            yield accuracy
    finally:
        bar.close()
        model.train(was_training)


def _shot_grid(shots: Sequence[int] | None, k_max: int, context: int) -> list[int]:
    """The shot counts to run: the given ones (checked against the most that fit), or the default grid."""
    if shots is None:
        return default_shot_grid(k_max)
    grid = sorted({int(k) for k in shots})
    if not grid or grid[0] < 1:
        raise ValueError(f"shots must be positive integers, got {list(shots)!r}")
    if grid[-1] > k_max:
        raise ValueError(f"{grid[-1]} shots do not fit the context of {context} tokens: at most {k_max}")
    return grid


def _draw_fitting(rng, pool_demos, pool_size: int, k: int, cost: Callable[[list[int]], int], budget: int):
    """``k`` demonstrations drawn without replacement whose tokens fit ``budget``, redrawn up to 100 times;
    returns them and the number of redraws."""
    for redraws in range(100):
        chosen = [int(i) for i in rng.choice(pool_size, size=k, replace=False)]
        if cost(chosen) <= budget:
            return chosen, redraws
    raise ValueError(f"could not draw {k} demonstrations that fit the context in 100 tries")


def run_icl(
    model,
    tokenizer,
    dataset: str | Sequence[Pair] = "wordnet",
    *,
    shots: Sequence[int] | None = None,
    draws: int = 10,
    test_size: int = 100,
    seed: int = 0,
    max_length: int | None = None,
    prompt: PromptFormat | None = None,
    dataset_options: Mapping | None = None,
    share_prefix: bool = True,
    progress: bool = True,
) -> dict:
    """Many-shot ICL accuracy vs number of demonstrations (DIFF Fig. 6; Dex Table 3).

    Args:
        dataset: ``"wordnet"``, ``"fortunes"``, ``"chatterbot"`` or a list of ``(text, label)`` pairs.
        shots: shot counts (default: 1, 2, 4, … up to the most that fit, plus that maximum); each ≤ the maximum.
        draws: demo sets drawn per shot count (docs/evaluation.md §7.3: 10).
        test_size: size of the fixed test set.
        max_length: context length in tokens (default: ``config.max_position_embeddings``).
        prompt: the :class:`PromptFormat`.
        dataset_options: options of the loader / :func:`~.icl_data.prepare_pairs` (``max_classes``,
            ``max_chars``, ``balanced``, ``per_class``, ``path``; ``seed`` defaults to ``seed``).
        share_prefix: reuse the demos' KV cache for all test items (same result as recomputing it).

    Returns a JSON-serialisable dict: ``shots``, ``accuracy`` (per shot count, one value per draw), ``mean``,
    ``std`` (over draws), ``labels``, ``metadata``.
    """
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    setup = _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length)
    _, name, _, labels, tokens, _, pool, context, _, test_queries, pool_demos, budget = setup
    k_max = max_shots(pool_demos.sample_lengths(seed), budget, len(tokens.sep), pool_size=len(pool))
    if k_max < 1:
        raise ValueError(f"not even one demonstration fits the context of {context} tokens; lower max_chars")
    grid = _shot_grid(shots, k_max, context)

    def cost(chosen: list[int]) -> int:
        return sum(len(ids) + len(tokens.sep) for ids in pool_demos[chosen])

    accuracy: list[list[float]] = []
    redraws = 0
    longest = 0
    with _test_set_scorer(model, setup, share_prefix, len(grid) * draws, f"icl {name}", progress) as score:
        for k in grid:
            per_draw = []
            for d in range(draws):
                chosen, again = _draw_fitting(
                    np.random.default_rng([seed, k, d]), pool_demos, len(pool), k, cost, budget
                )
                redraws += again
                prefix = tokens.prefix(pool_demos[chosen])
                longest = max(longest, len(prefix) + max(len(q) for q in test_queries))
                _check_fit(longest, context, f"{k} shots")
                per_draw.append(score(prefix))
            accuracy.append(per_draw)

    metadata = _base_metadata(setup, dataset_options, seed, model)
    metadata.update(
        {
            "task": "many-shot in-context learning (DIFF Fig. 6; Dex Table 3; Bertsch et al. 2024)",
            "shots": grid,
            "shot_grid": "given" if shots is not None else "1, 2, 4, ... up to the maximum, plus the maximum",
            "max_shots": k_max,
            "max_shots_rule": (
                "largest k with BOS + k*(mean demo + separator) + 3*sqrt(k)*std(demo) + longest test item + "
                "longest label <= context, capped at the pool size; mean and std over the pool (a seeded sample of "
                f"{_LazyDemos.SAMPLE} demos if larger); overflowing draws are redrawn"
            ),
            "draws": draws,
            "demo_sampling": "uniform without replacement from the pool, numpy default_rng([seed, shots, draw])",
            "redraws": redraws,
            "max_prompt_tokens": longest,
            "std": "population standard deviation (ddof=0) over draws",
            "share_prefix": share_prefix,
        }
    )
    return {
        "shots": grid,
        "accuracy": accuracy,
        "mean": [float(np.mean(a)) for a in accuracy],
        "std": [float(np.std(a)) for a in accuracy],
        "labels": labels,
        "metadata": metadata,
    }


# ----------------------------------------------------------------------------------------------------------------
# order robustness


def order_margin(accuracies: Sequence[float]) -> float:
    """Best − worst accuracy over permutations (DIFF Fig. 7's margin)."""
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("order_margin needs at least one accuracy")
    return max(values) - min(values)


def arrangement_order(labels: Sequence[str], arrangement: str, seed: int) -> list[int]:
    """A seeded order (indices) of demos with these ``labels``: ``"random"`` or ``"by_class"``.

    ``"random"``: a uniform permutation. ``"by_class"``: rounds that each contain every class once; needs the same
    number of demos per class; the class order is drawn once and repeated in every round, and which example of a
    class goes into which round is drawn too.
    """
    if arrangement == "random":
        return [int(i) for i in np.random.default_rng([seed, 1]).permutation(len(labels))]
    if arrangement != "by_class":
        raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, got {arrangement!r}")
    rng = np.random.default_rng([seed, 2])
    by_class: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(label, []).append(i)
    counts = {len(v) for v in by_class.values()}
    if len(counts) > 1:
        raise ValueError(f"'by_class' needs the same number of demos per class, got {sorted(counts)}")
    classes = sorted(by_class)
    order = [classes[i] for i in rng.permutation(len(classes))]
    columns = {c: [by_class[c][i] for i in rng.permutation(len(by_class[c]))] for c in order}
    rounds = counts.pop() if counts else 0
    return [columns[c][r] for r in range(rounds) for c in order]


def arrange_demos(demos: Sequence[Pair], arrangement: str, seed: int) -> list[Pair]:
    """``demos`` in the seeded order of :func:`arrangement_order`."""
    return [demos[i] for i in arrangement_order([y for _, y in demos], arrangement, seed)]


def _order_demo_set(
    rounds: int | None, labels, pool: list[Pair], pool_demos, sep_len: int, budget: int, context: int, seed: int
) -> tuple[int, list[int]]:
    """The order-robustness demo set: ``rounds`` pool examples of every class (a seeded per-class shuffle; by
    default as many rounds as fit ``budget``), as pool indices in round order; returns the rounds and the indices."""
    rng = np.random.default_rng([seed, 3])
    per_class: dict[str, list[int]] = {c: [] for c in labels}
    for i, (_, y) in enumerate(pool):
        per_class[y].append(i)
    columns = {c: [idx[j] for j in rng.permutation(len(idx))] for c, idx in per_class.items()}
    available = min(len(v) for v in columns.values())
    if available < 1:
        missing = sorted(c for c, v in columns.items() if not v)
        raise ValueError(f"the demo pool has no example of {missing}; lower test_size or use more data")

    def chosen(r: int) -> list[int]:
        return [columns[c][j] for j in range(r) for c in labels]

    def cost(r: int) -> int:
        return sum(len(ids) + sep_len for ids in pool_demos[chosen(r)])

    if rounds is None:
        rounds = 0
        while rounds < available and cost(rounds + 1) <= budget:
            rounds += 1
        if rounds < 1:
            raise ValueError(
                f"one round of {len(labels)} classes does not fit the context of {context} tokens; "
                "lower max_classes or max_chars"
            )
    elif not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    elif rounds > available:
        raise ValueError(f"{rounds} rounds need {rounds} pool examples per class; the smallest class has {available}")
    elif cost(rounds) > budget:
        raise ValueError(f"{rounds} rounds of {len(labels)} classes do not fit the context of {context} tokens")
    return rounds, chosen(rounds)


def run_order_robustness(
    model,
    tokenizer,
    dataset: str | Sequence[Pair] = "wordnet",
    *,
    rounds: int | None = None,
    permutations: int = 10,
    arrangements: Sequence[str] = ARRANGEMENTS,
    test_size: int = 100,
    seed: int = 0,
    max_length: int | None = None,
    prompt: PromptFormat | None = None,
    dataset_options: Mapping | None = None,
    share_prefix: bool = True,
    progress: bool = True,
) -> dict:
    """Accuracy over permutations of one fixed demo set, and the margin best − worst (DIFF Fig. 7, App. F).

    The demo set holds ``rounds`` examples of every class (default: as many rounds as fit the context).
    Returns ``labels``, ``rounds``, ``shots`` (= rounds × classes) and, per arrangement, ``accuracies`` (one per
    permutation), ``mean``, ``std``, ``best``, ``worst``, ``margin``, plus ``metadata``.
    """
    if not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations must be a positive integer, got {permutations!r}")
    arrangements = list(arrangements)
    if not arrangements or any(a not in ARRANGEMENTS for a in arrangements):
        raise ValueError(f"arrangements must be a non-empty subset of {ARRANGEMENTS}, got {arrangements!r}")
    setup = _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length)
    _, name, _, labels, tokens, _, pool, context, _, test_queries, pool_demos, budget = setup
    rounds, demo_index = _order_demo_set(rounds, labels, pool, pool_demos, len(tokens.sep), budget, context, seed)
    demo_labels = [pool[i][1] for i in demo_index]

    results: dict[str, dict] = {}
    prefixes = len(arrangements) * permutations
    with _test_set_scorer(model, setup, share_prefix, prefixes, f"icl order {name}", progress) as score:
        for arrangement in arrangements:
            accs = []
            for p in range(permutations):
                order = arrangement_order(demo_labels, arrangement, seed=seed * 1000 + p)
                prefix = tokens.prefix(pool_demos[[demo_index[i] for i in order]])
                _check_fit(len(prefix) + max(len(q) for q in test_queries), context, f"{rounds} rounds")
                accs.append(score(prefix))
            results[arrangement] = {
                "accuracies": accs,
                "mean": float(np.mean(accs)),
                "std": float(np.std(accs)),
                "best": max(accs),
                "worst": min(accs),
                "margin": order_margin(accs),
            }

    metadata = _base_metadata(setup, dataset_options, seed, model)
    metadata.update(
        {
            "task": "ICL order robustness (DIFF Fig. 7, App. F)",
            "rounds": rounds,
            "shots": rounds * len(labels),
            "demo_set": (
                "rounds examples per class from the pool (seeded per-class shuffle, numpy default_rng([seed, 3])); "
                "by default as many rounds as fit the context"
            ),
            "permutations": permutations,
            "permutation_seeds": [seed * 1000 + p for p in range(permutations)],
            "arrangements": {
                "random": "uniform permutation of the demo set",
                "by_class": (
                    "rounds each containing every class once; one seeded class order repeated in every round; "
                    "seeded assignment of a class's examples to rounds"
                ),
            },
            "margin": "best - worst accuracy over the permutations (accuracy in [0, 1])",
            "std": "population standard deviation (ddof=0) over permutations",
            "share_prefix": share_prefix,
        }
    )
    return {
        "labels": labels,
        "rounds": rounds,
        "shots": rounds * len(labels),
        "arrangements": results,
        "metadata": metadata,
    }


# ----------------------------------------------------------------------------------------------------------------
# plots


def _series(results: Mapping) -> dict[str, Mapping]:
    if "metadata" in results:
        return {str(results["metadata"].get("model", {}).get("name_or_path") or "model"): results}
    return dict(results)


def plot_icl(results: Mapping, path: str | Path) -> Path:
    """Accuracy vs number of demonstrations, mean ± std over draws (DIFF Fig. 6).

    ``results``: one :func:`run_icl` result, or a mapping ``{name: result}`` to compare models on one plot.
    """
    plt = figure()
    series = _series(results)
    if not series:
        raise ValueError("plot_icl needs at least one result")
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = group_colors(list(series))
    for name, res in series.items():
        for key in ("shots", "mean", "std"):
            if key not in res:
                raise ValueError(f"result {name!r} lacks {key!r}: not a run_icl result")
        x, mean, std = np.asarray(res["shots"]), np.asarray(res["mean"]), np.asarray(res["std"])
        ax.plot(x, mean, marker="o", label=name, color=colors[name])
        ax.fill_between(x, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), alpha=0.2, color=colors[name])
    labels = next(iter(series.values())).get("labels")
    if labels:  # constrained decoding to one of the K labels: a guess is right 1/K of the time
        ax.axhline(1 / len(labels), color="black", linestyle="--", linewidth=1, label=f"chance (1/{len(labels)})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("number of demonstrations")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    dataset = next(iter(series.values())).get("metadata", {}).get("dataset", "")
    ax.set_title(f"many-shot ICL {dataset}".strip())
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_order_robustness(results: Mapping, path: str | Path) -> Path:
    """Accuracy of every permutation per arrangement, with the margin in the labels (DIFF Fig. 7)."""
    plt = figure()
    series = _series(results)
    if not series:
        raise ValueError("plot_order_robustness needs at least one result")
    fig, ax = plt.subplots(figsize=(6, 4))
    ticks, names = [], []
    pos = 0
    for name, res in series.items():
        if "arrangements" not in res:
            raise ValueError(f"result {name!r} lacks 'arrangements': not a run_order_robustness result")
        for arrangement, r in res["arrangements"].items():
            accs = r["accuracies"]
            ax.scatter([pos] * len(accs), accs, alpha=0.7)
            ax.vlines(pos, r["worst"], r["best"])
            ticks.append(pos)
            names.append(f"{name}\n{arrangement}\nmargin {100 * r['margin']:.1f}")
            pos += 1
    ax.set_xticks(ticks, names, fontsize=7)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    labels = next(iter(series.values())).get("labels") or next(iter(series.values())).get("metadata", {}).get("labels")
    if labels:
        ax.axhline(1 / len(labels), color="black", linestyle="--", linewidth=1, label=f"chance (1/{len(labels)})")
        ax.legend(fontsize=7)
    ax.set_title("ICL order robustness")
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def _run_suite(model, tokenizer, o, folder, name):
    r = {
        "many_shot": run_icl(
            model,
            tokenizer,
            o.icl_dataset,
            shots=o.icl_shots,
            draws=o.icl_draws,
            test_size=o.icl_test_size,
            seed=o.seed,
            max_length=o.icl_context_tokens,
            dataset_options=_dataset_options(o),
        ),
        "order_robustness": run_order_robustness(
            model,
            tokenizer,
            o.icl_dataset,
            permutations=o.icl_permutations,
            test_size=o.icl_test_size,
            seed=o.seed,
            max_length=o.icl_context_tokens,
            dataset_options=_dataset_options(o),
        ),
    }
    pictures = {
        "icl": plot_icl({name: r["many_shot"]}, folder / "icl_accuracy.png").name,
        "icl_order": plot_order_robustness({name: r["order_robustness"]}, folder / "icl_order.png").name,
    }
    return r, pictures


def compare(icl: dict[str, dict], out: Path) -> list[str]:
    """Many-shot accuracy of every model in one picture, and the order margins."""
    from .common import fmt

    many = {n: r["many_shot"] for n, r in icl.items()}
    lines = [f"![ICL accuracy]({plot_icl(many, out / 'icl_all.png').name})", ""]
    lines += ["| model | order margin (random) | order margin (by class) |", "|---|---|---|"]
    for n, r in icl.items():
        arr = r["order_robustness"]["arrangements"]
        lines.append(f"| {n} | " + " | ".join(fmt(arr.get(k, {}).get("margin")) for k in ("random", "by_class")) + " |")
    return [*lines, ""]


@dataclass
class IclOptions:
    """Many-shot ICL and order robustness (docs/evaluation.md §7)."""

    icl_dataset: str = option("fortunes", f"ICL data set: {', '.join(DATASETS)}")
    icl_draws: int = option(3, "draws of demonstrations per shot count", minimum=1)
    icl_test_size: int = option(30, "test items per draw", minimum=1)
    icl_shots: tuple[int, ...] | None = option(
        None, "comma-separated shot counts (default: a grid up to what fits the context)", parse=int_list
    )
    icl_permutations: int = option(10, "orders of the order-robustness set", minimum=1)
    # longer texts are cut (the papers are silent; keeps many shots in context: docs/evaluation.md §7.1)
    icl_max_chars: int = option(300, "cut longer ICL texts", minimum=1)
    icl_max_classes: int | None = option(None, "keep the most frequent classes", minimum=2)
    # the order-robustness demo set fills it, so on a model with 8,192 positions every permutation is an
    # 8k-token prefill: this is the suite's cost knob
    icl_context_tokens: int | None = option(
        None, "ICL prompt length in tokens (default: the model's maximum; the order-robustness set fills it)", minimum=8
    )


def _dataset_options(o) -> dict:
    return {"max_chars": o.icl_max_chars, "max_classes": o.icl_max_classes}


def _check(o, name) -> None:
    if o.icl_dataset not in DATASETS:
        raise ValueError(
            f"{name('icl_dataset')}: unknown ICL dataset {o.icl_dataset!r}; choose one of {', '.join(DATASETS)}"
        )


def _preflight(o, targets) -> None:
    """The data set is loaded now: a missing one (say Debian's WordNet) fails before hours of training."""
    load_icl_dataset(o.icl_dataset, **_dataset_options(o))


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
def _at_largest(m: dict | None) -> float | None:
    return None if not m or not m.get("mean") else m["mean"][-1]


def _compare_shots(ref: Run, new: Run, seed: int) -> Comparison | None:
    """DIFF Fig. 6: many-shot accuracy at the largest shot count both models ran, paired over the same draws
    (the same demonstrations and test items); chance is the measure's (:func:`_chance`)."""
    mr, mn = ref.results("icl", "many_shot"), new.results("icl", "many_shot")
    if not mr or not mn:
        return None
    common_shots = sorted(set(mr["shots"]) & set(mn["shots"]))
    if not common_shots:
        return None
    k = common_shots[-1]
    ar, an = mr["accuracy"][mr["shots"].index(k)], mn["accuracy"][mn["shots"].index(k)]
    labels = len(mr.get("labels") or []) or 1
    diff = paired_difference(ar, an, seed=seed) if len(ar) == len(an) else unpaired_difference(ar, an)
    note = f"data uncertainty only; {k} shots, {len(ar)} draws; chance {1 / labels:.2f} (1 / {labels} labels)"
    (rv, rci), (nv, nci) = t_interval(ar), t_interval(an)  # each model's mean over the draws, t interval
    return Comparison(
        f"accuracy at {k} shots", ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff,
        kind=paired_kind(diff, "draws of demonstrations") if len(ar) == len(an) else "Welch t over draws",
        note=note, cells=f"{k} shots",
    )  # fmt: skip


def _chance(run: Run) -> float | None:
    """Guessing one of the labels: 1 / labels."""
    labels = run.results("icl", "many_shot", "labels")
    return 1 / len(labels) if labels else None


def _margin(run: Run) -> float | None:
    return run.results("icl", "order_robustness", "arrangements", "random", "margin")


def _compare_margin(ref: Run, new: Run, seed: int) -> Comparison | None:
    mr, mn = _margin(ref), _margin(new)
    if mr is None or mn is None:
        return None
    return Comparison(
        "order margin (random)", ref_value=mr, new_value=mn, kind=ONE_NUMBER + " (best − worst over permutations)"
    )


MEASURES = {
    "icl:many_shot": Measure(
        "accuracy at the largest shot count", 3, per_run=lambda run: _at_largest(run.results("icl", "many_shot")),
        compare=_compare_shots, chance=_chance,
    ),
    "icl:order_margin": Measure("order margin (random)", 3, per_run=_margin, compare=_compare_margin),
}  # fmt: skip

# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 6", "better many-shot in-context learning", "+5.2 to +21.6 points at 64K-token prompts",
        "icl:many_shot", "higher", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Fig. 7", "more robust to the order of demonstrations",
        "TREC margin 19.0 vs 4.0 (random order)", "icl:order_margin", "lower", "baseline",
    ),
)  # fmt: skip


SUITE = Suite(
    "icl",
    _run_suite,
    headline=lambda r: {"ICL best acc": max(r["many_shot"]["mean"])},
    compare=compare,
    options=IclOptions,
    check=_check,
    preflight=_preflight,
    measures=MEASURES,
    default=False,  # minutes per shot count at the model's full length: asked for by name,
    claims=CLAIMS,
)
