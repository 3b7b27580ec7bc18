"""The adapters' attention backend is a run setting like the models' (``model.backend``): ``method.backend`` in the
adapt config and ``diffattn adapt --backend`` reach every adapted attention module, and the two-map op runs on it."""

from __future__ import annotations

import pytest
import yaml

from diffattn.adapters import AdaptedAttention, DAAConfig, adapt, base
from diffattn.adapters.base import set_adapter_backend
from diffattn.cli import main
from diffattn.train.adapt_config import AdaptMethodSection, AdaptRunConfig

from ..helpers import record_backends
from ..tiny_models import ids, tiny


def test_diffattn_adapt_backend_reaches_the_installed_modules(base_dir, corpus_dir, tmp_path, monkeypatch, capsys):
    used = record_backends(monkeypatch, base)
    out = tmp_path / "daa"
    args = ["adapt", "--model", str(base_dir), "--method", "daa", "--data", str(corpus_dir), "--out", str(out)]
    args += ["--max-steps", "1", "--batch-size", "2", "--seq-len", "32", "--backend", "reference"]
    assert main(args) == 0, capsys.readouterr().err
    assert used and set(used) == {"reference"}  # every two-map forward of the run, training and evaluation
    assert yaml.safe_load((out / "run.yaml").read_text())["method"]["backend"] == "reference"


def test_method_backend_from_the_config_and_its_refusals():
    config = AdaptRunConfig().with_overrides({"method.name": "daa", "method.backend": "chunked"}).validate()
    assert config.method.backend == "chunked" and config.method.options == {}  # a section field, not an option
    with pytest.raises(ValueError, match=r"method\.backend must be one of auto, reference"):
        AdaptRunConfig(method=AdaptMethodSection(backend="magic")).validate()
    model = adapt(tiny("llama"), DAAConfig(anneal_steps=2))
    assert {m.backend for m in model.modules() if isinstance(m, AdaptedAttention)} == {"auto"}
    set_adapter_backend(model, "sdpa")
    assert {m.backend for m in model.modules() if isinstance(m, AdaptedAttention)} == {"sdpa"}
    model(ids())
    with pytest.raises(ValueError, match="backend must be one of"):
        set_adapter_backend(model, "magic")
