#!/usr/bin/env bash
# A device command (issue 31 item 5) that is NOT part of the 15-minute plan of docs/gpu-session.md
# (scripts/gpu/job.sh comes first; this one needs a session of its own with a machine start plus
# 565 s to spare): the NLL -> FA-DAT recipe on the carried bible-en-es data (.carry/bible-en-es,
# scripts/gpu/prepare.sh; the released DAT's 4k vocabulary) on CUDA, at the largest DAT whose
# fp16 weights come back in <= 60 MB (configs/dat-base43-nll-gpu.yaml: d = 512, 4 + 3 layers,
# λ = 8, 59.0 MB), inside a wall budget:
#   1. NLL pre-training stopped by --max-time (default: what the budget leaves after the rest),
#   2. its 5 best checkpoints averaged (fp16),
#   3. fuzzy alignment fine-tuning (n = 2, configs/dat-base43-fuzzy-gpu.yaml) from that average,
#      stopped by --max-time FT_S, and its 5 best averaged (fp16): the model;
#   4. `fadat evaluate` of both averages on the whole test set, greedy / lookahead / joint-Viterbi;
#   5. the model directory split into <= 15 MiB parts (scripts/gpu/shards.py).
# $OUT gets 8 files: job.log, train-logs.txt, eval.json, model.manifest.json and up to four
# model.tar.partNN (scripts/gpu/unpack-model.sh joins them here). If the fine-tuning fails, the
# NLL average is packed instead (job.log says which).
#
# Usage (device): bash scripts/gpu/job-train.sh [--nll-time S] [--ft-time S] [--budget S]
#        (here):  scripts/gpu/job-train.sh --dry-run   # CPU, tiny model, seconds, OUT a temp dir
# Defaults: --budget 565 (the whole job, s), --ft-time 90, --nll-time = the budget left after
# the fine-tuning and OVERHEAD_S (150 s: two trainings' start-up and final validation, the
# averages, the evaluation, the packing). NLL_FLAGS / FT_FLAGS (environment, split on spaces)
# add `fadat train` flags to either run, e.g. NLL_FLAGS="--max-tokens 32768 --validate-every 200".
set -uo pipefail  # no -e: a failed stage is logged; the packing still runs
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=${DRY_RUN:-0}
BUDGET_S=565
FT_S=90
NLL_S=""
OVERHEAD_S=150
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --nll-time) NLL_S=$2; shift 2 ;;
    --ft-time) FT_S=$2; shift 2 ;;
    --budget) BUDGET_S=$2; shift 2 ;;
    *) echo "job-train.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$ROOT/scripts/gpu/common.sh"
start_job

DATA=.carry/bible-en-es
WORK=$(mktemp -d /tmp/gpu-train.XXXXXX)
NAME=bible-en-es-fadat-gpu
COMMON=(--data "$DATA" --seed 1 --no-progress-bar)
if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  # the same path at toy sizes: a plumbing test, its model and BLEU mean nothing
  [ -z "$NLL_S" ] && NLL_S=8
  FT_S=5
  SMALL=(--device cpu --preset tiny --max-tokens 600 --validate-every 4 --valid-subset 16
    --threads 1)
  NLL_EXTRA=("${SMALL[@]}")
  FT_EXTRA=(--device cpu --max-tokens 600 --update-freq 1 --validate-every 2 --valid-subset 16
    --threads 1)
  EVAL_EXTRA=(--subset 8 --threads 1)
else
  DEVICE=cuda
  NLL_EXTRA=()
  FT_EXTRA=()
  EVAL_EXTRA=(--threads 4)
fi
# shellcheck disable=SC2206  # split on spaces on purpose
NLL_EXTRA+=(${NLL_FLAGS:-})
# shellcheck disable=SC2206
FT_EXTRA+=(${FT_FLAGS:-})

{
  echo "job-train $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} | tee -a "$OUT/job.log"
setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1

if [ -z "$NLL_S" ]; then
  NLL_S=$((DEADLINE - $(date +%s) - FT_S - OVERHEAD_S))
  [ "$NLL_S" -lt 30 ] && NLL_S=30
fi
echo "NLL --max-time ${NLL_S}s, fine-tuning --max-time ${FT_S}s" | tee -a "$OUT/job.log"

# 1-2. NLL pre-training and its average. A stage's budget is its --max-time plus the start-up and
# the final validation; the trainer stops itself at --max-time.
stage train-nll $((NLL_S + 60)) 5 train-logs.txt "$PY" -m fadat.cli train \
  --config configs/dat-base43-nll-gpu.yaml --run-dir "$WORK/nll" --max-time "${NLL_S}s" \
  "${COMMON[@]}" "${NLL_EXTRA[@]}"
stage average-nll 60 5 job.log "$PY" -m fadat.cli average --run "$WORK/nll" \
  --best "$(best_k "$WORK/nll")" --output "$WORK/nll-avg" --dtype float16

# 3. Fuzzy alignment fine-tuning from the NLL average, and its average: the model.
stage train-ft $((FT_S + 60)) 5 train-logs.txt "$PY" -m fadat.cli train \
  --config configs/dat-base43-fuzzy-gpu.yaml --init-from "$WORK/nll-avg" \
  --run-dir "$WORK/ft" --max-time "${FT_S}s" "${COMMON[@]}" "${FT_EXTRA[@]}"
stage average-ft 60 5 job.log "$PY" -m fadat.cli average --run "$WORK/ft" \
  --best "$(best_k "$WORK/ft")" --output "$WORK/$NAME" --dtype float16

# 4. Test BLEU of both averages with the three decoders (no latency: job.sh measures it).
models=()
[ -f "$WORK/nll-avg/config.json" ] && models+=("$WORK/nll-avg")
[ -f "$WORK/$NAME/config.json" ] && models+=("$WORK/$NAME")
if [ "${#models[@]}" -gt 0 ]; then
  stage evaluate 90 5 job.log "$PY" -m fadat.cli evaluate --device "$DEVICE" --model "${models[@]}" \
    --data "$DATA" --split test --no-latency --bootstrap 0 --report "$OUT/eval.json" \
    "${EVAL_EXTRA[@]}"
else
  echo "[evaluate] SKIPPED: no averaged model" | tee -a "$OUT/job.log"
fi

# 5. The model (the fine-tuned one, else the NLL average) into <= 15 MiB parts (pack_model: not a
# stage, it gets its time even past the deadline). An average takes the 5 best checkpoints, or
# as many as a short run validated (best_k).
pack=""
if [ -f "$WORK/$NAME/config.json" ]; then
  pack=$WORK/$NAME
elif [ -f "$WORK/nll-avg/config.json" ]; then
  echo "fine-tuned model missing: packing the NLL average instead" | tee -a "$OUT/job.log"
  mv "$WORK/nll-avg" "$WORK/$NAME-nll" && pack=$WORK/$NAME-nll
fi
if [ -n "$pack" ]; then
  pack_model "$pack"
else
  echo "no model to pack" | tee -a "$OUT/job.log"
fi
for run in nll ft; do
  # train.log: the update and validation records (fadat.training.run_log); config.yaml: the
  # resolved config of each run
  for f in config.yaml train.log valid_log.jsonl; do
    [ -f "$WORK/$run/$f" ] && { echo "==== $run/$f"; cat "$WORK/$run/$f"; } >>"$OUT/train-logs.txt"
  done
done
list_out job-train
rm -rf "$WORK" "$STAGES"
exit 0
