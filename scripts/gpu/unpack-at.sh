#!/usr/bin/env bash
# Run HERE after scripts/gpu/job-at.sh came back: join and check (scripts/gpu/shards.py: every
# part's and file's SHA-256) the two things it returns from FILES_DIR (the device tool's
# files_at folder):
#   - the compact copy of the AT's run as it ended (snapshot.manifest.json, snapshot.tar.partNN)
#     into SNAPSHOT_DIR (default snapshots/bible-en-es-at-plateau), replacing the copy there once
#     the new one is whole; the CPU continues it with `fadat train --resume SNAPSHOT_DIR
#     --reset-optimizer` (or experiment.py run, after linking it as the `at` stage's run);
#   - the averaged fp16 model (model.manifest.json, model.tar.partNN) into MODEL_DIR, which must
#     not exist, checked by translating the first 3 lines of the bible test set (greedy).
# Prints manifest.json's summary of the criterion.
#
# Usage: scripts/gpu/unpack-at.sh FILES_DIR MODEL_DIR [SNAPSHOT_DIR]
# Exit 2 on a missing or damaged part or an existing MODEL_DIR, 1 if the model does not translate.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: scripts/gpu/unpack-at.sh FILES_DIR MODEL_DIR [SNAPSHOT_DIR]" >&2
  exit 2
fi
FILES=$1
MODEL=$2
SNAP=${3:-$ROOT/snapshots/bible-en-es-at-plateau}
source "$ROOT/scripts/gpu/common.sh"
PY=${PY:-$(local_python)}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -e "$MODEL" ]; then
  echo "unpack-at.sh: $MODEL exists; remove it or choose another MODEL_DIR" >&2
  exit 2
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/unpack-at.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/model" "$TMP/snapshot"
model=$("$PY" "$ROOT/scripts/gpu/shards.py" join "$FILES" "$TMP/model" --name model) || exit 2
copy=$("$PY" "$ROOT/scripts/gpu/shards.py" join "$FILES" "$TMP/snapshot" --name snapshot) || exit 2

src=$ROOT/tests/data/bible-en-es-test-50.en
out=$(head -n 3 "$src" | "$PY" -m fadat.cli translate --model "$model" --device cpu)
echo "greedy:"
echo "$out"
if [ "$(printf '%s\n' "$out" | grep -c .)" -ne 3 ]; then
  echo "unpack-at.sh: the model translated 3 lines into $(printf '%s\n' "$out" | grep -c .)" \
    "non-empty lines" >&2
  exit 1
fi

mkdir -p "$(dirname "$MODEL")" "$(dirname "$SNAP")"
mv "$model" "$MODEL"
rm -rf "$SNAP"
mv "$copy" "$SNAP"
echo "model: $MODEL"
echo "snapshot: $SNAP (continue: fadat train --resume $SNAP --reset-optimizer)"
if [ -f "$FILES/manifest.json" ]; then
  "$PY" - "$FILES/manifest.json" <<'PY'
import json
import sys

m = json.load(open(sys.argv[1], encoding="utf-8"))
p, t = m["plateau"], m["training"]
held = f"held at N = {p['n']}" if p["held"] else "not held"
print(
    f"update {m['start']['update']} -> {t['updates']}; plateau {held}; best valid BLEU "
    f"{m['best_bleu']} at {m['best_update']}; {len(m['model']['averaged'])} checkpoints "
    f"validated at <= {m['model']['up_to_update']} averaged"
)
PY
fi
