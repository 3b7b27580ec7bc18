"""DIFF Eq. 2 for every layer at once in a DIFF model's forward (:func:`diffattn.models.diff_llama.layer_lambdas`, the
forward pre-hook :func:`diffattn.install_diff_attention` puts on the ``DiffLlamaModel``): each layer's λ and its
gradient as the layer's own computation gives them, within float32's rounding; every layer of a forward reads it;
not used where it would not be the same computation (activation checkpointing) or where λ's own kernels are switched
on; one hook however often the attention is installed."""

from __future__ import annotations

import math

import torch

from diffattn import ops
from diffattn.models import build_model, diff_llama, install_diff_attention, remove_diff_attention
from diffattn.models.diff_llama import LAMBDA_VECTORS, LAMBDAS_KWARG, hand_layers_their_lambdas, layer_lambdas

LAYERS = 4
F32_EPS = torch.finfo(torch.float32).eps


def _model(layers: int = LAYERS, dtype=torch.float32):
    """A debug DIFF model whose λ vectors are large enough that λ differs by layer, and whose weights are large enough
    that the loss depends on it (at the initialiser's scale every logit is about 0)."""
    model = build_model("debug", "diff", backend="sdpa", seed=0, num_layers=layers)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(10)
        for attn in _attentions(model):
            for name in LAMBDA_VECTORS:
                getattr(attn, name).normal_(0, 0.3)
    return model.to(dtype)


def _attentions(model):
    return [layer.self_attn for layer in model.model.layers]


def _ids(b=2, t=12):
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(0))


def _within_own_rounding(value: torch.Tensor, own: torch.Tensor, reference: torch.Tensor) -> None:
    """``value`` at most twice as far from the float64 ``reference`` as the layer's ``own`` float32 computation is
    (floored at one float32 ulp of the reference: where ``own`` rounds exactly, the batch may still round once)."""
    own_error = (own.double() - reference).abs()
    floor = F32_EPS * reference.abs()
    bound = 2 * torch.maximum(own_error, floor)
    error = (value.double() - reference).abs()
    assert bool((error <= bound).all()), f"error {error.max():.3g} over the bound {bound.max():.3g}"


def _reference_lambda(attn) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Eq. 2 in float64 from the layer's vectors, and the vectors it was computed from (leaves)."""
    q1, k1, q2, k2 = (getattr(attn, name).detach().double().requires_grad_() for name in LAMBDA_VECTORS)
    lam = torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + attn.lambda_init
    return lam, [q1, k1, q2, k2]


def test_every_layers_lambda_and_its_gradient_are_its_own_within_float32_rounding():
    model = _model()
    attentions = _attentions(model)
    lams = layer_lambdas(model.model).by_layer
    assert sorted(lams) == [a.layer_idx for a in attentions]
    weights = torch.linspace(-1.0, 2.0, len(attentions))  # a different upstream gradient for each layer's λ
    sum(w * lams[a.layer_idx] for w, a in zip(weights, attentions, strict=True)).backward()
    batched = {name: p.grad.clone() for name, p in model.named_parameters() if "lambda" in name}
    model.zero_grad()
    own = [a.lambda_full() for a in attentions]
    sum(w * lam for w, lam in zip(weights, own, strict=True)).backward()
    for attn, lam_own, w in zip(attentions, own, weights, strict=True):
        reference, leaves = _reference_lambda(attn)
        _within_own_rounding(lams[attn.layer_idx].detach(), lam_own.detach(), reference.detach())
        (w.double() * reference).backward()
        for name, leaf in zip(LAMBDA_VECTORS, leaves, strict=True):
            parameter = getattr(attn, name)
            key = next(k for k, p in model.named_parameters() if p is parameter)
            _within_own_rounding(batched[key], parameter.grad, leaf.grad)


def _count_lambda_calls(monkeypatch) -> list[int]:
    """Each call of Eq. 2 from a DIFF layer or the model's forward, by the number of λ it computed."""
    calls = []
    real = diff_llama.reparameterized_lambda

    def counted(*args):
        lam = real(*args)
        calls.append(lam.numel())
        return lam

    monkeypatch.setattr(diff_llama, "reparameterized_lambda", counted)
    return calls


def test_a_forward_computes_every_layers_lambda_once_and_trains_as_each_layers_own(monkeypatch):
    calls = _count_lambda_calls(monkeypatch)
    ids = _ids()
    runs = {}
    for how in ("at once", "per layer", "float64"):
        model = _model(dtype=torch.float64 if how == "float64" else torch.float32)
        calls.clear()
        # each layer's own forced (the float64 model's too, a reference independent of the batching)
        with ops.lambda_per_layer(None if how == "at once" else True):
            loss = model(input_ids=ids, labels=ids).loss
        runs[how] = (loss.detach().double(), [c for c in calls])
        loss.backward()
        runs[how] += ({name: p.grad.double() for name, p in model.named_parameters()},)
    assert runs["at once"][1] == [LAYERS]  # one computation, every layer's λ
    assert runs["per layer"][1] == runs["float64"][1] == [1] * LAYERS
    (loss, _, grads), (loss_own, _, grads_own), (loss_64, _, grads_64) = runs.values()
    _within_own_rounding(loss, loss_own, loss_64)
    for name, grad in grads.items():
        # a tensor at a time, by its largest entry: the yardstick is the float32 model's own distance from float64
        own_error = (grads_own[name] - grads_64[name]).abs().max()
        floor = F32_EPS * grads_64[name].abs().max()
        assert (grad - grads_64[name]).abs().max() <= 2 * max(own_error, floor), name


def test_each_layer_computes_its_own_lambda_where_batching_is_not_the_same_computation(monkeypatch):
    calls = _count_lambda_calls(monkeypatch)
    ids = _ids()
    model = _model().train()
    # a reentrant checkpoint would run a shared chain's backward once per layer (transformers >= 5.24's name first)
    checkpointing = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    checkpointing()
    model(input_ids=ids, labels=ids).loss.backward()
    assert calls == [1] * (2 * LAYERS)  # each layer's, in the forward and again in its recomputation
    assert all(p.grad is not None for name, p in model.named_parameters() if "lambda" in name)
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    assert layer_lambdas(model.model) is not None
    # where λ's own kernels are switched on (measured against the batching): each layer's by its kernel
    calls.clear()
    with ops.fused_lambda(True):
        model(input_ids=ids, labels=ids)
    assert calls == [1] * LAYERS
    # a layer called on its own (no model forward around it) computes its own
    calls.clear()
    layer = model.model.layers[0]
    hidden = torch.randn(2, 12, model.config.hidden_size)
    position = model.model.rotary_emb(hidden, torch.arange(12)[None])
    layer(hidden, position_embeddings=position)
    assert calls == [1]


def test_vectors_of_another_dtype_or_not_plain_parameters_are_not_batched():
    # (another device, or FSDP2's and tensor parallelism's DTensors, are told apart the same way: not on this CPU)
    model = _model()
    assert layer_lambdas(model.model) is not None
    last = _attentions(model)[-1]
    with torch.no_grad():
        last.lambda_k2 = torch.nn.Parameter(last.lambda_k2.double())
    assert layer_lambdas(model.model) is None
    model = _model()
    last = _attentions(model)[-1]
    vector = last._parameters.pop("lambda_k2").detach()
    last.register_buffer("lambda_k2", vector)
    assert layer_lambdas(model.model) is None


def _our_hooks(decoder) -> int:
    return sum(hook is hand_layers_their_lambdas for hook in decoder._forward_pre_hooks.values())


def test_installing_again_leaves_one_hook_and_removing_the_attention_takes_it_away():
    model = _model()
    assert _our_hooks(model.model) == 1
    install_diff_attention(model, "chunked")
    install_diff_attention(model, "sdpa", lambda_init=0.5)
    assert _our_hooks(model.model) == 1
    # and the λ handed over follow the new λ_init
    lams = layer_lambdas(model.model).by_layer
    for attn in _attentions(model):
        assert attn.lambda_init == 0.5
        assert torch.equal(lams[attn.layer_idx], attn.lambda_full())
    remove_diff_attention(model)
    assert _our_hooks(model.model) == 0


def test_the_keyword_reaches_every_layer():
    seen = []
    model = _model()
    for attn in _attentions(model):
        attn.register_forward_pre_hook(lambda m, a, kw: seen.append(LAMBDAS_KWARG in kw), with_kwargs=True)
    ids = _ids()
    with torch.no_grad():
        model(input_ids=ids)
    assert seen == [True] * LAYERS


def test_a_model_of_one_layer_lets_it_compute_its_own():
    model = _model(layers=1)
    assert layer_lambdas(model.model) is None
    assert math.isfinite(float(_attentions(model)[0].lambda_full().detach()))


def test_a_decodings_forwards_compute_lambda_once_until_a_vector_changes(monkeypatch):
    """Decoding: λ is the same at every token, so a forward without gradient against the same KV cache reuses the last
    one's λ — until a vector is updated in place (an optimiser's step), its memory replaced (``model.to``), λ_init
    changed, another mode (autocast, inference mode), or a forward takes a gradient; a forward without a cache, or
    with another, computes its own (so an edit through ``.data``, which moves nothing, is seen from the next cache on);
    the outputs are those of λ computed anew."""
    from transformers import DynamicCache

    from diffattn.eval.common import cache_keyword

    calls = _count_lambda_calls(monkeypatch)
    model, ids = _model(), _ids()
    keyword = cache_keyword(model)
    cache = DynamicCache()

    def forward(cache=cache):
        with torch.no_grad():
            return model(input_ids=ids, use_cache=True, **{keyword: cache}).logits

    first = forward()
    again = forward()
    assert calls == [LAYERS]
    with torch.no_grad():
        fresh = model(input_ids=ids).logits  # no cache: its own λ
    assert calls == [LAYERS] * 2 and torch.equal(first[:, -1], fresh[:, -1])
    assert not torch.equal(again, first)  # (the cache grew: the second forward saw more keys)

    attn = _attentions(model)[1]
    with torch.no_grad():
        attn.lambda_q1.add_(0.25)  # an in-place update, as an optimiser's step
    forward()
    assert calls == [LAYERS] * 3
    lam = layer_lambdas(model.model).by_layer[attn.layer_idx]  # with gradient: computed, not remembered
    reference, _ = _reference_lambda(attn)
    assert abs(lam.item() - reference.item()) <= 4 * F32_EPS * abs(reference.item())
    assert calls == [LAYERS] * 4
    forward()
    forward()
    assert calls == [LAYERS] * 4  # (the forward with gradient computed its own and left the decoding's memo alone)

    attn.lambda_init = attn.lambda_init + 0.1
    forward()
    assert calls == [LAYERS] * 5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        forward()
    assert calls == [LAYERS] * 6
    forward()  # out of autocast again: another mode than the last forward's
    assert calls == [LAYERS] * 7
    attn.lambda_k2.data.mul_(2)  # through .data: neither version nor memory moves — seen from the next cache on
    forward(DynamicCache())
    assert calls == [LAYERS] * 8
    model.double()  # every vector's memory replaced
    forward()
    assert calls == [LAYERS] * 9
    with torch.inference_mode():  # another mode: computed there, and remembered for its own forwards
        forward()
        forward()
    assert calls == [LAYERS] * 10
    monkeypatch.setattr(diff_llama, "values_readable", lambda: False)  # traced or captured: computed every time
    forward()
    forward()
    assert calls == [LAYERS] * 12
