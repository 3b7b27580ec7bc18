"""A toy evaluation suite, written as a contributor would add one: its option, its run, its headline, its protocol
sentence, a named measure and the paper claim it checks — this file alone, plus one registration line
(``register_suite(SUITE)``; see tests/eval/test_toy_suite.py): no edit of diffattn.experiments.claims."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffattn.eval.common import Suite, option
from diffattn.eval.measures import ONE_NUMBER, Comparison, Measure, PaperClaim, Run

TEXT = "to be or not to be"


@dataclass
class ToyOptions:
    toy_repeats: int = option(2, "times the toy text is repeated", minimum=1)


def _run(model, tokenizer, o, folder, name):
    """The mean next-token log-probability of the toy text repeated ``toy_repeats`` times."""
    ids = tokenizer(" ".join([TEXT] * o.toy_repeats), return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[:, :-1].float()
    logprob = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).mean()
    return {"score": float(logprob), "repeats": o.toy_repeats, "tokens": ids.shape[1]}, {}


def _compare(ref: Run, new: Run, seed: int) -> Comparison | None:
    vr, vn = ref.results("toy", "score"), new.results("toy", "score")
    if vr is None or vn is None:
        return None
    return Comparison("toy log-probability", ref_value=vr, new_value=vn, kind=ONE_NUMBER)


SUITE = Suite(
    "toy",
    _run,
    headline=lambda r: {"toy score": r["score"]},
    options=ToyOptions,
    protocol=lambda o: f"Toy: the toy text repeated {o.toy_repeats} times.",
    measures={
        "toy:score": Measure(
            "toy log-probability", 3, per_run=lambda run: run.results("toy", "score"), compare=_compare
        )
    },
    default=False,
    claims=(
        PaperClaim(
            "Toy paper Fig. 1", "a differential model gives the toy text a higher log-probability", "toy figure",
            "toy:score", "higher", "baseline",
        ),
    ),
)  # fmt: skip
