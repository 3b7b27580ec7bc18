"""The adapter machinery shared by every method: the annealed λ(t), the attention wrapper, adapt/remove.

λ(t) is Dex Eq. 4 (docs/methods.md §2.2, also used by DAA and DiffQ/K/V):

    λ(t) = (1 − α)·(t/T)·λ_init + α·λ_learn,      α = min(1, t/T)

so λ(0) = 0 (every such adapter starts as the identity), the annealed λ_init gives the new parameters a
learning signal while 0 < t < T, and the learnable λ_learn (one scalar per layer, initialised at 0) takes
over from t = T. ``set_adapter_step(model, t)`` moves t; the trainer's callback calls it every step.

The wrapper replaces an attention module *instance* (PEFT-style; no transformers class is patched), keeps
the original as ``base_attn``, reaches Q/K/V/O through the model-type table, and hands the per-head
attention output to the method. ``remove_adapter`` puts the original module back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass

import torch
from torch import nn

from ..lambdas import HasLambda, annealed_lambda
from ..models.attention_interface import (
    FUSED,
    dropout_not_applied,
    interface_attention,
    register_fused_attention,
    uses_fused_op,
    visible_keys,
)
from ..ops import BACKENDS, diff_attention, with_packed_segments
from ..ops.observe import observing, report
from ..ops.quantized import logit_bits, quantized_attention
from ..ops.sdpa import sdpa_call
from .model_types import (
    ModelTypeSpec,
    attention_modules,
    call_arguments,
    get_spec,
    linear_qkv,
    logit_scale,
    project_output,
    rope,
    rope_function,
    self_attention_cache,
    to_heads,
)

logger = logging.getLogger(__name__)


class AdapterState:
    """The training step t, shared by every wrapper of one model: an int (``step``), and a copy in every module that
    computes with it (:meth:`follow`: its ``adapter_step`` buffer, a 0-d int64 tensor in the state dict), which
    setting ``step`` fills. A compiled forward, or one captured as a CUDA graph, reads the buffer
    (:meth:`step_of`): a Python number would be a constant of its graph — guarded on, so that every step compiled the
    model again (λ(t) changes every step while annealing), or frozen at its capture's value. An eager forward reads
    the number: λ(t) is then two kernels a layer, where from the tensor it is ten."""

    def __init__(self, anneal_steps: int | None):
        self._step = 0
        self.anneal_steps = anneal_steps
        self._followers: list[nn.Module] = []
        self.ever_set = False  # set_adapter_step called: a training forward before it says it is missing, once

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = int(value)
        self.ever_set = True
        with torch.no_grad():
            for module in self._followers:
                module.adapter_step.fill_(self._step)  # in place: a CUDA graph reads the buffer where it is

    def follow(self, module: nn.Module, device=None) -> None:
        """Give ``module`` an ``adapter_step`` buffer holding t from now on (int64: a cast of the model to bf16
        leaves it exact). It is in the model's ``state_dict``, and loading one sets t (:meth:`_loaded`): a plain
        PyTorch checkpoint of an adapted model resumed λ(t) at t = 0 (a user's review, 2026-12-03)."""
        module.register_buffer("adapter_step", torch.tensor(self._step, device=device))
        module.register_load_state_dict_post_hook(self._loaded)
        self._followers.append(module)

    def _loaded(self, module: nn.Module, incompatible_keys) -> None:
        """After ``load_state_dict``: t is the loaded buffer's (the eager forward reads the number, not the buffer).
        A state dict without it (saved before it was kept) leaves the buffer, and t, as they were."""
        buffer = module.adapter_step
        if not buffer.is_meta and int(buffer) != self._step:
            self.step = int(buffer)

    def step_of(self, module: nn.Module, anneal: bool = True) -> int | torch.Tensor:
        """t as ``module`` (one :meth:`follow` gave a buffer) computes with it: its buffer in a forward being compiled
        or captured as a CUDA graph, where T is set; else the int (T unset: only step 0 is valid, which
        :func:`diffattn.lambdas.annealing_ramp` checks on the number). ``anneal``: whether the caller's value follows
        t (a training forward of an annealed term before any :func:`set_adapter_step` is said once: t stays 0, the
        term stays 0 and nothing of it trains)."""
        if self.anneal_steps is not None and (torch.compiler.is_compiling() or _capturing_cuda_graph()):
            return module.adapter_step
        if anneal and not self.ever_set and module.training and torch.is_grad_enabled():
            self.ever_set = True  # said once
            logger.warning(STEP_NEVER_SET)
        return self._step


STEP_NEVER_SET = (
    "diffattn: a training forward of an adapted model whose step was never set: λ(t) anneals from 0 at t = 0, so "
    "until diffattn.set_adapter_step(model, step) is called before each step its differential term is 0 and receives "
    "no gradient (the run would be a plain attention fine-tune). With transformers' Trainer pass "
    "callbacks=[diffattn.train.adapt_trainer.AdapterStepCallback()]; diffattn adapt does this itself"
)


def _capturing_cuda_graph() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class AnnealedLambda(nn.Module):
    """λ(t) of Dex Eq. 4 for one layer: fixed λ_init, learnable ``lambda_learn`` (float32, init 0), t from the
    model's :class:`AdapterState`."""

    def __init__(self, lambda_init: float, state: AdapterState, anneal: bool = True):
        super().__init__()
        self.lambda_init = lambda_init
        self.state = state
        self.anneal = anneal
        self.lambda_learn = nn.Parameter(torch.zeros((), dtype=torch.float32))
        state.follow(self)

    def forward(self) -> torch.Tensor:
        return annealed_lambda(
            self.state.step_of(self, self.anneal),
            self.state.anneal_steps,
            self.lambda_init,
            self.lambda_learn,
            anneal=self.anneal,
        )


class AdapterMethod(nn.Module):
    """What a method may change in one attention module; every hook defaults to "leave the base as it is".

    The wrapper computes, in this order (Q, K raw = linear outputs before the q/k norm):

    1. ``value_input(X)``: the input of the value projection (DiffV).
    2. ``projections(X, Q, K) → (Q1, K1, Q2, K2)`` raw; ``None`` for Q2/K2 means "the same as map 1"
       (DiffQ, DiffK, DiffLoRA).
    3. ``second_query(Q1)`` on normalised heads, before or after RoPE per ``second_query_stage`` (DAA).
    4. Two maps (``two_maps``): ``diff_attention(Q1, K1, Q2, K2, V, λ)`` (DIFF Eq. 1), λ from ``map_lambda()``;
       otherwise plain SDPA.
    5. ``transform_output(O)`` on the per-head output ``[B, H, T, d]`` before W_O (Dex, a per-head norm).
    """

    two_maps = False
    second_query_stage: str | None = None  # "pre-rope" | "post-rope" when second_query is used

    def value_input(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def projections(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return q, k, None, None

    def second_query(self, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def map_lambda(self) -> torch.Tensor:
        raise NotImplementedError

    def current_lambda(self) -> torch.Tensor:
        return self.map_lambda()

    def transform_output(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def effective_attention(
        self, attn: torch.Tensor, v: torch.Tensor, lam: float | torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """For analysis (diffattn.eval.capture): the single map ``attn`` [B, H, T, S] as this method changes it,
        given the values ``v`` [B, Hkv, S, d]; None when it does not (the map is what the model attends with).
        ``lam``: evaluate it at this λ instead of the method's current λ(t)."""
        return None

    def projection_reference(self, attn: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """The effective attention with λ forced to 0, from the same ``attn`` and ``v``: what the method's effective
        attention is without its λ term (Dex: A·V·V⁺, the projection onto the span of V alone, which is not A).
        Comparing a model's effective attention with this isolates the λ term; None when there is no effective
        attention."""
        return self.effective_attention(attn, v, lam=0.0)

    def forward(self, out: torch.Tensor) -> torch.Tensor:  # calling a method applies its output transform
        return self.transform_output(out)

    # A method whose output can be computed with its λ forced to a value (``forced_lambda``) sets this: evaluations
    # then also read the model with λ = 0, the same weights without the λ term (Dex: its λ = 0 reference).
    supports_forced_lambda = False
    lambda_forced_to: float | None = None


@contextlib.contextmanager
def forced_lambda(model: nn.Module, value: float):
    """Within the block, every adapted layer whose method supports it computes with λ = ``value`` (for Dex, λ = 0 is
    its own weights without the λ term: W_K, W_V, W_O as trained, W_D unused). Raises when no layer supports it."""
    methods = [m for m in model.modules() if isinstance(m, AdapterMethod) and m.supports_forced_lambda]
    if not methods:
        raise ValueError("the model has no adapted layer whose λ can be forced (only Dex's can)")
    before = [m.lambda_forced_to for m in methods]
    for m in methods:
        m.lambda_forced_to = float(value)
    try:
        yield model
    finally:
        for m, b in zip(methods, before, strict=True):
            m.lambda_forced_to = b


def supports_forced_lambda(model: nn.Module) -> bool:
    """Whether :func:`forced_lambda` applies to the model (an adapted layer whose method supports it)."""
    return any(isinstance(m, AdapterMethod) and m.supports_forced_lambda for m in model.modules())


class AdaptedAttention(nn.Module, HasLambda):
    """Wraps one attention module and applies its :class:`AdapterMethod` (see its hooks for the order)."""

    def __init__(self, base_attn: nn.Module, spec: ModelTypeSpec, layer_idx: int, method: AdapterMethod):
        super().__init__()
        self.base_attn = base_attn
        self.spec = spec
        self.layer_idx = layer_idx
        self.method = method
        self.backend = "auto"  # of the two-map op (diffattn.ops.diff_attention); set_adapter_backend changes it
        if spec.rope:
            rope_function(spec.model_type)  # imported now, outside any torch.compile trace of forward

    def current_lambda(self) -> torch.Tensor:
        return self.method.current_lambda()

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        spec, base, method = self.spec, self.base_attn, self.method
        position_embeddings, mask, cache = call_arguments(spec, args, kwargs)
        x = hidden_states
        q, k, v = linear_qkv(spec, base, x, method.value_input(x))
        q, k, q2, k2 = method.projections(x, q, k)
        q, k, v = to_heads(spec, base, q, "q"), to_heads(spec, base, k, "k"), to_heads(spec, base, v, "v")
        q2 = None if q2 is None else to_heads(spec, base, q2, "q")
        k2 = None if k2 is None else to_heads(spec, base, k2, "k")
        if method.second_query_stage == "pre-rope":
            q2 = method.second_query(q)
        q, k, q2, k2 = _rope_all(spec, q, k, q2, k2, position_embeddings)
        if method.second_query_stage == "post-rope":
            q2 = method.second_query(q)
        if cache is not None:
            cache = self_attention_cache(cache)
            if k2 is None:
                k, v = cache.update(k, v, self.layer_idx)
            else:  # K2 travels in the cache beside K1: [K1 | K2] along the head dim
                kk, v = cache.update(torch.cat([k, k2], dim=-1), v, self.layer_idx)
                k, k2 = kk.split(k.shape[-1], dim=-1)
        k, v, k2 = visible_keys(q.shape[2], mask, k, v, k2)  # a static cache's empty slots at prefill
        maps = dict(
            q1=q,
            k1=k,
            q2=(q if q2 is None else q2) if method.two_maps else None,
            k2=(k if k2 is None else k2) if method.two_maps else None,
            v=v,
            lam=method.map_lambda() if method.two_maps else None,
            causal=mask is None,  # bottom-right aligned, so also right for T = 1 decoding
            attn_mask=mask,
            scale=logit_scale(base),
        )
        one_call = not method.two_maps or maps["k2"] is maps["k1"]  # DiffK's and DiffLoRA's maps read two K's
        if one_call and not uses_fused_op(base.config):  # transformers' eager / sdpa / flex / flash implementation
            out = interface_attention(base, maps, logit_scale(base))
            return project_output(spec, base, method.transform_output(out)), None
        if mask is not None and not isinstance(mask, torch.Tensor):
            raise ValueError(
                f"this adapter's attention runs through diffattn's op, which needs a tensor attention mask "
                f"(attn_implementation {FUSED!r}, 'sdpa' or 'eager'); got {type(mask).__name__}"
            )
        if observing():  # attention capture for analysis (diffattn.eval.capture); off: one list check
            report(self, kind="diff" if method.two_maps else "single", method=method, **maps)
        bits = logit_bits()  # the low-bit logit analysis (diffattn.eval.outliers); normally None
        if bits is not None:
            out = quantized_attention(**maps, bits=bits)
        elif method.two_maps:
            # a packed row's mask reaches the op as segment ids (docs/methods.md §0.2)
            out = diff_attention(**with_packed_segments(maps, kwargs.get("position_ids")), backend=self.backend)
        else:
            t = q.shape[2]
            causal = mask is None and t > 1 and t == k.shape[2]  # with a cache and T > 1 transformers passes a mask
            out = sdpa_call(q, k, v, mask, causal, logit_scale(base))  # [B, H, T, d]
        out = method.transform_output(out)
        return project_output(spec, base, out), None


def _rope_all(spec, q, k, q2, k2, position_embeddings):
    """RoPE on Q1 (+Q2) and K1 (+K2) in one call each: the second map's heads ride along on the head axis."""
    hq, hk = q.shape[1], k.shape[1]
    qs = q if q2 is None else torch.cat([q, q2], dim=1)
    ks = k if k2 is None else torch.cat([k, k2], dim=1)
    qs, ks = rope(spec, qs, ks, position_embeddings)
    q, q2 = (qs, None) if q2 is None else qs.split(hq, dim=1)
    k, k2 = (ks, None) if k2 is None else ks.split(hk, dim=1)
    return q, k, q2, k2


@dataclass
class AdapterInfo:
    method: str
    config: object
    state: AdapterState
    fingerprint: str  # of the base model when the adapter was created (base_fingerprint)
    attn_implementation: str = "sdpa"  # the base's before adapting: remove_adapter puts it back
    base_dtype: str | None = None  # of the base's weights when fingerprinted ("float32"): a cast base is another


def weights_dtype(model: nn.Module) -> str | None:
    """The dtype most of the model's floating-point parameters have, as a name ("bfloat16")."""
    from collections import Counter

    counts = Counter(p.dtype for p in model.parameters() if p.is_floating_point())
    return str(counts.most_common(1)[0][0]).removeprefix("torch.") if counts else None


FINGERPRINT_VERSION = 2  # what base_fingerprint covers (every tensor of the base), recorded with it by save_adapter


def base_fingerprint(model: nn.Module) -> str:
    """Architecture sizes + a hash of every parameter and buffer of the base model, in name order (the adapter's
    output depends on all of them: a base with one MLP weight scaled is another base). Hashing is cheap next to
    loading the weights (~1 s for 135M parameters). save_adapter records it, load_adapter refuses another base."""
    h = hashlib.sha256(_fingerprint_sizes(model).encode())
    hash_tensors(h, model.state_dict(keep_vars=False))
    return h.hexdigest()


def hash_tensors(h, tensors: dict[str, torch.Tensor]) -> None:
    """Feed ``tensors`` to the hash ``h`` in name order: each one's name, shape, dtype and bytes (what the base and
    adapter fingerprints cover: a cast or a changed value is another fingerprint)."""
    for name, tensor in sorted(tensors.items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def _fingerprint_sizes(model: nn.Module) -> str:
    config = model.config
    keys = (
        "model_type",
        "hidden_size",
        "n_embd",
        "num_hidden_layers",
        "n_layer",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "vocab_size",
    )
    return json.dumps({k: getattr(config, k, None) for k in keys}, sort_keys=True)


def refuse_adapted(model: nn.Module, caller: str, remedy: str = "adapt a fresh base model") -> None:
    """The one refusal of a model that has a diffattn adapter already (its record, or attention modules an adapter
    wrapped; inside a PEFT wrapper too), for every entry that would adapt it again: ``adapt`` (before a method reads
    the attention modules: Dex's head selection would fail on wrapped ones), ``load_adapter`` and ``wrap_attention``."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model  # peft.PeftModel
    existing = vars(inner).get("_diffattn_adapter")
    if existing is None and not any(isinstance(m, AdaptedAttention) for m in inner.modules()):
        return
    what = f"a {existing.method} adapter" if existing is not None else "an adapter"
    raise ValueError(f"{caller}: this model has {what} already; {remedy}, or call remove_adapter(model) first")


def wrap_attention(model: nn.Module, make_method, config, method_name: str, anneal_steps: int | None):
    """Replace every attention module with an :class:`AdaptedAttention` built by ``make_method(layer_idx, attn)``."""
    spec = get_spec(model)
    refuse_adapted(model, "adapt")
    if getattr(model.config, "attn_logit_softcapping", None):
        raise ValueError(
            "attention logit soft-capping (config.attn_logit_softcapping) is not supported by the "
            "adapters yet; the recomputed attention would silently differ from the model's"
        )
    if dropout := dropout_not_applied(model.config):
        logger.warning(
            "the adapted attention computes without attention-probability dropout (%s): in training mode the adapted "
            "model drops no attention weights where the base did (docs/methods.md §7)",
            ", ".join(dropout),
        )
    # the adapted layers compute through diffattn's op (method.backend picks its backend); set_attn_implementation
    # afterwards routes them through transformers' implementations instead (diffattn.models.attention_interface)
    implementation_before = model.config._attn_implementation
    register_fused_attention()
    model.set_attn_implementation(FUSED)
    fingerprint = base_fingerprint(model)
    state = AdapterState(anneal_steps)
    for layer_idx, layer, attn in attention_modules(model, spec):
        method = make_method(layer_idx, attn, state)
        setattr(layer, spec.attention, AdaptedAttention(attn, spec, layer_idx, method))
    dtype = weights_dtype(model)
    model._diffattn_adapter = AdapterInfo(method_name, config, state, fingerprint, implementation_before, dtype)
    return model


def adapted_model(
    model: nn.Module, caller: str, *, allow_peft: bool = True, peft_remedy: str | None = None
) -> nn.Module:
    """The module that carries the diffattn adapter: ``model`` itself, or the model inside a PEFT wrapper
    (``get_base_model()``) or a DDP/accelerate wrapper (``.module``). ``allow_peft=False`` refuses a PEFT-wrapped
    model with the remedy (for operations whose result would drop the PEFT layers)."""
    inner = model
    for _ in range(4):
        # its own attribute, not getattr: PEFT's wrappers forward unknown attributes to the model inside
        if vars(inner).get("_diffattn_adapter") is not None:
            return inner
        if callable(getattr(inner, "get_base_model", None)):  # peft.PeftModel
            if not allow_peft:
                remedy = peft_remedy or (
                    f"fold the PEFT adapter in first (model = model.merge_and_unload()), then call {caller}(model)"
                )
                raise ValueError(f"{caller}: this model is wrapped by PEFT; {remedy}")
            inner = inner.get_base_model()
        elif isinstance(getattr(inner, "module", None), nn.Module):  # DistributedDataParallel, accelerate
            inner = inner.module
        elif isinstance(getattr(inner, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            inner = inner._orig_mod
        else:
            break
    raise ValueError(f"{caller}: this model has no diffattn adapter")


def set_adapter_step(model: nn.Module, step: int) -> None:
    """Set the training step t of λ(t) (Dex Eq. 4) for every adapted layer. A step past 0 needs T (the config's
    ``anneal_steps``) where λ anneals: refused here, not at the next forward, mid-training."""
    info = adapted_model(model, "set_adapter_step")._diffattn_adapter
    if int(step) != 0 and info.state.anneal_steps is None and getattr(info.config, "anneal", False):
        raise ValueError(
            f"{type(info.config).__name__}.anneal_steps (T of Dex Eq. 4) is not set, and λ(t) anneals: it is defined "
            f"at step 0 only, so step {int(step)} cannot be set; give anneal_steps in the config (diffattn adapt "
            "takes 20% of the run's steps), or anneal=False"
        )
    info.state.step = int(step)


def set_adapter_backend(model: nn.Module, backend: str) -> None:
    """Choose the backend of every adapted layer's two-map op (:func:`diffattn.ops.diff_attention`; ``auto`` by
    default); ``diffattn adapt`` sets the run's ``method.backend``. One-map methods ignore it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    for module in adapted_model(model, "set_adapter_backend").modules():
        if isinstance(module, AdaptedAttention):
            module.backend = backend


def remove_adapter(model: nn.Module) -> nn.Module:
    """Put the original attention modules back (adapter parameters are dropped; base weights the method
    trained, e.g. Dex's W_K/W_V/W_O, keep their trained values)."""
    info = getattr(model, "_diffattn_adapter", None)
    if info is None:
        raise ValueError("remove_adapter: this model has no diffattn adapter")
    spec = get_spec(model)
    for _, layer, attn in attention_modules(model, spec):
        if isinstance(attn, AdaptedAttention):
            setattr(layer, spec.attention, attn.base_attn)
    if model.config._attn_implementation == FUSED:  # ordinary attention modules cannot use our op
        model.set_attn_implementation(info.attn_implementation)
    model._diffattn_adapter = None
    return model
