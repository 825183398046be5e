#!/usr/bin/env bash
# A device command outside the 15-minute plan of docs/gpu-session.md ("Training one speed-sweep
# design on the GPU"): ONE design of the speed sweep (docs/speed-sweep.md) trained on CUDA at the
# sweep's training budget, and its model brought back:
#   1. the stage DESIGN of recipes/experiments/bible-en-es-speed-sweep.yaml: its config, seed,
#      max_updates, average and `train` flags, read by recipes/experiment.py's own loader
#      (scripts/gpu/sweep_design.py stage; nothing here names the designs or the dataset), and
#      the check that the data is the sweep's dataset (below; exit 1 before training if not);
#   2. `fadat train` as `experiment.py run` starts the stage (--config, --data, --seed, the
#      stage's train flags (--save-every 100), --max-updates, --no-progress-bar), with
#      --max-time what the budget leaves, so that a slow machine still brings a model back;
#   3. its `average` (5) best checkpoints by valid BLEU (fewer if fewer were validated) averaged
#      into the model directory DESIGN-s1-gpu, fp16 weights;
#   4. the model split into <= 15 MiB parts (scripts/gpu/shards.py; unpack-model.sh joins them);
#   5. manifest.json (sweep_design.py manifest): the stages, the updates reached and whether they
#      are the stage's max_updates (complete), the best valid BLEU, the settings, the data's
#      training digest, the files' hashes.
# $OUT (5 files; the device tool brings back 8): job.log, run-logs.tar.gz (DESIGN-s1-gpu/:
# config.yaml, train.log, train_log.jsonl, valid_log.jsonl, best.json: a run directory without
# checkpoints), model.manifest.json, model.tar.part00 (a cpu-small-size fp16 model is 14.4 MiB
# with its spm.model: one part; a part01 would be the 6th file), manifest.json.
#
# The same recipe as the CPU sweep, with these differences (none changes the model's shape, the
# data, the schedule or the number of updates):
# - the batch: the same tokens per update as the CPU runs, max_tokens × update_freq of the
#   config (3072 × 2 for a design with a λ range, 2048 × 2 for a fixed λ), in ONE micro-batch
#   (--max-tokens 6144 or 4096, --update-freq 1): the same batch budget, micro-batched
#   differently. The batches are cut and shuffled differently, so a run is not bit-identical to a
#   CPU run: like a run with another seed.
# - --device cuda, fp32 as the CPU sweep (no --bf16; PyTorch's default: no TF32 matmuls), the DAG
#   likelihood in the Triton kernels (--dag-backend auto; the CPU runs use the PyTorch DPs, the
#   same values within float32 rounding); the config's threads (0: torch's default) rather than
#   experiment.py's --threads 1.
# - the data: .carry/DATASET, DATASET being the experiment file's `data` (bible-en-es-4k-kd: the
#   8k training set distilled by the committed AT with beam 5, re-prepared in the 4k vocabulary;
#   valid and test keep the real references): scripts/gpu/prepare.sh copies the directory the CPU
#   sweep trains on (DATA_ROOT/DATASET, built by recipes/experiment.py's make_dataset) and records
#   its training files' digest in .carry/DATASET.json. Before training the job checks that the
#   data it was given has that digest (fadat.data.binarized.training_digest: spm.model, the
#   train and valid arrays, the valid references; sweep_design.py check-data) and otherwise
#   stops with exit 1 and a line naming the dataset, training nothing: no model is better than
#   one trained on other data than the CPU runs'. Only a dry run with --data skips the check.
# - the average stores fp16 weights (loading casts them back to fp32); experiment.py stores fp32.
# - one command, no --resume: a run that the budget cuts short is averaged as it is, and job.log
#   and manifest.json say `complete: false` with the last update.
#
# Usage (device): bash scripts/gpu/job-sweep.sh DESIGN [--budget S]
#        (here):  scripts/gpu/job-sweep.sh DESIGN --dry-run [--data DIR]  # CPU, toy widths
# DESIGN: a stage of the sweep (5x1-range, base, range, 5x1, 4x2-range, 4x2); another name exits 2
# with the list. --budget: the whole job in seconds, setup included (default 540); the training's
# --max-time is what it leaves after OVERHEAD_S (75 s: the trainer's start-up, its last
# validation, the average, the packing and the manifest); the average may run up to 20 s past the
# budget and the packing after it, so give the device tool a timeout_s of budget + 60. TRAIN_FLAGS
# (environment, split on spaces) adds `fadat train` flags last, e.g. "--validate-every 400".
# --data: the prepared data (default $CARRY/DATASET, CARRY (environment) defaulting to .carry;
# on the device it must be the sweep's dataset, as above; a dry run with --data may take any
# prepared set in the same 4k vocabulary, unchecked; a dry run without it checks
# $CARRY/DATASET as the device does). The dry run trains the design's config at toy widths
# (d = 32, FFN 64: its depths and λ stay; sweep_design.py toy-config) for 8 updates, validating
# every 2 on 16 sentences, one thread, OUT a temporary folder unless set: about a minute on one
# shared core.
set -uo pipefail  # no -e: a failed stage is logged; the packing and the manifest still run
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=${DRY_RUN:-0}
BUDGET_S=540
OVERHEAD_S=75
DESIGN=""
DATA=""
CARRY=${CARRY:-.carry}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --budget) BUDGET_S=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    -*) echo "job-sweep.sh: unknown argument $1" >&2; exit 2 ;;
    *)
      if [ -n "$DESIGN" ]; then echo "job-sweep.sh: one DESIGN, got $DESIGN and $1" >&2; exit 2; fi
      DESIGN=$1; shift ;;
  esac
done
source "$ROOT/scripts/gpu/common.sh"
pick_python
if [ -z "$DESIGN" ]; then
  echo "usage: scripts/gpu/job-sweep.sh DESIGN [--budget S] [--dry-run [--data DIR]]" >&2
  echo "DESIGN: one of $("$PY" scripts/gpu/sweep_design.py designs)" >&2
  exit 2
fi
# CONFIG SEED MAX_UPDATES AVERAGE TOKENS DATASET DESIGNS OPTIONS (sweep_design.py shell_vars)
vars=$("$PY" scripts/gpu/sweep_design.py stage "$DESIGN") || exit 2
eval "$vars"
# the sweep's own dataset, as prepare.sh carries it; CHECK_DATA=0 only for a dry run's --data
CHECK_DATA=1
if [ -z "$DATA" ]; then
  DATA=$CARRY/$DATASET
elif [ "$DRY" = 1 ]; then
  CHECK_DATA=0
fi
start_job

WORK=$(mktemp -d /tmp/gpu-sweep.XXXXXX)
NAME=$DESIGN-s$SEED-gpu
# experiment.py's layout: the run RUNS/STAGE-sSEED, its average RUNS/models/STAGE-sSEED
RUN=$WORK/$NAME
MODEL=$WORK/models/$NAME
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
{
  echo "job-sweep $(date -u +%FT%TZ) design=$DESIGN dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s"
  echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "stage $DESIGN: $CONFIG, seed $SEED, $MAX_UPDATES updates, the $AVERAGE best averaged," \
    "train flags: ${OPTIONS[*]}; $TOKENS tokens per update (max_tokens × update_freq) in one" \
    "micro-batch; data $DATA (the sweep's: $DATASET)"
} | tee -a "$OUT/job.log"
EXTRA=()
if [ "$DRY" = 1 ]; then
  # the same path at toy widths: a plumbing test, its model and BLEU mean nothing
  "$PY" scripts/gpu/sweep_design.py toy-config "$DESIGN" "$WORK/toy.yaml"
  echo "dry run: $CONFIG at toy widths ($WORK/toy.yaml), 8 of its $MAX_UPDATES updates" \
    | tee -a "$OUT/job.log"
  CONFIG=$WORK/toy.yaml
  MAX_UPDATES=8
  EXTRA=(--threads 1 --validate-every 2 --valid-subset 16)
fi
# shellcheck disable=SC2206  # split on spaces on purpose
EXTRA+=(${TRAIN_FLAGS:-})

setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1
# The data IS the sweep's dataset (its training files' digest, as prepare.sh recorded it), or
# nothing is trained.
if [ "$CHECK_DATA" = 1 ]; then
  "$PY" scripts/gpu/sweep_design.py check-data "$DATA" --carry "$CARRY" 2>&1 \
    | tee -a "$OUT/job.log"
  if [ "${PIPESTATUS[0]}" != 0 ]; then
    echo "job-sweep.sh: exit 1 before training, no model: $DATA is not shown to be the sweep's" \
      "dataset $DATASET (above)" | tee -a "$OUT/job.log"
    rm -rf "$WORK" "$STAGES"
    exit 1
  fi
else
  echo "data: $DATA (a dry run's --data: not checked against the sweep's $DATASET)" \
    | tee -a "$OUT/job.log"
  [ -f "$DATA/meta.json" ] || echo "no $DATA/meta.json" | tee -a "$OUT/job.log"
fi

T=$((DEADLINE - $(date +%s) - OVERHEAD_S))
[ "$T" -lt 30 ] && T=30
echo "training --max-time ${T}s" | tee -a "$OUT/job.log"

# 2. Training. The stage's timeout leaves RESERVE s for the average and the packing; the
# trainer stops itself at --max-time, validates the last update and saves.
RESERVE=40
stage train $((T + 60)) 5 job.log "$PY" -m fadat.cli train --config "$CONFIG" --data "$DATA" \
  --run-dir "$RUN" --seed "$SEED" "${OPTIONS[@]}" --device "$DEVICE" \
  --max-updates "$MAX_UPDATES" --max-time "${T}s" --no-progress-bar \
  --max-tokens "$TOKENS" --update-freq 1 "${EXTRA[@]}"

# 3. The average: it may run up to 20 s past the deadline (RESERVE -20), being what the job is for.
RESERVE=-20
mkdir -p "$WORK/models"
stage average 60 1 job.log "$PY" -m fadat.cli average --run "$RUN" \
  --best "$(best_k "$RUN" "$AVERAGE")" --output "$MODEL" --dtype float16

# 4. The model into <= 15 MiB parts (pack_model), and the run's logs.
t0=$(date +%s)
if [ -f "$MODEL/config.json" ]; then
  pack_model "$MODEL"
  rc=$?
  status=ok
  [ "$rc" != 0 ] && status=failed
else
  echo "[pack] SKIPPED: no averaged model" | tee -a "$OUT/job.log"
  rc="" status=skipped
fi
printf 'pack\t%s\t%s\t%s\t\tmodel.manifest.json\n' "$status" "$rc" "$(($(date +%s) - t0))" \
  >>"$STAGES"
logs=()
for f in config.yaml train.log train_log.jsonl valid_log.jsonl best.json; do
  [ -f "$RUN/$f" ] && logs+=("$NAME/$f")
done
[ "${#logs[@]}" -gt 0 ] && tar -czf "$OUT/run-logs.tar.gz" -C "$WORK" "${logs[@]}"

# 5. The manifest, and its summary at the end of job.log and of the output.
"$PY" scripts/gpu/sweep_design.py manifest "$OUT" --stages "$STAGES" --design "$DESIGN" \
  --run "$RUN" --model "$MODEL" --max-updates "$MAX_UPDATES" --data "$DATA" \
  --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
  --seconds "$(($(date +%s) - START))" --budget "$BUDGET_S" \
  $([ "$DRY" = 1 ] && echo --dry-run) 2>&1 | tee -a "$OUT/job.log"
list_out job-sweep
rm -rf "$WORK" "$STAGES"
exit 0
