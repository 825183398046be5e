#!/usr/bin/env bash
# Translate a test set with every decoder of a model in fp32 and write one file per decoder,
# each line 'SCORE<TAB>TEXT', for the identical-outputs check of a refactor (issue 33):
#   bash scripts/decoder_outputs.sh MODEL SRC OUTDIR        # with the code you want to check
#   diff -r OUTDIR_BEFORE OUTDIR_AFTER && echo identical
# The fadat imported is the one on PYTHONPATH / the current directory (run it from a frozen
# worktree for the "before" side). Sampling uses --seed 1.
set -euo pipefail
model=$1; src=$2; out=$3
py=${PYTHON:-python}
mkdir -p "$out"
for strategy in greedy lookahead viterbi joint-viterbi sample beam; do
    extra=()
    [[ $strategy == sample ]] && extra=(--seed 1)
    start=$(date +%s)
    "$py" -m fadat.cli translate --model "$model" --input "$src" --output "$out/$strategy.txt" \
        --strategy "$strategy" --print-scores --precision fp32 --threads 1 --no-progress "${extra[@]}"
    echo "$strategy: $(wc -l < "$out/$strategy.txt") lines, $(( $(date +%s) - start )) s"
done
