"""DIFF V2 as a retrofit of a pretrained model (ours; docs/methods.md §5.3).

Each attention module of the base keeps its projections and gains, per layer:

* a second query projection ``diffv2_q`` (d_model → H·d, with a bias where the base's query has one): the second
  query head of every head, initialised from the first (``second_query="copy"``: W_Q2 = W_Q, b_Q2 = b_Q) or, as an
  option, from noise (``"noise"``: N(0, σ²) with σ the standard deviation of W_Q's entries, bias zero);
* a gate ``diffv2_gate`` (Linear(d_model, H) with a bias): λ of every head and token is
  ``α(t) · sigmoid(x·w_λ,h + b_h)``, with α(t) = min(1, t/T) the annealing ramp of Dex Eq. 4 (α = 1 with
  ``anneal=False``). The weights start at 0 and the bias at logit(``gate_init``).

Then, as in the from-scratch V2 model, ``out_h = A1_h V − λ_{t,h} A2_h V`` with A1 from the base's Q1, K and A2
from Q2 and the **same** K and V (DIFF V2: the pair shares them), before the base's W_O; no GroupNorm, no
(1 − λ_init). Q2 goes through the base's q norm (Qwen3, Gemma 3) and RoPE like Q1.

* **Identity at step 0**: α(0) = 0, so λ = 0 and the model is exactly the base (tested on every model type).
* **It learns from the first steps**: a gate that starts at sigmoid(b) ≈ 0 has a gradient ∝ sigmoid'(b) ≈ 0 and
  would never open (as Dex with W_D = 0 and no annealing would). So the gate starts at ``gate_init`` = 0.05 and the
  identity comes from α(0) = 0 instead; ``gate_init`` below 1e-3 is refused with that reason.
* **KV cache unchanged**: K2 = K1, so the cache holds the base's keys and values only.
* Not mergeable: two softmax maps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..lambdas import annealing_ramp, v2_gate
from .annealed import ATTN_NEW, AnnealedMethodConfig, annealed_spec
from .base import AdapterMethod, AdapterState, wrap_attention
from .model_types import get_spec, head_layout, projection_weights
from .registry import TWO_MAPS, register

SECOND_QUERY_INITS = ("copy", "noise")
MIN_GATE_INIT = 1e-3  # below it sigmoid'(b) ≈ gate_init: the gate has (almost) no gradient


@dataclass
class DiffV2Config(AnnealedMethodConfig):
    second_query: str = "copy"  # W_Q2 from W_Q (copy) | from noise
    gate_init: float = 0.05  # sigmoid(b) at step 0; the identity at step 0 comes from α(0) = 0

    def __post_init__(self):
        super().__post_init__()
        if self.second_query not in SECOND_QUERY_INITS:
            raise ValueError(
                f"DiffV2Config.second_query must be one of {', '.join(SECOND_QUERY_INITS)}; got {self.second_query!r}"
            )
        if not (isinstance(self.gate_init, (int, float)) and 0.0 < self.gate_init < 1.0):
            raise ValueError(f"DiffV2Config.gate_init must be a float in (0, 1); got {self.gate_init!r}")

    def never_learns(self) -> str | None:
        if self.gate_init < MIN_GATE_INIT:
            return (
                f"gate_init={self.gate_init:g}: the gate's gradient is ∝ sigmoid'(b) ≈ gate_init, so it would "
                f"(almost) never open; use gate_init >= {MIN_GATE_INIT:g} (the identity at step 0 comes from the "
                f"annealing, α(0) = 0)"
            )
        return None


class DiffV2Maps(AdapterMethod):
    """The second query projection and the per-token gate of one layer (parameters prefixed ``diffv2_``)."""

    two_maps = True

    def __init__(self, base_attn: nn.Module, config: DiffV2Config, state: AdapterState, d_model: int, device, dtype):
        super().__init__()
        spec = get_spec(base_attn.config)
        self.spec, self.state, self.anneal = spec, state, config.anneal
        self._base = [base_attn]  # a plain list: the base module is registered once, in the wrapper
        layout = head_layout(base_attn)
        width = layout.num_heads * layout.head_dim
        weight, bias = projection_weights(spec, base_attn, "q")  # the base's W_Q [H·d, d_model] and b_Q
        has_bias = bias is not None
        self.diffv2_q = nn.Linear(d_model, width, bias=has_bias, device=device, dtype=dtype)
        with torch.no_grad():
            if config.second_query == "copy":
                self.diffv2_q.weight.copy_(weight)
                if has_bias:
                    self.diffv2_q.bias.copy_(bias)
            else:
                self.diffv2_q.weight.normal_(0.0, float(weight.float().std()))
                if has_bias:
                    self.diffv2_q.bias.zero_()
        self.diffv2_gate = nn.Linear(d_model, layout.num_heads, bias=True, device=device, dtype=torch.float32)
        with torch.no_grad():
            self.diffv2_gate.weight.zero_()
            self.diffv2_gate.bias.fill_(math.log(config.gate_init / (1.0 - config.gate_init)))
        self._lam: torch.Tensor | None = None
        state.follow(self, device)  # t as a tensor: a compiled forward does not compile again at every step

    def alpha(self) -> float | torch.Tensor:
        """The annealing ramp of Dex Eq. 4, min(1, t/T) (:func:`diffattn.lambdas.annealing_ramp`); 1 without
        annealing."""
        if not self.anneal:
            return 1.0
        return annealing_ramp(self.state.step_of(self), self.state.anneal_steps, self.diffv2_gate.weight.dtype)

    def projections(self, x, q, k):
        # λ of every head and token, from this layer's input: α(t)·sigmoid(x·w_λ + b), float32 [B, H, T]
        # the gate is float32 (float64 in a model cast to double, e.g. as a numerical reference)
        self._lam = self.alpha() * v2_gate(self.diffv2_gate, x.to(self.diffv2_gate.weight.dtype))
        return q, k, self.diffv2_q(x), None  # K2 = K1: the pair shares K and V

    def map_lambda(self) -> torch.Tensor:
        if self._lam is None:
            raise RuntimeError("DiffV2Maps.map_lambda is read during a forward, after projections")
        return self._lam

    def current_lambda(self) -> torch.Tensor:
        """The mean λ of the last forward (0-d); before any forward, α(t)·gate_init (the gate's value at x = 0)."""
        if self._lam is None:
            return self.alpha() * torch.sigmoid(self.diffv2_gate.bias.detach()).mean()
        return self._lam.detach().mean()


def adapt_diff_v2(model: nn.Module, config: DiffV2Config) -> nn.Module:
    config.check_learnable()
    param = next(model.parameters())
    d_model = model.get_input_embeddings().weight.shape[1]

    def make(layer_idx, attn, state):
        return DiffV2Maps(attn, config, state, d_model, param.device, param.dtype)

    return wrap_attention(model, make, config, "diff-v2", config.anneal_steps)


def _bench_rows(shape, anneal_steps: int, second_map_flops) -> list:
    n = shape.batch * shape.seq
    extra = 2 * n * shape.d_model * shape.heads * (shape.head_dim + 1) + second_map_flops(shape)  # Q2, gate, map 2
    return [("diff-v2", DiffV2Config(anneal_steps=anneal_steps), False, extra, ATTN_NEW)]


register(
    annealed_spec(
        "diff-v2", "DIFF V2 retrofit", DiffV2Config, adapt_diff_v2, _bench_rows, why_not_mergeable=TWO_MAPS,
        report_settings=("second_query", "gate_init", "anneal_steps"),
    )
)  # fmt: skip
