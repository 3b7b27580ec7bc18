"""The fine-tuning controls every adapter method is compared against, registered like the methods
(:mod:`diffattn.adapters.registry`, ``kind="control"``):

* ``lora`` — PEFT LoRA on the query and key projections (GPT-2: the fused ``c_attn``). At equal rank r it has
  exactly DiffLoRA's right-term parameter count: r·(d_model + H·d) + r·(d_model + Hkv·d) per layer (GPT-2:
  r·(d_model + 3·d_model) = DiffLoRA's 2·r·(d_model + d_model)). Its default rank is DiffLoRA's default, 64.
* ``attn-ft`` — every attention-module parameter trainable, the rest frozen.
* ``full-ft`` — every parameter trainable.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, replace

from torch import nn

from .dex import DEX_PAPER
from .difflora import DIFFLORA_PAPER
from .model_types import attention_modules, get_spec
from .registry import FINAL, MethodSpec, register


@dataclass
class LoRAControlConfig:
    """The PEFT LoRA control on the query and key projections (rank 64 = DiffLoRA's right-term default)."""

    rank: int = 64
    alpha: float | None = None  # default 2·rank, as DiffLoRA
    dropout: float = 0.0

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1; got {self.rank}")
        if self.alpha is None:
            self.alpha = 2.0 * self.rank


@dataclass
class NoOptions:
    """``attn-ft`` and ``full-ft`` take no method options."""


def lora_target_modules(model: nn.Module) -> list[str]:
    """Names (suffixes) PEFT should wrap for the LoRA control: the query and key projections."""
    spec = get_spec(model)
    return [spec.fused_qkv] if spec.fused_qkv is not None else [spec.q_proj, spec.k_proj]


@contextlib.contextmanager
def peft_wrapping():
    """Around PEFT's wrapping of a model: PEFT (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` as
    it wraps (peft_model.py), which from transformers 5.2x prints a FutureWarning on every LoRA control trained or
    loaded — the user's console twice per quickstart, about code that is not theirs. Silenced there only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def apply_lora(model: nn.Module, options: LoRAControlConfig, calibration=None) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    fused = get_spec(model).fused_qkv is not None
    lora = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=lora_target_modules(model),
        fan_in_fan_out=fused,  # GPT-2's Conv1D stores W as [in, out]
        bias="none",
        task_type="CAUSAL_LM",
    )
    with peft_wrapping():
        return get_peft_model(model, lora)


def train_attention(model: nn.Module, options=None, calibration=None) -> nn.Module:
    attention = {id(p) for _, _, a in attention_modules(model) for p in a.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in attention)
    return model


def train_everything(model: nn.Module, options=None, calibration=None) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _as_set(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


register(
    MethodSpec(
        name="lora", display="LoRA", config=LoRAControlConfig, adapt=apply_lora, kind="control", freeze=_as_set,
        paper_recipes={"*": DIFFLORA_PAPER}, report_settings=("rank",),
    )
)  # fmt: skip
register(
    MethodSpec(
        name="attn-ft", display="attention fine-tuning", config=NoOptions, adapt=train_attention, kind="control",
        freeze=_as_set, result=FINAL,
        paper_recipes={"*": DEX_PAPER},  # the Dex paper's partial fine-tuning baseline
    )
)  # fmt: skip
register(
    MethodSpec(
        name="full-ft", display="full fine-tuning", config=NoOptions, adapt=train_everything, kind="control",
        freeze=_as_set, result=FINAL,
        paper_recipes={"*": replace(DEX_PAPER, lr=1e-5)},  # the Dex paper's full fine-tuning baseline
    )
)  # fmt: skip
