"""Declarative experiments: one YAML names the models, methods, data, budgets and evaluation suites.

```yaml
name: quickstart
data: {source: shakespeare, seq_len: 256, vocab_size: 4096, retrieval_fraction: 0.2}   # pretraining data
train: {max_steps: 150, global_batch_size: 8}                                            # pretraining budget
models:                         # trained from scratch (diffattn pretrain), same data order and seed
  - {name: baseline, preset: tiny, attention: standard, seeds: [0, 1]}   # two replicates: baseline-s0, baseline-s1
  - {name: diff, preset: tiny, attention: diff, seeds: [0, 1]}
pretrained:                     # evaluated as they are, and usable as adapter bases by name
  - {name: smollm2, path: smollm2-135m}
adapters:                       # diffattn adapt on a model above (by name) or a pretrained one (smollm2-135m, a path)
  - {name: dex, base: baseline, method: dex, options: {heads: entropy}}
  - {name: lora, base: baseline, method: lora, options: {rank: 8}}
adapt_data: {seq_len: 256}      # defaults of every adapter's data section (source: the pretraining data's)
adapt_train: {max_steps: 60, lr: 1.0e-3}
eval:
  suites: [ppl, niah, alloc, outliers]
  options: {samples: 5, tokens: 2048}
```

Every section mirrors an existing config: ``data``/``train`` are :class:`~diffattn.train.DataConfig` /
:class:`~diffattn.train.TrainConfig` fields, a model's ``model`` mapping adds :class:`~diffattn.train.ModelConfig`
fields (``lambda_init``, ``backend``, …), ``adapt_data``/``adapt_train`` and an adapter's ``data``/``train`` are the
sections of ``diffattn adapt``'s run.yaml, ``eval.options`` are :class:`~diffattn.eval.suite.SuiteOptions` fields.
``seeds`` on a from-scratch model trains one replicate per seed (named ``NAME-sSEED``, each with ``train.seed`` set;
the replicates keep ``NAME`` as their ``group``), so that claims can report the spread over seeds.
``--set a.b=value`` overrides any of it (``--set train.max_steps=10``, ``--set models.1.preset=small``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..config import YamlConfig, check_keys, from_dict

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ScratchModel:
    name: str
    preset: str = "tiny"
    attention: str = "standard"  # standard | diff | diff-v2
    model: dict = field(default_factory=dict)  # further ModelConfig fields (lambda_init, norm, backend, overrides)
    train: dict = field(default_factory=dict)  # per-model TrainConfig overrides
    seeds: list[int] | None = None  # one replicate per seed, expanded at load time into NAME-sSEED models
    group: str | None = None  # the name the replicates of one model share (set by the expansion)

    @property
    def group_name(self) -> str:
        return self.group or self.name


@dataclass
class PretrainedModel:
    name: str
    path: str  # a known offline name (smollm2-135m) or a local Hugging Face folder; evaluated as it is


@dataclass
class AdapterRun:
    name: str
    base: str  # a model of this experiment (from scratch or `pretrained`) by name, a known name, or an HF folder
    method: str
    options: dict = field(default_factory=dict)
    merge: bool = False
    data: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)


@dataclass
class EvalPlan:
    suites: list[str] = field(default_factory=lambda: ["ppl", "niah", "alloc", "outliers"])
    options: dict = field(default_factory=dict)
    models: list[str] | None = None  # default: every model and adapter


@dataclass
class ExperimentConfig(YamlConfig):
    name: str
    data: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    models: list[ScratchModel] = field(default_factory=list)
    pretrained: list[PretrainedModel] = field(default_factory=list)  # evaluated as they are; adapter bases
    adapters: list[AdapterRun] = field(default_factory=list)
    adapt_data: dict = field(default_factory=dict)
    adapt_train: dict = field(default_factory=dict)
    eval: EvalPlan = field(default_factory=EvalPlan)
    seed: int = 0
    # the file it was read from (not a setting: never saved); identifies the experiment in its folder's marker
    source: ClassVar[str | None] = None

    # -- reading, writing, overriding -------------------------------------------------------------------------
    WHAT = "experiment file"

    @classmethod
    def from_dict(cls, d: dict) -> ExperimentConfig:
        if not isinstance(d, dict):
            raise ValueError(f"an experiment must be a mapping, got {type(d).__name__}")
        if "name" not in d and not (set(d) - {f.name for f in dataclasses.fields(cls)}):
            raise ValueError("the experiment needs a name (it names the folder runs/NAME)")
        config = from_dict(cls, {**d, "eval": d.get("eval") or {}})
        config.models = [r for m in config.models for r in _replicates(m)]
        return config.validate()

    @classmethod
    def load(cls, path: str | Path) -> ExperimentConfig:
        config = super().load(path)
        config.source = str(Path(path).resolve())
        return config

    def with_overrides(self, overrides: dict[str, object]) -> ExperimentConfig:
        """Dotted overrides; list items by index: ``models.0.preset``, ``adapters.1.options.rank``."""
        config = super().with_overrides(overrides)
        config.source = self.source
        return config

    # -- checks -----------------------------------------------------------------------------------------------
    def validate(self) -> ExperimentConfig:
        from ..adapters.registry import method_names
        from ..eval.suite import parse_suites
        from ..models.architectures import ARCHITECTURES

        if not NAME.match(self.name):
            raise ValueError(f"experiment name {self.name!r} must be letters, digits, '-', '_' or '.'")
        names = self.model_names()
        for n in names:
            if not NAME.match(n):
                raise ValueError(f"model name {n!r} must be letters, digits, '-', '_' or '.'")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        for m in self.models:
            if m.attention not in ARCHITECTURES:
                raise ValueError(
                    f"models[{m.name}].attention must be one of {', '.join(ARCHITECTURES)}, got {m.attention!r}"
                )
        for a in self.adapters:
            if a.method not in method_names():
                raise ValueError(
                    f"adapters[{a.name}].method must be one of {', '.join(method_names())}; got {a.method!r}"
                )
            if a.base in [x.name for x in self.adapters]:
                raise ValueError(f"adapters[{a.name}].base {a.base!r} is an adapter; adapt a base model instead")
            known = self.scratch_names() + [p.name for p in self.pretrained]
            replicas = self.seed_groups().get(a.base, [])
            if a.base not in known and len(replicas) > 1:
                raise ValueError(
                    f"adapters[{a.name}].base {a.base!r} has one model per seed; name one of {', '.join(replicas)}"
                )
            if a.base not in known and not _is_model(a.base):
                ours = ", ".join(known) or "none"
                raise ValueError(
                    f"adapters[{a.name}].base {a.base!r} is not a model of this experiment ({ours}), "
                    "a known pretrained name or a Hugging Face folder"
                )
        for p in self.pretrained:
            if not _is_model(p.path):
                raise ValueError(f"pretrained[{p.name}].path {p.path!r} is neither a known name nor a model folder")
        suites = parse_suites(self.eval.suites)
        from ..eval.suite import SuiteOptions

        check_keys(self.eval.options, SuiteOptions, "eval.options")
        SuiteOptions(**{"seed": self.seed, **self.eval.options}).validate(suites, style="experiment")
        if self.eval.models is not None:
            unknown = sorted(set(self.eval.models) - set(names))
            if unknown:
                raise ValueError(f"eval.models names unknown model(s) {', '.join(unknown)}; known: {', '.join(names)}")
        return self

    def seed_groups(self) -> dict[str, list[str]]:
        """From-scratch models by replicate group (a model without ``seeds`` is a group of one), in order."""
        groups: dict[str, list[str]] = {}
        for m in self.models:
            groups.setdefault(m.group_name, []).append(m.name)
        return groups

    def scratch_names(self) -> list[str]:
        return [m.name for m in self.models]

    def model_names(self) -> list[str]:
        """Every model the experiment trains or evaluates, in order: from scratch, pretrained, adapters."""
        return [m.name for m in self.models] + [p.name for p in self.pretrained] + [a.name for a in self.adapters]

    def adapter_data(self, a: AdapterRun | None = None) -> dict:
        """Adapter ``a``'s data section as it trains: the pretraining data's source, under the experiment's
        ``adapt_data``, under the entry's own ``data`` (the one home of that merge: the runner builds the run from it,
        the claims compare arms by it, the report describes it). ``None``: an entry without data of its own."""
        return {"source": self.data.get("source", "shakespeare"), **self.adapt_data, **(a.data if a else {})}

    def pretrained_path(self, name: str) -> str | None:
        return next((p.path for p in self.pretrained if p.name == name), None)


def _replicates(m: ScratchModel) -> list[ScratchModel]:
    """``m`` itself, or one model per seed of ``m.seeds`` (named NAME-sSEED, grouped under NAME)."""
    if m.seeds is None:
        return [m]
    seeds = m.seeds
    if (
        not isinstance(seeds, list)
        or not seeds
        or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(f"models[{m.name}].seeds must be a non-empty list of distinct ints, got {seeds!r}")
    if "seed" in m.train:
        raise ValueError(f"models[{m.name}]: give either seeds or train.seed, not both")
    return [
        dataclasses.replace(m, name=f"{m.name}-s{seed}", train={**m.train, "seed": seed}, seeds=None, group=m.name)
        for seed in seeds
    ]


def _is_model(name_or_path: str) -> bool:
    from ..models.pretrained import PRETRAINED

    return name_or_path in PRETRAINED or (Path(name_or_path) / "config.json").is_file()
