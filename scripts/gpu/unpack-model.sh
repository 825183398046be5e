#!/usr/bin/env bash
# Run HERE after scripts/gpu/job-train.sh or job-sweep.sh came back: join the model parts that
# the device tool copied (FILES_DIR: its files_at folder, holding model.manifest.json and
# model.tar.partNN), check every part's and file's SHA-256 (scripts/gpu/shards.py), then check
# that the model loads and translates (`fadat translate` on the first lines of the bible test
# set, greedy and lookahead).
#
# Usage: scripts/gpu/unpack-model.sh FILES_DIR [DEST_PARENT]   (default DEST_PARENT: runs/gpu)
# Prints the model directory; exit 2 on a missing or damaged part, 1 if the model does not load
# or translates nothing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/gpu/unpack-model.sh FILES_DIR [DEST_PARENT]" >&2
  exit 2
fi
FILES=$1
DEST=${2:-$ROOT/runs/gpu}
source "$ROOT/scripts/gpu/common.sh"
PY=${PY:-$(local_python)}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
model=$("$PY" "$ROOT/scripts/gpu/shards.py" join "$FILES" "$DEST" --name model)
echo "model directory: $model"
"$PY" - "$model" <<'PY'
import json
import sys
from pathlib import Path

meta = json.loads((Path(sys.argv[1]) / "config.json").read_text(encoding="utf-8"))
c = meta["config"]
print(
    f"{meta['model_type']}: d={c['d_model']} layers={c['encoder_layers']}+{c['decoder_layers']} "
    f"λ={c.get('upsample_ratio')}"
    + (f" (trained over {c['upsample_ratio_range']})" if c.get("upsample_ratio_range") else "")
    + f" V={c['vocab_size']} weights {meta.get('weights_dtype')}; "
    f"averaged {len(meta.get('training', {}).get('averaged', []))} checkpoints, valid BLEU "
    f"{[round(b, 2) for b in meta.get('training', {}).get('bleu', [])]}"
)
PY
src=$ROOT/tests/data/bible-en-es-test-50.en
for strategy in greedy lookahead; do
  out=$(head -n 3 "$src" | "$PY" -m fadat.cli translate --model "$model" --strategy "$strategy" \
    --device cpu)
  echo "$strategy:"
  echo "$out"
  if [ "$(printf '%s\n' "$out" | grep -c .)" -ne 3 ]; then
    echo "unpack-model.sh: $model translated 3 lines into $(printf '%s\n' "$out" | grep -c .)" \
      "non-empty lines" >&2
    exit 1
  fi
done
