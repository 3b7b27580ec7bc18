"""Per-method training recipes as each paper states them (``diffattn adapt --recipe paper``): the one home of
these values. Our own defaults (``--recipe ours``, :func:`diffattn.train.adapt._adapt_train_defaults`) are one
recipe for every method, so that methods are compared under equal budgets; ``paper`` reproduces each paper's
setting where it states one, and leaves the rest at ours.

| methods | what the paper states | source |
|---|---|---|
| dex, attn-ft (partial fine-tuning) | cosine, peak lr 1e-4, warm-up ratio 0.03 | Dex, App. F.1 |
| full-ft | cosine, peak lr 1e-5, warm-up ratio 0.03 | Dex, App. F.1 |
| daa, diffq, diffk, diffv on GPT-2 | cosine, 500 warm-up steps, lr 3e-5, weight decay 0.01 | DAA, App. E.1 |
| daa, diffq, diffk, diffv, other models | cosine, 500 warm-up steps, lr 1e-4, grad clip 1.0 | DAA, App. E.2 |
| difflora, lora | lr 1e-4 (schedule not stated: ours) | DiffLoRA, App. B, Table 2 |

A cosine here decays to 0 (``min_lr_ratio 0``), the usual meaning; ours decays to 4% (DIFF's linear schedule).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    source: str
    lr: float | None = None
    schedule: str | None = None
    min_lr_ratio: float | None = None
    warmup_ratio: float | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None


_DEX = "Dex (Kong et al. 2025), App. F.1"
_DAA_GPT2 = "DAA (2025), App. E.1 (GPT-2)"
_DAA_LLAMA = "DAA (2025), App. E.2 (Llama)"
_DIFFLORA = "DiffLoRA (Misrahi et al. 2025), App. B, Table 2"

# method -> model type -> recipe ("*": any other model type)
PAPER_RECIPES: dict[str, dict[str, Recipe]] = {
    "dex": {"*": Recipe(_DEX, lr=1e-4, schedule="cosine", min_lr_ratio=0.0, warmup_ratio=0.03)},
    "attn-ft": {"*": Recipe(_DEX, lr=1e-4, schedule="cosine", min_lr_ratio=0.0, warmup_ratio=0.03)},
    "full-ft": {"*": Recipe(_DEX, lr=1e-5, schedule="cosine", min_lr_ratio=0.0, warmup_ratio=0.03)},
    **{
        m: {
            "gpt2": Recipe(
                _DAA_GPT2, lr=3e-5, schedule="cosine", min_lr_ratio=0.0, warmup_steps=500, weight_decay=0.01
            ),
            "*": Recipe(_DAA_LLAMA, lr=1e-4, schedule="cosine", min_lr_ratio=0.0, warmup_steps=500, grad_clip=1.0),
        }
        for m in ("daa", "diffq", "diffk", "diffv")
    },
    "difflora": {"*": Recipe(_DIFFLORA, lr=1e-4)},
    "lora": {"*": Recipe(_DIFFLORA, lr=1e-4)},
}
RECIPES = ("ours", "paper")


def paper_recipe(
    method: str, model_type: str | None, max_steps: int, *, given: frozenset[str] | set[str] = frozenset()
) -> tuple[dict[str, object], str]:
    """``(dotted train overrides, source)`` of the paper's recipe for ``method`` on a model of ``model_type``
    trained for ``max_steps`` steps. A fixed warm-up longer than the run is refused, not shortened silently,
    unless the user gives the warm-up (``"train.warmup_steps"`` in ``given``: what they set themselves)."""
    if method not in PAPER_RECIPES:
        raise ValueError(f"no paper recipe for method {method!r}; known: {', '.join(PAPER_RECIPES)}")
    by_type = PAPER_RECIPES[method]
    r = by_type.get(model_type or "", by_type["*"])
    values: dict[str, object] = {
        "lr": r.lr,
        "schedule": r.schedule,
        "min_lr_ratio": r.min_lr_ratio,
        "weight_decay": r.weight_decay,
        "grad_clip": r.grad_clip,
    }
    if r.warmup_ratio is not None:
        values["warmup_steps"] = round(r.warmup_ratio * max_steps)
    if r.warmup_steps is not None and "train.warmup_steps" not in given:
        if r.warmup_steps >= max_steps:
            raise ValueError(
                f"the paper recipe of {method} warms up for {r.warmup_steps} steps ({r.source}), more than the "
                f"{max_steps} steps of this run: give --max-steps > {r.warmup_steps}, or use --recipe ours"
            )
        values["warmup_steps"] = r.warmup_steps
    return {f"train.{k}": v for k, v in values.items() if v is not None}, r.source
