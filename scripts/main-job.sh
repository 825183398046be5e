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
#
# --quick first runs a learning check that fails the job unless training works: a small
# DA-Transformer on the deterministic synthetic corpus (fadat prepare synth-multimodal with
# P = Q = 0: one valid translation per source) must reach LEARN_MIN_BLEU valid BLEU within
# LEARN_UPDATES updates (docs/results/main-job.md). The Bible stages that follow are a
# smoke test of every stage at a budget far too small to translate: their BLEU is near 0.
#   LEARN_UPDATES=300 LEARN_MIN_BLEU=80 bash scripts/main-job.sh --quick
#
# TEACHER=DIR (default: none) trains on sequence-level distilled data: an AT model directory
# (config.json, model.safetensors, spm.model) in the prepared data's vocabulary re-translates the
# training set once the data are prepared (fadat distill, beam 5; 21 minutes on one thread of an
# AMD Zen 3 with CTranslate2), and the NLL and FA-DAT stages train on its targets; valid and test
# keep the real references. Its data and runs carry the teacher's name and the first 8 hex digits
# of its weights' SHA-256 (data/bible-en-es-kd-NAME-HASH, runs/main-kd-NAME-HASH), so that runs
# with and without a teacher, or with another one, never resume each other's. --quick distils
# only the first QUICK_KD_PAIRS training pairs (kd300 in the names).
#   TEACHER=models/bible-en-es-at-cpu-small THREADS=1 bash scripts/main-job.sh
#   TEACHER=models/bible-en-es-at-cpu-small QUICK_KD_PAIRS=300 bash scripts/main-job.sh --quick
# KD_BEAM=K (default 5) distils with beam K instead (1 = greedy search: about 3x faster with
# CTranslate2; the data and runs names then carry "beamK").
#
# DESIGN=NAME (default: none, 3 encoder + 3 decoder layers at lambda = 4) trains another design of
# the speed sweep (docs/speed-sweep.md), configs/dat-cpu-small-NAME-nll.yaml: 5x1 and 4x2 are
# the deep-encoder, shallow-decoder DATs, range and *-range train lambda over a range. Its runs
# carry the name (runs/main-NAME...); the FA-DAT stage keeps the NLL model's design.
#   DESIGN=5x1 THREADS=1 bash scripts/main-job.sh
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; fi

# stage TEXT: a stage's heading with the seconds since the job started.
stage() { echo "== $* [${SECONDS} s]"; }

# KD: what the distilled data and runs are named after (checked before the set-up's minutes).
KD=""
if [ -n "${TEACHER:-}" ]; then
    if [ ! -f "$TEACHER/model.safetensors" ]; then
        echo "main-job: TEACHER=$TEACHER holds no model.safetensors (a fadat AT model directory)" >&2
        exit 2
    fi
    QUICK_KD_PAIRS=${QUICK_KD_PAIRS:-300}
    KD_BEAM=${KD_BEAM:-5}
    if ! [[ "$KD_BEAM" =~ ^[1-9][0-9]*$ ]]; then
        echo "main-job: KD_BEAM=$KD_BEAM: the beam size must be a positive integer" >&2
        exit 2
    fi
    KD=kd$([ "$QUICK" = 1 ] && echo "$QUICK_KD_PAIRS" || true)
    if [ "$KD_BEAM" != 5 ]; then KD+=-beam$KD_BEAM; fi
    KD+=-$(basename "$(cd "$TEACHER" && pwd -P)")-$(sha256sum "$TEACHER/model.safetensors" | cut -c1-8)
fi

# NLL_CONFIG: the design's NLL pre-training recipe (checked before the set-up's minutes).
NLL_CONFIG=configs/dat-cpu-small-nll.yaml
if [ -n "${DESIGN:-}" ]; then
    NLL_CONFIG=configs/dat-cpu-small-$DESIGN-nll.yaml
    if [[ "$DESIGN" == */* ]] || [ ! -f "$NLL_CONFIG" ]; then
        designs=$(cd configs && ls dat-cpu-small-*-nll.yaml | sed 's/^dat-cpu-small-//; s/-nll.yaml$//')
        echo "main-job: DESIGN=$DESIGN: no configs/dat-cpu-small-$DESIGN-nll.yaml (designs:" \
            $designs")" >&2
        exit 2
    fi
fi

bash scripts/setup.sh
FADAT=.venv/bin/fadat
DATA=data/bible-en-es
if [ "$QUICK" = 1 ]; then
    RUNS=runs/main-quick
    # A smoke test of the Bible stages (the learning check is what shows that training learns):
    # budgets, test sentences and latency sentences kept small for CI's 20 minutes.
    NLL_TIME=${NLL_TIME:-45s}; FUZZY_TIME=${FUZZY_TIME:-20s}; SUBSET=${SUBSET:-50}
    NLL_UPDATES=${NLL_UPDATES:-1400}; FUZZY_UPDATES=${FUZZY_UPDATES:-240}
    EXTRA=(--validate-every 0 --valid-subset 50)
    BEST=1  # one validation at the end: one best checkpoint
    LATENCY_SUBSET=10; WARMUP=2
else
    RUNS=runs/main
    NLL_TIME=${NLL_TIME:-60m}; FUZZY_TIME=${FUZZY_TIME:-15m}; SUBSET=${SUBSET:-0}
    NLL_UPDATES=${NLL_UPDATES:-1400}; FUZZY_UPDATES=${FUZZY_UPDATES:-240}
    EXTRA=()
    LATENCY_SUBSET=200; WARMUP=20
    BEST=3  # NLL validates every 200 updates: the best three are near the end
fi
EXTRA+=(--threads "${THREADS:-0}")
# The learning check does not depend on the Bible data: one run of it, with or without a teacher,
# of any design.
LEARN_RUN=$RUNS/learn
if [ -n "${DESIGN:-}" ]; then RUNS=$RUNS-$DESIGN; fi
# TRAIN_DATA: what the NLL and FA-DAT stages train on; the evaluation always reads DATA.
TRAIN_DATA=$DATA; ON=""; NLL_MODEL=nll-model; FADAT_MODEL=fadat-model
if [ -n "$KD" ]; then
    TRAIN_DATA=$DATA-$KD; RUNS=$RUNS-$KD; ON=", on $TRAIN_DATA"
    NLL_MODEL=nll-kd-model; FADAT_MODEL=fadat-kd-model  # their rows of the final table
fi
mkdir -p "$RUNS"

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

LEARN_BLEU="(not run)"
LEARN_UPDATES=${LEARN_UPDATES:-300}; LEARN_MIN_BLEU=${LEARN_MIN_BLEU:-80}
if [ "$QUICK" = 1 ] && [[ "$($FADAT prepare --help)" != *synth-multimodal* ]]; then
    # The corpus comes with `fadat prepare synth-multimodal`; a fadat without it cannot check.
    echo "== LEARNING CHECK NOT RUN: this fadat has no synth-multimodal corpus" >&2
elif [ "$QUICK" = 1 ]; then
    # Measured (docs/results/main-job.md, "The quick run's learning check"): valid BLEU 96.4-99.1 after
    # 300 updates over seeds 1-4, about one CPU-minute; an untrained model scores about 0.
    LEARN_DATA=data/synth-det
    LEARN_TIME=${LEARN_TIME:-20m}  # only against a hang: the check is defined by updates
    stage "learning check: synthetic deterministic corpus, $LEARN_UPDATES updates," \
        "must reach valid BLEU >= $LEARN_MIN_BLEU"
    if [ ! -f "$LEARN_DATA/meta.json" ]; then
        $FADAT prepare synth-multimodal --output "$LEARN_DATA" --swap-prob 0 --synonym-prob 0 \
            --source-types 60 --max-words 10 --train-size 20000
    fi
    train_stage "$LEARN_RUN" --config configs/synth-dat-nll.yaml --data "$LEARN_DATA" --bf16 \
        --threads 1 --max-updates "$LEARN_UPDATES" --max-time "$LEARN_TIME" \
        --validate-every 100 --valid-subset 200
    # The verdict goes to stderr; the script exits 1 (and so the job) when the check fails.
    LEARN_BLEU=$(.venv/bin/python scripts/learning_check.py "$LEARN_RUN" "$LEARN_UPDATES" \
        "$LEARN_MIN_BLEU")
fi

stage "prepare bible-en-es"
if [ ! -f "$DATA/meta.json" ]; then
    $FADAT prepare bible-en-es --output "$DATA"
fi

if [ -n "$KD" ]; then
    KD_ARGS=(--beam "$KD_BEAM" --engine auto)
    # fadat distill takes a thread count: THREADS=0 (all cores) is the cores this job may use.
    KD_ARGS+=(--threads "$([ "${THREADS:-0}" = 0 ] && nproc || echo "$THREADS")")
    if [ "$QUICK" = 1 ]; then KD_ARGS+=(--max-pairs "$QUICK_KD_PAIRS"); fi
    stage "distil the training set with the teacher $TEACHER (beam $KD_BEAM) into $TRAIN_DATA"
    KD_START=$SECONDS
    # Prints the distillation statistics: targets changed, length ratio, BLEU against the references.
    $FADAT distill --model "$TEACHER" --data "$DATA" --output "$TRAIN_DATA" "${KD_ARGS[@]}"
    echo "   distillation stage: $((SECONDS - KD_START)) s"
fi

stage "NLL pre-training with glancing, $NLL_CONFIG ($NLL_UPDATES updates or $NLL_TIME)$ON"
train_stage "$RUNS/nll" --config "$NLL_CONFIG" --data "$TRAIN_DATA" --bf16 \
    --max-updates "$NLL_UPDATES" --max-time "$NLL_TIME" "${EXTRA[@]}"
[ -f "$RUNS/$NLL_MODEL/config.json" ] || $FADAT average --run "$RUNS/nll" --best "$BEST" --output "$RUNS/$NLL_MODEL"

stage "FA-DAT fuzzy alignment fine-tuning ($FUZZY_UPDATES updates or $FUZZY_TIME)$ON"
train_stage "$RUNS/fuzzy" --config configs/dat-cpu-small-fuzzy.yaml --data "$TRAIN_DATA" --bf16 \
    --init-from "$RUNS/$NLL_MODEL" --max-updates "$FUZZY_UPDATES" --max-time "$FUZZY_TIME" \
    "${EXTRA[@]}"
[ -f "$RUNS/$FADAT_MODEL/config.json" ] || $FADAT average --run "$RUNS/fuzzy" --best 1 --output "$RUNS/$FADAT_MODEL"

stage "translate the test set"
TEST_INPUT=$DATA/raw/test.src.txt
if [ "$SUBSET" -gt 0 ]; then  # the first SUBSET sentences, as the evaluation below
    TEST_INPUT=$RUNS/test.src.first$SUBSET.txt
    head -n "$SUBSET" "$DATA/raw/test.src.txt" >"$TEST_INPUT"
fi
$FADAT translate --model "$RUNS/$FADAT_MODEL" --input "$TEST_INPUT" \
    --output "$RUNS/test.lookahead.txt" --strategy lookahead --threads "${THREADS:-0}"
head -n 3 "$DATA/raw/test.src.txt" | paste - <(head -n 3 "$RUNS/test.lookahead.txt")

stage "evaluate (test split)"
$FADAT evaluate --model "$RUNS/$NLL_MODEL" "$RUNS/$FADAT_MODEL" --data "$DATA" --split test \
    --strategies greedy,lookahead,joint-viterbi --subset "$SUBSET" --bootstrap 0 \
    --latency-subset "$LATENCY_SUBSET" --warmup "$WARMUP" --report "$RUNS/report.json" \
    --threads "${THREADS:-0}"
if [ -n "$KD" ]; then
    echo "$NLL_MODEL, $FADAT_MODEL: trained on $TRAIN_DATA, training targets translated by" \
        "$TEACHER$([ "$QUICK" = 1 ] && echo " (its first $QUICK_KD_PAIRS pairs only)" || true);" \
        "scored against the real test references"
fi
if [ "$QUICK" = 1 ]; then
    cat <<END_OF_NOTE

What these quick-run numbers mean: the Bible models above trained for at most $NLL_TIME (NLL)
and $FUZZY_TIME (FA-DAT fine-tuning), against 60 + 15 minutes in the full main job, and were
scored on $SUBSET test sentences: BLEU near 0 is expected, and these stages only show that
prepare, train, average, translate and evaluate run end to end. That training learns is shown
by the learning check: valid BLEU $LEARN_BLEU on the synthetic corpus after $LEARN_UPDATES
updates (required: >= $LEARN_MIN_BLEU). The full main job reaches about 12 BLEU on this test set.
END_OF_NOTE
fi
echo "== done [${SECONDS} s]"
