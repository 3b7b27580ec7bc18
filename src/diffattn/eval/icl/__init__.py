"""Many-shot in-context learning and its robustness to demonstration order (DIFF Transformer §3.5, Fig. 6–7 and
App. F; Dex Table 3; protocol of Bertsch et al. 2024, "In-Context Learning with Long-Context Models";
docs/evaluation.md §7).

**Prompt** (docs/evaluation.md §7.2): every demonstration is ``"{x_prefix}{text}\\n{y_prefix}{label}"``, the
demonstrations are joined by ``"\\n==\\n"``, then the test item follows with an empty label:
``demo_1 + "\\n==\\n" + … + demo_k + "\\n==\\n" + "{x_prefix}{text}\\n{y_prefix}"``. Defaults:
``x_prefix="Input: "``, ``y_prefix="Label: "`` (:class:`PromptFormat`).

**Constrained decoding** (Ratner et al. 2023, as used by Bertsch et al. and DIFF): the model may only emit one of
the data set's label strings. The labels are tokenised in the form they take in the prompt (see *tokenisation*
below) and put in a token trie (:class:`LabelTrie`). Decoding is greedy over the allowed next tokens only (the
argmax of the logits restricted to the current node's children) and stops at the shortest unique prefix: once
only one label remains below the node, that label is the prediction. A label whose tokens are a strict prefix of
another's (``"cat"`` vs ``"cats"`` when ``" cats"`` is ``" cat" + "s"``) ends with the first token of the
separator (the token that follows every label in the demonstrations), which competes with the longer labels'
next tokens. Each trie step is **one forward of one token on the KV cache** of the prompt; moreover the cache of
the demonstrations (everything before the test item) is computed once per demonstration set and shared by all
test items (rolled back with ``Cache.crop``, or copied where a cache cannot be cropped, e.g. sliding-window
layers) — numerically the same as one full forward per test item (``share_prefix=False`` does that instead).
Accuracy is the exact-match rate of the decoded label, in [0, 1] (the papers print percentages).

**Tokenisation.** The prompt is tokenised piece by piece (the tokenizer's own BOS, if it adds one; each
demonstration; each separator; the test item), so every demonstration's label has exactly the tokens the
decoder may emit. The label tokens are ``tokens(y_prefix + label)`` minus the longest prefix of
``tokens(y_prefix)`` they all share: with BPE the trailing space of ``"Label: "`` merges into the label's first
token (``" noun"``), so the test item's prompt ends at ``"Label:"`` and the space is part of the label — the
usual treatment of a target delimiter. Tokenizers that add a prefix space to every encoded string
(SentencePiece "dummy prefix") are handled by encoding each piece after a newline and dropping the newline's
tokens. Whether the decoded prompt reproduces the prompt string exactly is checked and recorded
(``metadata["tokenization_round_trip"]``).

**Many-shot accuracy** (:func:`run_icl`). A fixed test set (``test_size`` items, a seeded sample) and a demo pool
(the rest, disjoint). Shot counts default to 1, 2, 4, … up to the most that fit the context
(``max_length``, else the length the model was trained at where its run recorded it, else
``max_position_embeddings``), plus that maximum. The maximum is computed from the tokenised
lengths: the largest k with ``BOS + k·(mean demo + separator) + 3·sqrt(k)·std(demo) + longest test item +
longest label ≤ context``, capped at the pool size (mean and std over the pool, or over a seeded sample of 5,000
demos of a larger pool, which is tokenised lazily); a draw that still overflows is redrawn (seeded; counted in
``metadata["redraws"]``). For every shot count, ``draws`` (default 10) demo sets are drawn uniformly without
replacement from the pool, seeded by ``(seed, shots, draw)``; the mean and the population std (ddof 0) over draws
are reported. The label set of the decoder is every label of the data set, whether or not a draw shows it.

**Order robustness** (:func:`run_order_robustness`, DIFF Fig. 7). One demo set is fixed: ``rounds`` examples per
class (a seeded sample per class; by default as many rounds as fit the context), and it is permuted with
``permutations`` (default 10) seeds in two arrangements: ``"random"`` (a uniform permutation) and ``"by_class"``
("alternately arranged by class": ``rounds`` rounds, each containing every class once, in one seeded class order
repeated in every round — the strictly alternating reading of the paper; which example of a class goes into
which round is seeded too). The margin is best − worst accuracy over the permutations (:func:`order_margin`;
paper TREC margins in points: Transformer 19.0 vs DIFF 4.0 random, 56.7 vs 13.4 by class).

Choices the papers left open, all recorded in each result's ``"metadata"``: the prefixes, the test-set size
(default 100; Dex Table 3's granularity suggests ~45), the shot grid, the context-fitting rule, the trie end
token, the prefix-cache sharing, the class order of the by-class arrangement, the std convention. The data sets
(:mod:`.icl_data`) replace TREC/Banking-77/Clinic-150, which live on a hub this project may not use.

A package, one concern per module: :mod:`.prompts` (prompt strings, tokenisation, the label trie), :mod:`.decoding`
(constrained decoding on a shared prefix), :mod:`.many_shot` (run_icl), :mod:`.order` (run_order_robustness),
:mod:`.plots` (pictures and ``compare``), :mod:`.options` and :mod:`.claims`; the data sets are
:mod:`diffattn.eval.icl_data`.
"""

from __future__ import annotations

from ..common import Suite
from .claims import CLAIMS, MEASURES
from .many_shot import default_shot_grid, max_shots, run_icl
from .options import IclOptions, _check, _dataset_options, _preflight
from .order import ARRANGEMENTS, arrange_demos, arrangement_order, order_margin, run_order_robustness
from .plots import compare, plot_icl, plot_order_robustness
from .prompts import LabelTrie, PromptFormat, PromptTokens, build_prompt

__all__ = [
    "ARRANGEMENTS",
    "CLAIMS",
    "MEASURES",
    "SUITE",
    "IclOptions",
    "LabelTrie",
    "PromptFormat",
    "PromptTokens",
    "arrange_demos",
    "arrangement_order",
    "build_prompt",
    "compare",
    "default_shot_grid",
    "max_shots",
    "order_margin",
    "plot_icl",
    "plot_order_robustness",
    "run_icl",
    "run_order_robustness",
]


def _run_suite(model, tokenizer, o, folder, name):
    common = dict(  # the same test set, context and data for both protocols
        test_size=o.icl_test_size, seed=o.seed, max_length=o.icl_context_tokens, dataset_options=_dataset_options(o)
    )
    r = {
        "many_shot": run_icl(model, tokenizer, o.icl_dataset, shots=o.icl_shots, draws=o.icl_draws, **common),
        "order_robustness": run_order_robustness(
            model, tokenizer, o.icl_dataset, permutations=o.icl_permutations, **common
        ),
    }
    pictures = {
        "icl": plot_icl({name: r["many_shot"]}, folder / "icl_accuracy.png").name,
        "icl_order": plot_order_robustness({name: r["order_robustness"]}, folder / "icl_order.png").name,
    }
    return r, pictures


SUITE = Suite(
    "icl",
    _run_suite,
    headline=lambda r: {"ICL best acc": max(r["many_shot"]["mean"])},
    compare=compare,
    options=IclOptions,
    check=_check,
    preflight=_preflight,
    measures=MEASURES,
    default=False,  # minutes per shot count at the model's full length: asked for by name,
    claims=CLAIMS,
)
