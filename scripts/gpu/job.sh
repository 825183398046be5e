#!/usr/bin/env bash
# THE device command of a GPU session (issue 47; docs/gpu-session.md): one `run` call of at most
# 540 s whose stages run in order of value, each cut to what is left of one deadline:
#   tests         (a) tests/test_cuda.py and the DAG/decoder tests, CUDA visible
#   kernels       (b) the Triton DAG kernels against the PyTorch DPs: values, gradients, speed
#   train-base    (c) training step at base, λ = 8, --max-tokens 8192: fp32 / bf16 eager, the
#   train-small       bf16 `fadat train` path, + glancing, + fuzzy loss; the pieces timed alone
#                     (encoder, decoder, token head + log-softmax, links head, DAG NLL forward /
#                     backward, glancing pass, best alignment, fuzzy loss); tokens/s, peak memory
#   latency       (d) batch-1 latency of the released DAT (greedy, lookahead, joint-Viterbi)
#                     against fadat's AT (greedy, beam 5) on the Bible test sentences
#   train-torch-dag (c) the base step with the DAG programmes in the PyTorch DPs (train-base runs
#                     them where `auto` sends them: the Triton kernels on a GPU with triton)
# then `summary`: manifest.json (every file's size and SHA-256, every stage's status and time, the
# numbers that matter) and the summary tables at the end of job.log and of the output.
#
# A stage gets at most its own budget and never more than what is left before the deadline
# (--budget, default 510 s from the job's start, setup included, 15 s kept for the summary); one
# that would have less than its minimum is skipped with a line saying so. A failed, cut or
# skipped stage does not stop the next; what a stage wrote stays in $OUT.
#
# $OUT (8 files): job.log, pytest.txt, junit.xml, bench.txt (every benchmark's table),
# kernels.json, bench_model.json, latency.json, manifest.json.
#
# Needs (scripts/gpu/prepare.sh, carried as .whl and .carry): the wheels the image lacks, the
# prepared Bible data (.carry/bible-en-es); the DAT is models/bible-en-es-fadat-cpu-small and the
# AT models/bible-en-es-at-cpu-small where that directory exists (else the AT rows are skipped).
#
# Usage (device): bash scripts/gpu/job.sh [--only STAGE,...] [--budget S]
#        (here):  scripts/gpu/job.sh --dry-run [--data DIR] [--at DIR]
#   --dry-run: the same stages on this machine's CPU at toy sizes (tiny preset, a few steps and
#     sentences, Triton through its interpreter, the CUDA tests with FADAT_TEST_DEVICE=cpu), every
#     budget and minimum times BUDGET_SCALE (default 3 there, 1 on the device: a shared CPU is
#     slow); OUT a temporary folder unless set. Its numbers mean nothing; it tests the plumbing.
#   --only: run only these stages (a rerun of a failed one); the others are logged as skipped.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=0
BUDGET_S=""
ONLY=""
DATA=.carry/bible-en-es
DAT=models/bible-en-es-fadat-cpu-small
AT=models/bible-en-es-at-cpu-small
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --budget) BUDGET_S=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --at) AT=$2; shift 2 ;;
    *) echo "job.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
SCALE=${BUDGET_SCALE:-$((DRY == 1 ? 3 : 1))}
BUDGET_S=${BUDGET_S:-$((510 * SCALE))}
RESERVE=15
source "$ROOT/scripts/gpu/common.sh"
start_job

TESTS=(tests/test_cuda.py tests/test_dag.py tests/test_decoding.py tests/test_decoding_search.py
  tests/test_decoding_options.py)
if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  # the CUDA tests' own logic on the CPU (their module docstring), a few of them; serially, so
  # without the pytest plugins that the environment installs (hypothesis, schemathesis, xdist:
  # loading them takes half of this stage's CPU time)
  TEST_ENV=(FADAT_TEST_DEVICE=cpu PYTEST_DISABLE_PLUGIN_AUTOLOAD=1)
  TEST_ARGS=(tests/test_cuda.py -k "float64 or best_alignment_equals")
  # one call of each backend, no warm-up: each interpreted Triton call takes seconds
  KERNEL_ARGS=(--device cpu --sizes 2x40 --repeats 1 --warmup 0)
  KERNEL_ENV=(TRITON_INTERPRET=1)  # Triton's interpreter: its kernels on the CPU
  # a small vocabulary and matmul peak: bf16 matrix products run in a slow fallback on CPUs
  # without bf16 instructions (this one: 20 s for a 1024³ product)
  BM_ARGS=(--vocab 200 --steps 1 --max-tokens 600 --threads 1 --peak-size 128)
  SMALL=tiny
  BIG=tiny
  LAT_ARGS=(--subset 4 --latency-subset 3 --warmup 1 --threads 1)
else
  DEVICE=cuda
  # One torch thread per xdist worker (12 workers, 16 cores); tests spread one by one, so that
  # tests/test_cuda.py does not sit on one worker; a hung test is killed after 120 s.
  TEST_ENV=(OMP_NUM_THREADS=1)
  TEST_ARGS=(-n 12 --dist load --timeout 120 "${TESTS[@]}")
  KERNEL_ARGS=(--device cuda)
  KERNEL_ENV=()
  BM_ARGS=(--vocab 4000 --steps 5 --max-tokens 8192 --threads 4)
  SMALL=cpu-small
  BIG=base
  LAT_ARGS=(--latency-subset 200 --warmup 10 --threads 4)
fi

wanted() {  # STAGE: run it unless --only names others
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  echo "[$1] SKIPPED: not asked for (--only $ONLY)" | tee -a "$OUT/job.log"
  printf '%s\tskipped\t\t0\t0\t\n' "$1" >>"$STAGES"
  return 1
}

{
  echo "job.sh $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s" \
    "stage budgets x$SCALE only=${ONLY:-all}"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} | tee -a "$OUT/job.log"
# in this shell (not a pipeline's subshell), so that PY and PYTHONPATH stay set
setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1
echo "setup done after $(($(date +%s) - START))s" | tee -a "$OUT/job.log"

# (a) The CUDA tests and the DAG/decoder tests. -v prints each test as it ends, so that a stage
# cut by its budget still shows how far it got; -rs lists the skips with their reasons.
if wanted tests; then
  if [ "$DRY" = 0 ] && ! "$PY" -c "import xdist, pytest_timeout" 2>/dev/null; then
    echo "pytest-xdist or pytest-timeout missing: the tests run serially, no timeout" \
      | tee -a "$OUT/job.log"
    TEST_ARGS=("${TESTS[@]}")
  fi
  stage tests 150 40 pytest.txt env "${TEST_ENV[@]}" "$PY" -m pytest -p no:cacheprovider -v \
    -rs --durations=15 --junitxml="$OUT/junit.xml" "${TEST_ARGS[@]}"
fi

# (b) The Triton kernels against the PyTorch DPs on the same inputs (median of 20, CUDA events;
# the largest difference of log P, both gradients and the best path).
if wanted kernels; then
  stage kernels 45 15 bench.txt env "${KERNEL_ENV[@]}" PYTHONPATH="$ROOT/bench:$PYTHONPATH" \
    "$PY" bench/bench_dag_gpu.py "${KERNEL_ARGS[@]}" --json "$OUT/kernels.json"
fi

# (c) Where a training step's time and memory go, λ = 8, the 4k vocabulary of the data; every run
# adds its rows to bench_model.json.
bench_model() {  # STAGE MAX_S MIN_S PRESET [more flags]
  local name=$1 max=$2 need=$3 preset=$4
  shift 4
  stage "$name" "$max" "$need" bench.txt "$PY" bench/bench_model.py --device "$DEVICE" \
    --preset "$preset" --ratios 8 "${BM_ARGS[@]}" \
    --variants fp32-eager,bf16-eager,bf16-fused,bf16-glat,bf16-fuzzy --components \
    --json "$OUT/bench_model.json" "$@"
}
if wanted train-base; then bench_model train-base 75 30 "$BIG"; fi
if wanted train-small; then bench_model train-small 50 20 "$SMALL"; fi

# (d) Batch-1 latency (and batched BLEU / throughput) of the DAT's three decoders and the AT's
# greedy and beam 5 on the Bible test set; speed-ups against AT beam 5.
if wanted latency; then
  models=("$DAT")
  if [ -f "$AT/config.json" ]; then
    models+=("$AT")
  else
    echo "[latency] no AT at $AT: the AT rows (greedy, beam 5) are skipped" | tee -a "$OUT/job.log"
  fi
  if [ -f "$DATA/meta.json" ]; then
    stage latency 110 40 bench.txt "$PY" -m fadat.cli evaluate --device "$DEVICE" \
      --model "${models[@]}" --data "$DATA" --split test --bootstrap 0 \
      --report "$OUT/latency.json" "${LAT_ARGS[@]}"
  else
    echo "[latency] SKIPPED: no prepared data at $DATA (scripts/gpu/prepare.sh; carry .carry)" \
      | tee -a "$OUT/job.log"
    printf 'latency\tskipped\t\t0\t0\tbench.txt\n' >>"$STAGES"
  fi
fi

# (c, cont.) The same base step with the DAG programmes in the PyTorch DPs, against train-base's
# Triton kernels.
if wanted train-torch-dag; then bench_model train-torch-dag 40 20 "$BIG" --dag-backend torch; fi

# The manifest and the summary tables: always, in the time kept back for them. fadat's record of
# the output files it wrote (.fadat-files.json) is not a result: only 8 files come back.
rm -f "$OUT/.fadat-files.json"
echo "[summary] after $(($(date +%s) - START))s" | tee -a "$OUT/job.log"
set +e
timeout -k 5 "$RESERVE" "$PY" scripts/gpu/summary.py "$OUT" --stages "$STAGES" \
  --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
  --seconds "$(($(date +%s) - START))" 2>&1 | tee -a "$OUT/job.log"
[ "${PIPESTATUS[0]}" = 0 ] || echo "[summary] failed: manifest.json may be missing" \
  | tee -a "$OUT/job.log"
set -e
rm -f "$STAGES"
echo "job.sh done after $(($(date +%s) - START))s; OUT=$OUT" | tee -a "$OUT/job.log"
