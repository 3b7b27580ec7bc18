"""Fused Triton kernels for two-map (differential) attention, forward and backward (DIFF Transformer Eq. 1,
docs/methods.md §0), the ``triton`` backend of :func:`diffattn.ops.diff_attention`:

    out = softmax(Q1 K1ᵀ·s + M) V − λ · softmax(Q2 K2ᵀ·s + M) V

One file a path, each readable alone:

* :mod:`.forward` — both maps in one pass over the keys, two online softmaxes against the same V tile.
* :mod:`.forward_tma`, :mod:`.backward_tma` — the same forward and two-kernel backward with every tile loaded
  through a TMA descriptor (the dK/dV kernel optionally warp-specialised), for DIFF V1's and V2's heads without a mask
  (issue 37's candidates, off until a GPU times them).
* :mod:`.backward` — the row statistics, then the single-pass backward with atomic dQ (FlashAttention-2's scheme)
  or the deterministic two-kernel one.
* :mod:`.decode` — flash-decoding: a forward without gradient split over keys, and the kernel that merges the splits.
* :mod:`.epilogue` — the SDPA routes' last step, O1 − λ·O2 in float32, as one kernel each way (routes
  ``<route>+epilogue``), with DIFF V1's head norm in the same kernel where switched on, and after ``sdpa_split``'s two
  calls on their outputs unjoined.
* :mod:`.reparam` — DIFF V1's λ (Eq. 2) from its four vectors, one kernel each way, where switched on.
* :mod:`.vcopies` — DIFF V1's values twice over, [V; V], for the one-call SDPA routes, and V's gradient from the
  copies', one kernel each way, where switched on.
* :mod:`.tile_ops` — the ``@triton.jit`` steps those kernels share (loads, the user mask on both maps' scores).
* :mod:`.tuning` — which tiles, backward and key splits a launch gets, and the settings that override them.
* :mod:`.layout` — how tensors reach the kernels: strides, masks, offsets kept within 32 bits, V in two halves.
* :mod:`.launch` — the entry point :func:`~.launch.diff_attention_triton`, the custom ops and their autograd formula.
* :mod:`.eager` — each custom op's twin for eager training (its forward and backward without the op's dispatch), and
  the rule by which an entry point runs the op, the twin or the forward alone.

The plain PyTorch statement of the same computation is :mod:`diffattn.ops.reference`; the tests hold the kernels to
it within the rounding of plain PyTorch in the same dtype.

Precision: dot products take the input dtype (fp16/bf16) with float32 accumulation, probabilities are rounded to the
input dtype before the P·V and dS·K products (as FlashAttention does); softmax statistics, λ and the subtraction are
float32. Float32 inputs use IEEE fp32 dots (not TF32), so the fp32 path matches ``reference``. Head dims up to 128
(V up to 256) of any size are padded to a power of two >= 16 inside the kernels and lengths need not be multiples of
a tile, so tiny test shapes work.

On CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set *before* this package is first
imported, because ``triton.jit`` picks compiled or interpreted at decoration time): that is how the tests check them
without a GPU. The interpreter mis-multiplies bfloat16 (it feeds the raw 16-bit patterns to numpy's matmul), so under
the interpreter bfloat16 dot operands are widened to float32 after the same rounding (``UPCAST``) — numerically what
a GPU's bf16 MMA with fp32 accumulation computes.
"""
