"""Per-method training recipes as each paper states them (``diffattn adapt --recipe paper``). The values live in
each method's registry entry (:attr:`diffattn.adapters.registry.MethodSpec.paper_recipes`); this module applies
them. Our own defaults (``--recipe ours``, :func:`diffattn.train.adapt_config._adapt_train_defaults`) are one
recipe for every method, so that methods are compared under equal budgets; ``paper`` reproduces each paper's
setting where it states one, and leaves the rest at ours.

Each entry gives its source (paper and appendix). A cosine here decays to 0 (``min_lr_ratio 0``), the usual
meaning; ours decays to 4% (DIFF's linear schedule).
"""

from __future__ import annotations

from ..adapters.registry import Recipe, get_method, method_names


def __getattr__(name: str):
    if name == "PAPER_RECIPES":  # method -> model type -> recipe ("*": any other), from the registry's entries
        return {n: get_method(n).paper_recipes for n in method_names() if get_method(n).paper_recipes}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


RECIPES = ("ours", "paper")
__all__ = ["RECIPES", "Recipe", "paper_recipe"]  # and PAPER_RECIPES, built on access


def paper_recipe(
    method: str, model_type: str | None, max_steps: int, *, given: frozenset[str] | set[str] = frozenset()
) -> tuple[dict[str, object], str]:
    """``(dotted train overrides, source)`` of the paper's recipe for ``method`` on a model of ``model_type``
    whose schedule is planned over ``max_steps`` steps (``train.resolved_schedule_steps``: a warm-up ratio is of
    the planned schedule, so a run stopped part-way warms up as the full one did). A fixed warm-up longer than the
    run is refused, not shortened silently, unless the user gives the warm-up (``"train.warmup_steps"`` in
    ``given``: what they set themselves)."""
    recipes = __getattr__("PAPER_RECIPES")
    if method not in recipes:
        raise ValueError(f"no paper recipe for method {method!r}; known: {', '.join(recipes)}")
    by_type = recipes[method]
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
