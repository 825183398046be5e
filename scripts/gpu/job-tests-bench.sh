#!/usr/bin/env bash
# ONE device command (issue 31 items 1-4b; docs/gpu-session.md): the whole test suite with CUDA,
# the Triton DAG kernels against the PyTorch DPs, the training-step breakdown at cpu-small and
# base (λ = 8, bf16, --max-tokens 8192, eager and torch.compile), and batch-1 latency of the DAT
# decoders against the AT (greedy, beam 5) on the bible test sentences. Everything lands in $OUT
# (6 files): job.log (versions, each stage's command, exit and time), pytest.txt, bench.txt (the
# benchmarks' tables), bench_model.json (every bench_model run's rows), latency.txt, latency.json.
#
# Each stage runs under its own time budget (a maximum), cut to what is left before BUDGET_S
# (default 530 s) from the job's start; a failed or cut stage does not stop the next. Stages run
# in the order of what matters most for the issue, torch.compile last. Needs the carried .whl
# and .carry (scripts/gpu/prepare.sh): the AT is .carry/at-cpu-small, the data
# .carry/bible-en-es-4k; the DAT is the released models/bible-en-es-fadat-cpu-small (both
# cpu-small, both trained to their plateau on the CPU).
#
# Usage (device): bash scripts/gpu/job-tests-bench.sh
#        (here):  scripts/gpu/job-tests-bench.sh --dry-run   # CPU, tiny sizes, OUT a temp dir
set -uo pipefail  # no -e: a failed stage must not stop the later ones
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=${DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
BUDGET_S=${BUDGET_S:-530}
source "$ROOT/scripts/gpu/common.sh"
start_job

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
  SMALL=tiny
  BIG=tiny
  BM_EAGER=fp32-eager,bf16-fused,bf16-glat,bf16-fuzzy
  # inductor's C++ build of a CPU graph takes minutes on one core: the compile stages run eager
  BM_COMPILE=bf16-fused
  LAT_ARGS=(--subset 4 --latency-subset 3 --warmup 1 --threads 1)
else
  DEVICE=cuda
  # the whole suite, the CUDA tests' file first; a hung test is killed after 120 s. One torch
  # thread per xdist worker, as 14 workers share 16 cores.
  PYTEST_ARGS=(-n 14 --dist loadfile --timeout 120 tests/test_cuda.py tests)
  DAG_ARGS=(--device cuda)
  DAG_ENV=()
  BM_ARGS=(--steps 5 --max-tokens 8192 --threads 4)
  SMALL=cpu-small
  BIG=base
  BM_EAGER=fp32-eager,bf16-eager,bf16-fused,bf16-glat,bf16-fuzzy
  BM_COMPILE=bf16-fused,bf16-compile
  LAT_ARGS=(--latency-subset 200 --warmup 20 --threads 4)
fi

{
  echo "job-tests-bench $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} | tee -a "$OUT/job.log"
# in this shell (not a pipeline's subshell), so that PY and PYTHONPATH stay set
setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1

# pytest-xdist and pytest-timeout are in the image (KINDS.md); without them: serially, no timeout
if [ "$DRY" = 0 ] && ! "$PY" -c "import xdist, pytest_timeout" 2>/dev/null; then
  echo "pytest-xdist or pytest-timeout missing: the suite runs serially, no timeout" \
    | tee -a "$OUT/job.log"
  PYTEST_ARGS=(tests/test_cuda.py tests)
fi

# 1. The suite. -rs lists the skips with their reasons; -v prints each test as it ends, so that
# a stage cut by its budget still shows how far it got.
stage pytest 180 pytest.txt env OMP_NUM_THREADS=1 "$PY" -m pytest -p no:cacheprovider -v -rs \
  --durations=15 "${PYTEST_ARGS[@]}"

# 4b. Triton DAG kernels against the PyTorch DPs (median of 20, CUDA events, both checked equal).
stage bench_dag_gpu 35 bench.txt env "${DAG_ENV[@]}" PYTHONPATH="$ROOT/bench:$PYTHONPATH" \
  "$PY" bench/bench_dag_gpu.py "${DAG_ARGS[@]}"

# 2. Where a training step's time and memory go, λ = 8, the 4k vocabulary of the data; all runs
# add their rows to bench_model.json. Eager first (the throughput target), compiled last: a
# compilation that outruns what is left loses only its own stage.
bench_model() {  # STAGE BUDGET PRESET VARIANTS [more flags]
  local name=$1 budget=$2 preset=$3 variants=$4
  shift 4
  stage "$name" "$budget" bench.txt "$PY" bench/bench_model.py --device "$DEVICE" \
    --preset "$preset" --vocab 4000 --ratios 8 "${BM_ARGS[@]}" --variants "$variants" \
    --json "$OUT/bench_model.json" "$@"
}
bench_model bench_model-$BIG 60 "$BIG" "$BM_EAGER"
bench_model bench_model-$SMALL 40 "$SMALL" "$BM_EAGER"

# 3. Batch-1 latency (and batched BLEU / throughput) of the DAT's three decoders and the AT's
# greedy and beam 5, both cpu-small, on the bible test set; speed-ups against AT beam 5.
LAT_MODELS=("$DAT" "$AT")
if [ ! -f "$AT/config.json" ]; then
  echo "latency: no AT carried ($AT; prepare.sh --no-at?): the DAT's decoders alone" \
    | tee -a "$OUT/job.log"
  LAT_MODELS=("$DAT")
fi
stage latency 75 latency.txt "$PY" -m fadat.cli evaluate --device "$DEVICE" \
  --model "${LAT_MODELS[@]}" --data "$DATA" --split test --bootstrap 0 \
  --report "$OUT/latency.json" "${LAT_ARGS[@]}"

# 2 (cont.). The DAG programmes of the step in the Triton kernels; then torch.compile.
bench_model bench_model-$BIG-triton 35 "$BIG" bf16-fused,bf16-glat,bf16-fuzzy --dag-triton
bench_model bench_model-$BIG-compile 60 "$BIG" "$BM_COMPILE"
bench_model bench_model-$SMALL-compile 45 "$SMALL" "$BM_COMPILE"

echo "job-tests-bench done after $(($(date +%s) - START))s; files in OUT:" | tee -a "$OUT/job.log"
ls -la "$OUT" | tee -a "$OUT/job.log"
