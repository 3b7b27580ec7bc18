"""DAA and the input-differentiation variants DiffQ / DiffK (DAA paper, Eq. 3–7 and App. D; docs/methods.md §4).

All three build a second attention map and subtract it, DIFF Eq. 1 on a pretrained model:

    O = (softmax(Q1 K1ᵀ·s) − λ(t)·softmax(Q2 K2ᵀ·s)) V

* **DAA**: Q2 = Q1 W_DAA per head (W_DAA ∈ R^{d×d}, identity init), K2 = K1. By default W_DAA acts on the
  query that enters QKᵀ, i.e. *after* RoPE (``position="post-rope"``): the paper's Eq. 5 and its Llama-3.2-1B /
  3.1-8B runs (Table 3), which have RoPE. ``"pre-rope"`` (ours, an option) applies it before RoPE, where W_DAA is
  exactly a learned second query projection and the second map stays relative-position invariant. Without RoPE
  (GPT-2) the two are the same. The placement is saved with the adapter and in ``summary.json``.
* **DiffQ**: Q2 = (X W_Dᵀ) W_Q, one W_D ∈ R^{d_model×d_model} per layer, identity init; K2 = K1.
* **DiffK**: K2 = (X W_Dᵀ) W_K; Q2 = Q1. K2 is stored in the KV cache beside K1.

λ(t) is the annealed schedule of Dex Eq. 4 (λ(0) = 0, so every method starts as the identity). The second
map goes through :func:`diffattn.ops.diff_attention`, so it gets every backend (and the fused kernel).
Trainable, as in the paper: the attention modules (base weights and the new ones), plus lm_head when
``train_lm_head`` (the paper's Llama runs). Two softmax maps cannot fold into one linear map, so none of
these merges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .annealed import ATTN_NEW, AnnealedMethodConfig, annealed_lambda_for, annealed_spec
from .base import AdapterMethod, AnnealedLambda, wrap_attention
from .model_types import get_spec, head_layout, linear_part
from .registry import TWO_MAPS, PaperClaim, register


@dataclass
class DAAConfig(AnnealedMethodConfig):
    position: str = "post-rope"  # where W_DAA acts on the query: post-rope (the paper's) | pre-rope

    def __post_init__(self):
        super().__post_init__()
        if self.position not in ("pre-rope", "post-rope"):
            raise ValueError(f"DAAConfig.position must be pre-rope or post-rope; got {self.position!r}")


@dataclass
class DiffQConfig(AnnealedMethodConfig):
    pass


@dataclass
class DiffKConfig(AnnealedMethodConfig):
    pass


class _AnnealedTwoMaps(AdapterMethod):
    two_maps = True

    def __init__(self, lam: AnnealedLambda):
        super().__init__()
        self.diff_lambda = lam

    def map_lambda(self) -> torch.Tensor:
        return self.diff_lambda()


class DAAMaps(_AnnealedTwoMaps):
    """Q2 = Q1 W_DAA per head (parameters ``daa_w``, [H, d, d], identity init)."""

    def __init__(self, num_heads: int, head_dim: int, position: str, lam: AnnealedLambda, device, dtype):
        super().__init__(lam)
        self.daa_w = nn.Parameter(torch.eye(head_dim, device=device, dtype=dtype).repeat(num_heads, 1, 1))
        self.second_query_stage = position

    def second_query(self, q: torch.Tensor) -> torch.Tensor:  # q [B, H, T, d]
        return torch.einsum("bhtd,hde->bhte", q, self.daa_w)


class InputDiffMaps(_AnnealedTwoMaps):
    """Q2 (``part="q"``) or K2 (``part="k"``) projected from X W_Dᵀ (``diff_w_d`` [d_model, d_model], identity)."""

    def __init__(self, part: str, base_attn: nn.Module, d_model: int, lam: AnnealedLambda, device, dtype):
        super().__init__(lam)
        self.part = part
        self.spec = get_spec(base_attn.config)
        self._base = [base_attn]  # a plain list: the base module is registered once, in the wrapper
        self.diff_w_d = nn.Parameter(torch.eye(d_model, device=device, dtype=dtype))

    def projections(self, x, q, k):
        second = linear_part(self.spec, self._base[0], x @ self.diff_w_d.T, self.part)
        return (q, k, second, None) if self.part == "q" else (q, k, None, second)


def adapt_daa(model: nn.Module, config: DAAConfig) -> nn.Module:
    param = next(model.parameters())

    def make(layer_idx, attn, state):
        layout = head_layout(attn)
        lam = annealed_lambda_for(config, layer_idx, state, param.device)
        return DAAMaps(layout.num_heads, layout.head_dim, config.position, lam, param.device, param.dtype)

    return wrap_attention(model, make, config, "daa", config.anneal_steps)


def adapt_input_diff(model: nn.Module, config: DiffQConfig | DiffKConfig) -> nn.Module:
    param = next(model.parameters())
    d_model = model.get_input_embeddings().weight.shape[1]
    part, name = ("q", "diffq") if isinstance(config, DiffQConfig) else ("k", "diffk")

    def make(layer_idx, attn, state):
        lam = annealed_lambda_for(config, layer_idx, state, param.device)
        return InputDiffMaps(part, attn, d_model, lam, param.device, param.dtype)

    return wrap_attention(model, make, config, name, config.anneal_steps)


def _daa_rows(shape, anneal_steps: int, second_map_flops) -> list:
    extra = 2 * shape.batch * shape.seq * shape.heads * shape.head_dim**2 + second_map_flops(shape)  # Q1·W_DAA
    return [
        (f"daa {p}", DAAConfig(position=p, anneal_steps=anneal_steps), False, extra, ATTN_NEW)
        for p in ("pre-rope", "post-rope")
    ]


def _input_rows(part: str):
    def rows(shape, anneal_steps: int, second_map_flops) -> list:
        n, dm = shape.batch * shape.seq, shape.d_model
        width = (shape.heads if part == "q" else shape.kv_heads) * shape.head_dim
        extra = 2 * n * dm * dm + 2 * n * dm * width + second_map_flops(shape)  # X·W_Dᵀ, its projection, map 2
        config = (DiffQConfig if part == "q" else DiffKConfig)(anneal_steps=anneal_steps)
        return [(f"diff{part}", config, False, extra, ATTN_NEW)]

    return rows


for _spec in (
    annealed_spec(
        "daa", "DAA", DAAConfig, adapt_daa, _daa_rows, why_not_mergeable=TWO_MAPS,
        report_settings=("position", "anneal_steps"), differential_weights=("daa_w",),
        paper_claims=(
            PaperClaim(
                "DAA Table 2", "DAA retrieves needles better than fine-tuning the same attention",
                "NIAH above the fine-tuned model", "niah:r1_else_n2", reference="attn-ft",
            ),
        ),
    ),
    annealed_spec(
        "diffq", "DiffQ", DiffQConfig, adapt_input_diff, _input_rows("q"), why_not_mergeable=TWO_MAPS,
        differential_weights=("diff_w_d",),
    ),
    annealed_spec(
        "diffk", "DiffK", DiffKConfig, adapt_input_diff, _input_rows("k"), why_not_mergeable=TWO_MAPS,
        differential_weights=("diff_w_d",),
    ),
):  # fmt: skip
    register(_spec)
