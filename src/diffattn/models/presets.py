"""Named model sizes for from-scratch DIFF Transformers and their same-size Llama baselines.

Parameter matching follows DIFF Transformer §2.1: a DIFF model with ``h = d_model / 2d`` differential heads
has exactly the projections of a baseline with ``2h`` heads of width ``d``, so both are built from one preset
whose ``num_heads`` is the *baseline* head count (Hugging Face ``DiffLlama`` uses the same convention: its
``num_attention_heads`` counts Q1 and Q2 heads together). DIFF adds only 4·d λ parameters per layer.

Presets:

* ``debug`` — tiny, for tests (2 layers, d_model 64).
* ``quick`` — the quickstart's models (2 layers, d_model 128, head width 32): learn the quickstart's retrieval
  protocol in a few CPU minutes.
* ``tiny``, ``small`` — CPU experiments (head width 64).
* ``paper-830m`` … ``paper-13.1b`` — the scaling-law sizes of the paper's Appendix E (hidden size, layers,
  heads as we read its table; the shared excerpt lacks it). The paper does not list their FFN width or
  vocabulary; we use SwiGLU FFN = 8/3·d_model (rounded to 64, as in the 3B model: 8/3·3072 = 8192) and a
  tied 100,288-token vocabulary, which reproduces the named sizes within 1% (833M, 1.41B, 2.77B, 6.85B,
  13.1B).
* ``paper-3b`` — the main 3B configuration (28 layers, 3072 hidden, FFN 8192, 12 DIFF / 24 baseline heads,
  summary Appendix D). With our assumed tied 100,288 vocabulary it counts ~3.5B; the paper's tokenizer is
  not stated in the material we have.

These are references: the paper sizes are meant to be built on a GPU or on the ``meta`` device to count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: the DIFF layer's head norms (``model.norm``), an option of every preset's model: here, not in the model's module
#: (:mod:`.diff_llama`), so a run's config validates without importing transformers
NORMS = ("rms", "rms_affine", "none")


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int  # baseline heads (2h); DIFF has num_heads / 2 differential heads of V width 2d
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    description: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def diff_heads(self) -> int:
        return self.num_heads // 2

    def validate(self, attention: str, architecture_problems=None) -> None:
        """Refuse sizes no model can have; ``architecture_problems(preset)``: what the architecture ``attention``
        needs beyond them (its row's ``preset_problems``, :mod:`diffattn.models.architectures`)."""
        sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings")  # fmt: skip
        problems = [
            f"{f} must be a positive integer, got {getattr(self, f)!r}"
            for f in sizes
            if not isinstance(getattr(self, f), int) or isinstance(getattr(self, f), bool) or getattr(self, f) <= 0
        ]
        if problems:  # the divisibility checks below need positive sizes
            raise ValueError(f"preset {self.name!r} is invalid for attention={attention!r}: " + "; ".join(problems))
        if self.hidden_size % self.num_heads:
            problems.append(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if architecture_problems is not None:
            problems += architecture_problems(self)
        if problems:
            raise ValueError(f"preset {self.name!r} is invalid for attention={attention!r}: " + "; ".join(problems))


def _ffn(hidden: int) -> int:
    return round(8 * hidden / 3 / 64) * 64


_PAPER_VOCAB = 100288


def _paper(name: str, hidden: int, layers: int, diff_heads: int, ffn: int | None = None, ctx: int = 2048):
    return ModelPreset(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=2 * diff_heads,
        num_kv_heads=2 * diff_heads,
        intermediate_size=ffn or _ffn(hidden),
        vocab_size=_PAPER_VOCAB,
        max_position_embeddings=ctx,
        description=f"DIFF paper size: {layers} layers, d_model {hidden}, {diff_heads} DIFF heads",
    )


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset("debug", 64, 2, 4, 2, 128, 256, 256, description="tests only: 2 layers, d_model 64, GQA 4/2"),
        ModelPreset(
            "quick", 128, 2, 4, 4, 384, 2048, 1024, description="the quickstart: 2 layers, d_model 128, 2048 tokens"
        ),
        ModelPreset("tiny", 256, 4, 4, 4, 704, 8192, 1024, description="CPU minutes: 4 layers, d_model 256"),
        ModelPreset("small", 512, 8, 8, 8, 1344, 8192, 1024, description="CPU hours: 8 layers, d_model 512"),
        _paper("paper-830m", 1536, 24, 8),
        _paper("paper-1.4b", 2048, 24, 8),
        _paper("paper-2.8b", 2560, 32, 10),
        _paper("paper-6.8b", 4096, 32, 16),
        _paper("paper-13.1b", 5120, 40, 20),
        _paper("paper-3b", 3072, 28, 12, ffn=8192, ctx=4096),
    ]
}

PRESET_FIELDS = tuple(f.name for f in dataclasses.fields(ModelPreset) if f.name != "name")


def get_preset(preset: str | ModelPreset, **overrides) -> ModelPreset:
    """A preset by name (or as given), with field overrides such as ``num_layers=3``."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    elif not isinstance(preset, ModelPreset):
        raise ValueError(f"preset must be a preset name ({', '.join(PRESETS)}) or a ModelPreset, got {preset!r}")
    unknown = sorted(set(overrides) - set(PRESET_FIELDS))
    if unknown:
        raise ValueError(f"unknown preset override(s) {', '.join(unknown)}; allowed: {', '.join(PRESET_FIELDS)}")
    return dataclasses.replace(preset, **overrides) if overrides else preset
