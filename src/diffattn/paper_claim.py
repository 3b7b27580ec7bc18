"""A paper's claim as data (:class:`PaperClaim`): the one type the suites (``Suite.claims``), the methods' registry
entries (``MethodSpec.paper_claims``) and the claims engine (:mod:`diffattn.experiments.claims`) share. A leaf
module: it imports nothing of the library, so every layer can hold claims."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperClaim:
    """A paper's claim that an experiment checks (diffattn.experiments.claims), as data: what it measures, what it
    compares, and the direction the paper reports. A suite carries the DIFF Transformer claims its measures check
    (``Suite.claims``, reference ``"baseline"``), a method its own (``MethodSpec.paper_claims``).

    ``measure``: a measure an evaluation suite names (``Suite.measures`` in diffattn.eval): ``"loss"`` (validation
    loss), ``"niah:r1"`` (prompts solved over the R = 1 retrieval cells with N >= 2),
    ``"alloc:attention_to_answer"`` (an attention-allocation share), ``"heads:cka"`` (a head statistic), …
    ``reference``: what the model is compared
    with — ``"base"`` (the model a method adapted), another method's name (a control trained on the same base),
    ``"lambda0"`` (the model's own results with λ forced to 0, where its measure has them: allocation's
    ``lambda0_reference``, which isolates the λ term from the projection) or ``"baseline"`` (for a from-scratch
    differential model: the same-preset standard model). Replicate seeds on both sides are compared over seeds."""

    source: str
    claim: str
    paper: str
    measure: str
    claimed: str = "higher"  # the paper's direction for this model against the reference
    reference: str = "base"

    def __post_init__(self):
        if not isinstance(self.measure, str) or not self.measure:
            raise ValueError(f"PaperClaim.measure must name a suite's measure (e.g. 'niah'); got {self.measure!r}")
        if self.claimed not in ("higher", "lower"):
            raise ValueError(f"PaperClaim.claimed must be higher or lower; got {self.claimed!r}")
