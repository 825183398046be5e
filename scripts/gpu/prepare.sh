#!/usr/bin/env bash
# Run HERE (a CPU machine with PyPI and the Debian SWORD packages of scripts/setup.sh), in a clone
# of this repository, before a GPU session (issue 47; docs/gpu-session.md). One command makes
# everything scripts/gpu/job.sh needs that git does not hold, in two git-ignored folders that the
# device tool carries:
#   .whl/    wheels for Python 3.12 manylinux x86_64 of what fadat imports and the device image
#            lacks (/work/.library/device/KINDS.md's package list: only sacremoses; its own
#            needs, click, joblib, regex and tqdm, are there). torch is there: never carried.
#   .carry/  `fadat prepare bible-en-es` with the released DAT's sentencepiece model (its 4k
#            vocabulary) into .carry/bible-en-es, 6 MB: the test sentences and references in its
#            raw/ folder, which `fadat evaluate` reads; and the speed sweep's own dataset (the
#            `data` of recipes/experiments/bible-en-es-speed-sweep.yaml, bible-en-es-4k-kd: the
#            8k training set distilled by the AT, in the 4k vocabulary), ~6 MB, for
#            scripts/gpu/job-sweep.sh: copied from DATA_ROOT/<dataset> (the directory the CPU
#            sweep trains on) into .carry/<dataset>, with its training files' digest in
#            .carry/<dataset>.json, which job-sweep.sh checks before it trains (sweep_design.py
#            carry-data). Where DATA_ROOT lacks it, it is built there first by
#            recipes/experiment.py's own make_dataset (`fadat distill` by the committed AT
#            models/bible-en-es-at-cpu-small: about 20 minutes on one CPU thread); in a checkout
#            without that AT it cannot be built: a line says so and the other jobs' data is made.
# The models travel as tracked files: the released DAT models/bible-en-es-fadat-cpu-small and the
# released AT models/bible-en-es-at-cpu-small (job.sh skips the AT rows in a checkout without
# it). Prints what travels against the tool's 64 MiB, and the `run` call to make.
#
# Usage: scripts/gpu/prepare.sh [--python PY] [--no-download] [--data-root DIR] [--no-sweep-data]
#   PY (or $PYTHON): an interpreter with fadat's dependencies (default .venv/bin/python, else the
#   main checkout's when this is a git worktree, else python3); fadat itself is taken from this
#   checkout.
#   --no-download: keep the .whl folder there is (no network).
#   --data-root DIR: where the sweep's datasets are (experiment.py's --data-root; default data).
#   --no-sweep-data: no .carry/<the sweep's dataset> (only job-sweep.sh reads it; ~6 MB less).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PY=${PYTHON:-}
DOWNLOAD=1
SWEEP_DATA=1
DATA_ROOT=data
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --no-download) DOWNLOAD=0; shift ;;
    --data-root) DATA_ROOT=$2; shift 2 ;;
    --no-sweep-data) SWEEP_DATA=0; shift ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$PY" ]; then
  ROOT=$PWD
  source scripts/gpu/common.sh
  PY=$(local_python)
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

DAT=models/bible-en-es-fadat-cpu-small
AT=models/bible-en-es-at-cpu-small
DATA=.carry/bible-en-es
# The version this project's CPU venv runs (so both machines run the same code).
WHEELS=(sacremoses==0.2.0)

for dir in .whl .carry; do
  if ! git check-ignore -q "$dir/x"; then
    echo "prepare.sh: $dir is not ignored by git (.gitignore lists /.whl/ and /.carry/)" >&2
    exit 2
  fi
done

t0=$(date +%s)
if [ "$DOWNLOAD" = 1 ]; then
  rm -rf .whl
  mkdir -p .whl
  # pip matches each manylinux tag exactly: name the usual ones (device README).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
fi
for w in "${WHEELS[@]}"; do
  if ! ls .whl 2>/dev/null | grep -qi "^${w%%==*}-${w##*==}-"; then
    echo "prepare.sh: no wheel for $w in .whl" >&2
    exit 1
  fi
done

# A second run finds the same fingerprint in meta.json and does nothing; --force replaces a
# dataset built from other inputs.
mkdir -p .carry
"$PY" -m fadat.cli prepare bible-en-es --output "$DATA" --spm-model "$DAT/spm.model" --force
# what an earlier prepare.sh carried for the retired AT-continuation job (its 8k data): no job
# reads it, and it would travel
rm -rf .carry/bible-en-es-8k
SWEEP_SET=$("$PY" scripts/gpu/sweep_design.py dataset)
if [ "$SWEEP_DATA" = 1 ]; then
  # the speed sweep's dataset, as its CPU runs train on it (a copy; built first where missing)
  "$PY" scripts/gpu/sweep_design.py carry-data --data-root "$DATA_ROOT" --carry .carry
else
  rm -rf ".carry/$SWEEP_SET" ".carry/$SWEEP_SET.json"
fi
echo "prepared in $(($(date +%s) - t0))s"

if [ -f "$AT/config.json" ]; then
  echo "AT: $AT (tracked; the latency stage compares against it)"
else
  echo "AT: $AT is not in this checkout: the job skips the AT rows of the latency stage"
fi

# What the device tool sends: tracked files, untracked files git does not ignore, the carried
# folders (README: 64 MiB in all).
bytes() { xargs -0 -r du -cb 2>/dev/null | awk '$2 == "total" {s += $1} END {print s + 0}'; }
tracked=$(git ls-files -z | bytes)
untracked=$(git ls-files -z --others --exclude-standard | bytes)
carried=$(du -sb .whl .carry | awk '{s += $1} END {print s + 0}')
total=$((tracked + untracked + carried))
du -sh .whl .carry/*
awk -v t="$tracked" -v u="$untracked" -v c="$carried" 'BEGIN {
  m = 1048576
  printf "carried: tracked %.1f MiB + untracked %.1f MiB + .whl and .carry %.1f MiB = %.1f MiB of 64 MiB\n",
    t / m, u / m, c / m, (t + u + c) / m }'
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "prepare.sh: over the device tool's 64 MiB" >&2
  exit 1
fi

commit=$(git rev-parse HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -1)
[ -n "$dirty" ] && echo "note: the checkout has uncommitted changes; they travel too"
cat <<EOF
The device call (the tool sends the checkout the session started in: this one must be it):
  run(command="COMMIT=$commit bash scripts/gpu/job.sh",
      carry=[".whl", ".carry"], timeout_s=540)
EOF
if [ -f ".carry/$SWEEP_SET.json" ]; then
  cat <<EOF
or, one design of the speed sweep on its dataset .carry/$SWEEP_SET (docs/gpu-session.md):
  run(command="COMMIT=$commit bash scripts/gpu/job-sweep.sh DESIGN",
      carry=[".whl", ".carry"], timeout_s=600)
EOF
else
  echo "(not scripts/gpu/job-sweep.sh: .carry holds no $SWEEP_SET, the sweep's dataset)"
fi
