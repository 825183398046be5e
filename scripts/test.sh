#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# two worker processes (pytest-xdist): many tests wait on subprocesses and sockets; on an AVX2
# Zen 3 the suite took 14.8 min in one process and about half that in two
.venv/bin/python -m pytest -q -n 2 --durations=15 "$@"
