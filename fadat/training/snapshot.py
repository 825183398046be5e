"""A compact copy of a training run that training can continue from (``fadat snapshot``):
:func:`snapshot`, which ``fadat snapshot`` (:mod:`fadat.cli.snapshot`) runs.

A run's ``checkpoint_last.pt`` holds fp32 weights and AdamW's two moments per weight (12 bytes
per parameter: ≈ 95 MB for 7.9M parameters), too large to keep in git. The copy is itself a run
directory, with everything a resume restores except the optimizer state, and the weights in
float16 (2 bytes per parameter: ≈ 16 MB for 7.9M)::

    COPY/config.yaml           the run's resolved config (copied)
    COPY/train_log.jsonl       the run's update lines up to the checkpoint's update
    COPY/valid_log.jsonl       the run's validation lines up to the checkpoint's update
    COPY/train.log             the run's log (copied)
    COPY/best.json             the best list as of the checkpoint
    COPY/checkpoint_last.pt    weights in float16, no optimizer state,
                               "optimizer_reset_required": True (checkpoints.light_state),
                               the digest of the run's dataset ("data_digest")
    COPY/checkpoint_best_uNNNNNNNN.pt   with ``with_best`` only (``--with-best``): the best
                               checkpoints the list names, weights in float16

``fadat train --resume COPY --reset-optimizer`` continues it like fairseq's
``--reset-optimizer``: the update count, epoch, learning-rate schedule, data position, RNG
states, grad scaler and logs continue; AdamW starts with zero moments; the weights are cast
back to the model's fp32. Not kept: ``tensorboard/`` and, unless ``with_best``, the
``checkpoint_best_*.pt`` files (each as large as the fp32 model): the continued run's best list
then starts empty, and ``fadat average --run COPY --best K`` averages only best checkpoints
saved after the continuation (:mod:`fadat.training.trainer`). With ``with_best`` the copy also
holds the best checkpoints, their weights in the copy's dtype (2 bytes per parameter each for
float16), and the continued run keeps its best list: a run stopped by a plateau criterion and
restored from its copy averages the same checkpoints, each rounded to float16 (``fadat
average`` averages them in float64 and writes float32 weights).

The copy records the dataset the run trained on: the sha256 of the files a training run reads
(:func:`fadat.data.binarized.training_digest`), so that it continues on another machine with the
same dataset prepared at another path, by this or another version of fadat (``fadat train
--resume COPY --reset-optimizer --data DIR``: accepted when ``DIR``'s files have that content;
:func:`fadat.training.checkpoints.check_resume_data`). A checkpoint written before fadat recorded
it gets the digest of the run's data directory (its config's ``data``) where that is on this
machine.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

from fadat import outputs
from fadat.data.binarized import training_digest
from fadat.errors import InputError, UnrecordedDatasetWarning
from fadat.training.checkpoints import (
    CONFIG_FILE,
    DATA_DIGEST,
    LAST_NAME,
    LIGHT_DTYPES,
    TRAIN_LOG,
    VALID_LOG,
    atomic_save,
    atomic_write_text,
    cast_weights,
    light_state,
    load_checkpoint,
    log_lines_until,
    write_best_index,
)

#: The human-readable log of a run (:mod:`fadat.training.run_log`).
TRAIN_TEXT_LOG = "train.log"


def snapshot(
    run: str | Path,
    output: str | Path,
    *,
    dtype: str = "float16",
    force: bool = False,
    with_best: bool = False,
) -> Path:
    """Write a compact copy of the run ``run`` to the run directory ``output``
    (``fadat snapshot``).

    The copy is built in a staging directory next to ``output`` and renamed into place when
    complete (:func:`fadat.outputs.replace_dir`): an existing copy (a fadat run directory holding
    only files fadat wrote there) is replaced as a whole, and only with ``force``; a directory
    that fadat did not create, or a run holding files written after the copy (checkpoints of a
    continued training), is never replaced. Every check on ``output`` comes before the
    checkpoint is read. ``run`` may be training meanwhile: the checkpoint is read whole (it is
    replaced atomically) and the logs are cut at its update.

    Args:
        run: a run directory of ``fadat train`` (or a compact copy) with ``checkpoint_last.pt``
            and ``config.yaml``.
        output: the run directory to write; not ``run``, not inside it, not holding it.
        dtype: the dtype of the stored weights, one of
            :data:`~fadat.training.checkpoints.LIGHT_DTYPES` (``float16``: 2 bytes per
            parameter; ``bfloat16`` for weights beyond float16's range of ±65504; ``float32``
            keeps them exact and only drops the optimizer state).
        force: replace an existing copy at ``output``.
        with_best: also copy the best checkpoints that the checkpoint's best list names, with
            their weights in ``dtype`` (``fadat snapshot --with-best``).

    Returns:
        ``output`` as a Path; its ``checkpoint_last.pt`` holds ``"model"`` (name → tensor of
        ``dtype``, integer tensors unchanged), no ``"optimizer"``,
        ``"optimizer_reset_required": True``, ``"weights_dtype": dtype`` and
        ``"data_digest"``: the run's (:data:`~fadat.training.checkpoints.DATA_DIGEST`), or where
        its checkpoint records none, the :func:`~fadat.data.binarized.training_digest` of the
        run's data directory (``train_config["data"]``), ``None`` when that is not here or holds
        no readable dataset. With ``with_best``, each ``checkpoint_best_uNNNNNNNN.pt`` of the
        list is the run's with its floating weights in ``dtype`` and ``"weights_dtype": dtype``
        added.

    Warns:
        UnrecordedDatasetWarning: the copy records no digest (the checkpoint has none and the
            run's data directory is not here, or holds no readable dataset): it resumes only
            with its data at the saved path (:class:`fadat.errors.UnrecordedDatasetWarning`).

    Raises:
        InputError: an unknown ``dtype``; ``run`` is not a run directory or lacks
            ``checkpoint_last.pt`` / ``config.yaml``; a damaged checkpoint, or a weight that
            ``dtype`` cannot hold; an ``output`` that is or lies inside ``run`` or holds it, that
            is not new, empty or a fadat run directory, an existing run without ``force``, or
            one holding files fadat did not write there; with ``with_best``, a best checkpoint
            that the list names but that is missing (a run that is training replaced it after
            its last checkpoint: make the copy again after the next one) or damaged.
    """
    if dtype not in LIGHT_DTYPES:
        raise InputError(f"dtype must be one of {', '.join(LIGHT_DTYPES)}, got {dtype!r}")
    run = Path(run)
    if not run.is_dir():
        what = "is a file, not" if run.exists() else "does not exist: expected"
        raise InputError(f"--run {run} {what} a run directory of fadat train")
    for name in (LAST_NAME, CONFIG_FILE):
        if not (run / name).is_file():
            raise InputError(f"--run {run}: {name} does not exist (not a run of fadat train?)")
    # Before any work (fadat.outputs).
    outputs.check_not_input(output, [("--run", run)], "--output")
    outputs.check_whole_replacement(output, "run", "--output", force)
    state = load_checkpoint(run / LAST_NAME)
    light = light_state(state, run / LAST_NAME, dtype)
    if light.get(DATA_DIGEST) is None:
        light[DATA_DIGEST] = _run_data_digest(light, run / LAST_NAME)
    try:
        update = int(light["progress"]["update"])
        best = [dict(b) for b in light["progress"]["best"]]
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{run / LAST_NAME}: corrupt checkpoint (progress: {err})") from None
    staged = outputs.staging_dir(output)
    try:
        shutil.copyfile(run / CONFIG_FILE, staged / CONFIG_FILE)
        if (run / TRAIN_TEXT_LOG).is_file():
            shutil.copyfile(run / TRAIN_TEXT_LOG, staged / TRAIN_TEXT_LOG)
        for name in (TRAIN_LOG, VALID_LOG):
            if (run / name).is_file():
                atomic_write_text(staged / name, log_lines_until(run / name, update))
        write_best_index(staged, best)
        if with_best:
            for entry in best:
                _copy_best(run, staged, entry, update, dtype)
        atomic_save(light, staged / LAST_NAME)
        outputs.replace_dir(staged, output, "run", "--output")
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return Path(output)


def _copy_best(run: Path, staged: Path, entry: dict[str, Any], update: int, dtype: str) -> None:
    """Write the best checkpoint ``entry`` (of the best list of ``run``'s checkpoint_last at
    ``update``) to ``staged`` with its weights in ``dtype``."""
    name = entry.get("file") if isinstance(entry, dict) else None
    if (
        not isinstance(name, str)
        or Path(name).name != name
        or not name.startswith("checkpoint_best_")
    ):
        raise InputError(f"{run / LAST_NAME}: best list names {name!r}, not a best checkpoint")
    path = run / name
    retry = (
        f"the run replaced it after its checkpoint at update {update} (is it training?); make "
        "the copy again after its next checkpoint"
    )
    if not path.is_file():
        raise InputError(
            f"{path}: listed in the best list of {run / LAST_NAME} but missing: {retry}"
        )
    state = load_checkpoint(path)
    state["model"] = cast_weights(state, path, dtype)
    state["weights_dtype"] = dtype
    atomic_save(state, staged / name)


def _run_data_digest(state: dict[str, Any], where: Path) -> str | None:
    """The :func:`~fadat.data.binarized.training_digest` of the run's data directory
    (``train_config["data"]`` of the checkpoint ``state`` read from ``where``) for a checkpoint
    that records none: ``None``, with an :class:`~fadat.errors.UnrecordedDatasetWarning`, when
    that directory is not here or holds no readable dataset."""
    config = state.get("train_config")
    data = config.get("data") if isinstance(config, dict) else None
    if data:
        try:
            return training_digest(data)
        except InputError as err:
            found = (
                "is not here" if not Path(data).exists() else f"holds no readable dataset ({err})"
            )
            why = f"its data directory {data} {found}"
    else:
        why = "its config names no data directory"
    warnings.warn(
        f"{where} does not record which dataset the run trained on and {why}: the copy does not "
        f"record it either, so it resumes only with the dataset at {data}; make the copy where "
        "the run's data is to let it resume with --data elsewhere",
        UnrecordedDatasetWarning,
        stacklevel=3,
    )
    return None
