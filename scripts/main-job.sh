#!/usr/bin/env bash
# The main job on a fresh machine: set up, prepare the built-in bible-en-es corpus, NLL-pretrain a
# cpu-small DA-Transformer, fine-tune it with the FA-DAT fuzzy alignment objective, average the
# best checkpoints, translate the test set and print the evaluation table.
#
# Resumable: re-running continues an interrupted stage (fadat train --resume) and skips the
# stages that finished. Each stage stops at an update budget (the priority-1 experiment's N and M,
# recipes/experiments/bible-en-es.yaml, so that this run is its seed-1 pre-training and FA-DAT
# arm) or at a wall-time cap, whichever comes first. Budgets and CPU threads (0 = all cores) can
# be changed through the environment:
#   NLL_UPDATES=1400 NLL_TIME=60m FUZZY_UPDATES=240 FUZZY_TIME=15m THREADS=0 bash scripts/main-job.sh
#   bash scripts/main-job.sh --quick      # a few minutes end to end, for CI and a first look
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi

bash scripts/setup.sh
FADAT=.venv/bin/fadat
DATA=data/bible-en-es
if [ "$QUICK" = 1 ]; then
    RUNS=runs/main-quick
    NLL_TIME=${NLL_TIME:-90s}; FUZZY_TIME=${FUZZY_TIME:-30s}; SUBSET=${SUBSET:-100}
    NLL_UPDATES=${NLL_UPDATES:-1400}; FUZZY_UPDATES=${FUZZY_UPDATES:-240}
    EXTRA=(--validate-every 0 --valid-subset 50)
    BEST=1  # one validation at the end: one best checkpoint
else
    RUNS=runs/main
    NLL_TIME=${NLL_TIME:-60m}; FUZZY_TIME=${FUZZY_TIME:-15m}; SUBSET=${SUBSET:-0}
    NLL_UPDATES=${NLL_UPDATES:-1400}; FUZZY_UPDATES=${FUZZY_UPDATES:-240}
    EXTRA=()
    BEST=3  # NLL validates every 200 updates: the best three are near the end
fi
EXTRA+=(--threads "${THREADS:-0}")
mkdir -p "$RUNS"

echo "== prepare bible-en-es"
if [ ! -f "$DATA/meta.json" ]; then
    $FADAT prepare bible-en-es --output "$DATA"
fi

# train STAGE_DIR ARGS...: run a training stage once; resume it if it was interrupted.
train_stage() {
    local dir=$1; shift
    if [ -f "$dir/DONE" ]; then
        echo "   $dir finished earlier"
    elif [ -f "$dir/checkpoint_last.pt" ]; then
        $FADAT train --resume "$dir" && touch "$dir/DONE"
    else
        $FADAT train --run-dir "$dir" "$@" && touch "$dir/DONE"
    fi
}

echo "== NLL pre-training with glancing ($NLL_UPDATES updates or $NLL_TIME)"
train_stage "$RUNS/nll" --config configs/dat-cpu-small-nll.yaml --data "$DATA" --bf16 \
    --max-updates "$NLL_UPDATES" --max-time "$NLL_TIME" "${EXTRA[@]}"
[ -f "$RUNS/nll-model/config.json" ] || $FADAT average --run "$RUNS/nll" --best "$BEST" --output "$RUNS/nll-model"

echo "== FA-DAT fuzzy alignment fine-tuning ($FUZZY_UPDATES updates or $FUZZY_TIME)"
train_stage "$RUNS/fuzzy" --config configs/dat-cpu-small-fuzzy.yaml --data "$DATA" --bf16 \
    --init-from "$RUNS/nll-model" --max-updates "$FUZZY_UPDATES" --max-time "$FUZZY_TIME" \
    "${EXTRA[@]}"
[ -f "$RUNS/fadat-model/config.json" ] || $FADAT average --run "$RUNS/fuzzy" --best 1 --output "$RUNS/fadat-model"

echo "== translate the test set"
$FADAT translate --model "$RUNS/fadat-model" --input "$DATA/raw/test.src.txt" \
    --output "$RUNS/test.lookahead.txt" --strategy lookahead
head -n 3 "$DATA/raw/test.src.txt" | paste - <(head -n 3 "$RUNS/test.lookahead.txt")

echo "== evaluate (test split)"
$FADAT evaluate --model "$RUNS/nll-model" "$RUNS/fadat-model" --data "$DATA" --split test \
    --strategies greedy,lookahead,joint-viterbi --subset "$SUBSET" --bootstrap 0 \
    --latency-subset 200 --report "$RUNS/report.json"
