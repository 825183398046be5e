"""Fixtures shared by several test modules. Shared helpers that are not fixtures live in plain
modules beside the tests: ``brute_dag`` (brute force over DAG paths), ``copy_task`` (the
training tests' corpus); ``test_translate`` holds the tiny random models."""

from __future__ import annotations

from pathlib import Path

import pytest
from copy_task import prepare_copy_data
from test_translate import random_models


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Randomly initialised tiny DAT and AT model directories and their sentencepiece model
    (``{"dat", "at", "spm"}``; :func:`test_translate.random_models`)."""
    return random_models(str(tmp_path_factory.getbasetemp() / "random-models"))


@pytest.fixture(scope="session")
def dat_onnx(models, tmp_path_factory) -> Path:
    """``DIR/fp32``: the tiny random DAT of :func:`models` exported for ONNX Runtime by the
    Python verb (``fadat.translation.export.export(..., format="onnx")``: fp32, fused
    attention); ``DIR/int8``: its int8 copy (``quantize_export``). Returns DIR. Once per session
    (per xdist worker): the export takes ≈ 20 s of CPU time. Read-only; skips the test where
    onnxruntime or onnxscript is missing."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from fadat.translation.export import export
    from fadat.translation.onnx_export import quantize_export

    root = tmp_path_factory.getbasetemp() / "random-dat-onnx"
    quantize_export(export(models["dat"], root / "fp32", format="onnx"), root / "int8")
    return root


@pytest.fixture(scope="module")
def copy_data(tmp_path_factory) -> Path:
    """No word twice in a row: DAG decoders merge consecutive equal tokens
    (docs/reference-behaviour.md, "Decoding"), so only such sentences can be reproduced exactly
    by a DAT."""
    return prepare_copy_data(tmp_path_factory.mktemp("copy"), repeats=False)


@pytest.fixture(scope="module")
def copy_data_repeats(tmp_path_factory) -> Path:
    """Words drawn independently. The tiny AT model learns this copy task within 300 updates
    but not the no-repeat one (measured: BLEU 97–100 vs ≈2 at 300 updates, 3 seeds each; the
    no-repeat language model is a strong local optimum for a 1-layer d=32 decoder)."""
    return prepare_copy_data(tmp_path_factory.mktemp("copy_rep"), repeats=True)
