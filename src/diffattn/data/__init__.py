"""Data layer: corpora and their splits, byte-level BPE tokenizers, sequence packing, synthetic retrieval tasks.

- :mod:`.corpus` — Shakespeare (split by play) or local .txt/.jsonl/.json files, with a content fingerprint.
- :mod:`.tokenizer` — byte-level BPE trained on the training split, cached by fingerprint.
- :mod:`.packing` — concatenate-and-chunk packing into fixed-length rows for causal-LM training.
- :mod:`.synthetic` — seeded multi-needle retrieval (DIFF Transformer §3.4) and Zoology MQAR, and the
  retrieval practice mix that training appends to the corpus.
"""

from .corpus import Corpus, load_corpus
from .packing import PackedSequences, pack_documents, tokenize_and_pack
from .synthetic import (
    MQARSample,
    NeedleSample,
    make_mqar_sample,
    make_needle_sample,
    retrieval_mix,
    score_string_match_all,
)
from .tokenizer import PAD, SEPARATOR, tokenizer_cache_dir, tokenizer_fingerprint_key, train_tokenizer

__all__ = [
    "PAD",
    "SEPARATOR",
    "Corpus",
    "MQARSample",
    "NeedleSample",
    "PackedSequences",
    "load_corpus",
    "make_mqar_sample",
    "make_needle_sample",
    "pack_documents",
    "retrieval_mix",
    "score_string_match_all",
    "tokenize_and_pack",
    "tokenizer_cache_dir",
    "tokenizer_fingerprint_key",
    "train_tokenizer",
]
