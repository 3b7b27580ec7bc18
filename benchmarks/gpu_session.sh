#!/usr/bin/env bash
# One lent GPU's measurements in one call of at most ten minutes, most valuable first, each step bounded in time and
# run in processes of its own (a crash is one line, not the end); a step that no longer fits is skipped with a line.
# Writes into $OUT (default benchmarks/gpu-report), these files:
#   routes.md, routes.jsonl, route_table.json  the route sweep (diffattn.bench.route_sweep) and the table it gives
#   train.json                                 the bf16 train step (small, seq 1024 and 4096) with that table, and
#                                              each column's kernels in one profiled step (kernel_ms; log: a table)
#   train_host.json                            the same step at 1024 with DIFF's one-node route beside the default
#                                              columns, each column's host time in one more step (host_ms: by op,
#                                              autograd node, CUDA runtime call and Python function; log: the rows
#                                              beyond the baseline's, launches and host waits)
#   switches.txt                               the route table's kernel switches and the small class's first route
#                                              decided from that step (written into route_table.json's entry:
#                                              diffattn.bench.switches)
#   train_decided.json                         where that decided anything: the step again, default columns, with the
#                                              table as decided (what auto runs from then on; bench.targets reads it)
#   routes-1.md, routes-1.jsonl                where fused_v_copies went on: the first sweep's, set aside by a second
#                                              one of V1's one-call routes with it (routes.md, route_table.json)
#   kernels.json                               one V1 and one DIFF V2 call (d = 64, 16K tokens) and one V1 decoding
#                                              call: each route's kernels beside the baseline's and a stacked cuDNN
#                                              call's (bench.call_kernels)
#   train_graphed.json                         the same step with every column's whole step one CUDA graph
#                                              (diffattn.cuda_graphs: the GPU's work without the host's launches)
#   train_graphed_micro.json                   the same with forward and backward one graph, AdamW eager: what
#                                              `diffattn pretrain --cuda-graphs` runs
#   train_compiled.json                        the same step at 1024 compiled (inductor, reduce-overhead: forward and
#                                              backward replayed as CUDA graphs; diffattn pretrain --compile)
#   train_830m.json, train_830m_4k.json        the paper-830m step at 2048 (bf16, batch 2) and at 4096 (batch 1)
#   train_kernel.json                          the small step with the fused kernel forced (issue 37's step target)
#   report/gpu-report.md, .json                decoding per token (benchmarks/gpu_report.py --sections decode)
#   targets.md                                 issues 34's and 37's targets read off the files above (bench.targets)
#   tests/FILE.txt                             each gpu test file's whole pytest report (tracebacks of failures)
#   log.txt                                    everything printed: versions, each step, the sanitizer, the tests
# Usage (from the checkout's root, on the GPU machine): bash benchmarks/gpu_session.sh   (make gpu-report)
# Budgets (seconds, environment): BUDGET_S (all, 560), SWEEP_S (the sweep, 300), WARM_S (its compiling, 100),
# COMPILE_S (the compiled step, 150), DECODE_S (decoding, 150), TESTS_S (the gpu tests, 150), TEST_FILE_S (one
# test file's, 120: test_lambda_kernel.py did not finish in it on the H200 of 2026-11-29); TEST_FILES (the gpu
# tests of these comma-separated files alone, e.g. TEST_FILES=tests/ops/test_direct.py,tests/ops/test_triton.py).
# SWEEP_PLAN=kernel sweeps only the fused kernel and its tuning candidates and variants on the train classes (issue
# 37; the default plan, "all", times the route table's routes on every class first and rarely reaches them);
# SWEEP_PLAN=decode only its decoding forward on its default and candidate tiles and more key splits (seconds a job:
# for a lease's last minute or two, e.g. SWEEP_PLAN=decode STEPS=sweep BUDGET_S=100 SWEEP_S=70 WARM_S=20).
# SANITIZE=1 adds compute-sanitizer on the miscompiled backward tile (known since 2026-11-26; off by default).
# STEPS (comma-separated, in this order whatever the order given): sweep, layout, train, hostprof, kernels, graphed,
# graphedmicro, compiled, resweep, 830m, decode, kernelstep, sanitize, tests; default all but sanitize. A second call on the same lease runs what the first had no
# budget left for, e.g. STEPS=graphed,compiled,830m,tests, or SWEEP_PLAN=kernel STEPS=sweep for the fused kernel's candidates:
# a sweep into the same OUT extends the first call's entry (its measurements, switches and first routes kept) and sets
# the first call's routes.md and routes.jsonl aside as routes-1.md, routes-1.jsonl.
set -u
OUT=${OUT:-benchmarks/gpu-report}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$(date +%s)
left() { echo $(( ${BUDGET_S:-560} - ($(date +%s) - start) )); }
STEPS=${STEPS:-sweep,layout,train,hostprof,kernels,graphed,graphedmicro,compiled,resweep,830m,decode,kernelstep,tests}
[ "${SANITIZE:-0}" = 1 ] && STEPS="$STEPS,sanitize"
want() { [[ ",$STEPS," == *",$1,"* ]]; }  # want NAME: NAME is in STEPS
# step SECONDS TITLE COMMAND...: run COMMAND under a timeout of SECONDS if that still fits the budget
step() {
  local seconds=$1 title=$2
  shift 2
  if [ "$(left)" -lt "$seconds" ]; then
    echo "== $title: skipped, $(left) s left of the budget, it needs $seconds"
    return
  fi
  echo "== $title ($(left) s left)"
  if [ "$(type -t "$1")" = function ]; then  # timeout runs programs: a function of this script runs in a bash
    timeout "$seconds" bash -c "$(declare -f "$1"); PY=$PY; OUT=$OUT; $*"
  else
    timeout "$seconds" "$@"
  fi
  local rc=$?
  [ $rc -eq 0 ] || echo "(exit code $rc$([ $rc -eq 124 ] && echo ': timed out'))"
}
sanitize() {
  compute-sanitizer --tool memcheck --print-limit 3 $PY - <<'PYEOF' 2>&1 | grep -v "Host Frame" | head -40
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
}
grad_layout() {  # (functions run in a bash of their own: no variables of this script but PY)
  # whether bare cuDNN attention reads a second gradient by the first one's strides (a diagnostic of what was read in
  # PyTorch's source), and the library's check that its routes hand every backward one layout
  timeout 40 $PY benchmarks/cudnn_grad_layout.py 2>&1 | tail -6
  timeout 80 $PY -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_sdpa_grad_layout.py 2>&1 | tail -6
}
gpu_tests() {  # the ops' files first (the kernels against float64: issue 37's tests), then the rest, each file once;
  # TEST_FILES (comma-separated paths): those files alone, in that order (what changed since the last lease's run)
  local files
  if [ -n "${TEST_FILES:-}" ]; then
    files=$(echo "$TEST_FILES" | tr ',' ' ')
  else
    files=$(grep -l "mark.gpu" tests/ops/*.py tests/*.py tests/*/*.py | awk '!seen[$0]++' \
      | grep -v "^tests/ops/test_sdpa_grad_layout.py$")
  fi
  for f in $files; do
    echo "-- $f"
    # each file's whole report kept (tests/FILE.txt: every failure's traceback and message), its summary printed
    mkdir -p "$OUT/tests"
    timeout "${TEST_FILE_S:-120}" $PY -m pytest -q -rfE -m gpu -p no:cacheprovider "$f" \
      > "$OUT/tests/$(basename "$f" .py).txt" 2>&1
    grep -E "^(FAILED|ERROR) " "$OUT/tests/$(basename "$f" .py).txt" | tail -12
    tail -1 "$OUT/tests/$(basename "$f" .py).txt"  # pytest's count line (or where it was cut)
  done
}
{
  echo "== $(date -u +%FT%TZ) versions"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'transformers', transformers.__version__)"
  want sweep && step $(( ${SWEEP_S:-300} + 20 )) "route sweep" $PY -m diffattn.bench.route_sweep --out "$OUT" \
    --budget-s "${SWEEP_S:-300}" --warm-s "${WARM_S:-100}" --plan "${SWEEP_PLAN:-all}"
  # a correctness question before the timings: does cuDNN attention's cached backward read a gradient by another's
  # strides (diffattn.ops.sdpa's guard), and are the library's routes safe from it
  want layout && step 100 "gradient layout at cuDNN attention's backward" grad_layout
  # the steps below choose routes by this sweep's table where it wrote one, else by the shipped table
  [ -f "$OUT/route_table.json" ] && export DIFFATTN_ROUTE_TABLE="$OUT/route_table.json"
  # and routes forced beside auto where the step is host-bound (the table's were timed at 16K): `cudnn` (the small V1
  # class's choice), `cudnn+epilogue` (the 16K class's) and it with the head norm in its kernel (+norm), auto with the
  # norm and with λ's kernels too (+lambda) or each layer's λ by PyTorch's ops (+perlayer: what computing every
  # layer's λ at once saves, RESULTS.md, 2026-11-29, "Every layer's λ at once", predicts 2-5 ms at 1,024 tokens),
  # and cudnn+epilogue's kernels as one autograd node (cudnn_direct, with
  # and without the norm; RESULTS.md, 2026-11-29), and auto with DIFF V1's heads in interleaved pairs at every size
  # (+pairs: the layout where cudnn_shared_v reads V once, which the sweep's classes decide for calls above the small
  # size; RESULTS.md, 2026-11-29, "V read once"): benchmarks/RESULTS.md (2026-11-28: the host's share, and the
  # launches) has the predictions; the table switches either on, and moves a route first for the small class, only
  # from these numbers. 30 repetitions: the ten steps of 2026-11-28 spread 8-16 ms at 1,024 tokens, more than any
  # difference between the DIFF columns. -v logs the route auto runs for each call class, once each. DIFF V2's model
  # with its small class's first route forced and with cudnn_direct (its one node, K and V read once: RESULTS.md,
  # 2026-11-30), which switches.py compares for DIFF V2's small class — it needs a column of the first route as this
  # run's table orders that class: sdpa_maps in the shipped H200 entry, cudnn_direct if this run's sweep put it first
  want train && step 140 "train step, bf16, small, with the sweep's table" $PY -m diffattn -v bench train-step --presets small \
    --seq-lens 1024,4096 --batch 4 --reps 30 --dtype bf16 --json "$OUT/train.json" \
    --backends cudnn,cudnn+epilogue,cudnn+epilogue+norm,cudnn_direct,cudnn_direct+norm,auto+norm,auto+norm+lambda,auto+norm+perlayer,auto+pairs,v2:sdpa_maps,v2:cudnn_direct
  # where the host-bound step's host time goes, on this machine's own host (the CPU proxy, step_host_time.py, put
  # DIFF's cudnn_direct+norm under DiffLlama's host time, the H200 of 2026-11-29 over it: RESULTS.md, 2026-11-29,
  # "Where the host's time goes on the GPU's own machine", predicts what this finds), in a process of its own (a
  # profiler that crashed would take only this step's rows; each column's trace is written and read back: up to
  # several seconds a column)
  want hostprof && step 100 "train step, bf16, small at 1024, each column's host time profiled" $PY -m diffattn bench \
    train-step --presets small --seq-lens 1024 --batch 4 --reps 3 --dtype bf16 --host-profile \
    --backends cudnn_direct+norm --json "$OUT/train_host.json"
  # where a call's time goes beyond cuDNN's: V1 at d = 64 trains at 1.80x through cudnn+epilogue (GPU busy 1.67x)
  # where one stacked cuDNN call does 1.42x (issue 34's target 1.55x): each route's kernels per call, and that route
  # with [V; V] by its kernels (+vcopies; RESULTS.md, 2026-11-28, "[V; V] by one kernel", predicts 1.51-1.56x by GPU time)
  # The decoding class's columns also get a host profile each (an eager decoding call was host-bound, issue 37's
  # "what is in the time"), and the table's first decoding route where it is a candidate (after SWEEP_PLAN=decode)
  want kernels && step 75 "kernels of one call per route, V1 (stacked and in pairs) and DIFF V2 at d = 64, and V1 decoding" $PY -m diffattn.bench.call_kernels \
    --json "$OUT/kernels.json"
  # the table's kernel switches and the small class's first route from the step's columns and the kernels step's
  # (diffattn.bench.switches: on only where faster, by the paired repetitions' interval in the step and slower at no
  # length, or by GPU busy time per call beyond 2%), written into this run's entry, which the steps below then read;
  # where anything was decided, the step again with the table as decided (what auto runs from then on: the targets
  # read it)
  want train && [ -f "$OUT/train.json" ] && [ -f "$OUT/route_table.json" ] && \
    $PY -m diffattn.bench.switches "$OUT" --write | tee "$OUT/switches.txt"
  want train && grep -q -e ": on —" -e ": moved:" "$OUT/switches.txt" 2>/dev/null && \
    step 90 "train step, bf16, small, with the table as the step decided" $PY -m diffattn -v bench train-step \
    --presets small --seq-lens 1024,4096 --batch 4 --reps 30 --dtype bf16 --json "$OUT/train_decided.json"
  # the same step with every column's whole step captured once as one CUDA graph and replayed (diffattn.cuda_graphs;
  # RESULTS.md, 2026-11-29, "The whole step as one CUDA graph", predicts DIFF (auto) 1.12-1.20x the baseline and
  # below DiffLlama, where the eager step's 1.42x is host work): the step's GPU work without the host's launches,
  # with the table as decided above; bench.targets reads it beside the eager step
  want graphed && step 100 "train step, bf16, small, the whole step one CUDA graph" $PY -m diffattn -v bench train-step \
    --presets small --seq-lens 1024,4096 --batch 4 --reps 30 --dtype bf16 --cuda-graphs \
    --backends cudnn+epilogue+norm,cudnn_direct+norm,auto+pairs --json "$OUT/train_graphed.json"
  # what a training run graphs (`diffattn pretrain --cuda-graphs`: forward and backward one graph, AdamW and the
  # zeroing eager), the default columns: its AdamW is issued while the GPU replays, so it should read close to the
  # whole step's graph where the GPU's time exceeds the host's (RESULTS.md, 2026-11-29, "Where the host's time goes")
  want graphedmicro && step 100 "train step, bf16, small, forward and backward one CUDA graph (pretrain --cuda-graphs)" \
    $PY -m diffattn -v bench train-step --presets small --seq-lens 1024,4096 --batch 4 --reps 30 --dtype bf16 \
    --cuda-graphs micro --json "$OUT/train_graphed_micro.json"
  # the step a user gets from `diffattn pretrain --compile reduce-overhead`: inductor's fused forward and backward
  # replayed as CUDA graphs, AdamW eager (RESULTS.md, 2026-11-29, "The step compiled", predicts it; bench.targets
  # reads it in rows of its own)
  want compiled && step ${COMPILE_S:-150} "train step, bf16, small at 1024, compiled (inductor, reduce-overhead): the host-bound step without its dispatches" \
    $PY -m diffattn bench train-step --presets small --seq-lens 1024 --batch 4 --reps 10 --dtype bf16 --compile \
    --compile-mode reduce-overhead --json "$OUT/train_compiled.json"
  # where [V; V] by its kernels went on: V1's one-call routes timed again on its training classes (d = 64 and 128),
  # now with it (the sweep extends this run's entry: route_sweep --plan v_copies), so the targets read them as they run.
  # On by this call's step (switches.txt), or, where this call ran no step that decides it, by the table in force
  # (the shipped entry of 2026-11-29 has it on: a call with STEPS=resweep and no train step times it too)
  want resweep && { grep -q "^fused_v_copies: on" "$OUT/switches.txt" 2>/dev/null || { [ ! -f "$OUT/switches.txt" ] && \
    $PY -c "import sys; from diffattn.ops.routes import v_copies_in_kernel; sys.exit(not v_copies_in_kernel(0))"; }; } && \
    step 90 "route sweep again: V1's one-call routes with [V; V] by its kernels" $PY -m diffattn.bench.route_sweep \
    --out "$OUT" --budget-s 70 --warm-s 0 --plan v_copies
  # with the route the first H200 entry defaulted d = 96 to (sdpa) and the one its second lease's sweep chose for
  # DIFF V1 (sdpa_maps+epilogue) forced beside auto: the step said 1.25x with the one and 1.45x with the other, a
  # lease apart (six 830M models with AdamW: ~80 GB; where they do not fit a forced column is NaN with its error)
  want 830m && step 120 "train step, bf16, paper-830m at 2048 (DIFF Table 7's size)" $PY -m diffattn bench train-step \
    --presets paper-830m --seq-lens 2048 --batch 2 --reps 3 --dtype bf16 --backends sdpa,sdpa_maps+epilogue \
    --json "$OUT/train_830m.json"
  # and at 4,096 tokens (issue 34 asks 2K and 4K), batch 1: the same tokens a step, attention's share twice
  want 830m && step 120 "train step, bf16, paper-830m at 4096" $PY -m diffattn bench train-step \
    --presets paper-830m --seq-lens 4096 --batch 1 --reps 3 --dtype bf16 --backends sdpa,sdpa_maps+epilogue \
    --json "$OUT/train_830m_4k.json"
  want decode && step ${DECODE_S:-150} "decode per token, static cache, CUDA graphs, every train-step model" $PY benchmarks/gpu_report.py \
    --out "$OUT/report" --sections decode
  # issue 37's step target (the fused kernel's `small` step <= 1.15x for DIFF V1) had no column in any run: the step
  # with `triton` forced beside the default columns, in a process of its own (a kernel that brought the CUDA context
  # down would take only this step's rows with it), into train_kernel.json, which bench.targets reads for that row
  want kernelstep && step 90 "train step, bf16, small, the fused kernel forced (issue 37's step target)" $PY -m diffattn bench \
    train-step --presets small --seq-lens 1024,4096 --batch 4 --reps 10 --dtype bf16 --backends triton \
    --json "$OUT/train_kernel.json"
  # the miscompiled single-pass tile: reproduced on an H100 (2026-11-26) and an H200 (2026-11-27), barred since
  want sanitize && step 45 "compute-sanitizer: the backward tile (16, 64, 4, 1) alone, one small call" sanitize
  # (the H200 of 2026-11-28: test_gpu.py 52 s for its 170 tests, test_compile_dynamic.py 23 s, test_epilogue.py 4 s)
  want tests && step ${TESTS_S:-150} "gpu tests, one process per file (the ops' first)" gpu_tests
  # issues 34's and 37's targets on what this call wrote (no GPU needed: rerun it on a run's directory that gathers
  # several calls' files, `python -m diffattn.bench.targets DIR`)
  echo "== targets"
  $PY -m diffattn.bench.targets "$OUT" --write | tail -26
  echo "== done after $(( $(date +%s) - start )) s"
} 2>&1 | grep --line-buffered -v "Warning" | tee "$OUT/log.txt"
