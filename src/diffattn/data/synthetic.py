"""Seeded synthetic retrieval tasks: multi-needle retrieval and MQAR (after Zoology), plus the training practice mix.

Pure generators (a seed in, the same sample out, on any machine) shared by training and by evaluation.

Multi-needle retrieval (DIFF Transformer, Ye et al. 2024, §3.4, after Needle-In-A-Haystack and RULER):
``N`` needle sentences ``"The special magic {key} number is: {number}."`` (a distinct city name per needle, a
distinct random 7-digit number) are inserted at sentence boundaries of a haystack text; ``R`` of them are
asked for. The first queried needle sits at the requested depth, the others (and the ``N - R`` distractors) at
random depths. Question: ``"What is the special magic {key} number?"`` for ``R = 1``;
``"What are the special magic numbers for {k1}, {k2} and {k3}?"`` for ``R > 1`` (keys joined by ``", "``, the
last by ``" and "``). Prompt template, exactly: ``context + "\\n" + question + "\\nAnswer:"``; the reference
continuation is ``" " + ", ".join(answers)``. Scoring is RULER's ``string_match_all``: the fraction of the
queried numbers that occur (case-insensitively) in the model output.

MQAR (multi-query associative recall, after Arora et al. 2023, Zoology ``multiquery_ar``): a block of
``num_pairs`` key–value pairs ``k1 v1 k2 v2 …`` (distinct keys from the lower half of a ``V``-token range,
distinct values from the upper half), then every key queried once more, in random order, at even offsets after the
block whose distances follow Zoology's power law (``power_a = 0.01``). Two differences from Zoology's generator:
each query is followed *in the input* by its value (teacher-forced, a language model's usual layout; Zoology's
input holds filler there and only the label holds the value), so a model can see which values were already asked —
the suite's floor counts that (``eval.mqar.HEURISTICS``: "a random value not asked yet", 0.34 at 8 pairs); and all
other positions hold one filler token, the range's token 0 (``token_offset``), where Zoology's default
(``random_non_queries=True``) draws random tokens, which would collide with keys and make a different, harder
task. Labels are aligned with ``input_ids`` as Hugging Face expects (it shifts them): ``labels[t] =
input_ids[t]`` where ``input_ids[t]`` is an answer value, ``-100`` everywhere else.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .packing import IGNORE_INDEX, PackedSequences, special_token_ids

if TYPE_CHECKING:  # annotations only: importing transformers costs seconds (`diffattn eval --help`)
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

NEEDLE_TEMPLATE = "The special magic {key} number is: {number}."
SINGLE_QUESTION_TEMPLATE = "What is the special magic {key} number?"
MULTI_QUESTION_TEMPLATE = "What are the special magic numbers for {keys}?"
# RULER's multi-value task (one key, several values; DiffLoRA Fig. 3 "MV"): every value is a needle of its own with
# the same template, and the question asks for all of them
MULTI_VALUE_QUESTION_TEMPLATE = "What are all the special magic {key} numbers?"
PROMPT_TEMPLATE = "{context}\n{question}\nAnswer:"
# Needle keys: single-word city names, none a substring of another, so a key is found only where it is meant.
CITY_KEYS: tuple[str, ...] = (
    "Amsterdam", "Athens", "Atlanta", "Auckland", "Bangkok", "Barcelona", "Beijing", "Berlin", "Bogota",
    "Boston", "Brussels", "Budapest", "Cairo", "Caracas", "Chicago", "Copenhagen", "Dallas", "Delhi",
    "Denver", "Dhaka", "Dublin", "Edinburgh", "Geneva", "Hamburg", "Havana", "Helsinki", "Houston",
    "Istanbul", "Jakarta", "Johannesburg", "Karachi", "Kyoto", "Lagos", "Lima", "Lisbon", "London",
    "Madrid", "Manila", "Melbourne", "Miami", "Montevideo", "Montreal", "Moscow", "Mumbai", "Munich",
    "Nairobi", "Oslo", "Paris", "Phoenix", "Prague", "Quito", "Reykjavik", "Santiago", "Seattle",
    "Seoul", "Shanghai", "Stockholm", "Sydney", "Tokyo", "Toronto", "Vancouver", "Warsaw", "Zurich",
)  # fmt: skip
# A sentence starts after '. ', '? ', '! ' or a newline; needles go only there.
_SENTENCE_END = re.compile(r"[.?!] |\n")
NEEDLE_LOSSES = ("all", "answer")  # which tokens of a needle practice row are scored (retrieval_mix)
MQAR_POWER_A = 0.01  # Zoology's train/test power_a: query distances follow p(d) ∝ d^(a-1)


# ---------------------------------------------------------------- multi-needle retrieval


@dataclass(frozen=True)
class NeedleSample:
    """One multi-needle retrieval sample; ``prompt`` is ``context + "\\n" + question + "\\nAnswer:"``."""

    context: str  # haystack with needles inserted
    question: str
    prompt: str
    answers: tuple[str, ...]  # the queried 7-digit numbers, in question order
    keys: tuple[str, ...]  # queried keys, in question order
    needles: tuple[tuple[str, str, int], ...]  # (key, number, char offset in context) of all N, in context order
    depth: float  # fraction of the haystack text before the first queried needle


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be an int {allowed}, got {value!r}")


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _sentence_starts(text: str) -> list[int]:
    """Positions where a sentence (or line) starts: 0, after every boundary, and len(text)."""
    return sorted({0, len(text), *(m.end() for m in _SENTENCE_END.finditer(text))})


def _window(rng: random.Random, haystack: str, context_chars: int) -> str:
    """``context_chars`` characters of the haystack from a seeded sentence start, cut back to a sentence end.

    A haystack shorter than the window is repeated (joined by newlines), as Needle-In-A-Haystack repeats its
    essays. A window without any sentence end inside is cut at exactly ``context_chars``.
    """
    if context_chars == 0 or not haystack.strip():
        return ""
    copies = 1 if len(haystack) >= context_chars else context_chars // (len(haystack) + 1) + 1
    text = "\n".join([haystack] * copies)  # at least context_chars characters
    # A seeded character position, moved forward to the next sentence start: linear in the window, not in the
    # haystack (a whole play), which matters when the training mix draws thousands of windows.
    latest = len(text) - context_chars
    start = rng.randrange(latest + 1)
    if start > 0:
        m = _SENTENCE_END.search(text, start)
        # No sentence start between here and the latest allowed one: take the line this position is on.
        start = m.end() if m is not None and m.end() <= latest else text.rfind("\n", 0, start) + 1
    while start < len(text) and text[start].isspace():  # begin at the sentence's first word, not blank lines
        start += 1
    end = start + context_chars
    window = text[start:end]
    last = max((m.end() for m in _SENTENCE_END.finditer(window)), default=0)
    return window[:last] if last > 0 else window


def _question(keys: Sequence[str]) -> str:
    if len(keys) == 1:
        return SINGLE_QUESTION_TEMPLATE.format(key=keys[0])
    return MULTI_QUESTION_TEMPLATE.format(keys=", ".join(keys[:-1]) + " and " + keys[-1])


def make_needle_sample(
    seed: int,
    haystack: str,
    *,
    num_needles: int = 1,
    num_queries: int = 1,
    depth: float | None = None,
    context_chars: int | None = None,
    value_digits: int = 7,
    values_per_key: int = 1,
) -> NeedleSample:
    """A multi-needle retrieval sample: ``num_needles`` needles in ``haystack``, ``num_queries`` of them asked.

    ``context_chars`` takes a seeded window of the haystack of (at most) that many characters, cut at
    sentence boundaries, before the needles go in; None keeps the whole haystack. ``depth`` in [0, 1] places
    the first queried needle at the sentence start nearest that fraction of the haystack text (None: random).
    ``value_digits`` is the length of the needle numbers (the papers: 7); shorter numbers (fewer tokens to copy) make
    a protocol that small models can learn in minutes.

    ``values_per_key`` V > 1 is RULER's multi-value task (DiffLoRA Fig. 3, "MV"): the one queried key (num_queries
    must be 1) has V needles, each with its own number, and the question asks for all V; the other N − V needles
    are distractors with keys of their own (our choice: without them every number in the context is an answer and
    a model that copies any needles scores full marks). ``answers`` are the V numbers in context order.
    """
    _check_seed(seed)
    if not isinstance(haystack, str):
        raise ValueError(f"haystack must be a str, got {type(haystack).__name__}")
    _check_int("num_needles", num_needles, 1, len(CITY_KEYS))
    if isinstance(num_queries, bool) or not isinstance(num_queries, int) or not 1 <= num_queries <= num_needles:
        raise ValueError(f"num_queries must be an int in [1, num_needles={num_needles}], got {num_queries!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int | float) or not 0 <= depth <= 1):
        raise ValueError(f"depth must be None or a number in [0, 1], got {depth!r}")
    if context_chars is not None:
        _check_int("context_chars", context_chars, 0)
    _check_int("value_digits", value_digits, 1, 18)
    _check_int("values_per_key", values_per_key, 1, num_needles)
    if values_per_key > 1 and num_queries != 1:
        raise ValueError(f"a multi-value sample (values_per_key={values_per_key}) asks one key: num_queries must be 1")
    lo, hi = 10 ** (value_digits - 1), 10**value_digits - 1
    if hi - lo + 1 < num_needles:
        raise ValueError(f"value_digits={value_digits} gives fewer distinct numbers than num_needles={num_needles}")

    rng = random.Random(seed)
    if values_per_key == 1:
        keys = rng.sample(CITY_KEYS, num_needles)  # the first num_queries are the queried ones, in question order
    else:  # the queried key's V needles first, then N − V distractors with keys of their own
        distinct = rng.sample(CITY_KEYS, num_needles - values_per_key + 1)
        keys = [distinct[0]] * values_per_key + distinct[1:]
    numbers: list[str] = []
    while len(numbers) < num_needles:  # distinct numbers, so string_match_all cannot be fooled by a duplicate
        n = str(rng.randint(lo, hi))
        if n not in numbers:
            numbers.append(n)
    depths = [float(depth) if depth is not None else rng.random()] + [rng.random() for _ in range(num_needles - 1)]
    # The window has its own stream, so keys, numbers and depths do not change with context_chars.
    window_rng = random.Random(rng.getrandbits(64))
    window = haystack if context_chars is None else _window(window_rng, haystack, context_chars)

    starts = _sentence_starts(window)
    size = len(window)

    def nearest_start(d: float) -> int:
        return min(starts, key=lambda s: (abs(s - d * size), s))

    # (position in the window, needle index), needles at one sentence start in random order: short haystacks have
    # few sentence starts, and a fixed order (the queried needle first, as before) let "copy the first needle" beat
    # 1/N (0.35 of N = 4 prompts). Its own stream, so keys, numbers, depths and the window do not change.
    tie_rng = random.Random(rng.getrandbits(64))
    ties = [tie_rng.random() for _ in depths]
    placements = [(pos, i) for pos, _, i in sorted((nearest_start(d), ties[i], i) for i, d in enumerate(depths))]
    context, offsets = _insert_needles(window, placements, keys, numbers)

    if values_per_key == 1:
        question, answers = _question(keys[:num_queries]), tuple(numbers[:num_queries])
    else:
        question = MULTI_VALUE_QUESTION_TEMPLATE.format(key=keys[0])
        answers = tuple(numbers[i] for i in sorted(range(values_per_key), key=lambda i: offsets[i]))
    first_pos = placements[[i for _, i in placements].index(0)][0]
    return NeedleSample(
        context=context,
        question=question,
        prompt=PROMPT_TEMPLATE.format(context=context, question=question),
        answers=answers,
        keys=tuple(keys[:num_queries]),
        needles=tuple(sorted(((keys[i], numbers[i], offsets[i]) for i in range(num_needles)), key=lambda n: n[2])),
        depth=first_pos / size if size else 0.0,
    )


def _insert_needles(
    window: str, placements: list[tuple[int, int]], keys: list[str], numbers: list[str]
) -> tuple[str, list[int]]:
    """``window`` with needle ``i`` inserted at each ``(position, i)`` of ``placements`` (sorted), each a sentence of
    its own; returns the context and each needle's character offset in it."""
    parts: list[str] = []
    length = 0
    offsets = [0] * len(keys)
    cursor = 0

    def emit(s: str) -> None:
        nonlocal length
        parts.append(s)
        length += len(s)

    for pos, i in placements:
        if pos > cursor:
            emit(window[cursor:pos])
            cursor = pos
        if parts and not parts[-1][-1:].isspace():
            emit(" ")  # keep the needle a sentence of its own
        offsets[i] = length
        emit(NEEDLE_TEMPLATE.format(key=keys[i], number=numbers[i]))
        if cursor < len(window) and not window[cursor].isspace():
            emit(" ")
    emit(window[cursor:])
    return "".join(parts), offsets


def needle_answer_text(sample: NeedleSample) -> str:
    """The reference continuation of ``sample.prompt``: ``" " + ", ".join(answers)``."""
    return " " + ", ".join(sample.answers)


def score_first_numbers(output: str, answers: Sequence[str]) -> float:
    """Strict score: the fraction of ``answers`` among the first ``len(answers)`` numbers of ``output`` (a run of
    digits each). Unlike RULER's ``string_match_all`` it gives no credit for listing extra numbers: with short
    needle numbers a model that writes every needle's number would otherwise score ~R/N by chance."""
    if not isinstance(output, str):
        raise ValueError(f"output must be a str, got {type(output).__name__}")
    if isinstance(answers, str) or len(answers) == 0:
        raise ValueError(f"answers must be a non-empty sequence of strings, got {answers!r}")
    first = re.findall(r"\d+", output)[: len(answers)]
    return len(set(first) & {str(a) for a in answers}) / len(answers)


def score_string_match_all(output: str, answers: Sequence[str]) -> float:
    """RULER ``string_match_all``: the fraction of ``answers`` found (case-insensitively) in ``output``."""
    if not isinstance(output, str):
        raise ValueError(f"output must be a str, got {type(output).__name__}")
    if isinstance(answers, str) or len(answers) == 0:
        raise ValueError(f"answers must be a non-empty sequence of strings, got {answers!r}")
    out = output.lower()
    return sum(str(a).lower() in out for a in answers) / len(answers)


def needle_vocabulary_text(value_digits: int = 7, *, seed: int = 0, count: int = 20000) -> list[str]:
    """Needle prompts with their answers (no haystack), for training a tokenizer that knows the protocol's words.

    A BPE trained on a haystack corpus alone splits "special", "magic", the city keys and every digit of the
    numbers into pieces (Shakespeare: 4 tokens for " special magic", one per digit), so a small model has to copy
    several tokens per answer. Adding these texts to the tokenizer's training text makes the template words, the
    keys and (for ``value_digits`` <= 2) every number single tokens, as they are for a real LM's tokenizer:
    measured with Shakespeare and a 2048-token BPE, 20,000 texts make all 90 two-digit numbers and all 63 keys
    single tokens (4,000 texts were enough at 4096 tokens, not at 2048).
    """
    _check_int("value_digits", value_digits, 1, 18)
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randint(1, min(6, len(CITY_KEYS)))
        sample = make_needle_sample(
            seed * 1_000_003 + i, "", num_needles=n, num_queries=rng.randint(1, min(n, 2)), value_digits=value_digits
        )
        out.append(sample.prompt + needle_answer_text(sample))
    return out


# ---------------------------------------------------------------- MQAR


@dataclass(frozen=True)
class MQARSample:
    """One MQAR sequence; ``labels[t]`` is the answer value at answer positions, -100 elsewhere."""

    input_ids: list[int]
    labels: list[int]
    pairs: tuple[tuple[int, int], ...]  # (key, value) in block order


def make_mqar_sample(seed: int, *, vocab_size: int, seq_len: int, num_pairs: int, token_offset: int = 0) -> MQARSample:
    """An MQAR sequence (after Zoology; the module doc says how ours differs) of exactly ``seq_len`` tokens over
    ``[token_offset, token_offset + vocab_size)``.

    Keys come from ``[token_offset + 1, token_offset + V/2)``, values from ``[token_offset + V/2,
    token_offset + V)`` (``V = vocab_size``, ``V/2`` rounded down); ``token_offset`` itself is the filler.
    Needs ``seq_len >= 4·num_pairs`` (the block, plus a query–answer slot per pair).
    """
    _check_seed(seed)
    _check_int("num_pairs", num_pairs, 1)
    _check_int("token_offset", token_offset, 0)
    # num_pairs distinct keys from [1, V/2) and values from [V/2, V) need V >= 2·num_pairs + 2.
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2 * num_pairs + 2:
        raise ValueError(
            f"vocab_size must be an int >= 2·num_pairs + 2 = {2 * num_pairs + 2} (distinct keys and values), "
            f"got {vocab_size!r}"
        )
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 4 * num_pairs:
        raise ValueError(
            f"seq_len must be an int >= 4·num_pairs = {4 * num_pairs} (the key-value block plus a query and "
            f"its answer per pair), got {seq_len!r}"
        )
    half = vocab_size // 2

    rng = random.Random(seed)
    keys = rng.sample(range(token_offset + 1, token_offset + half), num_pairs)
    values = rng.sample(range(token_offset + half, token_offset + vocab_size), num_pairs)
    block = 2 * num_pairs
    slots = (seq_len - block) // 2  # query at block + 2s, its value at block + 2s + 1
    # Weighted sampling without replacement (Efraimidis–Spirakis) of Zoology's power law over the slots:
    # each slot s gets key log(u)/w_s and the num_pairs largest win; w_s ∝ (s+1)^(a-1) favours short distances.
    weights = [(s + 1) ** (MQAR_POWER_A - 1) for s in range(slots)]
    ranked = sorted(range(slots), key=lambda s: math.log(1.0 - rng.random()) / weights[s], reverse=True)
    chosen = sorted(ranked[:num_pairs])
    order = rng.sample(range(num_pairs), num_pairs)  # which pair is asked at each chosen slot

    input_ids = [token_offset] * seq_len
    labels = [IGNORE_INDEX] * seq_len
    for j, (k, v) in enumerate(zip(keys, values, strict=True)):
        input_ids[2 * j], input_ids[2 * j + 1] = k, v
    for slot, j in zip(chosen, order, strict=True):
        q = block + 2 * slot
        input_ids[q], input_ids[q + 1] = keys[j], values[j]
        labels[q + 1] = values[j]  # HF shifts: predicted from the query key at q
    return MQARSample(input_ids=input_ids, labels=labels, pairs=tuple(zip(keys, values, strict=True)))


# ---------------------------------------------------------------- training practice mix


def _mqar_args(
    tokenizer: PreTrainedTokenizerBase, seq_len: int, sep_id: int, pad_id: int, mqar_vocab: int | None = None
) -> dict[str, int]:
    """MQAR settings for a tokenizer: range past the specials and 256 byte tokens, below any later special (its
    first ``mqar_vocab`` tokens when given)."""
    specials = {int(i) for i in tokenizer.all_special_ids} | {sep_id, pad_id}
    offset = len(specials) + 256
    vocab = len(tokenizer)
    span = min([i for i in specials if i >= offset], default=vocab) - offset
    if mqar_vocab is not None:
        if mqar_vocab > span:
            raise ValueError(f"mqar_vocab {mqar_vocab} is more than the tokenizer's {span} ordinary tokens")
        span = mqar_vocab
    num_pairs = min(max(2, seq_len // 16), seq_len // 4, span // 2 - 1)
    if num_pairs < 1:
        raise ValueError(
            f"tokenizer has {vocab} tokens, too few for MQAR rows above its {offset} special and byte tokens; "
            "use a larger vocab_size"
        )
    return {"vocab_size": span, "num_pairs": num_pairs, "token_offset": offset}


def retrieval_mix(
    seed: int,
    count: int,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    haystack_docs: Sequence[str],
    *,
    mqar_fraction: float = 0.5,
    max_needles: int = 4,
    value_digits: int = 7,
    needle_loss: str = "all",
    varied_context: bool = False,
    mqar_pairs: Sequence[int] | None = None,
    mqar_vocab: int | None = None,
    needle_questions: int = 1,
) -> PackedSequences:
    """``count`` rows of ``seq_len`` tokens of retrieval practice: ``round(mqar_fraction·count)`` MQAR rows.

    MQAR rows: :func:`make_mqar_sample` with ``token_offset = #specials + 256`` and the rest of the vocabulary
    (below any later special token) as its range, ``num_pairs = max(2, seq_len // 16)`` (capped to fit);
    ``mqar_pairs``: each MQAR row's pair count drawn from these instead (few-pair rows teach the key lookup with few
    distractors, as ``varied_context`` does for needles); ``mqar_vocab``: keys and values from the range's first
    ``mqar_vocab`` tokens only (the evaluation's ``mqar_vocab`` must match).
    Needle rows: ``prompt + " " + ", ".join(answers) + SEPARATOR`` of a :func:`make_needle_sample` over a
    random document of ``haystack_docs``, with ``N`` in [1, max_needles] and ``R`` in [1, min(N, 2)]; the
    context starts at ~3 characters per token (refined as rows are measured) and shrinks until the row fits,
    then ``N`` is lowered if even an empty context does not fit; short rows are padded at the end. A needle
    row that cannot fit at all (one needle, no haystack: ~75 tokens with a 512-token vocabulary) becomes an
    MQAR row, with a warning, so small test settings still work. The prompt and the answer are tokenized
    separately, as the evaluation sees them (the prompt alone, then the model's continuation). ``needle_loss``:
    ``"all"`` trains needle rows with plain LM loss on every real token (labels = input_ids: the rest is ordinary
    text), ``"answer"`` only on the answer tokens and the closing separator (as MQAR rows are): the whole gradient
    of the row then goes to retrieval, which small models learn far sooner. ``value_digits``: the needle numbers'
    length (:func:`make_needle_sample`). ``varied_context``: each needle row's haystack is a uniform fraction of the
    row instead of filling it, so the rows range from needles and question alone to a full haystack (short rows teach
    the lookup with few distractors, which small models learn far sooner). Row kinds are shuffled; everything
    follows from ``seed``. ``needle_questions`` Q > 1: after its answer, a needle row asks up to Q − 1 more
    questions, one needle each among those not yet asked (``"\n" + question + "\nAnswer:"``, then the number and the
    separator, each answer scored as the first one is), so a row trains the lookup up to Q times, as an MQAR row
    trains it once per pair; the evaluation's prompts still ask one question.
    """
    _check_mix_options(seed, count, seq_len, max_needles, mqar_fraction, haystack_docs, needle_loss, value_digits)
    _check_int("needle_questions", needle_questions, 1, max_needles)
    if mqar_pairs is not None:
        if not mqar_pairs or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in mqar_pairs):
            raise ValueError(f"mqar_pairs must be a non-empty list of positive ints, got {mqar_pairs!r}")
        if 4 * max(mqar_pairs) > seq_len:
            raise ValueError(f"mqar_pairs {max(mqar_pairs)} does not fit seq_len {seq_len} (needs 4·pairs)")
    n_mqar = round(mqar_fraction * count)
    docs = [d for d in haystack_docs if d.strip()]
    if n_mqar < count and not docs:
        raise ValueError("haystack_docs has no text; needle rows need haystack documents (or use mqar_fraction=1)")
    sep_id, pad_id = special_token_ids(tokenizer)

    rng = random.Random(seed)
    kinds = ["mqar"] * n_mqar + ["needle"] * (count - n_mqar)
    rng.shuffle(kinds)
    row_seeds = [rng.getrandbits(63) for _ in range(count)]

    input_ids = torch.full((count, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((count, seq_len), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((count, seq_len), dtype=torch.long)
    mqar_args: dict[str, int] | None = None
    chars_per_token = 3.0  # first guess; refined from every needle row that is measured
    too_long: list[int] = []
    for row, (kind, row_seed) in enumerate(zip(kinds, row_seeds, strict=True)):
        if kind == "needle":
            ids, answer_spans, chars_per_token = _needle_row(
                row_seed, tokenizer, seq_len, docs, max_needles, sep_id, chars_per_token, value_digits,
                varied_context, needle_questions,
            )  # fmt: skip
            if len(ids) <= seq_len:
                input_ids[row, : len(ids)] = torch.tensor(ids)
                for start, end in [(0, len(ids))] if needle_loss == "all" else answer_spans:
                    labels[row, start:end] = torch.tensor(ids[start:end])
                attention_mask[row, : len(ids)] = 1
                continue
            too_long.append(len(ids))  # an MQAR row instead of a needle row cut short
        if mqar_args is None:
            mqar_args = _mqar_args(tokenizer, seq_len, sep_id, pad_id, mqar_vocab)
            if mqar_pairs is not None and 2 * max(mqar_pairs) + 2 > mqar_args["vocab_size"]:
                raise ValueError(f"mqar_pairs {max(mqar_pairs)} needs {2 * max(mqar_pairs) + 2} MQAR tokens")
        pairs = mqar_args["num_pairs"] if mqar_pairs is None else mqar_pairs[row_seed % len(mqar_pairs)]
        s = make_mqar_sample(row_seed, seq_len=seq_len, **{**mqar_args, "num_pairs": pairs})
        input_ids[row] = torch.tensor(s.input_ids)
        labels[row] = torch.tensor(s.labels)
        attention_mask[row] = 1
    if too_long:
        _warn_needle_rows_too_long(too_long, count - n_mqar, seq_len)
    num_tokens = int(attention_mask.sum())
    n_mqar += len(too_long)
    logger.info("retrieval mix: %d rows (%d MQAR, %d needle), %d tokens", count, n_mqar, count - n_mqar, num_tokens)
    return PackedSequences(input_ids=input_ids, labels=labels, attention_mask=attention_mask, num_tokens=num_tokens)


def _check_mix_options(
    seed, count, seq_len, max_needles, mqar_fraction, haystack_docs, needle_loss, value_digits
) -> None:
    _check_seed(seed)
    _check_int("count", count, 1)
    _check_int("seq_len", seq_len, 8)
    _check_int("max_needles", max_needles, 1, len(CITY_KEYS))
    if isinstance(mqar_fraction, bool) or not isinstance(mqar_fraction, int | float) or not 0 <= mqar_fraction <= 1:
        raise ValueError(f"mqar_fraction must be a number in [0, 1], got {mqar_fraction!r}")
    if isinstance(haystack_docs, str):
        raise ValueError("haystack_docs must be a sequence of document strings, got a single str")
    if needle_loss not in NEEDLE_LOSSES:
        raise ValueError(f"needle_loss must be one of {', '.join(NEEDLE_LOSSES)}, got {needle_loss!r}")
    _check_int("value_digits", value_digits, 1, 18)


def _warn_needle_rows_too_long(too_long: list[int], needle_rows: int, seq_len: int) -> None:
    logger.warning(
        "retrieval mix: %d of %d needle rows do not fit in seq_len=%d (one needle, its question and answer "
        "take up to %d tokens with this tokenizer); they are MQAR rows instead",
        len(too_long),
        needle_rows,
        seq_len,
        max(too_long),
    )


def _needle_row(
    seed: int,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    docs: Sequence[str],
    max_needles: int,
    sep_id: int,
    chars_per_token: float,
    value_digits: int = 7,
    varied_context: bool = False,
    questions: int = 1,
) -> tuple[list[int], list[tuple[int, int]], float]:
    """Token ids of one needle row (longer than ``seq_len`` only if nothing fits), the [start, end) spans of its
    answers with their separators (what ``needle_loss="answer"`` scores), and the updated characters-per-token
    estimate. ``questions``: how many questions the row asks (:func:`retrieval_mix`'s ``needle_questions``)."""
    rng = random.Random(seed)
    haystack = docs[rng.randrange(len(docs))]
    num_needles = rng.randint(1, max_needles)
    num_queries = rng.randint(1, min(num_needles, 2))
    depth = rng.random()
    sample_seed = rng.getrandbits(63)
    fill = rng.random() if varied_context else 1.0  # drawn only when varied: full rows draw as without the option
    # the follow-up questions' order: its own stream, drawn only when asked for (rows without them are unchanged)
    follow_seed = rng.getrandbits(63) if questions > 1 else None
    context_chars = int(seq_len * chars_per_token * fill)
    while True:
        sample = make_needle_sample(
            sample_seed,
            haystack,
            num_needles=num_needles,
            num_queries=num_queries,
            depth=depth,
            context_chars=context_chars,
            value_digits=value_digits,
        )
        prompt = tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(needle_answer_text(sample), add_special_tokens=False)["input_ids"]
        ids = [*prompt, *answer, sep_id]
        spans = [(len(prompt), len(ids))]
        if len(sample.context) > 200:  # long enough for a stable ratio
            chars_per_token = 0.8 * chars_per_token + 0.2 * len(sample.prompt + needle_answer_text(sample)) / len(ids)
        if follow_seed is not None:  # the same order at every retry: the keys do not change with the context
            ids = _follow_up_questions(ids, spans, sample, tokenizer, sep_id, questions, random.Random(follow_seed))
        if len(ids) <= seq_len:
            return ids, spans, chars_per_token
        if context_chars > 0:
            # Shrink in proportion to the overshoot, a little more, so that one retry usually suffices.
            context_chars = max(0, min(context_chars - 1, int(context_chars * seq_len / len(ids) * 0.95)))
        elif len(spans) > 1:  # follow-up questions go before needles do
            questions = len(spans) - 1
        elif num_needles > 1:
            num_needles -= 1
            num_queries = min(num_queries, num_needles)
        else:
            return ids, spans, chars_per_token


def _follow_up_questions(ids, spans, sample, tokenizer, sep_id, questions, rng) -> list[int]:
    """``ids`` with up to ``questions − 1`` single-needle questions and their answers appended, about needles of
    ``sample`` not yet asked, in ``rng``'s order; each answer's [start, end) span (separator included) added to
    ``spans``."""
    asked = set(sample.keys)
    others = [(key, number) for key, number, _ in sample.needles if key not in asked]
    rng.shuffle(others)
    ids = list(ids)
    for key, number in others[: questions - 1]:
        question = "\n" + SINGLE_QUESTION_TEMPLATE.format(key=key) + "\nAnswer:"
        ids += tokenizer(question, add_special_tokens=False)["input_ids"]
        start = len(ids)
        ids += [*tokenizer(" " + number, add_special_tokens=False)["input_ids"], sep_id]
        spans.append((start, len(ids)))
    return ids
