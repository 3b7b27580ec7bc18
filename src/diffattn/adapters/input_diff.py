"""DiffV: input differentiation on the value path (DAA paper, App. D; docs/methods.md §4.3).

    V' = (X − λ(t)·f_D(X)) W_Vᵀ,     f_D(X) = X W_Dᵀ,  W_D ∈ R^{d_model × d_model}, identity init

one attention map, λ(t) the annealed schedule of Dex Eq. 4 (so λ(0) = 0: the identity at step 0). Because
the change is linear in X before a linear map, ``merge_diffv`` folds it into W_V (W_V ← W_V (I − λ W_D)),
leaving a plain model of the base architecture. Trainable (paper): the attention modules and W_D, λ_learn.

DiffQ and DiffK (the same W_D on the query or key path, making a second map) live in ``daa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..lambdas import lambda_init_schedule
from .annealed import ATTN_NEW, AnnealedMethodConfig, annealed_spec
from .base import AdapterMethod, AnnealedLambda, remove_adapter, wrap_attention
from .model_types import attention_modules, get_spec, head_layout
from .registry import register


@dataclass
class DiffVConfig(AnnealedMethodConfig):
    pass


class DiffVInput(AdapterMethod):
    """X → X − λ(t)·X W_Dᵀ on the value projection's input (parameters prefixed ``diffv_``)."""

    def __init__(self, d_model: int, diffv_lambda: AnnealedLambda, device, dtype):
        super().__init__()
        self.diffv_w_d = nn.Parameter(torch.eye(d_model, device=device, dtype=dtype))
        self.diffv_lambda = diffv_lambda

    def current_lambda(self) -> torch.Tensor:
        return self.diffv_lambda()

    def value_input(self, x: torch.Tensor) -> torch.Tensor:
        return x - (self.diffv_lambda() * (x @ self.diffv_w_d.T)).to(x.dtype)


def adapt_diffv(model: nn.Module, config: DiffVConfig) -> nn.Module:
    param = next(model.parameters())
    d_model = model.get_input_embeddings().weight.shape[1]

    def make(layer_idx, attn, state):
        lam = AnnealedLambda(lambda_init_schedule(layer_idx, config.lambda_init), state, config.anneal)
        return DiffVInput(d_model, lam.to(param.device), param.device, param.dtype)

    return wrap_attention(model, make, config, "diffv", config.anneal_steps)


@torch.no_grad()
def merge_diffv(model: nn.Module) -> nn.Module:
    """Fold ``I − λ W_D`` into W_V and unwrap: a plain model of the base architecture."""
    spec = get_spec(model)
    for _, _, wrapper in attention_modules(model, spec):
        method: DiffVInput = wrapper.method
        lam = float(method.diffv_lambda())
        w_d = method.diffv_w_d.float()
        m = torch.eye(w_d.shape[0], device=w_d.device) - lam * w_d  # X' = X mᵀ
        base = wrapper.base_attn
        if spec.fused_qkv is None:  # v = X' W_Vᵀ = X (W_V m)ᵀ
            v_proj = getattr(base, spec.v_proj)
            v_proj.weight.copy_((v_proj.weight.float() @ m).to(v_proj.weight.dtype))
        else:  # GPT-2 Conv1D, v = X' W[:, V cols] = X (mᵀ W[:, V cols])
            fused = getattr(base, spec.fused_qkv)
            width = head_layout(base).num_heads * head_layout(base).head_dim
            cols = slice(2 * width, 3 * width)
            fused.weight[:, cols] = (m.T @ fused.weight[:, cols].float()).to(fused.weight.dtype)
    return remove_adapter(model)


def _bench_rows(shape, anneal_steps: int, second_map_flops) -> list:
    extra = 2 * shape.batch * shape.seq * shape.d_model**2  # X·W_Dᵀ before the value projection
    config = DiffVConfig(anneal_steps=anneal_steps)
    return [("diffv unmerged", config, False, extra, ATTN_NEW), ("diffv merged", config, True, 0.0, None)]


register(
    annealed_spec(
        "diffv", "DiffV", DiffVConfig, adapt_diffv, _bench_rows, merge=merge_diffv, differential_weights=("diffv_w_d",)
    )  # one map: it folds into W_V
)
