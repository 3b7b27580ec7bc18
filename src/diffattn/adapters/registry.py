"""The method registry: every fact about an adapter method or a fine-tuning control lives in its one entry.

An entry (:class:`MethodSpec`) says what the rest of the library needs to know about a method — its options
dataclass, how it adapts a model, what it trains and freezes, whether and how it merges, whether its λ follows
Dex Eq. 4, whether it needs calibration data, how its saved options are read back, its paper recipe, the settings
a report prints, how a run saves its result, and its benchmark rows — so nothing outside the method's own module
and this table names a method. Each method module registers its entries when it is imported; the package
``diffattn.adapters`` imports them all.

**Adding a method** (two files): write ``adapters/<name>.py`` with its config dataclass, its
:class:`~diffattn.adapters.base.AdapterMethod` and an adapt function, ending with ``register(MethodSpec(...))``;
add one import line to ``adapters/__init__.py``. ``diffattn adapt --method <name>``, experiments, reports, save/load
and the benchmarks then know it, and the conformance tests (``tests/adapters/test_conformance.py``: save/load,
identity at init where the entry claims it, cached decoding, merge-or-refuse) run on it. A method whose λ follows
Dex Eq. 4 subclasses :class:`diffattn.adapters.annealed.AnnealedOptions` for its config and so inherits λ_init,
``anneal``, ``anneal_steps`` (defaulted from the run's length by ``diffattn adapt``), their checks and
``check_learnable``; its entry is then :attr:`MethodSpec.annealed`. ``tests/adapters/test_registry.py`` and
``tests/adapters/test_toy_method.py`` do exactly this with toy methods.

This module imports nothing from the method modules (they import it), so the package has no import cycle.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..paper_claim import PaperClaim  # re-exported: a method's claims are data of its entry
from .annealed_options import AnnealedOptions

ADAPTER, MERGED, FINAL = "adapter", "merged", "final"  # the result folders of an adapt run (diffattn.train.adapt)
TWO_MAPS = "its second softmax map cannot be folded into a linear weight"  # why two-map methods do not merge
# the metadata key of a config field that adapt fills in (Dex's chosen heads): saved, but not an option a run sets
SET_BY_ADAPT = "set_by_adapt"


@dataclass(frozen=True)
class Recipe:
    """A paper's training recipe (``diffattn adapt --recipe paper``); None: the paper is silent (ours is kept).
    A cosine decays to 0 (``min_lr_ratio 0``), the usual meaning."""

    source: str
    lr: float | None = None
    schedule: str | None = None
    min_lr_ratio: float | None = None
    warmup_ratio: float | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None


def _never(config) -> bool:
    return False


@dataclass(frozen=True)
class MethodSpec:
    """Everything the library knows about one method or control (see the module doc)."""

    name: str  # what `diffattn adapt --method` and experiments call it
    display: str  # its name in prose ("Dex", "DiffLoRA")
    config: type  # the options dataclass
    adapt: Callable  # (model, config, calibration) -> model, changed in place
    kind: str = "method"  # "method" (a diffattn adapter: save_adapter/load_adapter) or "control"
    trained_names: Callable | None = None  # model -> names of every parameter it trains
    freeze: Callable | None = None  # model -> trainable names, after freezing the rest (default: trained_names)
    merge: Callable | None = None  # model -> plain model of the base architecture; None: not mergeable
    why_not_mergeable: str = ""
    # the merged model attends with the base's softmax maps, not the method's effective attention (Dex: the output
    # transform folded into W_O), so `diffattn eval` of a run reads its adapter/ form, in which the attention suites
    # (alloc, heads) see what the method attends with; the other methods' merged maps are their own
    merged_hides_attention: bool = False
    # the adapted model equals its base before training with the default options (λ(0) = 0, a zero-init update);
    # the conformance tests check it where claimed (DiffLoRA's fixed λ = 0.1 scales the output by 1 − λ)
    identity_at_init: bool = True
    # the attributes of the method's per-layer module (its AdapterMethod) that hold the weights of its λ(t) term
    # (Dex: "dex_w_d"); with every λ_learn of an annealed method they are its differential parameters, which get a
    # learning rate of their own (train.lambda_lr of `diffattn adapt`; adapters.differential_parameter_names)
    differential_weights: tuple[str, ...] = ()
    needs_calibration: Callable = _never  # config -> whether adapting needs calibration batches
    config_from_saved: Callable | None = None  # saved config dict -> config (default: config(**saved))
    no_decay: Callable | None = None  # model -> extra trainable names that must get weight decay 0
    paper_recipes: dict[str, Recipe] = field(default_factory=dict)  # model type ("*": any other) -> recipe
    report_settings: tuple[str, ...] = ()  # resolved options a report prints (defaults that may change)
    result: str = ADAPTER  # what a run saves: ADAPTER (save_adapter / PEFT's folder) or FINAL (the whole model)
    # (shape, anneal_steps, second_map_flops) -> [(row name, config, merge?, forward FLOPs added per layer, trains)]
    bench_variants: Callable | None = None
    paper_claims: tuple[PaperClaim, ...] = ()  # what an experiment with this method checks

    def __post_init__(self):
        if self.kind not in ("method", "control"):
            raise ValueError(f"MethodSpec.kind must be method or control; got {self.kind!r}")
        if self.result not in (ADAPTER, FINAL):
            raise ValueError(f"MethodSpec.result must be {ADAPTER} or {FINAL}; got {self.result!r}")

    @property
    def mergeable(self) -> bool:
        return self.merge is not None

    @property
    def annealed(self) -> bool:
        """λ follows Dex Eq. 4: the config subclasses :class:`~diffattn.adapters.annealed.AnnealedOptions` (so
        "contributes nothing" is checked at the end of a run, and ``anneal_steps`` defaults from its length)."""
        return issubclass(self.config, AnnealedOptions)

    @property
    def options(self) -> tuple[str, ...]:
        """The option names a run may set (``method.options``): the config's fields but those adapt fills in, the
        method's own first (then those it inherits, e.g. the λ(t) options of AnnealedOptions)."""
        mro = self.config.__mro__

        def owner(name: str) -> int:  # 0: declared by the config class itself
            return next(i for i, c in enumerate(mro) if name in inspect.get_annotations(c))

        fields = [f for f in dataclasses.fields(self.config) if not f.metadata.get(SET_BY_ADAPT)]
        return tuple(f.name for f in sorted(fields, key=lambda f: owner(f.name)))

    def load_config(self, saved: dict):
        return self.config_from_saved(saved) if self.config_from_saved else self.config(**saved)

    def trainable_parameters(self, model: nn.Module) -> list[str]:
        if self.freeze is not None:
            return self.freeze(model)
        names = set(self.trained_names(model))
        for n, p in model.named_parameters():
            p.requires_grad_(n in names)
        return [n for n, p in model.named_parameters() if p.requires_grad]


_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method (its module calls this on import). A second entry of one name, or one config type for two
    methods, is refused."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"method {spec.name!r} is registered twice")
    clash = [s.name for s in _REGISTRY.values() if s.config is spec.config and s.kind == "method" and s is not spec]
    if clash and spec.kind == "method":
        raise ValueError(f"{spec.config.__name__} is already the config of method {clash[0]!r}")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a method (tests that register a toy method clean up with this)."""
    _REGISTRY.pop(name, None)


def get_method(name: str) -> MethodSpec:
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def method_names(kind: str | None = None) -> tuple[str, ...]:
    """Registered names in registration order; ``kind``: only ``"method"`` or only ``"control"`` entries."""
    return tuple(n for n, s in _REGISTRY.items() if kind is None or s.kind == kind)


def specs(kind: str | None = None) -> list[MethodSpec]:
    return [s for s in _REGISTRY.values() if kind is None or s.kind == kind]


def spec_for_config(config) -> MethodSpec:
    """The method whose options dataclass ``config`` is an instance of (exact type)."""
    for s in _REGISTRY.values():
        if s.kind == "method" and type(config) is s.config:
            return s
    names = ", ".join(s.config.__name__ for s in specs("method"))
    raise ValueError(f"unsupported adapter config {type(config).__name__}; implemented: {names}")
