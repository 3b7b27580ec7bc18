"""Registration of the DIFF V2 model (:mod:`diffattn.models.diff_v2`) with transformers' Auto classes.

``import diffattn`` must make ``AutoModelForCausalLM.from_pretrained(v2_checkpoint)`` work, yet it must not load
torch and transformers (the ``diffattn`` command starts in a fraction of a second). So:

* if transformers' Auto classes are already imported, :func:`register_auto_classes` runs at once;
* otherwise a one-shot import hook (:class:`_AfterImport`) runs it right after Python executes
  ``transformers.models.auto.modeling_auto`` — the module every ``AutoModel*`` lookup goes through — so the
  classes are there before any checkpoint can be resolved.

Registration is idempotent. Without ``import diffattn`` transformers reports the unknown model type
``diffattn_v2`` (the name says which library it needs).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_AUTO_MODULE = "transformers.models.auto.modeling_auto"
_registered = False


def register_auto_classes() -> None:
    """Register the ``DiffTransformerV2`` config, model and causal-LM classes with transformers (once)."""
    global _registered
    if _registered:
        return
    _registered = True
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from .models.diff_v2 import (
        MODEL_TYPE,
        DiffTransformerV2Config,
        DiffTransformerV2ForCausalLM,
        DiffTransformerV2Model,
    )

    AutoConfig.register(MODEL_TYPE, DiffTransformerV2Config, exist_ok=True)
    AutoModel.register(DiffTransformerV2Config, DiffTransformerV2Model, exist_ok=True)
    AutoModelForCausalLM.register(DiffTransformerV2Config, DiffTransformerV2ForCausalLM, exist_ok=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``transformers.models.auto.modeling_auto`` with the normal finders, then registers after it runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _AUTO_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; the normal finders do the finding
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            sys.modules[fullname] = module  # register_auto_classes imports it by name
            register_auto_classes()

        spec.loader.exec_module = exec_module
        return spec


def register_when_transformers_loads() -> None:
    """Register now if transformers' Auto classes are loaded, else as soon as they are."""
    if _AUTO_MODULE in sys.modules:
        register_auto_classes()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
