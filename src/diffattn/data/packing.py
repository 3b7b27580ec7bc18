"""Sequence packing for causal-LM pretraining: GPT-2/GPT-3 style concatenate-and-chunk (the default), or documents
kept apart as transformers' ``DataCollatorWithFlattening`` keeps them (``data.packing``).

Concatenate-and-chunk: documents are concatenated into one token stream, each followed by the separator token,
and the stream is cut into consecutive rows of ``seq_len`` tokens. Attention runs across document boundaries inside
a row, as in GPT-3 and the DIFF Transformer recipe; the separator tells the model where a document ends. Only the
final row is padded: its pad positions have ``labels == -100`` and ``attention_mask == 0``. Nothing is dropped or
duplicated, so the non-pad tokens in row order are exactly the stream.

Documents kept apart (:func:`pack_separate_documents`, :class:`FlatteningCollator`): each document, followed by
the separator, is cut into pieces of at most ``seq_len`` tokens, and consecutive pieces share a row while they fit
(the row's unused tail is padding that never reaches the model); ``position_ids`` restart at 0 at each piece. The
collator hands every piece of a batch to transformers' ``DataCollatorWithFlattening``, which concatenates them into
one row without padding, restarts the position ids per piece and sets the label of each piece's first token to
-100; transformers' masking (and our op, from the same position ids: docs/methods.md §0.2) then lets no token
attend across a document boundary.

Labels are aligned with ``input_ids`` (``labels[t] == input_ids[t]``): Hugging Face causal-LM heads shift them
internally, so the token at ``t`` is predicted from positions ``< t``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # annotations only: importing transformers costs seconds (`diffattn eval --help`)
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # what torch.nn.CrossEntropyLoss and HF models skip


@dataclass
class PackedSequences:
    """Rows of packed token ids with their labels and attention mask."""

    input_ids: torch.LongTensor  # [N, seq_len]
    labels: torch.LongTensor  # [N, seq_len]; -100 at padding positions (HF shifts labels internally)
    attention_mask: torch.LongTensor  # [N, seq_len]; 0 at padding
    num_tokens: int  # real (non-pad) tokens, separators included
    # [N, seq_len], restarting at 0 at every document piece (documents kept apart); None: one stream per row
    position_ids: torch.LongTensor | None = None


def _check_seq_len(seq_len: object) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2, got {seq_len!r}")


def _check_token_ids(sep_id: object, pad_id: object) -> None:
    for arg, value in (("sep_id", sep_id), ("pad_id", pad_id)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{arg} must be a non-negative int token id, got {value!r}")


def pack_documents(docs: Iterable[Sequence[int]], seq_len: int, *, sep_id: int, pad_id: int) -> PackedSequences:
    """Pack token-id documents, each followed by ``sep_id``, into ``[N, seq_len]`` rows; pad the last row."""
    _check_seq_len(seq_len)
    _check_token_ids(sep_id, pad_id)
    pieces: list[np.ndarray] = []
    sep = np.array([sep_id], dtype=np.int64)
    for doc in docs:
        pieces.append(np.asarray(doc, dtype=np.int64).reshape(-1))
        pieces.append(sep)
    if not pieces:
        raise ValueError("docs is empty: no tokens to pack")
    stream = np.concatenate(pieces)
    num_tokens = int(stream.size)
    rows = -(-num_tokens // seq_len)  # ceil
    padded = np.full(rows * seq_len, pad_id, dtype=np.int64)
    padded[:num_tokens] = stream
    input_ids = torch.from_numpy(padded.reshape(rows, seq_len))
    # Built from positions, not from pad_id, so a pad id that also occurs as a real token is never masked.
    attention_mask = (torch.arange(rows * seq_len) < num_tokens).reshape(rows, seq_len).long()
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return PackedSequences(input_ids=input_ids, labels=labels, attention_mask=attention_mask, num_tokens=num_tokens)


def pack_separate_documents(
    docs: Iterable[Sequence[int]], seq_len: int, *, sep_id: int, pad_id: int
) -> PackedSequences:
    """Token-id documents, each followed by ``sep_id``, kept apart: cut into pieces of at most ``seq_len`` tokens,
    consecutive pieces sharing a ``[seq_len]`` row while they fit, ``position_ids`` restarting at each piece (the
    module docstring); rows are padded at their end, with ``attention_mask == 0`` and ``labels == -100`` there."""
    _check_seq_len(seq_len)
    _check_token_ids(sep_id, pad_id)
    rows: list[list[np.ndarray]] = [[]]
    used = 0
    for doc in docs:
        tokens = np.append(np.asarray(doc, dtype=np.int64).reshape(-1), sep_id)
        for start in range(0, tokens.size, seq_len):
            piece = tokens[start : start + seq_len]
            if used + piece.size > seq_len:
                rows.append([])
                used = 0
            rows[-1].append(piece)
            used += piece.size
    if not rows[0]:
        raise ValueError("docs is empty: no tokens to pack")
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), seq_len), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), seq_len), dtype=torch.long)
    for r, pieces in enumerate(rows):
        flat = np.concatenate(pieces)
        input_ids[r, : flat.size] = torch.from_numpy(flat)
        position_ids[r, : flat.size] = torch.from_numpy(np.concatenate([np.arange(p.size) for p in pieces]))
        attention_mask[r, : flat.size] = 1
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return PackedSequences(input_ids, labels, attention_mask, int(attention_mask.sum()), position_ids)


class FlatteningCollator:
    """Rows of documents kept apart (:func:`pack_separate_documents`; a row without ``position_ids`` is one
    document) → one flattened row by transformers' ``DataCollatorWithFlattening``: every document piece of the
    batch, padding dropped, ``position_ids`` restarting per piece, label -100 at each piece's first token."""

    def __init__(self):
        from transformers import DataCollatorWithFlattening

        self.flatten = DataCollatorWithFlattening(separator_id=IGNORE_INDEX)

    def __call__(self, rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        documents = []
        for row in rows:
            real = row["attention_mask"].bool()
            ids, labels = row["input_ids"][real], row["labels"][real]
            positions = row["position_ids"][real] if "position_ids" in row else torch.arange(ids.numel())
            starts = [*(positions == 0).nonzero().flatten().tolist(), ids.numel()]
            for start, end in itertools.pairwise(starts):
                documents.append({"input_ids": ids[start:end].tolist(), "labels": labels[start:end].tolist()})
        return self.flatten(documents)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """(separator id, pad id) of ``tokenizer``: its :data:`SEPARATOR`/:data:`PAD` tokens, else eos/pad."""
    from .tokenizer import PAD, SEPARATOR

    vocab = tokenizer.get_vocab()
    sep_id = vocab.get(SEPARATOR, tokenizer.eos_token_id)
    pad_id = vocab.get(PAD, tokenizer.pad_token_id)
    if sep_id is None:
        raise ValueError(f"tokenizer has neither a {SEPARATOR!r} token nor an eos token to separate documents")
    if pad_id is None:
        pad_id = sep_id  # safe: padding is identified by attention_mask/labels, never by the id itself
    return int(sep_id), int(pad_id)


def tokenize_and_pack(
    docs: Sequence[str], tokenizer: PreTrainedTokenizerBase, seq_len: int, *, separate_documents: bool = False
) -> PackedSequences:
    """Tokenize ``docs`` (no special tokens added by the tokenizer) and pack them with :func:`pack_documents`, or
    with :func:`pack_separate_documents` when ``separate_documents``."""
    _check_seq_len(seq_len)
    if isinstance(docs, str):
        raise ValueError("docs must be a sequence of document strings, got a single str")
    if len(docs) == 0:
        raise ValueError("docs is empty: no tokens to pack")
    sep_id, pad_id = special_token_ids(tokenizer)
    # One batched call: the Rust tokenizer encodes the documents in parallel.
    encoded = tokenizer(list(docs), add_special_tokens=False)["input_ids"]
    pack = pack_separate_documents if separate_documents else pack_documents
    packed = pack(encoded, seq_len, sep_id=sep_id, pad_id=pad_id)
    logger.info("packed %d documents into %d rows of %d tokens", len(docs), packed.input_ids.shape[0], seq_len)
    return packed
