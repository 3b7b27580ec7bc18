"""Registration of diffattn's own model types with transformers' Auto classes: ``diffattn_v2``
(:mod:`.diff_v2`) and ``diffattn_diff`` (:mod:`.diff_model`), and of the fused two-map op as an attention
implementation (``attn_implementation="diffattn"``). Run when a model is built or loaded and, after
``import diffattn``, as soon as transformers is (the hook in :mod:`diffattn.hf_auto`). Idempotent."""

from __future__ import annotations

_registered = False


def register_auto_classes() -> None:
    """Register the config, model and causal-LM classes of ``diffattn_v2`` and ``diffattn_diff`` (once)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from .attention_interface import register_fused_attention

    # the submodules, not diffattn.models itself: this may run while that package is still being imported
    from .diff_llama import DiffTransformerConfig
    from .diff_model import DiffTransformerForCausalLM, DiffTransformerModel
    from .diff_v2 import DiffTransformerV2Config, DiffTransformerV2ForCausalLM, DiffTransformerV2Model

    for config, model, causal_lm in (
        (DiffTransformerV2Config, DiffTransformerV2Model, DiffTransformerV2ForCausalLM),
        (DiffTransformerConfig, DiffTransformerModel, DiffTransformerForCausalLM),
    ):
        AutoConfig.register(config.model_type, config, exist_ok=True)
        AutoModel.register(config, model, exist_ok=True)
        AutoModelForCausalLM.register(config, causal_lm, exist_ok=True)
    register_fused_attention()  # attn_implementation="diffattn": our fused two-map op, the V2 models' default
    _registered = True
