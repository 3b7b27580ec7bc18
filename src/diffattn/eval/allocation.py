"""Attention allocation: attention to the answer vs attention noise (DIFF Table 3 / Fig. 1; Dex Table 2).

For the last prompt token's attention row (the token that must produce the answer), the mass is split into five
buckets by token position, then averaged over heads, layers and samples:

    bos      the first token (the BOS token when the tokenizer adds one; the attention sink otherwise)
    before   context before the answer span (distractor needles included: they are noise)
    answer   the queried needle's number tokens ("attention to answer")
    after    context after the answer span, up to the end of the haystack
    query    the question and "Answer:" (every token after the haystack)

"Attention noise" = before + after. Maps: softmax maps as they are; signed two-map maps (A1 − λA2: DIFF, DAA,
DiffQ/K, DiffLoRA) and Dex's effective attention are divided by their row sum first, as evaluation.md states, so
every model's buckets sum to 1. Samples: single-needle retrieval prompts by default (N = 1, R = 1), the answer at
the depths {0, 25, 50, 75, 100}% in turn; both are options. Paper figures: Transformer 0.03 answer / 0.51 noise;
DIFF 0.27–0.40 / 0.01–0.02.
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from ._common import check_fits, figure, load_text, model_device, model_max_length, save_figure
from .capture import AttentionCapture
from .niah import DEPTHS, fit_sample

BUCKETS = ("bos", "before", "answer", "after", "query")


def token_buckets(offsets: list[tuple[int, int]], answer_span: tuple[int, int], context_end: int) -> list[str]:
    """The bucket of every token from its character offsets (``(0, 0)`` = a special token such as BOS)."""
    a0, a1 = answer_span
    out = []
    for i, (s, e) in enumerate(offsets):
        if i == 0:
            out.append("bos")
        elif s >= context_end:
            out.append("query")
        elif e > a0 and s < a1:
            out.append("answer")
        elif e <= a0:
            out.append("before")
        else:
            out.append("after")
    return out


def allocate(row: torch.Tensor, buckets: list[str]) -> dict[str, float]:
    """Shares of one attention row (length S) per bucket, after dividing by the row sum (signed maps)."""
    if row.numel() != len(buckets):
        raise ValueError(f"row has {row.numel()} entries but {len(buckets)} tokens were bucketed")
    total = row.sum()
    if float(total.abs()) < 1e-12:
        raise ValueError("attention row sums to 0: cannot normalise it")
    row = row / total
    return {b: float(row[[i for i, x in enumerate(buckets) if x == b]].sum()) for b in BUCKETS}


def run_allocation(
    model: nn.Module,
    tokenizer,
    *,
    haystack: str = "shakespeare",
    context_tokens: int | None = None,
    samples: int = 10,
    num_needles: int = 1,
    depths=DEPTHS,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Mean attention share per bucket of the last prompt token (see the module doc), with per-layer detail."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("attention allocation needs a fast tokenizer (character offsets of every token)")
    context_tokens = context_tokens or min(model_max_length(model), 1024)
    check_fits(model, context_tokens, f"attention allocation at context_tokens={context_tokens}")
    text, description = load_text(haystack, "test") if haystack in ("shakespeare", "filler") else (haystack, "given")
    layers: dict[int, dict[str, float]] = {}
    totals = dict.fromkeys(BUCKETS, 0.0)
    count = skipped = 0
    for i in tqdm(range(samples), desc="attention allocation", disable=not progress, leave=False):
        depth = depths[i % len(depths)]
        sample = fit_sample(tokenizer, text, context_tokens, seed * 100003 + i, num_needles=num_needles, depth=depth)
        key, number = sample.keys[0], sample.answers[0]
        offset = next(o for k, n, o in sample.needles if k == key)
        start = offset + sample.context[offset:].index(number)
        enc = tokenizer(sample.prompt, return_offsets_mapping=True, return_tensors="pt")
        buckets = token_buckets(enc["offset_mapping"][0].tolist(), (start, start + len(number)), len(sample.context))
        if "answer" not in buckets:
            raise ValueError("the answer's tokens could not be located in the prompt")
        with AttentionCapture(model, rows="last") as cap, torch.no_grad():
            model(enc["input_ids"].to(model_device(model)))
        for layer, rec in cap.last().items():
            # per head: normalise each head's row by its own sum (a signed row sums to 1 − λ), then average heads;
            # a head whose row sums to ~0 (possible for Dex's effective attention) cannot be normalised: skipped
            rows = [rec.signed[0, h, 0] for h in range(rec.num_heads)]
            shares = [allocate(r, buckets) for r in rows if float(r.sum().abs()) > 1e-6]
            skipped += len(rows) - len(shares)
            per = {b: sum(s[b] for s in shares) / max(1, len(shares)) for b in BUCKETS}
            acc = layers.setdefault(layer, dict.fromkeys(BUCKETS, 0.0))
            for b in BUCKETS:
                acc[b] += per[b]
                totals[b] += per[b]
            count += 1
    n_layers = len(layers)
    mean = {b: totals[b] / count for b in BUCKETS}
    return {
        "allocation": mean,
        "attention_to_answer": mean["answer"],
        "attention_noise": mean["before"] + mean["after"],
        "per_layer": {layer: {b: v / samples for b, v in acc.items()} for layer, acc in sorted(layers.items())},
        "metadata": {
            "haystack": description,
            "context_tokens": context_tokens,
            "samples": samples,
            "num_needles": num_needles,
            "depths": list(depths),
            "row": "last prompt token; averaged over heads, layers and samples",
            "signed_maps": "divided by their row sum (per head) before bucketing",
            "layers": n_layers,
            "heads_skipped_zero_row_sum": skipped,
            "seed": seed,
        },
    }


def plot_allocation(results: dict[str, dict], path) -> object:
    """Stacked bars of the five buckets per model, ``results`` = {model name: run_allocation result}."""
    plt = figure()
    names = list(results)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(names)), 3.4))
    bottom = [0.0] * len(names)
    colors = {"bos": "tab:gray", "before": "tab:orange", "answer": "tab:green", "after": "tab:red", "query": "tab:blue"}
    for b in BUCKETS:
        vals = [results[n]["allocation"][b] for n in names]
        ax.bar(names, vals, bottom=bottom, label=b, color=colors[b])
        bottom = [x + v for x, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("share of the last token's attention")
    ax.set_title("attention allocation (answer vs noise)")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return save_figure(fig, path)
