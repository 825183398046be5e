"""The run directory's files: training checkpoints (written atomically, read with
``torch.load(weights_only=True)``: only tensors, numbers, strings, lists and dicts, no pickle of
arbitrary objects), the RNG states they carry for exact resumption, the index of the best
checkpoints, and checkpoint averaging into a model directory (``fadat average``; the papers
report best-5 averages)::

    RUN_DIR/config.yaml            resolved training config
    RUN_DIR/train_log.jsonl        one JSON line per update
    RUN_DIR/valid_log.jsonl        one JSON line per validation
    RUN_DIR/checkpoint_last.pt     model, optimizer, scheduler, grad scaler, RNG, data position
    RUN_DIR/checkpoint_best_uNNNNNNNN.pt   the best ``--keep-best`` checkpoints by validation BLEU
    RUN_DIR/best.json              index of the best checkpoints (file, BLEU, update)

A compact copy of a run (``fadat snapshot``, :mod:`fadat.training.snapshot`) is a run directory
too: the same files without the best checkpoints (with ``--with-best``: with them, their
weights in float16), and a checkpoint_last whose weights are stored
in float16 (or bfloat16) and that holds no optimizer state (:func:`light_state`; marked
``"optimizer_reset_required": True``). ``fadat train --resume COPY --reset-optimizer`` continues
it with fresh AdamW moments (:func:`restore_last`).

checkpoint_last records the dataset it trained on: the sha256 of the files a training run reads
(:data:`DATA_DIGEST`; :func:`fadat.data.binarized.training_digest`), its content, whatever its
path or the version of fadat that prepared it. A resumed run may read its data from another path
when the dataset there has that digest (:func:`check_resume_data`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fadat import outputs
from fadat.data.binarized import training_digest
from fadat.errors import InputError
from fadat.models.architectures import ARCHITECTURES, model_class

CHECKPOINT_FORMAT = "fadat-train-checkpoint-1"
LAST_NAME = "checkpoint_last.pt"
BEST_INDEX = "best.json"
CONFIG_FILE = "config.yaml"
TRAIN_LOG = "train_log.jsonl"
VALID_LOG = "valid_log.jsonl"

#: The key of a compact checkpoint_last (:func:`light_state`): ``True`` when it holds no
#: optimizer state, so that a resume must start the optimizer afresh (``--reset-optimizer``).
RESET_REQUIRED = "optimizer_reset_required"

#: The key of a checkpoint_last that records the dataset the run trained on: the sha256 of the
#: files a training run reads (:func:`fadat.data.binarized.training_digest`, 64 hex digits).
#: Absent in checkpoints written before fadat recorded it; ``None`` in a compact copy of such a
#: checkpoint made where its dataset was not (:mod:`fadat.training.snapshot`).
DATA_DIGEST = "data_digest"

#: The dtypes a compact copy may store its weights in (loading casts them back to the model's).
LIGHT_DTYPES = ("float16", "bfloat16", "float32")


def capture_rng_state() -> dict[str, torch.Tensor]:
    """The python, numpy and torch (CPU, CUDA) RNG states as tensors only, so that
    ``torch.load(weights_only=True)`` reads them back.

    Returns:
        dict of tensors: ``python`` int64 (626,), ``python_gauss`` float64 (2,), ``numpy`` int64
        (624,), ``numpy_meta`` float64 (3,), ``torch`` uint8, ``cuda`` uint8 (n_devices, k) if any.
    """
    version, internal, gauss = random.getstate()
    np_name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor(
            [0.0 if gauss is None else 1.0, 0.0 if gauss is None else gauss], dtype=torch.float64
        ),
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
        "numpy_meta": torch.tensor([pos, has_gauss, cached], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`capture_rng_state`.

    Raises:
        InputError: a state of the wrong form (corrupt checkpoint).
    """
    try:
        py = [int(v) for v in state["python"].tolist()]
        has_gauss, gauss = state["python_gauss"].tolist()
        random.setstate((py[0], tuple(py[1:]), gauss if has_gauss else None))
        pos, np_has_gauss, cached = state["numpy_meta"].tolist()
        keys = state["numpy"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, int(pos), int(np_has_gauss), float(cached)))
        torch.set_rng_state(state["torch"].to(torch.uint8).cpu())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(list(state["cuda"].to(torch.uint8).cpu()))
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise InputError(f"checkpoint holds an invalid RNG state ({err})") from None


def atomic_save(obj: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` to a temporary file, fsync, then rename over ``path`` (never a torn file;
    :func:`fadat.outputs.atomic_path`).

    Raises:
        InputError: the file cannot be written (disk full, directory removed), naming ``path``
            and the OS error; the old ``path`` stays whole and no temporary is left.
    """
    path = Path(path)
    with outputs.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        try:
            torch.save(obj, fh)
        except RuntimeError as err:
            # torch's zip writer reports a failed write of the file object as RuntimeError.
            cause = err.__cause__ or err.__context__
            if isinstance(cause, OSError):
                raise cause from None
            if "write" not in str(err).lower():
                raise
            raise InputError(f"{path}: cannot write ({_first_line(err)})") from None
        fh.flush()
        os.fsync(fh.fileno())


def _first_line(err: BaseException) -> str:
    """The first non-blank line of an error message (libraries' messages run over lines)."""
    return next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)


def verify_zip(path: str | Path) -> None:
    """Check every record of a zip archive (what ``torch.save`` writes) against its CRC-32:
    ``torch.load`` does not, and a flipped bit in a tensor's record would be resumed or
    averaged as if it were a weight.

    Raises:
        InputError: not a readable zip archive, or a record that fails its CRC (named, with the
            file).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every record: the first whose CRC fails, or None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as err:
        raise InputError(
            f"{path}: damaged checkpoint (not a readable zip archive: {err})"
        ) from None
    except OSError as err:
        raise InputError(f"{path}: cannot read checkpoint ({err.strerror or err})") from None
    if bad is not None:
        raise InputError(
            f"{path}: damaged checkpoint: record {bad} fails its CRC check (the file changed "
            "after it was written)"
        )


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a training checkpoint with ``torch.load(weights_only=True)`` on CPU, after checking
    its zip records' CRCs (:func:`verify_zip`).

    Raises:
        InputError: missing, unreadable/corrupt (a record that fails its CRC), or not a fadat
            training checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"checkpoint {path} is a directory, expected a .pt file")
    if not path.is_file():
        raise InputError(f"checkpoint {path} does not exist")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise InputError(f"{path}: cannot read checkpoint ({err.strerror or err})") from None
    # torch.save writes a zip archive (PK..) or, in the legacy format, a pickle (0x80 ...);
    # anything else (a text file, a safetensors file) is named as such, not as torch's error.
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        what = "an empty file" if not head else "not a file written by torch.save"
        raise InputError(f"{path}: cannot read checkpoint ({what}; expected a fadat .pt file)")
    if head.startswith(b"PK"):
        verify_zip(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for torn or foreign files
        if "Weights only load failed" in str(err):
            # torch's advice (weights_only=False) would run arbitrary code from the file.
            problem = "it holds Python objects other than tensors; not a fadat checkpoint"
        else:
            # torch's messages run over many lines; the first says what went wrong.
            first = next((line for line in str(err).splitlines() if line.strip()), "")
            problem = f"{type(err).__name__}: {first[:200]}"
        raise InputError(f"{path}: cannot read checkpoint ({problem})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path}: not a fadat training checkpoint")
    return state


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all-or-nothing (:func:`fadat.outputs.atomic_write`)."""
    outputs.atomic_write(path, text)


def log_lines_until(path: Path, update: int) -> str:
    """The JSON lines of the log ``path`` whose ``update`` is at most ``update``, each ending in a
    newline (a killed run, or one still training, may have logged updates after its checkpoint;
    a torn last line is dropped)."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and int(record.get("update", -1)) <= update:
            kept.append(line + "\n")
    return "".join(kept)


def truncate_log(path: Path, update: int) -> None:
    """Keep the log lines of updates ≤ ``update`` (:func:`log_lines_until`), if ``path`` exists."""
    if path.is_file():
        atomic_write_text(path, log_lines_until(path, update))


@dataclass
class Progress:
    """Where the run is: data position and counters (stored in checkpoint_last)."""

    epoch: int = 1
    batch_index: int = 0  # next micro-batch of the epoch's list
    update: int = 0
    elapsed: float = 0.0  # training seconds over all sessions
    best: list[dict[str, Any]] = field(default_factory=list)  # [{"file", "bleu", "update"}]
    bad_validations: int = 0
    last_validated: int = -1
    skipped_updates: int = 0
    # The highest BLEU of best checkpoints that a compact copy did not keep (None: none were
    # dropped); --patience compares new validations against it as against the best list.
    earlier_best_bleu: float | None = None


def last_state(
    arch: str,
    train_config: dict[str, Any],
    world_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    progress: Progress,
    rng: list[dict[str, torch.Tensor]],
    data_digest: str,
) -> dict[str, Any]:
    """The content of checkpoint_last: everything an exact resumption needs (``rng``: every
    rank's RNG state, :func:`capture_rng_state`), and the identity of the dataset it trains on
    (``data_digest``: :func:`fadat.data.binarized.training_digest` of its data directory),
    stored as :data:`DATA_DIGEST`."""
    return {
        "format": CHECKPOINT_FORMAT,
        "arch": arch,
        "model_config": model.config.to_dict(),
        "train_config": train_config,
        "world_size": world_size,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": {
            "kind": "inverse_sqrt",
            "lr": train_config["lr"],
            "warmup": train_config["warmup"],
            "warmup_init_lr": train_config["warmup_init_lr"],
            "update": progress.update,
        },
        "progress": dataclasses.asdict(progress),
        "rng": rng,
        DATA_DIGEST: data_digest,
    }


def _same_directory(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one directory (the same string, or both exist and are one)."""
    if str(a) == str(b):
        return True
    try:
        return Path(a).samefile(b)
    except OSError:
        return False


def check_resume_data(
    state: dict[str, Any], where: str | Path, data: str | Path, digest: str | None = None
) -> None:
    """Check that the data directory ``data`` of a resumed run holds the dataset the checkpoint
    ``state`` (read from ``where``) trained on, so that a run may read its data from another
    path than the one it was started with (a run directory or compact copy moved to another
    machine, its dataset prepared there, possibly by a later version of fadat), and is not
    resumed on another dataset. A dataset is identified by the content of the files a training
    run reads (:func:`fadat.data.binarized.training_digest`), not by its path or ``meta.json``:

    - the checkpoint records a digest (:data:`DATA_DIGEST`): ``data``'s digest must be the
      same, whether or not the path changed (a dataset rebuilt in place is caught too);
    - it records none (a checkpoint written before fadat recorded it, or a compact copy of one
      made where its dataset was not) and ``data`` is the path it saved
      (``train_config["data"]``): accepted, as there is nothing to compare with;
    - it records none and ``data`` is another path: the digest of the saved path's dataset,
      which must still be there, must be ``data``'s.

    Args:
        state: from :func:`load_checkpoint`.
        where: its path (for messages).
        data: the resumed run's data directory.
        digest: ``data``'s :func:`~fadat.data.binarized.training_digest` where the caller has
            computed it already (the trainer, once at start-up); ``None``: computed here when
            it is needed.

    Raises:
        InputError: ``data`` holds another dataset (both digests' first 12 hex digits,
            ``where`` and ``data`` named); the checkpoint records none and ``data`` is another
            path while the saved one is gone or no longer holds a readable dataset (both paths
            named, with what to do); ``data`` not a directory, missing a train file or holding
            an unreadable one, where its digest is computed here
            (:func:`~fadat.data.binarized.training_digest`).
    """
    recorded = state.get(DATA_DIGEST)
    config = state.get("train_config")
    saved = config.get("data") if isinstance(config, dict) else None
    source = f"recorded by {where}"
    if recorded is None:
        if saved is None or _same_directory(saved, data):
            return
        try:
            recorded = training_digest(saved)
        except InputError:
            there = "is gone" if not Path(saved).exists() else "no longer holds a readable dataset"
            raise InputError(
                f"{where} does not record which dataset the run trained on (a checkpoint written "
                f"before fadat recorded it), so data directory {data} cannot be verified against "
                f"the saved {saved}, which {there}; make that dataset available at {saved} (a "
                "symbolic link will do) and resume there, or re-save the run with a current "
                "`fadat snapshot` while its data is there (the copy records the dataset's "
                f"digest) and resume the copy with --data {data}"
            ) from None
        source = f"for {saved}, the data directory {where} saved"
    mine = digest if digest is not None else training_digest(data)
    if mine != recorded:
        raise InputError(
            f"data directory {data} holds another dataset than the run trained on: its training "
            f"files' sha256 {mine[:12]}…, {str(recorded)[:12]}… {source}; give --data the run's "
            "dataset (fadat prepare with the run's corpus and options rebuilds it) or start a "
            "new run"
        )


def restore_last(
    state: dict[str, Any],
    where: Path,
    train_config: dict[str, Any],
    fixed_keys: set[str],
    info: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    reset_optimizer: bool = False,
) -> Progress:
    """Load checkpoint_last's ``state`` into the model, optimizer, grad scaler and this rank's
    RNG; returns the run's :class:`Progress`.

    Weights stored in another floating dtype than the model's (a compact copy's float16) are
    cast to the model's dtype by ``load_state_dict``.

    Args:
        state: from :func:`load_checkpoint`.
        where: its path (for messages).
        train_config: the resumed run's config as a dict.
        fixed_keys: config keys that must equal the saved ones (the trainer's:
            :func:`fadat.training.config.fixed_resume_keys`; it checks ``data`` with
            :func:`check_resume_data` when it reads the checkpoint).
        info: the :class:`fadat.training.distributed.DistInfo` of this process.
        reset_optimizer: leave ``optimizer`` as it is (fresh: no moments, step counts 0)
            instead of loading the saved optimizer state; required for a compact checkpoint
            (:func:`is_light`), which holds none. The grad scaler, schedule position, data
            position and RNG are restored either way.

    Raises:
        InputError: a changed fixed key, another number of processes, a compact checkpoint
            without ``reset_optimizer``, or a corrupt state (NaN or infinite weights included).
    """
    if is_light(state) and not reset_optimizer:
        raise InputError(light_without_reset(where))
    saved = state.get("train_config", {})
    for key in sorted(fixed_keys):
        mine = train_config[key]
        if key in saved and saved[key] != mine:
            raise InputError(
                f"{where}: config key {key!r} was {saved[key]!r}, now {mine!r}; "
                "a resumed run must keep its config"
            )
    if state.get("world_size") != info.world_size:
        raise InputError(
            f"{where}: written by {state.get('world_size')} processes, resumed with "
            f"{info.world_size}; the data order depends on it"
        )
    weights = state.get("model")
    if isinstance(weights, dict):
        for name, value in weights.items():
            if (
                isinstance(value, torch.Tensor)
                and value.is_floating_point()
                and not bool(torch.isfinite(value).all())
            ):
                # Never written by the trainer (a diverged update is not saved): damage, which
                # resumed would be reported as divergence and blamed on the learning rate.
                raise InputError(f"{where}: weight {name} holds NaN or infinite values (damaged)")
    try:
        model.load_state_dict(state["model"])
        if not reset_optimizer:
            optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        p = state["progress"]
        progress = Progress(
            epoch=int(p["epoch"]),
            batch_index=int(p["batch_index"]),
            update=int(p["update"]),
            elapsed=float(p["elapsed"]),
            best=[dict(b) for b in p["best"]],
            bad_validations=int(p["bad_validations"]),
            last_validated=int(p["last_validated"]),
            skipped_updates=int(p["skipped_updates"]),
            earlier_best_bleu=(
                None if p.get("earlier_best_bleu") is None else float(p["earlier_best_bleu"])
            ),
        )
        restore_rng_state(state["rng"][info.rank])
    except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
        raise InputError(f"{where}: corrupt or incompatible checkpoint ({err})") from None
    return progress


def is_light(state: dict[str, Any]) -> bool:
    """Whether a checkpoint_last state is a compact copy's (:func:`light_state`): no optimizer
    state, so it resumes only with a fresh optimizer."""
    return bool(state.get(RESET_REQUIRED, False))


def light_without_reset(where: str | Path) -> str:
    """The one-line refusal of resuming the compact checkpoint ``where`` without a reset."""
    run_dir = Path(where).parent
    return (
        f"{where}: a compact copy without optimizer state (fadat snapshot); continue it with "
        f"fadat train --resume {run_dir} --reset-optimizer"
    )


def light_state(state: dict[str, Any], where: str | Path, dtype: str = "float16") -> dict[str, Any]:
    """A compact copy of a checkpoint_last ``state``: everything but the optimizer state
    (AdamW's two moments per weight, 2/3 of the file), with the floating model weights stored as
    ``dtype`` and ``"optimizer_reset_required": True`` (:data:`RESET_REQUIRED`), ``"weights_dtype":
    dtype`` added. Kept as they are: architecture and configs, grad-scaler state (fp16 loss
    scale; independent of the moments), scheduler, progress (update, epoch, data position, best
    list), every rank's RNG state and the dataset's digest (:data:`DATA_DIGEST`, where the state
    has it). A ``state`` that already is compact is cast again.

    For ``float16`` a tiny model's file is about 2 bytes per parameter plus ≈ 30 kB (RNG states,
    configs); a full checkpoint_last holds 12 (fp32 weights and two moments).

    Args:
        state: from :func:`load_checkpoint` (``"model"``: name → tensor).
        where: its path (for messages).
        dtype: one of :data:`LIGHT_DTYPES`.

    Raises:
        InputError: an unknown ``dtype``, no model weights, a weight with NaN or infinite values,
            or one whose magnitude ``dtype`` cannot hold (float16: above 65504; use
            ``bfloat16``), named.
    """
    light = {k: v for k, v in state.items() if k != "optimizer"}
    light["model"] = cast_weights(state, where, dtype)
    light[RESET_REQUIRED] = True
    light["weights_dtype"] = dtype
    return light


def cast_weights(state: dict[str, Any], where: str | Path, dtype: str) -> dict[str, Any]:
    """The model weights of a checkpoint ``state`` (``"model"``: name → tensor) with the
    floating ones cast to ``dtype`` (one of :data:`LIGHT_DTYPES`), integer tensors unchanged:
    the weights of a compact copy (:func:`light_state`, and the best checkpoints that
    ``fadat snapshot --with-best`` keeps).

    Raises:
        InputError: an unknown ``dtype``, no model weights, a weight with NaN or infinite values,
            or one whose magnitude ``dtype`` cannot hold (float16: above 65504; use
            ``bfloat16``), named.
    """
    if dtype not in LIGHT_DTYPES:
        raise InputError(f"dtype must be one of {', '.join(LIGHT_DTYPES)}, got {dtype!r}")
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise InputError(f"{where}: holds no model weights")
    target = getattr(torch, dtype)
    cast: dict[str, Any] = {}
    for name, value in weights.items():
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            cast[name] = value
            continue
        if not bool(torch.isfinite(value).all()):
            raise InputError(f"{where}: weight {name} holds NaN or infinite values (damaged)")
        stored = value.to(target)
        if not bool(torch.isfinite(stored).all()):
            raise InputError(
                f"{where}: weight {name} has values beyond the range of {dtype} "
                f"(largest magnitude {float(value.abs().max()):.6g}); use --dtype bfloat16"
            )
        cast[name] = stored
    return cast


def rank_best(
    best: list[dict[str, Any]], bleu: float, update: int, k: int
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Insert a validation into the best list: ``(its checkpoint name, the ``k`` best, the
    dropped ones)``, by BLEU (ties: the earlier update stays ahead)."""
    name = f"checkpoint_best_u{update:08d}.pt"
    candidates = best + [{"file": name, "bleu": bleu, "update": update}]
    candidates.sort(key=lambda b: (-b["bleu"], b["update"]))
    return name, candidates[:k], candidates[k:]


def save_best(
    run_dir: Path,
    best: list[dict[str, Any]],
    bleu: float,
    update: int,
    keep_best: int,
    arch: str,
    model: torch.nn.Module,
    data: str,
) -> list[dict[str, Any]]:
    """Keep the ``keep_best`` best checkpoints by BLEU (ties: the earlier stays ahead): write
    this update's weights if they enter the list, delete the checkpoints that leave it and
    rewrite ``best.json``. Returns the new best list (``file``, ``bleu``, ``update``)."""
    name, keep, drop = rank_best(best, bleu, update, keep_best)
    if any(b["file"] == name for b in keep):
        state = {
            "format": CHECKPOINT_FORMAT,
            "arch": arch,
            "model_config": model.config.to_dict(),
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "bleu": bleu,
            "update": update,
            "data": data,
        }
        atomic_save(state, run_dir / name)
    for b in drop:
        with contextlib.suppress(FileNotFoundError):
            (run_dir / b["file"]).unlink()
    write_best_index(run_dir, keep)
    return keep


def write_best_index(run_dir: Path, best: list[dict[str, Any]]) -> None:
    """Write ``run_dir``/best.json, the index of the best checkpoints (``file``, ``bleu``,
    ``update``), atomically."""
    index = {"metric": "bleu", "checkpoints": best}
    atomic_write_text(run_dir / BEST_INDEX, json.dumps(index, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Checkpoint averaging
# --------------------------------------------------------------------------------------------


def best_checkpoints(run_dir: str | Path, k: int) -> list[Path]:
    """The ``k`` best checkpoints of a run by validation BLEU (from ``best.json``).

    Raises:
        InputError: no run directory, no best.json, fewer than ``k`` listed or missing files.
    """
    run_dir = Path(run_dir)
    index_path = run_dir / BEST_INDEX
    if not run_dir.is_dir():
        what = "is a file, not" if run_dir.exists() else "does not exist: expected"
        raise InputError(f"--run {run_dir} {what} a run directory of fadat train")
    if not index_path.is_file():
        raise InputError(f"{index_path} does not exist (no validated checkpoints in {run_dir})")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        entries = sorted(index["checkpoints"], key=lambda b: (-b["bleu"], b["update"]))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise InputError(f"{index_path}: corrupt ({err})") from None
    if len(entries) < k:
        raise InputError(f"{index_path}: lists {len(entries)} checkpoints, --best {k} requested")
    paths = [run_dir / e["file"] for e in entries[:k]]
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path}: listed in {index_path} but missing")
    return paths


def average_checkpoints(paths: list[str | Path]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Arithmetic mean of the model weights of several checkpoints (floating tensors averaged in
    fp64 and cast back to the first checkpoint's dtype, float32 where that is float16 or bfloat16:
    the best checkpoints of a compact copy, ``fadat snapshot --with-best``; integer tensors
    floor-divided).

    Args:
        paths: training checkpoints (``checkpoint_best_*.pt`` or ``checkpoint_last.pt``).

    Returns:
        ``(state_dict, first checkpoint's metadata without weights)``.

    Raises:
        InputError: no paths, unreadable files, checkpoints of different models, or a weight
            with NaN or infinite values.
    """
    if not paths:
        raise InputError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    first_meta: dict[str, Any] = {}
    dtypes: dict[str, torch.dtype] = {}
    for i, path in enumerate(paths):
        state = load_checkpoint(path)
        weights = state.get("model")
        if not isinstance(weights, dict):
            raise InputError(f"{path}: holds no model weights")
        meta = {k: v for k, v in state.items() if k not in ("model", "optimizer", "rng")}
        weights = _current_names(weights, meta.get("model_config"))
        for k, v in weights.items():
            if not isinstance(v, torch.Tensor):
                raise InputError(f"{path}: model weight {k} is not a tensor")
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                # A diverged run's checkpoint: one NaN would make every averaged weight NaN.
                raise InputError(f"{path}: weight {k} holds NaN or infinite values")
        if i == 0:
            first_meta = meta
            dtypes = {
                k: torch.float32 if v.dtype in (torch.float16, torch.bfloat16) else v.dtype
                for k, v in weights.items()
            }
            total = {
                k: v.to(torch.float64) if v.is_floating_point() else v.clone()
                for k, v in weights.items()
            }
            continue
        if meta.get("model_config") != first_meta.get("model_config") or set(weights) != set(total):
            raise InputError(f"{path}: a different model than {paths[0]}")
        for k, v in weights.items():
            if v.shape != total[k].shape:
                raise InputError(
                    f"{path}: {k} has shape {tuple(v.shape)}, expected {tuple(total[k].shape)}"
                )
            total[k] += v.to(total[k].dtype)
    n = len(paths)
    averaged = {
        k: (v / n).to(dtypes[k])
        if dtypes[k].is_floating_point
        else torch.div(v, n, rounding_mode="floor")
        for k, v in total.items()
    }
    return averaged, first_meta


def _current_names(weights: dict[str, Any], model_config: Any) -> dict[str, Any]:
    """``weights`` with today's parameter names (checkpoints of earlier versions name some
    differently: :meth:`fadat.models.architectures.TranslationModel.upgrade_state_dict`)."""
    kind = model_config.get("model_type", "dat") if isinstance(model_config, dict) else None
    if kind not in ARCHITECTURES:
        return weights
    return model_class(kind).upgrade_state_dict(weights)


def write_averaged_model(
    paths: list[str | Path],
    output: str | Path,
    data_dir: str | Path | None,
    weights_dtype: str = "float32",
) -> Path:
    """Average ``paths`` and write a model directory with ``save_pretrained``, the data's
    sentencepiece model and its licence/attribution (from ``DATA/meta.json``); the weights are
    stored as ``weights_dtype`` (see :func:`fadat.models.directory.save_model_directory`).

    Returns:
        The output directory.

    Raises:
        InputError: as :func:`average_checkpoints`, or a missing data directory / spm model.
    """
    from fadat.models.config import ModelConfig

    state, meta = average_checkpoints(paths)
    config = ModelConfig.from_dict(dict(meta["model_config"]))
    model = model_class(config.model_type)(config)
    model.load_state_dict(state)
    data = Path(data_dir or meta.get("data") or meta.get("train_config", {}).get("data", ""))
    spm = data / "spm.model"
    if not spm.is_file():
        raise InputError(f"sentencepiece model {spm} not found (give --data DIR)")
    extra: dict[str, Any] = {
        "training": {
            "averaged": [str(Path(p).name) for p in paths],
            "bleu": [load_bleu(p) for p in paths],
        }
    }
    meta_path = data / "meta.json"
    if meta_path.is_file():
        try:
            data_meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"{meta_path}: not valid JSON ({err})") from None
        extra["data"] = {
            k: data_meta[k]
            for k in ("licence", "license", "attribution", "source_lang", "target_lang", "corpus")
            if k in data_meta
        }
    model.save_pretrained(output, spm_model=spm, extra=extra, weights_dtype=weights_dtype)
    return Path(output)


def load_bleu(path: str | Path) -> float | None:
    """Validation BLEU stored in a best checkpoint (``None`` for checkpoint_last)."""
    bleu = load_checkpoint(path).get("bleu")
    return None if bleu is None else float(bleu)
