"""The training configuration of ``fadat train``: :class:`TrainConfig` (its core fields plus the
chosen objective's options dataclass), reading it from YAML, converting values, validating it
(the ``fadat train`` flags and their resolution against a YAML file or a resumed run are the
verb's, :mod:`fadat.cli.train`).

In YAML files, saved ``config.yaml`` files and flags the objective's options are flat keys
(``ngram_order: 2``, ``--ngram-order 2``); they fill ``TrainConfig.objective_options``. A key of
another objective is an error, except in a saved config (runs saved before objectives owned their
options list every objective's keys; a resumed run ignores those of other objectives).

Resolution order: defaults < ``--config`` YAML (or the saved config of ``--resume``) < explicit
flags. Keys use underscores or dashes. A resumed run may change only :data:`RESUMABLE_KEYS`,
and ``data`` to another path of the same dataset (:data:`VERIFIED_RESUME_KEYS`): the keys that
must stay are :func:`fixed_resume_keys`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fadat.data.text import read_lines
from fadat.errors import InputError
from fadat.models.architectures import ARCHITECTURES
from fadat.objectives import OBJECTIVES, ObjectiveConfig, Option, all_options, default_objective
from fadat.objectives.base import options_of
from fadat.objectives.glancing import parse_glancing_schedule
from fadat.options import MAX_SEED, MAX_THREADS

CONFIG_FILE = "config.yaml"
LAST_NAME = "checkpoint_last.pt"


@dataclass(frozen=True)
class TrainConfig:
    """The resolved training configuration (saved as ``RUN_DIR/config.yaml``, flat: the core
    fields and the fields of ``objective_options``).

    ``objective_options`` is the chosen objective's frozen options dataclass (e.g.
    :class:`fadat.objectives.dat.FuzzyOptions`); ``None`` is replaced by its defaults (and stays
    ``None`` for an objective without options).

    Units: learning rates per update, ``warmup``/``max_updates``/``validate_every`` in updates,
    ``max_time`` in seconds (0 = no limit), ``max_tokens`` per rank and micro-batch (graph/target
    tokens as counted by ``TokenBatchSampler``). Zero means "no limit" for the stop criteria.
    """

    data: str
    run_dir: str
    arch: str = "dat"
    preset: str = "tiny"
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig overrides
    objective: str = ""  # "" = the architecture's default objective (nll for dat, CE for at)
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
    upsample_ratio: float = 0.0  # λ of a fresh DAT model; 0 = the preset's
    # (a, b): each training sentence's λ drawn uniformly from [a, b] (DA-Transformer v2's
    # --upsample-scale a~b; ModelConfig.upsample_ratio_range); () = the model's (fixed λ)
    upsample_ratio_range: tuple[float, ...] = ()
    glat_p: str = ""  # "" = the objective's default schedule (nll "0.5:0.1@200k", fuzzy "0.1")
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
    objective_options: Any = None  # the chosen objective's options dataclass

    def __post_init__(self) -> None:
        if self.objective_options is None:
            objective = OBJECTIVES.get(self.resolved_objective())
            if objective is not None and objective.options_class is not None:
                object.__setattr__(self, "objective_options", objective.options_class())

    def resolved_objective(self) -> str:
        """``objective``, else the one registered as the default of ``arch``."""
        return self.objective or default_objective(self.arch)

    def resolved_glat_p(self) -> str:
        """The glancing schedule: as given, else the objective's default (the reference
        recipes: the NLL stage anneals 0.5 → 0.1 over 200k updates, fuzzy fine-tuning keeps
        0.1; docs/reference-behaviour.md, "Glancing")."""
        if self.glat_p:
            return self.glat_p
        objective = OBJECTIVES.get(self.resolved_objective())
        return objective.glancing if objective is not None else "0"


#: The core keys of :class:`TrainConfig` (every field but ``objective_options``).
CORE_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)} - {"objective_options"}


def _options() -> dict[str, Option]:
    """Every registered objective's options by key (imports every objective)."""
    return {o.name: o for o in all_options()}


def config_keys() -> set[str]:
    """The keys of a YAML config: the core fields and every objective's options."""
    return CORE_FIELDS | set(_options())


# Keys that may change when a run is resumed (stop criteria, logging, hardware, and the DAG
# programmes' implementation, which computes the same values); every other key must match the
# saved config.
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
    "dag_backend",
}

#: Keys that a resumed run may change only to a value naming the same thing: ``data``, another
#: path to the dataset the run trained on (its training files have the content the run's
#: checkpoint records, :func:`fadat.data.binarized.training_digest`; checked when the checkpoint
#: is read, :func:`fadat.training.checkpoints.check_resume_data`).
VERIFIED_RESUME_KEYS = {"data"}


def fixed_resume_keys(keys: Iterable[str]) -> set[str]:
    """The keys among ``keys`` that a resumed run must keep as saved: all but
    :data:`RESUMABLE_KEYS`, :data:`VERIFIED_RESUME_KEYS` and ``run_dir`` (the run directory is
    where the run is, not a setting of it). ``fadat train --resume`` checks its flags with it,
    the trainer the checkpoint's saved config."""
    return set(keys) - RESUMABLE_KEYS - VERIFIED_RESUME_KEYS - {"run_dir"}


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


def coerce_value(name: str, value: Any, label: str = "") -> Any:
    """Check/convert one YAML or flag value to the type of TrainConfig.<name>; messages name it
    as ``label`` (default ``config key <name>``)."""
    label = label or f"config key {name}"
    if name in CORE_FIELDS:
        default = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
        example = (
            default.default
            if default.default is not dataclasses.MISSING
            else (
                default.default_factory()
                if default.default_factory is not dataclasses.MISSING
                else ""
            )
        )
    else:
        example = _options()[name].default
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
    if name == "upsample_ratio_range":
        if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
            return ()
        if not (
            isinstance(value, (list, tuple))
            and len(value) == 2
            and all(_finite_number(v) for v in value)
            and 0 < value[0] <= value[1]
        ):
            raise InputError(f"{label} must be two numbers 0 < a <= b, got {value!r}")
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


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: PyYAML keeps the last
    one silently, so ``arch: dat`` followed by ``arch: at`` would train an AT."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": overriding merged keys is fine
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if line != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first on line {line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """Read a training YAML file (keys of :class:`TrainConfig`, dashes or underscores).

    Raises:
        InputError: missing file, invalid YAML, a key given twice, not a mapping, unknown key or
            wrongly typed value (the message names the file, and the line or the key).
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"config file {path} is a directory")
    if not path.is_file():
        raise InputError(f"config file {path} does not exist")
    text = "\n".join(read_lines(path))  # InputError: unreadable, NUL byte, invalid UTF-8
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
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
    keys = config_keys()
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in keys:
            raise InputError(f"{path}: unknown config key {key!r}")
        if name in out:  # "lr" and "lr-" spellings of one key
            raise InputError(f"{path}: config key {name} is given twice ({key!r})")
        try:
            out[name] = coerce_value(name, value)
        except InputError as err:
            raise InputError(f"{path}: {err}") from None
    return out


def flag_of(key: str) -> str:
    """The ``fadat train`` flag of config key ``key`` (``--no-force-emit`` for a boolean objective
    option that defaults to true)."""
    option = _options().get(key)
    return option.flag if option is not None else "--" + key.replace("_", "-")


def validate_config(
    cfg: TrainConfig, sources: dict[str, str] | None = None, applicable: bool = True
) -> None:
    """Reject impossible values and combinations early with one clear message.

    Args:
        cfg: the resolved configuration.
        sources: where each key was given, for messages: ``{"lr": "run.yaml: config key lr"}``
            for a YAML file, ``{"lr": "--lr"}`` for a flag. A key given in neither (a default)
            is named by its flag.
        applicable: options given in ``sources`` that do not apply to the chosen architecture
            or objective are errors (off for a resumed run, which keeps the options it was
            started with).

    Raises:
        InputError: the problem, naming the file and key or the flag that set the value.
    """
    sources = sources or {}

    def name(key: str) -> str:
        return sources.get(key) or flag_of(key)

    if cfg.arch not in ARCHITECTURES:
        raise InputError(
            f"{name('arch')} must be one of {', '.join(ARCHITECTURES)}, got {cfg.arch!r}"
        )
    objective = cfg.resolved_objective()
    if objective not in OBJECTIVES:
        raise InputError(
            f"{name('objective')}: unknown objective {objective!r}; choose from "
            f"{sorted(OBJECTIVES)}"
        )
    if OBJECTIVES[objective].architecture != cfg.arch:
        raise InputError(f"objective {objective!r} does not train {name('arch')} {cfg.arch}")
    if cfg.bf16 and cfg.fp16:
        raise InputError(f"{name('bf16')} and {name('fp16')} exclude each other")
    if cfg.init_from and cfg.init_encoder_from:
        raise InputError(f"{name('init_from')} and {name('init_encoder_from')} exclude each other")
    if cfg.init_decoder_layers and not cfg.init_encoder_from:
        raise InputError(f"{name('init_decoder_layers')} needs --init-encoder-from")
    checks = [
        ("lr", cfg.lr > 0, "must be > 0"),
        ("warmup", cfg.warmup >= 0, "must be >= 0"),
        ("max_tokens", cfg.max_tokens > 0, "must be > 0"),
        ("update_freq", cfg.update_freq >= 1, "must be >= 1"),
        ("clip_norm", cfg.clip_norm >= 0, "must be >= 0 (0 = off)"),
        ("dropout", 0 <= cfg.dropout < 1, "must be in [0, 1)"),
        ("upsample_ratio", cfg.upsample_ratio >= 0, "must be >= 0 (0 = the preset's)"),
        *((k, getattr(cfg, k) >= 0, "must be >= 0") for k in ("max_updates", "max_epochs")),
        ("patience", cfg.patience >= 0, "must be >= 0"),
        ("validate_every", cfg.validate_every >= 0, "must be >= 0"),
        ("save_every", cfg.save_every >= 0, "must be >= 0"),
        ("keep_best", cfg.keep_best >= 1, "must be >= 1"),
        ("valid_subset", cfg.valid_subset >= 0, "must be >= 0"),
        ("weight_decay", cfg.weight_decay >= 0, "must be >= 0"),
        ("warmup_init_lr", cfg.warmup_init_lr >= 0, "must be >= 0"),
        ("adam_eps", cfg.adam_eps > 0, "must be > 0"),
        ("max_tokens_valid", cfg.max_tokens_valid >= 0, "must be >= 0 (0 = --max-tokens)"),
        ("seed", 0 <= cfg.seed <= MAX_SEED, f"must be >= 0 and at most {MAX_SEED}"),
        (
            "threads",
            0 <= cfg.threads <= MAX_THREADS,
            f"must be >= 0 (0 = torch's default) and at most {MAX_THREADS}",
        ),
        ("log_every", cfg.log_every >= 1, "must be >= 1"),
    ]
    options_class = OBJECTIVES[objective].options_class
    given = cfg.objective_options
    if (options_class is None) != (given is None) or not (
        given is None or isinstance(given, options_class)
    ):
        raise InputError(
            f"{name('objective_options')} is {type(given).__name__}, not the options of the "
            f"objective {objective!r} ({getattr(options_class, '__name__', 'none')})"
        )
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    values.update(dataclasses.asdict(given) if given is not None else {})
    checks += [(o.name, o.check is None or o.check(values[o.name]), o.problem)
               for o in options_of(options_class)]  # fmt: skip
    for key, ok, requirement in checks:
        if not ok:
            requirement = requirement.removeprefix(key).strip()
            raise InputError(f"{name(key)} {requirement}, got {values[key]!r}")
    if applicable:
        _refuse_inapplicable(cfg, sources)
    if not (cfg.max_updates or cfg.max_epochs or cfg.max_time):
        raise InputError("give a stop criterion: --max-updates, --max-epochs or --max-time")


def field_sources(cfg: TrainConfig) -> dict[str, str]:
    """The ``sources`` of :func:`validate_config` for a ``TrainConfig`` built in Python: the
    fields off their defaults (``{"lr": "TrainConfig.lr"}``, ``{"ngram_order":
    "TrainConfig.objective_options.ngram_order"}``) and ``objective_options`` itself."""
    sources = {
        f.name: f"TrainConfig.{f.name}"
        for f in dataclasses.fields(cfg)
        if f.default is not dataclasses.MISSING and getattr(cfg, f.name) != f.default
    }
    sources["objective_options"] = "TrainConfig.objective_options"
    if dataclasses.is_dataclass(cfg.objective_options):
        sources.update(
            (f.name, f"TrainConfig.objective_options.{f.name}")
            for f in dataclasses.fields(cfg.objective_options)
            if getattr(cfg.objective_options, f.name) != f.default
        )
    return sources


#: Core keys that only some architectures read.
_ARCH_KEYS = {
    "upsample_ratio": ("dat", "ctc"),  # λ: the graph (DAT) or the CTC output length
    "upsample_ratio_range": ("dat",),  # λ drawn per training sentence
    "decode_beta": ("dat",),  # β of lookahead in validation
}


def _refuse_inapplicable(cfg: TrainConfig, sources: dict[str, str]) -> None:
    """Options given (in ``sources``) that the chosen architecture or objective does not read:
    an error, not silently ignored.

    Raises:
        InputError: naming the option, where it was given, and what it applies to.
    """
    objective = OBJECTIVES[cfg.resolved_objective()]
    own = {o.name for o in objective.options}
    options = _options()
    for key, where in sources.items():
        if key in options and key not in own:
            owners = [o.name for o in OBJECTIVES.values() if key in {x.name for x in o.options}]
            raise InputError(
                f"{where} applies to the objective {' or '.join(owners)}, not to "
                f"{objective.name!r} (--arch {cfg.arch}); remove it"
            )
        if key in _ARCH_KEYS and cfg.arch not in _ARCH_KEYS[key]:
            raise InputError(
                f"{where} applies to --arch {' or '.join(_ARCH_KEYS[key])}, not to "
                f"--arch {cfg.arch}; remove it"
            )
        if key == "glat_p" and cfg.glat_p.strip() not in ("", "0") and objective.glancing == "0":
            raise InputError(
                f"{where}: the objective {objective.name!r} does not glance; remove it"
            )


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The flat form of ``cfg`` (``config.yaml``, checkpoints): the core fields, then the fields
    of ``cfg.objective_options``."""
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    del d["objective_options"]
    d["model"] = dict(cfg.model)
    d["adam_betas"] = list(cfg.adam_betas)
    d["upsample_ratio_range"] = list(cfg.upsample_ratio_range)
    if cfg.objective_options is not None:
        d.update(dataclasses.asdict(cfg.objective_options))
    return d


def config_from_dict(d: dict[str, Any], where: str) -> TrainConfig:
    """A :class:`TrainConfig` from flat keys (:func:`config_to_dict`, a YAML file, flags).

    The keys of the chosen objective's options fill ``objective_options``; keys of other
    objectives are dropped here (a config saved before objectives owned their options lists them
    all); :func:`validate_config` rejects them where a user gave them.

    Raises:
        InputError: unknown key or wrongly typed value, naming ``where``.
    """
    unknown = sorted(set(d) - config_keys())
    if unknown:
        raise InputError(f"{where}: unknown config keys {unknown}")
    values = {k: coerce_value(k, v) for k, v in d.items()}
    try:
        cfg = TrainConfig(**{k: v for k, v in values.items() if k in CORE_FIELDS})
    except TypeError as err:
        raise InputError(f"{where}: {err}") from None
    if cfg.objective_options is None:
        return cfg
    own = {f.name for f in dataclasses.fields(cfg.objective_options)}
    options = dataclasses.replace(
        cfg.objective_options, **{k: v for k, v in values.items() if k in own}
    )
    return dataclasses.replace(cfg, objective_options=options)


def objective_config(cfg: TrainConfig, glancing_ratio: float) -> ObjectiveConfig:
    """The settings of one update's step: the objective, the scheduled glancing ratio and the
    objective options of ``cfg``."""
    return ObjectiveConfig(cfg.resolved_objective(), glancing_ratio, cfg.objective_options)
