#!/usr/bin/env bash
# Set up a fresh Debian machine for fadat: corpus packages, the virtual environment .venv in the
# repository root, CPU torch when no torch is present, and fadat with its dev extras (which include
# the docs extra: the test suite builds the documentation site).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# Debian packages of the built-in corpora (bible-en-es). Installed only when missing.
need=()
for pkg in sword-text-web sword-text-sparv sword-text-kjv; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]}"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q "${need[@]}"
fi

# Headless Chromium and its driver for the browser test of the web page (tests/test_serve.py);
# installed only when missing. Not fatal: without them that one test skips and says why.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "setup: installing chromium chromium-driver (browser test of fadat serve)"
    { $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium chromium-driver; } \
        || echo "setup: could not install chromium; the browser test will skip"
fi

# A C++ compiler for the kenlm module of the lm extra (in the dev extras: pip builds it from its
# source, with cmake from PyPI); installed only when missing.
if ! command -v c++ >/dev/null; then
    echo "setup: installing g++ (the kenlm module of the lm extra compiles KenLM)"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q g++
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
PY=.venv/bin/python
# torch first and explicitly: an unpinned requirement would pull a multi-GB CUDA build.
if ! $PY -c "import torch" 2>/dev/null; then
    $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[dev]"
