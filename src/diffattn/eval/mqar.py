"""Associative recall: MQAR accuracy (after Zoology; how our generator differs: :mod:`diffattn.data.synthetic`),
and the AR-Hit vs Others loss split on real text (DIFF Table 6).

MQAR sequences come from the seeded generator :func:`diffattn.data.make_mqar_sample` (keys from the lower half of
a token range, values from the upper half, the key–value block first, every key queried once later); accuracy is
argmax-correct predictions at answer positions only. Configurations (seq, pairs): (64, 4), (128, 8), (256, 16) by
default; ``mqar_pairs`` asks for pair counts at one length ``mqar_length`` instead (more pairs at one length: more
distractor keys, the "noise" lever of a comparison). The token range is placed above the tokenizer's special and
256 byte tokens, as the training practice mix does, so a model trained with that mix is evaluated on the same
distribution.

Floors come from simulation, not from a formula: heuristic "models" that never match a query to its key
(:data:`HEURISTICS`: copy the first or last value of the block, a random value of the block, a random value not
asked yet, the most frequent value so far) are scored with the suite's own scorer on the suite's own samples, and
the floor a row prints is the best of them. "A random value not asked yet" matters: every key is asked once, so a
model that only learnt to skip answered values scores mean 1/(values left) — 0.34 at 8 pairs, not 1/8.

AR-Hit (Arora et al. 2023, Zoology; DIFF Table 6): on real text, a token t is an *AR hit* when the bigram
(x[t−1], x[t]) already occurred earlier in the same sequence — predicting it is a recall of the earlier
occurrence; every other token is *Others*. The mean loss of each group is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..data.packing import special_token_ids
from ..data.synthetic import MQARSample, make_mqar_sample
from .common import (
    Suite,
    check_fits,
    evaluation_window,
    int_list,
    load_text,
    model_device,
    option,
    window_preflight,
)
from .measures import (
    NO_PER_SAMPLE,
    ONE_NUMBER,
    Comparison,
    Measure,
    PaperClaim,
    Run,
    clears_floor,
    paired_kind,
    same_metadata,
    seeds_difference,
    value_text,
)
from .perplexity import per_token_windows, tokens_sha1
from .stats import (
    Difference,
    mean_interval,
    mean_se,
    normal_interval,
    paired_difference,
)

ACCURACY_DIGITS = 3  # what the accuracy rows print; the floor test reads the same precision

CONFIGS = ((64, 4), (128, 8), (256, 16))


def mqar_token_range(tokenizer) -> tuple[int, int]:
    """(token_offset, span) of MQAR tokens: above the specials and 256 byte tokens, below any later special."""
    sep_id, pad_id = special_token_ids(tokenizer)
    specials = {int(i) for i in tokenizer.all_special_ids} | {sep_id, pad_id}
    offset = len(specials) + 256
    span = min([i for i in specials if i >= offset], default=len(tokenizer)) - offset
    return offset, span


@torch.no_grad()
def mqar_per_sample(model: nn.Module, samples: list, batch: int = 64) -> list[float]:
    """Each sample's share of answers predicted right (argmax at the answer positions)."""
    device = model_device(model)
    out: list[float] = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        ids = torch.tensor([s.input_ids for s in chunk], device=device)
        target = torch.tensor([s.labels for s in chunk], device=device)[:, 1:]
        pred = model(ids, use_cache=False).logits[:, :-1].argmax(-1)  # no KV cache: nothing decodes
        mask = target != -100
        hits = ((pred == target) & mask).sum(-1).float() / mask.sum(-1).clamp_min(1)
        out += hits.tolist()
    return out


def mqar_accuracy(model: nn.Module, samples: list) -> float:
    """Share of answers predicted right over ``samples`` (every sample has the same number of answers)."""
    per_sample = mqar_per_sample(model, samples)
    return sum(per_sample) / len(per_sample)


# -- floors by simulation: heuristics that never match a query to its key ---------------------------------------------
def _queries(s: MQARSample) -> list[tuple[int, int]]:
    """(position of the query key, answer value) of each query, in order."""
    return [(t - 1, v) for t, v in enumerate(s.labels) if v != -100]


def _first_value(s: MQARSample, before: int, asked: list[int]) -> dict[int, float]:
    return {s.pairs[0][1]: 1.0}


def _last_value(s: MQARSample, before: int, asked: list[int]) -> dict[int, float]:
    return {s.pairs[-1][1]: 1.0}


def _random_value(s: MQARSample, before: int, asked: list[int]) -> dict[int, float]:
    return {v: 1.0 / len(s.pairs) for _, v in s.pairs}


def _random_unasked_value(s: MQARSample, before: int, asked: list[int]) -> dict[int, float]:
    left = [v for _, v in s.pairs if v not in asked]
    return {v: 1.0 / len(left) for v in left}


def _most_frequent_value(s: MQARSample, before: int, asked: list[int]) -> dict[int, float]:
    values = {v for _, v in s.pairs}
    counts: dict[int, int] = {}
    for tok in s.input_ids[: before + 1]:
        if tok in values:
            counts[tok] = counts.get(tok, 0) + 1
    top = max(counts.values())
    best = [v for v, c in counts.items() if c == top]
    return {v: 1.0 / len(best) for v in best}  # ties: a random one of them


# name → (sample, query position, values asked before) → {predicted value: probability}
HEURISTICS = {
    "first value of the block": _first_value,
    "last value of the block": _last_value,
    "random value of the block": _random_value,
    "random value not asked yet": _random_unasked_value,
    "most frequent value so far": _most_frequent_value,
}


def heuristic_accuracy(samples: list[MQARSample], heuristic) -> float:
    """The suite's scorer (share of answers right, averaged over samples) applied to a heuristic: the expected
    score over the heuristic's own randomness (a random choice among k values scores 1/k when one is the answer)."""
    scores = []
    for s in samples:
        asked: list[int] = []
        hits = 0.0
        for pos, answer in _queries(s):
            hits += heuristic(s, pos, asked).get(answer, 0.0)
            asked.append(answer)
        scores.append(hits / len(s.pairs))
    return sum(scores) / len(scores)


def mqar_floor(samples: list[MQARSample]) -> tuple[float, dict[str, float]]:
    """The best heuristic's score on ``samples`` (what a model without associative recall can reach) and each."""
    scores = {name: heuristic_accuracy(samples, h) for name, h in HEURISTICS.items()}
    return max(scores.values()), scores


def mqar_samples(
    seed: int, count: int, *, length: int, pairs: int, offset: int, span: int, vocab: int | None = None
) -> list[MQARSample]:
    """The suite's ``count`` seeded samples of one (length, pairs) configuration (the same for every model): keys
    and values from the first ``vocab`` tokens of the range (default: all ``span`` of them, as the training rows draw
    theirs without ``data.mqar_vocab``: keys from the first half, values from the second, so a cap here made values
    of tokens that training had used as keys once the span passed it; until 2026-12-01 the cap was 8,192)."""
    if vocab is not None and vocab > span:
        raise ValueError(f"mqar_vocab {vocab} is more than the tokenizer's {span} ordinary tokens")
    vocab = span if vocab is None else vocab
    if vocab < 2 * pairs + 2:
        raise ValueError(f"the tokenizer has too few ordinary tokens ({span}) for {pairs} MQAR pairs")
    return [
        make_mqar_sample(seed * 1_000_003 + i, vocab_size=vocab, seq_len=length, num_pairs=pairs, token_offset=offset)
        for i in range(count)
    ]


def run_mqar(
    model: nn.Module,
    tokenizer,
    *,
    configs=CONFIGS,
    samples: int = 32,
    seed: int = 0,
    text_source: str | None = "shakespeare",
    text_tokens: int = 4096,
    seq_len: int | None = None,
    progress: bool = True,
    vocab: int | None = None,
) -> dict:
    """MQAR accuracy per (seq, pairs) configuration and, when ``text_source`` is given, the AR-Hit/Others split."""
    offset, span = mqar_token_range(tokenizer)
    rows = []
    for length, pairs in tqdm(configs, desc="MQAR", disable=not progress, leave=False):
        check_fits(model, length, f"MQAR at seq {length}")
        batch = mqar_samples(seed, samples, length=length, pairs=pairs, offset=offset, span=span, vocab=vocab)
        per_sample = mqar_per_sample(model, batch)
        floor, heuristics = mqar_floor(batch)
        rows.append(
            {
                "seq_len": length,
                "pairs": pairs,
                "accuracy": sum(per_sample) / len(per_sample),
                "samples": samples,
                "floor": floor,
                "heuristics": heuristics,
                "per_sample": per_sample,
            }
        )
    result = {
        "mqar": rows,
        "metadata": {
            "token_offset": offset,
            "token_span": span,
            "samples_per_config": samples,
            "scoring": "argmax accuracy at answer positions",
            "floor": "best of the heuristics' scores on the same samples (mqar.HEURISTICS)",
            "configs": [list(c) for c in configs],
            "vocab": vocab,
            "seed": seed,
        },
    }
    if text_source is not None:
        window = evaluation_window(model, seq_len)
        check_fits(model, window, f"AR-Hit's window of {window} tokens")  # as every suite measuring in the window
        result["ar_hit"] = ar_hit_split(model, tokenizer, text_source, tokens=text_tokens, seq_len=window)
    return result


def ar_hit_mask(ids: torch.Tensor) -> torch.Tensor:
    """Bool ``[T]``: True at t when the bigram (ids[t−1], ids[t]) occurred at some earlier t' < t."""
    seen: set[tuple[int, int]] = set()
    out = torch.zeros(ids.numel(), dtype=torch.bool)
    values = ids.tolist()
    for t in range(1, len(values)):
        bigram = (values[t - 1], values[t])
        out[t] = bigram in seen
        seen.add(bigram)
    return out


@torch.no_grad()
def ar_hit_split(model: nn.Module, tokenizer, source: str, *, tokens: int, seq_len: int) -> dict:
    """Mean next-token loss on AR-Hit tokens vs the others, over disjoint ``seq_len`` windows of ``source``."""
    text, description = load_text(source, "test")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens])
    device = model_device(model)
    windows = {name: {"nll": [], "tokens": []} for name in ("ar_hit", "others")}
    for start in range(0, max(1, ids.numel() - 1), seq_len):
        chunk = ids[start : start + seq_len]
        if chunk.numel() < 2:
            break
        logits = model(chunk[None].to(device), use_cache=False).logits[0, :-1].float()
        loss = F.cross_entropy(logits, chunk[1:].to(device), reduction="none").cpu()
        hit = ar_hit_mask(chunk)[1:]
        for name, m in (("ar_hit", hit), ("others", ~hit)):
            windows[name]["nll"].append(float(loss[m].sum()))
            windows[name]["tokens"].append(int(m.sum()))
    sums = {name: sum(w["nll"]) for name, w in windows.items()}
    counts = {name: sum(w["tokens"]) for name, w in windows.items()}
    return {
        "ar_hit_loss": sums["ar_hit"] / counts["ar_hit"] if counts["ar_hit"] else None,
        "others_loss": sums["others"] / counts["others"] if counts["others"] else None,
        "ar_hit_tokens": counts["ar_hit"],
        "others_tokens": counts["others"],
        # each window's summed loss and token count of both kinds, each as the perplexity suite's per_window record:
        # two models on the same tokens are paired over them
        "per_window": windows,
        "metadata": {
            "text": description,
            "seq_len": seq_len,
            "tokens": int(ids.numel()),
            "tokens_sha1": tokens_sha1(ids),
        },
    }


def suite_configs(o) -> tuple[tuple[int, int], ...]:
    """The (length, pairs) configurations the options ask for: ``mqar_pairs`` at ``mqar_length``, else CONFIGS."""
    if o.mqar_pairs:
        return tuple((o.mqar_length, p) for p in sorted(set(o.mqar_pairs)))
    return CONFIGS


def _check(o, name) -> None:
    for p in o.mqar_pairs or ():
        if 4 * p > o.mqar_length:
            raise ValueError(
                f"{name('mqar_pairs')} {p} does not fit {name('mqar_length')} {o.mqar_length}: a sequence holds "
                f"the key-value block and one query-answer slot per pair (needs length >= 4·pairs = {4 * p})"
            )


def _preflight(o, targets, name) -> None:
    """Every (length, pairs) configuration fits each target's positions, its tokenizer has the keys and values,
    and AR-Hit's window fits."""
    for t in targets:
        offset, span = mqar_token_range(t.tokenizer())
        for length, pairs in suite_configs(o):
            asked = (
                f"MQAR at seq {length} ({name('mqar_length')})"
                if o.mqar_pairs
                else f"MQAR's default setting seq {length} ({pairs} pairs; set {name('mqar_pairs')} and "
                f"{name('mqar_length')} to what fits)"
            )
            t.check_fits(length, asked)
            mqar_samples(o.seed, 1, length=length, pairs=pairs, offset=offset, span=span, vocab=o.mqar_vocab)
    if o.mqar_ar_hit:
        window_preflight(o, targets, name)


def _run_suite(model, tokenizer, o, folder, name):
    r = run_mqar(
        model,
        tokenizer,
        configs=suite_configs(o),
        vocab=o.mqar_vocab,
        samples=o.mqar_samples,
        seed=o.seed,
        text_source=o.text if o.mqar_ar_hit else None,
        text_tokens=o.tokens,
        seq_len=o.window,
    )
    return r, {}


@dataclass
class MqarOptions:
    mqar_samples: int = option(32, "MQAR samples per (length, pairs) setting", minimum=1)
    mqar_pairs: tuple[int, ...] = option(
        (), "comma-separated pair counts at --mqar-length (default: 64/4, 128/8, 256/16)", parse=int_list
    )
    mqar_length: int = option(128, "sequence length of the --mqar-pairs configurations", minimum=8)
    mqar_vocab: int | None = option(
        None,
        "keys and values from this many tokens (as the training's data.mqar_vocab; default every ordinary one)",
        minimum=4,
    )
    mqar_ar_hit: int = option(
        1, "1: also the AR-Hit/Others loss split on --text (for models trained on text); 0: MQAR only", minimum=0,
        maximum=1,
    )  # fmt: skip


# -- what claims read (diffattn.experiments.claims) --------------------------------------------------------------------
def _rows(run: Run) -> list[dict] | None:
    rows = run.results("mqar", "mqar")
    return sorted(rows, key=lambda r: (r["pairs"], r["seq_len"])) if rows else None


def _largest(run: Run) -> dict | None:
    rows = _rows(run)
    return rows[-1] if rows else None


def _paired_rows(ref: Run, new: Run):
    """Both runs' rows when they measured the same configurations on the same samples, else None."""
    rr, rn = _rows(ref), _rows(new)
    if not rr or not rn:
        return None
    shape = lambda rows: [(r["seq_len"], r["pairs"], r["samples"]) for r in rows]  # noqa: E731
    same = shape(rr) == shape(rn)
    ma, mb = ref.results("mqar", "metadata"), new.results("mqar", "metadata")
    meta = same_metadata(ma, mb, "seed", "token_offset") and (ma or {}).get("vocab") == (mb or {}).get("vocab")
    return (rr, rn) if same and meta else None


def _cells(rows: list[dict]) -> str:
    return ", ".join(f"{r['pairs']} pairs at {r['seq_len']}" for r in rows)


def _compare_accuracy(ref: Run, new: Run, seed: int) -> Comparison | None:
    """Accuracy at the largest pair count: each model's mean over samples, the paired difference over the same
    samples."""
    a, b = _largest(ref), _largest(new)
    if a is None or b is None:
        return None
    metric = f"MQAR accuracy at {a['pairs']} pairs (floor {a.get('floor', float('nan')):.3f})"
    paired = _paired_rows(ref, new)
    if paired is None or "per_sample" not in a or "per_sample" not in b:
        kind = NO_PER_SAMPLE if paired else "none: the two models saw different samples"
        return Comparison(metric, ref_value=a["accuracy"], new_value=b["accuracy"], kind=kind, cells=_cells([a]))
    rm, rci = mean_interval(a["per_sample"], seed=seed)
    nm, nci = mean_interval(b["per_sample"], seed=seed)
    diff = paired_difference(a["per_sample"], b["per_sample"], seed=seed)
    return Comparison(
        metric, ref_value=rm, ref_ci=rci, new_value=nm, new_ci=nci, diff=diff, cells=_cells([a]),
        kind=paired_kind(diff, "MQAR samples"), note="data uncertainty only, one seed",
    )  # fmt: skip


def slope_weights(pairs: list[int]) -> list[float]:
    """Least-squares weights w with slope = Σ w·accuracy over log2(pairs): the change per doubling of the pairs."""
    x = [math.log2(p) for p in pairs]
    mean = sum(x) / len(x)
    ss = sum((v - mean) ** 2 for v in x)
    return [(v - mean) / ss for v in x] if ss > 0 else [0.0] * len(x)


def accuracy_slope(run: Run) -> float | None:
    """Accuracy change per doubling of the pair count (least squares over the configurations; needs two counts)."""
    rows = _rows(run)
    if not rows or len({r["pairs"] for r in rows}) < 2:
        return None
    w = slope_weights([r["pairs"] for r in rows])
    return sum(wi * r["accuracy"] for wi, r in zip(w, rows, strict=True))


SLOPE_WORDS = "MQAR accuracy change per doubling of the pairs"


def _slope_words(rows: list[dict]) -> str:
    """The slope's words for these configurations: where the sequence length grows with the pairs (the default
    grid: 4 pairs at 64 tokens … 16 at 256), the slope is per doubling of both, and the words say so."""
    lengths = [r["seq_len"] for r in rows]
    if len(set(lengths)) == 1:
        return SLOPE_WORDS
    return f"{SLOPE_WORDS} (the length growing with them, {lengths[0]} → {lengths[-1]} tokens: not separated)"


def _slope_metric_for(runs: list[Run]) -> str | None:
    words = {_slope_words(rows) for rows in map(_rows, runs) if rows}
    return next(iter(words)) if len(words) == 1 else None


def _compare_slope(ref: Run, new: Run, seed: int) -> Comparison | None:
    """The slopes' difference, with the normal interval of the mean over the samples of each sample's paired
    contribution to it (:func:`_slope_items`): sample k of every configuration comes from one seed (its keys are the
    first keys of the larger configurations'), so the configurations' samples are not independent, and a sum of the
    configurations' variances would miss their covariance. Data uncertainty only."""
    sr, sn = accuracy_slope(ref), accuracy_slope(new)
    if sr is None or sn is None:
        return None
    rows = _rows(ref)
    metric = _slope_words(rows)
    terms_r, terms_n = _slope_items(ref), _slope_items(new)
    paired = _paired_rows(ref, new)
    if paired is None or terms_r is None or terms_n is None:
        if paired is None:
            kind = "none: the two models saw different samples"
        elif any("per_sample" not in r for r in _rows(ref) + _rows(new)):
            kind = NO_PER_SAMPLE
        else:
            kind = "none: the configurations hold unequal numbers of samples (sample k of each is one item)"
        return Comparison(metric, ref_value=sr, new_value=sn, kind=kind, cells=_cells(rows))
    est, se = mean_se([b - a for a, b in zip(terms_r[1], terms_n[1], strict=True)])
    diff = Difference(est, normal_interval(est, se), "normal", len(terms_r[1]))
    return Comparison(
        metric, ref_value=sr, new_value=sn, diff=diff, cells=_cells(rows),
        kind=f"normal, from the {len(terms_r[1])} samples' paired contributions to the slope (sample k of every "
        "configuration from one seed)",
        note="data uncertainty only, one seed", veto=_not_ahead_at_largest(ref, new, seed),
    )  # fmt: skip


def _not_ahead_at_largest(ref: Run, new: Run, seed: int) -> str | None:
    """The claim is a model that degrades less as the pairs grow *and so recalls more*: a flatter slope from a model
    that is not ahead at the largest pair count (one at its floor everywhere is flat) does not agree with it, as the
    needle gap's row requires (``niah:gap``). Why not, or None where it is ahead (the paired interval of the
    accuracies there above 0 at the printed digits)."""
    c = _compare_accuracy(ref, new, seed)
    if _ahead(None if c is None or c.diff is None else c.diff.interval):
        return None
    return f"the slope is flatter but {new.name} is not ahead at the largest pair count"


def _ahead(ci) -> bool:
    """Whether a difference's interval lies above 0 at the printed digits: the floor rule every row reads
    (:func:`~diffattn.eval.measures.clears_floor`), against 0."""
    return ci is not None and math.isfinite(ci[0]) and clears_floor(ci[0], 0.0, ACCURACY_DIGITS)


def _behind_at_largest_over_seeds(ref_runs: list[Run], new_runs: list[Run], new: str) -> str | None:
    """:func:`_not_ahead_at_largest` over seeds: the accuracies at the largest pair count, with the interval the
    accuracy's own row over seeds reads (:func:`~diffattn.eval.measures.seeds_difference`)."""
    ahead = seeds_difference(MEASURES["mqar:accuracy"], ref_runs, new_runs)
    if ahead is not None and _ahead(ahead.interval):
        return None
    return f"the slope is flatter but {new} is not ahead at the largest pair count over seeds"


def _ar_hit_windows(r: dict | None, name: str = "ar_hit") -> tuple[np.ndarray, np.ndarray] | None:
    """(each window's mean loss on ``name`` tokens, their count) over the windows that have some; None for results
    from before the windows were kept."""
    return per_token_windows({"per_window": ((r or {}).get("per_window") or {}).get(name)}, skip_empty=True)


def _compare_ar_hit(ref: Run, new: Run, seed: int) -> Comparison | None:
    """DIFF Table 6's AR-Hit loss. Two models scored on the same tokens (same text, tokenizer and window: the same
    AR-Hit tokens) are paired over the text's windows, token-weighted, as the perplexity suite's rows are (data
    uncertainty only); the Others loss goes beside it, since a model better everywhere is better on AR-Hit tokens too.
    Results without the windows: the two numbers, no interval (an audit, 2026-12-03: the row could never give a
    verdict from one run per model)."""
    ar, an = ref.results("mqar", "ar_hit"), new.results("mqar", "ar_hit")
    a, b = (ar or {}).get("ar_hit_loss"), (an or {}).get("ar_hit_loss")
    if a is None or b is None:
        return None
    wr, wn = _ar_hit_windows(ar), _ar_hit_windows(an)
    paired = (
        wr is not None
        and wn is not None
        and same_metadata(ar.get("metadata"), an.get("metadata"), "tokens_sha1", "seq_len")
        and np.array_equal(wr[1], wn[1])
    )
    if not paired:
        return Comparison("AR-Hit loss", ref_value=a, new_value=b, kind=ONE_NUMBER)
    rv, rci = mean_interval(wr[0], weights=wr[1], seed=seed)
    nv, nci = mean_interval(wn[0], weights=wn[1], seed=seed)
    diff = paired_difference(wr[0], wn[0], weights=wr[1], seed=seed)
    others = ""
    orr, onn = _ar_hit_windows(ar, "others"), _ar_hit_windows(an, "others")
    if orr is not None and onn is not None and np.array_equal(orr[1], onn[1]):
        od = paired_difference(orr[0], onn[0], weights=orr[1], seed=seed)
        lo, hi = od.interval
        others = (
            f"; Others loss {ar['others_loss']:.3f} → {an['others_loss']:.3f} ({od.estimate:+.3f} [{lo:+.3f}, "
            f"{hi:+.3f}]): a model better everywhere is better on AR-Hit tokens too"
        )
    return Comparison(
        "AR-Hit loss", ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff,
        kind=paired_kind(diff, "text windows (AR-Hit tokens, token-weighted)"),
        note=f"data uncertainty only, one seed; {int(wr[1].sum())} AR-Hit tokens{others}",
    )  # fmt: skip


def _above_floor_somewhere(run: Run) -> bool | None:
    """Whether the run clears the floor at some configuration (:func:`~diffattn.eval.measures.clears_floor` with the
    normal 95% interval of its per-sample accuracy, the interval the suite prints, at the accuracy's digits); None
    without per-sample values."""
    rows = _rows(run)
    if not rows or any("per_sample" not in r or r.get("floor") is None for r in rows):
        return None
    for r in rows:
        mean, se = mean_se(r["per_sample"])
        if math.isfinite(se) and clears_floor(normal_interval(mean, se)[0], r["floor"], ACCURACY_DIGITS):
            return True
    return False


def _slope_at_floor(runs: list[Run]) -> str | None:
    """Every run at or below the floor at every pair count: the slope then measures the heuristics, not recall."""
    above = [_above_floor_somewhere(run) for run in runs]
    if not above or any(a is None or a for a in above):
        return None
    return "every model is at or below the floor at every pair count (the slope is the no-recall heuristics')"


def _samples_identity(run: Run, rows: list[dict]):
    """What names the MQAR samples ``rows`` were scored on (they are drawn from these alone: :func:`mqar_samples`),
    or None for results without the seed."""
    meta = run.results("mqar", "metadata") or {}
    if meta.get("seed") is None or meta.get("token_offset") is None:
        return None
    configs = tuple((r["seq_len"], r["pairs"], r["samples"]) for r in rows)
    return meta["seed"], meta["token_offset"], meta.get("token_span"), meta.get("vocab"), configs


def _accuracy_items(run: Run):
    """(the samples' identity, each sample's accuracy) at the largest pair count (``Measure.per_item``), or None."""
    row = _largest(run)
    identity = None if row is None else _samples_identity(run, [row])
    return None if identity is None or "per_sample" not in row else (identity, row["per_sample"])


def _slope_items(run: Run):
    """(the samples' identity, sample k's contribution Σ_c w_c·x_ck to the slope): their mean is the slope
    (:func:`accuracy_slope`), and sample k of every configuration comes from one seed, so these, not the
    configurations' samples, are the independent items. None without per-sample values, two pair counts, or the same
    count of samples in every configuration."""
    rows = _rows(run)
    if not rows or len({r["pairs"] for r in rows}) < 2 or any("per_sample" not in r for r in rows):
        return None
    counts = {len(r["per_sample"]) for r in rows}
    identity = _samples_identity(run, rows)
    if len(counts) != 1 or identity is None:
        return None
    w = slope_weights([r["pairs"] for r in rows])
    terms = [sum(wi * r["per_sample"][k] for wi, r in zip(w, rows, strict=True)) for k in range(counts.pop())]
    return identity, terms


def _floor(run: Run) -> float | None:
    row = _largest(run)
    return None if row is None else row.get("floor")


MEASURES = {
    "mqar:accuracy": Measure(
        "MQAR accuracy at the largest pair count", ACCURACY_DIGITS,
        per_run=lambda run: (_largest(run) or {}).get("accuracy"), compare=_compare_accuracy, chance=_floor,
        per_item=_accuracy_items,
    ),
    "mqar:slope": Measure(SLOPE_WORDS, 3, per_run=accuracy_slope, compare=_compare_slope, untestable=_slope_at_floor,
                          metric_for=_slope_metric_for, seeds_veto=_behind_at_largest_over_seeds,
                          per_item=_slope_items),
    "mqar:ar_hit_loss": Measure(
        "AR-Hit loss", 3, per_run=lambda run: run.results("mqar", "ar_hit", "ar_hit_loss"), compare=_compare_ar_hit
    ),
}  # fmt: skip


def _headline(r: dict) -> dict:
    out = {}
    for m in r["mqar"]:
        out[f"MQAR {m['seq_len']}/{m['pairs']}"] = m["accuracy"]
    if r["mqar"] and "floor" in r["mqar"][-1]:
        out[f"floor {r['mqar'][-1]['seq_len']}/{r['mqar'][-1]['pairs']}"] = r["mqar"][-1]["floor"]
    return out


def _compare_tables(results: dict[str, dict], out) -> list[str]:
    """Accuracy per configuration for every model, with the simulated floor of each configuration."""
    first = next(iter(results.values()))["mqar"]
    head = [f"{m['pairs']} pairs / {m['seq_len']}" for m in first]
    lines = ["MQAR accuracy (share of answers right; floor: the best heuristic without recall):", ""]
    lines += ["| model | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    lines.append("| floor | " + " | ".join(value_text(m.get("floor"), None, 3) for m in first) + " |")
    shape = [(m["seq_len"], m["pairs"]) for m in first]
    for name, r in results.items():
        # a model measured on other configurations is left out of the table
        if [(m["seq_len"], m["pairs"]) for m in r["mqar"]] == shape:
            lines.append(f"| {name} | " + " | ".join(f"{m['accuracy']:.3f}" for m in r["mqar"]) + " |")
    return [*lines, ""]


# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Table 6", "lower loss on associative-recall tokens (AR-Hit)",
        "AR-Hit 0.898 (Transformer), 0.899 (half the heads) vs 0.880 (DIFF), 1.4B models", "mqar:ar_hit_loss",
        "lower", "baseline",
    ),
    PaperClaim(
        "MQAR (ours, from DIFF Table 6's AR-Hit)", "better multi-query associative recall at the most pairs",
        "not measured in the paper; its less-attention-noise claim predicts it", "mqar:accuracy", "higher",
        "baseline",
    ),
    PaperClaim(
        "MQAR (ours, from DIFF Table 6's AR-Hit)", "recall degrades less as the pairs (distractor keys) grow",
        "not measured in the paper (cf. Table 2: the gap grows with N)", "mqar:slope", "higher", "baseline",
    ),
)  # fmt: skip


SUITE = Suite(
    "mqar",
    _run_suite,
    headline=_headline,
    compare=_compare_tables,
    options=MqarOptions,
    check=_check,
    preflight=_preflight,
    measures=MEASURES,
    claims=CLAIMS,
)
