"""Fixtures of the experiment tests: every suite's real output, which the claim-list walk and the claim-row tests
read instead of results kept by hand (issue 36 §15)."""

from __future__ import annotations

import pytest

ALL_SUITES = ["ppl", "niah", "alloc", "icl", "outliers", "quant", "heads", "mqar"]


@pytest.fixture(scope="session")
def measured(tokenizer, tmp_path_factory) -> dict:
    """Every suite's results as the suites themselves write them (issue 36 §15: the walk read a fake kept by hand):
    run_suites on a debug Transformer given Dex, so the λ = 0 readings Dex rows need are the suites' own, at tiny
    sizes (about 5 s)."""
    from diffattn import DexConfig, adapt, build_model
    from diffattn.eval.suite import options_class, run_suites

    model = adapt(build_model("debug", "standard", seed=0, vocab_size=len(tokenizer)), DexConfig(heads="all"))
    options = options_class()(
        tokens=160, samples=2, context_tokens=256, haystack="filler", text="filler", window=64, niah_digits=2,
        niah_grid=((1, 1), (2, 1), (4, 1), (6, 1), (8, 1), (2, 2), (4, 2), (6, 2)), niah_needles=2,
        niah_multivalue=(4, 2), niah_heatmap_lengths=(128, 256), niah_heatmap_samples=1,
        icl_dataset="chatterbot", icl_draws=2, icl_test_size=4, icl_max_chars=40, icl_max_classes=3,
        icl_context_tokens=240, icl_permutations=2, mqar_samples=2,
    )  # fmt: skip
    return run_suites(model.eval(), tokenizer, ALL_SUITES, tmp_path_factory.mktemp("all-suites"), options=options)
