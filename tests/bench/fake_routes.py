"""Routes for the route sweep's tests (diffattn.bench.route_sweep --extra-routes tests.bench.fake_routes): one that
kills its process the way an illegal memory access does on a GPU, on one class only, one that raises what a poisoned
CUDA context raises, one that is wrong, and one that hangs on training calls (a job that never ends)."""

import os
import time

from diffattn.bench.route_sweep import official_four_calls


def _dies_on_decode(p):
    if p.diff["q1"].shape[2] == 1:
        os.abort()  # the process dies without a word, as after a GPU fault
    return official_four_calls(p)


def _poisons_on_infer(p):
    if not p.diff["q1"].requires_grad and p.diff["q1"].shape[2] > 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return official_four_calls(p)


def _wrong(p):
    return official_four_calls(p) * 1.01


def _hangs_on_train(p):
    if p.diff["q1"].requires_grad:
        time.sleep(600)  # killed long before: by the job's timeout or the sweep's deadline
    return official_four_calls(p)


ROUTES = {"dies_on_decode": _dies_on_decode, "poisons_on_infer": _poisons_on_infer, "wrong": _wrong,
          "hangs_on_train": _hangs_on_train}  # fmt: skip
