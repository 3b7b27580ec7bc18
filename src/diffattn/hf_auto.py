"""Registration of diffattn's own model types with transformers' Auto classes (``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM``): DIFF V2 (``diffattn_v2``, :mod:`diffattn.models.diff_v2`) and DIFF models whose options
plain DiffLlama does not compute (``diffattn_diff``, :mod:`diffattn.models.diff_model`); and of our fused two-map
op as an attention implementation (``attn_implementation="diffattn"``, :mod:`diffattn.models.attention_interface`).

After ``import diffattn``, ``AutoModelForCausalLM.from_pretrained(checkpoint)`` must work whatever was imported
first, yet ``import diffattn`` must not load torch and transformers (the ``diffattn`` command starts in a fraction
of a second) and must never break an import of transformers. So registration runs

* at once, if ``transformers`` is already imported when ``import diffattn`` runs;
* otherwise from a one-shot import hook (:class:`_AfterImport`), right after the top-level ``transformers``
  package has executed. At that point no transformers module is half-imported (Python imports a submodule only
  after its package), so importing transformers' Llama modeling and ours is safe. The Auto classes' own module,
  ``transformers.models.auto.modeling_auto``, is no such point: transformers first imports it from inside the
  class definitions of its model modules (``auto_docstring`` looks classes up in it), and importing more models
  there fails with a circular import;
* whenever a name of :mod:`diffattn.models` other than the presets and the architecture table is first used, and
  whenever a model is built or loaded (``build_model``, ``load_pretrained``): a model built before any Auto class
  was imported, or a registration that failed in the hook.

The registration itself is :func:`diffattn.models.auto.register_auto_classes`; the card a checkpoint of our types
carries is :func:`diffattn.cards.save_readme`. This module is only the hook.

Registration is idempotent. A failure inside the hook is logged, never raised into the import of transformers.
Without ``import diffattn`` transformers refuses the unknown model types, whose names say which library they need,
and :func:`diffattn.cards.save_readme` leaves a card in the folder that says so.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

logger = logging.getLogger(__name__)

_TOP_LEVEL = "transformers"


def _register_quietly() -> None:
    try:
        # deferred, one way: diffattn.models never imports this module (it registers itself, models.auto)
        from .models.auto import register_auto_classes

        register_auto_classes()
    except Exception as error:  # never break the user's import of transformers; diffattn.models retries
        logger.warning(
            "diffattn could not register its model types with transformers' Auto classes after transformers was "
            "imported (%s: %s); they are registered when a model is built or loaded",
            type(error).__name__,
            error,
        )


class _AfterImport:
    """Finds the top-level ``transformers`` package with the normal finders, then registers after it executes (a
    meta path finder by protocol: ``find_spec``; not an ``importlib.abc`` subclass, whose import alone took half of
    ``import diffattn``'s time, the window before the command line's Ctrl-C handler)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TOP_LEVEL:
            return None
        sys.meta_path.remove(self)  # one shot; the normal finders do the finding
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        loader_exec = loader.exec_module

        def exec_module(module):
            try:
                loader_exec(module)
            finally:
                del loader.exec_module  # transformers' own loader again (this instance attribute shadowed it)
            _register_quietly()

        loader.exec_module = exec_module
        return spec


def register_when_transformers_loads() -> None:
    """Register now if transformers is imported, else as soon as its top-level package has executed."""
    if _TOP_LEVEL in sys.modules:
        _register_quietly()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
