"""Fixtures shared by several test modules. Shared helpers that are not fixtures live in plain
modules beside the tests: ``brute_dag`` (brute force over DAG paths), ``copy_task`` (the
training tests' corpus); ``test_translate`` holds the tiny random models."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from copy_task import prepare_copy_data
from test_translate import copy_task_model, random_models


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], dict[str, Path]]
) -> dict[str, Path]:
    """The paths that ``build(root)`` wrote, built once per test run in ``root``, a folder
    ``name`` of the run's temporary folder.

    Under pytest-xdist the workers share that folder (the parent of each worker's own base
    folder): the first worker to ask builds while holding an exclusive ``fcntl.flock`` on
    ``name.lock`` beside it, the others wait for the lock and read the paths it recorded in
    ``name.json``. Without xdist it is built once per session. What ``build`` writes is
    read-only to the tests (copy it to change it). A build that raises records nothing: the
    next test to ask builds again.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    record = base / f"{name}.json"
    with open(base / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not record.is_file():
            paths = build(base / name)
            record.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return {k: Path(v) for k, v in json.loads(record.read_text()).items()}


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Randomly initialised tiny DAT and AT model directories and their sentencepiece model
    (``{"dat", "at", "spm"}``; :func:`test_translate.random_models`)."""
    return random_models(str(tmp_path_factory.getbasetemp() / "random-models"))


@pytest.fixture(scope="session")
def dat_onnx(tmp_path_factory) -> dict[str, Path]:
    """A tiny random DAT (``"dat"``, :func:`test_translate.random_models`, seeded: the DAT that
    every call builds) exported for ONNX Runtime by the Python verb
    (``fadat.translation.export.export(..., format="onnx")``: fp32, fused attention) into
    ``DIR/fp32``, with its int8 copy (``quantize_export``) in ``DIR/int8`` (``"dir"``: DIR).
    Once per test run (:func:`once_per_run`): the export takes ≈ 20 s of CPU time. Skips the
    test where onnxruntime or onnxscript is missing."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from fadat.translation.export import export
    from fadat.translation.onnx_export import quantize_export

    def build(root: Path) -> dict[str, Path]:
        dat = random_models(str(root / "random"))["dat"]
        quantize_export(export(dat, root / "onnx" / "fp32", format="onnx"), root / "onnx" / "int8")
        return {"dat": dat, "dir": root / "onnx"}

    return once_per_run(tmp_path_factory, "random-dat-onnx", build)


def random_shortlist(vocab: int, seed: int = 0):
    """A shortlist of the tiny random DAT's vocabulary (:func:`fadat.models.shortlist.
    build_shortlist`, 2 candidates per source token, 1 frequent token) from 200 random id pairs
    whose targets are correlated with their sources: about 7 to 13 of the 16 tokens per
    sentence, so a shortlisted head's choices differ from the full head's."""
    import numpy as np

    from fadat.data.contract import BOS_ID, EOS_ID
    from fadat.models.shortlist import build_shortlist

    rng = np.random.default_rng(seed)
    translation = rng.permutation(np.arange(4, vocab))  # token 4 + i "translates" to this
    pairs = []
    for _ in range(200):
        x = rng.integers(4, vocab, size=rng.integers(1, 6))
        y = translation[x[rng.permutation(len(x))] - 4]
        y = np.concatenate([y, rng.integers(4, vocab, size=rng.integers(0, 2))])
        pairs.append((np.append(x, EOS_ID), np.concatenate([[BOS_ID], y, [EOS_ID]])))
    return build_shortlist(pairs, vocab, top_k=2, frequent=1, built_from="tests/conftest.py")


@pytest.fixture(scope="session")
def dat_onnx_shortlist(tmp_path_factory) -> dict[str, Path]:
    """The tiny random DAT of :func:`dat_onnx` (``"dat"``) with a shortlist in its directory
    (:func:`random_shortlist`, ``"shortlist"``: ``DAT/shortlist.safetensors``), exported with
    it by the Python verb (``export(..., format="onnx", shortlist=True)``: fp32, fused
    attention) into ``DIR/fp32-sl``, with its int8 copy (``quantize_export``) in
    ``DIR/int8-sl`` (``"dir"``: DIR). Once per test run (:func:`once_per_run`): the export
    takes ≈ 20 s of CPU time. Skips the test where onnxruntime or onnxscript is missing."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from fadat.models.shortlist import SHORTLIST_NAME
    from fadat.translation.export import export
    from fadat.translation.onnx_export import quantize_export

    def build(root: Path) -> dict[str, Path]:
        dat = random_models(str(root / "random"))["dat"]
        path = random_shortlist(16).save(dat / SHORTLIST_NAME)
        fp32 = export(dat, root / "onnx" / "fp32-sl", format="onnx", shortlist=True)
        quantize_export(fp32, root / "onnx" / "int8-sl")
        return {"dat": dat, "dir": root / "onnx", "shortlist": path}

    return once_per_run(tmp_path_factory, "random-dat-onnx-shortlist", build)


@pytest.fixture(scope="session")
def copy_model(tmp_path_factory) -> dict[str, Path]:
    """A tiny DAT trained on a copy task (:func:`test_translate.copy_task_model`: ``"model"``,
    ``"data"``, ``"test_src"``), once per test run (:func:`once_per_run`): the training takes
    ≈ 30 s of CPU time."""
    return once_per_run(tmp_path_factory, "copy-task", lambda root: copy_task_model(str(root)))


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


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """The first 20 Bible test sentences as every split, in the released DAT's vocabulary
    (``fadat prepare`` in this process: it is the GPU jobs' input in their dry runs, not what
    their tests check). 20, not all 50 of tests/data: the plumbing does not depend on the count,
    and the sweep's dry run trains on them (its 16 validation sentences fit; job.sh's latency
    stage reads 4)."""
    from fadat import cli

    here = Path(__file__).resolve().parent
    test_50 = here / "data" / "bible-en-es-test-50"
    released = here.parent / "models" / "bible-en-es-fadat-cpu-small"
    root = tmp_path_factory.mktemp("toy")
    files = []
    for lang in ("en", "es"):
        lines = Path(f"{test_50}.{lang}").read_text(encoding="utf-8").splitlines()[:20]
        files.append(str(root / f"first-20.{lang}"))
        Path(files[-1]).write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = root / "data"
    argv = ["prepare", "--output", str(out)]
    for split in ("", "valid-", "test-"):
        argv += [f"--{split}source-file", files[0], f"--{split}target-file", files[1]]
    argv += ["--spm-model", str(released / "spm.model"), "--source-lang", "en"]
    assert cli.main([*argv, "--target-lang", "es"]) == 0
    return out
