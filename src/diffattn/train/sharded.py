"""Fully sharded data-parallel training (PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard``) of every model diffattn
builds: the baseline, DIFF V1 (docs/methods.md §1), DIFF V2 (§5) and each adapter method's model (§6).

* :func:`shard_model` — ``fully_shard`` on every decoder layer, then on the root, with an optional
  ``MixedPrecisionPolicy``. The λ parameters (:func:`lambda_parameters`: DIFF Eq. 2's λ_q/λ_k vectors, DIFF V2's
  gate ``lambda_proj``, an adapter's λ_learn, DiffLoRA's λ vectors and the V2 retrofit's gate) are left out of the
  sharding: every rank keeps them whole and in float32 (they are a few numbers, or one d_model × H gate, per layer),
  and a gradient hook averages their gradients over the ranks as the sharded parameters' reduce-scatter does. So a
  bf16 policy casts everything but λ: λ is computed from float32 parameters, and DIFF's subtraction
  ``A1·V − λ·A2·V`` runs in float32 inside the op whatever the maps' dtype (docs/methods.md §0.2). A module whose
  parameters are all λ (the gates) gets its floating-point inputs cast to float32, so it runs in float32 on bf16
  activations.
* :func:`save_sharded_checkpoint` / :func:`load_sharded_checkpoint` — model and optimizer state through
  ``torch.distributed.checkpoint`` (each rank writes its own shards; resuming continues the same trajectory).
* :func:`save_full_model` — the whole state dict gathered on rank 0 and written by ``save_pretrained``: a
  checkpoint plain transformers loads (a DIFF V2 one through the Auto classes ``import diffattn`` registers).

An optimizer over a sharded model holds both kinds of parameters (sharded DTensors and the λ replicas): build it
with ``foreach=False`` (PyTorch's grouped kernels refuse a list that mixes the two).

Run under ``torchrun --nproc_per_node N`` (or ``torch.multiprocessing.spawn``) after
``torch.distributed.init_process_group`` — ``gloo`` on CPU, ``nccl`` on GPUs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import PreTrainedModel

# parameter-name parts that mark a λ parameter besides "lambda" itself: the DIFF V2 retrofit's gate (its λ per token)
LAMBDA_MODULE_NAMES = ("diffv2_gate",)


def lambda_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters λ is computed from, by name: every parameter with ``lambda`` in a part of its name
    (``lambda_q1`` … ``lambda_k2``, ``lambda_proj.weight``, ``lambda_learn``, ``lambda_vectors``) or inside a module
    of :data:`LAMBDA_MODULE_NAMES`."""
    found = {}
    for name, param in model.named_parameters():
        parts = name.split(".")
        if any("lambda" in part for part in parts) or any(part in LAMBDA_MODULE_NAMES for part in parts):
            found[name] = param
    return found


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks: modules of the classes its ``_no_split_modules`` names (an adapter's or
    PEFT's wrapping leaves the blocks' classes as they were)."""
    block_classes: set[str] = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            block_classes |= set(module._no_split_modules or ())
    layers = [m for m in model.modules() if type(m).__name__ in block_classes]
    if not layers:
        raise ValueError(f"shard_model: no decoder layer found in {type(model).__name__} (by _no_split_modules)")
    return layers


def _average_gradient_over_ranks(param: torch.Tensor) -> None:
    # gloo has no AVG reduction; the sum of identical-shape gradients over ranks, divided by their number, is what
    # FSDP's reduce-scatter gives the sharded parameters. Repeated on every accumulated micro-batch it stays the
    # mean: the part already averaged is the same on every rank.
    dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
    param.grad.div_(dist.get_world_size())


def _inputs_to_float32(module: nn.Module, args: tuple, kwargs: dict):
    def cast(x):
        return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def shard_model(
    model: nn.Module,
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
    mesh=None,
) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over the default process group (or ``mesh``) and return it.

    Every decoder layer is one ``fully_shard`` group, the root (embeddings, final norm, LM head) another. The λ
    parameters stay whole float32 replicas on every rank (module doc). Every rank must hold the same initial
    weights (build with one seed, or load one checkpoint); the λ replicas are broadcast from rank 0 all the same."""
    if not dist.is_initialized():
        raise RuntimeError("shard_model needs torch.distributed initialised (run under torchrun)")
    policy = mp_policy or MixedPrecisionPolicy()
    lambdas = lambda_parameters(model)
    for param in lambdas.values():  # in name order: the same on every rank, as the broadcasts pair up
        if param.dtype != torch.float32:
            raise ValueError("shard_model: λ parameters must be float32 (build or load the model in float32)")
        dist.broadcast(param.data, src=0)
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(_average_gradient_over_ranks)
    if policy.param_dtype not in (None, torch.float32):
        lambda_names = set(lambdas)
        for name, module in model.named_modules():
            own = [f"{name}.{n}" if name else n for n, _ in module.named_parameters()]
            if own and all(n in lambda_names for n in own):
                module.register_forward_pre_hook(_inputs_to_float32, with_kwargs=True)
    options = dict(mp_policy=policy, reshard_after_forward=reshard_after_forward, ignored_params=set(lambdas.values()))
    if mesh is not None:
        options["mesh"] = mesh
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def save_sharded_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Model and optimizer state of a sharded model into the folder ``path`` (``torch.distributed.checkpoint``:
    every rank writes its shards; call on every rank)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path))


def load_sharded_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Load :func:`save_sharded_checkpoint`'s folder into a model sharded the same way and its optimizer (call on
    every rank, after :func:`shard_model` and building the optimizer)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def save_full_model(model: PreTrainedModel, out_dir: str | Path, **save_kwargs) -> None:
    """Gather the whole state dict on rank 0 and write it with ``save_pretrained`` into ``out_dir`` (call on every
    rank; only rank 0 writes): a checkpoint ``from_pretrained`` loads without any process group."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        model.save_pretrained(out_dir, state_dict=full, **save_kwargs)
    dist.barrier()
