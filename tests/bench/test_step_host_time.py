"""benchmarks/step_host_time.py, the host's share of a training step on the CPU (the proxy of RESULTS.md's prediction
for the host-bound `small` step): it runs, prints every column, and counts what the prediction reads off it — the
head norm in the epilogue's kernel and λ's kernels each take ATen kernels out of a step and add Triton launches, and
the one-node route launches what the chain does; every layer's λ at once takes out what each layer's own launched.
Speed here means nothing (one round, one layer)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_host_time.py"


def _rows(argv: list[str]) -> dict[str, tuple[int, int]]:
    """The script's table run with ``argv``: each column's (ATen kernels, Triton launches) a step."""
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {}
    for line in done.stdout.splitlines():
        match = re.match(r"(\S+(?: \S+)*?)\s+[\d.]+\s+-?[\d.]+\s+[\d.]+\s+\[[\d.]+, [\d.]+\]\s+(\d+)\s+(\d+)$", line)
        if match:
            rows[match[1]] = (int(match[2]), int(match[3]))
    return rows


def test_the_proxy_runs_and_counts_each_fusions_kernels():
    rows = _rows(["--rounds", "2", "--layers", "2", "--tokens", "8"])
    columns = {
        "baseline",
        "DiffLlama",
        "DIFF cudnn",
        "DIFF cudnn+epilogue",
        "DIFF cudnn+epilogue+norm",
        "DIFF cudnn+epilogue+norm+lambda",
        "DIFF cudnn_direct+norm",
        "DIFF cudnn_direct+norm, λ per layer",
        "DIFF cudnn_shared_v+norm+pairs",
        "DIFF, op one dispatch",
        "DIFF V2 sdpa_maps",
        "DIFF V2 sdpa+epilogue",
        "DIFF V2 cudnn_direct",
    }
    assert set(rows) == columns, sorted(rows)
    epilogue, norm, lam = (rows[f"DIFF cudnn+epilogue{s}"] for s in ("", "+norm", "+norm+lambda"))
    layers = 2
    assert rows["baseline"][1] == rows["DIFF cudnn"][1] == 0
    assert epilogue[1] == norm[1] == 2 * layers, "the epilogue's forward and backward launch a layer"
    assert lam[1] == norm[1] + 2 * layers, "and λ's two kernels"
    assert norm[0] < epilogue[0] and lam[0] < norm[0], "each fusion takes ATen kernels out of the step"
    # the same kernels as one autograd node: the epilogue's launches and the chain's ATen kernels ([V; V]'s copy; the
    # attention call's stand-ins only allocate, which is not counted) — but its gradient's two copies summed straight
    # into V's halves, one kernel a layer where autograd's chain has a sum and a copy back to the halves
    assert rows["DIFF cudnn_direct+norm"] == (norm[0] - layers, norm[1])
    # each layer's own λ (its chain forward and backward a layer) against every layer's at once (one chain, stacked)
    per_layer = rows["DIFF cudnn_direct+norm, λ per layer"]
    assert per_layer[1] == norm[1] and per_layer[0] > norm[0]
    # the heads in pairs and V read once: per layer no [V; V] copy, sum of its gradient or copy back to V's halves (3
    # fewer), and the three projections' weight rows reordered, a copy each way (6 more); the same launches
    shared = rows["DIFF cudnn_shared_v+norm+pairs"]
    assert shared == (norm[0] + 3 * layers, norm[1])
    # the op as one dispatch: none of the op's own kernels (the [V; V] copy, its gradient's sum and copy back, the
    # epilogue's launches), the layer's λ forward still there
    one = rows["DIFF, op one dispatch"]
    assert one[1] == 0 and rows["baseline"][0] < one[0] < norm[0]
    # DIFF V2 by one node (K and V read once): what its chain through SDPA and the epilogue launches, no more; by two
    # SDPA calls a layer and PyTorch's subtraction, no Triton launch and more ATen kernels
    v2_maps, v2_epilogue, v2_direct = (rows[f"DIFF V2 {r}"] for r in ("sdpa_maps", "sdpa+epilogue", "cudnn_direct"))
    assert v2_direct == v2_epilogue and v2_direct[1] == 2 * layers
    assert v2_maps[1] == 0 and v2_maps[0] > v2_direct[0]


@pytest.mark.heavy
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_the_decoding_proxy_runs_against_either_cache_and_a_plan_launches_what_the_whole_path_does(cache):
    layers, tokens = 2, 3
    argv = ["--decode", "--rounds", "2", "--layers", str(layers), "--tokens", str(tokens), "--cache", "8"]
    rows = _rows(argv + (["--dynamic"] if cache == "dynamic" else []))
    assert set(rows) == {
        "baseline", "DiffLlama", "DIFF sdpa_maps+epilogue+norm", "DIFF sdpa_maps+epilogue+norm, no plans",
        "DIFF sdpa_maps", "DIFF sdpa", "DIFF triton", "DIFF, op one dispatch", "DIFF V2 sdpa",
    }  # fmt: skip
    # route plans skip the op's host work, not its kernels: the same ATen kernels and launches with them and without
    assert rows["DIFF sdpa_maps+epilogue+norm"] == rows["DIFF sdpa_maps+epilogue+norm, no plans"]
    assert rows["DIFF sdpa_maps+epilogue+norm"][1] == layers * tokens, "the epilogue's kernel once a layer a token"
    # the op as one dispatch: a decoding DIFF layer's own work is the baseline's (λ computed once per decoding, its
    # ops not in a token: diffattn.models.diff_llama.layer_lambdas' memo)
    assert rows["DIFF, op one dispatch"] == rows["baseline"]
    assert rows["DIFF sdpa_maps"][1] == rows["DIFF sdpa"][1] == 0 < rows["DIFF triton"][1]


@pytest.mark.heavy
@pytest.mark.parametrize("decode", [False, True], ids=["train", "decode"])
def test_through_tritons_own_launcher_each_column_launches_what_the_stubs_counted(decode):
    """``--triton-launcher``: every launch through Triton's real launch path (compiled for sm_90, launched nowhere;
    diffattn.bench.triton_host), so the host's share includes Triton's launcher. The same ATen kernels and Triton
    launches a step as with the launches stubbed: the stubs stood for exactly these launches, the fused kernel's
    decoding among them. One more column, the epilogue's launches stubbed in its twin's step, launches the same."""
    argv = ["--rounds", "2", "--layers", "2", "--tokens", "3" if decode else "8"]
    argv += ["--decode", "--cache", "8"] if decode else []
    stubbed, launched = _rows(argv), _rows([*argv, "--triton-launcher"])
    twin = "DIFF sdpa_maps+epilogue+norm" if decode else "DIFF cudnn_direct+norm"
    assert launched.pop(f"{twin}, launches stubbed") == launched[twin] == stubbed[twin]
    assert launched == stubbed
    assert sum(triton for _, triton in launched.values()) > 0
