"""Does PyTorch's cuDNN attention read a second gradient by the first one's strides? A diagnostic for the GPU script.

Why: ``run_cudnn_SDP_bprop`` (aten/src/ATen/native/cudnn/MHA.cpp) caches its backward graph under Q, K and V alone,
while the graph is built with the output gradient's strides baked in; so, as read, a second backward with the same
Q, K, V and the gradient laid out otherwise reuses the first graph and reads the gradient wrongly. diffattn's SDPA
routes guard against it (``diffattn.ops.sdpa._GradInOutputLayout``); this script asks the bare PyTorch call, so that
the guard's reason is measured, not only read. It prints one line per case and exits 0 either way (a diagnostic, not
a test: tests/ops/test_sdpa_grad_layout.py checks the library).

Usage (a CUDA machine, a fresh process: the cache is per process and thread): python benchmarks/cudnn_grad_layout.py
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def gradients(q, k, v, cotangent, backend):
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad(out, (q, k, v), cotangent)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> int:
    if not torch.cuda.is_available():
        print("cudnn grad layout: needs a CUDA device", file=sys.stderr)
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, t, d = 2, 3, 333, 64
    # transformers' heads: [B, T, H, d] memory seen as [B, H, T, d]; cuDNN lays the output out like Q
    q, k, v = (torch.randn(b, t, h, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    contiguous = torch.randn(b, h, t, d, device="cuda", generator=g, dtype=torch.bfloat16)
    like_output = contiguous.transpose(1, 2).contiguous().transpose(1, 2)  # same values, [B, T, H, d] order
    reference = gradients(q, k, v, contiguous, SDPBackend.MATH)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    # the first call builds the cached graph (with the contiguous gradient's strides); the second has the same Q, K,
    # V and the gradient laid out like the output; the third is the first again
    errors = []
    for label, cotangent in (("contiguous", contiguous), ("output's layout", like_output), ("contiguous", contiguous)):
        grads = gradients(q, k, v, cotangent, SDPBackend.CUDNN_ATTENTION)
        errors.append(max(rel(x, r) for x, r in zip(grads, reference, strict=True)))
        print(
            f"call {len(errors)}, gradient {label}: worst relative gradient error against the math backend "
            f"{errors[-1]:.2e}"
        )
    wrong = errors[1] > 10 * errors[0] + 1e-2
    print("cuDNN backward graph " + ("REUSED WITH THE FIRST GRADIENT'S STRIDES: the guard is needed" if wrong
                                     else "read the second gradient by its own strides"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
