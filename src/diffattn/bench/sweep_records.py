"""What a route sweep's record says, read by the sweep itself (:mod:`diffattn.bench.route_sweep`) and by the issues'
targets (:mod:`diffattn.bench.targets`), which the sweep in turn reads to order its work (a module of its own, so that
neither imports the other's whole module: test_import_layers)."""

from __future__ import annotations

#: routes the sweep times beside the table's, never chosen: transformers' DiffLlama and the official DIFF code
COMPARISON_ROUTES = ("hf_two_calls", "official_four_calls")

#: the inputs a record was timed on, kept in it (``inputs``): "model" — laid out and cut as the models hand them to
#: the op, the gradient back in their order (:func:`~diffattn.bench.route_sweep.make_problem`, since 2026-11-28).
#: Records without it were timed on separate contiguous tensors (the leases of 2026-11-26/27): a sweep times them
#: again as missing, and issue targets are read from records of these inputs where a class has any
#: (:mod:`diffattn.bench.targets`). A class's order ranks an older record by its best case among current ones
#: (:data:`EARLIER_EXCESS`, :func:`~diffattn.bench.route_sweep.order_key`)
INPUTS = "model"

#: how a record's times were sampled, kept in it (``sampling``): at least four calls back to back between two
#: synchronisations (:func:`~diffattn.bench.route_sweep.interleaved_ms`, since the H200 lease of 2026-11-28, which
#: timed one call a sample at the standard size and so the host's lead-in to each call with it, 0.17–1.0 ms). Records
#: without it are older: a sweep times them again as missing, and targets prefer records with it, like :data:`INPUTS`.
#: A current record reads lower than an older one of the same route (by the host's lead-in, up to about
#: :data:`EARLIER_EXCESS` at 16K tokens), so a class's order ranks an older record by its ratio less that excess — its
#: best case — among current ones (:func:`~diffattn.bench.route_sweep.order_key`); the first round times every table
#: route of the target classes (:func:`~diffattn.bench.route_sweep.first_round`)
SAMPLING = "4+ calls a sample"

#: how much lower, at most, a record timed today reads than an older one of the same route and class (its ratio to
#: the baseline): the host's lead-in that one call a sample held, about 0.2x at 16K tokens (the H200 lease of
#: 2026-11-28). Measured again on 2026-11-29, on the same H200 and software, the V1 d = 64 training class's routes timed
#: both ways read within 0.06x (`cudnn+epilogue` 1.84 then 1.82, `cudnn` 2.05 then 2.08, `sdpa` 2.22 then 2.28): the
#: bound is generous, so an older record is never ranked behind a current one it may beat
EARLIER_EXCESS = 0.2

#: what a current record carries: the inputs and the sampling it was timed with
CURRENT = {"inputs": INPUTS, "sampling": SAMPLING}


def is_current(record: dict) -> bool:
    """Whether a record was timed on the models' inputs (:data:`INPUTS`) with today's sampling (:data:`SAMPLING`)."""
    return all(record.get(k) == v for k, v in CURRENT.items())


def graph_ratio(r: dict) -> float | None:
    """A decoding record's time replayed from a CUDA graph over the baseline's, where both were measured."""
    if r.get("graph_ms") and r.get("base_graph_ms"):
        return r["graph_ms"] / r["base_graph_ms"]
    return None
