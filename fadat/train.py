"""``fadat train``: the one training loop, for the DA-Transformer (``--arch dat``, objectives
``nll`` and ``fuzzy``) and the autoregressive baseline (``--arch at``, label-smoothed CE).

setup (config, data, model, optimizer) → resume → loop over updates (token-budget micro-batches,
``--update-freq`` accumulation, AdamW, inverse-sqrt warm-up, clipping) → validate (loss + BLEU)
→ checkpoints. Everything a run produces lives in its run directory::

    RUN_DIR/config.yaml            resolved training config (defaults < --config YAML < flags)
    RUN_DIR/train_log.jsonl        one JSON line per update (loss, lr, glancing ratio, ...)
    RUN_DIR/valid_log.jsonl        one JSON line per validation (loss, BLEU)
    RUN_DIR/train.log              human-readable log
    RUN_DIR/tensorboard/           TensorBoard events
    RUN_DIR/checkpoint_last.pt     model, optimizer, scheduler, grad scaler, RNG, data position
    RUN_DIR/checkpoint_best_uNNNNNNNN.pt   the best ``--keep-best`` checkpoints by validation BLEU
    RUN_DIR/best.json              index of the best checkpoints (file, BLEU, update)

Checkpoints hold only tensors, numbers, strings, lists and dicts: ``torch.load(weights_only=True)``
reads them (no pickle of arbitrary objects). They are written to a temporary file and renamed.

Loss normalisation (anchor-spec §2, ``sample_size = 1``): the DAG losses are per-sentence means
over the whole update (all micro-batches, all ranks): each micro-batch contributes
``Σ_b ℓ_b / N_update``, where ``N_update`` is the update's global number of sentences (tokens for
the AT baseline). The reference instead averages per-micro-batch means; the two agree when
micro-batches are equally full and ours makes one process with a global batch and several
processes with its shards give the same gradient.

Distributed training (torchrun, ``gloo`` on CPU, ``nccl`` on CUDA): every rank holds the full
model; gradients are summed with one ``all_reduce`` per update instead of wrapping the model in
``DistributedDataParallel``. This is the same arithmetic as DDP with a SUM reduction but it needs
no ``no_sync`` bookkeeping for accumulation, no ``find_unused_parameters`` for glancing's no-grad
pass, and a rank whose shard of a global batch is empty (possible at an epoch end) simply
contributes zero gradients instead of running a dummy forward. Rank 0 logs and checkpoints. Only
CPU was run; CUDA/nccl paths are written device-agnostically but untested.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import random
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from fadat import outputs
from fadat.architectures import ARCHITECTURES, model_class
from fadat.data.contract import Batch
from fadat.errors import InputError
from fadat.objectives import (
    OBJECTIVES,
    ObjectiveConfig,
    compute_loss,
    parse_glancing_schedule,
)

logger = logging.getLogger("fadat.train")

CHECKPOINT_FORMAT = "fadat-train-checkpoint-1"
LAST_NAME = "checkpoint_last.pt"
BEST_INDEX = "best.json"
CONFIG_FILE = "config.yaml"
TRAIN_LOG = "train_log.jsonl"
VALID_LOG = "valid_log.jsonl"

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    """Resolved training configuration (saved as ``RUN_DIR/config.yaml``).

    Units: learning rates per update, ``warmup``/``max_updates``/``validate_every`` in updates,
    ``max_time`` in seconds (0 = no limit), ``max_tokens`` per rank and micro-batch (graph/target
    tokens as counted by ``TokenBatchSampler``). Zero means "no limit" for the stop criteria.
    """

    data: str
    run_dir: str
    arch: str = "dat"
    preset: str = "tiny"
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides
    objective: str = ""  # "" = nll for dat, label_smoothed_ce for at
    lr: float = 5e-4
    warmup: int = 4000
    warmup_init_lr: float = 1e-7
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    weight_decay: float = 0.01
    max_tokens: int = 4096
    max_tokens_valid: int = 0  # 0 = max_tokens
    update_freq: int = 1
    clip_norm: float = 0.1
    dropout: float = 0.1
    glat_p: str = ""  # "" = "0.5:0.1@200k" for nll, "0.1" for fuzzy (anchor-spec §3, §4)
    force_emit: bool = True
    ngram_order: int = 2
    label_smoothing: float = 0.1
    max_updates: int = 0
    max_epochs: int = 0
    max_time: float = 0.0
    patience: int = 0
    validate_every: int = 1000
    save_every: int = 0  # 0 = validate_every
    valid_subset: int = 0  # 0 = whole valid split
    keep_best: int = 5
    decode_beta: float = 1.0
    seed: int = 1
    bf16: bool = False
    fp16: bool = False
    init_from: str = ""
    init_encoder_from: str = ""  # DAT/AT model dir: encoder + shared embedding of a fresh model
    init_decoder_layers: bool = False  # with init_encoder_from: the decoder layers too
    device: str = "cpu"
    threads: int = 0
    log_every: int = 10
    progress_bar: bool = True

    def resolved_objective(self) -> str:
        if self.objective:
            return self.objective
        return "label_smoothed_ce" if self.arch == "at" else "nll"

    def resolved_glat_p(self) -> str:
        """The glancing schedule: as given, else the reference recipes' (NLL stage anneals
        0.5 → 0.1 over 200k updates, fuzzy fine-tuning keeps 0.1; anchor-spec §3, §4)."""
        if self.glat_p:
            return self.glat_p
        return "0.1" if self.resolved_objective() == "fuzzy" else "0.5:0.1@200k"


CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
# Keys that may change when a run is resumed (stop criteria, logging, hardware); every other key
# must match the saved config.
RESUMABLE_KEYS = {
    "max_updates",
    "max_epochs",
    "max_time",
    "patience",
    "validate_every",
    "save_every",
    "valid_subset",
    "max_tokens_valid",
    "device",
    "threads",
    "log_every",
    "progress_bar",
    "keep_best",
}


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``"90"``, ``"90s"``, ``"30m"``, ``"2h"`` or a number.

    Raises:
        InputError: malformed or negative duration.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", str(value))
        if m is None:
            raise InputError(f"bad duration {value!r} (use e.g. 90, 90s, 30m, 2h)")
        seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if seconds < 0 or math.isnan(seconds):
        raise InputError(f"duration must be >= 0, got {value!r}")
    return seconds


def _coerce(name: str, value: Any, label: str = "") -> Any:
    """Check/convert one YAML or flag value to the type of TrainConfig.<name>; messages name it
    as ``label`` (default ``config key <name>``)."""
    label = label or f"config key {name}"
    default = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    example = (
        default.default
        if default.default is not dataclasses.MISSING
        else (
            default.default_factory() if default.default_factory is not dataclasses.MISSING else ""
        )
    )
    if name == "max_time":
        return parse_duration(value)
    if name == "glat_p":
        if value is None or value == "":
            return ""
        try:
            parse_glancing_schedule(value)
        except ValueError as err:
            raise InputError(f"{label}: {err}") from None
        return str(value)
    if name == "adam_betas":
        if not (
            isinstance(value, (list, tuple))
            and len(value) == 2
            and all(_finite_number(v) and 0 <= v < 1 for v in value)
        ):
            raise InputError(f"{label} must be two numbers in [0, 1), got {value!r}")
        return (float(value[0]), float(value[1]))
    if name == "model":
        if not isinstance(value, dict):
            raise InputError(f"{label} must be a mapping, got {value!r}")
        return dict(value)
    if isinstance(example, bool):
        if not isinstance(value, bool):
            raise InputError(f"{label} must be true or false, got {value!r}")
        return value
    if isinstance(example, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{label} must be an integer, got {value!r}")
        return value
    if isinstance(example, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{label} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise InputError(f"{label} must be a finite number, got {value!r}")
        return float(value)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{label} must be a string, got {value!r}")
    return value


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """Read a training YAML file (keys of :class:`TrainConfig`, dashes or underscores).

    Raises:
        InputError: missing file, invalid YAML, not a mapping, unknown key or wrongly typed value.
    """
    from fadat.data.prepare import read_lines  # the checked reader of text files

    path = Path(path)
    if path.is_dir():
        raise InputError(f"config file {path} is a directory")
    if not path.is_file():
        raise InputError(f"config file {path} does not exist")
    text = "\n".join(read_lines(path))  # InputError: unreadable, NUL byte, invalid UTF-8
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{where}: invalid YAML ({problem})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a mapping of config keys")
    out = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in CONFIG_FIELDS:
            raise InputError(f"{path}: unknown config key {key!r}")
        try:
            out[name] = _coerce(name, value)
        except InputError as err:
            raise InputError(f"{path}: {err}") from None
    return out


def validate_config(cfg: TrainConfig) -> None:
    """Reject impossible combinations early with one clear message.

    Raises:
        InputError: the problem.
    """
    if cfg.arch not in ARCHITECTURES:
        raise InputError(f"--arch must be one of {', '.join(ARCHITECTURES)}, got {cfg.arch!r}")
    objective = cfg.resolved_objective()
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; choose from {sorted(OBJECTIVES)}")
    if OBJECTIVES[objective][0] != cfg.arch:
        raise InputError(f"objective {objective!r} does not train --arch {cfg.arch}")
    if cfg.bf16 and cfg.fp16:
        raise InputError("--bf16 and --fp16 exclude each other")
    if cfg.init_from and cfg.init_encoder_from:
        raise InputError("--init-from and --init-encoder-from exclude each other")
    if cfg.init_decoder_layers and not cfg.init_encoder_from:
        raise InputError("--init-decoder-layers needs --init-encoder-from")
    checks = [
        (cfg.lr > 0, "--lr must be > 0"),
        (cfg.warmup >= 0, "--warmup must be >= 0"),
        (cfg.max_tokens > 0, "--max-tokens must be > 0"),
        (cfg.update_freq >= 1, "--update-freq must be >= 1"),
        (cfg.clip_norm >= 0, "--clip-norm must be >= 0 (0 = off)"),
        (0 <= cfg.dropout < 1, "--dropout must be in [0, 1)"),
        (cfg.ngram_order >= 1, "ngram_order must be >= 1"),
        (0 <= cfg.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
        (min(cfg.max_updates, cfg.max_epochs, cfg.patience) >= 0, "stop criteria must be >= 0"),
        (cfg.validate_every >= 0 and cfg.save_every >= 0, "intervals must be >= 0"),
        (cfg.keep_best >= 1, "--keep-best must be >= 1"),
        (cfg.valid_subset >= 0, "--valid-subset must be >= 0"),
        (cfg.weight_decay >= 0, "weight_decay must be >= 0"),
        (cfg.warmup_init_lr >= 0, "warmup_init_lr must be >= 0"),
        (cfg.adam_eps > 0, "adam_eps must be > 0"),
        (cfg.max_tokens_valid >= 0, "--max-tokens-valid must be >= 0 (0 = --max-tokens)"),
        (cfg.seed >= 0, f"--seed must be >= 0, got {cfg.seed}"),
        (cfg.threads >= 0, f"--threads must be >= 0 (0 = torch's default), got {cfg.threads}"),
        (cfg.log_every >= 1, f"--log-every must be >= 1, got {cfg.log_every}"),
    ]
    for ok, message in checks:
        if not ok:
            raise InputError(message)
    if not (cfg.max_updates or cfg.max_epochs or cfg.max_time):
        raise InputError("give a stop criterion: --max-updates, --max-epochs or --max-time")


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["adam_betas"] = list(cfg.adam_betas)
    return d


def config_from_dict(d: dict[str, Any], where: str) -> TrainConfig:
    unknown = sorted(set(d) - CONFIG_FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown config keys {unknown}")
    values = {k: _coerce(k, v) for k, v in d.items()}
    try:
        return TrainConfig(**values)
    except TypeError as err:
        raise InputError(f"{where}: {err}") from None


# --------------------------------------------------------------------------------------------
# Learning rate, RNG states, checkpoint files
# --------------------------------------------------------------------------------------------


def inverse_sqrt_lr(update: int, lr: float, warmup: int, warmup_init_lr: float) -> float:
    """fairseq's ``inverse_sqrt`` schedule: linear warm-up from ``warmup_init_lr`` to ``lr`` over
    ``warmup`` updates, then ``lr·sqrt(warmup/u)`` (anchor-spec §4 recipes).

    Args:
        update: 1-based number of the update about to be applied.
        lr: peak learning rate.
        warmup: warm-up length in updates (0 = start at ``lr`` and decay as ``lr/sqrt(u)``).
        warmup_init_lr: learning rate at update 0.

    Returns:
        The learning rate of that update.
    """
    if warmup > 0 and update < warmup:
        return warmup_init_lr + (lr - warmup_init_lr) * update / warmup
    return lr * math.sqrt(max(warmup, 1) / max(update, 1))


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
    """``torch.save`` to ``path.tmp``, fsync, then rename over ``path`` (never a torn file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a training checkpoint with ``torch.load(weights_only=True)`` on CPU.

    Raises:
        InputError: missing, unreadable/corrupt, or not a fadat training checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"checkpoint {path} is a directory, expected a .pt file")
    if not path.is_file():
        raise InputError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for torn or foreign files
        # torch's messages run over many lines; the first says what went wrong.
        first = next((line for line in str(err).splitlines() if line.strip()), "")
        raise InputError(
            f"{path}: cannot read checkpoint ({type(err).__name__}: {first[:200]})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path}: not a fadat training checkpoint")
    return state


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Distributed helpers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> DistInfo:
    """Initialise ``torch.distributed`` when launched by torchrun (``WORLD_SIZE`` > 1): gloo on CPU,
    nccl on CUDA (one device per local rank). Otherwise a single process on ``device``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda requested but CUDA is not available")
        if world > 1:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world_size=world, device=dev)


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss``; Linux counts KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _all_reduce(tensor: torch.Tensor, info: DistInfo, op=None) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def _gather_rng(info: DistInfo) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG state (rank 0 writes them all into checkpoint_last)."""
    mine = capture_rng_state()
    if info.world_size == 1:
        return [mine]
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(info.world_size)]
    for key in sorted(mine):
        value = mine[key]
        wire = value.to(torch.int64) if value.dtype == torch.uint8 else value
        wire = wire.to(info.device)
        parts = [torch.empty_like(wire) for _ in range(info.world_size)]
        dist.all_gather(parts, wire)
        for r, part in enumerate(parts):
            out[r][key] = part.cpu().to(value.dtype)
    return out


# --------------------------------------------------------------------------------------------
# Data and model construction
# --------------------------------------------------------------------------------------------


def _load_data(cfg: TrainConfig):
    from fadat.data.binarized import BinarizedDataset

    data_dir = Path(cfg.data)
    if data_dir.exists() and not data_dir.is_dir():
        raise InputError(f"--data {data_dir}: a file, not a data directory of fadat prepare")
    if not data_dir.is_dir():
        raise InputError(f"data directory {data_dir} does not exist")
    train = BinarizedDataset(data_dir, "train")
    valid = BinarizedDataset(data_dir, "valid") if _has_split(data_dir, "valid") else None
    return train, valid


def _has_split(data_dir: Path, split: str) -> bool:
    from fadat.data.binarized import read_meta

    return split in read_meta(data_dir).get("splits", {})


def _vocab_size(data_dir: Path) -> int:
    from fadat.data.binarized import read_meta

    meta = read_meta(data_dir)
    if "vocab_size" not in meta:
        raise InputError(f"{data_dir / 'meta.json'}: no vocab_size")
    return int(meta["vocab_size"])


def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """A fresh model from ``--preset`` + YAML ``model`` overrides + ``--dropout``, or the weights
    of ``--init-from`` (the FA-DAT fine-tune: weights only, the optimizer starts fresh).

    Raises:
        InputError: bad preset/overrides, or an ``--init-from`` model of the other architecture
            or another vocabulary.
    """
    from fadat.model_dir import load_pretrained
    from fadat.transformer import make_config

    if cfg.init_from:
        model = load_pretrained(cfg.init_from)
        if model.config.model_type != cfg.arch:
            raise InputError(
                f"--init-from {cfg.init_from} holds a {model.config.model_type!r} model, "
                f"not --arch {cfg.arch}"
            )
        if model.config.vocab_size != vocab_size:
            raise InputError(
                f"--init-from {cfg.init_from} has vocabulary size {model.config.vocab_size}, "
                f"the data has {vocab_size}"
            )
        if model.config.dropout != cfg.dropout:
            # Dropout is a training setting: the fine-tune's --dropout wins.
            config = dataclasses.replace(model.config, dropout=cfg.dropout)
            fresh = model_class(cfg.arch)(config)
            fresh.load_state_dict(model.state_dict())
            model = fresh
        model.train()
        return model
    overrides = {"model_type": cfg.arch, "dropout": cfg.dropout, **cfg.model}
    config = make_config(cfg.preset, vocab_size, **overrides)
    model = model_class(cfg.arch)(config)
    if cfg.init_encoder_from:
        _load_encoder(model, cfg.init_encoder_from, cfg.init_decoder_layers)
    return model


def _load_encoder(model: torch.nn.Module, directory: str, decoder_layers: bool = False) -> None:
    """Copy the encoder (with the shared token embedding, which is also the tied output
    projection) of the DAT or AT model in ``directory`` into ``model`` (issue 7: initialising a
    DA-Transformer from a trained AT baseline); with ``decoder_layers`` also the decoder layers
    (self-attention, cross-attention, FFN; the AT's causal mask is not a weight). The decoder's
    position table and the links head stay freshly initialised.

    Raises:
        InputError: the directory's encoder (or decoder layers) differ in shape (vocabulary,
            width, layers, pre/post-norm).
    """
    from fadat.model_dir import load_pretrained

    source = load_pretrained(directory).state_dict()
    own = model.state_dict()
    prefixes = ("encoder.", "layers.", "final_norm.") if decoder_layers else ("encoder.",)
    names = [n for n in own if n.startswith(prefixes)]
    bad = [n for n in names if n not in source or source[n].shape != own[n].shape]
    if bad:
        raise InputError(
            f"--init-encoder-from {directory}: encoder does not fit this model "
            f"(first mismatch: {bad[0]}); use the same vocabulary, width and encoder layers"
        )
    model.load_state_dict({**own, **{n: source[n] for n in names}})


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def usable_indices(dataset, model) -> np.ndarray:
    """Indices of the sentences ``model`` can take (its ``usable``: source within
    ``max_source_positions``; for the AT also the decoder input ``<s> y`` within
    ``max_target_positions``; a DAT target longer than its graph is kept and counted as invalid
    by the NLL).

    Returns:
        ``(N',)`` int64 sorted indices.
    """
    keep = model.usable(np.asarray(dataset.source_lengths), np.asarray(dataset.target_lengths))
    return np.flatnonzero(keep).astype(np.int64)


def _valid_indices(valid, model, subset: int) -> list[int]:
    usable = usable_indices(valid, model).tolist()
    return usable[:subset] if subset else usable


def validate(
    model,
    valid,
    cfg: TrainConfig,
    device: torch.device,
    objective: ObjectiveConfig,
    autocast: dict[str, Any],
) -> dict[str, float]:
    """Loss and BLEU on the first ``--valid-subset`` sentences of the valid split.

    Loss: the training objective without glancing, in eval mode (no dropout). BLEU: sacreBLEU
    (13a tokenisation) of detokenised lookahead outputs (DAT, ``decode_beta`` β) or greedy outputs
    (AT) against the raw references (anchor-spec §6). Runs under a forked RNG so that it never
    changes the training run's random stream.

    Returns:
        ``{"valid_loss", "bleu", "sentences"}``.
    """
    import sacrebleu

    from fadat.data.binarized import raw_references
    from fadat.data.spm import decode as spm_decode
    from fadat.data.spm import load_sentencepiece

    sp = load_sentencepiece(Path(cfg.data) / "spm.model")
    refs_all = raw_references(cfg.data, "valid")
    indices = _valid_indices(valid, model, cfg.valid_subset)
    budget = cfg.max_tokens_valid or cfg.max_tokens
    ratio, max_graph = model.length_budget()
    batches = _valid_batches(valid, indices, budget, ratio, max_graph)
    eval_objective = dataclasses.replace(objective, glancing_ratio=0.0)
    hyps: dict[int, str] = {}
    loss_sum, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        with torch.no_grad():
            for idx in batches:
                batch = valid.collate(idx).to(device)
                with torch.autocast(**autocast):
                    out = compute_loss(model, batch, eval_objective)
                loss_sum += float(out.loss_sum)
                count += out.count
                for sid, tokens in zip(
                    batch.ids.tolist(), _translate(model, batch, cfg), strict=True
                ):
                    hyps[sid] = spm_decode(sp, tokens)
    model.train(was_training)
    order = sorted(hyps)
    hyp_list = [hyps[i] for i in order]
    streams = [[stream[i] for i in order] for stream in refs_all]
    bleu = sacrebleu.corpus_bleu(hyp_list, streams).score if order else 0.0
    return {"valid_loss": loss_sum / max(count, 1), "bleu": float(bleu), "sentences": len(order)}


def _valid_batches(valid, indices, budget, ratio, max_graph) -> list[list[int]]:
    from fadat.data.batching import TokenBatchSampler

    src = [int(valid.source_lengths[i]) for i in indices]
    tgt = [int(valid.target_lengths[i]) for i in indices]
    sampler = TokenBatchSampler(
        src, tgt, budget, ratio, max_graph_positions=max_graph, seed=0, shuffle=False
    )
    return [[indices[j] for j in b] for b in sampler.batches(0) if b]


def _translate(model, batch: Batch, cfg: TrainConfig) -> list[list[int]]:
    """Token ids (without ``<s>``/``</s>``/``<pad>``) of the model's outputs for ``batch``, with
    its ``validation_strategy`` (lookahead with β = ``decode_beta`` for DAT, greedy for AT)."""
    strategy = model.validation_strategy
    options = {"beta": cfg.decode_beta}
    accepted = model.strategies()[strategy]
    options = {k: v for k, v in options.items() if k in accepted}
    hyps = model.translate_batch(batch.source, strategy, options)
    return [tokens for ((tokens, _score),) in hyps]


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------

STAT_KEYS = (
    "loss_sum",
    "count",
    "sentences",
    "target_tokens",
    "glanced",
    "invalid_too_long",
    "invalid_nonfinite",
    "underflow_recomputed",
    "precision_sum",
    "bp_sum",
    "length_ratio_sum",
    "nll_sum",
    "stop",
)


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


class _Interrupt:
    """First Ctrl-C (SIGINT) sets a flag: the loop finishes the update, writes checkpoint_last and
    exits 130. A second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> _Interrupt:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Trainer:
    """State and steps of one training run. Use :func:`train` to run it."""

    def __init__(self, cfg: TrainConfig, resume: bool) -> None:
        started = time.perf_counter()
        validate_config(cfg)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.info = setup_distributed(cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.objective_name = cfg.resolved_objective()
        self.schedule = parse_glancing_schedule(cfg.resolved_glat_p())
        self.train_data, self.valid_data = _load_data(cfg)
        vocab = _vocab_size(Path(cfg.data))
        # Model initialisation draws from the seed on every rank: identical replicas.
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        self._resume_state = load_checkpoint(self.run_dir / LAST_NAME) if resume else None
        if self._resume_state is not None:
            # A resumed run rebuilds the architecture it saved (an --init-from model need not
            # match --preset) and then loads checkpoint_last's weights.
            from fadat.transformer import ModelConfig

            try:
                model_config = ModelConfig.from_dict(dict(self._resume_state["model_config"]))
            except (KeyError, TypeError) as err:
                raise InputError(f"{self.run_dir / LAST_NAME}: no model config ({err})") from None
            self.model = model_class(cfg.arch)(model_config).to(self.info.device)
        else:
            self.model = build_model(cfg, vocab).to(self.info.device)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.warmup_init_lr if cfg.warmup else cfg.lr,
            betas=cfg.adam_betas,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        self.scaler = torch.amp.GradScaler(self.info.device.type, enabled=cfg.fp16)
        dtype = torch.bfloat16 if cfg.bf16 else torch.float16
        self.autocast = dict(
            device_type=self.info.device.type, dtype=dtype, enabled=cfg.bf16 or cfg.fp16
        )
        self.progress = Progress()
        ratio, max_graph = self.model.length_budget()
        from fadat.data.batching import TokenBatchSampler

        self.train_index = usable_indices(self.train_data, self.model)  # (N',)
        dropped = len(self.train_data) - len(self.train_index)
        if not len(self.train_index):
            raise InputError(f"{cfg.data}: no training sentence fits the model's positions")
        self.sampler = TokenBatchSampler(
            np.asarray(self.train_data.source_lengths)[self.train_index],
            np.asarray(self.train_data.target_lengths)[self.train_index],
            cfg.max_tokens,
            ratio,
            max_graph_positions=max_graph,
            seed=cfg.seed,
            shuffle=True,
            rank=self.info.rank,
            world_size=self.info.world_size,
        )
        if resume:
            self._resume()
        else:
            # Training randomness (dropout, glancing) differs per rank but is reproducible.
            torch.manual_seed(cfg.seed + 1000 * self.info.rank + 1)
            random.seed(cfg.seed + self.info.rank)
            np.random.seed((cfg.seed + self.info.rank) % 2**32)
        self.writer = None
        if self.info.is_main:
            outputs.mark_dir(self.run_dir, "run")
            _atomic_write_text(
                self.run_dir / CONFIG_FILE, yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
            )
            self._setup_logging()
            n_params = sum(p.numel() for p in self.params)
            logger.info(
                "%s model, %d parameters, objective %s, %d training sentences (%d longer than the "
                "model's positions skipped), %d process(es)",
                cfg.arch,
                n_params,
                self.objective_name,
                len(self.train_index),
                dropped,
                self.info.world_size,
            )
        # Start-up cost (data, batch plan, model, optimizer; not the imports), every rank's.
        rss = torch.zeros(self.info.world_size, dtype=torch.float64, device=self.info.device)
        rss[self.info.rank] = peak_rss_mib()
        rss = _all_reduce(rss, self.info)
        if self.info.is_main:
            logger.info(
                "ready after %.1f s; peak RSS per process so far: %s MiB",
                time.perf_counter() - started,
                ", ".join(f"{x:.0f}" for x in rss.tolist()),
            )

    # ---- setup helpers

    def _setup_logging(self) -> None:
        handler = logging.FileHandler(self.run_dir / "train.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self._log_handler = handler
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a dependency; tolerate a broken install
            logger.warning("tensorboard unavailable; no event files written")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        handler = getattr(self, "_log_handler", None)
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()

    def _resume(self) -> None:
        state = self._resume_state
        self._resume_state = None  # free the memory once loaded
        where = str(self.run_dir / LAST_NAME)
        saved = state.get("train_config", {})
        for key in CONFIG_FIELDS - RESUMABLE_KEYS - {"run_dir"}:
            mine = config_to_dict(self.cfg)[key]
            if key in saved and saved[key] != mine:
                raise InputError(
                    f"{where}: config key {key!r} was {saved[key]!r}, now {mine!r}; "
                    "a resumed run must keep its config"
                )
        if state.get("world_size") != self.info.world_size:
            raise InputError(
                f"{where}: written by {state.get('world_size')} processes, resumed with "
                f"{self.info.world_size}; the data order depends on it"
            )
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            p = state["progress"]
            self.progress = Progress(
                epoch=int(p["epoch"]),
                batch_index=int(p["batch_index"]),
                update=int(p["update"]),
                elapsed=float(p["elapsed"]),
                best=[dict(b) for b in p["best"]],
                bad_validations=int(p["bad_validations"]),
                last_validated=int(p["last_validated"]),
                skipped_updates=int(p["skipped_updates"]),
            )
            restore_rng_state(state["rng"][self.info.rank])
        except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
            raise InputError(f"{where}: corrupt or incompatible checkpoint ({err})") from None
        if self.info.is_main:
            _truncate_log(self.run_dir / TRAIN_LOG, self.progress.update)
            _truncate_log(self.run_dir / VALID_LOG, self.progress.update)

    # ---- checkpoints

    def _checkpoint_state(self, rng: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "arch": self.cfg.arch,
            "model_config": self.model.config.to_dict(),
            "train_config": config_to_dict(self.cfg),
            "world_size": self.info.world_size,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": {
                "kind": "inverse_sqrt",
                "lr": self.cfg.lr,
                "warmup": self.cfg.warmup,
                "warmup_init_lr": self.cfg.warmup_init_lr,
                "update": self.progress.update,
            },
            "progress": dataclasses.asdict(self.progress),
            "rng": rng,
        }

    def save_last(self) -> None:
        """Write checkpoint_last (collective: every rank contributes its RNG state)."""
        rng = _gather_rng(self.info)
        if self.info.is_main:
            atomic_save(self._checkpoint_state(rng), self.run_dir / LAST_NAME)

    def _save_best(self, bleu: float) -> None:
        """Keep the ``keep_best`` best checkpoints by BLEU (ties: the earlier stays ahead)."""
        p = self.progress
        name = f"checkpoint_best_u{p.update:08d}.pt"
        candidates = p.best + [{"file": name, "bleu": bleu, "update": p.update}]
        candidates.sort(key=lambda b: (-b["bleu"], b["update"]))
        keep, drop = candidates[: self.cfg.keep_best], candidates[self.cfg.keep_best :]
        if any(b["file"] == name for b in keep):
            state = {
                "format": CHECKPOINT_FORMAT,
                "arch": self.cfg.arch,
                "model_config": self.model.config.to_dict(),
                "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "bleu": bleu,
                "update": p.update,
                "data": self.cfg.data,
            }
            atomic_save(state, self.run_dir / name)
        for b in drop:
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / b["file"]).unlink()
        p.best = keep
        index = {"metric": "bleu", "checkpoints": keep}
        _atomic_write_text(self.run_dir / BEST_INDEX, json.dumps(index, indent=2) + "\n")

    # ---- one update

    def _objective(self) -> ObjectiveConfig:
        return ObjectiveConfig(
            name=self.objective_name,
            glancing_ratio=self.schedule(self.progress.update),
            force_emit=self.cfg.force_emit,
            ngram_order=self.cfg.ngram_order,
            label_smoothing=self.cfg.label_smoothing,
        )

    def _count(self, indices: list[int]) -> int:
        if self.objective_name == "label_smoothed_ce":
            return sum(int(self.train_data.target_lengths[i]) - 1 for i in indices)
        return len(indices)

    def train_update(self, group: list[list[int]], stop_flag: float) -> dict[str, float]:
        """Forward/backward the micro-batches of one update, reduce over ranks, step.

        Args:
            group: this rank's micro-batches (lists of sentence indices; some may be empty).
            stop_flag: 1.0 if this rank wants to stop after this update (time limit, Ctrl-C).

        Returns:
            The update's statistics summed over ranks (``STAT_KEYS`` plus ``grad_norm``, ``lr``).
        """
        device = self.info.device
        objective = self._objective()
        total = torch.tensor([float(sum(self._count(idx) for idx in group))], device=device)
        total = float(_all_reduce(total, self.info)[0])
        stats = dict.fromkeys(STAT_KEYS, 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        for idx in group:
            if not idx:
                continue  # an empty shard: zero gradient from this rank
            batch = self.train_data.collate(idx).to(device)
            with torch.autocast(**self.autocast):
                out = compute_loss(self.model, batch, objective)
            self.scaler.scale(out.loss_sum / total).backward()
            stats["loss_sum"] += float(out.loss_sum.detach())
            stats["count"] += out.count
            for key, value in out.stats.items():
                stats[key] += value
        stats["stop"] = stop_flag
        packed = torch.tensor([stats[k] for k in STAT_KEYS], dtype=torch.float64, device=device)
        packed = _all_reduce(packed, self.info)
        reduced = dict(zip(STAT_KEYS, packed.tolist(), strict=True))
        self._reduce_gradients()
        lr = inverse_sqrt_lr(
            self.progress.update + 1, self.cfg.lr, self.cfg.warmup, self.cfg.warmup_init_lr
        )
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        if math.isfinite(grad_norm):
            self.scaler.step(self.optimizer)
        else:
            # Never apply a NaN/inf step (fp16 overflow or a degenerate batch): skip it, log it.
            self.progress.skipped_updates += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.cfg.fp16:
                self.scaler.step(self.optimizer)  # records the overflow, skips the step
        self.scaler.update()
        reduced["grad_norm"] = grad_norm
        reduced["lr"] = lr
        reduced["glancing_ratio"] = objective.glancing_ratio
        return reduced

    def _reduce_gradients(self) -> None:
        """Sum gradients over ranks with one flat all_reduce (missing grads count as zeros)."""
        if self.info.world_size == 1:
            return
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )
        dist.all_reduce(flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    # ---- the loop

    def _epoch_groups(self) -> Iterator[tuple[list[list[int]], bool]]:
        """This rank's micro-batch groups from the current data position on, epoch after epoch,
        each with a flag "last group of its epoch"."""
        uf = self.cfg.update_freq
        while True:
            p = self.progress
            if self.cfg.max_epochs and p.epoch > self.cfg.max_epochs:
                return
            n = self.sampler.num_batches()
            if not n:
                raise InputError(f"{self.cfg.data}: the train split yields no batches")
            # This rank's batches from the saved position on, made one group at a time (a
            # resumed run starts at batch_index without going through the epoch's first part).
            shard = self.sampler.shard(p.epoch, start=p.batch_index)
            for start in range(p.batch_index, n, uf):
                group = [self.train_index[b].tolist() for b in itertools.islice(shard, uf)]
                yield group, start + uf >= n
            # _advance() has moved the position to the next epoch after the last group.

    def _advance(self, group_size: int, epoch_done: bool) -> None:
        p = self.progress
        p.batch_index += group_size
        p.update += 1
        if epoch_done:
            p.epoch += 1
            p.batch_index = 0

    def run(self) -> dict[str, Any]:
        """Train until a stop criterion; returns a summary dict. Raises KeyboardInterrupt after
        writing checkpoint_last if interrupted with Ctrl-C."""
        cfg = self.cfg
        p = self.progress
        bar = self._progress_bar()
        session_start = time.perf_counter()
        start_elapsed = p.elapsed
        last_bleu = float("nan")
        save_every = cfg.save_every or cfg.validate_every
        with _Interrupt() as interrupt:
            stop_reason = self._stop_reason()
            groups = iter(()) if stop_reason else self._epoch_groups()
            for group, epoch_done in groups:
                t0 = time.perf_counter()
                time_up = cfg.max_time and start_elapsed + t0 - session_start >= cfg.max_time
                stats = self.train_update(group, 1.0 if interrupt.requested or time_up else 0.0)
                epoch = p.epoch
                self._advance(len(group), epoch_done)
                p.elapsed = start_elapsed + (time.perf_counter() - session_start)
                record = self._log_update(stats, epoch, time.perf_counter() - t0)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{record['loss']:.4g}",
                        bleu=f"{last_bleu:.2f}",
                        tok_s=f"{record['tokens_per_s']:.0f}",
                    )
                if cfg.validate_every and p.update % cfg.validate_every == 0:
                    last_bleu = self._validate_and_track()
                if save_every and p.update % save_every == 0:
                    self.save_last()
                if stats["stop"] > 0:
                    # Any rank's Ctrl-C or clock stops every rank after the same update.
                    stop_reason = "interrupted" if interrupt.requested else "max_time"
                else:
                    stop_reason = self._stop_reason()
                if stop_reason:
                    break
            stop_reason = stop_reason or "max_epochs"
            if p.last_validated != p.update and stop_reason != "interrupted":
                last_bleu = self._validate_and_track()
            self.save_last()
        if bar is not None:
            bar.close()
        summary = {
            "stop_reason": stop_reason,
            "update": p.update,
            "epoch": p.epoch,
            "best": p.best,
            "elapsed": p.elapsed,
            "skipped_updates": p.skipped_updates,
        }
        if self.info.is_main:
            logger.info("stopped (%s) after %d updates", stop_reason, p.update)
        if stop_reason == "interrupted":
            raise KeyboardInterrupt
        return summary

    def _stop_reason(self) -> str:
        cfg, p = self.cfg, self.progress
        if cfg.max_updates and p.update >= cfg.max_updates:
            return "max_updates"
        if cfg.max_epochs and p.epoch > cfg.max_epochs:
            return "max_epochs"
        if cfg.max_time and p.elapsed >= cfg.max_time:
            return "max_time"
        if cfg.patience and p.bad_validations >= cfg.patience:
            return "patience"
        return ""

    def _progress_bar(self):
        if not (self.info.is_main and self.cfg.progress_bar):
            return None
        from tqdm import tqdm

        total = self.cfg.max_updates or None
        return tqdm(total=total, initial=self.progress.update, unit="upd", dynamic_ncols=True)

    def _log_update(self, stats: dict[str, float], epoch: int, seconds: float) -> dict[str, Any]:
        count = max(stats["count"], 1.0)
        sentences = max(stats["sentences"], 1.0)
        record: dict[str, Any] = {
            "update": self.progress.update,
            "epoch": epoch,
            "loss": stats["loss_sum"] / count,
            "lr": stats["lr"],
            "grad_norm": stats["grad_norm"],
            "sentences": int(stats["sentences"]),
            "target_tokens": int(stats["target_tokens"]),
            "tokens_per_s": stats["target_tokens"] / max(seconds, 1e-9),
            "elapsed": round(self.progress.elapsed, 1),
        }
        if self.cfg.arch == "dat":
            record.update(
                glancing_ratio=stats["glancing_ratio"],
                glanced=int(stats["glanced"]),
                invalid_too_long=int(stats["invalid_too_long"]),
                invalid_nonfinite=int(stats["invalid_nonfinite"]),
                underflow_recomputed=int(stats["underflow_recomputed"]),
            )
        if self.objective_name == "fuzzy":
            record.update(
                precision=stats["precision_sum"] / sentences,
                bp=stats["bp_sum"] / sentences,
                length_ratio=stats["length_ratio_sum"] / sentences,
            )
        if self.objective_name == "label_smoothed_ce":
            record["nll"] = stats["nll_sum"] / count
        if not math.isfinite(stats["grad_norm"]):
            record["skipped"] = True
            record["grad_norm"] = None
        if self.info.is_main:
            with open(self.run_dir / TRAIN_LOG, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            if self.writer is not None:
                for key, value in record.items():
                    if key not in ("update", "epoch") and isinstance(value, (int, float)):
                        self.writer.add_scalar(f"train/{key}", value, record["update"])
            if self.cfg.log_every and record["update"] % self.cfg.log_every == 0:
                logger.info("update %s", json.dumps(record))
        return record

    def _validate_and_track(self) -> float:
        """Validate on rank 0, broadcast BLEU, update best checkpoints and patience."""
        p = self.progress
        p.last_validated = p.update
        result = torch.zeros(1, dtype=torch.float64, device=self.info.device)
        if self.info.is_main and self.valid_data is not None:
            metrics = validate(
                self.model,
                self.valid_data,
                self.cfg,
                self.info.device,
                self._objective(),
                self.autocast,
            )
            result[0] = metrics["bleu"]
            record = {
                "update": p.update,
                "epoch": p.epoch,
                "elapsed": round(p.elapsed, 1),
                **metrics,
            }
            with open(self.run_dir / VALID_LOG, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            if self.writer is not None:
                self.writer.add_scalar("valid/loss", metrics["valid_loss"], p.update)
                self.writer.add_scalar("valid/bleu", metrics["bleu"], p.update)
            logger.info("valid %s", json.dumps(record))
        if self.info.world_size > 1:
            dist.broadcast(result, src=0)
        if self.valid_data is None:
            return float("nan")
        bleu = float(result[0])
        previous_best = max((b["bleu"] for b in p.best), default=-math.inf)
        p.bad_validations = 0 if bleu > previous_best else p.bad_validations + 1
        if self.info.is_main:
            self._save_best(bleu)
        else:
            self._track_best_only(bleu)
        return bleu

    def _track_best_only(self, bleu: float) -> None:
        # Non-main ranks mirror the best list so every rank's checkpoint progress agrees.
        p = self.progress
        name = f"checkpoint_best_u{p.update:08d}.pt"
        candidates = p.best + [{"file": name, "bleu": bleu, "update": p.update}]
        candidates.sort(key=lambda b: (-b["bleu"], b["update"]))
        p.best = candidates[: self.cfg.keep_best]


def _truncate_log(path: Path, update: int) -> None:
    """Keep the log lines of updates ≤ ``update`` (a killed run may have logged updates after its
    last checkpoint, or a torn last line)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and int(record.get("update", -1)) <= update:
            kept.append(line)
    _atomic_write_text(path, "".join(line + "\n" for line in kept))


def train(cfg: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """Run (or resume) training as configured; returns the summary (stop reason, update, best).

    Raises:
        InputError: bad config, data, ``--init-from`` or resume state.
        KeyboardInterrupt: after Ctrl-C, once checkpoint_last is written.
    """
    run_dir = Path(cfg.run_dir)
    # Before any work: a new, empty or fadat run directory in a writable place (fadat.outputs).
    option = "--resume" if resume else "--run-dir"
    if not outputs.check_output_dir(run_dir, "run", option) and resume:
        raise InputError(f"--resume {run_dir}: not a run directory of fadat train")
    if not resume and (run_dir / LAST_NAME).exists():
        raise InputError(
            f"run directory {run_dir} already holds a run; "
            f"use --resume {run_dir} or a new --run-dir"
        )
    trainer = Trainer(cfg, resume=resume)
    try:
        return trainer.run()
    finally:
        trainer.close()


# --------------------------------------------------------------------------------------------
# Checkpoint averaging (anchor-spec §6)
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
    """Arithmetic mean of the model weights of several checkpoints (anchor-spec §6: floating
    tensors averaged in fp32 and cast back; integer tensors floor-divided).

    Args:
        paths: training checkpoints (``checkpoint_best_*.pt`` or ``checkpoint_last.pt``).

    Returns:
        ``(state_dict, first checkpoint's metadata without weights)``.

    Raises:
        InputError: no paths, unreadable files, or checkpoints of different models.
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
        if i == 0:
            first_meta = meta
            dtypes = {k: v.dtype for k, v in weights.items()}
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


def write_averaged_model(
    paths: list[str | Path],
    output: str | Path,
    data_dir: str | Path | None,
    weights_dtype: str = "float32",
) -> Path:
    """Average ``paths`` and write a model directory with ``save_pretrained``, the data's
    sentencepiece model and its licence/attribution (from ``DATA/meta.json``); the weights are
    stored as ``weights_dtype`` (see :func:`fadat.model_dir.save_model_directory`).

    Returns:
        The output directory.

    Raises:
        InputError: as :func:`average_checkpoints`, or a missing data directory / spm model.
    """
    from fadat.transformer import ModelConfig

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


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

# flag -> (config key, type, help). Every flag defaults to None so that only explicit flags
# override the YAML file and the defaults.
_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--data", "data", str, "binarized data directory (from fadat prepare)"),
    ("--run-dir", "run_dir", str, "run directory (config, logs, checkpoints)"),
    ("--arch", "arch", str, "dat (DA-Transformer) or at (autoregressive baseline)"),
    ("--preset", "preset", str, "model preset: tiny, cpu-small, base"),
    ("--objective", "objective", str, "nll | fuzzy (dat), label_smoothed_ce (at)"),
    ("--lr", "lr", float, "peak learning rate (default 5e-4)"),
    ("--warmup", "warmup", int, "warm-up updates of the inverse-sqrt schedule"),
    ("--max-tokens", "max_tokens", int, "token budget per micro-batch and process"),
    ("--max-tokens-valid", "max_tokens_valid", int, "token budget for validation batches"),
    ("--update-freq", "update_freq", int, "micro-batches accumulated per update"),
    ("--clip-norm", "clip_norm", float, "gradient-norm clipping (0 = off; default 0.1)"),
    ("--dropout", "dropout", float, "dropout (default 0.1)"),
    ("--weight-decay", "weight_decay", float, "AdamW decoupled weight decay (default 0.01)"),
    (
        "--glat-p",
        "glat_p",
        str,
        'glancing ratio schedule, e.g. "0.5:0.1@200k" (nll default) or "0.1" (fuzzy default)',
    ),
    ("--ngram-order", "ngram_order", int, "n of the fuzzy alignment loss (default 2)"),
    ("--label-smoothing", "label_smoothing", float, "label smoothing of --arch at (0.1)"),
    ("--max-updates", "max_updates", int, "stop after this many updates"),
    ("--max-epochs", "max_epochs", int, "stop after this many epochs"),
    ("--max-time", "max_time", str, "stop after this training time (90s, 30m, 2h)"),
    ("--patience", "patience", int, "stop after N validations without a better BLEU"),
    ("--validate-every", "validate_every", int, "validate every N updates (0 = at the end)"),
    ("--save-every", "save_every", int, "write checkpoint_last every N updates"),
    ("--valid-subset", "valid_subset", int, "validate on the first N sentences (0 = all)"),
    ("--keep-best", "keep_best", int, "keep the best K checkpoints by BLEU"),
    ("--decode-beta", "decode_beta", float, "β of lookahead decoding in validation"),
    ("--seed", "seed", int, "random seed"),
    ("--init-from", "init_from", str, "model directory to take initial weights from"),
    (
        "--init-encoder-from",
        "init_encoder_from",
        str,
        "model directory (DAT or AT) whose encoder and embedding start a fresh model",
    ),
    ("--device", "device", str, "cpu or cuda"),
    ("--threads", "threads", int, "torch CPU threads (0 = torch default)"),
    ("--log-every", "log_every", int, "write an update line to train.log every N updates"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fadat train`` (fairseq-style names)."""
    parser.add_argument("--config", help="YAML file of config keys (flags override it)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    for flag, key, typ, help_text in _FLAGS:
        parser.add_argument(flag, dest=key, type=typ, default=None, help=help_text)
    parser.add_argument(
        "--bf16", dest="bf16", action="store_true", default=None, help="bf16 autocast"
    )
    parser.add_argument(
        "--fp16",
        dest="fp16",
        action="store_true",
        default=None,
        help="fp16 autocast + grad scaling",
    )
    parser.add_argument(
        "--init-decoder-layers",
        dest="init_decoder_layers",
        action="store_true",
        default=None,
        help="with --init-encoder-from: copy the decoder layers too",
    )
    parser.add_argument(
        "--no-force-emit",
        dest="force_emit",
        action="store_false",
        default=None,
        help="do not pin glanced vertices to their oracle token",
    )
    parser.add_argument(
        "--no-progress-bar",
        dest="progress_bar",
        action="store_false",
        default=None,
        help="no tqdm bar",
    )


def resolve_config(args: argparse.Namespace) -> tuple[TrainConfig, bool]:
    """Defaults < saved config (``--resume``) or ``--config`` YAML < explicit flags.

    Raises:
        InputError: unknown YAML keys, bad values, or flags that conflict with a resumed run.
    """
    explicit = {}
    for key in CONFIG_FIELDS:
        value = getattr(args, key, None)
        if value is not None:
            explicit[key] = _coerce(key, value, "--" + key.replace("_", "-"))
    if args.resume:
        run_dir = Path(args.resume)
        saved_path = run_dir / CONFIG_FILE
        if not (run_dir / LAST_NAME).is_file():
            raise InputError(f"cannot resume: {run_dir / LAST_NAME} does not exist")
        saved = load_yaml_config(saved_path)
        for key, value in explicit.items():
            if key not in RESUMABLE_KEYS and key != "run_dir" and saved.get(key) != value:
                raise InputError(
                    f"--resume {run_dir}: {key} is {saved.get(key)!r} in the run, "
                    f"{value!r} given; only stop criteria, logging and device may change"
                )
        values = {**saved, **explicit, "run_dir": str(run_dir)}
        return config_from_dict(values, str(saved_path)), True
    values = load_yaml_config(args.config) if args.config else {}
    values.update(explicit)
    for key in ("data", "run_dir"):
        if not values.get(key):
            raise InputError(f"--{key.replace('_', '-')} is required")
    cfg = config_from_dict(values, args.config or "flags")
    validate_config(cfg)
    if not cfg.init_from:
        # The preset and the YAML's model section, checked before any data is read (the
        # vocabulary size is a placeholder: the data's is used later).
        from fadat.transformer import make_config

        try:
            make_config(cfg.preset, 8, model_type=cfg.arch, dropout=cfg.dropout, **cfg.model)
        except InputError as err:
            where = f"{args.config}: " if args.config and cfg.model else ""
            raise InputError(f"{where}{err}") from None
    return cfg, False


def run(args: argparse.Namespace) -> int:
    """``fadat train``: returns 0; Ctrl-C → KeyboardInterrupt (exit 130) after a checkpoint."""
    cfg, resume = resolve_config(args)
    summary = train(cfg, resume=resume)
    if int(os.environ.get("RANK", "0")) == 0:
        best = summary["best"][0]["bleu"] if summary["best"] else float("nan")
        print(
            f"stopped ({summary['stop_reason']}) at update {summary['update']}, "
            f"best BLEU {best:.2f}; run directory {cfg.run_dir}"
        )
    if dist.is_initialized():
        # Every rank waits here before tearing down: gloo aborts a process ("terminate called
        # without an active exception") that destroys its group while a peer is still connected.
        dist.barrier()
        dist.destroy_process_group()
    return 0
