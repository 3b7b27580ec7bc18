"""Every claim of the four papers is a report row or a stated "not testable here" reason: the claim list
(diffattn.experiments.claim_list) is walked against the rows paper_claims makes for an experiment with every kind of
model and every suite, both ways."""

from __future__ import annotations

import numpy as np
import pytest

from diffattn.experiments import ExperimentConfig
from diffattn.experiments.claim_list import PAPER_CLAIM_LIST, ClaimEntry, not_testable_markdown
from diffattn.experiments.claims import paper_claims


def _evals(rng) -> dict:
    """Every suite's fields the claims read, with per-sample values on the same prompts and windows."""
    n = 20

    def alloc():
        per = [{"answer": a, "noise": b, "answer_magnitude": a, "noise_magnitude": b}
               for a, b in zip(rng.uniform(0, 0.3, n), rng.uniform(0.2, 0.6, n), strict=True)]  # fmt: skip
        return {"attention_to_answer": 0.1, "attention_noise": 0.4, "per_sample": per,
                "metadata": {"samples_sha1": "same"}}  # fmt: skip

    def niah():
        cells = [(1, 1), (2, 1), (4, 1), (6, 1), (6, 2), (8, 1)]
        grid = []
        for big_n, r in cells:
            s = [float(x) for x in rng.integers(0, 2, n)]
            grid.append({"N": big_n, "R": r, "accuracy": float(np.mean(s)), "scores": s, "strict_scores": s,
                         "strict_accuracy": float(np.mean(s))})  # fmt: skip
        heat = [[[float(x) for x in rng.integers(0, 2, 4)] for _ in range(5)] for _ in range(2)]
        mv = [float(x) / 4 for x in rng.integers(0, 5, n)]  # four values asked: credit in quarters
        multivalue = {"N": 8, "V": 4, "R": 1, "strict_scores": mv, "strict_accuracy": float(np.mean(mv))}
        return {"grid": grid, "multivalue": multivalue, "mean_accuracy": 0.5, "metadata": {"samples_sha1": "same"},
                "heatmap": {"lengths": [64, 128], "depths": [0, 0.25, 0.5, 0.75, 1], "N": 4, "scores": heat,
                            "strict_scores": heat}}  # fmt: skip

    def windows(k):
        return {"nll": list(rng.uniform(3, 4, k) * 64), "tokens": [64] * k}

    def model():
        alloc_result = alloc()
        alloc_result["lambda0_reference"] = alloc()
        meta = {"tokens_sha1": "t", "seq_len": 64}
        return {
            "alloc": alloc_result,
            "niah": niah(),
            "ppl": {"per_window": windows(8), "metadata": {**meta, "window": 64, "stride": 32}},
            "outliers": {"attention_logits": {"top1": 10.0}, "hidden_states": {"top1": 50.0}, "metadata": meta,
                         "per_window": {"attention_logits_top1": list(rng.uniform(5, 10, 8)),
                                        "hidden_states_top1": list(rng.uniform(20, 50, 8))}},
            "quant": {"quantization": [{"bits": 16, "nll": 3.5, "per_window": windows(8)},
                                       {"bits": 4, "nll": 3.7, "per_window": windows(8)}], "metadata": meta},
            "icl": {"many_shot": {"shots": [1, 4], "accuracy": [list(rng.uniform(0, 1, 3)), list(rng.uniform(0, 1, 3))],
                                  "mean": [0.3, 0.4], "labels": ["a", "b", "c", "d"]},
                    "order_robustness": {"arrangements": {"random": {"margin": 0.2}}}},
            "heads": {"summary": {"cka": float(rng.uniform(0.1, 0.3)), "cosine_distance": 0.5, "entropy": 1.0}},
            "mqar": {"mqar": [{"seq_len": 64, "pairs": p, "samples": n, "accuracy": 0.5, "floor": 0.3,
                               "per_sample": list(rng.uniform(0, 1, n))} for p in (4, 8)],
                     "ar_hit": {"ar_hit_loss": float(rng.uniform(1, 2))},
                     "metadata": {"seed": 0, "token_offset": 300}},
        }  # fmt: skip

    names = ["baseline", "diff", "dex", "daa", "attn", "difflora", "lora"]
    return {name: model() for name in names}


def test_every_claim_of_the_papers_is_a_row_or_a_stated_reason(tmp_path):
    config = ExperimentConfig.from_dict(
        {
            "name": "all-claims",
            "data": {"source": "shakespeare", "seq_len": 64},
            "models": [
                {"name": "baseline", "preset": "debug", "attention": "standard"},
                {"name": "diff", "preset": "debug", "attention": "diff"},
            ],
            "adapters": [
                {"name": m, "base": "baseline", "method": method}
                for m, method in [
                    ("dex", "dex"),
                    ("daa", "daa"),
                    ("attn", "attn-ft"),
                    ("difflora", "difflora"),
                    ("lora", "lora"),
                ]
            ],
            "eval": {"suites": ["ppl", "niah", "alloc", "icl", "outliers", "quant", "heads", "mqar"]},
        }
    )
    rows = {name: {"val_loss": 3.0 + 0.01 * i} for i, name in enumerate(["baseline", "diff", "dex", "daa", "attn",
                                                                         "difflora", "lora"])}  # fmt: skip
    claims = paper_claims(config, rows, _evals(np.random.default_rng(0)))
    made = {c.source for c in claims}
    listed = {e.row for e in PAPER_CLAIM_LIST if e.row}
    assert listed - made == set(), "claims in the list that no report row checks"
    assert made - listed == set(), "report rows missing from the claim list"
    reasons = [e for e in PAPER_CLAIM_LIST if e.not_testable]
    assert reasons and all(len(e.not_testable) > 20 for e in reasons)
    assert {e.paper for e in PAPER_CLAIM_LIST} == {"DIFF Transformer", "Dex", "DiffLoRA", "DAA"}
    table = not_testable_markdown({"Dex"})
    assert table[0] == "### Not testable here" and all("DIFF Transformer |" not in line for line in table)
    # the Dex row against λ = 0 compares Dex with its own projection, not with the base
    lam0 = next(c for c in claims if c.source == "Dex Table 2 (vs λ = 0)")
    assert (lam0.ref, lam0.new) == ("dex at λ = 0", "dex") and "paired" in lam0.interval
    cka = next(c for c in claims if c.source == "Dex Fig. 11b")
    assert cka.claimed == "lower" and cka.ref == "baseline"


def test_a_claim_entry_is_a_row_or_a_reason_not_both_nor_neither():
    with pytest.raises(ValueError, match="either a report row or not testable"):
        ClaimEntry("Dex", "x")
    with pytest.raises(ValueError, match="either a report row or not testable"):
        ClaimEntry("Dex", "x", row="Dex Table 2", not_testable="because")
