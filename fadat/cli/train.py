"""``fadat train``: its flags (fairseq-style names), their resolution against the defaults, a
``--config`` YAML file or the saved config of ``--resume``, and the run
(:func:`fadat.training.trainer.train`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from fadat.cli.common import add_force_argument
from fadat.errors import InputError
from fadat.models.architectures import ARCHITECTURES
from fadat.objectives import OBJECTIVES, all_options
from fadat.options import check_threads
from fadat.training.config import (
    CONFIG_FILE,
    LAST_NAME,
    TrainConfig,
    coerce_value,
    config_from_dict,
    config_keys,
    fixed_resume_keys,
    flag_of,
    load_yaml_config,
    validate_config,
)
from fadat.training.model_init import lambda_overrides
from fadat.training.schedule import stop_text
from fadat.training.trainer import train

# flag -> (config key, type, help). Every flag defaults to None so that only explicit flags
# override the YAML file and the defaults.
_FLAGS: list[tuple[str, str, Any, str]] = [
    (
        "--data",
        "data",
        str,
        "binarized data directory (from fadat prepare); with --resume, the run's dataset at "
        "another path than its config.yaml's: accepted when its training files have the content "
        "(sha256) that the run's checkpoint records, whichever fadat version prepared it",
    ),
    ("--run-dir", "run_dir", str, "run directory (config, logs, checkpoints)"),
    ("--arch", "arch", str, f"architecture: {', '.join(ARCHITECTURES)} (dat: DA-Transformer)"),
    (
        "--preset",
        "preset",
        str,
        "model preset: tiny, cpu-small, cpu-small-4x2, cpu-small-5x1 (deep encoder, shallow "
        "decoder), base",
    ),
    ("--objective", "objective", str, f"objective: {', '.join(OBJECTIVES)}"),
    ("--lr", "lr", float, "peak learning rate (default 5e-4)"),
    ("--warmup", "warmup", int, "warm-up updates of the inverse-sqrt schedule"),
    ("--max-tokens", "max_tokens", int, "token budget per micro-batch and process"),
    ("--max-tokens-valid", "max_tokens_valid", int, "token budget for validation batches"),
    ("--update-freq", "update_freq", int, "micro-batches accumulated per update"),
    ("--clip-norm", "clip_norm", float, "gradient-norm clipping (0 = off; default 0.1)"),
    ("--dropout", "dropout", float, "dropout (default 0.1)"),
    (
        "--upsample-ratio",
        "upsample_ratio",
        float,
        "λ: graph size L = λ·|x| of a fresh DAT model (DA-Transformer's --upsample-scale; "
        "default: the preset's)",
    ),
    (
        "--upsample-ratio-range",
        "upsample_ratio_range",
        float,
        "A B: draw each training sentence's λ uniformly from [A, B] at every update "
        "(DA-Transformer v2's --upsample-scale A~B; DAT only; the budget of --max-tokens counts "
        "λ = B); default: the model's fixed λ",
    ),
    ("--weight-decay", "weight_decay", float, "AdamW decoupled weight decay (default 0.01)"),
    (
        "--glat-p",
        "glat_p",
        str,
        'glancing ratio schedule, e.g. "0.5:0.1@200k" (nll default) or "0.1" (fuzzy default)',
    ),
    ("--max-updates", "max_updates", int, "stop after this many updates"),
    ("--max-epochs", "max_epochs", int, "stop after this many epochs"),
    (
        "--max-time",
        "max_time",
        str,
        "stop when the run has trained this long, its resumes included (90s, 30m, 2h)",
    ),
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
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR with its saved config; only stop criteria, logging, "
        "device and --data (the same dataset at another path) may change",
    )
    parser.add_argument(
        "--reset-optimizer",
        action="store_true",
        help="with --resume: start AdamW afresh (zero moments; as fairseq's --reset-optimizer) "
        "instead of loading its state; the update count, LR schedule, data position and RNG "
        "continue. Required to continue a compact copy of fadat snapshot",
    )
    for flag, key, typ, help_text in _FLAGS:
        nargs = 2 if key == "upsample_ratio_range" else None
        metavar = ("A", "B") if nargs else None
        parser.add_argument(
            flag, dest=key, type=typ, nargs=nargs, metavar=metavar, default=None, help=help_text
        )
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
    for option in all_options():  # the objectives' own flags
        if option.type is bool:
            action = "store_false" if option.default else "store_true"
            parser.add_argument(
                option.flag, dest=option.name, action=action, default=None, help=option.help
            )
        else:
            parser.add_argument(
                option.flag, dest=option.name, type=option.type, default=None, help=option.help
            )
    parser.add_argument(
        "--no-progress-bar",
        dest="progress_bar",
        action="store_false",
        default=None,
        help="no tqdm bar",
    )
    add_force_argument(parser)


def resolve_config(args: argparse.Namespace) -> tuple[TrainConfig, bool]:
    """Defaults < saved config (``--resume``) or ``--config`` YAML < explicit flags.

    With ``--resume``, ``--data`` may name another path than the saved one: the trainer accepts
    it when it holds the run's dataset (:func:`fadat.training.checkpoints.check_resume_data`).

    Raises:
        InputError: unknown YAML keys, bad values, or flags that conflict with a resumed run
            (a key outside :data:`~fadat.training.config.RESUMABLE_KEYS` and ``data``).
    """
    explicit = {}
    for key in config_keys():
        value = getattr(args, key, None)
        if value is not None:
            explicit[key] = coerce_value(key, value, flag_of(key))
    if args.resume:
        run_dir = Path(args.resume)
        saved_path = run_dir / CONFIG_FILE
        if not (run_dir / LAST_NAME).is_file():
            raise InputError(f"cannot resume: {run_dir / LAST_NAME} does not exist")
        saved = load_yaml_config(saved_path)
        for key in sorted(fixed_resume_keys(explicit)):
            if saved.get(key) != explicit[key]:
                raise InputError(
                    f"--resume {run_dir}: {key} is {saved.get(key)!r} in the run, "
                    f"{explicit[key]!r} given; only stop criteria, logging, device and the "
                    "data's path may change"
                )
        values = {**saved, **explicit, "run_dir": str(run_dir)}
        return config_from_dict(values, str(saved_path)), True
    values = load_yaml_config(args.config) if args.config else {}
    # Where each value came from, so that a message names the file and key or the flag.
    sources = {key: f"{args.config}: config key {key}" for key in values}
    values.update(explicit)
    sources.update({key: flag_of(key) for key in explicit})
    for key in ("data", "run_dir"):
        if not values.get(key):
            raise InputError(f"--{key.replace('_', '-')} is required")
    cfg = config_from_dict(values, args.config or "flags")
    validate_config(cfg, sources)
    if not cfg.init_from:
        # The preset and the YAML's model section, checked before any data is read (the
        # vocabulary size is a placeholder: the data's is used later).
        from fadat.models.config import make_config

        try:
            make_config(
                cfg.preset,
                8,
                model_type=cfg.arch,
                dropout=cfg.dropout,
                **{**cfg.model, **lambda_overrides(cfg)},
            )
        except InputError as err:
            where = f"{args.config}: " if args.config and cfg.model else ""
            raise InputError(f"{where}{err}") from None
    return cfg, False


def best_text(summary: dict) -> str:
    """The final line's best valid BLEU: the best of the run's whole history. After a resume from
    a compact copy (``fadat snapshot`` without ``--with-best``) the best-checkpoint list keeps
    only the checkpoints the copy holds, and the best BLEU of those it lacks is kept as
    ``earlier_best_bleu``; when that is the higher one, the line
    says so and also gives the best of the checkpoints that exist."""
    kept = summary["best"][0]["bleu"] if summary["best"] else None
    earlier = summary.get("earlier_best_bleu")
    if earlier is not None and (kept is None or earlier > kept):
        since = "none validated since" if kept is None else f"the best kept checkpoint's {kept:.2f}"
        return f"best BLEU {earlier:.2f} (before the compact copy it continued from; {since})"
    return f"best BLEU {float('nan') if kept is None else kept:.2f}"


def run(args: argparse.Namespace) -> int:
    """``fadat train``: returns 0; Ctrl-C → KeyboardInterrupt (exit 130) after a checkpoint."""
    if args.reset_optimizer and not args.resume:
        raise InputError("--reset-optimizer applies to a resumed run: add --resume RUN_DIR")
    cfg, resume = resolve_config(args)
    # More threads than cores: refused without --force; the trainer logs the warning.
    check_threads(cfg.threads, args.force, "--threads" if args.threads is not None else "threads")
    summary = train(cfg, resume=resume, reset_optimizer=args.reset_optimizer)
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"stopped ({stop_text(summary['stop_reason'], cfg, summary['update'])}), "
            f"{best_text(summary)}; run directory {cfg.run_dir}"
        )
    if dist.is_initialized():
        # Every rank waits here before tearing down: gloo aborts a process ("terminate called
        # without an active exception") that destroys its group while a peer is still connected.
        dist.barrier()
        dist.destroy_process_group()
    return 0
