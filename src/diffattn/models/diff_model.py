"""The model classes of ``diffattn_diff`` checkpoints: DIFF models whose options plain ``DiffLlama`` does not compute
(a constant λ_init, ``norm="none"`` or ``"rms_affine"``; :mod:`diffattn.models.diff_llama`).

Each is transformers' DiffLlama class with our attention installed at construction, with the options
``config.diffattn`` records, so ``AutoModelForCausalLM.from_pretrained`` (after ``import diffattn``, which registers
them) builds the layers the checkpoint was trained with — ``groupnorm.weight`` included, which is then loaded like
every other parameter — and returns the model that was saved.
"""

from __future__ import annotations

from transformers import DiffLlamaForCausalLM, DiffLlamaModel

from .diff_llama import DiffTransformerConfig
from .install import install_diff_attention


class DiffTransformerModel(DiffLlamaModel):
    """``DiffLlamaModel`` with our DIFF attention and the options of ``config.diffattn`` (``AutoModel``)."""

    config_class = DiffTransformerConfig

    def __init__(self, config: DiffTransformerConfig):
        super().__init__(config)
        install_diff_attention(self)


class DiffTransformerForCausalLM(DiffLlamaForCausalLM):
    """``DiffLlamaForCausalLM`` with our DIFF attention and the options of ``config.diffattn``
    (``AutoModelForCausalLM``); generation, KV cache and losses are DiffLlama's."""

    config_class = DiffTransformerConfig

    def __init__(self, config: DiffTransformerConfig):
        super().__init__(config)
        install_diff_attention(self)
