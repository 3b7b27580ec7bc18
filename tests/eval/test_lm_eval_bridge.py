"""The lm-evaluation-harness bridge: a user's local YAML task over a local JSON-lines file is
scored offline through ``HFLM(pretrained=<model>, tokenizer=<tokenizer>)`` for a from-scratch ``debug`` DIFF model
and a Dex-adapted tiny Llama loaded from a local Hugging Face folder; the harness's log-likelihoods equal our own
forward pass; bad input is one clear error each; nothing touches the network.
"""

from __future__ import annotations

import copy
import json
import random
import socket

import pytest
import torch
from transformers import AutoModelForCausalLM

from diffattn import DexConfig, adapt, build_model, load_pretrained, set_adapter_step
from diffattn.data import load_corpus, train_tokenizer
from diffattn.eval.lm_eval_bridge import evaluate_with_lm_eval, list_local_tasks

from ..tiny_models import tiny_config

pytest.importorskip("lm_eval", reason="the lm-eval bridge needs the 'eval' extra (pip install 'diffattn[eval]')")

WORDS = ["the", "king", "queen", "sword", "crown", "night", "day", "river", "stone", "ghost", "crow", "bell"]
TASK = "tiny_local_mc"
# Six multiple-choice items: a context and three one-word continuations (lm-eval joins them with a space).
ITEMS = [
    {"question": f"the {a} and the {b} saw the", "choices": [c, d, e], "label": i % 3}
    for i, (a, b, c, d, e) in enumerate(WORDS[j : j + 5] for j in range(6))
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-eval-corpus")
    rng = random.Random(0)
    for i in range(24):
        (root / f"doc{i:02d}.txt").write_text(
            "\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(10))
        )
    return train_tokenizer(load_corpus(root), 300, cache_dir=tmp_path_factory.mktemp("lm-eval-tok"))


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A user's task folder: one YAML over a local JSON-lines file (absolute path: no hub, no working-dir rule)."""
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    data = folder / "items.jsonl"
    data.write_text("\n".join(json.dumps(item) for item in ITEMS) + "\n")
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(data))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        "doc_to_target: label\n"
        "metric_list:\n"
        "  - metric: acc\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "metadata:\n"
        "  version: 1.0\n"
    )
    return folder


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama saved with the tokenizer: what a user's local Hugging Face folder looks like."""
    folder = tmp_path_factory.mktemp("lm-eval-llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def no_network(monkeypatch):
    """Every outgoing connection fails and is recorded: the bridge must need none."""
    attempts = []

    def refuse(sock, address):
        attempts.append(address)
        raise OSError(f"test: network access to {address!r} refused")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@torch.no_grad()
def continuation_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """Sum of the continuation tokens' log-probabilities from one plain forward pass over context + continuation."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    assert whole[: len(context_ids)] == context_ids
    logits = model(torch.tensor([whole])).logits[0].double()
    logprobs = torch.log_softmax(logits[len(context_ids) - 1 : -1], dim=-1)
    targets = torch.tensor(whole[len(context_ids) :])
    return logprobs.gather(-1, targets[:, None]).sum().item()


def _check_scored(results: dict, model, tokenizer) -> None:
    entry = results[TASK]
    assert isinstance(entry["acc"], float) and 0.0 <= entry["acc"] <= 1.0
    assert entry["n_samples"] == len(ITEMS)
    assert len(entry["samples"]) == len(ITEMS)
    json.dumps(results, allow_nan=False)  # JSON-serialisable, no NaN
    meta = results["metadata"]
    assert meta["tasks"] == [TASK] and meta["limit"] is None and meta["num_fewshot_per_task"] == {TASK: 0}
    assert meta["lm_eval_version"] and meta["offline"] is True

    # The harness's log-likelihoods are our own: one item, each of its choices.
    sample = next(s for s in entry["samples"] if s["doc_id"] == 2)
    assert sample["doc"] == ITEMS[2]
    assert [cont for _, cont in sample["arguments"]] == [" " + c for c in ITEMS[2]["choices"]]
    for (context, continuation), (harness_ll, _greedy) in zip(
        sample["arguments"], sample["filtered_resps"], strict=True
    ):
        assert harness_ll == pytest.approx(continuation_logprob(model, tokenizer, context, continuation), abs=1e-4)
    # acc is the argmax of those log-likelihoods, averaged over the items.
    picks = [max(range(3), key=lambda i: s["filtered_resps"][i][0]) == s["target"] for s in entry["samples"]]
    assert entry["acc"] == pytest.approx(sum(picks) / len(picks))


def test_debug_diff_model_scores_a_local_task(tokenizer, task_dir, no_network):
    from diffattn.eval.common import TRAINED_LENGTH

    model = build_model("debug", "diff", seed=0, vocab_size=len(tokenizer))  # our attention installed
    setattr(model, TRAINED_LENGTH, 100)  # as load_for_eval records a run's data.seq_len
    model.train()
    rng_before = torch.get_rng_state()
    results = evaluate_with_lm_eval(model, tokenizer, TASK, include_path=task_dir, log_samples=True)
    # scored at the length the model was trained at, not its config's maximum (out of distribution past it)
    assert results["metadata"]["max_length"] == 100
    assert model.training  # the caller's train/eval mode is restored
    model.eval()
    _check_scored(results, model, tokenizer)
    assert results["metadata"]["model_class"] == "DiffLlamaForCausalLM"
    assert no_network == []
    assert torch.equal(torch.get_rng_state(), rng_before)  # simple_evaluate's reseeding is undone
    assert tokenizer.pad_token == "<|pad|>" and len(tokenizer) == 300  # the caller's tokenizer is untouched


def test_dex_adapted_llama_from_a_local_folder(llama_dir, task_dir, no_network):
    model, tokenizer = load_pretrained(llama_dir)  # a plain HF model + tokenizer objects from a local folder
    base = copy.deepcopy(model).eval()
    adapt(model, DexConfig(heads="all", anneal_steps=2))
    set_adapter_step(model, 1)  # λ(1) > 0
    with torch.no_grad():  # W_D starts at zero (identity); make the extension really change the outputs
        for name, p in model.named_parameters():
            if "dex_w_d" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    results = evaluate_with_lm_eval(
        model, tokenizer, [TASK], include_path=str(task_dir), batch_size=2, log_samples=True
    )
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)  # model untouched
    _check_scored(results, model, tokenizer)
    # The wrapped attention was what lm-eval scored: the adapted model's numbers are not the base model's.
    context, continuation = ITEMS[0]["question"], " " + ITEMS[0]["choices"][0]
    sample = next(s for s in results[TASK]["samples"] if s["doc_id"] == 0)
    assert abs(sample["filtered_resps"][0][0] - continuation_logprob(base, tokenizer, context, continuation)) > 1e-3
    assert no_network == []

    limited = evaluate_with_lm_eval(base, tokenizer, TASK, include_path=task_dir, limit=2, num_fewshot=1)
    assert limited[TASK]["n_samples"] == 2 and 0.0 <= limited[TASK]["acc"] <= 1.0
    assert limited["metadata"]["limit"] == 2 and limited["metadata"]["num_fewshot_per_task"] == {TASK: 1}


def test_bad_input_is_one_clear_error(tokenizer, task_dir, tmp_path):
    model = build_model("debug", "standard", seed=0, vocab_size=len(tokenizer))
    assert list_local_tasks(task_dir) == [TASK]
    with pytest.raises(ValueError, match=rf"unknown lm-eval task 'tiny_local_m'.*did you mean {TASK}.*include_path"):
        evaluate_with_lm_eval(model, tokenizer, "tiny_local_m", include_path=task_dir)
    with pytest.raises(ValueError, match="does not exist"):
        evaluate_with_lm_eval(model, tokenizer, TASK, include_path=tmp_path / "missing")
    with pytest.raises(ValueError, match=r"holds no \.yaml"):
        evaluate_with_lm_eval(model, tokenizer, TASK, include_path=tmp_path)
    with pytest.raises(ValueError, match="tokenizer object, not a name"):
        evaluate_with_lm_eval(model, "gpt2", TASK, include_path=task_dir)
    with pytest.raises(ValueError, match="limit"):
        evaluate_with_lm_eval(model, tokenizer, TASK, include_path=task_dir, limit=0)
    with pytest.raises(ValueError, match="simple_evaluate_kwargs"):
        evaluate_with_lm_eval(model, tokenizer, TASK, include_path=task_dir, task_manager=None)
