"""Byte-level BPE tokenizers trained on a corpus' training split, cached by corpus fingerprint.

GPT-2-style byte-level BPE (Radford et al., 2019) built with Hugging Face ``tokenizers``: a ByteLevel
pre-tokenizer (no prefix space) and decoder, so every string round-trips exactly; the 256 byte symbols are the
initial alphabet, so no input is ever out of vocabulary. Two special tokens come first in the vocabulary:
:data:`SEPARATOR` (id 0; document separator, also BOS/EOS) and :data:`PAD` (id 1).

Training sees ``corpus.train`` only, so validation perplexity is not flattered by merges learnt on validation
text. Tokenizers are cached under :func:`tokenizer_cache_dir` by :func:`tokenizer_fingerprint_key`, written
atomically (saved to a temporary folder, then renamed) so an interrupted run never leaves a half-written entry
that a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .corpus import Corpus

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SEPARATOR = "<|endoftext|>"  # document separator, also bos/eos
PAD = "<|pad|>"
SPECIAL_TOKENS = (SEPARATOR, PAD)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # the byte alphabet plus the specials
# Bumped whenever the tokenizer recipe changes, so cached tokenizers of the old recipe are not reused.
TOKENIZER_FORMAT_VERSION = "diffattn-bpe-v1"
# Same value transformers uses for "no limit"; sequence length is the trainer's business, not the tokenizer's.
_MODEL_MAX_LENGTH = int(1e30)
_META_FILE = "diffattn_tokenizer.json"


def tokenizer_cache_dir() -> Path:
    """``$DIFFATTN_CACHE/tokenizers`` if ``DIFFATTN_CACHE`` is set, else ``~/.cache/diffattn/tokenizers``."""
    root = os.environ.get("DIFFATTN_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "diffattn"
    return base / "tokenizers"


def _check_vocab_size(vocab_size: object) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be an int >= {MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special tokens), "
            f"got {vocab_size!r}"
        )


def tokenizer_fingerprint_key(corpus: Corpus, vocab_size: int) -> str:
    """Cache key: sha256 of (corpus fingerprint, vocab size, tokenizer format version)."""
    _check_vocab_size(vocab_size)
    payload = json.dumps([corpus.fingerprint, vocab_size, TOKENIZER_FORMAT_VERSION])
    return hashlib.sha256(payload.encode()).hexdigest()


def train_tokenizer(
    corpus: Corpus, vocab_size: int = 8192, *, cache_dir: str | os.PathLike | None = None
) -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer of ``corpus.train`` with ``vocab_size`` entries, from cache if present.

    The vocabulary can come out smaller than ``vocab_size`` when the training text runs out of merges.
    """
    _check_vocab_size(vocab_size)
    if not isinstance(corpus, Corpus):
        raise ValueError(f"corpus must be a diffattn.data.Corpus, got {type(corpus).__name__}")
    if not any(doc.strip() for doc in corpus.train):
        raise ValueError(f"corpus {corpus.name!r} has no training text to train a tokenizer on")
    root = Path(cache_dir).expanduser() if cache_dir is not None else tokenizer_cache_dir()
    key = tokenizer_fingerprint_key(corpus, vocab_size)
    entry = root / key
    if _is_complete(entry):
        logger.info("tokenizer: loading cached %s", entry)
        return _load(entry)
    if entry.exists():
        # Only complete entries are ever renamed into place, so this is foreign debris; replace it.
        logger.warning("tokenizer: ignoring incomplete cache entry %s", entry)
        shutil.rmtree(entry, ignore_errors=True)

    logger.info("tokenizer: training byte-level BPE (vocab %d) on %d train documents", vocab_size, len(corpus.train))
    tokenizer = _train(corpus.train, vocab_size)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-", dir=root))
    try:
        tokenizer.save_pretrained(tmp)
        meta = {"corpus": corpus.name, "corpus_fingerprint": corpus.fingerprint, "vocab_size": vocab_size}
        (tmp / _META_FILE).write_text(json.dumps({**meta, "format": TOKENIZER_FORMAT_VERSION}, indent=2))
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another process (e.g. a second torchrun rank) renamed its identical tokenizer into place first.
            if not _is_complete(entry):
                raise
            logger.info("tokenizer: %s was written concurrently; using it", entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _load(entry)


def _is_complete(entry: Path) -> bool:
    return all((entry / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", _META_FILE))


def _load(entry: Path) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast  # here, not at the top: seconds (`diffattn eval --help`)

    return PreTrainedTokenizerFast.from_pretrained(str(entry))


def _train(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast  # here, not at the top: seconds (`diffattn eval --help`)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    # BPE training is deterministic for the same input in the same order (ties between equally frequent
    # pairs are broken by the pair itself, not by hash order); tests/data/test_data.py checks it.
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SEPARATOR,
        eos_token=SEPARATOR,
        pad_token=PAD,
        model_max_length=_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,  # would break the exact decode(encode(text)) == text round trip
    )
