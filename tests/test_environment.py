"""The environment record (diffattn.environment): what a training run and a report say they ran on, and the report's
line on where its models were trained."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from diffattn.environment import REPRODUCING, environment, package_version, processor
from diffattn.experiments.report import _training_environments


def test_the_record_names_the_processor_and_the_kernels_instruction_set():
    env = environment()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu"] == processor()
    assert env["threads"] == torch.get_num_threads() and set(REPRODUCING) - {"gpu"} <= set(env)


def test_package_versions_come_from_the_installed_metadata_without_an_import():
    import transformers

    assert environment()["transformers"] == package_version("transformers") == transformers.__version__
    assert package_version("diffattn-no-such-package") == "not installed"


def test_the_report_lists_training_environments_only_where_they_differ_from_the_evaluations():
    here = environment()
    other = {**here, "cpu": "Another CPU (cpu family 25, model 1)", "cpu_capability": "AVX2"}

    def part(name, env, kind="pretrain"):
        return SimpleNamespace(name=name, kind=kind, summary={"environment": env} if env else {})

    assert _training_environments([part("a", None), part("e", here, kind="eval")], here) == []  # nothing recorded
    assert _training_environments([part("a", here), part("b", here, kind="adapt")], here)[-1] == (
        "Trained in the same environment."
    )
    lines = _training_environments([part("a", here), part("b", other)], here)
    assert lines[1] == "Trained in:" and lines[2].startswith("- a: ") and "cpu_capability AVX2" in lines[3]
    assert len(_training_environments([part("b", other)], here)) == 3  # one environment, not the evaluation's
