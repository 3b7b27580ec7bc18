"""The paper claims an experiment can check, each with the paper's figure, ours, and whether ours agrees.

A claim is checked only where the experiment has what it needs: a from-scratch DIFF model and a same-preset
baseline (DIFF Transformer claims), an adapter and its base model (Dex, DiffLoRA claims), and the evaluation
suite the claim is about. Every "ours" reads reference → method (baseline → DIFF, base → adapter, LoRA →
DiffLoRA). "Agrees" compares *directions* (which model is better), never the papers' absolute
numbers, which come from billion-parameter models trained on billions of tokens: a miniature can agree or
disagree in direction, and a disagreement is reported as such.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Claim:
    source: str  # paper and figure/table
    claim: str
    paper: str  # the paper's figure
    ours: str
    agrees: bool | None  # None: measured, but the result is a tie or undefined


def _pairs(config) -> list[tuple[str, str]]:
    """(baseline, DIFF) from-scratch model pairs with the same preset."""
    out = []
    for d in config.models:
        if d.attention == "diff":
            for b in config.models:
                if b.attention == "standard" and b.preset == d.preset:
                    out.append((b.name, d.name))
                    break
    return out


def _get(evals: dict, name: str, *path):
    node = evals.get(name)
    for key in path:
        if node is None:
            return None
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _direction(ref: float, new: float, digits: int, *, claimed: str) -> bool | None:
    """Whether ``new`` moved from ``ref`` the way the paper claims (``claimed``: "lower" or "higher"); None (a tie)
    when they are equal at the ``digits`` the report prints, so a verdict never rests on a difference the reader
    cannot see."""
    a, b = round(ref, digits), round(new, digits)
    if a == b:
        return None
    return b < a if claimed == "lower" else b > a


def _both(first: bool | None, second: bool | None) -> bool | None:
    """Two directions that must both hold: any wrong one disagrees, two ties tie."""
    if first is False or second is False:
        return False
    return None if first is None and second is None else True


def _quant_drop(evals, name) -> float | None:
    rows = _get(evals, name, "quant", "quantization")
    if not rows:
        return None
    by_bits = {r["bits"]: r["nll"] for r in rows}
    if 16 not in by_bits or min(by_bits) >= 16:
        return None
    return by_bits[min(by_bits)] - by_bits[16]


def paper_claims(config, rows: dict[str, dict], evals: dict[str, dict]) -> list[Claim]:
    claims: list[Claim] = []
    for base, diff in _pairs(config):
        tag = f"{base} → {diff}"  # every "ours" below reads baseline value → DIFF value
        lb, ld = rows.get(base, {}).get("val_loss"), rows.get(diff, {}).get("val_loss")
        if lb is not None and ld is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Fig. 3–4",
                    "lower language-modelling loss than a same-size Transformer",
                    "DIFF needs ~62–65% of the parameters or tokens for the same loss",
                    f"{tag}: val loss {lb:.4f} → {ld:.4f}",
                    _direction(lb, ld, 4, claimed="lower"),
                )
            )
        ab, ad = _get(evals, base, "alloc"), _get(evals, diff, "alloc")
        if ab and ad:
            more = _direction(ab["attention_to_answer"], ad["attention_to_answer"], 3, claimed="higher")
            less = _direction(ab["attention_noise"], ad["attention_noise"], 3, claimed="lower")
            claims.append(
                Claim(
                    "DIFF Transformer Table 3",
                    "more attention to the answer, less attention noise",
                    "answer 0.03 → 0.27–0.40; noise 0.51 → 0.01–0.02",
                    f"{tag}: answer {ab['attention_to_answer']:.3f} → {ad['attention_to_answer']:.3f}; "
                    f"noise {ab['attention_noise']:.3f} → {ad['attention_noise']:.3f}",
                    _both(more, less),
                )
            )
        nb, nd = _get(evals, base, "niah", "mean_accuracy"), _get(evals, diff, "niah", "mean_accuracy")
        if nb is not None and nd is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Table 2",
                    "better multi-needle retrieval",
                    "N=6, R=2: 0.35 (Transformer) vs 0.85 (DIFF)",
                    f"{tag}: mean accuracy {nb:.3f} → {nd:.3f}",
                    _direction(nb, nd, 3, claimed="higher"),
                )
            )
        gb, gd = _get(evals, base, "niah", "grid"), _get(evals, diff, "niah", "grid")
        if gb and gd and len(gb) > 1:
            gaps = [(c["N"], d["accuracy"] - c["accuracy"]) for c, d in zip(gb, gd, strict=True)]
            (n_lo, g_lo), (n_hi, g_hi) = min(gaps), max(gaps)
            claims.append(
                Claim(
                    "DIFF Transformer Table 2",
                    "the retrieval gap grows with the number of needles N",
                    "gap 0.00 at N=1 → 0.07, 0.22, 0.50 at N=2, 4, 6",
                    f"{tag}: gap {g_lo:+.2f} at N={n_lo} → {g_hi:+.2f} at N={n_hi}",
                    _direction(g_lo, g_hi, 2, claimed="higher"),
                )
            )
        ob, od = (
            _get(evals, base, "outliers", "attention_logits", "top1"),
            _get(evals, diff, "outliers", "attention_logits", "top1"),
        )
        if ob is not None and od is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Table 5",
                    "smaller attention-logit outliers",
                    "top-1 |logit| 318.0 vs 38.8",
                    f"{tag}: top-1 |logit| {ob:.2f} → {od:.2f}",
                    _direction(ob, od, 2, claimed="lower"),
                )
            )
        hb, hd = (
            _get(evals, base, "outliers", "hidden_states", "top1"),
            _get(evals, diff, "outliers", "hidden_states", "top1"),
        )
        if hb is not None and hd is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Table 5",
                    "smaller hidden-state outliers",
                    "top-1 |hidden| 3608.6 vs 1688.2",
                    f"{tag}: top-1 |hidden| {hb:.2f} → {hd:.2f}",
                    _direction(hb, hd, 2, claimed="lower"),
                )
            )
        qb, qd = _quant_drop(evals, base), _quant_drop(evals, diff)
        if qb is not None and qd is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Fig. 8",
                    "degrades less when attention logits go to low bits",
                    "at 4 bits DIFF keeps most of its accuracy, the Transformer loses much more",
                    f"{tag}: NLL increase at the lowest width {qb:+.4f} → {qd:+.4f}",
                    _direction(qb, qd, 4, claimed="lower"),
                )
            )
        mb = _get(evals, base, "icl", "order_robustness", "arrangements", "random", "margin")
        md = _get(evals, diff, "icl", "order_robustness", "arrangements", "random", "margin")
        if mb is not None and md is not None:
            claims.append(
                Claim(
                    "DIFF Transformer Fig. 7",
                    "more robust to the order of demonstrations",
                    "TREC margin 19.0 vs 4.0 (random order)",
                    f"{tag}: margin {mb:.3f} → {md:.3f}",
                    _direction(mb, md, 3, claimed="lower"),
                )
            )
    for a in config.adapters:
        if a.method != "dex":
            continue
        ab, ad = _get(evals, a.base, "alloc"), _get(evals, a.name, "alloc")
        if ab and ad:
            claims.append(
                Claim(
                    "Dex Table 2",
                    "Dex raises the (effective) attention to the answer",
                    "Llama-3B 0.06 → Dex 0.19",
                    f"{a.base} → {a.name}: {ab['attention_to_answer']:.3f} → {ad['attention_to_answer']:.3f}",
                    _direction(ab["attention_to_answer"], ad["attention_to_answer"], 3, claimed="higher"),
                )
            )
        nb, nd = _get(evals, a.base, "niah", "mean_accuracy"), _get(evals, a.name, "niah", "mean_accuracy")
        if nb is not None and nd is not None:
            claims.append(
                Claim(
                    "Dex §4.2, Fig. 10",
                    "Dex improves multi-needle retrieval",
                    "66.9% → 78.3% (N=8, R=1)",
                    f"{a.base} → {a.name}: {nb:.3f} → {nd:.3f}",
                    _direction(nb, nd, 3, claimed="higher"),
                )
            )
    difflora = [a for a in config.adapters if a.method == "difflora"]
    lora = [a for a in config.adapters if a.method == "lora"]
    for d in difflora:
        for lo in (x for x in lora if x.base == d.base):
            vd, vl = rows.get(d.name, {}).get("val_loss"), rows.get(lo.name, {}).get("val_loss")
            if vd is not None and vl is not None:
                claims.append(
                    Claim(
                        "DiffLoRA §4",
                        "DiffLoRA falls short of LoRA at matched parameters in most tasks",
                        "below LoRA on most benchmarks (+11 pts on HumanEval)",
                        f"{lo.name} → {d.name}: val loss {vl:.4f} → {vd:.4f}",
                        _direction(vl, vd, 4, claimed="higher"),
                    )
                )
    return claims


def claims_markdown(claims: list[Claim]) -> list[str]:
    if not claims:
        return ["No paper claim applies to the models and suites of this experiment.", ""]
    lines = ["| source | claim | paper | ours | agrees |", "|---|---|---|---|---|"]
    mark = {True: "yes", False: "**no**", None: "tie"}
    lines += [f"| {c.source} | {c.claim} | {c.paper} | {c.ours} | {mark[c.agrees]} |" for c in claims]
    lines += [
        "",
        "Directions only: the papers' numbers come from billion-parameter models. Attention shares of two-map and "
        "Dex models come from signed maps divided by their row sum, so a bucket can hold negative mass "
        '(negative attention) and "noise" can fall below zero.',
    ]
    return [*lines, ""]


def claims_json(claims: list[Claim]) -> list[dict]:
    return [asdict(c) for c in claims]
