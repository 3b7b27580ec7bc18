"""Many-shot in-context learning (DIFF Transformer Fig. 6–7; Dex Table 3; Bertsch et al. 2024): the offline data
loaders (WordNet supersenses, fortunes, chatterbot-corpus), the docs/evaluation.md §7.2 prompt, constrained decoding
over a label token trie (labels sharing prefixes included), many-shot accuracy and order robustness on a tiny random
Llama with a BPE tokenizer trained in the test. Torch runs single-threaded here: on a busy 2-core machine the tiny
model is ~50x faster that way."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from diffattn.data import load_corpus, train_tokenizer
from diffattn.eval.icl import (
    LabelTrie,
    PromptFormat,
    PromptTokens,
    arrange_demos,
    arrangement_order,
    build_prompt,
    default_shot_grid,
    max_shots,
    order_margin,
    plot_icl,
    plot_order_robustness,
    run_icl,
    run_order_robustness,
)
from diffattn.eval.icl.decoding import _Runner
from diffattn.eval.icl.many_shot import HEURISTICS, heuristic_scores
from diffattn.eval.icl_data import (
    LEXNAMES,
    clean_text,
    load_chatterbot,
    load_fortunes,
    load_icl_dataset,
    load_wordnet,
    prepare_pairs,
    read_fortunes,
    read_wordnet,
)
from diffattn.eval.stats import rows_variance
from diffattn.models.build import build_model

from ..tiny_models import CONFIGS, tiny_config

WORDS = [
    "the",
    "cat",
    "cats",
    "catalog",
    "dog",
    "dogs",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "ran",
    "to",
    "see",
    "bird",
    "fish",
    "tree",
    "house",
    "red",
    "blue",
    "green",
    "small",
    "big",
]
LABELS = ["cat", "cats", "catalog", "dog"]  # " cat" is a token prefix of " cats" and " catalog"
WORDNET = Path("/usr/share/wordnet/data.noun")
FORTUNES = Path("/usr/share/games/fortunes")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("icl_corpus")
    rng = random.Random(0)
    for i in range(24):
        lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(12)]
        (root / f"doc{i:02d}.txt").write_text("\n".join(lines))
    return train_tokenizer(load_corpus(root), 300, cache_dir=tmp_path_factory.mktemp("icl_tok"))


def _model(tokenizer, seed=0, positions=256):
    torch.manual_seed(seed)
    config = tiny_config(
        "llama", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, max_position_embeddings=positions
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return _model(tokenizer)


def _pairs(n=48, seed=0):
    rng = random.Random(seed)
    return [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))), LABELS[i % 4]) for i in range(n)]


# ----------------------------------------------------------------------------------------------------------------
# prompt and tokenisation


def test_prompt_string_is_evaluation_md_format():
    demos = [("a b", "x"), ("c", "y")]
    assert build_prompt(demos, "q") == "Input: a b\nLabel: x\n==\nInput: c\nLabel: y\n==\nInput: q\nLabel: "
    fmt = PromptFormat(x_prefix="Q: ", y_prefix="A:")
    assert build_prompt(demos[:1], "q", fmt) == "Q: a b\nA:x\n==\nQ: q\nA:"
    with pytest.raises(ValueError, match="separator"):
        PromptFormat(separator="")


def test_prompt_tokens_round_trip_and_shared_prefix_labels(tokenizer):
    tokens = PromptTokens(tokenizer, PromptFormat(), LABELS)
    demos = [("the cat sat", "cat"), ("a big dog", "dog")]
    for label in LABELS:
        assert tokens.round_trip(demos, "small fish", label)
    # the pieces' label tokens are exactly the decoder's; the space of "Label: " lives in the label's first token
    assert tokenizer.decode(tokens.label_ids["cats"]) == " cats"
    assert tokens.label_ids["cats"][: len(tokens.label_ids["cat"])] == tokens.label_ids["cat"]  # a shared prefix
    assert tokens.trie.end_token == tokens.sep[0]
    assert tokens.demos([("x", "dog")])[0][-len(tokens.label_ids["dog"]) :] == tokens.label_ids["dog"]


# ----------------------------------------------------------------------------------------------------------------
# the label trie


def _trie():
    # "cat"=[5], "cats"=[5, 7], "catalog"=[5, 8, 9], "car"=[5, 8, 3], "dog"=[6]; end token 1
    return LabelTrie({"cat": [5], "cats": [5, 7], "catalog": [5, 8, 9], "car": [5, 8, 3], "dog": [6]}, end_token=1)


def _scripted(preferred: list[int], vocab=12):
    """Logits that put the maximum on preferred[i] at step i (and noise elsewhere)."""
    calls = []

    def logits_at(i):
        g = torch.Generator().manual_seed(i)
        out = torch.randn(vocab, generator=g)
        if i < len(preferred):
            out[preferred[i]] = 10.0
        return out

    def step(token):
        calls.append(token)
        return logits_at(len(calls))

    return logits_at(0), step, calls


def test_trie_can_reach_every_label_with_shortest_unique_prefixes():
    trie = _trie()
    for label, preferred in {
        "cat": [5, 1],
        "cats": [5, 7],
        "catalog": [5, 8, 9],
        "car": [5, 8, 3],
        "dog": [6],
    }.items():
        logits, step, calls = _scripted(preferred)
        assert trie.decode(logits, step) == label
        # one forward per step that still leaves a choice: never after the token that makes the label unique
        assert calls == preferred[:-1]
    assert trie.allowed(trie.root) == [5, 6]
    assert trie.allowed(trie.root.children[5]) == [7, 8, 1]  # children, then "the label ends here"


def test_trie_decoding_only_emits_labels_under_random_logits():
    trie = _trie()
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        logits = torch.randn(12, generator=gen) * 5
        seen.add(trie.decode(logits, lambda _t: torch.randn(12, generator=gen) * 5))
    assert seen == {"cat", "cats", "catalog", "car", "dog"}


def test_trie_refuses_ambiguous_labels():
    with pytest.raises(ValueError, match="same tokens"):
        LabelTrie({"a": [1, 2], "b": [1, 2]}, end_token=0)
    with pytest.raises(ValueError, match="token prefix"):
        LabelTrie({"cat": [1], "cats": [1, 2]})
    with pytest.raises(ValueError, match="also a label token"):
        LabelTrie({"cat": [1], "cats": [1, 2]}, end_token=2)
    with pytest.raises(ValueError, match="at least 2"):
        LabelTrie({"cat": [1]})


def test_constrained_decoding_on_tiny_models_only_emits_labels(tokenizer):
    tokens = PromptTokens(tokenizer, PromptFormat(), LABELS)
    gen = torch.Generator().manual_seed(0)
    prefix = tokens.prefix(tokens.demos(_pairs(6)))
    queries = [torch.randint(0, len(tokenizer), (int(n),), generator=gen).tolist() for n in range(1, 9)]
    seen = set()
    for seed in range(3):
        model = _model(tokenizer, seed)
        with torch.inference_mode():
            shared = _Runner(model, share_prefix=True).predict(tokens.trie, prefix, queries)
            alone = _Runner(model, share_prefix=False).predict(tokens.trie, prefix, queries)
        assert shared == alone  # the shared demo cache changes nothing
        assert set(shared) <= set(LABELS)
        seen |= set(shared)
    assert seen  # something was decoded


@pytest.mark.parametrize("kind", ["gpt2", "mistral", "gemma3_text", "diff"])
def test_shared_demo_cache_equals_full_recompute(tokenizer, kind):
    """The demos' KV cache is rolled back (crop) or copied (sliding-window layers) between test items."""
    if kind == "diff":  # our DIFF Transformer (DiffLlama with differential attention)
        model = build_model("debug", "diff", seed=0, vocab_size=len(tokenizer)).eval()
    else:
        config = CONFIGS[kind]()
        config.vocab_size, config.max_position_embeddings = len(tokenizer), 256
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    tokens = PromptTokens(tokenizer, PromptFormat(), LABELS)
    prefix = tokens.prefix(tokens.demos(_pairs(3)))  # longer than the sliding windows (32)
    assert len(prefix) > 32
    queries = tokens.queries(["the cat", "a big dog sat", "red"])
    with torch.inference_mode():
        shared = _Runner(model, share_prefix=True).predict(tokens.trie, prefix, queries)
        alone = _Runner(model, share_prefix=False).predict(tokens.trie, prefix, queries)
    assert shared == alone and set(shared) <= set(LABELS)


# ----------------------------------------------------------------------------------------------------------------
# data


def test_prepare_pairs_validates_and_is_deterministic():
    with pytest.raises(ValueError, match="empty"):
        prepare_pairs([])
    with pytest.raises(ValueError, match="single class"):
        prepare_pairs([("a", "x"), ("b", "x")])
    with pytest.raises(ValueError, match="identical after normalisation"):
        prepare_pairs([("a", "Cat"), ("b", "cat ")])
    with pytest.raises(ValueError, match="empty label"):
        prepare_pairs([("a", " "), ("b", "x")])
    with pytest.raises(ValueError, match="single class"):  # two classes, but one only had an ambiguous text
        prepare_pairs([("a", "x"), ("b", "x"), ("a", "y")])
    pairs = [(f"text  {i}\nline", "x" if i % 3 else "y") for i in range(30)] + [("dup", "x"), ("dup", "x")]
    a = prepare_pairs(pairs, seed=1)
    assert a == prepare_pairs(pairs, seed=1) and a != prepare_pairs(pairs, seed=2)
    assert ("text 1 line", "x") in a and sum(t == "dup" for t, _ in a) == 1  # cleaned, de-duplicated
    balanced = prepare_pairs(pairs, balanced=True)
    assert sum(y == "x" for _, y in balanced) == sum(y == "y" for _, y in balanced) == 10
    assert {y for _, y in prepare_pairs([*pairs, ("z1", "z")], max_classes=2)} == {"x", "y"}
    assert clean_text("abcdefghij klm", max_chars=12) == "abcdefghij"
    assert clean_text("one two three", max_chars=9) == "one two t"
    assert load_icl_dataset(pairs, seed=1) == a
    with pytest.raises(ValueError, match="unknown ICL dataset"):
        load_icl_dataset("trec")


@pytest.mark.skipif(not WORDNET.is_file(), reason="Debian wordnet-base is not installed (/usr/share/wordnet)")
def test_wordnet_supersenses():
    raw = read_wordnet(parts=("noun",))
    assert ("that which is perceived or known or inferred to have its own distinct existence (living or nonliving)",
            "noun.Tops") in raw  # fmt: skip
    pairs = load_wordnet(parts=("verb",), max_classes=3, per_class=10, seed=0)
    assert len(pairs) == 30 and {y for _, y in pairs} <= set(LEXNAMES)
    assert all(y.startswith("verb.") and t and "\n" not in t for t, y in pairs)
    assert pairs == load_wordnet(parts=("verb",), max_classes=3, per_class=10, seed=0)


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="Debian fortunes is not installed (/usr/share/games/fortunes)")
def test_fortunes_categories():
    pairs = load_fortunes(max_classes=3, balanced=True, max_chars=120)
    counts = Counter(y for _, y in pairs)
    assert len(counts) == 3 and len(set(counts.values())) == 1
    assert all(len(t) <= 120 and "\n" not in t for t, _ in pairs)
    assert all((FORTUNES / y).is_file() and "." not in y for y in counts)


def test_fortune_files_are_split_on_percent_lines_skipping_indexes(tmp_path):
    (tmp_path / "riddles").write_text("Q: one\nA: two\n%\nthree\n%\n")
    (tmp_path / "riddles.dat").write_bytes(b"\x00\x01")
    (tmp_path / "riddles.u8").write_text("ignored\n%\n")
    (tmp_path / "off").mkdir()
    (tmp_path / "off" / "rude").write_text("never read\n%\n")
    (tmp_path / "art").write_text("a picture")
    assert read_fortunes(tmp_path) == [("a picture", "art"), ("Q: one\nA: two", "riddles"), ("three", "riddles")]
    expected = [("Q: one A: two", "riddles"), ("a picture", "art"), ("three", "riddles")]
    assert sorted(load_fortunes(path=tmp_path)) == expected


def test_chatterbot_topics_and_missing_data_errors(tmp_path):
    english = tmp_path / "english"
    english.mkdir()
    (english / "food.yml").write_text("categories:\n- food\nconversations:\n- - do you eat\n  - I do not\n- - pie?\n")
    (english / "greetings.yml").write_text("conversations:\n- - Hello\n  - Hi\n")
    assert sorted(load_chatterbot(path=english)) == [
        ("Hello / Hi", "greetings"),
        ("do you eat / I do not", "food"),
        ("pie?", "food"),
    ]
    with pytest.raises(ValueError, match="chatterbot-corpus"):
        load_chatterbot(path=tmp_path / "nothing")
    with pytest.raises(ValueError, match="wordnet-base"):
        load_wordnet(path=tmp_path)
    with pytest.raises(ValueError, match="apt-get install fortunes"):
        load_fortunes(path=tmp_path / "nothing")


def test_installed_chatterbot_corpus():
    try:
        pairs = load_chatterbot(max_classes=3)
    except ValueError as err:
        pytest.skip(f"chatterbot-corpus is not installed ({err})")
    assert len({y for _, y in pairs}) == 3


# ----------------------------------------------------------------------------------------------------------------
# shots, arrangements, margins


def test_max_shots_and_grid():
    assert max_shots([10] * 100, budget=110, sep_len=1) == 10  # no spread: k·(10 + 1) ≤ 110
    assert max_shots([10] * 5, budget=1000, sep_len=1) == 5  # capped at the pool
    assert max_shots([5, 15] * 50, budget=110, sep_len=1) < 10  # a spread leaves a margin
    assert default_shot_grid(1) == [1]
    assert default_shot_grid(8) == [1, 2, 4, 8]
    assert default_shot_grid(13) == [1, 2, 4, 8, 13]


def test_margin_on_hand_made_accuracies():
    assert order_margin([0.5, 0.8, 0.65, 0.7]) == pytest.approx(0.3)
    assert order_margin([0.4]) == 0.0
    with pytest.raises(ValueError):
        order_margin([])


def test_arrangements_are_seeded_permutations():
    demos = [(f"t{c}{i}", c) for c in "abc" for i in range(4)]
    for seed in range(3):
        by_class = arrange_demos(demos, "by_class", seed)
        assert sorted(by_class) == sorted(demos)
        rounds = [by_class[i : i + 3] for i in range(0, 12, 3)]
        orders = [[y for _, y in r] for r in rounds]
        assert all(sorted(o) == ["a", "b", "c"] for o in orders)  # each round has every class once
        assert all(o == orders[0] for o in orders)  # one class order, repeated: strictly alternating
        random_order = arrange_demos(demos, "random", seed)
        assert sorted(random_order) == sorted(demos)
        assert arrange_demos(demos, "random", seed) == random_order
    assert arrangement_order(["a"] * 5, "random", 0) != arrangement_order(["a"] * 5, "random", 1)
    with pytest.raises(ValueError, match="same number"):
        arrange_demos(demos[:-1], "by_class", 0)
    with pytest.raises(ValueError, match="arrangement"):
        arrange_demos(demos, "sorted", 0)


# ----------------------------------------------------------------------------------------------------------------
# end to end


def test_run_icl_end_to_end_is_deterministic(model, tokenizer, tmp_path):
    pairs = _pairs()
    kwargs = dict(shots=[1, 2, 4], draws=2, test_size=6, seed=0, progress=False)
    result = run_icl(model, tokenizer, pairs, **kwargs)
    assert result == run_icl(model, tokenizer, pairs, **kwargs)
    json.dumps(result)
    assert result["shots"] == [1, 2, 4] and result["labels"] == sorted(LABELS)
    assert all(len(a) == 2 and all(0.0 <= x <= 1.0 for x in a) for a in result["accuracy"])
    # each test item's hit per draw, in the test set's order: what the claim row's interval reads
    assert [[sum(h) / len(h) for h in per_k] for per_k in result["hits"]] == result["accuracy"]
    assert all(len(h) == 6 and set(h) <= {0, 1} for per_k in result["hits"] for h in per_k)
    meta = result["metadata"]
    assert meta["tokenization_round_trip"] and meta["draws"] == 2 and meta["test_size"] == 6
    assert meta["context_length"] == 256 and meta["max_prompt_tokens"] <= 256
    assert meta["demo_pool_size"] == 42 and meta["num_classes"] == 4
    with pytest.raises(ValueError, match="do not fit"):
        run_icl(model, tokenizer, pairs, shots=[meta["max_shots"] + 1], draws=1, test_size=6, progress=False)

    # the floor: each heuristic without the skill played on every draw's own test set and demonstrations
    counts = meta["test_label_counts"]
    assert sorted(counts) == sorted(LABELS) and sum(counts.values()) == 6
    best_constant = max(counts.values()) / 6
    assert result["heuristics"]["constant"] == [best_constant] * 3 and best_constant > 1 / len(LABELS)
    assert result["floor"] == [max(result["heuristics"][h][i] for h in HEURISTICS) for i in range(3)]
    assert all(f >= best_constant for f in result["floor"])

    auto = run_icl(model, tokenizer, pairs, draws=1, test_size=4, max_length=64, progress=False)
    assert auto["shots"] == default_shot_grid(auto["metadata"]["max_shots"])
    assert auto["metadata"]["max_prompt_tokens"] <= 64
    assert plot_icl({"tiny": result, "tiny-64": auto}, tmp_path / "icl.png").stat().st_size > 0


def test_heuristics_score_what_a_model_without_the_skill_would():
    gold = ["a", "a", "b", "c"]
    assert heuristic_scores(["a", "b", "c"], gold, ["c", "b", "b"]) == {
        "constant": 0.5,  # always "a", the test set's most frequent label
        "demo_majority": 0.25,  # "b", twice among the demonstrations
        "last_demo": 0.25,  # "b"
    }
    # a tie among the demonstrations goes to the first label in label order; the last one is the prompt's last
    tied = heuristic_scores(["a", "b", "c"], gold, ["c", "a"])
    assert tied == {"constant": 0.5, "demo_majority": 0.5, "last_demo": 0.5}


def test_the_icl_rows_chance_is_the_simulated_floor_and_1_over_labels_without_one():
    from diffattn.eval.icl.claims import _chance, _chance_words

    class _Run:
        def __init__(self, many_shot):
            self.many_shot = many_shot

        def results(self, suite, key, *path):
            return self.many_shot if not path else self.many_shot.get(path[0])

    heuristics = {"constant": [0.3, 0.3], "demo_majority": [0.4, 0.2], "last_demo": [0.1, 0.25]}
    floored = {"shots": [1, 4], "labels": ["a", "b", "c", "d"], "floor": [0.4, 0.3], "heuristics": heuristics}
    assert _chance(_Run(floored)) == pytest.approx(0.35)  # averaged over the curve, as the row's accuracy is
    assert _chance_words(floored, [1]) == "chance 0.40 (the best heuristic, demo_majority; 1 / 4 labels = 0.25)"
    assert _chance_words(floored, [1, 4]) == "chance 0.35 (the best heuristic at each shot count; 1 / 4 labels = 0.25)"
    older = {"shots": [1, 4], "labels": ["a", "b", "c", "d"]}  # results from before the floor was simulated
    assert _chance(_Run(older)) == 0.25 and "no simulated floor" in _chance_words(older, [4])


def test_run_icl_refuses_bad_input(model, tokenizer):
    with pytest.raises(ValueError, match="single class"):
        run_icl(model, tokenizer, [("a", "x"), ("b", "x")], progress=False)
    with pytest.raises(ValueError, match="empty"):
        run_icl(model, tokenizer, [], progress=False)
    with pytest.raises(ValueError, match="too few"):
        run_icl(model, tokenizer, _pairs(8), test_size=8, progress=False)
    with pytest.raises(ValueError, match="exceeds"):
        run_icl(model, tokenizer, _pairs(), max_length=10_000, progress=False)


def test_run_order_robustness_end_to_end(model, tokenizer, tmp_path, monkeypatch):
    pairs = _pairs()
    result = run_order_robustness(model, tokenizer, pairs, rounds=2, permutations=3, test_size=6, progress=False)
    json.dumps(result)
    assert result["rounds"] == 2 and result["shots"] == 8
    for name in ("random", "by_class"):
        r = result["arrangements"][name]
        assert len(r["accuracies"]) == 3 and np.shape(r["hits"]) == (3, 6)
        assert r["accuracies"] == pytest.approx(np.mean(r["hits"], axis=1).tolist())
        assert r["margin"] == pytest.approx(max(r["accuracies"]) - min(r["accuracies"]))
        assert r["best"] - r["worst"] == pytest.approx(r["margin"])
        assert r["order_variance"] == pytest.approx(rows_variance(r["hits"])[0])  # the items' noise removed
    assert result["metadata"]["permutations"] == 3
    assert plot_order_robustness(result, tmp_path / "order.png").stat().st_size > 0
    with pytest.raises(ValueError, match="rounds need"):
        run_order_robustness(model, tokenizer, pairs, rounds=50, permutations=1, test_size=6, progress=False)
    # by default the demo set fills the length the model was trained at, as every suite measures there (results
    # version 7; it filled the model's 256 positions), else its maximum context
    from diffattn.eval.common import TRAINED_LENGTH

    one = run_order_robustness(model, tokenizer, pairs, permutations=1, test_size=6, progress=False)
    assert one["arrangements"]["random"]["order_variance"] is None  # one order: no variance to read
    full = one["metadata"]
    assert (full["context_length"], full["context_source"], full["trained_length"]) == (
        256, "the model's maximum context", None,
    )  # fmt: skip
    monkeypatch.setattr(model, TRAINED_LENGTH, 160, raising=False)
    short = run_order_robustness(model, tokenizer, pairs, permutations=1, test_size=6, progress=False)
    meta = short["metadata"]
    assert (meta["context_length"], meta["context_source"], meta["trained_length"]) == (
        160, "the length the model was trained at", 160,
    )  # fmt: skip
    assert 1 <= short["rounds"] < run_order_robustness(model, tokenizer, pairs, permutations=1, test_size=6,
                                                        max_length=256, progress=False)["rounds"]  # fmt: skip


def test_draws_pair_only_where_both_runs_drew_the_same_demonstrations_and_test_items():
    from diffattn.eval.icl.claims import same_draws

    meta = {"dataset": "fortunes", "dataset_options": {}, "seed": 0, "test_size": 30, "labels": ["a", "b"],
            "demo_pool_size": 200, "draws": 5, "redraws": 0, "label_tokens": {"a": 1, "b": 2}, "end_token": 7,
            "max_prompt_tokens": 250}  # fmt: skip
    run = {"metadata": meta}
    assert same_draws(run, {"metadata": {**meta, "max_prompt_tokens": 240}})  # no redraw: the seeds decide
    assert not same_draws(run, {"metadata": {**meta, "seed": 1}})
    assert not same_draws(run, {"metadata": {**meta, "test_size": 40}})
    redrawn = {**meta, "redraws": 3}  # a redraw depends on the tokenizer: the same one's marks needed
    assert same_draws({"metadata": redrawn}, {"metadata": dict(redrawn)})
    assert not same_draws({"metadata": redrawn}, {"metadata": {**redrawn, "max_prompt_tokens": 240}})
    assert not same_draws({"metadata": redrawn}, {"metadata": meta})


def test_the_reports_order_table_gives_the_order_variance_where_the_results_have_it(tmp_path):
    import copy

    from diffattn.eval.icl import compare

    runs = json.loads((Path(__file__).parents[2] / "results/mini-scratch/results.json").read_text())["evaluations"]
    old = runs["diff-s0"]["icl"]  # results from before the order variance was recorded
    new = copy.deepcopy(old)
    new["order_robustness"]["arrangements"]["random"]["order_variance"] = 0.00123
    lines = compare({"old": old, "new": new}, tmp_path)
    assert "order variance (random, points², items' noise removed)" in lines[2]
    assert lines[4].startswith("| old |") and lines[4].endswith("| – |")
    assert lines[5].startswith("| new |") and lines[5].endswith("| 12.3 |")
