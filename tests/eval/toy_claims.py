"""The toy suite's claim, as data (one registration line: ``register_claims(*CLAIMS)``)."""

from diffattn.adapters.registry import PaperClaim

CLAIMS = (
    PaperClaim(
        "Toy paper Fig. 1", "a differential model gives the toy text a higher log-probability", "toy figure",
        "toy:score", "higher", "baseline",
    ),
)  # fmt: skip
