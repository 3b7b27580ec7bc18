"""The from-scratch architectures (``model.attention`` of ``diffattn pretrain`` and of an experiment's models): one
row per architecture holding every fact the library needs about it, so nothing else tests the architecture's name.

A row (:class:`Architecture`) says what builds it (its Hugging Face config and model classes, the options it takes
and how they are installed), how its preset is checked, how it is matched in parameters to the baseline
(docs/methods.md §1.4; the FFN narrowed by the weights it adds per layer, §5.1 for DIFF V2), what its logged λ
means (the report's λ picture), its label in paired runs' tables and pictures, and how claims name it (the DIFF
paper's claims measured on it against the baseline of the same preset).

* ``standard``: Hugging Face ``LlamaForCausalLM`` (RMSNorm, SwiGLU, no bias, RoPE; the DIFF paper's "Transformer"),
  the baseline every differential architecture is paired with;
* ``diff``: ``DiffLlamaForCausalLM`` with our DIFF attention installed (docs/methods.md §1);
* ``diff-v2``: :class:`~diffattn.models.diff_v2.DiffTransformerV2ForCausalLM` (docs/methods.md §5).

**Adding an architecture**: one :func:`register_architecture` call with its row. Building, presets' checks,
``diffattn pretrain --attention`` (and ``all``), paired runs, parameter matching, the report's λ picture and the
claims then know it (``tests/models/test_models.py`` does this with a toy row).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .presets import ModelPreset

if TYPE_CHECKING:
    from torch import nn

MEAN_LAMBDA = "mean λ over layers"  # the λ read-out of DIFF Eq. 2 (and of the adapters' λ(t))


def _no_weights(preset: ModelPreset) -> int:
    return 0


def _no_problems(preset: ModelPreset) -> list[str]:
    return []


@dataclass(frozen=True)
class Architecture:
    """Everything the library knows about one from-scratch architecture (see the module doc)."""

    name: str  # the value of model.attention
    label: str  # its name in paired runs' tables and pictures
    short_label: str  # its name in one-line summaries (describe_parameters, `diffattn presets`)
    # the Hugging Face config (made from the preset's sizes plus config_options) and model classes, or their
    # "module:Name", imported when a model is first built: listing the rows (`diffattn pretrain --help`) then
    # imports no transformers (:meth:`make_config`, :meth:`make_model`)
    config_class: type | str
    model_class: type | str
    shape: Callable[[ModelPreset], str]  # its heads in words, for describe_parameters ("4 heads × d=16")
    config_options: dict = field(default_factory=dict)
    differential: bool = False  # paired with the baseline (``differential=False``) of its preset in claims
    options: tuple[str, ...] = ()  # the build options it takes, of backend, lambda_init, norm (model.* settings)
    install: Callable | None = None  # (model, **options) after the model is made: our attention, its backend
    # parameter matching: the weights it adds to a layer over the baseline; its FFN is narrowed by the SwiGLU units
    # (3·d_model each) that pay for them, so every architecture of a preset has the baseline's parameter count (within
    # 4½ units a layer: matched_intermediate_size rounds the width to a multiple of 8)
    extra_layer_weights: Callable[[ModelPreset], int] = _no_weights
    preset_problems: Callable[[ModelPreset], list[str]] = _no_problems  # what it needs of a preset beyond the sizes
    lambda_readout: str | None = None  # what the λ it logs per layer is (the report's axis); None: it logs none
    claims_label: str = ""  # appended to the source of a DIFF paper claim measured on it ("" for DIFF itself)

    def make_config(self, **sizes):
        """Its Hugging Face config from ``sizes`` (the preset's) and its own ``config_options``."""
        return _class(self.config_class)(**sizes, **self.config_options)

    def make_model(self, config, **kwargs):
        """A freshly initialised model of ``config`` (``kwargs``: ``_from_config``'s, e.g. ``dtype``)."""
        return _class(self.model_class)._from_config(config, **kwargs)


def _class(ref: type | str) -> type:
    """A class, or the one a "module:Name" names (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(architecture: Architecture) -> Architecture:
    """Add a row; a second row of one name is refused."""
    if ARCHITECTURES.get(architecture.name, architecture) is not architecture:
        raise ValueError(f"architecture {architecture.name!r} is registered twice")
    ARCHITECTURES[architecture.name] = architecture
    return architecture


def unregister_architecture(name: str) -> None:
    """Remove a row (tests that register a toy architecture clean up with this)."""
    ARCHITECTURES.pop(name, None)


def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"attention must be one of {', '.join(ARCHITECTURES)}; got {name!r}")
    return ARCHITECTURES[name]


#: a narrowed FFN's width is a multiple of this: 16-byte rows in bf16/fp16, which cuBLAS's fast GEMMs need. On an
#: H200 (2026-11-28) the DIFF V2 presets' odd widths (``small`` 1,171, paper-830m 3,579) sent every MLP matmul to its
#: unaligned fallback (``cutlass_75_…_align1``): 85 of the 830M step's 189 ms of GPU time, 1.89× the baseline's
FFN_WIDTH_MULTIPLE = 8


def matched_intermediate_size(preset: ModelPreset, architecture: Architecture) -> int:
    """The FFN width of ``architecture`` on ``preset``: the baseline's minus the SwiGLU units (3·d_model weights
    each) that pay for the weights it adds per layer, rounded to the nearest multiple of :data:`FFN_WIDTH_MULTIPLE`
    (the parameter counts then match within 4½ FFN units per layer; never below that multiple). An architecture that
    adds no weights keeps the preset's width as it is."""
    units = round(architecture.extra_layer_weights(preset) / (3 * preset.hidden_size))
    if units == 0:
        return preset.intermediate_size
    return FFN_WIDTH_MULTIPLE * max(1, round((preset.intermediate_size - units) / FFN_WIDTH_MULTIPLE))


def _install_diff(model: nn.Module, backend: str | None, lambda_init=None, norm=None) -> None:
    from .install import install_diff_attention  # transformers' DiffLlama: imported when a model is built

    if backend is not None:  # None keeps Hugging Face's own DiffLlamaAttention
        install_diff_attention(model, backend, lambda_init=lambda_init, norm=norm)


def _install_v2(model: nn.Module, backend: str | None) -> None:
    from .diff_v2 import set_v2_backend

    set_v2_backend(model, backend or "auto")


def _diff_problems(p: ModelPreset) -> list[str]:
    problems = []
    if p.num_heads % 2:
        problems.append(f"DIFF needs an even num_heads (Q1/Q2 halves), got {p.num_heads}")
    if p.num_kv_heads % 2:
        problems.append(f"DIFF needs an even num_kv_heads (K1/K2 halves), got {p.num_kv_heads}")
    return problems


def _v2_problems(p: ModelPreset) -> list[str]:
    return ["DIFF V2 pairs its 2H query heads on the Hkv key heads"] if p.num_heads % p.num_kv_heads else []


def _v2_extra_weights(p: ModelPreset) -> int:
    """V2's H·d·d_model second-query weights and d_model·H gate weights per layer."""
    return p.num_heads * p.head_dim * p.hidden_size + p.hidden_size * p.num_heads


_V2 = "diffattn.models.diff_v2"  # its classes subclass transformers': named, imported when a V2 model is built
register_architecture(
    Architecture(
        name="standard", label="Transformer (baseline)", short_label="baseline",
        config_class="transformers:LlamaConfig", model_class="transformers:LlamaForCausalLM",
        config_options={"mlp_bias": False}, shape=lambda p: f"{p.num_heads} heads × d={p.head_dim}",
    )
)  # fmt: skip
register_architecture(
    Architecture(
        name="diff", label="DIFF Transformer", short_label="DIFF", config_class="transformers:DiffLlamaConfig",
        model_class="transformers:DiffLlamaForCausalLM",
        config_options={"lambda_std_dev": 0.1}, shape=lambda p: f"{p.diff_heads} heads × d={p.head_dim}, V 2d",
        differential=True, options=("backend", "lambda_init", "norm"), install=_install_diff,
        # its λ vectors and per-head norm add fewer weights per layer than one SwiGLU unit: nothing to match
        preset_problems=_diff_problems, lambda_readout=MEAN_LAMBDA,
    )
)  # fmt: skip
register_architecture(
    Architecture(
        name="diff-v2", label="DIFF Transformer V2", short_label="DIFF V2",
        config_class=f"{_V2}:DiffTransformerV2Config", model_class=f"{_V2}:DiffTransformerV2ForCausalLM",
        config_options={"mlp_bias": False, "use_diff_v2": True},
        shape=lambda p: f"{p.num_heads} pairs × d={p.head_dim}", differential=True, options=("backend",),
        install=_install_v2, extra_layer_weights=_v2_extra_weights, preset_problems=_v2_problems,
        lambda_readout="DIFF V2 gate: mean sigmoid(x·w_λ)", claims_label="applied to V2",
    )
)  # fmt: skip
