"""The model directory: ``config.json`` + ``model.safetensors`` + ``spm.model``, written and read
for every architecture of :data:`fadat.models.architectures.ARCHITECTURES` by one implementation
(:class:`PretrainedMixin` gives each model class ``save_pretrained`` / ``from_pretrained``).

:func:`load_pretrained` reads any model directory (dispatching on ``model_type``);
:func:`load_model` also loads and checks its sentencepiece model; :func:`resolve_device` parses a
``--device`` name.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fadat import outputs
from fadat.errors import InputError
from fadat.models.architectures import ARCHITECTURES, TranslationModel, model_class
from fadat.models.config import ModelConfig

FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
SPM_NAME = "spm.model"
#: config.json's key for the sha256 of the sentencepiece model the weights were saved with:
#: another spm.model of the same size (a model directory assembled by hand) passes every other
#: check and turns the output into garbage.
SPM_SHA256 = "spm_sha256"


class PretrainedMixin:
    """``save_pretrained`` / ``from_pretrained`` for a model class with a ``model_type``."""

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        spm_model: str | Path | None = None,
        extra: dict[str, Any] | None = None,
        weights_dtype: str = "float32",
    ) -> None:
        """Write a complete model directory (see :func:`save_model_directory`)."""
        save_model_directory(
            self, directory, spm_model=spm_model, extra=extra, weights_dtype=weights_dtype
        )

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str = "cpu") -> Any:
        """Load a model directory written by :meth:`save_pretrained`.

        Raises:
            InputError: as :func:`load_pretrained`, or the directory holds another architecture.
        """
        return _load(directory, map_location, expected=cls.model_type)


def save_model_directory(
    model: TranslationModel,
    directory: str | Path,
    *,
    spm_model: str | Path | None = None,
    extra: dict[str, Any] | None = None,
    weights_dtype: str = "float32",
) -> None:
    """Write ``config.json``, ``model.safetensors`` and (optionally) ``spm.model`` to ``directory``.

    config.json is ``{"model_type", "format_version": 1, "config": {...}, "spm_model": "spm.model"
    or null, "spm_sha256": its sha256 or null, **extra}``; put the training data's licence and
    attribution in ``extra`` (e.g.
    ``{"data": {"licence": ..., "attribution": ..., "source_lang": ..., "target_lang": ...}}``).
    The tied output weight is the shared embedding and is stored once. Files are written to a
    temporary name and renamed, so an interrupted save leaves no truncated file.

    Args:
        model: a model of any registered architecture.
        directory: created if missing.
        spm_model: path of the sentencepiece model to copy in; ``None`` keeps no tokenizer.
        extra: further JSON-serialisable top-level entries.
        weights_dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``: the dtype of the stored
            floating-point weights (half the file size for the 16-bit ones, e.g. for a model
            kept in git). Loading casts them back into the model's fp32 parameters; the value
            is recorded in config.json as ``weights_dtype``.

    Raises:
        ValueError: ``extra`` uses a reserved key, or an unknown ``weights_dtype``.
        InputError: ``spm_model`` does not exist, ``directory`` is not new, empty or a
            fadat model directory (:func:`fadat.outputs.check_output_dir`), or writing a file
            failed (disk full, directory removed; :func:`fadat.outputs.atomic_path`), naming it.
    """
    from safetensors.torch import save_file

    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if weights_dtype not in dtypes:
        raise ValueError(f"weights_dtype must be one of {sorted(dtypes)}, got {weights_dtype!r}")

    directory = Path(directory)
    reserved = {"model_type", "format_version", "config", "spm_model", SPM_SHA256, "weights_dtype"}
    clash = reserved & set(extra or {})
    if clash:
        raise ValueError(f"extra uses reserved config.json keys: {sorted(clash)}")
    if spm_model is not None and not Path(spm_model).is_file():
        raise InputError(f"sentencepiece model {spm_model} does not exist")
    # Only a new, empty or fadat model directory is written (fadat.outputs); other files in it
    # stay.
    outputs.mark_dir(directory, "model")
    meta = {
        "model_type": model.config.model_type,
        "format_version": FORMAT_VERSION,
        "config": model.config.to_dict(),
        "spm_model": SPM_NAME if spm_model is not None else None,
        SPM_SHA256: None,  # filled in below, from the copy in the directory
        "weights_dtype": weights_dtype,
        **(extra or {}),
    }
    state = {}
    for name, value in model.state_dict().items():
        value = value.detach()
        if value.is_floating_point():
            cast = value.to(dtypes[weights_dtype])
            if not bool(torch.isfinite(cast).all()) and bool(torch.isfinite(value).all()):
                # float16 ends at 65504: a larger weight would be stored as infinity.
                raise InputError(
                    f"weight {name}: values up to {value.abs().max().item():.4g} do not fit in "
                    f"{weights_dtype}; store the weights as float32"
                )
            value = cast
        state[name] = value.contiguous().cpu()
    # Each file all-or-nothing (fadat.outputs); atomic_path gives the temporary file the umask's
    # mode (safetensors would create it 0600)
    with outputs.atomic_path(directory / WEIGHTS_NAME) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", "model_type": model.config.model_type})
    if spm_model is not None and Path(spm_model).resolve() != (directory / SPM_NAME).resolve():
        with outputs.atomic_path(directory / SPM_NAME) as tmp:
            shutil.copyfile(spm_model, tmp)
    if spm_model is not None:
        from fadat.data.build import sha256_file

        meta[SPM_SHA256] = sha256_file(directory / SPM_NAME)
    outputs.atomic_write(
        directory / CONFIG_NAME, json.dumps(meta, indent=2, ensure_ascii=False) + "\n"
    )


def read_model_metadata(directory: str | Path) -> dict[str, Any]:
    """Read and check a model directory's config.json.

    Returns:
        The parsed config.json (``model_type``, ``format_version``, ``config``, ...).

    Raises:
        InputError: missing directory, missing/corrupt config.json, unknown ``model_type`` or
            ``format_version``, invalid ``config``.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: a file, not a model directory (config.json, ...)")
    if not directory.is_dir():
        raise InputError(f"model directory {directory} does not exist")
    path = directory / CONFIG_NAME
    if not path.is_file():
        what = "not a file" if path.exists() else "missing"
        raise InputError(f"{path}: {what} (not a fadat model directory)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object")
    version = meta.get("format_version")
    if version is None:
        raise InputError(f"{path}: no format_version (not a fadat model directory?)")
    if isinstance(version, bool) or not isinstance(version, int):
        # A string "1" would otherwise read "unsupported format_version '1' (this fadat reads 1)".
        raise InputError(
            f"{path}: format_version must be an integer, got {version!r} ({type(version).__name__})"
        )
    if version != FORMAT_VERSION:
        raise InputError(
            f"{path}: unsupported format_version {meta.get('format_version')!r} "
            f"(this fadat reads {FORMAT_VERSION})"
        )
    if meta.get("model_type") not in ARCHITECTURES:
        raise InputError(f"{path}: unknown model_type {meta.get('model_type')!r}")
    try:
        config = ModelConfig.from_dict(meta.get("config"))
    except InputError as err:
        raise InputError(f"{path}: {err}") from err
    if config.model_type != meta["model_type"]:
        raise InputError(f"{path}: model_type {meta['model_type']!r} disagrees with its config")
    return meta


def spm_model_path(directory: str | Path, verify: bool = True) -> Path | None:
    """Path of the sentencepiece model stored in a model directory, or ``None`` if it has none;
    with ``verify``, checked against the sha256 config.json records
    (:func:`verify_spm_fingerprint`).

    Raises:
        InputError: as :func:`read_model_metadata` and :func:`verify_spm_fingerprint`, or
            config.json names a missing file.
    """
    meta = read_model_metadata(directory)
    name = meta.get("spm_model")
    if name is None:
        return None
    path = Path(directory) / name
    if not path.is_file():
        what = "not a file" if path.exists() else "missing"
        raise InputError(f"{path}: sentencepiece model named in config.json is {what}")
    if verify:
        verify_spm_fingerprint(directory, path)
    return path


def verify_spm_fingerprint(directory: str | Path, path: str | Path) -> None:
    """Check that the sentencepiece model ``path`` of a model directory is the one its weights
    were saved with: config.json's ``spm_sha256`` (written by :func:`save_model_directory`
    since it exists). Directories saved before it (the committed models/) are not checked.

    Raises:
        InputError: config.json's ``spm_sha256`` is not a sha256, or ``path`` has another one.
    """
    config_path = Path(directory) / CONFIG_NAME
    recorded = read_model_metadata(directory).get(SPM_SHA256)
    if recorded is None:
        return
    if (
        not isinstance(recorded, str)
        or len(recorded) != 64
        or recorded.strip("0123456789abcdefABCDEF")
    ):
        raise InputError(f"{config_path}: {SPM_SHA256} must be 64 hex digits, got {recorded!r}")
    from fadat.data.build import sha256_file

    actual = sha256_file(Path(path))  # InputError: unreadable
    if actual != recorded.lower():
        raise InputError(
            f"{path}: not the sentencepiece model this model was saved with (sha256 "
            f"{actual[:12]}..., {config_path} records {recorded[:12]}...); put back the "
            "spm.model of its training data"
        )


def _load(
    directory: str | Path, map_location: str | torch.device, expected: str | None
) -> TranslationModel:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = read_model_metadata(directory)
    if expected is not None and meta["model_type"] != expected:
        raise InputError(
            f"{Path(directory) / CONFIG_NAME}: holds a {meta['model_type']!r} model, "
            f"expected {expected!r}"
        )
    config = ModelConfig.from_dict(meta["config"])
    model = model_class(config.model_type)(config)
    path = Path(directory) / WEIGHTS_NAME
    if not path.is_file():
        raise InputError(f"{path}: {'not a file' if path.exists() else 'missing'}")
    try:
        state = load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise InputError(f"{path}: cannot read weights ({err})") from err
    state = model.upgrade_state_dict(state)  # parameter names of earlier versions
    expected_state = model.state_dict()
    missing = sorted(set(expected_state) - set(state))
    unexpected = sorted(set(state) - set(expected_state))
    if missing or unexpected:
        raise InputError(
            f"{path}: weights do not match the config (missing {missing[:5]}, "
            f"unexpected {unexpected[:5]})"
        )
    for name, tensor in state.items():
        if tensor.shape != expected_state[name].shape:
            raise InputError(
                f"{path}: {name} has shape {tuple(tensor.shape)}, the config expects "
                f"{tuple(expected_state[name].shape)}"
            )
        # Damage the header does not show: a wrong dtype, or values that are not numbers.
        if tensor.is_floating_point() != expected_state[name].is_floating_point():
            raise InputError(
                f"{path}: {name} is stored as {tensor.dtype}, the model expects "
                f"{expected_state[name].dtype} (damaged weights)"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{path}: {name} holds NaN or infinite values (damaged weights)")
    model.to(map_location)
    # load_state_dict copies into the existing parameters, so the tie (one Parameter used by the
    # embedding and the output projection) is kept.
    model.load_state_dict(state, strict=True)
    model.metadata = {k: v for k, v in meta.items() if k != "config"}
    model.directory = Path(directory)  # named by errors about the model's outputs
    model.eval()
    return model


def load_pretrained(
    directory: str | Path, map_location: str | torch.device = "cpu"
) -> TranslationModel:
    """Load any fadat model directory, dispatching on config.json's ``model_type``.

    Args:
        directory: written by ``save_pretrained``.
        map_location: device for the weights.

    Returns:
        The model (the class registered for its ``model_type``) in eval mode; its ``metadata`` holds
        the non-config entries of config.json, its ``directory`` the ``directory`` loaded.

    Raises:
        InputError: missing directory; missing or corrupt config.json or model.safetensors;
            unknown ``model_type`` or ``format_version``; invalid config; weights whose names,
            shapes or dtypes do not match the config, or that hold NaN or infinite values. The
            message names the file.
    """
    return _load(directory, map_location, expected=None)


def resolve_device(name: str | torch.device | None) -> torch.device:
    """Parse ``--device`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``…).

    Raises:
        InputError: not a device name, or a CUDA/MPS device that is not available.
    """
    if name is None:
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise InputError(f"invalid device {name!r} ({err})") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {name!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {name!r} requested but MPS is not available")
    return device


def load_model(
    directory: str | Path,
    device: str | torch.device | None = "cpu",
) -> tuple[TranslationModel, Any]:
    """Load a model directory (DAT or AT, by config.json's ``model_type``) and its tokenizer.

    Args:
        directory: written by ``save_pretrained`` (config.json + model.safetensors + spm.model).
        device: device for the weights.

    Returns:
        ``(model in eval mode, sentencepiece processor)``.

    Raises:
        InputError: missing or corrupt directory or files (from
            :func:`load_pretrained`), no sentencepiece model, or a sentencepiece
            model whose size or special ids disagree with the model (vocabulary mismatch), or
            that is not the one the model was saved with (:func:`verify_spm_fingerprint`).
    """
    from fadat.data.spm import load_sentencepiece

    device = resolve_device(device)
    model = load_pretrained(directory, map_location=device)
    path = spm_model_path(directory, verify=False)
    if path is None:
        raise InputError(f"{directory}: the model directory has no sentencepiece model")
    sp = load_sentencepiece(path)
    check_vocabulary(sp, model, where=str(path))  # the plainer message for another size
    verify_spm_fingerprint(directory, path)
    return model, sp


def check_vocabulary(sp: Any, model: nn.Module, where: str = "sentencepiece model") -> None:
    """Check that a sentencepiece model fits a model (size and the contract's special ids).

    Raises:
        InputError: vocabulary size or special ids differ (``<s>``=0, ``<pad>``=1, ``</s>``=2,
            ``<unk>``=3, :mod:`fadat.data.contract`).
    """
    from fadat.data.spm import check_special_ids

    size, expected = sp.get_piece_size(), model.config.vocab_size
    if size != expected:
        raise InputError(
            f"{where}: vocabulary mismatch: the sentencepiece model has {size} pieces, "
            f"the model expects {expected}"
        )
    check_special_ids(sp, where)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's parameters (the ``device`` attribute of a model that is no
    torch module: :class:`fadat.translation.engines.OnnxRuntimeModel`)."""
    if not isinstance(model, nn.Module):
        return torch.device(model.device)
    return next(model.parameters()).device


def model_labels(directories: Sequence[str]) -> list[str]:
    """Short unique labels: each directory's name (``parent/name`` if the name is generic,
    ``#k`` appended to repeats)."""
    labels = []
    for d in directories:
        p = Path(d).resolve()
        label = (
            p.name
            if p.name not in ("model", "final", "averaged", "")
            else f"{p.parent.name}/{p.name}"
        )
        base, k = label, 2
        while label in labels:
            label, k = f"{base}#{k}", k + 1
        labels.append(label)
    return labels
