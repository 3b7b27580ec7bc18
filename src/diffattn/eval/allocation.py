"""Attention allocation: attention to the answer vs attention noise (DIFF Table 3 / Fig. 1; Dex Table 2).

For the last prompt token's attention row (the token that must produce the answer), the mass is split into five
buckets by token position, per head, then averaged over heads and layers (one value per sample) and over samples:

    bos      the first token (the BOS token when the tokenizer adds one; the attention sink otherwise)
    before   context before the answer span (distractor needles included: they are noise)
    answer   the queried needle's number tokens ("attention to answer")
    after    context after the answer span, up to the end of the haystack
    query    the question and "Answer:" (every token after the haystack)

"Attention noise" = before + after: the context that is not the answer, as DIFF's Table 3 defines it (attention to
the answer span vs to the noise context). The question and the first token are neither: they are reported as buckets
of their own (``query``, ``bos``), never folded into either share, so that a model whose attention left the noise for
the question is not read as attending to the answer. The claim rows print every bucket's share of |attention| for
both models and name the bucket that gained the most (:func:`where_attention_went`).

Normalisation. Each head's row ``a`` is divided by its sum of absolute values ``Σ|a|``, not by its sum. Softmax
rows are non-negative, so nothing changes for them: the shares sum to 1. Signed two-map rows (A1 − λA2: DIFF,
DAA, DiffQ/K, DiffLoRA) sum to 1 − λ, which is near 0 when λ is near 1 (0.05 at λ = 0.95), so dividing by the
sum is ill-conditioned (it once gave a −1.33 "query" share); Dex's effective attention can sum to anything.
Divided by ``Σ|a|`` every bucket share lies in [−1, 1], and the negative entries are reported on their own:
``negative_mass`` = −Σ(negative entries) / Σ|a| (in [0, 1]; per bucket in ``negative_by_bucket``). A bucket's share
is its positive minus its negative mass, so for a signed map the shares sum to 1 − 2·negative_mass.

Results: the mean shares (``allocation``, ``attention_to_answer``, ``attention_noise``, ``negative_mass``), their
standard errors over samples (``*_se``), one value per sample (``per_sample``: the same samples, seeded
``seed·100003 + i``, for every model evaluated with the same options and tokenizer-independent prompts, so two
models' values can be compared pair by pair; ``metadata["samples_sha1"]`` fingerprints the prompts), and every
layer's mean (``per_layer``; the average over layers hides where the cancellation happens).

The λ = 0 reference (``lambda0_reference``, models whose method has an effective attention: Dex). Dex's effective
attention X = A·V·(I − λW_Dᵀ)·V⁺ is not A even at λ = 0: it is then A·V·V⁺, A's rows projected onto the span of V's
d columns, which spreads mass over every token and makes some of it negative. Comparing Dex's shares with the base
model's plain attention therefore measures the projection as much as λ. So for such a model the same shares are also
computed, in the same forward passes, from the effective attention with λ forced to 0
(:meth:`~diffattn.adapters.base.AdapterMethod.projection_reference`), and stored under ``lambda0_reference`` with
the top level's fields (means, ``*_se``, ``*_magnitude``, ``negative_mass``, ``negative_by_bucket``, ``per_sample``
in the same sample order with the same keys, ``per_layer``) and ``metadata["what"]``. Models without an effective
attention have no such key.

Samples: retrieval prompts of N needles, one queried, the answer at the depths {0, 25, 50, 75, 100}% in turn, the
distractor needles at random depths: the multi-needle setting the papers measured in (DIFF §3.4, Dex §4.2: N = 8,
R = 1). The suite's N: ``alloc_needles`` where asked, else ``niah_needles`` (default 8, the heatmap's N) where its
prompts fit the context, else the most that fit (``metadata["fewer_needles_why"]``); the function's ``num_needles``
defaults to 1 (no distractor). Results before 2026-12-01 (results version 8) used one needle. Paper figures: Transformer
0.03 answer / 0.51 noise; DIFF 0.27–0.40 / 0.01–0.02 (docs/evaluation.md §6.1: a real run should use at least 50
samples).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .capture import AttentionCapture
from .common import (
    NEEDLE_CONTEXT_CAP,
    Suite,
    check_fits,
    evaluation_window,
    figure,
    group_colors,
    load_text,
    model_device,
    option,
    save_figure,
)
from .measures import NO_PER_SAMPLE, Comparison, Measure, PaperClaim, Run, first, paired_kind, same_metadata
from .niah import DEPTHS, check_needle_cells, depths_in_turn, fit_sample, needle_protocol
from .stats import mean_se, normal_interval, paired_difference, unpaired_difference

BUCKETS = ("bos", "before", "answer", "after", "query")
LAMBDA0_REFERENCE = (
    "the same shares, prompts and forward passes, computed from the model's effective attention with λ forced to 0 "
    "(Dex: A·V·V⁺ on its selected heads with the model's own A and V, A on the others): the low-rank projection "
    "without the λ term. The model's shares minus these are what its λ term does; the difference between these and "
    "another model's plain attention is the projection, which a comparison of the two models would also count"
)
SIGNED_MAPS = (
    "each head's row divided by the sum of absolute values of its entries (not by its sum, which is 1 − λ for "
    "A1 − λA2 and near 0 when λ is near 1); every bucket share lies in [−1, 1], softmax rows are unchanged (shares "
    "sum to 1); negative mass reported separately (negative_mass = −Σ negative entries / Σ|a|)"
)


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


def _bucket_index(buckets: list[str]) -> torch.Tensor:
    return torch.tensor([BUCKETS.index(b) for b in buckets], dtype=torch.long)


def uniform_shares(buckets: list[str]) -> dict[str, float]:
    """The shares uniform attention over the prompt's tokens gives the claims' buckets: ``answer`` (the queried
    needle's tokens) and ``noise`` (the context before and after it), each its tokens over all of them."""
    n = len(buckets)
    return {"answer": buckets.count("answer") / n, "noise": (buckets.count("before") + buckets.count("after")) / n}


def allocate_rows(rows: torch.Tensor, buckets: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shares of attention rows ``[R, S]`` per bucket after dividing each row by its sum of absolute values.

    Returns ``(shares [R, 5], negative [R, 5], valid [R])``: the signed share of every bucket (in [−1, 1]) and its
    negative mass (in [0, 1]), in :data:`BUCKETS` order; ``valid`` is False for an all-zero row (nothing to share)."""
    if rows.shape[-1] != len(buckets):
        raise ValueError(f"row has {rows.shape[-1]} entries but {len(buckets)} tokens were bucketed")
    rows = rows.reshape(-1, rows.shape[-1]).double()
    idx = _bucket_index(buckets).to(rows.device)
    scale = rows.abs().sum(-1)
    valid = scale > 0
    scale = torch.where(valid, scale, torch.ones_like(scale))
    shares = torch.zeros(rows.shape[0], len(BUCKETS), dtype=rows.dtype, device=rows.device)
    negative = torch.zeros_like(shares)
    shares.index_add_(1, idx, rows)
    negative.index_add_(1, idx, -rows.clamp(max=0))
    return (shares / scale[:, None]).cpu(), (negative / scale[:, None]).cpu(), valid.cpu()


def allocate(row: torch.Tensor, buckets: list[str]) -> dict[str, float]:
    """Shares of one attention row (length S) per bucket, after dividing by the row's sum of absolute values
    (see the module doc: softmax rows are unchanged; a signed row's shares lie in [−1, 1])."""
    if row.numel() != len(buckets):
        raise ValueError(f"row has {row.numel()} entries but {len(buckets)} tokens were bucketed")
    shares, _, valid = allocate_rows(row.reshape(1, -1), buckets)
    if not bool(valid[0]):
        raise ValueError("attention row is all zeros: there is no attention to share")
    return {b: float(shares[0, i]) for i, b in enumerate(BUCKETS)}


def negative_shares(row: torch.Tensor, buckets: list[str]) -> dict[str, float]:
    """Negative mass of one attention row per bucket: −Σ(negative entries) / Σ|row| (0 for softmax rows)."""
    _, negative, _ = allocate_rows(row.reshape(1, -1), buckets)
    return {b: float(negative[0, i]) for i, b in enumerate(BUCKETS)}


def run_allocation(
    model: nn.Module,
    tokenizer,
    *,
    haystack: str = "shakespeare",
    context_tokens: int | None = None,
    samples: int = 10,
    num_needles: int = 1,
    most_needles: int | None = None,
    depths=DEPTHS,
    value_digits: int = 7,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Mean attention share per bucket of the last prompt token (see the module doc), with per-sample values,
    standard errors over samples, negative mass and per-layer detail. ``most_needles``: instead of ``num_needles``,
    the most needles up to it whose every sample fits the context (the suite's default; metadata says why fewer)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("attention allocation needs a fast tokenizer (character offsets of every token)")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    context_tokens = evaluation_window(model, context_tokens, cap=NEEDLE_CONTEXT_CAP)
    check_fits(model, context_tokens, f"attention allocation at context_tokens={context_tokens}")
    text, description = load_text(haystack, "test") if haystack in ("shakespeare", "filler") else (haystack, "given")
    fewer = None
    if most_needles is not None:
        num_needles, fewer, prompts = fitting_needles(
            tokenizer, text, context_tokens, most_needles, samples, value_digits, seed, depths
        )
    else:
        prompts = _samples(tokenizer, text, context_tokens, num_needles, samples, value_digits, seed, depths)
    tally = _Tally()  # the model's own maps (rec.signed)
    reference = _Tally()  # the same rows of the effective attention at λ = 0 (rec.reference), when there is one
    digest = hashlib.sha1()
    bar = tqdm(prompts, desc="attention allocation", disable=not progress, leave=False)
    for i, (sample, depth) in enumerate(zip(bar, depths_in_turn(depths, samples), strict=True)):
        digest.update(sample.prompt.encode() + b"\0")
        enc, buckets = _tokens_in_buckets(tokenizer, sample)
        with AttentionCapture(model, rows="last", reference=True) as cap, torch.no_grad():
            model(enc["input_ids"].to(model_device(model)))
        records = cap.last()
        label = {"seed": _sample_seed(i, seed), "depth": depth}
        tally.add({layer: rec.signed[0, :, 0] for layer, rec in records.items()}, buckets, label)
        if any(rec.reference is not None for rec in records.values()):
            # a layer the method leaves alone has no λ term: its own map is its reference
            rows = {layer: (rec.signed if rec.reference is None else rec.reference) for layer, rec in records.items()}
            reference.add({layer: r[0, :, 0] for layer, r in rows.items()}, buckets, label)
    result = {
        **tally.result(),
        "metadata": {
            "haystack": description,
            "context_tokens": context_tokens,
            "samples": samples,
            "num_needles": num_needles,
            "needles_rule": f"the most up to {most_needles} that fit the context" if most_needles else "as asked",
            "fewer_needles_why": fewer,  # why not most_needles (None: it fitted, or num_needles was asked)
            "value_digits": value_digits,
            "depths": list(depths),
            "row": "last prompt token; every head's row normalised, then averaged over heads and layers (one value "
            "per sample) and over samples",
            "signed_maps": SIGNED_MAPS,
            "standard_error": "sample standard deviation of the per-sample values / sqrt(samples) (NaN for 1 sample)",
            "pairing": "sample i uses seed seed*100003 + i: models evaluated with the same options see the same "
            "prompts (same samples_sha1) and can be compared pair by pair",
            "samples_sha1": digest.hexdigest(),
            "layers": len(tally.per_layer()),
            "heads_skipped_zero_rows": tally.skipped,
            "seed": seed,
        },
    }
    if reference.per_sample:
        result["lambda0_reference"] = {
            **reference.result(),
            "metadata": {"what": LAMBDA0_REFERENCE, "heads_skipped_zero_rows": reference.skipped},
        }
        result["metadata"]["lambda0_reference"] = LAMBDA0_REFERENCE
    return result


def _sample_seed(i: int, seed: int) -> int:
    """Sample ``i``'s seed: the same for every model evaluated with the same options."""
    return seed * 100003 + i


def _samples(tokenizer, text: str, context_tokens: int, n: int, samples: int, value_digits: int, seed: int, depths):
    """The allocation prompts of ``n`` needles: sample ``i`` at its seed (:func:`_sample_seed`) and its depth, the
    depths in turn (:func:`~diffattn.eval.niah.sampling.depths_in_turn`, as the needle grid places them)."""
    return [
        fit_sample(tokenizer, text, context_tokens, _sample_seed(i, seed), num_needles=n, depth=depth,
                   value_digits=value_digits)
        for i, depth in enumerate(depths_in_turn(depths, samples))
    ]  # fmt: skip


def fitting_needles(
    tokenizer, text: str, context_tokens: int, most: int, samples: int, value_digits: int, seed: int, depths=DEPTHS
) -> tuple[int, str | None, list]:
    """The most needles, up to ``most``, whose every allocation sample fits ``context_tokens``, why not ``most``
    (None when it fits), and those samples; one needle must fit (the suite's preflight checked it)."""
    why = None
    for n in range(most, 0, -1):
        try:
            return n, why, _samples(tokenizer, text, context_tokens, n, samples, value_digits, seed, depths)
        except ValueError as e:
            why = why or f"{most} needles: {e}"
            if n == 1:
                raise
    raise AssertionError("unreachable: n = 1 returns or raises")


def _tokens_in_buckets(tokenizer, sample) -> tuple[dict, dict]:
    """The prompt's tokens (with character offsets) and their buckets, the answer being the queried needle's
    number where it stands in the context."""
    key, number = sample.keys[0], sample.answers[0]
    offset = next(o for k, n, o in sample.needles if k == key)
    start = offset + sample.context[offset:].index(number)
    enc = tokenizer(sample.prompt, return_offsets_mapping=True, return_tensors="pt")
    buckets = token_buckets(enc["offset_mapping"][0].tolist(), (start, start + len(number)), len(sample.context))
    if "answer" not in buckets:
        raise ValueError("the answer's tokens could not be located in the prompt")
    return enc, buckets


class _Tally:
    """The allocation of one kind of map over the samples: per sample (head- then layer-mean shares), per layer."""

    def __init__(self):
        self.layer_shares: dict[int, torch.Tensor] = {}  # layer -> sum over samples of the head-mean shares [5]
        self.layer_negative: dict[int, torch.Tensor] = {}
        self.layer_count: dict[int, int] = {}
        # per sample: answer, noise, negative mass, and the answer's and noise's shares of |attention|
        self.layer_samples: dict[int, list[tuple[float, float, float, float, float]]] = {}
        self.negatives: list[torch.Tensor] = []  # per sample: negative mass per bucket [5]
        self.per_sample: list[dict] = []
        self.skipped = 0

    def add(self, rows: dict[int, torch.Tensor], buckets: list[str], label: dict) -> None:
        """One sample: ``rows`` = every layer's last-token rows ``[H, S]``; ``label`` is kept with its values."""
        nb = len(BUCKETS)
        sample_shares, sample_negative = [], []
        for layer, heads in rows.items():
            # every head's row divided by its sum of |a| (module doc), then the heads averaged; an all-zero row
            # (nothing attended) has no shares and is skipped
            shares, negative, valid = allocate_rows(heads, buckets)
            self.skipped += int((~valid).sum())
            if not bool(valid.any()):
                continue
            s_mean, n_mean = shares[valid].mean(0), negative[valid].mean(0)
            self.layer_shares[layer] = self.layer_shares.get(layer, torch.zeros(nb, dtype=s_mean.dtype)) + s_mean
            self.layer_negative[layer] = self.layer_negative.get(layer, torch.zeros(nb, dtype=n_mean.dtype)) + n_mean
            self.layer_count[layer] = self.layer_count.get(layer, 0) + 1
            answer, noise = (
                s_mean[BUCKETS.index("answer")],
                s_mean[BUCKETS.index("before")] + s_mean[BUCKETS.index("after")],
            )
            m_mean = s_mean + 2 * n_mean  # |a| mass per bucket / Σ|a| (what the claims read)
            answer_mag = m_mean[BUCKETS.index("answer")]
            noise_mag = m_mean[BUCKETS.index("before")] + m_mean[BUCKETS.index("after")]
            self.layer_samples.setdefault(layer, []).append(
                (float(answer), float(noise), float(n_mean.sum()), float(answer_mag), float(noise_mag))
            )
            sample_shares.append(s_mean)
            sample_negative.append(n_mean)
        if not sample_shares:
            raise ValueError("every attention row was all zeros: there is no attention to share")
        s = torch.stack(sample_shares).mean(0)
        n = torch.stack(sample_negative).mean(0)
        self.negatives.append(n)
        magnitude = s + 2 * n  # |a| mass per bucket / Σ|a|: positive share + negative share (signed = pos − neg)
        self.per_sample.append(
            {
                "answer": float(s[BUCKETS.index("answer")]),
                "noise": float(s[BUCKETS.index("before")] + s[BUCKETS.index("after")]),
                "answer_magnitude": float(magnitude[BUCKETS.index("answer")]),
                "noise_magnitude": float(magnitude[BUCKETS.index("before")] + magnitude[BUCKETS.index("after")]),
                "negative_mass": float(n.sum()),
                "allocation": {b: float(s[j]) for j, b in enumerate(BUCKETS)},
                # every bucket's share of |a| (sums to 1; equals the signed shares for softmax maps)
                "allocation_magnitude": {b: float(magnitude[j]) for j, b in enumerate(BUCKETS)},
                # what uniform attention over the prompt gives each bucket: its share of the tokens (the chance
                # level of the claims' shares: a model attending to nothing in particular scores it)
                "uniform": uniform_shares(buckets),
                **label,
            }
        )

    def per_layer(self) -> dict[int, dict]:
        out = {}
        for layer in sorted(self.layer_shares):
            ls = self.layer_shares[layer] / self.layer_count[layer]
            ln = self.layer_negative[layer] / self.layer_count[layer]
            samples = np.array(self.layer_samples[layer])  # the per-layer spread over samples, for error bars
            out[layer] = {
                **{b: float(ls[j]) for j, b in enumerate(BUCKETS)},
                "attention_to_answer": float(ls[BUCKETS.index("answer")]),
                "attention_noise": float(ls[BUCKETS.index("before")] + ls[BUCKETS.index("after")]),
                "negative_mass": float(ln.sum()),
                # shares of |attention|, the quantity the claim rows read (the signed ones above can cancel)
                "attention_to_answer_magnitude": float(samples[:, 3].mean()),
                "attention_noise_magnitude": float(samples[:, 4].mean()),
                **{
                    f"{key}_se": mean_se(samples[:, j])[1] if len(samples) > 1 else None
                    for j, key in enumerate(LAYER_SAMPLE_KEYS)
                },
            }
        return out

    def result(self) -> dict:
        """Means over samples, their standard errors, per-sample values and per-layer means (no metadata)."""
        per_sample = self.per_sample
        allocation = {b: float(np.mean([p["allocation"][b] for p in per_sample])) for b in BUCKETS}
        answer, answer_se = mean_se([p["answer"] for p in per_sample])
        noise, noise_se = mean_se([p["noise"] for p in per_sample])
        neg, neg_se = mean_se([p["negative_mass"] for p in per_sample])
        answer_mag, answer_mag_se = mean_se([p["answer_magnitude"] for p in per_sample])
        noise_mag, noise_mag_se = mean_se([p["noise_magnitude"] for p in per_sample])
        negative_by_bucket = {b: float(v) for b, v in zip(BUCKETS, torch.stack(self.negatives).mean(0), strict=True)}
        return {
            "allocation": allocation,
            "allocation_magnitude": {
                b: float(np.mean([p["allocation_magnitude"][b] for p in per_sample])) for b in BUCKETS
            },
            "attention_to_answer": answer,
            "attention_noise": noise,
            "attention_to_answer_se": answer_se,
            "attention_noise_se": noise_se,
            "negative_mass": neg,
            "negative_mass_se": neg_se,
            # shares of the attention *magnitude* (Σ|a| of a bucket / Σ|a|): equal to the signed shares for softmax
            # maps; for signed maps they cannot be lowered by positive and negative entries of one bucket cancelling
            "attention_to_answer_magnitude": answer_mag,
            "attention_to_answer_magnitude_se": answer_mag_se,
            "attention_noise_magnitude": noise_mag,
            "attention_noise_magnitude_se": noise_mag_se,
            "negative_by_bucket": negative_by_bucket,
            "per_sample": per_sample,
            "per_layer": self.per_layer(),
        }


#: what each per-layer sample tuple holds, in order (``_Tally.layer_samples``)
LAYER_SAMPLE_KEYS = (
    "attention_to_answer", "attention_noise", "negative_mass", "attention_to_answer_magnitude",
    "attention_noise_magnitude",
)  # fmt: skip

COLORS = {"bos": "tab:gray", "before": "tab:orange", "answer": "tab:green", "after": "tab:red", "query": "tab:blue"}


def _per_layer_series(r: dict, key: str) -> tuple[list[int], list[float]]:
    """(layers, values) of a per-layer quantity; layer keys may be strings after a JSON round trip."""
    layers = sorted(r.get("per_layer", {}).items(), key=lambda kv: int(kv[0]))
    points = []
    for k, v in layers:
        if key == "attention_noise" and key not in v:
            value = v.get("before", 0.0) + v.get("after", 0.0)  # results written before per-layer noise existed
        elif key == "attention_to_answer" and key not in v:
            value = v.get("answer")
        else:
            value = v.get(key)
        if value is not None:
            points.append((int(k), float(value)))
    return [p[0] for p in points], [p[1] for p in points]


def _se(r: dict, key: str) -> float:
    se = r.get(f"{key}_se")
    return 0.0 if se is None or not np.isfinite(se) else float(se)


def plot_allocation(results: dict[str, dict], path) -> object:
    """Every model's attention allocation in one picture, ``results`` = {model name: run_allocation result}.

    Top row, one bar per model: (a) the five buckets, positive mass to the right of 0 and negative mass (signed
    maps) to the left, shares ≥ 0.08 printed on their segment; (b) attention to the answer and (c) attention noise,
    each on its own scale (an answer share of 1% stays visible), value printed, bars = 95% interval (±1.96 SE over
    samples). Bottom row, per layer: (d) answer share, (e) noise, (f) negative mass — the average over layers hides
    where the cancellation happens. Results without the newer keys (SEs, negative mass) are drawn without them."""
    plt = figure()
    names = list(results)
    n = len(names)
    top_h = max(2.6, 0.42 * n + 1.2)
    fig = plt.figure(figsize=(16, top_h + 3.6))
    grid = fig.add_gridspec(2, 3, height_ratios=[top_h, 3.2], width_ratios=[1.5, 1, 1])
    y = np.arange(n)[::-1]  # first model on top

    _bucket_panel(fig.add_subplot(grid[0, 0]), results, names, y)
    for col, (key, label, color) in enumerate(
        [
            ("attention_to_answer", "(b) attention to the answer", "tab:green"),
            ("attention_noise", "(c) attention noise", "tab:red"),
        ],
        start=1,
    ):
        _share_panel(fig.add_subplot(grid[0, col]), results, names, y, key, label, color)
    _per_layer_panels(fig, grid, results, names)
    fig.suptitle("attention allocation of the last prompt token (rows normalised by Σ|a|)", fontsize=10)
    return save_figure(fig, path)


def _bucket_panel(ax, results: dict[str, dict], names: list[str], y) -> None:
    """(a): every model's five buckets, positive mass right of 0, negative mass (signed maps) hatched left of it."""
    n = len(names)
    pos_left = np.zeros(n)
    neg_right = np.zeros(n)
    for b in BUCKETS:
        share = np.array([results[m]["allocation"][b] for m in names], dtype=float)
        neg = np.array([results[m].get("negative_by_bucket", {}).get(b, 0.0) for m in names], dtype=float)
        pos = share + neg  # a bucket's positive mass; share = positive − negative
        ax.barh(y, pos, left=pos_left, color=COLORS[b], label=b, height=0.7)
        ax.barh(y, -neg, left=neg_right, color=COLORS[b], height=0.7, hatch="///", edgecolor="white", linewidth=0)
        for yi, left, width in zip(y, pos_left, pos, strict=True):
            if width >= 0.08:
                ax.text(left + width / 2, yi, f"{width:.2f}", ha="center", va="center", fontsize=7, color="white")
        pos_left += pos
        neg_right -= neg
    for yi, m in zip(y, names, strict=True):
        total_neg = results[m].get("negative_mass", 0.0) or 0.0
        if total_neg > 0.005:
            ax.text(-total_neg - 0.01, yi, f"−{total_neg:.2f}", ha="right", va="center", fontsize=7)
    lo = min(0.0, float(neg_right.min()))
    ax.set_xlim(lo - (0.12 if lo < 0 else 0.0), 1.02)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel("share of the last token's attention (left of 0: negative mass, hatched)")
    ax.set_title("(a) attention allocation, per bucket", fontsize=9, pad=18)
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, handlelength=1.2)


def _share_panel(axk, results: dict[str, dict], names: list[str], y, key: str, label: str, color: str) -> None:
    """(b) or (c): one share per model on its own scale, value printed, bars = 95% interval (±1.96 SE)."""
    n = len(names)
    vals = np.array([results[m][key] for m in names], dtype=float)
    errs = 1.96 * np.array([_se(results[m], key) for m in names])
    axk.barh(y, vals, xerr=errs, color=color, height=0.6, error_kw={"elinewidth": 1, "capsize": 2})
    span = max(float(np.max(np.abs(vals) + errs)), 1e-3)
    for yi, v, e in zip(y, vals, errs, strict=True):
        text = f"{v:.3f}" + (f" ± {e:.3f}" if e > 0 else "")
        axk.text(max(v + e, 0) + 0.02 * span, yi, text, va="center", fontsize=7)
    left = min(0.0, float(np.min(vals - errs)))
    axk.set_xlim(left - (0.05 * span if left < 0 else 0), span * 1.45)
    axk.axvline(0, color="black", linewidth=0.8)
    axk.set_yticks(y, names if n <= 1 else [""] * n, fontsize=8)
    axk.set_title(f"{label} (bars: 95% CI, ±1.96 SE)", fontsize=9)
    axk.tick_params(axis="x", labelsize=7)


def _per_layer_panels(fig, grid, results: dict[str, dict], names: list[str]) -> None:
    """(d)-(f): answer share, noise and negative mass per layer, one line per model with 95% error bars."""
    colors = group_colors(names)  # one colour per model group (seeds of one architecture share it)
    styles = ["-", "--", "-.", ":"]
    # the claims' quantity, shares of |attention|, where every model's results have it per layer (signed before)
    magnitude = all(
        any("attention_to_answer_magnitude" in v for v in (results[m].get("per_layer") or {}).values()) for m in names
    )
    of = " of |attention|" if magnitude else ""  # (results from before: their pictures drawn as they were)
    for col, (key, label) in enumerate(
        [
            ("attention_to_answer" + "_magnitude" * magnitude, f"(d) answer share{of} per layer"),
            ("attention_noise" + "_magnitude" * magnitude, f"(e) noise{of} per layer"),
            ("negative_mass", "(f) negative mass per layer"),
        ]
    ):
        axl = fig.add_subplot(grid[1, col])
        drawn = False
        for i, m in enumerate(names):
            layers, vals = _per_layer_series(results[m], key)
            if layers:
                _, ses = _per_layer_series(results[m], f"{key}_se")
                axl.errorbar(
                    layers,
                    vals,
                    yerr=[1.96 * s for s in ses] if len(ses) == len(vals) else None,  # 95% over samples
                    fmt=styles[(i // 10) % len(styles)],
                    marker="o",
                    markersize=3,
                    capsize=2,
                    color=colors[m],
                    label=m,
                    linewidth=1.2,
                )
                drawn = True
        axl.axhline(0, color="black", linewidth=0.6)
        axl.set_xlabel("layer", fontsize=8)
        axl.set_title(label, fontsize=9)
        axl.tick_params(labelsize=7)
        if col == 2 and drawn:
            axl.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if drawn:
            axl.xaxis.get_major_locator().set_params(integer=True)


@dataclass
class AllocOptions:
    """Allocation's own option (its prompts' other options are :class:`~diffattn.eval.common.CommonOptions`)."""

    alloc_needles: int | None = option(
        None,
        "needles in each allocation prompt, one queried (default: niah_needles where they fit the context, else the "
        "most that fit)",
        minimum=1,
    )


def _run_suite(model, tokenizer, o, folder, name):
    needles = {"num_needles": o.alloc_needles} if o.alloc_needles is not None else {"most_needles": o.niah_needles}
    r = run_allocation(model, tokenizer, **needles, **o.needle_prompts())
    return r, {"alloc": plot_allocation({name: r}, folder / "allocation.png").name}


def _headline(r: dict) -> dict:
    return {
        "attn→answer": r["attention_to_answer"],
        "attn noise": r["attention_noise"],
        "attn neg. mass": r.get("negative_mass"),
        "|attn|→answer": r.get("attention_to_answer_magnitude"),
        "|attn| noise": r.get("attention_noise_magnitude"),
    }


def allocation_table(alloc: dict[str, dict]) -> list[str]:
    """Answer share, noise and negative mass per model, each ± its standard error over samples."""

    def pm(r: dict, key: str) -> str:
        v, se = r.get(key), r.get(f"{key}_se")
        if v is None:
            return "–"
        return f"{v:.3f} ± {se:.3f}" if isinstance(se, float) and se == se else f"{v:.3f}"

    lines = [
        "Attention allocation of the last prompt token (rows normalised by Σ|a|; ± 1 SE over samples; the question and "
        "the first token are buckets of their own, in neither share; every bucket's share of |attention| on the "
        "right, summing to 1):",
        "",
        "| model | samples | attention to answer | attention noise | negative mass | |a|: first token / noise / answer "
        "/ question |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in alloc.items():
        samples = r.get("metadata", {}).get("samples", "–")
        shares = bucket_shares(r)
        buckets = " / ".join(f"{shares[b]:.3f}" for b in BUCKET_WORDS) if shares else "–"
        lines.append(
            f"| {n} | {samples} | {pm(r, 'attention_to_answer')} | {pm(r, 'attention_noise')} | "
            f"{pm(r, 'negative_mass')} | {buckets} |"
        )
    return [*lines, ""]


def compare(alloc: dict[str, dict], out: Path) -> list[str]:
    return [f"![attention allocation]({plot_allocation(alloc, out / 'allocation_all.png').name})", "",
            *allocation_table(alloc)]  # fmt: skip


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
_BUCKETS = {"attention_to_answer": ("answer", "attention to answer"), "attention_noise": ("noise", "attention noise")}


def _compare_share(ref: Run, new: Run, seed: int, key: str) -> Comparison | None:
    """An allocation share (``attention_to_answer`` or ``attention_noise``), over the same prompts when both models
    saw them: the shares of |attention| where the results have them (docs/evaluation.md §6.2)."""
    ar, an = ref.results("alloc"), new.results("alloc")
    if not ar or not an or key not in ar or key not in an:
        return None
    per_key, metric = _BUCKETS[key]
    samples_r, samples_n = ar.get("per_sample") or [], an.get("per_sample") or []
    if not samples_r or not samples_n:  # no interval: the two means, of |attention| where both results have them
        both = ar.get(f"{key}_magnitude") is not None and an.get(f"{key}_magnitude") is not None
        value = f"{key}_magnitude" if both else key
        words = f"{metric} (share of |attention|)" if both else f"{metric} (signed share)"
        return Comparison(words, ref_value=ar[value], new_value=an[value], kind=NO_PER_SAMPLE)
    magnitude = all(f"{per_key}_magnitude" in p for p in samples_r + samples_n)
    if magnitude:
        # shares of |a|: a signed map cannot meet the claim by cancelling + and − entries of one bucket
        per_key, metric = f"{per_key}_magnitude", f"{metric} (share of |attention|)"
    else:
        metric = f"{metric} (signed share)"
    sr = [p[per_key] for p in samples_r]
    sn = [p[per_key] for p in samples_n]
    (rm, rse), (nm, nse) = mean_se(sr), mean_se(sn)
    rci = normal_interval(rm, rse) if math.isfinite(rse) else None
    nci = normal_interval(nm, nse) if math.isfinite(nse) else None
    if len(sr) == len(sn) and same_metadata(ar.get("metadata"), an.get("metadata"), "samples_sha1"):
        diff = paired_difference(sr, sn, seed=seed)
        kind = paired_kind(diff, "samples; values ± 1.96 SE over samples")
    else:
        diff = unpaired_difference(sr, sn, method="welch")
        kind = f"Welch t over samples ({len(sr)} vs {len(sn)}; unpaired: different prompts); values ± 1.96 SE"
    note = "data uncertainty only, one seed; rows normalised by their sum of absolute values"
    needles = {(r.get("metadata") or {}).get("num_needles") for r in (ar, an)}
    if len(needles) == 1 and None not in needles:
        note += f"; prompts of {needles.pop()} needle(s), one queried"
    if magnitude:
        note += f"; signed shares {ar[key]:.3f} → {an[key]:.3f}"
    where = where_attention_went(ar, an)
    if where:
        note += f"; {where}"
    return Comparison(metric, ref_value=rm, ref_ci=rci, new_value=nm, new_ci=nci, diff=diff, kind=kind, note=note)


BUCKET_WORDS = {"bos": "first token", "noise": "noise (context)", "answer": "answer", "query": "question"}


def bucket_shares(r: dict) -> dict[str, float] | None:
    """A result's shares of |attention| per reported bucket — first token, noise (before + after), answer, question —
    summing to 1 (for results written before magnitudes were kept per bucket: the signed share plus twice the
    bucket's negative mass, which is the same number; signed shares alone where that is missing too)."""
    a = r.get("allocation_magnitude")
    if not a and r.get("allocation"):
        negative = r.get("negative_by_bucket") or {}
        a = {b: r["allocation"][b] + 2 * negative.get(b, 0.0) for b in BUCKETS}
    if not a:
        return None
    return {"bos": a["bos"], "noise": a["before"] + a["after"], "answer": a["answer"], "query": a["query"]}


def where_attention_went(ref: dict, new: dict) -> str | None:
    """Every bucket's share of |attention|, ref → new, and the bucket that gained the most: the words a verdict on
    "less noise" or "more to the answer" needs (the mass a model takes from the noise can go to the question)."""
    sr, sn = bucket_shares(ref), bucket_shares(new)
    return None if sr is None or sn is None else _where_words(sr, sn)


def _where_words(sr: dict[str, float], sn: dict[str, float]) -> str:
    """:func:`where_attention_went`'s words from two sets of bucket shares (:func:`bucket_shares`)."""
    change = {b: sn[b] - sr[b] for b in sr}
    gained = max(change, key=change.get)
    lost = min(change, key=change.get)
    shares = ", ".join(f"{BUCKET_WORDS[b]} {sr[b]:.3f} → {sn[b]:.3f}" for b in sr)
    return (
        f"every bucket (share of |attention|): {shares}; the most went to the {BUCKET_WORDS[gained]} "
        f"({change[gained]:+.3f}), from the {BUCKET_WORDS[lost]} ({change[lost]:+.3f})"
    )


def _at_lambda0(run: Run) -> dict | None:
    """The model's own attention with λ forced to 0, as a model's results (docs/evaluation.md §6.3)."""
    own = run.results("alloc", "lambda0_reference")
    return None if own is None else {"alloc": {**own, "metadata": run.results("alloc", "metadata")}}


def _mean_shares(runs: list[Run]) -> dict[str, float] | None:
    """The bucket shares of |attention| (:func:`bucket_shares`) averaged over replicate runs."""
    shares = [bucket_shares(r) for r in (run.results("alloc") or {} for run in runs)]
    shares = [s for s in shares if s]
    return {b: float(np.mean([s[b] for s in shares])) for b in shares[0]} if shares else None


def _where_over_seeds(ref_runs: list[Run], new_runs: list[Run]) -> str | None:
    ref, new = _mean_shares(ref_runs), _mean_shares(new_runs)
    return None if ref is None or new is None else f"mean over the seeds: {_where_words(ref, new)}"


def _share_words_for(key: str, runs: list[Run]) -> str | None:
    """The words over seeds where a run's results predate shares of |attention| and its signed share was read."""
    signed = [run.results("alloc", f"{key}_magnitude") is None for run in runs if run.results("alloc", key) is not None]
    if not any(signed):
        return None
    how = "signed share" if all(signed) else "share of |attention|, signed where a run's results have no |attention|"
    return f"{_BUCKETS[key][1]} ({how})"


def _share_items(key: str, run: Run):
    """(the prompts' hash and which share, each prompt's share) — the items a row over seeds counts once beside the
    seeds (``Measure.per_item``): the share of |attention| where the run has it, else the signed one, as ``per_run``
    reads; None without per-sample values or the prompts' hash."""
    r = run.results("alloc") or {}
    samples, sha = r.get("per_sample") or [], (r.get("metadata") or {}).get("samples_sha1")
    per_key = _BUCKETS[key][0]
    if r.get(f"{key}_magnitude") is not None:
        per_key = f"{per_key}_magnitude"
    if not samples or sha is None or any(per_key not in p for p in samples):
        return None
    return (sha, per_key), [p[per_key] for p in samples]


def _uniform_level(key: str, run: Run) -> float | None:
    """The share uniform attention gets on the run's prompts (mean over them): the chance level of ``key``'s rows.
    A model near it attends to the answer (or the noise) no more than to any token; two such models differing by
    0.002 read as a difference in attention they do not have (an audit, 2026-12-03). None for results written
    before the level was kept."""
    samples = (run.results("alloc") or {}).get("per_sample") or []
    per_key = _BUCKETS[key][0]
    levels = [p["uniform"][per_key] for p in samples if isinstance(p.get("uniform"), dict) and per_key in p["uniform"]]
    return float(np.mean(levels)) if levels and len(levels) == len(samples) else None


def _share_measure(key: str) -> Measure:
    return Measure(
        f"{_BUCKETS[key][1]} (share of |attention|)",
        3,
        per_run=lambda run: first(run.results("alloc", f"{key}_magnitude"), run.results("alloc", key)),
        compare=lambda ref, new, seed: _compare_share(ref, new, seed, key),
        per_item=partial(_share_items, key),
        at_lambda0=_at_lambda0,
        seeds_note=_where_over_seeds,
        metric_for=lambda runs: _share_words_for(key, runs),
        chance=partial(_uniform_level, key),
    )


MEASURES = {f"alloc:{key}": _share_measure(key) for key in _BUCKETS}

# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Table 3", "more attention to the answer", "answer 0.03 → 0.27–0.40",
        "alloc:attention_to_answer", "higher", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Table 3", "less attention noise", "noise 0.51 → 0.01–0.02", "alloc:attention_noise", "lower",
        "baseline",
    ),
)  # fmt: skip


def _preflight(options, targets, name) -> None:
    """The allocation prompts fit (:func:`check_needle_cells`), and each target's tokenizer is a fast one (the
    buckets read every token's character offsets: :func:`run_allocation`)."""
    check_needle_cells(options, targets, [(options.alloc_needles or 1, 1)], name=name)
    for t in targets:
        if not getattr(t.tokenizer(), "is_fast", False):
            raise ValueError(
                f"attention allocation for {t.name} needs a fast tokenizer (character offsets of every token)"
            )


SUITE = Suite(
    "alloc",
    _run_suite,
    headline=_headline,
    compare=compare,
    # an asked alloc_needles must fit; by default the most up to niah_needles that fit, at least one
    preflight=_preflight,
    options=AllocOptions,
    protocol=needle_protocol,
    measures=MEASURES,
    claims=CLAIMS,
)
