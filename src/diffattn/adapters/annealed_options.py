"""The options of λ(t), Dex Eq. 4 (docs/methods.md §2.2), and their checks: :class:`AnnealedOptions`, the base of every
λ(t) method's config (what it gives a method: :mod:`diffattn.adapters.annealed`). A leaf module — it imports only
:mod:`diffattn.lambdas` — so that the registry (:attr:`diffattn.adapters.registry.MethodSpec.annealed`) and
:mod:`.annealed` (which imports the registry) both read it without an import circle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..lambdas import check_annealing, check_lambda_init


@dataclass
class AnnealedOptions:
    """The options of λ(t), Dex Eq. 4, and their checks: the base of every λ(t) method's config (module doc)."""

    lambda_init: str | float = "exponential"  # DIFF's per-layer schedule, or a constant
    anneal: bool = True  # False: λ = λ_learn from the start (ablation)
    anneal_steps: int | None = None  # T of Dex Eq. 4; `diffattn adapt` defaults it (adapt_config.default_anneal_steps)

    # what to do instead, appended to check_learnable's refusal (a subclass whose never_learns can say something)
    learnable_remedy: ClassVar[str] = ""

    def __post_init__(self):
        check_annealing(self.anneal, self.anneal_steps, type(self).__name__)
        check_lambda_init(self.lambda_init, f"{type(self).__name__}.lambda_init")

    def never_learns(self) -> str | None:
        """Why the method's new parameters could never receive a gradient under these options, or None if they can.
        None here: a method whose new weight starts non-zero gets λ_learn's gradient as soon as α > 0."""
        return None

    def check_learnable(self) -> None:
        """Refuse (ValueError, with the remedy) options whose new parameters can never get a gradient."""
        why = self.never_learns()
        if why is not None:
            remedy = f". {self.learnable_remedy}" if self.learnable_remedy else ""
            raise ValueError(f"{type(self).__name__} would train nothing: {why}{remedy}")
