"""DiffLoRA: low-rank adapters that create the second attention map (Misrahi et al. 2025, Sec. 2–3.4, App. B;
docs/methods.md §3).

    Q2 = X (W_Q + B_Q2 A_Q2),   K2 = X (W_K + B_K2 A_K2)     (LoRA scaling α/r on B A)
    O  = (softmax(Q1 K1ᵀ·s) − λ·softmax(Q2 K2ᵀ·s)) V

By default (``second_term="base+lora"``) the second map starts from the *pretrained* projections, as in the
authors' code. B = 0 at init, so A2 = A1 and O = (1 − λ)·(base attention output): unlike Dex/DAA, DiffLoRA does
not start as the identity when λ ≠ 0 (the paper's fixed λ = 0.1). ``second_term="lora-only"`` is the paper's
formula (Sec. 2), Q2 = X·B_Q2 A_Q2 and K2 = X·B_K2 A_K2 without W_Q/W_K (the authors' ``negative_term_lora_only``):
there B starts non-zero (Kaiming-uniform, like A), since with B = 0 the second map would be uniform and its
adapters would get no gradient through the softmax.

Options: ``terms="right"`` (adapters on Q2/K2 only, rank 64, α 128) or ``"both"`` (also on Q1/K1, rank 32,
α 64, the same parameter count); λ fixed (0.1, the paper's most stable) or learnable with DIFF's
re-parameterisation λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init (vectors N(0, 0.1), as Ye et al.);
``lambda_init`` a constant or ``"exponential"``, DIFF's per-layer 0.8 − 0.6·exp(−0.3·l) (the authors' option);
an optional per-head RMS normalisation scaled by (1 − λ_init) (DIFF's GroupNorm; the paper found it harmful
on pretrained models, so it is off by default), with a learnable gain as in the authors' code
(``group_norm_gain``). Trainable: the adapters and λ. K2 is stored in the KV cache
beside K1. Not mergeable: the second softmax map has no linear equivalent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..lambdas import check_lambda_init, lambda_init_schedule, output_scale, reparameterized_lambda
from .base import AdapterMethod, wrap_attention
from .model_types import attention_modules, get_spec, head_layout
from .registry import TWO_MAPS, MethodSpec, PaperClaim, Recipe, register


@dataclass
class DiffLoRAConfig:
    terms: str = "right"  # right: adapters on Q2/K2 only | both: also on Q1/K1
    rank: int | None = None  # default 64 (right) or 32 (both)
    alpha: float | None = None  # default 2·rank
    lambda_init: float | str = 0.1  # the fixed λ, or λ_init of the learnable λ; "exponential": DIFF's per layer
    learn_lambda: bool = False
    group_norm: bool = False  # per-head RMS norm × (1 − λ_init), DIFF's GroupNorm
    group_norm_gain: bool = False  # a learnable per-channel gain on that norm (the authors' code)
    second_term: str = "base+lora"  # base+lora: Q2 = X(W_Q + B2A2) (authors' code) | lora-only: X·B2A2 (paper)
    seed: int = 0  # of the A (and lora-only B) matrices and learnable-λ vectors

    def __post_init__(self):
        if self.terms not in ("right", "both"):
            raise ValueError(f"DiffLoRAConfig.terms must be right or both; got {self.terms!r}")
        if self.rank is None:
            self.rank = 64 if self.terms == "right" else 32
        if self.rank < 1:
            raise ValueError(f"DiffLoRAConfig.rank must be >= 1; got {self.rank}")
        if self.alpha is None:
            self.alpha = 2.0 * self.rank
        check_lambda_init(
            self.lambda_init, "DiffLoRAConfig.lambda_init", low=0.0, high=1.0, low_open=False,
            message="in [0, 1) or 'exponential'",
        )  # fmt: skip
        if self.second_term not in ("base+lora", "lora-only"):
            raise ValueError(f"DiffLoRAConfig.second_term must be base+lora or lora-only; got {self.second_term!r}")
        if self.group_norm_gain and not self.group_norm:
            raise ValueError("DiffLoRAConfig.group_norm_gain needs group_norm=True (it is the norm's gain)")


class LowRank(nn.Module):
    """x ↦ (α/r)·x Aᵀ Bᵀ with B = 0 at init (PEFT's LoRA initialisation: A Kaiming-uniform)."""

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float, generator, device, dtype, b_zero=True):
        super().__init__()
        a = torch.empty(rank, d_in)
        bound = 1.0 / math.sqrt(d_in)  # kaiming_uniform_(a=√5) on [rank, d_in], as PEFT does
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(device=device, dtype=dtype))
        b = torch.zeros(d_out, rank)
        if not b_zero:  # the same Kaiming-uniform on [d_out, rank]
            b.uniform_(-1.0 / math.sqrt(rank), 1.0 / math.sqrt(rank), generator=generator)
        self.lora_B = nn.Parameter(b.to(device=device, dtype=dtype))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling


class DiffLoRAMaps(AdapterMethod):
    two_maps = True

    def __init__(
        self,
        config: DiffLoRAConfig,
        layer_idx: int,
        d_model: int,
        q_width: int,
        k_width: int,
        head_dim: int,
        gen,
        dev,
        dt,
    ):
        super().__init__()
        r, a = config.rank, config.alpha
        self.lora_only = config.second_term == "lora-only"
        self.lora_q2 = LowRank(d_model, q_width, r, a, gen, dev, dt, b_zero=not self.lora_only)
        self.lora_k2 = LowRank(d_model, k_width, r, a, gen, dev, dt, b_zero=not self.lora_only)
        if config.terms == "both":
            self.lora_q1 = LowRank(d_model, q_width, r, a, gen, dev, dt)
            self.lora_k1 = LowRank(d_model, k_width, r, a, gen, dev, dt)
        self.lambda_init = lambda_init_schedule(layer_idx, config.lambda_init)
        self.group_norm = config.group_norm
        self.norm_gain = nn.Parameter(torch.ones(head_dim, device=dev, dtype=dt)) if config.group_norm_gain else None
        if config.learn_lambda:
            self.lambda_vectors = nn.Parameter(
                (torch.randn(4, head_dim, generator=gen) * 0.1).to(device=dev, dtype=torch.float32)
            )  # rows λ_q1, λ_k1, λ_q2, λ_k2 (DIFF Eq. 2)
        else:
            self.lambda_vectors = None

    def projections(self, x, q, k):
        if self.lora_only:  # the paper's Q2 = X·B2A2, K2 = X·B_K2 A_K2
            q2, k2 = self.lora_q2(x), self.lora_k2(x)
        else:  # from the pretrained Q, K (before any map-1 update)
            q2, k2 = q + self.lora_q2(x), k + self.lora_k2(x)
        if hasattr(self, "lora_q1"):
            q, k = q + self.lora_q1(x), k + self.lora_k1(x)
        return q, k, q2, k2

    def map_lambda(self) -> torch.Tensor:
        if self.lambda_vectors is None:
            return torch.tensor(self.lambda_init)
        return reparameterized_lambda(*self.lambda_vectors, self.lambda_init)

    def transform_output(self, out: torch.Tensor) -> torch.Tensor:
        if not self.group_norm:
            return out
        weight = self.norm_gain.float() if self.norm_gain is not None else None
        normed = F.rms_norm(out.float(), (out.shape[-1],), weight, eps=1e-5).to(out.dtype)
        return normed * output_scale(self.lambda_init)


def adapt_difflora(model: nn.Module, config: DiffLoRAConfig) -> nn.Module:
    param = next(model.parameters())
    d_model = model.get_input_embeddings().weight.shape[1]
    gen = torch.Generator().manual_seed(config.seed)

    def make(layer_idx, attn, state):
        lay = head_layout(attn)
        q_w, k_w = lay.num_heads * lay.head_dim, lay.num_kv_heads * lay.head_dim
        return DiffLoRAMaps(config, layer_idx, d_model, q_w, k_w, lay.head_dim, gen, param.device, param.dtype)

    return wrap_attention(model, make, config, "difflora", None)


def difflora_trained_names(model: nn.Module) -> list[str]:
    """The low-rank adapters and, when learnable, the λ vectors."""
    spec = get_spec(model)
    prefixes = []
    for _, layer, _ in attention_modules(model, spec):
        root = next(n for n, m in model.named_modules() if m is layer)
        prefixes.append(f"{root}.{spec.attention}.method.")
    return [n for n, _ in model.named_parameters() if n.startswith(tuple(prefixes))]


DIFFLORA_PAPER = Recipe("DiffLoRA (Misrahi et al. 2025), App. B, Table 2", lr=1e-4)  # schedule not stated: ours


def lora_flops(shape, rank: int, terms: int) -> float:
    """Forward FLOPs per layer of ``terms`` pairs of rank-r adapters on the query and key projections."""
    n = shape.batch * shape.seq
    return terms * 2 * n * rank * (2 * shape.d_model + shape.heads * shape.head_dim + shape.kv_heads * shape.head_dim)


def _bench_rows(shape, anneal_steps: int, second_map_flops) -> list:
    right, both = DiffLoRAConfig(terms="right"), DiffLoRAConfig(terms="both")
    return [
        ("difflora right", right, False, lora_flops(shape, right.rank, 1) + second_map_flops(shape),
         f"LoRA r{right.rank} (Q2,K2)"),
        ("difflora both", both, False, lora_flops(shape, both.rank, 2) + second_map_flops(shape),
         f"LoRA r{both.rank} (Q1,K1,Q2,K2)"),
    ]  # fmt: skip


register(
    MethodSpec(
        name="difflora",
        display="DiffLoRA",
        config=DiffLoRAConfig,
        adapt=lambda model, config, calibration=None: adapt_difflora(model, config),
        trained_names=difflora_trained_names,
        why_not_mergeable=TWO_MAPS,
        identity_at_init=False,  # the fixed λ = 0.1 with A2 = A1 at init: O = (1 − λ)·(base attention output)
        paper_recipes={"*": DIFFLORA_PAPER},
        report_settings=("terms", "second_term", "rank", "lambda_init", "learn_lambda", "group_norm"),
        bench_variants=_bench_rows,
        paper_claims=(
            PaperClaim(
                "DiffLoRA §4", "DiffLoRA falls short of LoRA at matched parameters in most tasks",
                "below LoRA on most benchmarks (+11 pts on HumanEval); ours: held-out loss in their place",
                "loss", claimed="higher", reference="lora",
            ),
            PaperClaim(
                "DiffLoRA Fig. 3 (MV)", "DiffLoRA gains over LoRA on multi-value needle retrieval",
                "MV needle accuracy above LoRA's (Llama-3.2-1B)", "niah:multivalue", claimed="higher",
                reference="lora",
            ),
        ),
    )
)  # fmt: skip
