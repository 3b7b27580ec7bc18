"""DIFF Transformer V2 as a Hugging Face model (docs/methods.md §5; the DIFF authors' ``Diff-Transformer-V2``, 2026).

Per layer, with H heads of the baseline's width d and Hkv key/value heads:

    q_proj: d_model → 2H·d      k_proj, v_proj: d_model → Hkv·d      o_proj: H·d → d_model
    lambda_proj: Linear(d_model, H, bias=False)
    Q = RoPE(x W_q) as 2H heads; heads 0::2 give map 1, heads 1::2 map 2 (the two maps of a pair read the
    same K and V: one attention over 2H query heads against Hkv key heads)
    out_h = A1_h V − sigmoid(x·w_λ,h) · A2_h V        (λ per token and head, from the layer input x)
    out = concat(out_h) W_O                            (no GroupNorm, no (1 − λ_init), no λ re-parameterisation)

With ``use_diff_v2=False`` the very same model class is the Llama baseline (H query heads, no gate), which gives
the parameter-matched comparison the reference makes: V2 adds H·d·d_model query and d_model·H gate weights per
layer. :func:`diffattn.models.build_model` with ``attention="diff-v2"`` shrinks the FFN to pay for them so that a
preset's V2 model has the baseline's parameter count within 4½ FFN units a layer (the width a multiple of 8;
``diffattn presets`` lists the three counts).

The model is a :class:`transformers.LlamaForCausalLM` whose attention modules are :class:`DiffV2Attention`; its
config class :class:`DiffTransformerV2Config` (``model_type "diffattn_v2"``) is registered with ``AutoConfig``,
``AutoModel`` and ``AutoModelForCausalLM`` when ``import diffattn`` has run (:mod:`diffattn.hf_auto`),
so ``save_pretrained`` / ``from_pretrained`` need no ``trust_remote_code`` and no remote code. The parameter
names are those of the layout above (``model.layers.{i}.self_attn.{q,k,v,o,lambda}_proj.weight``); query/key
rows follow Hugging Face's rotate-half RoPE (a checkpoint that rotates interleaved pairs is converted by the
row permutation transformers' Llama conversion applies).
"""

from __future__ import annotations

import logging
from typing import ClassVar

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
)

from ..cards import save_readme
from ..lambdas import HasLambda, v2_gate
from ..ops import (
    BACKENDS,
    diff_attention_maps,
    diff_attention_pairs,
    interleaved_pair,
    output_through_maps,
    with_packed_segments,
)
from ..ops.observe import observing, report
from ..ops.quantized import logit_bits, quantized_attention
from .attention_interface import (
    FUSED,
    dropout_not_applied,
    paired_attention,
    register_fused_attention,
    uses_fused_op,
    visible_keys,
)
from .diff_llama import attention_maps_requested, rotated_heads

logger = logging.getLogger(__name__)

MODEL_TYPE = "diffattn_v2"


class DiffTransformerV2Config(LlamaConfig):
    """A Llama config plus ``use_diff_v2`` (True: DIFF V2 attention; False: the baseline, same class)."""

    model_type = MODEL_TYPE
    # Tensor parallelism (``from_pretrained(..., tp_plan="auto")``): Llama's plan plus the gate. A colwise q_proj
    # gives each rank a contiguous block of the 2H interleaved query heads (2h: map 1, 2h + 1: map 2), so whole
    # pairs when H is a multiple of the ranks; a colwise lambda_proj gives it those heads' gates, and colwise k/v
    # the key/value heads its pairs read (tests/train/test_tensor_parallel.py).
    base_model_tp_plan: ClassVar[dict[str, str]] = {
        **LlamaConfig.base_model_tp_plan,
        "layers.*.self_attn.lambda_proj": "colwise",
    }

    def __init__(self, use_diff_v2: bool = True, **kwargs):
        self.use_diff_v2 = bool(use_diff_v2)
        super().__init__(**kwargs)
        if self.use_diff_v2 and self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"diff-v2 pairs 2H query heads with Hkv key/value heads: "
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


def v2_attention(
    module: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    backend: str,
    position_ids: torch.Tensor | None = None,
    return_maps: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The V2 attention of one layer after RoPE and the cache: q [B, 2H, T, d] (pairs interleaved), k, v
    [B, Hkv, S, d], λ [B, H, T] → ([B, H, T, d], maps). A packed row's mask (documents restarting at
    ``position_ids`` 0) reaches the op as segment ids instead (docs/methods.md §0.2). ``return_maps``: also both
    maps [B, 2H, T, S], interleaved like the query heads, from the reference op (the fused backends never form
    them), with the output computed from these very tensors so they carry its gradient as eager attention's do
    (issue 36 §8); otherwise maps is None."""
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ValueError(
            f"DIFF V2 attention needs a tensor mask (attn_implementation 'sdpa' or 'eager'); got "
            f"{type(attention_mask).__name__}"
        )
    k, v = visible_keys(q.shape[2], attention_mask, k, v)  # a static cache's empty slots at prefill
    lam = lam.to(torch.float32)
    options = dict(causal=attention_mask is None, attn_mask=attention_mask, scale=scale)
    bits = logit_bits()
    if observing() or bits is not None or return_maps:  # the analysis paths read the two maps' queries apart
        q1, q2 = interleaved_pair(q, 1)
        # k twice, the same tensor: the op's shared-key path reads K and V once
        maps = dict(q1=q1, k1=k, q2=q2, k2=k, v=v, lam=lam, **options)
        if observing():  # attention capture for analysis (diffattn.eval.capture)
            report(module, kind="diff", **maps)
        if bits is not None:
            return quantized_attention(**maps, bits=bits), None
        if return_maps:
            ref = diff_attention_maps(**maps)
            weights = torch.stack([ref.attn1, ref.attn2], dim=2).flatten(1, 2).to(q.dtype)
            return output_through_maps(*interleaved_pair(weights, 1), ref.lam, v), weights
    # the op on Q as it is (pairs interleaved): a one-call route reads it without stacking its pairs' views again
    return diff_attention_pairs(q, k, v, lam, **with_packed_segments(options, position_ids), backend=backend), None


class DiffV2Attention(LlamaAttention, HasLambda):
    """DIFF V2 attention with Llama's projections and a doubled ``q_proj`` (docs/methods.md §5.1).

    A subclass of ``LlamaAttention`` so that transformers' weight initialisation and attention bookkeeping see
    it as Llama's; its ``q_proj`` has 2H heads and it adds ``lambda_proj``."""

    backend = "auto"  # the op's backend (a run-time choice, not saved); set per instance or via set_backend

    def __init__(self, config: DiffTransformerV2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(
            config.hidden_size, 2 * self.num_heads * self.head_dim, bias=getattr(config, "attention_bias", False)
        )
        self.lambda_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        # the 2H pair-interleaved query heads against Hkv key/value heads, as attention implementations group them
        self.num_key_value_groups = 2 * self.num_heads // config.num_key_value_heads
        self._last_lambda: torch.Tensor | None = None

    def current_lambda(self) -> torch.Tensor:
        """The mean gate of the last forward over heads and tokens (a 0-d float32 tensor; 0 before any): λ itself
        is per token, this is the one number per layer that training logs and reports read."""
        return torch.tensor(0.0) if self._last_lambda is None else self._last_lambda

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        cache=None,  # transformers >= 5.24 passes the KV cache under this name
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        bsz, q_len = hidden_states.shape[:2]
        # q [B, 2H, T, d] (pairs interleaved); k, v [B, Hkv, S, d]
        q, k, v = rotated_heads(
            self, hidden_states, position_embeddings, cache if cache is not None else past_key_values
        )
        lam = v2_gate(self.lambda_proj, hidden_states)  # [B, H, T]
        self._last_lambda = lam.detach().mean()
        maps_requested = attention_maps_requested(self.config, kwargs)
        if not uses_fused_op(self.config):  # transformers' eager / sdpa / flex / flash: both maps in one call
            dropout = self.attention_dropout if self.training else 0.0
            kwargs["output_attentions"] = maps_requested
            out, weights = paired_attention(self, q, k, v, lam, attention_mask, self.scaling, dropout, **kwargs)
            return self.o_proj(out.reshape(bsz, q_len, -1)), weights
        out, weights = v2_attention(
            self, q, k, v, lam, attention_mask, self.scaling, self.backend, kwargs.get("position_ids"), maps_requested
        )  # [B, H, T, d], [B, 2H, T, S] or None
        out = out.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(out), weights


class DiffTransformerV2PreTrainedModel(LlamaPreTrainedModel):
    config_class = DiffTransformerV2Config
    base_model_prefix = "model"
    _supports_attention_backend = True  # any implementation of ALL_ATTENTION_FUNCTIONS (vLLM's backend checks it)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """Our fused two-map op (attn_implementation "diffattn") unless another implementation is asked for; the
        baseline (``use_diff_v2=False``) is Llama's and keeps transformers' default."""
        register_fused_attention()
        if requested_attention is None and getattr(self.config, "use_diff_v2", True):
            return FUSED
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def save_pretrained(self, save_directory, *args, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
        save_readme(save_directory, MODEL_TYPE, "DIFF Transformer V2 checkpoint")


class DiffTransformerV2Model(DiffTransformerV2PreTrainedModel, LlamaModel):
    """``LlamaModel`` whose attention modules are :class:`DiffV2Attention` when ``config.use_diff_v2``."""

    def __init__(self, config: DiffTransformerV2Config):
        LlamaModel.__init__(self, config)
        if config.use_diff_v2:
            for idx, layer in enumerate(self.layers):
                layer.self_attn = DiffV2Attention(config, idx)
            self.post_init()  # initialise the new modules like every other Linear
            if uses_fused_op(config) and (dropout := dropout_not_applied(config)):
                logger.warning(
                    "DIFF V2 attention under attn_implementation=%r computes without attention-probability dropout "
                    "(%s): in training mode it drops no attention weights; 'sdpa' or 'eager' apply it "
                    "(docs/methods.md §7)",
                    FUSED,
                    ", ".join(dropout),
                )


class DiffTransformerV2ForCausalLM(DiffTransformerV2PreTrainedModel, LlamaForCausalLM):
    """``LlamaForCausalLM`` over :class:`DiffTransformerV2Model`: generation, KV cache and losses are Llama's."""

    def __init__(self, config: DiffTransformerV2Config):
        DiffTransformerV2PreTrainedModel.__init__(self, config)
        self.model = DiffTransformerV2Model(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


def rotate_half_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows of a q/k projection (its weight [rows, cols] or its bias [rows]) that rotates interleaved pairs
    (x_2i, x_2i+1) → the rows Hugging Face's rotate-half RoPE needs for the same attention: within each head, even
    rows first, then odd rows (the permutation transformers' Llama conversion applies). A bias is added before RoPE,
    so it moves with its rows."""
    rows, rest = weight.shape[0], tuple(weight.shape[1:])
    head_dim = rows // num_heads
    return weight.view(num_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def convert_interleaved_rope_state_dict(state_dict: dict, config: DiffTransformerV2Config) -> dict:
    """A V2 state dict in this module's parameter layout but written for interleaved-pair RoPE (the reference
    code's rotary) → the same model for :class:`DiffTransformerV2ForCausalLM`: q_proj and k_proj rows (weights and,
    with ``attention_bias``, biases) permuted per head (:func:`rotate_half_rows`); every other tensor unchanged."""
    q_heads = (2 if config.use_diff_v2 else 1) * config.num_attention_heads
    out = dict(state_dict)
    for name, tensor in state_dict.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            out[name] = rotate_half_rows(tensor, q_heads)
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            out[name] = rotate_half_rows(tensor, config.num_key_value_heads)
    return out


def set_v2_backend(model: nn.Module, backend: str) -> nn.Module:
    """Choose the op backend of every :class:`DiffV2Attention` of ``model`` (``auto``, ``sdpa``, …)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    for module in model.modules():
        if isinstance(module, DiffV2Attention):
            module.backend = backend
    return model
