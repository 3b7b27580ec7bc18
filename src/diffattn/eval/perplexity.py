"""Perplexity with a strided sliding window (docs/evaluation.md §4; Hugging Face's fixed-length-model recipe).

The text is tokenized once; windows of ``window`` tokens start every ``stride`` tokens, and each window scores only
the tokens the previous one did not (the first window scores all but its first token), each with up to
``window − stride`` tokens of context before it. PPL = exp(mean NLL over scored tokens). Defaults: window = the
model's context, stride = window / 2. This is *token*-level perplexity on the model's own tokenizer: it is not
comparable across tokenizers, and it is not lm-eval's ``wikitext`` number (disjoint windows, word perplexity).

``per_window`` holds each window's summed NLL and scored-token count (the windows score disjoint tokens): two
models with the same tokenizer and text (same ``metadata["tokens_sha1"]``) score the same tokens in the same
windows, so their per-window NLLs can be compared pair by pair (an interval for the data's uncertainty; neighbouring
windows are not independent text, so it is somewhat optimistic).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .common import Suite, check_fits, evaluation_window, figure, model_device, save_figure, window_preflight
from .measures import (
    TEXT_SHARE,
    UNIGRAM_FLOOR,
    Comparison,
    Measure,
    PaperClaim,
    Run,
    finite,
    paired_kind,
    same_metadata,
)
from .stats import mean_interval, paired_difference


@torch.no_grad()
def sliding_window_nll(
    model: nn.Module,
    ids: torch.Tensor,
    *,
    window: int,
    stride: int,
    progress: bool = True,
    per_window: list[tuple[float, int]] | None = None,
) -> tuple[float, int]:
    """(sum of NLL, number of scored tokens) of a 1-D token tensor ``ids``; ``per_window``, a list, receives each
    window's (sum of NLL, scored tokens)."""
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"need a 1-D sequence of at least 2 tokens, got shape {tuple(ids.shape)}")
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in [1, window={window}], got {stride}")
    device = model_device(model)
    n = ids.numel()
    total, count, scored_to = 0.0, 0, 1  # the first token is never scored: nothing predicts it
    starts = list(range(0, max(1, n - 1), stride))
    for start in tqdm(starts, desc="perplexity", disable=not progress, leave=False):
        end = min(start + window, n)
        chunk = ids[start:end].to(device)[None]
        # no KV cache: nothing here decodes, and without one DIFF V1's layer may hand its heads over in pairs where
        # the route table measured that faster (diffattn.models.diff_llama)
        logits = model(chunk, use_cache=False).logits[0, :-1].float()
        targets = chunk[0, 1:]
        first_new = max(scored_to, start + 1) - (start + 1)  # index into targets of the first unscored token
        if first_new < targets.numel():
            nll = F.cross_entropy(logits[first_new:], targets[first_new:], reduction="sum")
            total += float(nll)
            count += targets.numel() - first_new
            if per_window is not None:
                per_window.append((float(nll), targets.numel() - first_new))
        scored_to = end
        if end == n:
            break
    return total, count


def run_perplexity(
    model: nn.Module,
    tokenizer,
    *,
    text: str | None = None,
    source: str = "shakespeare",
    window: int | None = None,
    stride: int | None = None,
    max_tokens: int | None = 8192,
    progress: bool = True,
) -> dict:
    """Token-level perplexity of ``model`` on ``text`` (default: the test split of ``source``)."""
    from .common import load_text

    description = "given text"
    if text is None:
        text, description = load_text(source, "test")
    window = evaluation_window(model, window)
    check_fits(model, window, f"perplexity window={window}")
    stride = stride or max(1, window // 2)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    windows: list[tuple[float, int]] = []
    nll, count = sliding_window_nll(model, ids, window=window, stride=stride, progress=progress, per_window=windows)
    mean = nll / count
    return {
        "nll": mean,
        "ppl": math.exp(min(mean, 50.0)),
        "scored_tokens": count,
        "per_window": {"nll": [w[0] for w in windows], "tokens": [w[1] for w in windows]},
        "metadata": {
            "tokens_sha1": tokens_sha1(ids),
            "per_window": "summed NLL and scored tokens of every window (disjoint scored tokens)",
            "text": description,
            "window": window,
            "stride": stride,
            "max_tokens": max_tokens,
            "level": "token (the model's own tokenizer); not lm-eval's word perplexity",
        },
    }


def tokens_sha1(ids: torch.Tensor) -> str:
    """A fingerprint of the evaluated token ids (equal ids ⇒ per-window results are paired across models)."""
    return hashlib.sha1(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()


def plot_perplexity(results: dict[str, dict], path) -> object:
    """Bar chart of perplexity per model, ``results`` = {model name: run_perplexity result}."""
    plt = figure()
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(results)), 3))
    names = list(results)
    ax.bar(names, [results[n]["ppl"] for n in names], color="tab:blue")
    ax.set_ylabel("perplexity")
    ax.set_title("strided sliding-window perplexity")
    return save_figure(fig, path)


def _run_suite(model, tokenizer, o, folder, name):
    r = run_perplexity(model, tokenizer, source=o.text, window=o.window, max_tokens=o.tokens)
    return r, {"ppl": plot_perplexity({name: r}, folder / "ppl.png").name}


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
TEST_NLL = "test NLL/token (ppl suite)"  # what the loss rows read where the ppl suite has per-window NLLs


def per_token_windows(r: dict | None, *, skip_empty: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """(per-window mean NLL, tokens) of a ``per_window`` {"nll": sums, "tokens": counts} record. A window without
    tokens makes the record unreadable (None), or, with ``skip_empty`` (a subset of each window's tokens, as
    AR-Hit's), is left out; None where no window is left."""
    pw = (r or {}).get("per_window")
    if not pw or not pw.get("nll") or len(pw["nll"]) != len(pw.get("tokens", [])):
        return None
    nll, tokens = np.asarray(pw["nll"], dtype=float), np.asarray(pw["tokens"], dtype=float)
    if skip_empty:
        nll, tokens = nll[tokens > 0], tokens[tokens > 0]
    if not tokens.size or np.any(tokens <= 0):
        return None
    return nll / tokens, tokens


def _compare_loss(ref: Run, new: Run, seed: int) -> Comparison | None:
    """Validation loss. One run per model: the val losses have no interval; this suite's per-window NLLs on the
    same tokens give a paired one (data uncertainty only)."""
    lr, ln = ref.row.get("val_loss"), new.row.get("val_loss")
    if not finite(lr) or not finite(ln):
        return None
    pr, pn = ref.results("ppl"), new.results("ppl")
    wr, wn = per_token_windows(pr), per_token_windows(pn)
    paired = (
        wr is not None
        and wn is not None
        and same_metadata(pr.get("metadata"), pn.get("metadata"), "tokens_sha1", "window", "stride")
        and np.array_equal(wr[1], wn[1])
    )
    val = f"val loss {lr:.4f} → {ln:.4f}"
    if paired:
        rv, rci = mean_interval(wr[0], weights=wr[1], seed=seed)
        nv, nci = mean_interval(wn[0], weights=wn[1], seed=seed)
        diff = paired_difference(wr[0], wn[0], weights=wr[1], seed=seed)
        return Comparison(
            TEST_NLL, ref_value=rv, ref_ci=rci, new_value=nv, new_ci=nci, diff=diff,
            kind=paired_kind(diff, "text windows (token-weighted)"), note=f"data uncertainty only, one seed; {val}",
        )  # fmt: skip
    why = "no per-window NLL of the same text (ppl suite)" if wr is None or wn is None else "different token windows"
    return Comparison("val loss", ref_value=lr, new_value=ln, kind=f"none: one seed and {why}")


#: below this share of text rows in its training data a model's loss on text is a by-product: every run of the
#: mqar-seeds exports (1% text) sits at the validation rows' unigram cross-entropy (6.28 nats, their own tokenizer:
#: audit of 2026-12-01), DIFF's worse than it, while runs with 25% text reach 4.2-5.0
MIN_TEXT_SHARE = 0.1


def _no_language_modelling(runs: list[Run]) -> str | None:
    """Why a loss row's runs cannot test a claim about language modelling: a model trained mostly on synthetic rows
    (retrieval practice, MQAR), whose loss on text says how much of the text's token statistics a few rows taught
    it, or a model whose validation loss is not below the validation rows' unigram cross-entropy (knowing which
    tokens are common scores that; runs from before 2026-12-01 do not record it)."""
    for run in runs:
        share = run.row.get(TEXT_SHARE)
        if finite(share) and share < MIN_TEXT_SHARE:
            return (
                f"{run.name} trained on {share:.0%} text rows (the rest synthetic): its loss on text is a by-product "
                "of those few rows, not language modelling"
            )
        loss, floor = run.row.get("val_loss"), run.row.get(UNIGRAM_FLOOR)
        if finite(loss) and finite(floor) and round(loss, 4) >= round(floor, 4):
            return (
                f"{run.name}'s validation loss {loss:.4f} is not below the validation rows' unigram cross-entropy "
                f"{floor:.4f}: it has learnt no more than which tokens are common"
            )
    return None


def _test_nll_windows(run: Run):
    """The ppl suite's (per-window mean NLL, tokens, metadata) of a run, or None."""
    r = run.results("ppl")
    windows = per_token_windows(r)
    return None if windows is None else (*windows, (r or {}).get("metadata") or {})


def _test_nll(run: Run) -> float | None:
    """The run's NLL/token on the ppl suite's text (its windows token-weighted), or None."""
    w = _test_nll_windows(run)
    return None if w is None else float(np.sum(w[0] * w[1]) / np.sum(w[1]))


def _test_nll_items(run: Run):
    """(the text's token hash, window, stride and the windows' token counts; each window's NLL/token scaled by its
    share of the tokens × the window count): their plain mean is :func:`_test_nll`, and every run over the same
    windows scales them alike — the items a row over seeds counts once beside the seeds (``Measure.per_item``). None
    without finite per-window values or without the tokens' hash, window and stride."""
    w = _test_nll_windows(run)
    if w is None or not np.all(np.isfinite(w[0])):
        return None
    nll, tokens, meta = w
    named = [meta.get(k) for k in ("tokens_sha1", "window", "stride")]  # what _compare_loss pairs windows by
    if any(v is None for v in named):
        return None
    return (*named, tuple(tokens.tolist())), (nll * tokens * len(tokens) / tokens.sum()).tolist()


def _val_loss_beside(ref_runs: list[Run], new_runs: list[Run]) -> str | None:
    """The training's validation loss over the same seeds, beside a row that reads the ppl suite's NLL (None where a
    side has none)."""
    values = [[v for v in (r.row.get("val_loss") for r in runs) if finite(v)] for runs in (ref_runs, new_runs)]
    if not all(values):
        return None
    return f"val loss (mean over seeds) {np.mean(values[0]):.4f} → {np.mean(values[1]):.4f}"


# the training's validation loss, with this suite's paired interval where both models ran it; over seeds, where every
# run ran it on the same tokens, this suite's NLL/token with its windows counted once beside the seeds (the
# validation loss keeps no per-window values, and the windows every run shares are a chance Welch does not see)
MEASURES = {
    "loss": Measure(
        "val loss",
        4,
        per_run=lambda run: run.row.get("val_loss"),
        compare=_compare_loss,
        untestable=_no_language_modelling,
        seeds_measure=Measure(
            TEST_NLL,
            4,
            per_run=_test_nll,
            compare=_compare_loss,
            untestable=_no_language_modelling,
            per_item=_test_nll_items,
            seeds_note=_val_loss_beside,
        ),
    )
}


# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 3", "lower language-modelling loss than a same-size Transformer",
        "DIFF needs ~62–65% of the parameters or tokens for the same loss", "loss", "lower", "baseline",
    ),
)  # fmt: skip


SUITE = Suite(
    "ppl",
    _run_suite,
    headline=lambda r: {"PPL": r["ppl"]},
    measures=MEASURES,
    claims=CLAIMS,
    preflight=window_preflight,
)
