#!/usr/bin/env bash
# Run HERE (the CPU machine with PyPI), in the repository root, before a GPU session (issue 31;
# docs/gpu-session.md). Fills two git-ignored folders that the device tool carries:
#   .whl/    wheels for Python 3.12 manylinux x86_64 of what `pip install --no-deps -e .` and the
#            test suite import that the device image lacks (/work/.library/device/KINDS.md:
#            sacremoses, pysword, and fastapi's stack for tests/test_serve.py). ctranslate2 (its
#            CUDA wheel is too large to travel), kenlm (no wheel) and selenium (no browser there)
#            stay behind: their tests skip.
#   .carry/  the 4k-vocabulary bible-en-es data (`fadat prepare bible-en-es --vocab-size 4000`)
#            and, for the latency comparison, the plateau AT (cpu-small, the released DAT's size)
#            stored as fp16.
# Adds both to .git/info/exclude and prints what will travel.
#
# Usage: scripts/gpu/prepare.sh [--data DIR] [--at MODEL_DIR | --no-at] [--python PY] [--dry-run]
#   --dry-run: everything but the download (checks the paths and prints the sizes).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

DATA=/work/data/bible-en-es-4k
AT=/work/runs/experiments/bible-en-es-plateau/models/at-s1
PY=${PYTHON:-/work/main/.venv/bin/python}
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=$2; shift 2 ;;
    --at) AT=$2; shift 2 ;;
    --no-at) AT=""; shift ;;
    --python) PY=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# The versions this project's CPU venv runs (so both machines run the same code); each one's
# Requires-Dist were checked against the image's package list (KINDS.md): anyio, click, h11,
# joblib, regex, tqdm and annotated-doc are there already; fastapi needs opentelemetry-api, which
# is not, and pydantic typing_extensions >= 4.16, newer than the image may hold.
WHEELS=(
  sacremoses==0.2.0
  fastapi==0.165.0
  starlette==1.10.0
  pydantic==2.14.4
  pydantic_core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  uvicorn==0.54.0
  opentelemetry-api==1.45.2
  typing_extensions==4.16.0
)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for pattern in /.whl/ /.carry/; do
  grep -qxF "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >>"$exclude"
done

if [ ! -f "$DATA/meta.json" ]; then
  echo "prepare.sh: $DATA is not a prepared dataset (no meta.json); make it with" >&2
  echo "  fadat prepare bible-en-es --vocab-size 4000 --output $DATA" >&2
  exit 2
fi
if [ -n "$AT" ] && [ ! -f "$AT/config.json" ]; then
  echo "prepare.sh: $AT is not a model directory (no config.json); give --at DIR or --no-at" >&2
  exit 2
fi

if [ "$DRY" = 0 ]; then
  rm -rf .whl
  mkdir -p .whl
  # pip matches each manylinux tag exactly: name the usual ones (device README).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  # pysword is published as a source archive only; it is pure Python, so a wheel built here
  # installs there.
  "$PY" -m pip wheel -q --no-deps -w .whl pysword==0.2.8 2>&1 | grep -v "^WARNING: Location" || true
  for w in "${WHEELS[@]}" pysword==0.2.8; do
    stem=$(echo "${w%%==*}" | tr - _)
    if ! ls .whl | grep -qi "^${stem}-${w##*==}-"; then
      echo "prepare.sh: no wheel for $w in .whl" >&2
      exit 1
    fi
  done
fi

rm -rf .carry
mkdir -p .carry
name=$(basename "$DATA")
# raw/ holds the untokenized text the data was made from; evaluate reads the test references
# from it, so it travels too.
cp -r "$DATA" ".carry/$name"
if [ -n "$AT" ]; then
  # fp16 halves the AT's 32 MB; loading casts back to fp32 (fadat.models.directory).
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} "$PY" - "$AT" .carry/at-cpu-small <<'PY'
import json
import sys
from pathlib import Path

from fadat.models.directory import load_model, spm_model_path

src, dst = sys.argv[1], sys.argv[2]
model, _ = load_model(src)
meta = json.loads((Path(src) / "config.json").read_text(encoding="utf-8"))
reserved = {"model_type", "format_version", "config", "spm_model", "weights_dtype"}
extra = {k: v for k, v in meta.items() if k not in reserved}  # data licence, training record
model.save_pretrained(dst, spm_model=spm_model_path(src), extra=extra, weights_dtype="float16")
print(f"AT {src} -> {dst} (fp16)")
PY
fi

echo "what travels besides the tracked files:"
du -sh .whl .carry/* 2>/dev/null || true
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null \
  | tail -1 | cut -f1)
carried=$(du -sb .whl .carry 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((tracked + ${untracked:-0} + carried))
echo "tracked $((tracked / 1024)) KiB + untracked-not-ignored $((${untracked:-0} / 1024)) KiB" \
  "+ carried (.whl, .carry) $((carried / 1024)) KiB = $((total / 1024 / 1024)) MiB of 64 MiB"
if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
  echo "prepare.sh: over the device's 64 MiB limit" >&2
  exit 1
fi
