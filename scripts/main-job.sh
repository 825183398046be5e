#!/usr/bin/env bash
# The main job: set up, prepare the built-in bible-en-es corpus, train, translate, score.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fadat prepare bible-en-es --output data/bible-en-es
