"""Offline classification data sets for many-shot in-context learning (DIFF Transformer Fig. 6–7; Dex Table 3;
Bertsch et al. 2024, "In-Context Learning with Long-Context Models"; docs/evaluation.md §7.1).

The papers evaluate on TREC, TREC-fine, Banking-77 and Clinic-150, which live on a model/dataset hub that this
project may not use. These loaders build comparable many-class text-classification sets from files that come
with ordinary Debian/PyPI packages instead:

* :func:`load_wordnet` — WordNet supersenses (Debian ``wordnet-base``): the gloss of every synset in
  ``/usr/share/wordnet/data.{noun,verb,adj,adv}`` labelled with its lexicographer file name (``"noun.animal"``,
  ``"verb.motion"``, …; 45 classes). The lexfile number is the 2nd field of each data line; numbers are mapped to
  names with the standard ``lexnames`` list (:data:`LEXNAMES`).
* :func:`load_fortunes` — Debian ``fortunes``: each quote of ``/usr/share/games/fortunes/<category>`` (quotes are
  separated by lines holding only ``%``), labelled with its category. The offensive ``off/`` directory and the
  ``.dat``/``.u8`` index files are skipped.
* :func:`load_chatterbot` — PyPI ``chatterbot-corpus``: every conversation of
  ``chatterbot_corpus/data/english/<topic>.yml``, labelled with the topic (the file name without ``.yml``). The
  package's YAML files are read directly; it is never imported, and its dependencies are not needed
  (``pip install --no-deps chatterbot-corpus``).

All loaders return a list of ``(text, label)`` pairs and share the options of :func:`prepare_pairs`, which also
validates user-supplied pairs. Choices the papers leave open (they used ready-made data sets), stated here:

* **Text cleaning.** Whitespace runs (newlines included) are collapsed to one space, because the prompt format is
  line based (``"{x_prefix}{text}\\n{y_prefix}{label}"``, demos joined by ``"\\n==\\n"``). Texts longer than
  ``max_chars`` characters are cut to ``max_chars`` (at the last space when one lies in the final fifth), with no
  ellipsis. A chatterbot conversation's turns are joined with ``" / "``.
* **Duplicates.** A text that occurs several times with one label is kept once; a text that occurs with several
  labels is ambiguous and dropped entirely (it would make a demo contradict the test item).
* **Classes.** ``max_classes`` keeps the most frequent classes (after de-duplication; ties broken by label name),
  so a capped data set keeps the most data.
* **Balance.** ``per_class`` caps every class at that many examples (a seeded sample); ``balanced=True`` further
  caps every class at the size of the smallest kept class, so all classes are equally frequent.
* **Order.** The result is shuffled with ``seed`` (a :class:`random.Random`, identical on every machine).
* **Labels.** Labels are whitespace-collapsed and must be non-empty; two different labels that are equal after
  normalisation (whitespace-collapsed, case-folded) are refused, because a reader (and a case-insensitive
  tokenizer) could not tell them apart. Labels that merely share a prefix (``"noun.act"``/``"noun.artifact"``)
  are fine: the constrained decoder of :mod:`.icl` handles them.
"""

from __future__ import annotations

import importlib.util
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

WORDNET_DIR = Path("/usr/share/wordnet")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
WORDNET_PARTS = ("noun", "verb", "adj", "adv")
DATASETS = ("wordnet", "fortunes", "chatterbot")
DEFAULT_MAX_CHARS = 300

# The standard WordNet 3.0 lexicographer files, indexed by lexfile number (WordNet's ``lexnames`` file).
LEXNAMES = (
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
)

_WS = re.compile(r"\s+")

Pair = tuple[str, str]


# ----------------------------------------------------------------------------------------------------------------
# cleaning and validation


def clean_text(text: str, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """Collapse whitespace to single spaces and cut to ``max_chars`` characters (at a late space if possible)."""
    text = _WS.sub(" ", str(text)).strip()
    if max_chars is not None and len(text) > max_chars:
        cut = text[:max_chars]
        space = cut.rfind(" ")
        text = (cut[:space] if space >= 0.8 * max_chars else cut).rstrip()
    return text


def normalize_label(label: str) -> str:
    """The form under which two labels count as the same: whitespace-collapsed and case-folded."""
    return _WS.sub(" ", str(label)).strip().casefold()


def validate_pairs(pairs: Iterable[Pair], *, what: str = "dataset") -> list[Pair]:
    """Check ``(text, label)`` pairs: strings, non-empty, ≥ 2 classes, no labels equal after normalisation.

    Returns the pairs with whitespace-collapsed labels (texts untouched). Raises ``ValueError`` otherwise.
    """
    out: list[Pair] = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"{what}: item {i} must be a (text, label) pair, got {pair!r}")
        text, label = pair
        if not isinstance(text, str) or not isinstance(label, str):
            kinds = f"({type(text).__name__}, {type(label).__name__})"
            raise ValueError(f"{what}: item {i} must hold two strings, got {kinds}")
        label = _WS.sub(" ", label).strip()
        if not label:
            raise ValueError(f"{what}: item {i} has an empty label")
        if not text.strip():
            raise ValueError(f"{what}: item {i} (label {label!r}) has an empty text")
        out.append((text, label))
    if not out:
        raise ValueError(f"{what} is empty: in-context learning needs examples of at least 2 classes")
    seen: dict[str, str] = {}
    for _, label in out:
        other = seen.setdefault(normalize_label(label), label)
        if other != label:
            raise ValueError(
                f"{what}: labels {other!r} and {label!r} are identical after normalisation (whitespace, case); "
                "rename one of them"
            )
    if len(seen) < 2:
        raise ValueError(f"{what} has a single class ({out[0][1]!r}); in-context classification needs at least 2")
    return out


def prepare_pairs(
    pairs: Iterable[Pair],
    *,
    max_classes: int | None = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
    balanced: bool = False,
    per_class: int | None = None,
    seed: int = 0,
    what: str = "dataset",
) -> list[Pair]:
    """Clean, de-duplicate, select classes, balance and shuffle ``(text, label)`` pairs (see the module docstring).

    Args:
        max_classes: keep only the this many most frequent classes (``None``: all); at least 2.
        max_chars: cut texts to this many characters (``None``: no cut).
        balanced: cap every class at the size of the smallest kept class.
        per_class: cap every class at this many examples (seeded sample).
        seed: seeds the sampling and the final shuffle.
    """
    if max_classes is not None and (not isinstance(max_classes, int) or max_classes < 2):
        raise ValueError(f"max_classes must be an integer >= 2 or None, got {max_classes!r}")
    if max_chars is not None and (not isinstance(max_chars, int) or max_chars < 1):
        raise ValueError(f"max_chars must be a positive integer or None, got {max_chars!r}")
    if per_class is not None and (not isinstance(per_class, int) or per_class < 1):
        raise ValueError(f"per_class must be a positive integer or None, got {per_class!r}")
    raw = validate_pairs(pairs, what=what)
    cleaned = [(clean_text(text, max_chars), label) for text, label in raw]
    cleaned = [(text, label) for text, label in cleaned if text]

    labels_of: dict[str, set[str]] = defaultdict(set)
    for text, label in cleaned:
        labels_of[text].add(label)
    by_class: dict[str, list[str]] = defaultdict(list)
    kept: set[str] = set()
    for text, label in cleaned:  # first occurrence order: deterministic
        if len(labels_of[text]) == 1 and text not in kept:
            kept.add(text)
            by_class[label].append(text)
    if not by_class:
        raise ValueError(f"{what} is empty after cleaning and de-duplication")

    counts = Counter({label: len(texts) for label, texts in by_class.items()})
    classes = sorted(counts, key=lambda c: (-counts[c], c))
    if max_classes is not None:
        classes = classes[:max_classes]
    if len(classes) < 2:
        raise ValueError(
            f"{what} has a single class ({classes[0]!r}) after cleaning and de-duplication; "
            "in-context classification needs at least 2"
        )
    rng = random.Random(seed)
    cap = per_class
    if balanced:
        smallest = min(counts[c] for c in classes)
        cap = smallest if cap is None else min(cap, smallest)
    out: list[Pair] = []
    for label in sorted(classes):
        texts = by_class[label]
        if cap is not None and len(texts) > cap:
            texts = rng.sample(texts, cap)
        out.extend((text, label) for text in texts)
    rng.shuffle(out)
    return out


# ----------------------------------------------------------------------------------------------------------------
# WordNet supersenses (Debian wordnet-base)


def _missing(what: str, path: Path, install: str) -> ValueError:
    return ValueError(f"{what} not found at {path}; install it with `{install}` (or pass path=...)")


def read_wordnet(path: str | Path | None = None, parts: Sequence[str] = WORDNET_PARTS) -> list[Pair]:
    """All ``(gloss, lexfile name)`` pairs of WordNet's ``data.<part>`` files, unfiltered and in file order."""
    root = Path(path) if path is not None else WORDNET_DIR
    bad = [p for p in parts if p not in WORDNET_PARTS]
    if bad or not parts:
        raise ValueError(f"parts must be a non-empty subset of {WORDNET_PARTS}, got {tuple(parts)!r}")
    pairs: list[Pair] = []
    for part in parts:
        file = root / f"data.{part}"
        if not file.is_file():
            raise _missing("WordNet", file, "sudo apt-get install wordnet-base")
        with file.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  ") or " | " not in line:  # the license header lines start with 2 spaces
                    continue
                fields, gloss = line.split(" | ", 1)
                lexfile = int(fields.split(" ", 2)[1])
                if not 0 <= lexfile < len(LEXNAMES):
                    raise ValueError(f"{file}: lexicographer file number {lexfile} is not a standard lexname")
                pairs.append((gloss.strip(), LEXNAMES[lexfile]))
    return pairs


def load_wordnet(
    *,
    path: str | Path | None = None,
    parts: Sequence[str] = WORDNET_PARTS,
    **options,
) -> list[Pair]:
    """WordNet supersense classification: synset gloss → lexicographer file name (e.g. ``"noun.animal"``).

    ``path`` defaults to ``/usr/share/wordnet`` (Debian ``wordnet-base``); ``parts`` picks the parts of speech.
    ``options``: those of :func:`prepare_pairs` (``max_classes``, ``max_chars``, ``balanced``, ``per_class``,
    ``seed``).
    """
    return prepare_pairs(
        read_wordnet(path, parts),
        what="wordnet",
        **options,
    )


# ----------------------------------------------------------------------------------------------------------------
# fortunes (Debian fortunes)


def read_fortunes(path: str | Path | None = None) -> list[Pair]:
    """All ``(quote, category)`` pairs of a fortune directory, unfiltered, categories in name order.

    Only the plain files directly in the directory are read: the offensive ``off/`` subdirectory and the
    ``.dat`` (strfile index) and ``.u8`` files are skipped.
    """
    root = Path(path) if path is not None else FORTUNES_DIR
    if not root.is_dir():
        raise _missing("the fortunes database", root, "sudo apt-get install fortunes")
    files = sorted(
        p for p in root.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix not in (".dat", ".u8")
    )
    if not files:
        raise _missing("fortune category files", root, "sudo apt-get install fortunes")
    pairs: list[Pair] = []
    for file in files:
        quote: list[str] = []
        for line in [*file.read_text(encoding="utf-8", errors="replace").splitlines(), "%"]:
            if line.strip() == "%":
                if "".join(quote).strip():
                    pairs.append(("\n".join(quote), file.name))
                quote = []
            else:
                quote.append(line)
    return pairs


def load_fortunes(
    *,
    path: str | Path | None = None,
    **options,
) -> list[Pair]:
    """Fortune-cookie category classification: quote → category file name (e.g. ``"riddles"``).

    ``path`` defaults to ``/usr/share/games/fortunes`` (Debian ``fortunes``). Options: :func:`prepare_pairs`.
    """
    return prepare_pairs(
        read_fortunes(path),
        what="fortunes",
        **options,
    )


# ----------------------------------------------------------------------------------------------------------------
# chatterbot-corpus (PyPI)

CHATTERBOT_INSTALL = 'pip install --no-deps "chatterbot-corpus==1.3.3"'


def chatterbot_dir() -> Path:
    """``chatterbot_corpus/data/english`` of the installed PyPI package (found without importing it)."""
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the chatterbot corpus is not installed; install it with `{CHATTERBOT_INSTALL}`")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "english"


def read_chatterbot(path: str | Path | None = None) -> list[Pair]:
    """All ``(conversation, topic)`` pairs of a chatterbot-corpus language folder, topics in name order."""
    import yaml

    root = Path(path) if path is not None else chatterbot_dir()
    files = sorted(root.glob("*.yml")) if root.is_dir() else []
    if not files:
        raise _missing("chatterbot-corpus YAML files", root, CHATTERBOT_INSTALL)
    pairs: list[Pair] = []
    for file in files:
        data = yaml.safe_load(file.read_text(encoding="utf-8", errors="replace")) or {}
        conversations = data.get("conversations") if isinstance(data, dict) else None
        for conversation in conversations or []:
            turns = conversation if isinstance(conversation, list) else [conversation]
            text = " / ".join(str(t).strip() for t in turns if t is not None and str(t).strip())
            if text:
                pairs.append((text, file.stem))
    return pairs


def load_chatterbot(
    *,
    path: str | Path | None = None,
    **options,
) -> list[Pair]:
    """Chat-topic classification: a conversation (turns joined by ``" / "``) → its topic file (e.g. ``"food"``).

    ``path`` defaults to the installed PyPI ``chatterbot-corpus`` package's ``data/english`` folder
    (``pip install --no-deps chatterbot-corpus``). Options: :func:`prepare_pairs`.
    """
    return prepare_pairs(
        read_chatterbot(path),
        what="chatterbot",
        **options,
    )


_LOADERS = {"wordnet": load_wordnet, "fortunes": load_fortunes, "chatterbot": load_chatterbot}


def load_icl_dataset(dataset: str | Iterable[Pair], **options) -> list[Pair]:
    """``"wordnet"``, ``"fortunes"``, ``"chatterbot"`` (options: the loader's), or ``(text, label)`` pairs
    (options: :func:`prepare_pairs`'s)."""
    if isinstance(dataset, str):
        if dataset not in _LOADERS:
            raise ValueError(f"unknown ICL dataset {dataset!r}; choose one of {', '.join(DATASETS)} or pass pairs")
        return _LOADERS[dataset](**options)
    return prepare_pairs(dataset, **options)
