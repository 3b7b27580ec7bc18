"""The base of every λ(t) method (docs/methods.md §2.2): a method whose λ follows Dex Eq. 4 subclasses
:class:`AnnealedOptions` for its options dataclass and so inherits, with no other file changed:

* the options ``lambda_init`` (DIFF's per-layer schedule or a constant), ``anneal`` and ``anneal_steps`` (T), checked
  when the config is made;
* T's default from the run's length (``diffattn adapt`` fills an unset ``anneal_steps``:
  :func:`diffattn.train.adapt_config.default_anneal_steps`);
* :meth:`~AnnealedOptions.never_learns` / :meth:`~AnnealedOptions.check_learnable`: the refusal, before any training,
  of a setting whose new parameters could never get a gradient (a method overrides ``never_learns`` to say when);
* the registry's ``annealed`` (:attr:`diffattn.adapters.registry.MethodSpec.annealed`): the end-of-run check that
  λ(t) moved, and ``diffattn info``.

DAA, DiffQ, DiffK (``daa``), DiffV (``input_diff``) and the DIFF V2 retrofit (``diff_v2``) share more: the options
of :class:`AnnealedMethodConfig` (``train_lm_head``), their annealed λ per layer, what they train (the attention
modules, optionally lm_head), DAA's paper recipes (App. E.1/E.2) and the registry entry built from these
(:func:`annealed_spec`). Dex subclasses :class:`AnnealedOptions` only (it trains other weights).
:class:`AnnealedOptions` itself lives in the leaf module :mod:`.annealed_options`, so the registry can read it without
importing this module (which imports the registry); it is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..lambdas import lambda_init_schedule
from .annealed_options import AnnealedOptions
from .base import AnnealedLambda
from .model_types import attention_modules, get_spec
from .registry import MethodSpec, Recipe


@dataclass
class AnnealedMethodConfig(AnnealedOptions):
    """Options shared by the λ(t) methods trained like DAA (DAA, DiffQ, DiffK, DiffV, the DIFF V2 retrofit).

    None of DAA, DiffQ, DiffK, DiffV has a setting that leaves a parameter without a gradient (so
    :meth:`never_learns` stays None): their new weight (W_DAA, W_D) starts at the identity, so the second term is
    non-zero from step 0 (DAA, DiffQ, DiffK: the second map equals the first, A2·V = O; DiffV: X·W_Dᵀ·W_Vᵀ = V) and
    λ_learn's gradient (∝ that term, times α) is non-zero as soon as α > 0, even with ``anneal=False`` (α = 1 from
    step 0), ``anneal_steps=1`` or ``lambda_init=0``; once λ ≠ 0 the new weight gets its gradient (∝ λ) too."""

    train_lm_head: bool = False  # also train lm_head (the paper's Llama runs)


def annealed_lambda_for(config: AnnealedOptions, layer_idx: int, state, device) -> AnnealedLambda:
    return AnnealedLambda(lambda_init_schedule(layer_idx, config.lambda_init), state, config.anneal).to(device)


def attention_module_names(model: nn.Module, lm_head: bool = False) -> list[str]:
    """Every parameter of the (wrapped) attention modules, plus the output embedding's when ``lm_head``."""
    spec = get_spec(model)
    prefixes = []
    for _, layer, _ in attention_modules(model, spec):
        root = next(n for n, m in model.named_modules() if m is layer)
        prefixes.append(f"{root}.{spec.attention}.")
    names = [n for n, _ in model.named_parameters() if n.startswith(tuple(prefixes))]
    if lm_head:
        head = model.get_output_embeddings().weight
        names += [n for n, p in model.named_parameters() if p is head]  # tied models: the embedding's name
    return names


ATTN_NEW = "W_Q,K,V,O + new"

# DAA App. E.1 (GPT-2) and E.2 (Llama): the recipe of DAA and of its DiffQ/K/V variants (DiffV lives in input_diff)
ANNEALED_PAPER_RECIPES = {
    "gpt2": Recipe(
        "DAA (2025), App. E.1 (GPT-2)",
        lr=3e-5,
        schedule="cosine",
        min_lr_ratio=0.0,
        warmup_steps=500,
        weight_decay=0.01,
    ),
    "*": Recipe(
        "DAA (2025), App. E.2 (Llama)", lr=1e-4, schedule="cosine", min_lr_ratio=0.0, warmup_steps=500, grad_clip=1.0
    ),
}


def attention_and_head_names(model: nn.Module) -> list[str]:
    """What DAA and DiffQ/K/V train: the attention modules (with their new weights), and lm_head if asked."""
    return attention_module_names(model, model._diffattn_adapter.config.train_lm_head)


def annealed_spec(name: str, display: str, config: type, adapt, bench_variants, **kwargs) -> MethodSpec:
    """The registry entry of a λ(t) method trained like DAA (attention modules, optionally lm_head; DAA's recipes)."""
    return MethodSpec(
        name=name,
        display=display,
        config=config,
        adapt=lambda model, c, calibration=None: adapt(model, c),
        trained_names=attention_and_head_names,
        paper_recipes=ANNEALED_PAPER_RECIPES,
        report_settings=kwargs.pop("report_settings", ("anneal_steps",)),
        bench_variants=bench_variants,
        **kwargs,
    )
