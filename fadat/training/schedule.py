"""When a training run's updates happen and when it stops: the learning-rate schedule
(:func:`inverse_sqrt_lr`), divergence (:func:`diverged_update`, :class:`TrainingDiverged`), Ctrl-C
(:class:`Interrupt`) and the stop reasons told to people (:func:`stop_text`). The loop that
applies them is :mod:`fadat.training.trainer`.
"""

from __future__ import annotations

import math
import signal

from fadat.errors import InputError
from fadat.training.config import TrainConfig

#: Consecutive diverged updates (:func:`diverged_update`) after which training stops with
#: :class:`TrainingDiverged`. Large enough for fp16's loss scaler, which skips a run of
#: overflowing updates while it halves its scale, and small against any real training budget.
DIVERGED_UPDATES = 50


class TrainingDiverged(InputError):
    """Training stopped because its losses or gradients stayed non-finite (a learning rate too
    high, fp16 overflow that does not recover, weights that became NaN); the run directory keeps
    the last checkpoint written before the divergence."""


def diverged_update(stats: dict[str, float]) -> bool:
    """Whether an update's summed statistics show divergence: a non-finite loss or gradient
    norm, or most of its sentences with a non-finite loss (the objectives count those as 0, so
    the logged loss alone looks fine, even 0.0)."""
    nonfinite = stats.get("invalid_nonfinite", 0.0)
    return (
        not math.isfinite(stats["loss_sum"])
        or not math.isfinite(stats["grad_norm"])
        or (nonfinite > 0 and 2 * nonfinite >= max(stats.get("sentences", 0.0), 1.0))
    )


# --------------------------------------------------------------------------------------------
# Learning rate
# --------------------------------------------------------------------------------------------


def inverse_sqrt_lr(update: int, lr: float, warmup: int, warmup_init_lr: float) -> float:
    """fairseq's ``inverse_sqrt`` schedule: linear warm-up from ``warmup_init_lr`` to ``lr`` over
    ``warmup`` updates, then ``lr·sqrt(warmup/u)`` (the reference recipes' schedule).

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


class Interrupt:
    """First Ctrl-C (SIGINT) sets a flag: the loop finishes the update, writes checkpoint_last and
    exits 130. A second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> Interrupt:
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


def stop_text(reason: str, cfg: TrainConfig, update: int) -> str:
    """What ended a training run, for people: ``"time cap --max-time 90s at update 50 of 1400"``."""
    of = f" of {cfg.max_updates}" if cfg.max_updates else ""
    texts = {
        "max_updates": f"update cap --max-updates {cfg.max_updates} reached",
        "max_time": f"time cap --max-time {cfg.max_time:g}s at update {update}{of}",
        "max_epochs": f"epoch cap --max-epochs {cfg.max_epochs} at update {update}{of}",
        "patience": f"--patience {cfg.patience} validations without a better BLEU, update {update}",
        "interrupted": f"interrupted at update {update}{of}",
    }
    return texts.get(reason, f"{reason} at update {update}")
