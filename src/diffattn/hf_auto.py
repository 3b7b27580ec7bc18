"""Registration of diffattn's own model types with transformers' Auto classes (``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM``): DIFF V2 (``diffattn_v2``, :mod:`diffattn.models.diff_v2`) and DIFF models whose options
plain DiffLlama does not compute (``diffattn_diff``, :mod:`diffattn.models.diff_model`); and of our fused two-map
op as an attention implementation (``attn_implementation="diffattn"``, :mod:`diffattn.models.attention_interface`).

After ``import diffattn``, ``AutoModelForCausalLM.from_pretrained(checkpoint)`` must work whatever was imported
first, yet ``import diffattn`` must not load torch and transformers (the ``diffattn`` command starts in a fraction
of a second) and must never break an import of transformers. So registration runs

* at once, if ``transformers`` is already imported when ``import diffattn`` runs;
* otherwise from an import hook (:class:`_AfterImport`), right after the top-level ``transformers`` package has
  executed. At that point no transformers module is half-imported (Python imports a submodule only after its
  package), so importing transformers' Llama modeling and ours is safe — unless transformers' first import came
  from inside one of our model modules (``import diffattn.models.diff_v2``, or ``diffattn.train``, first): that
  module has not defined its classes yet, so the registration runs right after it has executed. The Auto classes'
  own module,
  ``transformers.models.auto.modeling_auto``, is no such point: transformers first imports it from inside the
  class definitions of its model modules (``auto_docstring`` looks classes up in it), and importing more models
  there fails with a circular import;
* whenever a model is built or loaded (``build_model``, ``load_pretrained``): a model built before any Auto class
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
#: the model modules the registration imports (diffattn.models.auto): where transformers' first import comes from
#: inside one of them (``import diffattn.models.diff_v2`` or ``diffattn.train`` first), that module is half-imported
#: when transformers has executed, so the registration waits until it has executed too
_MODEL_MODULES = frozenset(f"diffattn.models.{m}" for m in ("diff_llama", "diff_model", "diff_v2", "install"))
_pending = False  # transformers has executed while a model module was half-imported: registered after the last one


def _half_imported(besides: str | None = None) -> list[str]:
    """Those of :data:`_MODEL_MODULES` whose body is running (the import system marks their spec meanwhile), but
    ``besides`` (one that has just executed, still marked until its import returns)."""
    modules = (sys.modules.get(name) for name in _MODEL_MODULES if name != besides)
    return [m.__name__ for m in modules if m is not None and getattr(m.__spec__, "_initializing", False)]


def _register_quietly(besides: str | None = None) -> None:
    global _pending
    _pending = bool(_half_imported(besides))  # then registered when the last of them has executed (_AfterImport)
    if _pending:
        return
    try:
        # deferred, one way: diffattn.models never imports this module
        from .models.auto import register_auto_classes

        register_auto_classes()
    except Exception as error:  # never break the user's import of transformers; building or loading retries
        logger.warning(
            "diffattn could not register its model types with transformers' Auto classes after transformers was "
            "imported (%s: %s); they are registered when a model is built or loaded",
            type(error).__name__,
            error,
        )


class _AfterImport:
    """Finds the top-level ``transformers`` package and diffattn's model modules with the normal finders, and
    registers after transformers executes, or after the model module that imported it has (a meta path finder by
    protocol: ``find_spec``; not an ``importlib.abc`` subclass, whose import alone took half of ``import diffattn``'s
    time, the window before the command line's Ctrl-C handler). Removed once the registration has run or failed."""

    finding = False  # the normal finders are finding a spec for us: stand aside

    def find_spec(self, fullname, path, target=None):
        if self.finding or (fullname != _TOP_LEVEL and fullname not in _MODEL_MODULES):
            return None
        self.finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.finding = False
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        loader_exec = loader.exec_module

        def exec_module(module):
            try:
                loader_exec(module)
            finally:
                del loader.exec_module  # the module's own loader again (this instance attribute shadowed it)
            if fullname == _TOP_LEVEL or _pending:
                _register_quietly(besides=fullname)
            if _TOP_LEVEL in sys.modules and not _pending and self in sys.meta_path:
                sys.meta_path.remove(self)  # the registration has run (or failed, and said so)

        loader.exec_module = exec_module
        return spec


def register_when_transformers_loads() -> None:
    """Register now if transformers is imported, else as soon as its top-level package has executed."""
    if _TOP_LEVEL in sys.modules:
        _register_quietly()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
