"""Tensor parallelism through transformers' ``from_pretrained(..., tp_plan="auto")`` on 2 gloo CPU processes: the
baseline and DIFF V2 (whose config's ``base_model_tp_plan`` adds the gate ``lambda_proj``, so each rank holds whole
query pairs with their gates, docs/methods.md §5.1) give the logits of one process, and each rank really holds half
of the heads."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from diffattn.models import build_model

from .test_sharded import assert_within_rounding, run_job

PROBE = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))


def tensor_parallel_job(rank, out_dir, names):
    results = {}
    for name in names:
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, name), tp_plan="auto", dtype=torch.float32)
        attention = model.model.layers[0].self_attn
        with torch.no_grad():
            logits = model(PROBE).logits
        results[name] = {
            "logits": logits.tolist(),
            "local_rows": {
                n: getattr(p, "to_local", lambda p=p: p)().shape[0]
                for n, p in attention.named_parameters()
                if n != "o_proj.weight"
            },
        }
    return results


@pytest.mark.parametrize("name", [pytest.param("standard", marks=pytest.mark.slow), "diff-v2"])
def test_tp_plan_auto_on_two_processes_gives_the_logits_of_one(tmp_path, name):
    model = build_model("debug", name, seed=0)
    model.save_pretrained(tmp_path / name)
    got = run_job(tensor_parallel_job, tmp_path, names=[name])[name]
    heads = 2 * model.config.num_attention_heads if name == "diff-v2" else model.config.num_attention_heads
    d, hkv = model.config.head_dim, model.config.num_key_value_heads
    want_rows = {"q_proj.weight": heads * d // 2, "k_proj.weight": hkv * d // 2, "v_proj.weight": hkv * d // 2}
    if name == "diff-v2":
        want_rows["lambda_proj.weight"] = model.config.num_attention_heads // 2
    assert got["local_rows"] == want_rows
    with torch.no_grad():
        fp32 = model(PROBE).logits
        gold = model.double()(PROBE).logits
    assert_within_rounding(f"{name} tp logits", torch.tensor(got["logits"]), gold, [fp32])
