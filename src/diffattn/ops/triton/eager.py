"""A custom op's twin for eager training, and the rule by which the kernels' entry points choose between the two.

The fused kernels (:mod:`.launch`) and the epilogue (:mod:`.epilogue`) are ``torch.library`` custom ops, each with its
backward registered as an autograd formula (``register_autograd``): what torch.compile needs, an op opaque to its
tracer with a fake implementation. In eager mode that dispatch is host time a host-bound training step pays per layer:
on this project's CPU the epilogue's custom op cost 308 µs a forward+backward through its autograd path, an autograd
Function running the same implementations 113 µs (benchmarks/RESULTS.md). So each op has a twin — the same forward,
the same context set-up and the same backward formula, calling the backward's implementation directly instead of its
custom op — and an entry point runs the op under torch.compile, the twin where a gradient is wanted, and the forward's
implementation alone otherwise (:func:`choose`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def eager_twin(
    name: str, forward: Callable, setup_context: Callable, backward: Callable, backward_impl: Callable
) -> type[torch.autograd.Function]:
    """An autograd Function named ``name`` that runs ``forward(*inputs)``, sets its context up by ``setup_context(ctx,
    inputs, output)`` and differentiates by ``backward(ctx, *grads, bwd=backward_impl)`` — the custom op's
    ``register_autograd`` pair, its backward's implementation in place of the backward's custom op. A tuple output is
    (result, what the backward reads): those extra outputs are marked non-differentiable, and a gradient nothing sent
    stays None rather than a zero-filled tensor. Differentiable once: the kernels' gradients carry no graph, so a second
    derivative (``create_graph=True``) is one clear error, not the gradients silently taken as constants."""

    def forward_(ctx, *inputs):
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        if isinstance(output, tuple):
            ctx.mark_non_differentiable(*output[1:])
            ctx.set_materialize_grads(False)
        return output

    @torch.autograd.function.once_differentiable
    def backward_(ctx, *grads):
        return backward(ctx, *grads, bwd=backward_impl)

    # made by autograd's metaclass under its own name, so that its graph nodes are "<name>Backward"
    namespace = {
        "forward": staticmethod(forward_),
        "backward": staticmethod(backward_),
        "__doc__": f"The eager-training twin of {forward.__module__}.{forward.__qualname__} (:func:`eager_twin`).",
        "__module__": forward.__module__,
    }
    return type(torch.autograd.Function)(name, (torch.autograd.Function,), namespace)


def choose(op: Callable | None, twin: type[torch.autograd.Function], impl: Callable, need_grad: bool) -> Callable:
    """What an entry point calls: the custom ``op`` under torch.compile (which must see it), else ``twin.apply`` where
    a gradient is wanted (``need_grad``: :func:`~diffattn.ops._inputs.wants_grad` of the differentiable inputs), else
    the forward's implementation ``impl`` alone. ``op`` None: the caller takes its own way under torch.compile."""
    if op is not None and torch.compiler.is_compiling():
        return op
    return twin.apply if need_grad else impl
