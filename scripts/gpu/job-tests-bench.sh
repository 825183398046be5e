#!/usr/bin/env bash
# ONE device command (issue 31 items 1-4b; docs/gpu-session.md): the whole test suite with CUDA,
# the Triton DAG kernels against the PyTorch DPs, the training-step breakdown at cpu-small and
# base (λ = 8, bf16, --max-tokens 8192, eager and torch.compile), and batch-1 latency of the DAT
# decoders against the AT (greedy, beam 5) on the bible test sentences. Everything lands in $OUT
# (8 files): job.log (versions, each stage's exit and time), pytest.txt, bench_dag_gpu.txt,
# bench_model.txt, bench_model-cpu-small.json, bench_model-base.json, latency.txt, latency.json.
#
# Each stage runs under its own time budget and a failed stage does not stop the next; the job
# ends within BUDGET_S (default 530 s) of its start. Needs the carried .whl and .carry
# (scripts/gpu/prepare.sh): the AT is .carry/at-cpu-small, the data .carry/bible-en-es-4k; the
# DAT is the released models/bible-en-es-fadat-cpu-small (both cpu-small, trained).
#
# Usage (device): bash scripts/gpu/job-tests-bench.sh
#        (here):  scripts/gpu/job-tests-bench.sh --dry-run   # CPU, tiny sizes, OUT a temp dir
set -uo pipefail  # no -e: a failed stage must not stop the later ones
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=${DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
BUDGET_S=${BUDGET_S:-530}
RESERVE=5
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
if [ "$DRY" = 1 ]; then
  OUT=${OUT:-$(mktemp -d /tmp/gpu-dry.XXXXXX)}
fi
: "${OUT:?OUT is not set (the device tool sets it; --dry-run makes one)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source "$ROOT/scripts/gpu/common.sh"

DAT=models/bible-en-es-fadat-cpu-small
AT=.carry/at-cpu-small
DATA=.carry/bible-en-es-4k
if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  # the same stages at toy sizes: a plumbing test, its numbers mean nothing
  PYTEST_ARGS=(tests/test_bench_model.py)
  DAG_ARGS=(--device cpu --sizes 2x64 --repeats 1)
  DAG_ENV=(TRITON_INTERPRET=1)  # Triton's interpreter: its kernels on the CPU
  BM_ARGS=(--steps 1 --max-tokens 600 --threads 1)
  BM_PRESETS=(tiny)
  BM_VARIANTS=fp32-eager,bf16-fused,bf16-glat,bf16-fuzzy
  LAT_ARGS=(--subset 4 --latency-subset 3 --warmup 1 --threads 1)
else
  DEVICE=cuda
  # the whole suite, the CUDA tests' file first; a hung test is killed after 120 s. One torch
  # thread per xdist worker, as 14 workers share 16 cores.
  PYTEST_ARGS=(-n 14 --dist loadfile --timeout 120 tests/test_cuda.py tests)
  DAG_ARGS=(--device cuda)
  DAG_ENV=()
  BM_ARGS=(--steps 5 --max-tokens 8192 --threads 4)
  BM_PRESETS=(cpu-small base)
  BM_VARIANTS=fp32-eager,bf16-eager,bf16-fused,bf16-compile,bf16-glat,bf16-fuzzy
  LAT_ARGS=(--latency-subset 200 --warmup 20 --threads 4)
fi

{
  echo "job-tests-bench $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} | tee -a "$OUT/job.log"
# in this shell (not a pipeline's subshell), so that PY and PYTHONPATH stay set
setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1

# 1. The suite. -rs lists the skips with their reasons; -v prints each test as it ends, so that
# a stage cut by its budget still shows how far it got.
stage pytest 215 pytest.txt env OMP_NUM_THREADS=1 "$PY" -m pytest -p no:cacheprovider -v -rs \
  --durations=15 "${PYTEST_ARGS[@]}"

# 4b. Triton DAG kernels against the PyTorch DPs (median of 20, CUDA events, both checked equal).
stage bench_dag_gpu 45 bench_dag_gpu.txt env "${DAG_ENV[@]}" PYTHONPATH="$ROOT/bench:$PYTHONPATH" \
  "$PY" bench/bench_dag_gpu.py "${DAG_ARGS[@]}"

# 2. Where a training step's time and memory go, λ = 8, the 4k vocabulary of the data.
for preset in "${BM_PRESETS[@]}"; do
  budget=75
  [ "$preset" = base ] && budget=95
  stage "bench_model-$preset" "$budget" bench_model.txt "$PY" bench/bench_model.py \
    --device "$DEVICE" --preset "$preset" --vocab 4000 --ratios 8 "${BM_ARGS[@]}" \
    --variants "$BM_VARIANTS" --json "$OUT/bench_model-$preset.json"
done

# 3. Batch-1 latency (and batched BLEU / throughput) of the DAT's three decoders and the AT's
# greedy and beam 5, both cpu-small, on the bible test set; speed-ups against AT beam 5.
stage latency 90 latency.txt "$PY" -m fadat.cli evaluate --device "$DEVICE" \
  --model "$DAT" "$AT" --data "$DATA" --split test --bootstrap 0 \
  --report "$OUT/latency.json" "${LAT_ARGS[@]}"

echo "job-tests-bench done after $(($(date +%s) - START))s; files in OUT:" | tee -a "$OUT/job.log"
ls -la "$OUT" | tee -a "$OUT/job.log"
