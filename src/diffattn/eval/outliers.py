"""Activation outliers and low-bit attention logits (DIFF Transformer Table 5, Fig. 8; docs/evaluation.md §9–10).

Outliers: over a fixed token budget of held-out text (disjoint windows), collect |attention logits| — the scaled
pre-softmax scores of every map (both maps for two-map models), at the entries the causal mask keeps — and
|hidden states| (the raw output of every decoder layer, the last one before the final norm), and report the
top-1/2/3/10/100 values and the median of each. Paper: top-1 attention logit 318.0 (Transformer) vs 38.8 (DIFF).

Quantization: the logits of every map are absmax-quantized per head and sample to 16 (none), 8, 6 and 4 bits
(:mod:`diffattn.ops.quantized`) and the score left is measured: token perplexity on the same held-out text
(the offline stand-in for the paper's HellaSwag; stated in the metadata), and with every logit equal (each map
uniform, ours): what the logits are worth, without which a small drop may only mean a model that uses them little.
Plain Hugging Face attention modules (baselines, pretrained bases) are rerouted through the same quantized attention
by :class:`QuantizedLogits`.

Per window: both suites also keep one value per evaluation window (``per_window``): the top-1 |attention logit|
and |hidden state| of each window, and each window's summed NLL and token count at each width. Two models with
the same tokenizer and text (same ``metadata["tokens_sha1"]``) see the same windows, so these can be compared pair
by pair: an interval over windows for the *typical window's* largest value (not for the single largest value over
all windows, which has no such interval) and for the NLL a width costs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..ops.quantized import UNIFORM_LOGITS, quantized_attention, quantized_logits
from .capture import AttentionCapture, reporting_and_plain_attention
from .common import Suite, check_fits, evaluation_window, fmt, load_text, model_device, window_preflight
from .measures import (
    NO_PER_SAMPLE,
    Comparison,
    Measure,
    PaperClaim,
    Run,
    clears_floor,
    finite,
    paired_kind,
    same_metadata,
    value_text,
)
from .perplexity import per_token_windows, sliding_window_nll, tokens_sha1
from .stats import mean_interval, paired_difference

TOP_K = (1, 2, 3, 10, 100)
BITS = (16, 8, 6, 4)


def top_stats(values: np.ndarray) -> dict[str, float]:
    """Top-1/2/3/10/100 and median of a flat array of magnitudes (k beyond the size: None), and how many values they
    are of (``values``: a maximum over more values is larger, so two models' top-k compare like with like only over
    pools of one size)."""
    if values.size == 0:
        raise ValueError("no values to summarise")
    n = values.size
    k_max = min(max(TOP_K), n)
    top = np.sort(np.partition(values, n - k_max)[n - k_max :])[::-1]
    out = {f"top{k}": float(top[k - 1]) if k <= n else None for k in TOP_K}
    out["median"] = float(np.median(values))
    out["values"] = int(n)
    return out


def _windows(model, tokenizer, source: str, tokens: int, seq_len: int | None):
    text, description = load_text(source, "test")
    seq_len = evaluation_window(model, seq_len)
    check_fits(model, seq_len, f"windows of {seq_len} tokens")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens])
    return [ids[i : i + seq_len] for i in range(0, ids.numel(), seq_len) if ids[i : i + seq_len].numel() > 1], {
        "text": description,
        "tokens": int(ids.numel()),
        "seq_len": seq_len,
        "tokens_sha1": tokens_sha1(ids),
    }


@torch.no_grad()
def run_outliers(
    model: nn.Module,
    tokenizer,
    *,
    source: str = "shakespeare",
    tokens: int = 2048,
    seq_len: int | None = None,
    progress: bool = True,
) -> dict:
    """Top-k and median of |attention logits| and |hidden states| (see the module doc)."""
    windows, meta = _windows(model, tokenizer, source, tokens, seq_len)
    logits: list[np.ndarray] = []
    device = model_device(model)

    def keep(rec):
        logits.extend(x.abs().cpu().numpy().ravel() for x in rec.kept_logits())

    hidden: list[np.ndarray] = []
    window_logit_top1: list[float] = []
    window_hidden_top1: list[float] = []

    def keep_layer_output(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        hidden.append(h.detach().abs().float().cpu().numpy().ravel())

    hooks = [layer.register_forward_hook(keep_layer_output) for layer in decoder_layers(model)]
    try:
        for chunk in tqdm(windows, desc="outliers", disable=not progress, leave=False):
            first_logit, first_hidden = len(logits), len(hidden)
            with AttentionCapture(model, callback=keep, store=False):
                model(chunk[None].to(device))
            window_logit_top1.append(max(float(x.max()) for x in logits[first_logit:] if x.size))
            window_hidden_top1.append(max(float(x.max()) for x in hidden[first_hidden:] if x.size))
    finally:
        for h in hooks:
            h.remove()
    return {
        "attention_logits": top_stats(np.concatenate(logits)),
        "hidden_states": top_stats(np.concatenate(hidden)),
        "per_window": {"attention_logits_top1": window_logit_top1, "hidden_states_top1": window_hidden_top1},
        "metadata": {
            **meta,
            "attention_logits": "scaled Q·Kᵀ of every map (both for two-map models), causal entries only",
            "hidden_states": "raw output of every decoder layer (the residual stream after it; the last layer's "
            "before the final norm, unlike transformers' hidden_states[-1])",
            "per_window": "top-1 |attention logit| and |hidden state| of every window (paired across models with the "
            "same tokens_sha1)",
        },
    }


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM (PEFT-wrapped or not), in order: ``get_decoder().layers``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", base)
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)  # GPT-2 names them h
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__}")
    return list(layers)


class QuantizedLogits:
    """Context manager: every attention module of ``model`` computes with ``bits``-bit logits.

    Our modules obey :func:`diffattn.ops.quantized.quantized_logits` themselves; plain HF attention modules get a
    forward hook that recomputes their output through :func:`quantized_attention` from the same Q, K, V."""

    def __init__(self, model: nn.Module, bits: int | None):
        self.model, self.bits, self._hooks, self._ctx = model, bits, [], None

    def __enter__(self):
        from ..adapters.model_types import get_spec, project_output, recompute_attention_call

        self._ctx = quantized_logits(self.bits)
        self._ctx.__enter__()
        if self.bits is None or self.bits >= 16:
            return self
        _, plain = reporting_and_plain_attention(self.model)
        if plain:
            base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            spec = get_spec(base)

            def hook(module, args, kwargs, output):
                c = recompute_attention_call(spec, module, args, kwargs)
                out = quantized_attention(
                    c.q, c.k, None, None, c.v, None, causal=c.causal, attn_mask=c.attn_mask, scale=c.scale,
                    bits=self.bits,
                )  # fmt: skip
                return (project_output(spec, module, out), None)

            self._hooks = [a.register_forward_hook(hook, with_kwargs=True) for _, a in plain]
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._ctx.__exit__(*exc)


@torch.no_grad()
def run_quantization(
    model: nn.Module,
    tokenizer,
    *,
    bits=BITS,
    source: str = "shakespeare",
    tokens: int = 2048,
    seq_len: int | None = None,
    progress: bool = True,
) -> dict:
    """Token perplexity with attention logits quantized to each width in ``bits`` (16 = unquantized; each in [2, 16]),
    and with every logit equal (``uniform``: each map uniform over the visible keys,
    :data:`~diffattn.ops.quantized.UNIFORM_LOGITS`; ours): uniform − 16-bit is what the model's logits are worth."""
    if not bits or any(not isinstance(b, int) or not 2 <= b <= 16 for b in bits):
        raise ValueError(f"bits must be widths in [2, 16] (uniform maps are scored apart), got {bits!r}")
    windows, meta = _windows(model, tokenizer, source, tokens, seq_len)
    ids = torch.cat(windows)
    window = meta["seq_len"]

    def score(b: int) -> dict:
        per: list[tuple[float, int]] = []
        with QuantizedLogits(model, None if b >= 16 else b):
            nll, count = sliding_window_nll(model, ids, window=window, stride=window, progress=False, per_window=per)
        return {
            "bits": b,
            "nll": nll / count,
            "ppl": math.exp(min(nll / count, 50.0)),
            "per_window": {"nll": [w[0] for w in per], "tokens": [w[1] for w in per]},
        }

    widths = [*bits, UNIFORM_LOGITS]
    rows = [score(b) for b in tqdm(widths, desc="logit quantization", disable=not progress, leave=False)]
    return {
        "quantization": rows[:-1],
        "uniform": rows[-1],
        "metadata": {
            **meta,
            "quantizer": "absmax per head and sample over kept entries, scale = max|x|/(2^(b-1)-1), round",
            "applied_to": "attention logits of every map only",
            "uniform": "every logit equal (bits 0): each map uniform over the keys the mask keeps, what the model "
            "scores without its attention patterns (ours; results from before 2026-12-02 lack it)",
            "score": "token perplexity, disjoint windows (stand-in for the paper's HellaSwag accuracy)",
            "per_window": "summed NLL and tokens of every window at each width (paired across widths and across "
            "models with the same tokens_sha1)",
        },
    }


def _compare_outliers(outl: dict[str, dict], out) -> list[str]:
    keys = ["top1", "top2", "top3", "top10", "top100", "median"]
    lines = ["Activation outliers (|attention logits| / |hidden states|):", ""]
    lines += ["| model | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for n, r in outl.items():
        cells = [f"{fmt(r['attention_logits'][k])} / {fmt(r['hidden_states'][k])}" for k in keys]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _compare_quant_tables(quant: dict[str, dict], out) -> list[str]:
    bits = [q["bits"] for q in next(iter(quant.values()))["quantization"]]
    lines = ["Perplexity with attention logits quantized (absmax per head):", ""]
    lines += [
        "| model | " + " | ".join(f"{b}-bit" for b in bits) + " | uniform maps |",
        "|---|" + "---|" * (len(bits) + 1),
    ]
    for n, r in quant.items():
        uniform = f"{r['uniform']['ppl']:.3f}" if r.get("uniform") else "–"  # results from before 2026-12-02 lack it
        lines.append(f"| {n} | " + " | ".join(f"{q['ppl']:.3f}" for q in r["quantization"]) + f" | {uniform} |")
    return [*lines, ""]


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
def _compare_top1(ref: Run, new: Run, seed: int, which: str, label: str) -> Comparison | None:
    """The top-1 |value| of ``which`` (attention logits or hidden states): the overall top-1 has no interval; the
    mean per-window top-1 over the same text windows has a paired one."""
    orr, on = ref.results("outliers"), new.results("outliers")
    vr, vn = ref.results("outliers", which, "top1"), new.results("outliers", which, "top1")
    if vr is None or vn is None:
        return None
    metric = f"top-1 {label}"
    wr = (orr.get("per_window") or {}).get(f"{which}_top1")
    wn = (on.get("per_window") or {}).get(f"{which}_top1")
    headline = f"{ref.name} → {new.name}: top-1 {label} {vr:.2f} → {vn:.2f}"
    pools = _pools(ref, new, which)
    if not wr or not wn:
        return Comparison(metric, ref_value=vr, new_value=vn, kind=NO_PER_SAMPLE, ours=headline, note=pools or "")
    if len(wr) != len(wn) or not same_metadata(orr.get("metadata"), on.get("metadata"), "tokens_sha1", "seq_len"):
        return Comparison(
            metric, ref_value=vr, new_value=vn, ours=headline, note=pools or "",
            kind="none: the two models saw different token windows (another tokenizer)",
        )  # fmt: skip
    rm, rci = mean_interval(wr, seed=seed)
    nm, nci = mean_interval(wn, seed=seed)
    diff = paired_difference(wr, wn, seed=seed)
    # the interval, and so the verdict, is the mean per-window top-1's, as over seeds: the row's words name it (the
    # overall top-1, the paper's, is in the headline)
    return Comparison(
        f"mean per-window top-1 {label}", ref_value=rm, ref_ci=rci, new_value=nm, new_ci=nci, diff=diff,
        ours=f"{headline}; mean per-window top-1 {value_text(rm, rci, 2)} → {value_text(nm, nci, 2)}",
        kind=paired_kind(diff, "text windows, of the mean per-window top-1 (the overall top-1 has no interval)"),
        note="data uncertainty only, one seed" + (f"; {pools}" if pools else ""),
    )  # fmt: skip


def _pools(ref: Run, new: Run, which: str) -> str | None:
    """Where two models' maxima are over pools of different sizes (DIFF V2 has twice the Transformer's logit maps, the
    halved-heads control half; DIFF V1 as many: two maps of half the heads), how much larger the new model's is: a
    larger pool has a larger maximum (audit 2026-12-01: about +1 logit per doubling in seeds-loss)."""
    nr, nn_ = ref.results("outliers", which, "values"), new.results("outliers", which, "values")
    if not nr or not nn_ or nr == nn_:
        return None
    ratio = nn_ / nr
    return f"{new.name}'s maxima are over {ratio:.2g}× as many values as {ref.name}'s (a larger pool, a larger maximum)"


def _quant_windows(r: dict | None):
    """(lowest width, per-window NLL/token at 16 bits and at the lowest width, tokens) or None."""
    rows = (r or {}).get("quantization") or []
    by_bits = {q["bits"]: q for q in rows}
    if 16 not in by_bits or min(by_bits) >= 16:
        return None
    low = min(by_bits)
    w16, wlo = per_token_windows(by_bits[16]), per_token_windows(by_bits[low])
    if w16 is None or wlo is None or not np.array_equal(w16[1], wlo[1]):
        return low, None
    return low, (w16[0], wlo[0], w16[1])


def _quant_drop(r: dict | None) -> float | None:
    rows = (r or {}).get("quantization") or []
    by_bits = {q["bits"]: q["nll"] for q in rows}
    if 16 not in by_bits or min(by_bits) >= 16:
        return None
    return by_bits[min(by_bits)] - by_bits[16]


def _quant_items(run: Run):
    """(the windows' token hash, length, lowest width and token counts; each window's NLL increase at the lowest width,
    scaled by its share of the tokens × the window count): their plain mean is the run's token-weighted drop
    (:func:`_quant_drop`), and every run over the same windows scales them alike — the items a row over seeds counts
    once beside the seeds (``Measure.per_item``). None without per-window values or the tokens' hash."""
    r = run.results("quant")
    windows, meta = _quant_windows(r), (r or {}).get("metadata") or {}
    if windows is None or windows[1] is None or meta.get("tokens_sha1") is None:
        return None
    low, (w16, wlo, tokens) = windows
    values = (wlo - w16) * tokens * len(tokens) / tokens.sum()
    return (meta["tokens_sha1"], meta.get("seq_len"), low, tuple(tokens.tolist())), values.tolist()


def _logit_worth(r: dict | None, seed: int = 0):
    """What a model's attention logits are worth on the text: the NLL/token with every logit equal (each map
    uniform) less that at 16 bits, paired over the windows (token-weighted; a :class:`~diffattn.eval.stats.Difference`):
    what a width that kept nothing of the logits would cost; None for results without the uniform row (before
    2026-12-02)."""
    rows = {q["bits"]: q for q in (r or {}).get("quantization") or []}
    uniform = (r or {}).get("uniform")
    w16, wu = per_token_windows(rows.get(16)), per_token_windows(uniform)
    if w16 is None or wu is None or not np.array_equal(w16[1], wu[1]):
        return None
    return paired_difference(w16[0], wu[0], weights=w16[1], seed=seed)


WORTH = "what the logits are worth (uniform maps − 16-bit NLL/token"


def _worth_words(qr: dict | None, qn: dict | None) -> str | None:
    """The two sides' logit worth, for a quant row's note. Not as a share the drop is of it: a coarse width can cost
    more than uniform maps (absmax rounding can move a map further from the model's own), and for two-map heads
    uniform maps give (1 − λ)·mean V through the head's norm, another intervention than a one-map head's (review of
    2026-12-02)."""
    wr, wn = _logit_worth(qr), _logit_worth(qn)
    if wr is None or wn is None:
        return None
    return f"{WORTH}) {value_text(wr.estimate, wr.interval, 4)} → {value_text(wn.estimate, wn.interval, 4)}"


def _worth_over_seeds(ref_runs: list[Run], new_runs: list[Run]) -> str | None:
    """A quant row over seeds' note: each side's logit worth averaged over its seeds."""
    means = []
    for runs in (ref_runs, new_runs):
        worth = [w.estimate for w in (_logit_worth(r.results("quant")) for r in runs) if w is not None]
        if not worth:
            return None
        means.append(np.mean(worth))
    return f"{WORTH}, mean over seeds) {means[0]:.4f} → {means[1]:.4f}"


def _logits_worth_nothing(runs: list[Run]) -> str | None:
    """A model whose attention logits are worth nothing on the text (uniform maps score as well as its own: the
    lower end of the paired interval not above 0 at the row's digits) has nothing a low width could take: its small
    drop is not robustness, so the row cannot test the claim (audit of 2026-12-01, finding 6). A sanity check: a
    trained model's logits are worth far more than 0, and logits worth little but something do not trip it."""
    for run in runs:
        worth = _logit_worth(run.results("quant"))
        if worth is not None and math.isfinite(worth.interval[0]) and not clears_floor(worth.interval[0], 0.0, 4):
            return (
                f"{run.name}'s attention logits are worth nothing on this text (uniform maps − 16-bit NLL/token "
                f"{value_text(worth.estimate, worth.interval, 4)}): a low width has nothing to take"
            )
    return None


def _compare_quant(ref: Run, new: Run, seed: int) -> Comparison | None:
    """The NLL increase from 16 bits to the lowest width, paired over the same text windows."""
    qr, qn = ref.results("quant"), new.results("quant")
    dr, dn = _quant_drop(qr), _quant_drop(qn)
    if dr is None or dn is None:
        return None
    wr, wn = _quant_windows(qr), _quant_windows(qn)
    metric = f"NLL increase at {min(wr[0], wn[0])} bits"
    if wr[1] is None or wn[1] is None:
        return Comparison(metric, ref_value=dr, new_value=dn, kind=NO_PER_SAMPLE)
    (r16, rlo, tok_r), (n16, nlo, tok_n) = wr[1], wn[1]
    if (
        wr[0] != wn[0]
        or not np.array_equal(tok_r, tok_n)
        or not same_metadata(qr.get("metadata"), qn.get("metadata"), "tokens_sha1", "seq_len")
    ):
        return Comparison(
            metric, ref_value=dr, new_value=dn, kind="none: the two models saw different token windows or widths"
        )
    ref_d = paired_difference(r16, rlo, weights=tok_r, seed=seed)
    new_d = paired_difference(n16, nlo, weights=tok_n, seed=seed)
    diff = paired_difference(rlo - r16, nlo - n16, weights=tok_r, seed=seed)
    return Comparison(
        metric, ref_value=ref_d.estimate, ref_ci=ref_d.interval, new_value=new_d.estimate, new_ci=new_d.interval,
        diff=diff, kind=paired_kind(diff, "text windows (token-weighted)"),
        note="; ".join(t for t in ("data uncertainty only, one seed; perplexity stands in for the paper's HellaSwag",
                                   _worth_words(qr, qn)) if t),
    )  # fmt: skip


def _window_top1(run: Run, which: str) -> float | None:
    """The mean per-window top-1 |value| of ``which``: what a row reads, over seeds as for one run (the overall top-1
    is one token's spike — 609 / 325 / 310 against per-window means near 80 in mini-scratch-v2-rerun — and has no
    interval for one run); None for results without per-window values."""
    windows = (run.results("outliers", "per_window") or {}).get(f"{which}_top1")
    return float(np.mean(windows)) if windows else None


def _window_values(run: Run, which: str):
    """(the windows' token hash and length, each window's top-1 |value| of ``which``) or None: the items a row over
    seeds counts once beside the seeds (``Measure.per_item``)."""
    r = run.results("outliers") or {}
    windows = (r.get("per_window") or {}).get(f"{which}_top1")
    meta = r.get("metadata") or {}
    if not windows or meta.get("tokens_sha1") is None:
        return None
    return (meta["tokens_sha1"], meta.get("seq_len")), windows


def _overall_over_seeds(which: str, label: str):
    """The seeds row's note: the overall top-1 (the paper's Table 5 value), averaged over each side's seeds."""

    def note(ref_runs: list[Run], new_runs: list[Run]) -> str | None:
        overall = lambda runs: [v for v in (r.results("outliers", which, "top1") for r in runs) if finite(v)]  # noqa: E731
        rv, nv = overall(ref_runs), overall(new_runs)
        if not rv or not nv:
            return None
        sized = [[r for r in runs if r.results("outliers", which, "values")] for runs in (ref_runs, new_runs)]
        pools = _pools(sized[0][0], sized[1][0], which) if all(sized) else None
        return f"overall top-1 {label} (mean over seeds) {np.mean(rv):.2f} → {np.mean(nv):.2f}" + (
            f"; {pools}" if pools else ""
        )

    return note


def _top1_measure(which: str, label: str) -> Measure:
    # until 2026-12-01 a row over seeds read the overall top-1 and one run's row the mean per-window top-1: the
    # verdict depended on the number of seeds (7 verdicts of 4 exports: audit of 2026-12-01)
    return Measure(
        f"mean per-window top-1 {label}",
        2,
        per_run=lambda run: _window_top1(run, which),
        per_item=lambda run: _window_values(run, which),
        compare=lambda ref, new, seed: _compare_top1(ref, new, seed, which, label),
        seeds_note=_overall_over_seeds(which, label),
    )


OUTLIER_MEASURES = {
    "outliers:attention_logits": _top1_measure("attention_logits", "|logit|"),
    "outliers:hidden_states": _top1_measure("hidden_states", "|hidden|"),
}
QUANT_MEASURES = {
    "quant:drop": Measure(
        "NLL increase at the lowest width", 4, per_run=lambda run: _quant_drop(run.results("quant")),
        compare=_compare_quant, untestable=_logits_worth_nothing, seeds_note=_worth_over_seeds,
        per_item=_quant_items,
    )
}  # fmt: skip


# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
OUTLIER_CLAIMS = (
    PaperClaim(
        "DIFF Transformer Table 5", "smaller attention-logit outliers", "top-1 |logit| 318.0 vs 38.8",
        "outliers:attention_logits", "lower", "baseline",
    ),
    PaperClaim(
        "DIFF Transformer Table 5", "smaller hidden-state outliers", "top-1 |hidden| 3608.6 vs 1688.2",
        "outliers:hidden_states", "lower", "baseline",
    ),
)  # fmt: skip


OUTLIERS_SUITE = Suite(
    "outliers",
    lambda model, tokenizer, o, folder, name: (
        run_outliers(model, tokenizer, source=o.text, tokens=o.tokens, seq_len=o.window),
        {},
    ),
    headline=lambda r: {"top-1 |logit|": r["attention_logits"]["top1"], "top-1 |hidden|": r["hidden_states"]["top1"]},
    compare=_compare_outliers,
    measures=OUTLIER_MEASURES,
    claims=OUTLIER_CLAIMS,
    preflight=window_preflight,
)
# The DIFF Transformer claims this suite's measures check, as data (every from-scratch differential model against its
# same-preset standard model: diffattn.experiments.claims.claim_table).
QUANT_CLAIMS = (
    PaperClaim(
        "DIFF Transformer Fig. 8", "degrades less when attention logits go to low bits",
        "at 4 bits DIFF keeps most of its accuracy, the Transformer loses much more", "quant:drop", "lower",
        "baseline",
    ),
)  # fmt: skip


QUANT_SUITE = Suite(
    "quant",
    lambda model, tokenizer, o, folder, name: (
        run_quantization(model, tokenizer, source=o.text, tokens=o.tokens, seq_len=o.window),
        {},
    ),
    headline=lambda r: {f"PPL@{q['bits']}b": q["ppl"] for q in r["quantization"]},
    compare=_compare_quant_tables,
    measures=QUANT_MEASURES,
    claims=QUANT_CLAIMS,
    preflight=window_preflight,
)
