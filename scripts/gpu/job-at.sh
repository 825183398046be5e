#!/usr/bin/env bash
# A device command outside the 15-minute plan of docs/gpu-session.md ("Continuing the AT's
# plateau run on the GPU"): the AT of recipes/experiments/bible-en-es-plateau.yaml (stage `at`,
# configs/at-cpu-small.yaml on the 8k data), whose run the CPU trains, continued on CUDA from its
# compact copy (snapshots/bible-en-es-at-plateau, `fadat snapshot`), and brought back:
#   1. the copy into a run directory; its config.yaml's data directory made to point at the
#      carried .carry/bible-en-es-8k (a link at that path where it is missing, which also serves
#      a copy that records no dataset digest; scripts/gpu/prepare.sh checks the carried data
#      against the digest the copy records, checkpoints.check_resume_data);
#   2. `fadat train --resume RUN --reset-optimizer --device cuda --max-time E+T`, E the run's
#      training seconds so far (--max-time counts its resumes) and T what the budget leaves,
#      stopped with SIGINT as soon as the plateau criterion holds (scripts/gpu/at_plateau.py
#      train: recipes/experiment.py's train_until_plateau). Everything else is the run's own
#      config: validate_every 1000 and valid_subset 0 (the whole valid set), max_tokens,
#      update_freq, keep_best, and bf16 (a key a resumed run keeps; on CUDA it is bf16 autocast,
#      fadat.process.native_bf16 = torch.cuda.is_bf16_supported()). Not started when the
#      criterion already holds in the copy's valid log;
#   3. the plateau criterion on the run's whole valid_log.jsonl (CPU and GPU validations), and
#      the min(5, on disk) best checkpoints validated at <= N (at <= the last update when it does
#      not hold) averaged by `fadat average --checkpoints ... --dtype float16` into the model
#      directory bible-en-es-at-cpu-small (a compact copy keeps no best checkpoints: only those
#      validated on the GPU can be averaged);
#   4. `fadat snapshot` of the run as it ended into bible-en-es-at-plateau, with its config.yaml's
#      device, max_time and threads put back to the copy's (so the CPU continues it as before);
#   5. both split into <= 15 MiB parts (scripts/gpu/shards.py; scripts/gpu/unpack-at.sh joins them
#      here), manifest.json (at_plateau.py manifest: updates reached, the criterion, N, the best
#      BLEU, the checkpoints averaged, every file's size and SHA-256) and job.log.
# $OUT: job.log, manifest.json, model.manifest.json, model.tar.partNN, snapshot.manifest.json,
# snapshot.tar.partNN: 8 files at cpu-small size (two parts each: 15.8 MB of fp16 weights).
#
# Usage (device): bash scripts/gpu/job-at.sh [--budget S] [--snapshot DIR] [--data DIR]
#        (here):  scripts/gpu/job-at.sh --dry-run --data DIR [--snapshot DIR]
# --budget: the whole job in seconds, setup included (default 540); the training gets what it
# leaves after OVERHEAD_S (90 s: the trainer's start-up, its last validation of the whole valid
# set, the average, the snapshot, the packing); give the device tool a timeout_s of budget + 60.
# --snapshot: the compact copy (default snapshots/bible-en-es-at-plateau); --data: the run's data
# (default .carry/bible-en-es-8k). TRAIN_FLAGS (environment, split on spaces) adds `fadat train`
# flags (resumable ones only: --threads, --validate-every would break the criterion's spacing).
# Dry run: CPU, OUT a temporary folder unless set; without --snapshot it first trains a toy AT
# (preset tiny) on DIR for 4 updates, validating every 2 on 16 sentences, and snapshots it with
# its data behind a link that it then removes (so step 1's link is exercised); the continuation
# runs to update 12 at most with the criterion's minimum at 8 instead of 10,000.
set -uo pipefail  # no -e: a failed stage is logged; the packing and the manifest still run
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=${DRY_RUN:-0}
BUDGET_S=540
OVERHEAD_S=90
SNAPSHOT=""
DATA=.carry/bible-en-es-8k
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --budget) BUDGET_S=$2; shift 2 ;;
    --snapshot) SNAPSHOT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    *) echo "job-at.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
source "$ROOT/scripts/gpu/common.sh"
pick_python
HELPER=(scripts/gpu/at_plateau.py)
EXTRA=()
if [ "$DRY" = 1 ]; then
  HELPER+=(--min-updates 8)
  EXTRA=(--max-updates 12 --threads 1)
fi
# shellcheck disable=SC2206  # split on spaces on purpose
EXTRA+=(${TRAIN_FLAGS:-})
# MIN_UPDATES WINDOW GAIN AVERAGE MAX_UPDATES CONFIG (at_plateau.py stage)
vars=$("$PY" "${HELPER[@]}" stage) || exit 2
eval "$vars"
start_job

WORK=$(mktemp -d /tmp/gpu-at.XXXXXX)
RUN=$WORK/at-run
MODEL=$WORK/bible-en-es-at-cpu-small
COPY=$WORK/bible-en-es-at-plateau
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{
  echo "job-at $(date -u +%FT%TZ) dry_run=$DRY device=$DEVICE budget=${BUDGET_S}s"
  echo "commit: $COMMIT"
  echo "stage at: $CONFIG; plateau: first validated N >= $MIN_UPDATES with b(N) - b((1 -" \
    "$WINDOW) N) < $GAIN; the $AVERAGE best validated at <= N averaged"
} | tee -a "$OUT/job.log"
setup_python > >(tee -a "$OUT/job.log") 2>&1
versions > >(tee -a "$OUT/job.log") 2>&1
[ -f "$DATA/meta.json" ] || echo "no $DATA/meta.json: run scripts/gpu/prepare.sh and carry .carry" \
  | tee -a "$OUT/job.log"
DATA_ABS=$(cd "$DATA" 2>/dev/null && pwd || echo "$ROOT/$DATA")

if [ "$DRY" = 1 ] && [ -z "$SNAPSHOT" ]; then
  # a toy run to continue: a plumbing test, its model and BLEU mean nothing
  ln -s "$DATA_ABS" "$WORK/toy-data"
  printf 'arch: at\npreset: tiny\nobjective: label_smoothed_ce\nlabel_smoothing: 0.1\n' \
    >"$WORK/toy.yaml"
  printf 'lr: 0.0005\nwarmup: 2\nmax_tokens: 600\nupdate_freq: 2\nbf16: true\n' >>"$WORK/toy.yaml"
  echo "dry run: a toy AT (preset tiny, 4 updates) to continue" | tee -a "$OUT/job.log"
  "$PY" -m fadat.cli train --config "$WORK/toy.yaml" --data "$WORK/toy-data" \
    --run-dir "$WORK/toy-run" --max-updates 4 --validate-every 2 --valid-subset 16 \
    --save-every 2 --threads 1 --device cpu --seed 1 --no-progress-bar >>"$WORK/toy.log" 2>&1 \
    && "$PY" -m fadat.cli snapshot --run "$WORK/toy-run" --output "$WORK/toy-snapshot" \
      >>"$WORK/toy.log" 2>&1 || { cat "$WORK/toy.log"; echo "dry run: the toy run failed"; }
  rm -f "$WORK/toy-data"  # step 1 links it again
  SNAPSHOT=$WORK/toy-snapshot
fi
SNAPSHOT=${SNAPSHOT:-snapshots/bible-en-es-at-plateau}

# 1. The copy into a run directory, its data in place.
if [ ! -f "$SNAPSHOT/checkpoint_last.pt" ]; then
  echo "no $SNAPSHOT/checkpoint_last.pt: nothing to continue" | tee -a "$OUT/job.log"
else
  cp -r "$SNAPSHOT" "$RUN"
  cp "$SNAPSHOT/config.yaml" "$WORK/original-config.yaml"
fi
# UPDATES ELAPSED PLATEAU_N RUN_DATA BEST_BLEU (at_plateau.py status --shell)
UPDATES=0 ELAPSED=0 PLATEAU_N="" RUN_DATA="" BEST_BLEU=""
[ -d "$RUN" ] && { vars=$("$PY" "${HELPER[@]}" status "$RUN" --shell) && eval "$vars"; }
echo "the copy: update $UPDATES, ${ELAPSED}s trained, best valid BLEU ${BEST_BLEU:--}," \
  "data $RUN_DATA; criterion ${PLATEAU_N:+held at N = $PLATEAU_N}${PLATEAU_N:-not held}" \
  | tee -a "$OUT/job.log"
if [ -n "$RUN_DATA" ] && [ ! -f "$RUN_DATA/meta.json" ]; then
  if mkdir -p "$(dirname "$RUN_DATA")" && ln -sfn "$DATA_ABS" "$RUN_DATA"; then
    echo "data: $RUN_DATA -> $DATA_ABS (a link)" | tee -a "$OUT/job.log"
  else
    echo "data: could not link $RUN_DATA to $DATA_ABS" | tee -a "$OUT/job.log"
  fi
fi
grep -E '^(bf16|fp16|validate_every|valid_subset|max_tokens|update_freq|keep_best):' \
  "$RUN/config.yaml" 2>/dev/null | tr '\n' ' ' | sed 's/^/the run'"'"'s settings: /;s/$/\n/' \
  | tee -a "$OUT/job.log"

# 2. Training, stopped at the plateau or at --max-time. The stage's timeout leaves RESERVE s for
# the average, the snapshot and the packing.
if [ -n "$PLATEAU_N" ]; then
  echo "[train] SKIPPED: the criterion already holds at N = $PLATEAU_N in the copy" \
    | tee -a "$OUT/job.log"
  printf 'train\tskipped\t\t0\t\tjob.log\n' >>"$STAGES"
elif [ -d "$RUN" ]; then
  T=$((DEADLINE - $(date +%s) - OVERHEAD_S))
  [ "$DRY" = 1 ] && T=20
  [ "$T" -lt 30 ] && [ "$DRY" != 1 ] && T=30
  echo "training for ${T}s: --max-time $((ELAPSED + T))s (${ELAPSED}s before)" \
    | tee -a "$OUT/job.log"
  RESERVE=45
  stage train $((T + 90)) 5 job.log "$PY" "${HELPER[@]}" train "$RUN" -- \
    "$PY" -m fadat.cli train --resume "$RUN" --reset-optimizer --device "$DEVICE" \
    --max-time "$((ELAPSED + T))s" --no-progress-bar "${EXTRA[@]}"
fi

# 3. The criterion and the average: it may run up to 20 s past the deadline (RESERVE -20).
RESERVE=-20
AVG_END=""
if [ -d "$RUN" ] && chosen=$("$PY" "${HELPER[@]}" choose "$RUN" 2>&1); then
  mapfile -t files <<<"$chosen"
  echo "average: ${files[0]}" | tee -a "$OUT/job.log"
  AVG_END=${files[0]%% *}
  files=("${files[@]:1}")
  stage average 60 1 job.log "$PY" -m fadat.cli average --checkpoints "${files[@]}" \
    --output "$MODEL" --dtype float16
else
  echo "[average] SKIPPED: ${chosen:-no run}" | tee -a "$OUT/job.log"
  printf 'average\tskipped\t\t0\t\tjob.log\n' >>"$STAGES"
fi

# 4. The compact copy of the run as it ended, set back to continue on the CPU.
if [ -f "$RUN/checkpoint_last.pt" ]; then
  stage snapshot 60 1 job.log "$PY" -m fadat.cli snapshot --run "$RUN" --output "$COPY"
  [ -f "$COPY/config.yaml" ] && "$PY" "${HELPER[@]}" restore-config "$COPY" \
    "$WORK/original-config.yaml" | sed 's/^/config.yaml put back: /' | tee -a "$OUT/job.log"
fi

# 5. Both into <= 15 MiB parts (not stages: they get their time even past the deadline).
t0=$(date +%s)
status=ok rc=0
for pair in "model:$MODEL" "snapshot:$COPY"; do
  name=${pair%%:*} dir=${pair#*:}
  if [ -d "$dir" ]; then
    "$PY" "$ROOT/scripts/gpu/shards.py" split "$dir" "$OUT" --name "$name" --part-mib 15 2>&1 \
      | tee -a "$OUT/job.log"
    [ "${PIPESTATUS[0]}" != 0 ] && status=failed rc=1
  else
    echo "[pack] no $name to pack" | tee -a "$OUT/job.log"
    [ "$status" = ok ] && status=partial
  fi
done
printf 'pack\t%s\t%s\t%s\t\tmodel.manifest.json\n' "$status" "$rc" "$(($(date +%s) - t0))" \
  >>"$STAGES"

"$PY" "${HELPER[@]}" manifest "$OUT" --stages "$STAGES" --run "$RUN" --model "$MODEL" \
  --snapshot-name "$([ -d "$COPY" ] && basename "$COPY")" --start-update "$UPDATES" \
  --start-elapsed "$ELAPSED" ${AVG_END:+--average-end "$AVG_END"} --data "$DATA" \
  --commit "$COMMIT" --seconds "$(($(date +%s) - START))" --budget "$BUDGET_S" \
  $([ "$DRY" = 1 ] && echo --dry-run) 2>&1 | tee -a "$OUT/job.log"
list_out job-at
# the dry run's link at the toy's data path (the device's goes with the machine)
[ "$DRY" = 1 ] && [ -L "$RUN_DATA" ] && rm -f "$RUN_DATA"
rm -rf "$WORK" "$STAGES"
exit 0
