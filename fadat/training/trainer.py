"""``fadat train``: the one training loop, for every architecture and objective (the
DA-Transformer with ``nll`` or ``fuzzy``, the autoregressive baseline with label-smoothed CE).

setup (config, data, model, optimizer) → resume → loop over updates (token-budget micro-batches,
``--update-freq`` accumulation, AdamW, inverse-sqrt warm-up, clipping) → validate (loss + BLEU)
→ checkpoints. The configuration is :mod:`fadat.training.config`, the run directory's files
(checkpoints, best list, averaging) :mod:`fadat.training.checkpoints`, the objectives
:mod:`fadat.objectives`: this loop names no objective and no architecture. A run also writes
``RUN_DIR/train.log`` (human-readable), JSON lines per update and validation and
``RUN_DIR/tensorboard/`` (:mod:`fadat.training.run_log`).

Loss normalisation (docs/reference-behaviour.md, "DAG likelihood"): the DAG losses are
per-sentence means over the whole update (all micro-batches, all ranks): each micro-batch
contributes ``Σ_b ℓ_b / N_update``, where ``N_update`` is the update's global number of sentences
(tokens for the AT baseline). The reference instead averages per-micro-batch means; the two agree
when micro-batches are equally full and ours makes one process with a global batch and several
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

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from fadat import outputs
from fadat.data.binarized import training_digest
from fadat.data.contract import Batch
from fadat.errors import InputError
from fadat.models.architectures import model_class
from fadat.objectives import OBJECTIVES, ObjectiveConfig, compute_loss
from fadat.objectives.glancing import parse_glancing_schedule
from fadat.options import check_threads
from fadat.training.checkpoints import (
    BEST_INDEX,
    CONFIG_FILE,
    LAST_NAME,
    TRAIN_LOG,
    VALID_LOG,
    Progress,
    atomic_save,
    atomic_write_text,
    check_resume_data,
    is_light,
    last_state,
    light_without_reset,
    load_checkpoint,
    rank_best,
    restore_last,
    save_best,
    truncate_log,
    write_best_index,
)
from fadat.training.config import (
    TrainConfig,
    config_to_dict,
    field_sources,
    fixed_resume_keys,
    objective_config,
    validate_config,
)
from fadat.training.distributed import all_reduce, gather_rng, peak_rss_mib, setup_distributed
from fadat.training.model_init import build_model, data_vocab_size, load_data
from fadat.training.run_log import RunLog, close_bar, open_bar, update_bar
from fadat.training.schedule import (
    DIVERGED_UPDATES,
    Interrupt,
    TrainingDiverged,
    diverged_update,
    inverse_sqrt_lr,
    stop_text,
)
from fadat.training.validation import usable_indices, validate

logger = logging.getLogger("fadat.training.trainer")


def autocast_options(bf16: bool, fp16: bool, device_type: str) -> dict[str, Any]:
    """``torch.autocast`` keywords for a run's precision flags on ``device_type``.

    bf16 on a device without bf16 hardware (:func:`fadat.process.native_bf16`: a CPU with neither
    AVX-512 BF16 nor AMX) is turned off with a warning: emulated bf16 matrix products are an
    order of magnitude slower than fp32 there, and fp32 is at least as accurate. The run's
    config keeps ``bf16: true``, so the same run resumed on a machine with bf16 hardware uses it.
    """
    from fadat.process import native_bf16

    if bf16 and not native_bf16(device_type):
        logger.warning(
            "bf16 autocast requested, but this %s has no bf16 hardware (AVX-512 BF16 or AMX); "
            "emulated bf16 would be far slower than fp32, so this run trains in fp32",
            device_type.upper(),
        )
        bf16 = False
    dtype = torch.bfloat16 if bf16 else torch.float16
    return dict(device_type=device_type, dtype=dtype, enabled=bf16 or fp16)


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------

#: Statistics every update sums over micro-batches and ranks; each objective adds its own.
CORE_STATS = ("loss_sum", "count", "sentences", "target_tokens", "stop")


class Trainer:
    """State and steps of one training run. Use :func:`train` to run it."""

    def __init__(self, cfg: TrainConfig, resume: bool, reset_optimizer: bool = False) -> None:
        started = time.perf_counter()
        self.reset_optimizer = reset_optimizer  # with resume: train() refuses it without
        self._reset_notes: list[str] = []  # logged once train.log is open
        self._mark_reset = False  # the next update record carries "optimizer_reset": true
        # A Python caller built the TrainConfig: name its fields, not flags. The fields it set
        # (those off their defaults) must apply; a resumed run keeps what it was started with.
        changed = field_sources(cfg)
        validate_config(cfg, changed, applicable=not resume)
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.info = setup_distributed(cfg.device)
        if cfg.threads:
            warning = check_threads(cfg.threads, force=True, name="threads")
            if warning:  # the command line refuses it without --force
                logger.warning("%s", warning)
            torch.set_num_threads(cfg.threads)
        # The objective and its options resolved once per run; an update only sets the ratio.
        self.objective = OBJECTIVES[cfg.resolved_objective()]
        self.settings = objective_config(cfg, 0.0)
        self.stat_keys = (*CORE_STATS, *self.objective.statistics)
        self.schedule = parse_glancing_schedule(cfg.resolved_glat_p())
        self.train_data, self.valid_data = load_data(cfg)
        # The dataset's identity, its training files' sha256 (one read of them, here on every
        # rank): checked against checkpoint_last on resume and recorded in it, so that a resume
        # may read the same dataset from another path.
        self.data_digest = training_digest(cfg.data)
        self.model = self._build_model(resume)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self._build_optimizer()
        self.progress = Progress()
        dropped = self._build_sampler()
        if resume:
            self._resume()
        else:
            # Training randomness (dropout, glancing) differs per rank but is reproducible.
            torch.manual_seed(cfg.seed + 1000 * self.info.rank + 1)
            random.seed(cfg.seed + self.info.rank)
            np.random.seed((cfg.seed + self.info.rank) % 2**32)
        self.log: RunLog | None = None  # rank 0's
        if self.info.is_main:
            self._start_run_dir(dropped)
        self._log_startup(started)

    # ---- setup helpers

    def _build_model(self, resume: bool) -> torch.nn.Module:
        """The model on the run's device: a new one (:func:`build_model`), or for a resumed run
        the architecture checkpoint_last saved (its weights are loaded by :meth:`_resume`).

        Raises:
            InputError: checkpoint_last holds no model config, an invalid one, or one of
                another architecture than the run's; the run's data directory holds another
                dataset than the checkpoint trained on, or one that cannot be verified
                (:func:`fadat.training.checkpoints.check_resume_data`).
        """
        cfg = self.cfg
        vocab = data_vocab_size(Path(cfg.data))
        # Model initialisation draws from the seed on every rank: identical replicas.
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        self._resume_state = load_checkpoint(self.run_dir / LAST_NAME) if resume else None
        if self._resume_state is None:
            return build_model(cfg, vocab).to(self.info.device)
        # A resumed run rebuilds the architecture it saved (an --init-from model need not
        # match --preset) and then loads checkpoint_last's weights.
        from fadat.models.config import ModelConfig

        path = self.run_dir / LAST_NAME
        if is_light(self._resume_state) and not self.reset_optimizer:
            raise InputError(light_without_reset(path))
        check_resume_data(self._resume_state, path, cfg.data, self.data_digest)
        try:
            model_config = ModelConfig.from_dict(dict(self._resume_state["model_config"]))
        except (KeyError, TypeError) as err:
            raise InputError(f"{path}: no model config ({err})") from None
        except InputError as err:
            raise InputError(f"{path}: {err}") from None
        if model_config.model_type != cfg.arch:
            raise InputError(
                f"{path}: a checkpoint of an {model_config.model_type!r} model, but the run "
                f"{self.run_dir} trains --arch {cfg.arch} (a checkpoint of another run?)"
            )
        return model_class(cfg.arch)(model_config).to(self.info.device)

    def _build_optimizer(self) -> None:
        """AdamW over the trainable parameters, the fp16 grad scaler and the autocast options."""
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.warmup_init_lr if cfg.warmup else cfg.lr,
            betas=cfg.adam_betas,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        self.scaler = torch.amp.GradScaler(self.info.device.type, enabled=cfg.fp16)
        self.autocast = autocast_options(cfg.bf16, cfg.fp16, self.info.device.type)

    def _build_sampler(self) -> int:
        """This rank's token-budget batch sampler over the training sentences the model's
        positions fit; returns how many sentences were left out as too long.

        Raises:
            InputError: no training sentence fits.
        """
        from fadat.data.batching import TokenBatchSampler

        cfg = self.cfg
        ratio, max_graph = self.model.length_budget()
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
        return dropped

    def _start_run_dir(self, dropped: int) -> None:
        """Rank 0: mark the run directory, write the resolved config, open the logs."""
        cfg = self.cfg
        outputs.mark_dir(self.run_dir, "run")
        atomic_write_text(
            self.run_dir / CONFIG_FILE, yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
        )
        self.log = RunLog(self.run_dir, logger, cfg.log_every)
        for note in self._reset_notes:
            logger.info("%s", note)
        n_params = sum(p.numel() for p in self.params)
        logger.info(
            "%s model, %d parameters, objective %s, %d training sentences (%d longer than the "
            "model's positions skipped), %d process(es)",
            cfg.arch,
            n_params,
            self.objective.name,
            len(self.train_index),
            dropped,
            self.info.world_size,
        )

    def _log_startup(self, started: float) -> None:
        """Log the start-up cost (data, batch plan, model, optimizer; not the imports) and every
        rank's peak RSS (collective)."""
        rss = torch.zeros(self.info.world_size, dtype=torch.float64, device=self.info.device)
        rss[self.info.rank] = peak_rss_mib()
        rss = all_reduce(rss, self.info)
        if self.info.is_main:
            logger.info(
                "ready after %.1f s; peak RSS per process so far: %s MiB",
                time.perf_counter() - started,
                ", ".join(f"{x:.0f}" for x in rss.tolist()),
            )

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def _resume(self) -> None:
        state = self._resume_state
        self._resume_state = None  # free the memory once loaded
        light = is_light(state)
        self.progress = restore_last(
            state,
            self.run_dir / LAST_NAME,
            config_to_dict(self.cfg),
            # The run's own keys: a config saved before objectives owned their options also
            # holds other objectives' keys, which this run does not read. (data: checked by
            # check_resume_data in _build_model.)
            fixed_resume_keys(config_to_dict(self.cfg)),
            self.info,
            self.model,
            self.optimizer,
            self.scaler,
            reset_optimizer=self.reset_optimizer,
        )
        p = self.progress
        if self.reset_optimizer:
            self._mark_reset = True
            what = (
                f"{LAST_NAME} is a compact copy (weights {state.get('weights_dtype', '?')}, "
                "no optimizer state)"
                if light
                else f"the optimizer state of {LAST_NAME} is dropped"
            )
            self._reset_notes.append(
                f"optimizer reset at update {p.update}: {what}; AdamW starts with zero moments "
                "and step counts (bias correction from the next update on); the learning rate "
                "follows the schedule at the run's update count"
            )
        missing = [b for b in p.best if not (self.run_dir / b["file"]).is_file()] if light else []
        if missing:
            # A compact copy keeps no best checkpoint unless made with --with-best: the best
            # list keeps those it holds and new validations fill it; --patience still counts
            # from the best BLEU so far.
            top = max(b["bleu"] for b in missing)
            if p.earlier_best_bleu is None or top > p.earlier_best_bleu:
                p.earlier_best_bleu = top
            self._reset_notes.append(
                f"{len(missing)} of the {len(p.best)} best checkpoint(s) listed in {LAST_NAME} "
                f"(best BLEU {top:.2f}) are not kept in a compact copy (fadat snapshot without "
                f"--with-best); {BEST_INDEX} lists only those it holds and those saved from now on"
            )
            p.best = [b for b in p.best if b not in missing]
        if self.info.is_main:
            truncate_log(self.run_dir / TRAIN_LOG, p.update)
            truncate_log(self.run_dir / VALID_LOG, p.update)
            if light:
                write_best_index(self.run_dir, p.best)

    # ---- checkpoints

    def save_last(self) -> None:
        """Write checkpoint_last (collective: every rank contributes its RNG state)."""
        rng = gather_rng(self.info)
        if self.info.is_main:
            state = last_state(
                self.cfg.arch,
                config_to_dict(self.cfg),
                self.info.world_size,
                self.model,
                self.optimizer,
                self.scaler,
                self.progress,
                rng,
                self.data_digest,
            )
            atomic_save(state, self.run_dir / LAST_NAME)

    def _save_best(self, bleu: float) -> None:
        p = self.progress
        cfg = self.cfg
        p.best = save_best(
            self.run_dir, p.best, bleu, p.update, cfg.keep_best, cfg.arch, self.model, cfg.data
        )

    # ---- one update

    def _objective(self) -> ObjectiveConfig:
        ratio = self.schedule(self.progress.update)
        return dataclasses.replace(self.settings, glancing_ratio=ratio)

    def _count(self, indices: list[int]) -> int:
        return self.objective.count([int(self.train_data.target_lengths[i]) for i in indices])

    def _collate(self, indices: list[int]) -> Batch:
        """The training batch of ``indices``, with the graph sizes of this update when the model
        draws them from a λ range (the model's ``training_graph_lengths``: a pure function of
        the seed, the update and the sentence ids, so resuming needs no extra state)."""
        batch = self.train_data.collate(indices)
        sizes = self.model.training_graph_lengths(batch, self.cfg.seed, self.progress.update)
        return batch if sizes is None else dataclasses.replace(batch, graph_lengths=sizes)

    def train_update(self, group: list[list[int]], stop_flag: float) -> dict[str, float]:
        """Forward/backward the micro-batches of one update, reduce over ranks, step.

        Args:
            group: this rank's micro-batches (lists of sentence indices; some may be empty).
            stop_flag: 1.0 if this rank wants to stop after this update (time limit, Ctrl-C).

        Returns:
            The update's statistics summed over ranks (``stat_keys`` plus ``grad_norm``, ``lr``,
            ``glancing_ratio``).
        """
        device = self.info.device
        objective = self._objective()
        total = torch.tensor([float(sum(self._count(idx) for idx in group))], device=device)
        total = float(all_reduce(total, self.info)[0])
        stats = dict.fromkeys(self.stat_keys, 0.0)
        self.optimizer.zero_grad(set_to_none=True)
        for idx in group:
            if not idx:
                continue  # an empty shard: zero gradient from this rank
            batch = self._collate(idx).to(device)
            with torch.autocast(**self.autocast):
                out = compute_loss(self.model, batch, objective, self.objective)
            self.scaler.scale(out.loss_sum / total).backward()
            stats["loss_sum"] += float(out.loss_sum.detach())
            stats["count"] += out.count
            for key, value in out.stats.items():
                stats[key] += value
        stats["stop"] = stop_flag
        packed = [stats[k] for k in self.stat_keys]
        packed = torch.tensor(packed, dtype=torch.float64, device=device)
        packed = all_reduce(packed, self.info)
        reduced = dict(zip(self.stat_keys, packed.tolist(), strict=True))
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
        bar = None
        if self.info.is_main and cfg.progress_bar:
            bar = open_bar(cfg.max_updates or None, p.update)
        session_start = time.perf_counter()
        start_elapsed = p.elapsed
        last_bleu = float("nan")
        save_every = cfg.save_every or cfg.validate_every
        bad = 0  # consecutive diverged updates
        warned_nonfinite = False
        with Interrupt() as interrupt:
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
                    update_bar(bar, record, last_bleu)
                warned_nonfinite = self._warn_nonfinite(stats, warned_nonfinite)
                bad = self._count_diverged(stats, bad)
                if bad >= DIVERGED_UPDATES:
                    stop_reason = "diverged"
                    break
                # The weights may be damaged while updates diverge: neither validate them
                # nor let them replace the last good checkpoint.
                if not bad and cfg.validate_every and p.update % cfg.validate_every == 0:
                    last_bleu = self._validate_and_track()
                if not bad and save_every and p.update % save_every == 0:
                    self.save_last()
                if stats["stop"] > 0:
                    # Any rank's Ctrl-C or clock stops every rank after the same update.
                    stop_reason = "interrupted" if interrupt.requested else "max_time"
                else:
                    stop_reason = self._stop_reason()
                if stop_reason:
                    break
            stop_reason = stop_reason or "max_epochs"
            if bad:
                if bar is not None:
                    bar.close()
                self._stop_diverged(bad)
            if p.last_validated != p.update and stop_reason != "interrupted":
                last_bleu = self._validate_and_track()
            self.save_last()
        if bar is not None:
            close_bar(bar, stop_text(stop_reason, cfg, p.update), last_bleu)
        summary = {
            "stop_reason": stop_reason,
            "update": p.update,
            "epoch": p.epoch,
            "best": p.best,
            "earlier_best_bleu": p.earlier_best_bleu,
            "elapsed": p.elapsed,
            "skipped_updates": p.skipped_updates,
        }
        if self.info.is_main:
            logger.info("stopped (%s) after %d updates", stop_reason, p.update)
        if stop_reason == "interrupted":
            raise KeyboardInterrupt
        return summary

    def _warn_nonfinite(self, stats: dict[str, float], warned: bool) -> bool:
        """Warn once per run about sentences with a non-finite loss; returns "warned"."""
        if stats.get("invalid_nonfinite", 0) > 0 and not warned:
            logger.warning(
                "update %d: %d sentence(s) with a non-finite loss (counted as 0); "
                "if this goes on, lower --lr",
                self.progress.update,
                int(stats["invalid_nonfinite"]),
            )
            return True
        return warned

    def _count_diverged(self, stats: dict[str, float], bad: int) -> int:
        """The number of diverged updates in a row after this one (0 if it did not diverge);
        warns at the first of a run."""
        bad = bad + 1 if diverged_update(stats) else 0
        if bad == 1:
            logger.warning(
                "update %d: non-finite loss or gradient; training stops after %d such "
                "updates in a row (no checkpoint or validation until it recovers)",
                self.progress.update,
                DIVERGED_UPDATES,
            )
        return bad

    def _stop_diverged(self, bad: int) -> None:
        """End a run whose last ``bad`` updates diverged (or that stopped during such a run of
        updates), keeping the last checkpoint written before.

        Raises:
            TrainingDiverged: always; the message names the updates, the checkpoint kept and
                what to change.
        """
        p = self.progress
        last = self.run_dir / LAST_NAME
        kept = (
            f"{last} (the last checkpoint before it) is kept"
            if last.is_file()
            else "no checkpoint was written before it"
        )
        message = (
            f"training diverged: non-finite loss or gradient in the last {bad} updates "
            f"(updates {p.update - bad + 1} to {p.update}); {kept}; lower --lr (now "
            f"{self.cfg.lr:g}) or raise --warmup, and start a new run"
        )
        if self.info.is_main:
            logger.error("%s", message)
        raise TrainingDiverged(message)

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

    def _log_update(self, stats: dict[str, float], epoch: int, seconds: float) -> dict[str, Any]:
        count = max(stats["count"], 1.0)
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
        record.update(self.objective.log(stats))
        if self._mark_reset:
            record["optimizer_reset"] = True  # the first update with fresh AdamW moments
            self._mark_reset = False
        if not math.isfinite(stats["grad_norm"]):
            record["skipped"] = True
            record["grad_norm"] = None
        if self.log is not None:
            self.log.update(record)
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
            if self.log is not None:
                self.log.validation(record)
        if self.info.world_size > 1:
            dist.broadcast(result, src=0)
        if self.valid_data is None:
            return float("nan")
        bleu = float(result[0])
        previous_best = max((b["bleu"] for b in p.best), default=-math.inf)
        if p.earlier_best_bleu is not None:
            previous_best = max(previous_best, p.earlier_best_bleu)
        p.bad_validations = 0 if bleu > previous_best else p.bad_validations + 1
        if self.info.is_main:
            self._save_best(bleu)
        else:
            self._track_best_only(bleu)
        return bleu

    def _track_best_only(self, bleu: float) -> None:
        # Non-main ranks mirror the best list so every rank's checkpoint progress agrees.
        p = self.progress
        p.best = rank_best(p.best, bleu, p.update, self.cfg.keep_best)[1]


def train(cfg: TrainConfig, resume: bool = False, reset_optimizer: bool = False) -> dict[str, Any]:
    """Run (or resume) training as configured; returns the summary (stop reason, update, best).
    ``fadat train`` (:mod:`fadat.cli.train`) resolves its flags and YAML into ``cfg`` and calls
    this; from Python::

        import fadat
        fadat.train(fadat.TrainConfig(data="data/mine", run_dir="runs/mine", preset="cpu-small"))

    Args:
        cfg: the configuration (:class:`fadat.training.config.TrainConfig`; its defaults are
            the flags').
        resume: continue the run in ``cfg.run_dir`` from its ``checkpoint_last.pt`` (model,
            optimizer, schedule, data order and random state). ``cfg`` keeps the run's saved
            config but for its resumable keys
            (:data:`fadat.training.config.RESUMABLE_KEYS`) and ``data``, which may name another
            path of the dataset the run trained on: one whose training files have the content
            the checkpoint records (their sha256,
            :func:`fadat.data.binarized.training_digest`; checked by
            :func:`fadat.training.checkpoints.check_resume_data`), whichever version of fadat
            prepared it.
        reset_optimizer: with ``resume``: start AdamW afresh (zero moments, step counts 0, as
            fairseq's ``--reset-optimizer``) instead of loading its saved state; the learning
            rate still follows the schedule at the restored update count, and weights, grad
            scaler, data position and RNG are restored as in any resume. Required for a
            compact copy (``fadat snapshot``), whose checkpoint holds no optimizer state;
            logged in ``train.log`` and as ``"optimizer_reset": true`` in the first update's
            line of ``train_log.jsonl``.

    The run directory has one trainer at a time: before anything is written, rank 0 takes its
    lock (:func:`fadat.outputs.directory_lock`, held until the process ends) and then removes
    the temporaries that killed trainers left there.

    Raises:
        InputError: bad config, data, ``--init-from`` or resume state; a run directory that
            another process trains in (the message names its PID); ``reset_optimizer``
            without ``resume``; a compact checkpoint resumed without ``reset_optimizer``; a
            resumed run whose data directory holds another dataset than its checkpoint
            trained on (another digest: given with ``data`` or rebuilt in place), or, for a
            checkpoint that records none, a data path other than the saved one while the saved
            one is gone or holds no readable dataset.
        KeyboardInterrupt: after Ctrl-C, once checkpoint_last is written.
    """
    run_dir = Path(cfg.run_dir)
    if reset_optimizer and not resume:
        raise InputError("--reset-optimizer applies to a resumed run: add --resume RUN_DIR")
    # Before any work: a new, empty or fadat run directory in a writable place (fadat.outputs).
    option = "--resume" if resume else "--run-dir"
    if not resume:
        outputs.check_not_input(
            run_dir,
            [
                ("--data", cfg.data),
                ("--init-from", cfg.init_from or None),
                ("--init-encoder-from", cfg.init_encoder_from or None),
            ],
            option,
        )
    main_rank = int(os.environ.get("RANK", "0")) == 0  # only rank 0 writes the run directory
    # The other ranks check a resumed run's directory only: a new one is rank 0's to check and
    # mark, and between its creation and its mark (rank 0's lock file only) it would look like
    # a directory that fadat did not create. A rank 0 that refuses it stops the others
    # (torchrun ends the job).
    with (
        outputs.directory_lock(run_dir, "run", option)
        if main_rank
        else contextlib.nullcontext(
            outputs.check_output_dir(run_dir, "run", option) if resume else False
        )
    ) as is_run:
        if resume and not is_run:
            raise InputError(f"--resume {run_dir}: not a run directory of fadat train")
        if not resume and (run_dir / LAST_NAME).exists():
            raise InputError(
                f"run directory {run_dir} already holds a run; "
                f"use --resume {run_dir} or a new --run-dir"
            )
        if main_rank:
            outputs.remove_temporaries(run_dir)
        trainer = Trainer(cfg, resume=resume, reset_optimizer=reset_optimizer)
        try:
            return trainer.run()
        finally:
            trainer.close()
