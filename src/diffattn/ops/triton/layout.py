"""How the host hands tensors to the fused kernel (DIFF Transformer Eq. 1, docs/methods.md §0; masks by the
rule of docs/methods.md §0.2): the strides it reads them through, masks in the form the kernels read, the
offsets they compute in 32 bits kept in range, and V given as two halves of one tensor read in place.

Addresses: batch and head offsets, a block's rows and the rows of a 4-D mask are 64-bit in the kernels (a tensor
may hold more than 2³¹ elements); offsets within one head and row indices of [B, H, T] are 32-bit, kept in range
here (:func:`_kernel_layout`, :func:`_check_offsets`).

Masks: the mask from :func:`~diffattn.ops._inputs.validate` — 2-D key padding (stored as [B, 1, 1, S]) or any 4-D
bool/additive mask broadcastable to [B, H, T, S] — is read through its strides (0 on broadcast dims), never
expanded; a mask whose rows do not start at multiples of 16 elements is read from a copy with padded rows
(:func:`_mask_for_kernels`), and transformers' causal ∧ padding mask is read back as causal + key padding
(:func:`_causal_key_padding`), so the kernels skip the tiles above the diagonal. Both are decided inside the ops,
at run time, once per mask tensor.
"""

from __future__ import annotations

import torch

from .._inputs import LastMask, values_readable
from .tuning import _cdiv


def _strides4(x: torch.Tensor | None) -> tuple[int, int, int]:
    # (batch, head, sequence) strides; the last dim is contiguous (checked by the caller)
    return (0, 0, 0) if x is None else (x.stride(0), x.stride(1), x.stride(2))


def _mask_args(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, int, bool, tuple[int, int, int, int]]:
    """(tensor, MASK_KIND, MASK_ROWS, strides): kind 0 none, 1 bool (read as uint8), 2 additive. Broadcast dims
    get stride 0, so a [B, 1, 1, S] key-padding mask is read per key and a 4-D mask is never expanded."""
    if mask is None:
        return None, 0, False, (0, 0, 0, 0)
    kind = 1 if mask.dtype == torch.bool else 2
    if kind == 1:
        mask = mask.view(torch.uint8)  # same bytes; Triton loads uint8 more portably than i1
    strides = tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(4))
    rows = mask.shape[1] != 1 or mask.shape[2] != 1
    return mask, kind, rows, strides


_ALIGNED_MASK = LastMask()  # the last unaligned mask and its aligned copy
_CAUSAL_PADDING = LastMask()  # the last [B, 1, T, S] bool mask and the key padding it reduced to, or None


# What the kernels compute in 32 bits (everything else is 64-bit: batch and head offsets, a block's packed rows,
# the rows of a 4-D mask): row indices of [B, H, T], offsets within one head of Q, K, V and of the outputs, and
# within a mask row plus a block of mask rows. The host keeps each below 2³¹ (a strided view whose head spans more
# is copied contiguous; what still does not fit is a clear error).
_INT32_LIMIT = 2**31
_MASK_ROW_BLOCK = 128  # the most query rows of one block a mask tile spans in 32 bits (BLOCK_M <= 128)


def _head_span(x: torch.Tensor) -> int:
    """Elements from the first of one [batch, head] slice of a 4-D tensor to its last, plus one."""
    return (x.shape[2] - 1) * x.stride(2) + (x.shape[3] - 1) * x.stride(3) + 1


def _mask_span(mask: torch.Tensor) -> int:
    """Elements a mask tile's 32-bit offsets span: one row of keys plus a block of query rows (MASK_ROWS)."""
    return (mask.shape[3] - 1) * mask.stride(3) + (min(mask.shape[2], _MASK_ROW_BLOCK) - 1) * mask.stride(2) + 1


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its last dimension dense (the element-wise kernels read rows with the last stride 1; their offsets
    are 64-bit, so no span to keep in range as :func:`_kernel_layout` does): itself, or a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernels read it: a contiguous last dim, and one head's span within 32-bit offsets (a strided
    view over more than 2³¹ elements per head, e.g. [B, S, H, d] transposed at millions of tokens, is copied)."""
    return x if x.stride(-1) == 1 and _head_span(x) < _INT32_LIMIT else x.contiguous()


def _mask_aligned(mask: torch.Tensor) -> bool:
    """Whether the kernels can read ``mask`` as it is: keys contiguous, every other stride (of a dim not broadcast)
    and the start a multiple of 16 elements, and its tiles within 32-bit offsets."""
    strides_ok = all(mask.stride(i) % 16 == 0 for i in range(3) if mask.shape[i] != 1)
    keys_ok = mask.shape[3] == 1 or mask.stride(3) == 1
    return strides_ok and keys_ok and mask.storage_offset() % 16 == 0 and _mask_span(mask) < _INT32_LIMIT


def _mask_for_kernels(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` as the kernels read it. A mask whose rows do not start at multiples of 16 elements (S not a multiple
    of 16, as transformers builds them for any other length) is copied into rows padded to a multiple of 16 (a view
    of the first S columns): Triton cannot vectorise its loads otherwise, and on sm_90 the forward then spilled
    hundreds of bytes (benchmarks/RESULTS.md). Called inside the ops at run time, like :func:`_causal_key_padding`;
    the layers of a model, forward and backward, share one copy (:class:`~diffattn.ops._inputs.LastMask`)."""
    if mask is None or _mask_aligned(mask):
        return mask
    return _ALIGNED_MASK.get(mask, _aligned_copy)


def _aligned_copy(mask: torch.Tensor) -> torch.Tensor:
    s = mask.shape[3]
    copy = torch.empty(*mask.shape[:3], _cdiv(s, 16) * 16, dtype=mask.dtype, device=mask.device)[..., :s]
    copy.copy_(mask)
    return copy


def _check_offsets(q1, k1, q2, k2, v, mask, b, h, t, s, d, dv) -> None:
    """ValueError where an offset the kernels compute in 32 bits would overflow (see :data:`_INT32_LIMIT`)."""
    problems = []
    if b * h * t >= _INT32_LIMIT:
        problems.append(f"B·H·T = {b * h * t} query rows (the kernels index rows in 32 bits)")
    if max(t, s) * max(d, dv) >= _INT32_LIMIT:
        problems.append(f"sequence {max(t, s)} × head width {max(d, dv)} elements in one head")
    for name, x in (("q1", q1), ("k1", k1), ("q2", q2), ("k2", k2), ("v", v)):
        if x is not None and _head_span(x) >= _INT32_LIMIT:
            problems.append(f"{name} spans {_head_span(x)} elements in one head")
    if mask is not None and _mask_span(mask) >= _INT32_LIMIT:
        problems.append(f"the mask's tiles span {_mask_span(mask)} elements")
    if problems:
        raise ValueError(
            f"diffattn triton: {'; '.join(problems)}: beyond 2³¹ − 1, the kernels' 32-bit offsets within a head; "
            "use the chunked backend or split the batch"
        )


def _causal_key_padding(mask: torch.Tensor | None, t: int, s: int) -> torch.Tensor | None:
    """A [B, 1, T, S] bool mask that is exactly bottom-right causality ∧ key padding — what transformers builds for
    a padded batch (its SDPA path has no other way to say "causal and padded") — as its [B, 1, 1, S] key-padding
    row, so the kernels run causal and skip the tiles above the diagonal; None for any other mask.

    Called inside the forward and backward ops, at run time: a traced graph (torch.compile) cannot branch on the
    comparison. It costs one comparison per mask, not per layer (:class:`~diffattn.ops._inputs.LastMask`)."""
    if mask is None or mask.dtype != torch.bool or mask.shape[1] != 1 or mask.shape[2] != t or t == 1:
        return None
    if not values_readable():  # (under a CUDA graph's capture: the kernels read the whole mask, the same numbers)
        return None
    return _CAUSAL_PADDING.get(mask, lambda mask: _as_causal_padding(mask, t, s))


def _as_causal_padding(mask: torch.Tensor, t: int, s: int) -> torch.Tensor | None:
    padding = mask[:, :, -1:, :]  # the last query sees every key that the padding lets through
    causal = torch.ones(t, s, dtype=torch.bool, device=mask.device).tril(s - t)
    return padding.clone() if torch.equal(mask, causal & padding) else None  # a copy: not holding the mask


def _in_place_halves(parts: tuple[torch.Tensor, ...]) -> int:
    """For V given as two halves (va, vb): the element offset from va to vb when the kernel can read both in
    place (equal shapes and strides, contiguous last dim, one storage, vb after va), else 0 (concatenate)."""
    if len(parts) != 2:
        return 0
    va, vb = parts
    if va.shape != vb.shape or va.stride() != vb.stride() or va.stride(-1) != 1:
        return 0
    if va.untyped_storage().data_ptr() != vb.untyped_storage().data_ptr():
        return 0
    offset = vb.storage_offset() - va.storage_offset()
    # the kernel adds the offset to the second half within a head's 32-bit offsets
    return offset if offset > 0 and offset + _head_span(va) < _INT32_LIMIT else 0
