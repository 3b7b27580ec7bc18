#!/usr/bin/env bash
# One lent GPU's measurements in one call of at most ten minutes, most valuable first, each step bounded in time and
# run in processes of its own (a crash is one line, not the end). Writes into $OUT (default benchmarks/gpu-report):
#   routes.md, routes.jsonl, route_table.json  the route sweep (diffattn.bench.route_sweep) and the table it gives
#   train.json                                 the bf16 train step (small, seq 1024 and 4096) with that table
#   report/gpu-report.md, .json                decoding per token (benchmarks/gpu_report.py --sections decode)
#   log.txt                                    everything printed: versions, the train step, the sanitizer, tests
# Usage (from the checkout's root, on the GPU machine): bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-benchmarks/gpu-report}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
{
  echo "== $(date -u +%FT%TZ) versions"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'transformers', transformers.__version__)"
  echo "== route sweep ($(left) s left)"
  timeout $(( ${SWEEP_S:-300} + 20 )) $PY -m diffattn.bench.route_sweep --out "$OUT" --budget-s "${SWEEP_S:-300}" --warm-s "${WARM_S:-100}" > /dev/null
  echo "sweep exit $?"
  echo "== train step, bf16, small, with the sweep's table ($(left) s left)"
  DIFFATTN_ROUTE_TABLE="$OUT/route_table.json" timeout 100 $PY -m diffattn bench train-step --presets small \
    --seq-lens 1024,4096 --batch 4 --reps 5 --dtype bf16 --json "$OUT/train.json" 2>&1 | grep -v Warning
  echo "== train step, bf16, paper-830m at 2048 ($(left) s left)"
  DIFFATTN_ROUTE_TABLE="$OUT/route_table.json" timeout 60 $PY -m diffattn bench train-step --presets paper-830m \
    --seq-lens 2048 --batch 2 --reps 3 --dtype bf16 2>&1 | grep -v Warning
  echo "== decode per token with a static cache and CUDA graphs, every train-step model ($(left) s left)"
  DIFFATTN_ROUTE_TABLE="$OUT/route_table.json" timeout 120 $PY benchmarks/gpu_report.py --out "$OUT/report" \
    --sections decode 2>&1 | grep -v Warning | tail -12
  echo "== compute-sanitizer: the backward tile (16, 64, 4, 1) alone, one small call ($(left) s left)"
  timeout 60 compute-sanitizer --tool memcheck --print-limit 5 $PY - <<'PYEOF' 2>&1 | tail -40
import torch
from diffattn.bench import route_sweep as rs
rs.force_candidate("triton[dkdv_atomic 16x64 w4 s1]")
from diffattn.ops import diff_attention
g = torch.Generator().manual_seed(0)
def r(*s): return torch.randn(*s, generator=g).cuda().bfloat16().requires_grad_()
q1, q2, k1, k2, v = r(1, 2, 300, 64), r(1, 2, 300, 64), r(1, 2, 300, 64), r(1, 2, 300, 64), r(1, 2, 300, 128)
o = diff_attention(q1, k1, q2, k2, v, 0.5, backend="triton")
o.float().sum().backward()
torch.cuda.synchronize()
print("sanitized call finished")
PYEOF
  echo "== gpu tests, one process per file ($(left) s left)"
  for f in $(grep -l "mark.gpu" tests/*.py tests/*/*.py); do
    [ "$(left)" -gt 30 ] || { echo "skipped $f: time"; continue; }
    echo "-- $f"
    timeout $(( $(left) - 10 )) $PY -m pytest -q -m gpu -p no:cacheprovider "$f" 2>&1 | tail -8
  done
  echo "== done after $(( $(date +%s) - start )) s"
} 2>&1 | tee "$OUT/log.txt"
