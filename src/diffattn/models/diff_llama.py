"""Our DIFF Transformer V1 attention module for Hugging Face ``DiffLlama`` (DIFF Transformer Eq. 1–3,
docs/methods.md §1), built on :func:`diffattn.ops.diff_attention_stacked` (the op on Q, K in this layout).

Per layer, with H query heads of width d split into halves (``h = H/2`` differential heads) and Hkv KV heads:

    Q1 = heads [0, H/2),  Q2 = heads [H/2, H)        K1, K2 likewise over the KV heads
    V of differential head j = concat(V_kv[j], V_kv[j + Hkv/2])  (width 2d; Hugging Face's layout)
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init                                           (Eq. 2)
    head = (1 − λ_init) · RMSNorm_2d((A1 − λ·A2) V)                                     (Eq. 3)
    out = concat(heads) W_O

Parameter names are those of ``transformers``' ``DiffLlamaAttention`` (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``, ``lambda_q1`` … ``lambda_k2``) and the very same tensors are reused. λ and the subtraction are float32.

Options (:class:`DiffAttentionOptions`):

* ``lambda_init``: ``"exponential"`` (paper default, λ_init = 0.8 − 0.6·exp(−0.3·layer_idx)) or a constant
  in (0, 1) such as 0.8 or 0.5 (paper Table 6 ablation). A constant is not known to plain ``DiffLlama``,
  which always uses the exponential schedule.
* ``norm``: ``"rms"`` (per-head RMSNorm without gain: the paper's equations and Hugging Face's
  ``DiffLlama``), ``"rms_affine"`` (learnable gain, the official code after October 2024 — it adds
  ``groupnorm.weight`` parameters, which plain ``DiffLlama`` does not have), or ``"none"`` (ablation, Table 6:
  the paper is silent on the multiplier without the norm; we keep ``(1 − λ_init)`` so the ablation changes one
  thing).

**λ of every layer at once.** A model's forward computes Eq. 2 for all its DIFF layers in one chain of ops on their
vectors stacked as rows (:func:`layer_lambdas`, a forward pre-hook :func:`diffattn.install_diff_attention` puts on
the ``DiffLlamaModel``) and hands each layer its own under the keyword :data:`LAMBDAS_KWARG`, which transformers'
decoder layers pass on to their attention: the same value as the layer's own :meth:`~DiffLlamaDifferentialAttention.
lambda_full` within float32's rounding, in a dozen kernels forward and backward for the model where each layer's own
took about fifteen — host work a small model's training step is bound by (benchmarks/RESULTS.md, 2026-11-29).

The options are recorded in ``config.diffattn`` so they are saved beside the weights. Plain ``DiffLlama`` computes
the default options only (:attr:`DiffAttentionOptions.computed_by_plain_diffllama`): a model with those saves a
``diffllama`` checkpoint that plain transformers loads exactly; with any other, its config is a
:class:`DiffTransformerConfig` (``model_type "diffattn_diff"``, registered with the Auto classes by ``import
diffattn``), which plain transformers refuses instead of loading it silently wrong.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DiffLlamaConfig
from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, apply_rotary_pos_emb

from ..cards import save_readme
from ..lambdas import (
    EXPONENTIAL,
    HasLambda,
    check_lambda_init,
    lambda_init_schedule,
    output_scale,
    reparameterized_lambda,
)
from ..ops import (
    BACKENDS,
    HeadNorm,
    diff_attention_maps,
    diff_attention_pairs,
    diff_attention_stacked,
    output_through_maps,
    with_packed_segments,
)
from ..ops._inputs import v_from_halves, values_readable
from ..ops.observe import observing, report
from ..ops.quantized import logit_bits, quantized_attention
from ..ops.routes import FORCED_FLAGS, class_key, lambda_in_kernel, pairs_faster, work_is_small
from .attention_interface import visible_keys
from .presets import NORMS

# what our module takes over from the DiffLlamaAttention it replaces (the same objects, under the same names)
#: DIFF Eq. 2's four vectors of a layer, in the order :func:`diffattn.lambdas.reparameterized_lambda` takes them
LAMBDA_VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
SHARED_WITH_HF = ("q_proj", "k_proj", "v_proj", "o_proj", *LAMBDA_VECTORS)


@dataclass(frozen=True)
class DiffAttentionOptions:
    backend: str = "auto"
    lambda_init: str | float = "exponential"
    norm: str = "rms"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        check_lambda_init(self.lambda_init, "lambda_init", low=0.0, high=1.0)
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {self.norm!r}")

    def to_config(self) -> dict:
        """What is stored in ``config.diffattn`` (the backend is a run-time choice, not a model property)."""
        d = asdict(self)
        d.pop("backend")
        return d

    @property
    def computed_by_plain_diffllama(self) -> bool:
        """Whether transformers' own ``DiffLlamaAttention`` computes these options: the exponential λ_init and the
        gainless RMS norm are what it hard-codes; a constant λ_init, no norm or a learnt gain give other logits than
        it does on the same weights (compared in tests/models/test_hf_interop.py). Every checkpoint-type decision
        reads this."""
        return self.lambda_init == EXPONENTIAL and self.norm == "rms"


MODEL_TYPE = "diffattn_diff"


class DiffTransformerConfig(DiffLlamaConfig):
    """The config of a DIFF model whose options plain ``DiffLlama`` does not compute: ``DiffLlamaConfig`` under
    its own ``model_type``, so plain transformers refuses the checkpoint (it does not know the type) instead of
    loading it as ``diffllama`` with other outputs. ``import diffattn`` registers it with the Auto classes, which
    load it as :class:`diffattn.models.diff_model.DiffTransformerForCausalLM`."""

    model_type = MODEL_TYPE

    def save_pretrained(self, save_directory, *args, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
        save_readme(save_directory, MODEL_TYPE, "DIFF Transformer checkpoint with non-default options")


#: the keyword under which a DIFF model's forward hands its attention layers their λ, computed for every layer at once
#: (:func:`layer_lambdas`), as a :class:`LayerLambdas`; a layer called without it computes its own
LAMBDAS_KWARG = "diffattn_lambdas"


class LayerLambdas:
    """Every DIFF layer's λ of one forward, ``{layer_idx: λ}`` (:func:`layer_lambdas`), as the decoder layers pass it
    on in their keywords. An object of its own, not the dict: what casts a module's floating-point inputs on their way
    in — FSDP2's mixed-precision policy casts every tensor in a layer's args and keywords, dicts and tuples included,
    to its bf16 — leaves it alone, and λ reaches the op in float32 as a layer's own would (tests/train/test_sharded.py,
    the bf16 policy)."""

    __slots__ = ("by_layer",)

    def __init__(self, by_layer: dict[int, torch.Tensor]):
        self.by_layer = by_layer


def layer_lambdas(decoder: nn.Module, cache=None) -> LayerLambdas | None:
    """λ of DIFF Eq. 2 for every DIFF attention layer of ``decoder`` (a ``DiffLlamaModel``) in one chain of ops, their
    λ vectors stacked as rows (:func:`diffattn.lambdas.reparameterized_lambda`): ``{layer_idx: λ}`` in a
    :class:`LayerLambdas`, each a 0-d float32 tensor whose gradient reaches that layer's vectors (``cache``: the
    forward's KV cache, by which the forwards of one decoding share their λ: :func:`_lambdas_source`). None — each layer
    then computes its own, as it always may — where batching would not be the same computation or not the faster
    one:

    * fewer than two DIFF layers, or layers that are not all ours;
    * λ vectors that are not plain parameters on one device of one shape and dtype: FSDP2's and tensor parallelism's
      DTensors (whole only inside their own layer's forward), layers spread over devices (``device_map``);
    * activation checkpointing on a layer: a reentrant checkpoint recomputes its layer in the backward, which would
      run this shared chain's backward once per layer;
    * λ's own kernels switched on for the device (:func:`diffattn.ops.routes.lambda_in_kernel`: the `small` step's
      ``+lambda`` column measures those per layer against this, and the route table switches them on only where they
      measured faster);
    * each layer's own forced (:func:`diffattn.ops.lambda_per_layer`: the step's ``+perlayer`` column, this
      batching's own measurement)."""
    if FORCED_FLAGS["lambda_per_layer"]:
        return None
    layers = decoder.layers[: decoder.config.num_hidden_layers]
    attentions = [getattr(layer, "self_attn", None) for layer in layers]
    if len(attentions) < 2 or not all(isinstance(a, DiffLlamaDifferentialAttention) for a in attentions):
        return None
    if any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        return None
    columns = [[getattr(a, name) for a in attentions] for name in LAMBDA_VECTORS]
    first = columns[0][0]
    kind = (first.device, first.shape, first.dtype)
    vectors = [vector for column in columns for vector in column]
    if any(type(v) is not nn.Parameter or (v.device, v.shape, v.dtype) != kind for v in vectors):
        return None
    if lambda_in_kernel(first.device.index if first.is_cuda else None):
        return None
    source = _lambdas_source(vectors, attentions, cache)
    remembered = _remembered_lambdas(decoder, source, cache)
    if remembered is not None:
        return remembered
    stacked = [torch.stack(column) for column in columns]
    if torch.compiler.is_compiling():  # each λ_init a constant of the graph, whose adds inductor fuses: no tensor made
        diffs = reparameterized_lambda(*stacked, 0.0).unbind()
        lams = [diff + a.lambda_init for a, diff in zip(attentions, diffs, strict=True)]
    else:
        lams = reparameterized_lambda(*stacked, _lambda_inits(tuple(a.lambda_init for a in attentions), first.device))
    found = LayerLambdas({a.layer_idx: lam for a, lam in zip(attentions, lams, strict=True)})
    _remember_without_grad(decoder, source, cache, found)
    return found


#: decoder → (what its λ were computed from, those λ) of its last forward without gradient (:func:`_remembered_lambdas`)
_WITHOUT_GRAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lambdas_source(vectors: list[torch.Tensor], attentions: list, cache) -> tuple | None:
    """What a forward's λ are computed from, where they may be remembered across forwards: the forwards of one
    decoding — without gradient, against one KV cache ``cache`` (the same object every token: λ is the same at every
    token until the vectors change; a forward without a cache computes its own) — not while a graph is traced or
    captured (a remembered λ would be a tensor made outside the graph). The cache and the vectors themselves (compared
    by identity; the cache by weak reference, so that the memo keeps no cache alive), each vector's version counter
    and memory (an in-place update — an optimiser's step, ``load_state_dict`` — or ``.data`` replaced, as ``model.to``
    does, tells them apart), λ_init, and the modes the chain runs in. An edit through ``.data`` in place
    (``p.data.copy_``: it moves neither the version counter nor the memory) is seen from the next cache on, not within
    one decoding."""
    if cache is None or torch.is_grad_enabled() or not values_readable():
        return None
    device = vectors[0].device
    autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    state = tuple((v._version, v.data_ptr()) for v in vectors)
    return (tuple(vectors), cache, state, tuple(a.lambda_init for a in attentions), autocast,
            torch.is_inference_mode_enabled())  # fmt: skip


def _remembered_lambdas(decoder: nn.Module, source: tuple | None, cache) -> LayerLambdas | None:
    """The λ of ``decoder``'s last forward without gradient, where they were computed from what this one's would be
    (``source``, :func:`_lambdas_source`): at decoding, every layer's λ chain (a dozen kernels and their host work)
    once per cache, not once a token (benchmarks/RESULTS.md, 2026-11-30, "An eager decoding step's host work")."""
    last = _WITHOUT_GRAD.get(decoder)
    if source is None or last is None:
        return None
    vectors = source[0]
    (vectors_then, cache_then, *rest), lams = last
    if cache_then() is not cache or len(vectors_then) != len(vectors):
        return None
    if not all(map(operator.is_, vectors_then, vectors)):
        return None
    return lams if tuple(rest) == source[2:] else None


def _remember_without_grad(decoder: nn.Module, source: tuple | None, cache, lams: LayerLambdas) -> None:
    """Remember ``lams`` as what ``source`` (:func:`_lambdas_source`) gives, the cache by weak reference."""
    if source is not None:
        vectors, _, *rest = source
        _WITHOUT_GRAD[decoder] = ((vectors, weakref.ref(cache), *rest), lams)


#: (λ_init of each layer, device) → those λ_init as one float32 tensor on that device: made once, not at every forward
#: (a host-to-device copy from pageable memory waits for the stream, and could not be captured in a CUDA graph)
_INITS: dict[tuple, torch.Tensor] = {}


def _lambda_inits(inits: tuple[float, ...], device: torch.device) -> torch.Tensor:
    key = (inits, device)
    if key not in _INITS:
        _INITS[key] = torch.tensor(inits, dtype=torch.float32, device=device)
    return _INITS[key]


def hand_layers_their_lambdas(decoder: nn.Module, args: tuple, kwargs: dict):
    """A ``DiffLlamaModel``'s forward pre-hook (``with_kwargs=True``): its layers' λ computed at once
    (:func:`layer_lambdas`) added to the forward's keywords under :data:`LAMBDAS_KWARG`, where it applies."""
    # the KV cache, under the name transformers gives it (``cache`` from 5.24): a decoding's forwards share it
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    lams = layer_lambdas(decoder, cache)
    if lams is None:
        return None
    return args, {**kwargs, LAMBDAS_KWARG: lams}


def attention_maps_requested(config, kwargs: dict) -> bool:
    """Whether an attention forward must return its maps: the ``output_attentions`` keyword when the caller gave
    one, else ``config.output_attentions`` — the rule by which transformers' output recorder
    (``utils.output_capturing.capture_outputs``) decides to collect what the attention modules return, so the maps
    are there whichever way they were asked for."""
    return bool(kwargs.get("output_attentions", getattr(config, "output_attentions", False)))


lambda_init_value = lambda_init_schedule  # the public name of diffattn.lambdas.lambda_init_schedule


def rotated_heads(module: nn.Module, hidden_states: torch.Tensor, position_embeddings, cache, pairs: bool = False):
    """Q, K, V heads ``[B, heads, T|S, d]`` of a Llama-layout attention module as transformers computes them:
    the projections split into heads of ``module.head_dim``, RoPE on Q and K, then K and V through the KV cache
    (``cache``: ``past_key_values`` up to transformers 5.23, ``cache`` from 5.24; None without one). ``pairs``
    (DIFF V1, no cache): Q and K in interleaved pairs and V whole, [B, Hkv/2, S, 2d] (:func:`pairs_projection`)."""
    bsz, q_len = hidden_states.shape[:2]
    shape = (bsz, q_len, -1, module.head_dim)
    if pairs:
        q = pairs_projection(module.q_proj, hidden_states, module.head_dim).view(shape).transpose(1, 2)
        k = pairs_projection(module.k_proj, hidden_states, module.head_dim).view(shape).transpose(1, 2)
        v = pairs_projection(module.v_proj, hidden_states, module.head_dim)
        v = v.view(bsz, q_len, -1, 2 * module.head_dim).transpose(1, 2)
    else:
        q = module.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = module.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = module.v_proj(hidden_states).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, module.layer_idx)
    return q, k, v


def pairs_projection(linear: nn.Linear, x: torch.Tensor, width: int) -> torch.Tensor:
    """``linear(x)`` with its output's heads of ``width`` in interleaved pairs: DiffLlama's heads j and j + n/2 (of its
    n) — map 1's and map 2's head j for Q and K, the two column halves of DIFF head j's V — at 2j and 2j + 1, so that
    Q and K [B, T, n·width] view as heads in pairs and V as n/2 heads of width 2·width (the official DIFF code's
    layout, docs/methods.md §1). The weight's rows are taken in that order (a copy of the weight, its gradient put
    back by autograd), not the output's columns: a weight is B·T/d_model times smaller than a projection's output (8x
    at the sweep's 16K tokens of d_model 2048)."""
    weight = linear.weight.unflatten(0, (2, -1, width)).transpose(0, 1).flatten(0, 2)
    bias = linear.bias
    if bias is not None:
        bias = bias.unflatten(0, (2, -1, width)).transpose(0, 1).flatten(0, 2)
    return F.linear(x, weight, bias)


class DiffLlamaDifferentialAttention(DiffLlamaAttention, HasLambda):
    """Drop-in replacement of one ``DiffLlamaAttention`` instance (same parameters, same tensors).

    A subclass, so that what transformers does by class sees it as DiffLlama's attention: ``_init_weights``
    initialises its λ vectors (meta-device builds, checkpoints without λ keys) and ``output_attentions=True``
    records its maps. Its own ``__init__`` takes the parameters of the module it replaces instead of making new
    ones, so the parent's ``__init__`` is skipped on purpose."""

    def __init__(self, hf_attention: nn.Module, options: DiffAttentionOptions):
        nn.Module.__init__(self)
        config = hf_attention.config
        self.config = config
        self.layer_idx = hf_attention.layer_idx
        self.head_dim = hf_attention.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = hf_attention.scaling
        self.is_causal = True
        self.options = options
        for name in SHARED_WITH_HF:  # reuse the very same modules and Parameters: no copy, identical names
            setattr(self, name, getattr(hf_attention, name))
        self.lambda_init = lambda_init_schedule(self.layer_idx, options.lambda_init)
        if options.norm == "none":
            self.groupnorm = nn.Identity()
        else:
            self.groupnorm = nn.RMSNorm(
                2 * self.head_dim, eps=config.rms_norm_eps, elementwise_affine=options.norm == "rms_affine"
            ).to(device=self.q_proj.weight.device, dtype=self.q_proj.weight.dtype)
        self._original = [hf_attention]  # a list, so it is not registered as a submodule

    @property
    def original(self) -> nn.Module:
        """The ``DiffLlamaAttention`` this module replaced, holding this module's current parameters: loading a
        checkpoint into the model may have replaced the Parameter objects here (not in place), which the original,
        no submodule of the model, never sees."""
        original = self._original[0]
        for name in SHARED_WITH_HF:
            setattr(original, name, getattr(self, name))
        return original

    def lambda_full(self) -> torch.Tensor:
        """λ of Eq. 2, in float32 (a 0-d tensor)."""
        return reparameterized_lambda(*(getattr(self, name) for name in LAMBDA_VECTORS), self.lambda_init)

    current_lambda = lambda_full  # the read-out convention of diffattn.lambdas

    def head_norm(self) -> HeadNorm | None:
        """Eq. 3's norm and multiplier for the op to apply (:class:`diffattn.ops.HeadNorm`), where the op can: the
        gainless norm (``norm="rms"``, DiffLlama's); None where the layer applies its own — a learnt gain, no norm, or
        a hook on ``groupnorm`` (an analysis reading the heads before their norm sees them, as it always did)."""
        norm = self.groupnorm
        if self.options.norm != "rms" or norm._forward_hooks or norm._forward_pre_hooks:
            return None
        return HeadNorm(norm.eps, output_scale(self.lambda_init))

    def _heads_in_pairs(self, hidden_states: torch.Tensor, cache, attention_mask, analysis: bool) -> bool:
        """Whether this call hands the op its heads in interleaved pairs (:func:`pairs_projection`), where it may —
        no KV cache (a cache keeps DiffLlama's layout, which its shapes are made for), no analysis reading the maps,
        plain ``nn.Linear`` projections (an adapter's wrapper, DiffLoRA's or PEFT's, computes more than the weight) —
        and it is faster: forced by :func:`diffattn.ops.pairs_layout` (any call), else on CUDA for a call without a
        mask, one key head per query head (what ``cudnn_shared_v`` takes) and above
        :data:`~diffattn.ops.routes.SMALL_WORK` (the layout's gain is the GPU's work, no [V; V]; its cost host work,
        the weights' rows reordered, which decides a small call) whose class the route table measured faster in pairs
        than stacked (:func:`diffattn.ops.routes.pairs_faster`)."""
        if cache is not None or analysis:
            return False
        if not all(type(getattr(self, name)) is nn.Linear for name in ("q_proj", "k_proj", "v_proj")):
            return False
        forced = FORCED_FLAGS["heads_in_pairs"]
        if forced is not None:
            return forced
        if attention_mask is not None or self.num_kv_heads != self.num_heads:
            return False
        b, t = hidden_states.shape[:2]
        if work_is_small(b, self.num_heads // 2, t, t, self.head_dim):  # no cache: S = T
            return False
        device = hidden_states.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.q_proj.weight.dtype
        mode = "train" if torch.is_grad_enabled() and self.q_proj.weight.requires_grad else "infer"
        stacked = class_key("v1", self.head_dim, 2 * self.head_dim, dtype, True, "none", mode, False)
        return pairs_faster(hidden_states.device.index if hidden_states.is_cuda else None, stacked)

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
        cache = cache if cache is not None else past_key_values
        bits = logit_bits()  # the low-bit logit analysis (diffattn.eval.outliers); normally None
        returns_maps = attention_maps_requested(self.config, kwargs)
        analysis = observing() or bits is not None or returns_maps
        pairs = self._heads_in_pairs(hidden_states, cache, attention_mask, analysis)
        # q [B, H, T, d]; k, v [B, Hkv, S, d] (pairs: Q and K in interleaved pairs, v [B, Hkv/2, S, 2d])
        q, k, v = rotated_heads(self, hidden_states, position_embeddings, cache, pairs=pairs)

        k, v = visible_keys(q_len, attention_mask, k, v)  # a static cache's empty slots at prefill
        # V of a DIFF head is [v_j | v_(j + Hkv/2)], [B, Hkv/2, S, 2d]: handed over as it is, those halves stacked as
        # heads, which the triton backend and the per-map routes read in place (no concatenation of the whole KV cache
        # at every decoding step)
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
            raise ValueError(
                f"DIFF attention needs a tensor mask (attn_implementation 'sdpa' or 'eager'); got "
                f"{type(attention_mask).__name__} from attn_implementation={self.config._attn_implementation!r}"
            )
        # transformers' SDPA mask is None exactly when plain causality (T == S, or T == 1) is enough;
        # otherwise it is a [B, 1, T, S] mask that already encodes causality and padding.
        given = kwargs.get(LAMBDAS_KWARG)  # the model's forward computed every layer's λ at once (layer_lambdas)
        lam = given.by_layer.get(self.layer_idx) if given is not None else None
        lam = self.lambda_full() if lam is None else lam
        options = dict(causal=attention_mask is None, attn_mask=attention_mask, scale=self.scaling)
        weights, head_norm = None, None
        if analysis:  # the analysis paths read the two maps apart
            # halves by one split each, not two slices: autograd joins a split's gradients with one cat, where two
            # slices cost a zero-filled tensor and a copy each and an addition (five kernels a tensor in the backward)
            (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
            maps = dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v_from_halves(v), lam=lam, **options)
            if observing():  # attention capture for analysis (diffattn.eval.capture); off: one list check
                report(self, kind="diff", **maps)
        if bits is not None:
            out = quantized_attention(**maps, bits=bits)
        elif returns_maps:
            # laid out as transformers' DiffLlama eager path returns them: [B, H, T, S], heads [0, H/2) map 1
            # and [H/2, H) map 2, from the reference op (the fused backends never form the maps); the output is
            # computed from these very tensors, so they carry its gradient as eager attention's do (issue 36 §8)
            ref = diff_attention_maps(**maps)
            weights = torch.cat([ref.attn1, ref.attn2], dim=1).to(q.dtype)
            out = output_through_maps(*weights.chunk(2, dim=1), ref.lam, maps["v"])
        else:
            # the op on Q, K and V as they are (both maps' heads stacked, V's halves as heads): a one-call route
            # reads Q and K without concatenating the maps' chunks back into copies; a packed row's mask reaches the
            # op as segment ids (docs/methods.md §0.2); out: [B, h, T, 2d]
            options = with_packed_segments(options, kwargs.get("position_ids"))
            head_norm = self.head_norm()  # the op norms and scales (in an epilogue route's kernel, where it may)
            op = diff_attention_pairs if pairs else diff_attention_stacked
            out = op(q, k, v, lam, **options, backend=self.options.backend, head_norm=head_norm)
        # the norm is per head (over the last axis), so it may come after the transpose to [B, T, h, 2d]: an output laid
        # out [B, T, h, 2d] in memory — as the SDPA routes return it for the model's Q, and CUDA's kernels always — is
        # then normed as it is and joined into [B, T, h·2d] by a view, where a norm before the transpose copied it
        # into [B, h, T, 2d] (rms_norm makes its input contiguous) and the reshape copied it back; an output laid out
        # [B, h, T, 2d] is copied once either way
        out = out.transpose(1, 2)
        if head_norm is None:  # the layer's own norm: the analysis paths, a learnt gain, no norm, or a hook on it
            out = self.groupnorm(out) * output_scale(self.lambda_init)
        return self.o_proj(out.reshape(bsz, q_len, -1)), weights  # [B, T, h·2d]
