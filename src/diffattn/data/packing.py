"""Sequence packing for causal-LM pretraining (GPT-2/GPT-3 style concatenate-and-chunk).

Documents are concatenated into one token stream, each followed by the separator token, and the stream is cut
into consecutive rows of ``seq_len`` tokens. Attention runs across document boundaries inside a row, as in
GPT-3 and the DIFF Transformer recipe; the separator tells the model where a document ends. Only the final row
is padded: its pad positions have ``labels == -100`` and ``attention_mask == 0``. Nothing is dropped or
duplicated, so the non-pad tokens in row order are exactly the stream.

Labels are aligned with ``input_ids`` (``labels[t] == input_ids[t]``): Hugging Face causal-LM heads shift them
internally, so the token at ``t`` is predicted from positions ``< t``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
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


def _check_seq_len(seq_len: object) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an int >= 2, got {seq_len!r}")


def pack_documents(docs: Iterable[Sequence[int]], seq_len: int, *, sep_id: int, pad_id: int) -> PackedSequences:
    """Pack token-id documents, each followed by ``sep_id``, into ``[N, seq_len]`` rows; pad the last row."""
    _check_seq_len(seq_len)
    for arg, value in (("sep_id", sep_id), ("pad_id", pad_id)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{arg} must be a non-negative int token id, got {value!r}")
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


def tokenize_and_pack(docs: Sequence[str], tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PackedSequences:
    """Tokenize ``docs`` (no special tokens added by the tokenizer) and pack them with :func:`pack_documents`."""
    _check_seq_len(seq_len)
    if isinstance(docs, str):
        raise ValueError("docs must be a sequence of document strings, got a single str")
    if len(docs) == 0:
        raise ValueError("docs is empty: no tokens to pack")
    sep_id, pad_id = special_token_ids(tokenizer)
    # One batched call: the Rust tokenizer encodes the documents in parallel.
    encoded = tokenizer(list(docs), add_special_tokens=False)["input_ids"]
    packed = pack_documents(encoded, seq_len, sep_id=sep_id, pad_id=pad_id)
    logger.info("packed %d documents into %d rows of %d tokens", len(docs), packed.input_ids.shape[0], seq_len)
    return packed
