"""Dex (Kong et al. 2025, Eq. 3–5; docs/methods.md §2) on every architecture of the adapter table."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from diffattn.adapters import (
    AdaptedAttention,
    DexConfig,
    adapt,
    attention_modules,
    head_entropy,
    head_importance,
    load_adapter,
    merge_adapter,
    remove_adapter,
    save_adapter,
    set_adapter_step,
    trainable_parameters,
)
from diffattn.adapters.base import AdapterState, AnnealedLambda

from ..tiny_models import CONFIGS, VOCAB, ids, tiny

ATOL = 1e-5


def _randomise_dex(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, _, w in attention_modules(model):
            w.method.dex_w_d.copy_(0.3 * torch.randn(w.method.dex_w_d.shape, generator=g))
            w.method.dex_lambda.lambda_learn.fill_(0.4)


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_identity_at_init(model_type):
    base = tiny(model_type)
    x = ids()
    with torch.no_grad():
        want = base(x).logits
        model = adapt(base, DexConfig(heads="all", init="identity", anneal_steps=10))
        got = model(x).logits  # λ(0) = 0 even with W_D = I
    assert all(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(model))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


def test_annealed_lambda_follows_eq4():
    state = AdapterState(anneal_steps=10)
    lam = AnnealedLambda(0.5, state)
    with torch.no_grad():
        lam.lambda_learn.fill_(0.2)
    expected = {0: 0.0, 5: 0.5 * 0.5 * 0.5 + 0.5 * 0.2, 10: 0.2, 40: 0.2}
    for t, want in expected.items():
        state.step = t
        assert float(lam().detach()) == pytest.approx(want)
    state.anneal_steps = None
    state.step = 0
    assert float(lam().detach()) == 0.0
    state.step = 3
    with pytest.raises(ValueError, match="anneal_steps"):
        lam()


def test_dex_changes_only_the_selected_heads():
    model = adapt(tiny("llama"), DexConfig(heads=[[1], [0, 3]], anneal_steps=10))
    _randomise_dex(model)
    set_adapter_step(model, 10)
    wrapper = attention_modules(model)[1][2]
    o = torch.randn(2, 4, 5, 16)
    out = wrapper.method(o)
    torch.testing.assert_close(out[:, [1, 2]], o[:, [1, 2]])
    lam = float(wrapper.method.dex_lambda().detach())
    w = wrapper.method.dex_w_d
    torch.testing.assert_close(out[:, 0], o[:, 0] - lam * o[:, 0] @ w[0].T)
    torch.testing.assert_close(out[:, 3], o[:, 3] - lam * o[:, 3] @ w[1].T)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gpt2"])
def test_trainable_set_is_dex_s_and_training_lowers_the_loss(model_type):
    model = adapt(tiny(model_type), DexConfig(heads="all", w_d="per_head", anneal_steps=4))
    names = trainable_parameters(model)
    spec_names = ("k_proj", "v_proj", "o_proj") if model_type != "gpt2" else ("c_attn", "c_proj")
    expected = {
        n for n, _ in model.named_parameters() if any(f"base_attn.{s}." in n for s in spec_names) or ".method." in n
    }
    assert set(names) == expected
    n_layers, heads, d = 2, 4, 16
    dex_params = sum(p.numel() for n, p in model.named_parameters() if ".method." in n)
    assert dex_params == n_layers * (heads * d * d + 1)  # W_D per head + λ_learn per layer
    # AdamW's decoupled decay would move the zero-gradient query third of GPT-2's fused c_attn: no decay there
    fused = [p for n, p in model.named_parameters() if p.requires_grad and "c_attn" in n]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and "c_attn" not in n]
    opt = torch.optim.AdamW([{"params": rest}, {"params": fused, "weight_decay": 0.0}], lr=1e-2)
    x = ids(b=4, t=16)
    q_before = [p.clone() for n, p in model.named_parameters() if "c_attn" in n]
    losses = []
    for step in range(8):
        set_adapter_step(model, step)
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    if model_type == "gpt2":  # the query third of the fused c_attn stays frozen in effect
        w = next(p for n, p in model.named_parameters() if n.endswith("0.attn.base_attn.c_attn.weight"))
        torch.testing.assert_close(w[:, :64], q_before[0][:, :64], atol=0, rtol=0)
        assert not torch.equal(w[:, 64:], q_before[0][:, 64:])


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_merge_equals_unmerged_and_is_a_plain_model(model_type):
    base = tiny(model_type)
    keys = set(base.state_dict())
    classes = [type(m) for _, _, m in attention_modules(base)]
    model = adapt(base, DexConfig(heads="random", k=3, anneal_steps=10))
    _randomise_dex(model, seed=3)
    set_adapter_step(model, 7)
    x = ids()
    with torch.no_grad():
        unmerged = model(x).logits
        merged_model = merge_adapter(model)
        merged = merged_model(x).logits
    torch.testing.assert_close(merged, unmerged, atol=ATOL, rtol=ATOL)
    assert set(merged_model.state_dict()) == keys
    assert [type(m) for _, _, m in attention_modules(merged_model)] == classes


def test_entropy_picks_the_uniform_head():
    model = tiny("llama")
    with torch.no_grad():  # layer 0, head 2: zero queries -> uniform attention -> the highest entropy
        model.model.layers[0].self_attn.q_proj.weight[2 * 16 : 3 * 16] = 0
    entropy = head_entropy(model, [ids(t=16)])
    assert entropy.shape == (2, 4) and entropy[0].argmax().item() == 2
    cfg = DexConfig(heads="entropy", k=1, anneal_steps=5)
    adapt(model, cfg, calibration=[ids(t=16)])
    assert cfg.selected[0] == [2]
    low = DexConfig(heads="low-entropy", k=1, anneal_steps=5)
    adapt(remove_adapter(model), low, calibration=[ids(t=16)])
    assert low.selected[0] != [2]


def test_remove_adapter_restores_the_modules():
    base = tiny("mistral")
    classes = [type(m) for _, _, m in attention_modules(base)]
    model = remove_adapter(adapt(base, DexConfig(heads="all", anneal_steps=3)))
    assert [type(m) for _, _, m in attention_modules(model)] == classes
    with pytest.raises(ValueError, match="no diffattn adapter"):
        remove_adapter(model)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda m: adapt(m, DexConfig(heads=[[0], [7]])), r"heads\[1\] has head index\(es\) \[7\] out of range"),
        (lambda m: adapt(m, DexConfig(heads=[[0]])), "one list per layer"),
        (lambda m: adapt(m, DexConfig(heads="random", k=5)), "k=5 exceeds the 4 heads"),
        (lambda m: adapt(m, DexConfig(heads="entropy")), "needs calibration batches"),
        (lambda m: DexConfig(anneal_steps=0), "anneal_steps must be >= 1"),
        (lambda m: DexConfig(heads="best"), "heads must be one of"),
        (lambda m: adapt(m, "dex"), "unsupported adapter config"),
    ],
)
def test_bad_input_is_one_clear_error_and_leaves_the_model_unchanged(make, message):
    model = tiny("llama")
    with pytest.raises(ValueError, match=message):
        make(model)
    assert not any(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(model))


def test_unsupported_architecture_is_refused():
    from transformers import BertConfig, BertForMaskedLM

    bert = BertForMaskedLM(
        BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )
    with pytest.raises(ValueError, match="unsupported model type 'bert'; supported: llama"):
        adapt(bert, DexConfig(heads="all", anneal_steps=2))


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_importance_is_the_gate_gradient_and_picks_a_disconnected_head(model_type):
    model = tiny(model_type)
    o_proj = attention_modules(model)[0][2].o_proj if model_type != "gpt2" else attention_modules(model)[0][2].c_proj
    with torch.no_grad():  # layer 0, head 1 feeds nothing into W_O: importance exactly 0, the least important
        if model_type == "gpt2":  # Conv1D stores W as [in, out]
            o_proj.weight[16:32, :] = 0
        else:
            o_proj.weight[:, 16:32] = 0
    x = ids(t=16)
    importance = head_importance(model, [x])
    assert importance.shape == (2, 4) and importance[0, 1] == 0 and importance[0].argmin().item() == 1
    # Michel et al.'s |∂L/∂ξ_h| against a central finite difference of the loss in head 2's gate (its W_O rows
    # scaled by 1 ± ε), in float64
    model = model.double()
    eps = 1e-4

    def loss_with_gate(g):
        w = o_proj.weight.detach().clone()
        with torch.no_grad():
            if model_type == "gpt2":
                o_proj.weight[32:48, :] *= g
            else:
                o_proj.weight[:, 32:48] *= g
            logits = model(x).logits  # the loss in float64 (HF's loss upcasts only to float32)
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:]) + torch.nn.functional.cross_entropy(
                logits[1, :-1], x[1, 1:]
            )
            o_proj.weight.copy_(w)
        return loss

    numeric = abs(loss_with_gate(1 + eps) - loss_with_gate(1 - eps)).item() / 2 / (2 * eps)  # mean of 2 rows
    assert head_importance(model, [x])[0, 2].item() == pytest.approx(numeric, rel=1e-3)
    assert all(p.grad is None for p in model.parameters())  # the model's grads are untouched
    cfg = DexConfig(heads="importance", k=1, anneal_steps=5)
    adapt(model.float(), cfg, calibration=[x])
    assert cfg.selected[0] == [1]


def _trained_dex(model_type="llama"):
    model = adapt(tiny(model_type), DexConfig(heads="random", k=2, anneal_steps=4))
    trainable_parameters(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    x = ids(b=4, t=16)
    for step in range(6):
        set_adapter_step(model, step)
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_save_then_load_into_a_fresh_base_gives_identical_logits(model_type, tmp_path):
    model = _trained_dex(model_type)
    save_adapter(model, tmp_path / "adapter")
    meta = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert meta["method"] == "dex" and meta["step"] == 5 and meta["config"]["selected"]
    fresh = load_adapter(tiny(model_type), tmp_path / "adapter")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, model(x).logits, atol=0, rtol=0)


def _unchanged(model, reference) -> bool:
    same_modules = not any(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(model))
    same_weights = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.values(), strict=True))
    return same_modules and same_weights


def test_loading_into_another_base_is_refused_and_changes_nothing(tmp_path):
    save_adapter(_trained_dex(), tmp_path / "adapter")
    other = tiny("llama", seed=7)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="trained on a different base model"):
        load_adapter(other, tmp_path / "adapter")
    assert _unchanged(other, before)


@pytest.mark.parametrize("damage", ["truncate", "method", "missing"])
def test_damaged_adapter_folders_fail_clearly_and_change_nothing(tmp_path, damage):
    folder = save_adapter(_trained_dex(), tmp_path / "adapter")
    weights, cfg = folder / "adapter.safetensors", folder / "adapter_config.json"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        message = "truncated or corrupt"
    elif damage == "method":
        cfg.write_text(cfg.read_text().replace('"method": "dex"', '"method": "bogus"'))
        message = "unsupported adapter method 'bogus'"
    else:
        weights.unlink()
        message = "is not an adapter folder"
    base = tiny("llama")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        load_adapter(base, folder)
    assert _unchanged(base, before)


@pytest.mark.parametrize("model_type", ["mistral", "gemma3_text"])
def test_sliding_window_shorter_than_the_sequence_is_respected(model_type):
    from transformers import AutoModelForCausalLM

    config = CONFIGS[model_type]()
    config.sliding_window = 4  # shorter than the 12-token sequence: transformers passes a banded mask
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    x = ids()
    with torch.no_grad():
        want = base(x).logits
        unwindowed = copy.deepcopy(base)
        unwindowed.config.sliding_window = 64
        assert not torch.allclose(unwindowed(x).logits, want, atol=1e-3)  # the window really matters here
        model = adapt(base, DexConfig(heads="all", anneal_steps=2))
        got = model(x).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


def test_logit_softcapping_is_refused():
    from transformers import AutoModelForCausalLM

    config = CONFIGS["gemma3_text"]()
    config.attn_logit_softcapping = 50.0
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="soft-capping"):
        adapt(model, DexConfig(heads="all", anneal_steps=2))


def _train_six_steps(model, x):
    """Six AdamW steps of Dex's training set, t = 0..5, without :func:`trainable_parameters` (which refuses a
    Dex that cannot learn): what a loop that skipped the check would do."""
    params = [p for n, p in model.named_parameters() if ".method." in n or "o_proj" in n]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    for step in range(6):
        set_adapter_step(model, step)
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()


def test_identity_is_the_default_init_and_six_steps_move_w_d_and_lambda():
    cfg = DexConfig(heads="all", anneal_steps=1)  # T = 1: what `diffattn adapt` used to give a 6-step run
    assert cfg.init == "identity" and cfg.never_learns() is None
    model = adapt(tiny("llama"), cfg)
    trainable_parameters(model)  # accepted
    _train_six_steps(model, ids(b=4, t=16))
    for _, _, w in attention_modules(model):
        eye = torch.eye(16).expand_as(w.method.dex_w_d)
        assert not torch.equal(w.method.dex_w_d.detach(), eye)  # W_D moved from its init
        assert float(w.method.dex_lambda().detach()) != 0.0  # and λ = λ_learn is no longer 0


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"anneal": False}, "init='zero' and anneal=False"),
        ({"anneal_steps": 1}, "init='zero' and anneal_steps=1"),
        ({"anneal_steps": 4, "lambda_init": 0.0}, "init='zero' and lambda_init=0"),
    ],
)
def test_a_zero_init_dex_that_can_never_learn_is_refused_before_training(options, reason):
    # the refusal is right: trained anyway, W_D and λ end exactly 0 (the old default on a 6-step run)
    model = adapt(tiny("llama"), DexConfig(heads="all", init="zero", **options))
    _train_six_steps(model, ids(b=4, t=16))
    for _, _, w in attention_modules(model):
        assert torch.count_nonzero(w.method.dex_w_d) == 0
        assert float(w.method.dex_lambda().detach()) == 0.0 and float(w.method.dex_lambda.lambda_learn.detach()) == 0.0
    # trainable_parameters (the step before any training) says why and what to do instead
    model = adapt(tiny("llama"), DexConfig(heads="all", init="zero", **options))
    with pytest.raises(ValueError, match="would train nothing") as err:
        trainable_parameters(model)
    message = str(err.value)
    assert reason in message and "neither ever moves" in message and "Use init='identity'" in message


def test_a_zero_init_dex_with_an_annealing_ramp_is_accepted_and_learns():
    model = adapt(tiny("llama"), DexConfig(heads="all", init="zero", anneal_steps=3))
    trainable_parameters(model)
    _train_six_steps(model, ids(b=4, t=16))
    for _, _, w in attention_modules(model):
        assert torch.count_nonzero(w.method.dex_w_d) > 0 and float(w.method.dex_lambda().detach()) != 0.0


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_head_entropy_is_the_entropy_of_the_model_s_own_attention_maps(model_type):
    """Dex's selection signal equals the entropy of the maps transformers' eager path returns, over 64 tokens:
    beyond the 32-token sliding window of Mistral's and Gemma-3's layers, so the window must be respected."""
    model = tiny(model_type)
    x = ids(t=64)
    entropy = head_entropy(model, [x])
    model.set_attn_implementation("eager")
    with torch.no_grad():
        maps = model(x, output_attentions=True).attentions
    want = torch.stack([-(a * torch.log(a.clamp_min(1e-30))).sum(-1).mean(dim=(0, 2)) for a in maps])
    torch.testing.assert_close(entropy, want.float(), atol=1e-4, rtol=1e-4)
