"""The many-shot prompt, its piece-by-piece tokenisation and the label trie of constrained decoding
(:mod:`diffattn.eval.icl`'s docstring: *Prompt*, *Tokenisation*, *Constrained decoding*)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..icl_data import Pair

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
