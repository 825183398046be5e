"""Average the best K checkpoints of a run (by validation BLEU) or a given list of checkpoints
into a model directory (docs/reference-behaviour.md, "Checkpoint averaging"; the FA-DAT papers
report best-5 averages): :func:`average`, which ``fadat average`` (:mod:`fadat.cli.average`)
runs.

The arithmetic lives in :mod:`fadat.training.checkpoints`
(:func:`~fadat.training.checkpoints.average_checkpoints`,
:func:`~fadat.training.checkpoints.write_averaged_model`); this module adds the rules of an output
model directory (checked before any work, written all-or-nothing).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from fadat import outputs
from fadat.errors import InputError
from fadat.training.checkpoints import best_checkpoints, write_averaged_model
from fadat.training.config import load_yaml_config

#: The dtypes the averaged weights may be stored in (loading casts them back to fp32).
DTYPES = ("float32", "float16", "bfloat16")


def average(
    source: str | Path | Sequence[str | Path],
    output: str | Path,
    *,
    best: int = 5,
    data: str | Path | None = None,
    dtype: str = "float32",
    force: bool = False,
) -> Path:
    """Write the average of checkpoints as a model directory (``fadat average``).

    The model is built in a staging directory next to ``output`` and renamed into place when
    complete (:func:`fadat.outputs.replace_dir`): an existing model directory (with or without
    fadat's marker) is replaced as a whole, and only with ``force``. Every check on ``output``
    comes before any checkpoint is read.

    Args:
        source: a run directory of ``fadat train`` (a ``str`` or ``Path``: its ``best`` best
            checkpoints by validation BLEU, from ``best.json``), or a sequence of checkpoint
            files (``.pt``) to average instead.
        output: the model directory to write.
        best: how many of the run's best checkpoints to average (ignored for a sequence).
        data: the data directory whose ``spm.model`` (and licence) goes into the model
            directory; default: the run's ``data`` (its ``config.yaml``).
        dtype: the dtype of the stored weights, one of :data:`DTYPES` (``float16`` halves the
            file).
        force: replace an existing model directory at ``output``.

    Returns:
        ``output`` as a Path.

    Raises:
        InputError: ``best`` < 1, an empty sequence, an unknown ``dtype``, bad checkpoints
            (non-finite weights included), an ``output`` that is not new, empty or a fadat model
            directory, an existing model without ``force``, or an ``output`` that is or lies
            inside an input (the run, a checkpoint, ``data``).
    """
    is_run = isinstance(source, str | os.PathLike)
    checkpoints = [] if is_run else list(source)
    if best < 1:
        raise InputError("--best must be >= 1")
    if not is_run and not checkpoints:
        raise InputError("no checkpoints to average: give a run directory or checkpoint files")
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    # Before any work (fadat.outputs).
    inputs = [("--run", source if is_run else None), ("--data", data)]
    inputs += [("--checkpoints", p) for p in checkpoints]
    outputs.check_not_input(output, inputs, "--output")
    outputs.check_whole_replacement(output, "model", "--output", force)
    if is_run:
        paths = best_checkpoints(source, best)
        config = Path(source) / "config.yaml"
        if data is None and config.is_file():
            data = load_yaml_config(config).get("data")
    else:
        paths = [Path(p) for p in checkpoints]
    staged = outputs.staging_dir(output)
    try:
        write_averaged_model(paths, staged, data, weights_dtype=dtype)
        outputs.replace_dir(staged, output, "model", "--output")
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return Path(output)
