"""The conformance checks (:mod:`tests.adapters.conformance`) on every method the registry holds, generated from it:
a new method's module gets them by registering itself, with no test to edit."""

from __future__ import annotations

import pytest

from diffattn.adapters import method_names

from ..tiny_models import CONFIGS
from . import conformance

METHODS = method_names("method")  # at collection: every method the package registers


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("method", METHODS)
def test_identity_at_init_where_claimed(method, model_type):
    conformance.check_identity_at_init(method, model_type)


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("method", METHODS)
def test_cached_decoding_equals_the_full_forward(method, model_type):
    conformance.check_cache(method, model_type)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("method", METHODS)
def test_save_then_load_into_a_fresh_base_gives_identical_logits(method, model_type, tmp_path):
    conformance.check_save_load(method, model_type, tmp_path / "adapter")


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("method", METHODS)
def test_merge_equals_unmerged_or_is_refused_saying_why(method, model_type):
    conformance.check_merge_or_refuse(method, model_type)
