"""Rank 0's record of a training run, apart from its checkpoints: the human-readable
``RUN_DIR/train.log`` (the trainer's log lines), one JSON line per update
(``train_log.jsonl``) and per validation (``valid_log.jsonl``), TensorBoard scalars
(``RUN_DIR/tensorboard/``) and the terminal's progress bar. File names:
:mod:`fadat.training.checkpoints`.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from fadat.training.checkpoints import TRAIN_LOG, VALID_LOG


class RunLog:
    """The log files of one run, opened by rank 0 once the run directory is marked.

    Args:
        run_dir: the run directory.
        logger: the logger whose lines ``train.log`` receives (its level is set to INFO).
        log_every: log every ``log_every``-th update's record to ``logger`` too (0: never).
    """

    def __init__(self, run_dir: Path, logger: logging.Logger, log_every: int) -> None:
        self.run_dir = run_dir
        self.logger = logger
        self.log_every = log_every
        self.handler = logging.FileHandler(run_dir / "train.log", encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a dependency; tolerate a broken install
            logger.warning("tensorboard unavailable; no event files written")

    def update(self, record: dict[str, Any]) -> None:
        """Append one update's record (``update``, ``epoch`` and numbers or None)."""
        with open(self.run_dir / TRAIN_LOG, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("update", "epoch") and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"train/{key}", value, record["update"])
        if self.log_every and record["update"] % self.log_every == 0:
            self.logger.info("update %s", json.dumps(record))

    def validation(self, record: dict[str, Any]) -> None:
        """Append one validation's record (``update``, ``valid_loss``, ``bleu``, ...)."""
        with open(self.run_dir / VALID_LOG, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.writer is not None:
            self.writer.add_scalar("valid/loss", record["valid_loss"], record["update"])
            self.writer.add_scalar("valid/bleu", record["bleu"], record["update"])
        self.logger.info("valid %s", json.dumps(record))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.logger.removeHandler(self.handler)
        self.handler.close()


def open_bar(total: int | None, initial: int) -> Any:
    """A tqdm bar counting updates from ``initial`` to ``total`` (None: no known end)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="upd", dynamic_ncols=True)


def update_bar(bar: Any, record: dict[str, Any], last_bleu: float) -> None:
    """Advance the bar by one update; show its loss, speed and the last validation BLEU."""
    bar.update(1)
    bar.set_postfix(
        loss=f"{record['loss']:.4g}",
        bleu="-" if math.isnan(last_bleu) else f"{last_bleu:.2f}",
        tok_s=f"{record['tokens_per_s']:.0f}",
    )


def close_bar(bar: Any, stopped: str, last_bleu: float) -> None:
    """Close the bar with a last line saying what ended the stage (a cap, not convergence)."""
    bar.set_description_str(f"stopped: {stopped}")
    if not math.isnan(last_bleu):
        bar.set_postfix(bleu=f"{last_bleu:.2f}")
    bar.close()
