"""The method registry: a toy method defined and registered in this file alone (what a new method's own module
does) is adapted, trained by ``diffattn adapt``, saved, reloaded, benchmarked, listed and reported with no other
file changed — the two-file recipe of the README (the method's module + its name in ``adapters/__init__.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import diffattn
from diffattn.adapters import registry
from diffattn.adapters.annealed import attention_module_names
from diffattn.adapters.base import AdapterMethod, wrap_attention
from diffattn.cli import main

from ..tiny_models import tiny


@dataclass
class ToyConfig:
    """V' = (1 + g)·X on the value path, one learnable g per layer (0 at init: the identity)."""

    gain_init: float = 0.0


class ToyGain(AdapterMethod):
    def __init__(self, gain_init: float, device):
        super().__init__()
        self.toy_gain = nn.Parameter(torch.tensor(gain_init, device=device))

    def current_lambda(self) -> torch.Tensor:
        return self.toy_gain.detach().float()

    def value_input(self, x):
        return x * (1.0 + self.toy_gain).to(x.dtype)


def adapt_toy(model, config: ToyConfig, calibration=None):
    device = next(model.parameters()).device
    return wrap_attention(model, lambda layer, attn, state: ToyGain(config.gain_init, device), config, "toy", None)


def _bench_rows(shape, anneal_steps, second_map_flops):
    return [("toy", ToyConfig(gain_init=0.5), False, float(shape.batch * shape.seq * shape.d_model), None)]


@pytest.fixture
def toy():
    spec = registry.register(
        registry.MethodSpec(
            name="toy", display="Toy", config=ToyConfig, adapt=adapt_toy,
            trained_names=lambda m: [n for n in attention_module_names(m) if n.endswith("toy_gain")],
            report_settings=("gain_init",), bench_variants=_bench_rows,
        )
    )  # fmt: skip
    yield spec
    registry.unregister("toy")


def test_a_registered_method_is_known_everywhere(toy):
    from diffattn.train.adapt_config import ADAPT_METHODS
    from diffattn.train.recipes import PAPER_RECIPES

    assert diffattn.METHODS["toy"] is ToyConfig and "toy" in ADAPT_METHODS
    assert diffattn.ToyConfig is ToyConfig  # the top-level name resolves through the registry
    assert "toy" not in PAPER_RECIPES  # it states none
    model = tiny("llama")
    x = torch.randint(0, 90, (1, 12))
    before = model(x).logits
    diffattn.adapt(model, ToyConfig())
    torch.testing.assert_close(model(x).logits, before)  # identity at init
    assert diffattn.trainable_parameters(model) == [n for n, _ in model.named_parameters() if "toy_gain" in n]
    assert diffattn.adapter_lambdas(model) == [0.0, 0.0]  # the one λ read-out sees it
    with pytest.raises(NotImplementedError, match="toy cannot be merged"):
        diffattn.merge_adapter(model)


def test_a_registered_method_trains_saves_and_reloads(toy, base_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "toy"
    args = ["adapt", "--model", str(base_dir), "--method", "toy", "--data", str(corpus_dir), "--out", str(out)]
    args += ["--max-steps", "2", "--batch-size", "2", "--seq-len", "32", "--lr", "0.05"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "toy" and summary["method_config"] == {"gain_init": 0.0}
    assert any(abs(v) > 0 for v in summary["lambda"])  # the gain moved
    model, _ = diffattn.load_adapted(out)
    reloaded = [float(p) for n, p in model.named_parameters() if n.endswith("toy_gain")]
    assert reloaded == pytest.approx(summary["lambda"])


def test_a_registered_method_has_its_benchmark_rows(toy):
    from diffattn.bench.adapters import ModelShape, variants

    shape = ModelShape(layers=2, d_model=64, heads=4, kv_heads=2, head_dim=16, d_ff=96, vocab=96, batch=1, seq=8)
    rows = {v.name: v for v in variants(shape)}
    assert rows["toy"].extra_flops(shape) == 8 * 64
    assert "dex unmerged" in rows and "difflora both" in rows  # the built-in methods' rows come from the registry too


def test_the_registry_refuses_a_second_entry_of_one_name():
    spec = registry.get_method("dex")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.MethodSpec(name="dex", display="x", config=ToyConfig, adapt=adapt_toy))
    assert registry.get_method("dex") is spec
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        registry.get_method("nope")
