"""Does fuzzy alignment fix multi-modality? The study on the synthetic multi-modal corpus (issues 20
and 30): FA-DAT against NLL where the pre-training has converged, λ (paper Figure 2), the AT.

One command runs (or resumes) everything; a job is skipped when it is done (its state file in
``ROOT/state/`` matches its settings and its inputs), and a training job interrupted by a kill
resumes from its last checkpoint::

    python recipes/synth_study.py plan  [--root DIR] [--phases ...]   # jobs, order, core-hours
    python recipes/synth_study.py run   [--root DIR] [--jobs N] [--phases main,curve] [--plot PNG]
    python recipes/synth_study.py table [--root DIR] [--plot PNG] [--plot-lambda PNG]  # tables

``run`` stores its settings (``--branches``, ``--caps``, ``--phases``) in ``ROOT/settings.json``;
``plan`` and ``table`` read them from there.

**Data** (``fadat prepare synth-multimodal``, data seed 1; 60 source word types, 5–10 words, 500
valid and 500 test sentences): levels (P, Q) = ``LEVELS`` (det, med, high) with 20,000 training
pairs, and ``med10x``: the med level with ten times the training pairs (the generator draws
valid/test from their own streams, so med10x's valid and test sets are med's).

**Pre-training to convergence** (``configs/synth-dat-nll.yaml``, λ = 4): the run is trained in
segments of ``validate_every`` updates (``fadat train --resume --max-updates``, which continues
a run exactly) so that after every validation the recipe can keep the model at the lowest valid
NLL so far and judge convergence (:func:`judge`). It stops at the first validation, at or after
the last fixed branch point, where

- **overfit**: the lowest valid NLL is at least ``patience`` validations old and the latest
  valid NLL is above it by at least ``max(rise_rel · min, rise_abs)`` nats (a minimum followed by
  overfitting: early stopping on the valid NLL would pick the minimum); or
- **floor**: the lowest valid NLL is within ``rise_abs`` nats of the data's entropy (the lowest
  valid NLL any model can reach, :func:`entropy_per_token`): nothing left to learn (det); or
- **cap**: the run reached its level's update cap (``caps``): not converged, stated as such.

Defaults (:class:`Settings`): a validation every 200 updates, patience 5 validations (1,000
updates), a rise of at least max(2 % of the minimum, 0.002 nats), the earliest stop at update
3,000 (the last fixed branch point), caps det 4,000, med and high 16,000, med10x 40,000, AT
12,000 (its earliest stop 1,000). ``table`` prints every run's minimum, rise and verdict.

**Branch points** (``branches``, default 1200, 3000, min, stop): the pre-trained model at fixed
updates, at the valid-NLL minimum (``min``: the converged point) and where the criterion
stopped the run (``stop``: past the minimum). From each, ``finetune_updates`` updates of
NLL continued (``configs/synth-dat-nll-finetune.yaml``) and of FA-DAT
(``configs/synth-dat-fuzzy.yaml``, n = 2), identical except for the objective, and from the last
branch point a ``long_updates`` NLL-continued arm (the strongest control).

**Phases** (``PHASES``, in start order; a phase's jobs start as soon as their inputs exist):

- ``main``: det/med/high × seeds: pre-training to convergence, both arms at ``min``, evaluation;
- ``curve``: both arms at the other branch points, the long NLL arm, evaluations;
- ``large``: med10x, ``large_seeds``: pre-training, every branch point, evaluations;
- ``fig2``: paper Figure 2 on med: λ ∈ ``lambdas`` other than 4, each pre-trained to its own
  convergence by the same criterion, both arms at ``figure2_branch`` (λ = 4 comes from main);
- ``at``: the AT reference (``configs/synth-at.yaml``, lr 5e-4) per level × seed, trained to its
  own convergence by the same criterion on its valid loss (label-smoothed CE), evaluated at its
  valid-loss minimum with greedy search and beam 5;
- ``table1``: paper Table 1 on med, FA-DAT n = 1, 3, 4 at ``min``.

**Evaluation** (``fadat evaluate`` on the test split, greedy and lookahead): exact-valid rate,
BLEU against the valid set and the single reference, mixtures, repeated tokens, length error
(:mod:`fadat.evaluation.validset_metrics`), and every model's test NLL per token
(:func:`nll_report`).

**Scheduling**: a job starts when its inputs exist (a fine-tune at a fixed branch point while
its pre-training goes on; one at ``min`` or ``stop`` when the pre-training is done); each job
runs in its own process, which dies with the scheduler, under a lock file, so that a killed or
doubly started study never has two processes in one run directory. Two schedulers can share
one root on two cores when ``--only`` gives them disjoint jobs (e.g. ``--only med-l2-`` and
``--only med-l8-``); the files both write (``settings.json``, ``times.json``) are written
atomically through temporaries of their own. ``plan`` prints the jobs in
start order and core-hours per phase (:data:`SECONDS_PER_UPDATE`, or the rates measured in
``ROOT/times.json`` once jobs have run).

``table`` gives mean ± sd over seeds and, per seed, paired tests of FA-DAT against NLL continued:
paired bootstrap of BLEU against the valid set (1,000 resamples) and an exact McNemar test of the
exact-valid rate; across seeds a paired t-test of the per-seed differences.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
# This checkout's fadat, also in the worker processes (they import this file again).
sys.path.insert(0, str(REPO))

#: Data levels: (P, Q, factor of the training pairs).
LEVELS = {
    "det": (0.0, 0.0, 1),
    "med": (0.25, 0.25, 1),
    "high": (0.5, 0.5, 1),
    "med10x": (0.25, 0.25, 10),
}
MAIN_LEVELS = ("det", "med", "high")
DATA_OPTIONS = ("--source-types", "60", "--max-words", "10", "--seed", "1")
TRAIN_SIZE = 20000
PHASES = ("main", "curve", "large", "fig2", "at", "table1")
BOOTSTRAP = 1000


@dataclass(frozen=True)
class Settings:
    """The study's settings (stored in ``ROOT/settings.json`` by ``run``).

    Attributes:
        seeds: training seeds of every arm (the data is the same for all: data seed 1).
        train_size, data_options: the corpus (``fadat prepare synth-multimodal`` options).
        large_seeds: seeds of the med10x level.
        validate_every: updates between validations of a run trained to convergence (its
            segment length; also the resolution of the valid-NLL minimum).
        patience: validations the minimum must be old before "overfit" can stop a run.
        rise_rel, rise_abs: the rise above the minimum that counts as overfitting:
            ``max(rise_rel · min, rise_abs)`` nats; ``rise_abs`` is also the "floor" margin.
        caps: update cap per pre-training data level (``at`` for the AT).
        at_min_updates: the AT's earliest stop.
        branches: branch points: update numbers, ``min``, ``stop`` (in this order of time).
        finetune_updates / long_updates: the arms' budgets (the long NLL arm's).
        lambdas: Figure 2's upsample ratios (4 is the main study's).
        figure2_branch: the branch point of Figure 2's arms.
        ngrams: Table 1's n (2 is the main arm).
        phases: the phases ``run`` runs.
    """

    seeds: tuple[int, ...] = (1, 2, 3)
    train_size: int = TRAIN_SIZE
    data_options: tuple[str, ...] = DATA_OPTIONS
    large_seeds: tuple[int, ...] = (1,)
    validate_every: int = 200
    patience: int = 5
    rise_rel: float = 0.02
    rise_abs: float = 0.002
    caps: dict[str, int] = field(
        default_factory=lambda: {
            "det": 4000,
            "med": 16000,
            "high": 16000,
            "med10x": 40000,
            "at": 12000,
        }
    )
    at_min_updates: int = 1000
    branches: tuple[str, ...] = ("1200", "3000", "min", "stop")
    finetune_updates: int = 100
    long_updates: int = 1000
    lambdas: tuple[int, ...] = (2, 3, 4, 6, 8)
    figure2_branch: str = "min"
    ngrams: tuple[int, ...] = (1, 2, 3, 4)
    phases: tuple[str, ...] = PHASES

    def fixed_branches(self) -> list[int]:
        return [int(b) for b in self.branches if b.isdigit()]

    def min_updates(self) -> int:
        """A pre-training's earliest stop: its last fixed branch point."""
        return max(self.fixed_branches(), default=0)

    def criterion(self, cap: int, min_updates: int) -> Criterion:
        return Criterion(self.patience, self.rise_rel, self.rise_abs, min_updates, cap)

    def check(self) -> None:
        """Raises SystemExit (exit 2) naming the bad setting."""
        for b in self.branches:
            if not (b.isdigit() or b in ("min", "stop")):
                _fail(f"--branches: {b!r} is not an update number, 'min' or 'stop'")
        if not self.branches:
            _fail("--branches: give at least one branch point")
        if self.figure2_branch not in self.branches:
            _fail(f"figure 2's branch {self.figure2_branch!r} is not among --branches")
        if "min" not in self.branches:
            _fail("--branches must contain 'min' (the main comparison's branch point)")
        if any(f % self.validate_every for f in self.fixed_branches()):
            _fail(f"--branches: fixed points must be multiples of {self.validate_every}")
        for phase in self.phases:
            if phase not in PHASES:
                _fail(f"--phases: unknown phase {phase!r} (known: {', '.join(PHASES)})")
        for level, cap in self.caps.items():
            if level not in (*LEVELS, "at"):
                _fail(f"--caps: unknown level {level!r}")
            low = self.at_min_updates if level == "at" else self.min_updates()
            if cap < low:
                _fail(f"--caps: {level}={cap} is below the earliest stop {low}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(obj: dict) -> Settings:
        known = {f.name for f in dataclasses.fields(Settings)}
        unknown = set(obj) - known
        if unknown:
            _fail(f"settings.json: unknown keys {sorted(unknown)}")
        return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in obj.items()})


def _fail(message: str) -> None:
    print(f"synth_study: error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ----------------------------------------------------------------------------- convergence


@dataclass(frozen=True)
class Criterion:
    """When a run trained to convergence stops (module docstring; :func:`judge`)."""

    patience: int
    rise_rel: float
    rise_abs: float
    min_updates: int
    cap: int

    def text(self) -> str:
        return (
            f"stop at the first validation at update ≥ {self.min_updates} where the lowest valid "
            f"loss is ≥ {self.patience} validations old and the latest is ≥ "
            f"max({self.rise_rel:.0%} of it, {self.rise_abs} nats) above it (overfit), or the "
            f"lowest is within {self.rise_abs} nats of the data entropy (floor), or at update "
            f"{self.cap} (cap)"
        )


@dataclass(frozen=True)
class Verdict:
    """:func:`judge`'s answer. ``reason`` is ``"overfit"``, ``"floor"``, ``"cap"`` or ``""``
    (keep training); updates and losses are those of the minimum and of the latest validation."""

    reason: str
    best_update: int
    best_loss: float
    last_update: int
    last_loss: float
    since_best: int  # validations after the minimum

    @property
    def stop(self) -> bool:
        return bool(self.reason)

    @property
    def rise(self) -> float:
        return self.last_loss - self.best_loss


def judge(curve: list[tuple[int, float]], crit: Criterion, entropy: float | None) -> Verdict:
    """Whether a run stops, from its validations so far.

    Args:
        curve: ``(update, valid loss in nats per token)`` of every validation, in update order.
        crit: the criterion.
        entropy: the data's entropy in nats per token (the floor), or None (no floor: the AT's
            label-smoothed loss does not reach it).

    Returns:
        The verdict. The minimum is the earliest validation with the lowest loss (what early
        stopping keeps). An empty curve gives ``reason=""`` and NaN losses.
    """
    if not curve:
        return Verdict("", 0, math.nan, 0, math.nan, 0)
    best = min(range(len(curve)), key=lambda i: (curve[i][1], i))
    (best_update, best_loss), (last_update, last_loss) = curve[best], curve[-1]
    since = len(curve) - 1 - best
    reason = ""
    if last_update >= crit.min_updates:
        margin = max(crit.rise_rel * best_loss, crit.rise_abs)
        if since >= crit.patience and last_loss - best_loss >= margin:
            reason = "overfit"
        elif entropy is not None and best_loss - entropy <= crit.rise_abs:
            reason = "floor"
        elif last_update >= crit.cap:
            reason = "cap"
    return Verdict(reason, best_update, best_loss, last_update, last_loss, since)


def read_curve(run_dir: Path, until: int | None = None) -> list[dict]:
    """The validations of a run (``valid_log.jsonl``), at most one per update (the last), up to
    update ``until``, in update order."""
    path = run_dir / "valid_log.jsonl"
    if not path.is_file():
        return []
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            entries[entry["update"]] = entry
    return [entries[u] for u in sorted(entries) if until is None or u <= until]


def entropy_per_token(data_dir: Path, level: str, sentences: int, split: str = "valid") -> float:
    """Entropy of the generating process (nats per target token, <s> and </s> counted, as the
    DAT's valid NLL is) over the first ``sentences`` sentences of a split (0 = all): the lowest
    NLL per token any model can reach on them.

    Per sentence: the swap decisions (H(K) = h(P) + P·H(K − 2) + (1 − P)·H(K − 1) for K
    phrases, h the binary entropy) plus log 2 per word with two synonyms.
    """
    from fadat.data.synth import read_valid_sets

    p = LEVELS[level][0]
    h = 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))
    total, tokens = 0.0, 0
    sets = read_valid_sets(data_dir, split) or []
    for vs in sets[:sentences] if sentences else sets:
        swaps = [0.0, 0.0]
        for k in range(2, len(vs.phrases) + 1):
            swaps.append(h + p * swaps[k - 2] + (1 - p) * swaps[k - 1])
        synonyms = sum(math.log(len(w)) for phrase in vs.phrases for w in phrase)
        total += swaps[len(vs.phrases)] + synonyms
        tokens += vs.length() + 2
    return total / max(tokens, 1)


# ----------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Training:
    """A training run of a job.

    ``max_updates`` > 0: a fixed budget, the model is ``snapshots[0]`` (point ``last``).
    ``criterion``: trained to convergence in segments; ``snapshots`` maps branch points
    (``u1200``, ``min``, ``stop``) to the model directories written there.
    """

    config: Path
    data: Path
    run_dir: Path
    seed: int
    level: str
    init: Path | None = None
    max_updates: int = 0
    criterion: Criterion | None = None
    validate_every: int = 0
    snapshots: tuple[tuple[str, Path], ...] = ()
    floor: bool = True  # the data entropy stops the run (not for the AT's smoothed loss)


@dataclass(frozen=True)
class Job:
    """One step of the study.

    Attributes:
        name: unique, also the state file's name.
        phase: one of ``PHASES`` (start order), seed, order (data 0, pre-training 1,
            fine-tuning 2, evaluation 3): the priority.
        inputs: data and model directories it reads.
        outputs: directories it writes; ``early``: those usable before the job is done (the
            fixed-update snapshots of a pre-training, final once written).
        training: its training run, or None.
        commands: ``fadat`` command lines (data preparation, evaluation).
        nll: ``(report, data, models)``: the test NLL of ``models`` written to ``report``.
    """

    name: str
    phase: str
    seed: int
    order: int
    inputs: tuple[Path, ...] = ()
    outputs: tuple[Path, ...] = ()
    early: tuple[Path, ...] = ()
    training: Training | None = None
    commands: tuple[tuple[str, ...], ...] = ()
    nll: tuple[Path, Path, tuple[Path, ...]] | None = None

    def key(self) -> dict:
        """What defines the job's result: changing it makes a done job not done."""
        if self.training is not None:
            t = self.training
            return {
                "config": yaml.safe_load(t.config.read_text(encoding="utf-8")),
                "seed": t.seed,
                "max_updates": t.max_updates,
                "criterion": dataclasses.asdict(t.criterion) if t.criterion else None,
                "snapshots": [p for p, _ in t.snapshots],
            }
        return {"commands": [list(c) for c in self.commands], "nll": self.nll is not None}


def write_config(root: Path, name: str, base: str, **changes) -> Path:
    """``ROOT/configs/NAME.yaml``: configs/BASE with ``changes`` (``model`` keys merged)."""
    cfg = yaml.safe_load((REPO / "configs" / base).read_text(encoding="utf-8"))
    model = {**(cfg.get("model") or {}), **changes.pop("model", {})}
    if model:
        cfg["model"] = model
    cfg.update(changes)
    path = root / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"# written by recipes/synth_study.py from configs/{base}\n" + yaml.safe_dump(cfg)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def point_name(branch: str) -> str:
    """``"1200"`` → ``"u1200"``; ``min`` and ``stop`` stay."""
    return f"u{branch}" if branch.isdigit() else branch


def plan(root: Path, s: Settings) -> list[Job]:
    """Every job of the study (all phases), in no particular order (:func:`priority`)."""
    jobs: list[Job] = []
    data = {level: root / "data" / level for level in LEVELS}
    models = root / "models"
    for level, (p, q, factor) in LEVELS.items():
        command = (
            "prepare",
            "synth-multimodal",
            "--output",
            str(data[level]),
            "--swap-prob",
            str(p),
            "--synonym-prob",
            str(q),
            "--train-size",
            str(s.train_size * factor),
            *s.data_options,
        )
        phase = "large" if factor > 1 else "main"
        jobs.append(Job(f"data-{level}", phase, 0, 0, (), (data[level],), commands=(command,)))

    finetune = {
        "nll": write_config(
            root, "finetune-nll", "synth-dat-nll-finetune.yaml", max_updates=s.finetune_updates
        ),
        "nll-long": write_config(
            root, "finetune-nll-long", "synth-dat-nll-finetune.yaml", max_updates=s.long_updates
        ),
    }
    for n in sorted({2, *s.ngrams}):  # n = 2 is the main arm's
        finetune[f"fuzzy-n{n}"] = write_config(
            root,
            f"finetune-fuzzy-n{n}",
            "synth-dat-fuzzy.yaml",
            max_updates=s.finetune_updates,
            ngram_order=n,
        )
    points = [point_name(b) for b in s.branches]
    last = points[-1]

    def finetune_job(arm: str, tag: str, point: str, phase: str, level: str, seed: int) -> Job:
        name = f"{arm}-{tag}-{point}"
        init = models / f"pre-{tag}-{point}"
        training = Training(
            config=finetune[arm],
            data=data[level],
            run_dir=root / "runs" / name,
            seed=seed,
            level=level,
            init=init,
            max_updates=s.long_updates if arm == "nll-long" else s.finetune_updates,
            snapshots=(("last", models / name),),
        )
        return Job(name, phase, seed, 2, (data[level], init), (models / name,), training=training)

    def eval_job(name: str, phase: str, level: str, seed: int, model_dirs: list[Path], *extra):
        report = root / "eval" / f"{name}.json"
        command = (
            "evaluate",
            "--model",
            *map(str, model_dirs),
            "--data",
            str(data[level]),
            "--split",
            "test",
            "--no-latency",
            "--bootstrap",
            "0",
            "--threads",
            "1",
            "--report",
            str(report),
            "--save-hypotheses",
            str(root / "eval" / name),
            *extra,
        )
        nll = (root / "eval" / f"{name}.nll.json", data[level], tuple(model_dirs))
        return Job(
            f"eval-{name}",
            phase,
            seed,
            3,
            (data[level], *model_dirs),
            (report,),
            commands=(command,),
            nll=nll,
        )

    pretrain_tags = [(lvl, 4, seed, "main") for lvl in MAIN_LEVELS for seed in s.seeds]
    pretrain_tags += [("med10x", 4, seed, "large") for seed in s.large_seeds]
    pretrain_tags += [
        ("med", lam, seed, "fig2") for lam in s.lambdas if lam != 4 for seed in s.seeds
    ]
    for level, lam, seed, phase in pretrain_tags:
        tag = f"{level}-l{lam}-s{seed}"
        config = write_config(
            root,
            f"pretrain-{level}-l{lam}",
            "synth-dat-nll.yaml",
            max_updates=s.caps[level],
            validate_every=s.validate_every,
            save_every=s.validate_every,
            model={"upsample_ratio": float(lam)},
        )
        snapshots = tuple((p, models / f"pre-{tag}-{p}") for p in points)
        training = Training(
            config=config,
            data=data[level],
            run_dir=root / "runs" / f"pre-{tag}",
            seed=seed,
            level=level,
            criterion=s.criterion(s.caps[level], s.min_updates()),
            validate_every=s.validate_every,
            snapshots=snapshots,
        )
        early = tuple(d for p, d in snapshots if p.startswith("u"))
        outputs = tuple(d for _, d in snapshots)
        jobs.append(
            Job(f"pre-{tag}", phase, seed, 1, (data[level],), outputs, early, training=training)
        )
        for point in points:
            if phase == "fig2" and point != point_name(s.figure2_branch):
                continue
            if phase == "main":
                arm_phase = "main" if point == "min" else "curve"
            else:
                arm_phase = phase
            arms = ["nll", "fuzzy-n2"] + (["nll-long"] if point == last and phase != "fig2" else [])
            for arm in arms:
                jobs.append(finetune_job(arm, tag, point, arm_phase, level, seed))
            model_dirs = [models / f"{a}-{tag}-{point}" for a in ["pre", *arms]]
            strategies = "lookahead" if phase == "fig2" else "greedy,lookahead"
            jobs.append(
                eval_job(
                    f"{tag}-{point}",
                    arm_phase,
                    level,
                    seed,
                    model_dirs,
                    "--strategies",
                    strategies,
                )
            )
            if (level, lam, point) == ("med", 4, "min"):
                others = [f"fuzzy-n{n}" for n in s.ngrams if n != 2]
                for arm in others:
                    jobs.append(finetune_job(arm, tag, point, "table1", level, seed))
                jobs.append(
                    eval_job(
                        f"n-{tag}-{point}",
                        "table1",
                        level,
                        seed,
                        [models / f"{a}-{tag}-{point}" for a in others],
                        "--strategies",
                        "lookahead",
                    )
                )

    at_config = write_config(
        root,
        "at",
        "synth-at.yaml",
        max_updates=s.caps["at"],
        validate_every=s.validate_every,
        save_every=s.validate_every,
    )
    for level in MAIN_LEVELS:
        for seed in s.seeds:
            tag = f"{level}-s{seed}"
            snapshots = (("min", models / f"at-{tag}-min"), ("stop", models / f"at-{tag}-stop"))
            training = Training(
                config=at_config,
                data=data[level],
                run_dir=root / "runs" / f"at-{tag}",
                seed=seed,
                level=level,
                criterion=s.criterion(s.caps["at"], s.at_min_updates),
                validate_every=s.validate_every,
                snapshots=snapshots,
                floor=False,
            )
            outputs = tuple(d for _, d in snapshots)
            jobs.append(Job(f"at-{tag}", "at", seed, 1, (data[level],), outputs, training=training))
            jobs.append(
                eval_job(
                    f"at-{tag}",
                    "at",
                    level,
                    seed,
                    [models / f"at-{tag}-min"],
                    "--at-beam-size",
                    "5",
                )
            )
    return jobs


def priority(job: Job) -> tuple[int, int, int]:
    """Start order: phase (``PHASES``), then seed, then data < pre-training < fine-tuning <
    evaluation, so that an interrupted study has whole seeds of its first phases."""
    return PHASES.index(job.phase), job.seed, job.order


def producers(jobs: list[Job]) -> dict[Path, Job]:
    """Output directory → the job that writes it."""
    return {out: j for j in jobs for out in j.outputs}


def select(jobs: list[Job], phases: tuple[str, ...]) -> list[Job]:
    """The jobs of ``phases`` and, transitively, the jobs that write their inputs."""
    made = producers(jobs)
    chosen = {j.name: j for j in jobs if j.phase in phases}
    todo = list(chosen.values())
    while todo:
        job = todo.pop()
        for path in job.inputs:
            maker = made.get(path)
            if maker is not None and maker.name not in chosen:
                chosen[maker.name] = maker
                todo.append(maker)
    return sorted(chosen.values(), key=priority)


# ----------------------------------------------------------------------------- job state


def stamp(path: Path) -> str:
    """What identifies the content of an input: a data directory by its meta.json, a model
    directory by its snapshot.json (run, point, update), a report by its bytes; "" if absent."""
    for name in ("snapshot.json", "meta.json"):
        if (path / name).is_file():
            return hashlib.sha256((path / name).read_bytes()).hexdigest()[:16]
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return ""


def state_path(root: Path, job: Job) -> Path:
    return root / "state" / f"{job.name}.json"


def _fingerprint(job: Job) -> dict:
    return {"key": job.key(), "inputs": {str(p): stamp(p) for p in job.inputs}}


def is_done(root: Path, job: Job) -> bool:
    """Finished with the current settings and inputs: its state file matches and its outputs
    exist (a larger budget, a changed criterion or a new input snapshot makes it not done)."""
    path = state_path(root, job)
    if not path.is_file() or not all(stamp(o) for o in job.outputs):
        return False
    return json.loads(path.read_text(encoding="utf-8")) == _fingerprint(job)


def mark_done(root: Path, job: Job) -> None:
    path = state_path(root, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_text(path, json.dumps(_fingerprint(job), indent=1, sort_keys=True) + "\n")


def _atomic_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all-or-nothing, through a temporary of its own (two ``run``
    schedulers on one root, e.g. split with ``--only``, write the same files)."""
    from fadat.outputs import atomic_write

    atomic_write(path, text)


def exists(path: Path) -> bool:
    """Whether a data directory, model directory or report has been written (completely: the
    recipe writes meta.json and snapshot.json last, reports atomically)."""
    return (path / "snapshot.json").is_file() or (path / "meta.json").is_file() or path.is_file()


def available(path: Path, maker: Job | None, done: set[str]) -> bool:
    """Whether an input can be read now: it exists and the job that writes it (``maker``) is
    done (``done``: names), or it is one of that job's early outputs (a fixed-update snapshot)."""
    if not exists(path):
        return False
    return maker is None or path in maker.early or maker.name in done


# ----------------------------------------------------------------------------- running


def _log(root: Path, message: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} {message}"
    print(line, flush=True)
    with open(root / "study.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _fadat(argv: list[str]) -> None:
    """Run one ``fadat`` command in this process; raises RuntimeError on a non-zero exit."""
    import torch

    from fadat import cli

    code = cli.main(argv)
    torch.set_num_threads(1)
    if code != 0:
        raise RuntimeError(f"fadat {argv[0]} exited {code}: fadat {' '.join(argv)}")


def checkpoint_update(run_dir: Path) -> int:
    """The update of a run's checkpoint_last (0 when there is none)."""
    from fadat.training.checkpoints import LAST_NAME, load_checkpoint

    path = run_dir / LAST_NAME
    return int(load_checkpoint(path)["progress"]["update"]) if path.is_file() else 0


def _prepare_run_dir(t: Training) -> None:
    """Start a run afresh when its inputs changed (another init snapshot) or when it was killed
    before its first checkpoint; otherwise it resumes. The inputs a run started from are
    recorded beside it (``RUN_DIR.inputs.json``: fadat train creates the run directory)."""
    record = t.run_dir.with_name(t.run_dir.name + ".inputs.json")
    inputs = {"init": stamp(t.init) if t.init else "", "data": stamp(t.data)}
    if t.run_dir.exists():
        has_checkpoint = (t.run_dir / "checkpoint_last.pt").is_file()
        same = record.is_file() and json.loads(record.read_text(encoding="utf-8")) == inputs
        if has_checkpoint and same:
            return
        shutil.rmtree(t.run_dir)
    t.run_dir.parent.mkdir(parents=True, exist_ok=True)
    _atomic_text(record, json.dumps(inputs) + "\n")


def _train_to(t: Training, target: int) -> None:
    """Train (or resume) the run up to update ``target``."""
    common = ["--threads", "1", "--no-progress-bar", "--max-updates", str(target)]
    if (t.run_dir / "checkpoint_last.pt").is_file():
        _fadat(["train", "--resume", str(t.run_dir), *common])
        return
    argv = ["train", "--config", str(t.config), "--data", str(t.data), "--run-dir", str(t.run_dir)]
    argv += ["--bf16", "--seed", str(t.seed), *common]
    if t.init is not None:
        argv += ["--init-from", str(t.init)]
    _fadat(argv)


def write_snapshot(checkpoint: Path, out: Path, data: Path, info: dict) -> None:
    """The model of a training checkpoint as a model directory ``out`` with ``snapshot.json``
    (``info``: run, point, update, valid loss), replacing an older one."""
    from fadat.training.checkpoints import write_averaged_model

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    write_averaged_model([checkpoint], tmp, data)
    (tmp / "snapshot.json").write_text(json.dumps(info, sort_keys=True) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def _loss_at(curve: list[dict], update: int) -> float:
    return next((e["valid_loss"] for e in curve if e["update"] == update), math.nan)


def _keep_snapshots(t: Training, name: str, update: int, curve: list[dict]) -> None:
    """After a segment (idempotent, so also after a kill): keep the checkpoint at a new valid-loss
    minimum as ``min.pt`` and write the fixed-update snapshots."""
    last = t.run_dir / "checkpoint_last.pt"
    if curve and curve[-1]["update"] == update:
        record = t.run_dir / "min.json"
        best = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
        if best is None or curve[-1]["valid_loss"] < best["valid_loss"]:
            from fadat.outputs import atomic_path

            with atomic_path(t.run_dir / "min.pt") as tmp:
                shutil.copyfile(last, tmp)
            _atomic_text(record, json.dumps(curve[-1]) + "\n")
    for point, out in t.snapshots:
        if point == f"u{update}" and stamp(out) == "":
            info = {"run": name, "point": point, "update": update}
            write_snapshot(last, out, t.data, {**info, "valid_loss": _loss_at(curve, update)})


def train_to_convergence(t: Training, name: str) -> Verdict:
    """Train in segments of ``validate_every`` updates until :func:`judge` stops the run; write
    the ``min`` and ``stop`` snapshots and ``RUN_DIR/verdict.json``."""
    crit = t.criterion
    entropy = None
    if t.floor:
        subset = int(yaml.safe_load(t.config.read_text(encoding="utf-8")).get("valid_subset", 0))
        entropy = entropy_per_token(t.data, t.level, subset)
    stops = sorted({*(int(p[1:]) for p, _ in t.snapshots if p.startswith("u")), crit.cap})
    while True:
        update = checkpoint_update(t.run_dir)
        curve = read_curve(t.run_dir, until=update)
        if update:
            _keep_snapshots(t, name, update, curve)
        verdict = judge([(e["update"], e["valid_loss"]) for e in curve], crit, entropy)
        if verdict.stop and verdict.last_update == update:
            break
        # The next validation, without stepping over a fixed branch point.
        target = (update // t.validate_every + 1) * t.validate_every
        target = min([target, *(u for u in stops if u > update)])
        _train_to(t, target)
    for point, out in t.snapshots:
        if point.startswith("u") and not exists(out):
            raise RuntimeError(
                f"{t.run_dir}: branch point {point} is before the run's update {update} but was "
                "not kept (added after the run passed it); branch there from a new --root"
            )
    best = json.loads((t.run_dir / "min.json").read_text(encoding="utf-8"))
    for point, out in t.snapshots:
        info = {"run": name, "point": point}
        if point == "min":
            info |= {"update": best["update"], "valid_loss": best["valid_loss"]}
            if json.loads(stamp_text(out) or "{}") != info:
                write_snapshot(t.run_dir / "min.pt", out, t.data, info)
        elif point == "stop":
            info |= {"update": update, "valid_loss": verdict.last_loss}
            if json.loads(stamp_text(out) or "{}") != info:
                write_snapshot(t.run_dir / "checkpoint_last.pt", out, t.data, info)
    record = {**dataclasses.asdict(verdict), "entropy": entropy, "criterion": crit.text()}
    _atomic_text(t.run_dir / "verdict.json", json.dumps(record, indent=1) + "\n")
    return verdict


def stamp_text(model_dir: Path) -> str:
    path = model_dir / "snapshot.json"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def train_fixed(t: Training, name: str) -> None:
    """Train to ``max_updates`` (resuming) and write the model with its snapshot.json."""
    if checkpoint_update(t.run_dir) < t.max_updates:
        _train_to(t, t.max_updates)
    update = checkpoint_update(t.run_dir)
    if update != t.max_updates:
        raise RuntimeError(f"{t.run_dir}: stopped at update {update}, not {t.max_updates}")
    curve = read_curve(t.run_dir, until=update)
    info = {"run": name, "point": "last", "update": update, "valid_loss": _loss_at(curve, update)}
    info["init"] = stamp(t.init) if t.init else ""
    ((_, out),) = t.snapshots
    write_snapshot(t.run_dir / "checkpoint_last.pt", out, t.data, info)


def nll_report(report: Path, data: Path, model_dirs: tuple[Path, ...]) -> dict:
    """Test-set NLL of every model (:func:`fadat.translation.pipeline.score_pairs`: DAT paper Eq. 3
    on the decoding graph over ``<s> y </s>``; AT teacher-forced over ``y </s>``) against the single
    reference, written to ``report`` as ``{model: {"nll_per_token", "nll_per_sentence",
    "tokens", "sentences", "unscorable"}}`` in nats. Unscorable pairs (−inf/NaN: a target longer
    than the graph) are counted and left out."""
    from fadat.evaluation.scoring import load_split
    from fadat.models.directory import load_model
    from fadat.translation.pipeline import score_pairs

    sources, references = load_split(data, "test", 0)
    out = {}
    for directory in model_dirs:
        model, sp = load_model(directory)
        scores = score_pairs(model, sp, sources, references[0], warn=lambda m: None)
        good = [s for s in scores if math.isfinite(s.log_prob)]
        total = -sum(s.log_prob for s in good)
        out[directory.name] = {
            "nll_per_token": total / max(sum(s.tokens for s in good), 1),
            "nll_per_sentence": total / max(len(good), 1),
            "tokens": sum(s.tokens for s in good),
            "sentences": len(good),
            "unscorable": len(scores) - len(good),
        }
    _atomic_text(report, json.dumps(out, indent=1) + "\n")
    return out


@contextlib.contextmanager
def job_lock(root: Path, job: Job) -> Iterator[None]:
    """Hold ``ROOT/state/NAME.lock`` (``flock``) while a job runs: a second ``run`` on the same
    root (another session) waits for the job instead of writing into the same run directory."""
    import fcntl

    path = state_path(root, job).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run_job(root: Path, job: Job) -> tuple[str, int, float, int]:
    """Run one job in this process (under :func:`job_lock`); returns (name, exit code, seconds,
    updates trained). Raises what the job raised (a fadat verb's non-zero exit: RuntimeError)."""
    start = time.time()
    with job_lock(root, job):
        before = 0
        t = job.training
        if t is not None:
            _prepare_run_dir(t)
            before = checkpoint_update(t.run_dir)
            if t.criterion is not None:
                train_to_convergence(t, job.name)
            else:
                train_fixed(t, job.name)
        for out in job.outputs if job.commands else ():
            if out.is_dir():  # a data directory of an interrupted or outdated attempt
                shutil.rmtree(out)
        for argv in job.commands:
            _fadat(list(argv))
        if job.nll is not None:
            nll_report(*job.nll)
        mark_done(root, job)
        updates = checkpoint_update(t.run_dir) - before if t is not None else 0
    return job.name, 0, time.time() - start, updates


def _job_process(root: Path, job: Job, scheduler: int) -> None:
    """A job's own process (spawned by the scheduler, pid ``scheduler``): run it, write
    ``ROOT/state/NAME.last.json`` (exit code, seconds, updates trained), exit with its code.
    An error is printed, not raised."""
    if sys.platform.startswith("linux"):
        # The job dies with the scheduler (PR_SET_PDEATHSIG = 1): a killed study leaves no
        # orphan still training; the job resumes from its checkpoint on the next run. A
        # scheduler killed before this line is seen by the parent check.
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        if os.getppid() != scheduler:
            os._exit(1)
    import traceback

    import torch

    torch.set_num_threads(1)
    start, code, updates = time.time(), 1, 0
    try:
        _, code, _, updates = run_job(root, job)
    except (Exception, KeyboardInterrupt):  # reported; the scheduler logs the failure
        traceback.print_exc()
    result = {"code": code, "seconds": round(time.time() - start, 1), "updates": updates}
    _atomic_text(state_path(root, job).with_suffix(".last.json"), json.dumps(result) + "\n")
    sys.exit(code)


def _record_time(root: Path, job: Job, seconds: float, updates: int) -> None:
    """Add a job's wall time and updates to ``ROOT/times.json`` (read, add and write under
    ``ROOT/times.lock``: another scheduler on the same root may be adding its own)."""
    import fcntl

    path = root / "times.json"
    with open(root / "times.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        entry = times.setdefault(job.name, {"seconds": 0.0, "updates": 0})
        entry["seconds"] = round(entry["seconds"] + seconds, 1)
        entry["updates"] = entry.get("updates", 0) + updates
        entry["kind"] = job_kind(job)
        _atomic_text(path, json.dumps(times, indent=1) + "\n")


def startable(pending: list[Job], made: dict[Path, Job], done: set[str], free: int) -> list[Job]:
    """The first ``free`` jobs of ``pending`` (in its order) whose inputs are all
    :func:`available`."""
    ready = [j for j in pending if all(available(p, made.get(p), done) for p in j.inputs)]
    return ready[: max(free, 0)]


def run(root: Path, s: Settings, jobs_at_once: int, only: str | None = None) -> int:
    """Run every unfinished job of ``s.phases`` (and the jobs their inputs need),
    ``jobs_at_once`` processes at a time: among the jobs whose inputs are available, the first
    by :func:`priority`. Returns 0 when every job finished, 1 after a failure (the running jobs
    are let finish; nothing new starts)."""
    import multiprocessing

    root.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    every = plan(root, s)
    made = producers(every)
    jobs = [j for j in select(every, s.phases) if only is None or only in j.name]
    done = {j.name for j in every if is_done(root, j)}
    pending = [j for j in jobs if j.name not in done]
    _log(root, f"{len(pending)} of {len(jobs)} jobs to run, {jobs_at_once} at a time")
    failed: list[str] = []
    # One spawned process per job (a fresh interpreter: no state carried from job to job).
    running: dict[str, tuple[Job, multiprocessing.process.BaseProcess, float]] = {}
    ctx = multiprocessing.get_context("spawn")
    try:
        while pending or running:
            for name, (job, proc, started) in list(running.items()):
                if proc.exitcode is None:
                    continue
                del running[name]
                last = state_path(root, job).with_suffix(".last.json")
                result = json.loads(last.read_text(encoding="utf-8")) if last.is_file() else {}
                last.unlink(missing_ok=True)
                seconds = time.time() - started
                _record_time(root, job, seconds, result.get("updates", 0))
                if proc.exitcode == 0 and is_done(root, job):
                    done.add(name)
                    _log(root, f"done {name} ({seconds:.0f} s)")
                else:
                    failed.append(name)
                    _log(root, f"FAILED {name} (exit {proc.exitcode})")
            if failed:
                pending = []  # after a failure: let the running jobs finish
            for job in startable(pending, made, done, jobs_at_once - len(running)):
                pending.remove(job)
                _log(root, f"start {job.name}")
                proc = ctx.Process(target=_job_process, args=(root, job, os.getpid()))
                proc.start()
                running[job.name] = (job, proc, time.time())
            if pending and not running:
                _log(root, "no job can start: " + ", ".join(j.name for j in pending[:5]))
                failed.append("(blocked)")
                break
            time.sleep(1.0)
    except KeyboardInterrupt:
        # Ctrl-C reached the jobs too: fadat train writes its checkpoint and exits; wait.
        for _, proc, _ in running.values():
            proc.join()
        _log(root, "interrupted; `run` again resumes")
        return 130
    _log(root, "finished" if not failed else f"stopped: {len(failed)} failed ({', '.join(failed)})")
    return 1 if failed else 0


# ----------------------------------------------------------------------------- plan


#: Seconds per update on one core, the estimates ``plan`` uses until ROOT/times.json has
#: measurements of the kind. Pre-training and AT: ≈ 0.1 CPU-s per update (RESULTS.md, "The
#: synthetic study": pre-training and 3,000 AT updates ≈ 5 CPU-minutes); fine-tuning batches
#: are twice as large (0.2 s), fuzzy alignment costs ≈ 1.5× NLL (0.3 s). A pre-training at λ
#: scales as λ/4 (the decoder's positions). Each validation (200 sentences, decoding and loss)
#: and each segment's start-up (data, model, checkpoint): ≈ 3 s; an evaluation ≈ 30 s per model.
SECONDS_PER_UPDATE = {"pre": 0.1, "at": 0.1, "ft-nll": 0.2, "ft-fuzzy": 0.3}
SECONDS_PER_VALIDATION = 3.0
SECONDS_PER_EVAL_MODEL = 30.0


def job_kind(job: Job) -> str:
    if job.training is None:
        return "eval" if job.nll is not None else "data"
    if job.training.criterion is not None:
        return "at" if job.name.startswith("at-") else "pre"
    return "ft-fuzzy" if job.name.startswith("fuzzy") else "ft-nll"


def measured_rates(root: Path) -> dict[str, float]:
    """Seconds per update by kind of job, from ROOT/times.json (wall seconds of whole jobs over
    the updates they trained, so start-up and validation are included)."""
    path = root / "times.json"
    if not path.is_file():
        return {}
    sums: dict[str, list[float]] = {}
    for entry in json.loads(path.read_text(encoding="utf-8")).values():
        if entry.get("updates") and entry.get("kind"):
            acc = sums.setdefault(entry["kind"], [0.0, 0.0])
            acc[0] += entry["seconds"]
            acc[1] += entry["updates"]
    return {k: sec / upd for k, (sec, upd) in sums.items() if upd}


def estimate(job: Job, rates: dict[str, float]) -> tuple[float, float]:
    """(low, high) core-seconds of a job: a run trained to convergence stops between its
    earliest stop and its cap."""
    kind = job_kind(job)
    if kind == "data":
        return (20.0, 20.0) if "10x" not in job.name else (200.0, 200.0)
    if kind == "eval":
        n = len(job.nll[2]) if job.nll else 1
        return n * SECONDS_PER_EVAL_MODEL, n * SECONDS_PER_EVAL_MODEL
    t = job.training
    measured = kind in rates
    rate = rates.get(kind, SECONDS_PER_UPDATE[kind])
    if kind == "pre" and not measured:
        lam = float(yaml.safe_load(t.config.read_text(encoding="utf-8"))["model"]["upsample_ratio"])
        rate *= lam / 4
    if t.criterion is None:
        return t.max_updates * rate, t.max_updates * rate

    def cost(updates: int) -> float:
        extra = 0.0 if measured else updates / t.validate_every * SECONDS_PER_VALIDATION
        return updates * rate + extra

    return cost(t.criterion.min_updates), cost(t.criterion.cap)


def plan_text(root: Path, s: Settings) -> str:
    """The jobs of ``s.phases`` in start order with the estimated core-hours per phase."""
    every = plan(root, s)
    jobs = select(every, s.phases)
    rates = measured_rates(root)
    lines = [
        f"Study root {root}; phases {', '.join(s.phases)}; branch points {', '.join(s.branches)}",
        "Seconds per update: "
        + ", ".join(
            f"{k} {rates.get(k, v):.3f} ({'measured' if k in rates else 'estimate'})"
            for k, v in SECONDS_PER_UPDATE.items()
        ),
        "",
    ]
    by_phase: dict[str, list[Job]] = {}
    for job in jobs:
        by_phase.setdefault(job.phase, []).append(job)
    total = [0.0, 0.0]
    for phase in PHASES:
        if phase not in by_phase:
            continue
        low = sum(estimate(j, rates)[0] for j in by_phase[phase] if not is_done(root, j))
        high = sum(estimate(j, rates)[1] for j in by_phase[phase] if not is_done(root, j))
        total[0] += low
        total[1] += high
        done = sum(is_done(root, j) for j in by_phase[phase])
        lines.append(
            f"## {phase}: {len(by_phase[phase])} jobs ({done} done), "
            f"{low / 3600:.2f}–{high / 3600:.2f} core-hours left"
        )
        for job in by_phase[phase]:
            lo, hi = estimate(job, rates)
            state = "done" if is_done(root, job) else f"{lo / 60:.1f}–{hi / 60:.1f} min"
            lines.append(f"  {job.name}  [{state}]")
    lines.append(f"\nTotal left: {total[0] / 3600:.2f}–{total[1] / 3600:.2f} core-hours")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- statistics


def _mean_sd(values: list[float], digits: int = 2) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def t_test_p(diffs: list[float]) -> float:
    """Two-sided p of the paired t-test (Student's t with n − 1 degrees of freedom)."""
    n = len(diffs)
    if n < 2:
        return math.nan
    sd = statistics.stdev(diffs)
    if sd == 0:
        return 0.0 if statistics.fmean(diffs) != 0 else 1.0
    t = abs(statistics.fmean(diffs)) / (sd / math.sqrt(n))
    df = n - 1
    # With T = √df·tan θ the tail P(|T| > t) = 2 ∫ c √df cos^(df−1) θ dθ over [atan(t/√df), π/2]
    # (c the t density's constant): a smooth integrand on a finite range, Simpson's rule.
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    lo, hi = math.atan(t / math.sqrt(df)), math.pi / 2
    steps = 2000
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * math.cos(lo + i * h) ** (df - 1)
    return min(1.0, 2 * c * math.sqrt(df) * total * h / 3)


def mcnemar_p(a: list[bool], b: list[bool]) -> float:
    """Exact two-sided McNemar test of two paired success lists (binomial on discordant pairs)."""
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_p(hyps_a: list[str], hyps_b: list[str], refs: list[list[str]], seed: int) -> float:
    """Paired bootstrap (sentence resampling, ``BOOTSTRAP`` times) of corpus BLEU against the
    listed valid translations: the share of resamples where B is not better than A (one-sided,
    doubled for a two-sided p), with the observed difference's sign."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(tokenize="none")
    width = max(len(r) for r in refs)
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
    sa = np.array(bleu._extract_corpus_statistics(hyps_a, streams), dtype=np.float64)
    sb = np.array(bleu._extract_corpus_statistics(hyps_b, streams), dtype=np.float64)
    score = lambda s: bleu._compute_score_from_stats(list(s)).score  # noqa: E731
    observed = score(sb.sum(0)) - score(sa.sum(0))
    rng = np.random.default_rng(seed)
    n = len(hyps_a)
    worse = 0
    for _ in range(BOOTSTRAP):
        idx = rng.integers(n, size=n)
        d = score(sb[idx].sum(0)) - score(sa[idx].sum(0))
        worse += (d <= 0) if observed > 0 else (d >= 0)
    return min(1.0, 2 * (worse + 1) / (BOOTSTRAP + 1))


# ----------------------------------------------------------------------------- tables


METRICS = (
    ("exact valid %", "exact_valid", 2),
    ("BLEU (valid set)", "bleu_multi", 2),
    ("BLEU (1 ref)", "bleu_single", 2),
    ("mixtures %", "mixture_rate", 2),
    ("repeated tok %", "repeated_tokens", 2),
    ("len err", "length_error", 2),
    ("test NLL/tok", "nll_per_token", 4),
)


class Results:
    """Every evaluated system's scores under ROOT/eval (read once)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.systems: dict[str, dict] = {}
        self.nll: dict[str, dict] = {}
        for path in sorted((root / "eval").glob("*.json")):
            obj = json.loads(path.read_text(encoding="utf-8"))
            if path.name.endswith(".nll.json"):
                self.nll.update(obj)
                continue
            for s in obj["systems"]:
                hyps = path.with_suffix("") / (s["name"].replace(":", ".") + ".txt")
                self.systems[s["name"]] = {**s["validset"], "hypotheses": hyps}

    def get(self, model: str, strategy: str) -> dict | None:
        """Scores of ``MODEL:STRATEGY`` with the model's test NLL, or None."""
        found = self.systems.get(f"{model}:{strategy}")
        if found is None:
            return None
        return {**found, **self.nll.get(model, {})}

    def hyps(self, model: str, strategy: str) -> list[str]:
        return self.systems[f"{model}:{strategy}"]["hypotheses"].read_text("utf-8").splitlines()


def _row(label: str, runs: list[dict | None]) -> str:
    runs = [r for r in runs if r is not None]
    cells = [_mean_sd([r[k] for r in runs if k in r], d) for _, k, d in METRICS]
    return f"| {label} | {len(runs)} | " + " | ".join(cells) + " |"


def _header(first: str) -> list[str]:
    names = [m for m, _, _ in METRICS]
    return [
        f"| {first} | seeds | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]


PAIRED_HEADER = [
    "| setting | Δ BLEU (valid set) | p (bootstrap) | Δ exact valid | p (McNemar) "
    "| mixtures A → B | Δ test NLL/tok |",
    "|---|---:|---:|---:|---:|---|---:|",
]


def paired(
    res: Results, data: Path, label: str, pairs: list[tuple[int, str, str]], strategy: str
) -> list[str]:
    """Rows of B − A per seed with their tests, and the t-test over seeds.

    Args:
        pairs: ``(seed, model A, model B)``; pairs without both evaluations are skipped.
    """
    from fadat.data.synth import read_listed_references, read_valid_sets

    sets = read_valid_sets(data, "test")
    if sets is None:
        return []
    listed = read_listed_references(data, "test")
    lines = []
    d_bleu, d_valid = [], []
    for seed, model_a, model_b in pairs:
        a, b = res.get(model_a, strategy), res.get(model_b, strategy)
        if a is None or b is None:
            continue
        ha, hb = res.hyps(model_a, strategy), res.hyps(model_b, strategy)
        va = [v.contains(h.split()) for v, h in zip(sets, ha, strict=True)]
        vb = [v.contains(h.split()) for v, h in zip(sets, hb, strict=True)]
        d_bleu.append(b["bleu_multi"] - a["bleu_multi"])
        d_valid.append(b["exact_valid"] - a["exact_valid"])
        d_nll = b.get("nll_per_token", math.nan) - a.get("nll_per_token", math.nan)
        lines.append(
            f"| {label} s{seed} | {d_bleu[-1]:+.2f} | {bootstrap_p(ha, hb, listed, seed):.3f} "
            f"| {d_valid[-1]:+.2f} | {mcnemar_p(va, vb):.3g} "
            f"| {a['mixtures']} → {b['mixtures']} | {d_nll:+.4f} |"
        )
    if len(d_bleu) > 1:
        lines.append(
            f"| {label} mean | {statistics.fmean(d_bleu):+.2f} | t-test p = "
            f"{t_test_p(d_bleu):.3f} | {statistics.fmean(d_valid):+.2f} | t-test p = "
            f"{t_test_p(d_valid):.3f} | | |"
        )
    return lines


def convergence_table(root: Path, s: Settings) -> list[str]:
    """Every run trained to convergence: its minimum, its latest validation, its verdict."""
    lines = [
        "| run | updates | min valid loss @ update | last valid loss | rise (nats) "
        "| rise (% of min) | validations since min | data entropy | min − entropy "
        "| valid BLEU @ min / last | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for job in plan(root, s):
        t = job.training
        if t is None or t.criterion is None:
            continue
        curve = read_curve(t.run_dir)
        if not curve:
            continue
        entropy = None
        if t.floor:
            subset = int(yaml.safe_load(t.config.read_text(encoding="utf-8"))["valid_subset"])
            entropy = entropy_per_token(t.data, t.level, subset)
        v = judge([(e["update"], e["valid_loss"]) for e in curve], t.criterion, entropy)
        bleu = {e["update"]: e["bleu"] for e in curve}
        if v.reason == "overfit":
            verdict = f"converged: overfit (min at {v.best_update})"
        elif v.reason == "floor":
            verdict = "converged: at the entropy floor"
        elif v.reason == "cap":
            verdict = f"NOT converged: cap {t.criterion.cap}"
        else:
            verdict = "running"
        ent = "–" if entropy is None else f"{entropy:.4f}"
        relative = f"{100 * v.rise / v.best_loss:+.1f} %" if v.best_loss > 0 else "–"
        gap = "–" if entropy is None else f"{v.best_loss - entropy:+.4f}"
        lines.append(
            f"| {job.name} | {v.last_update} | {v.best_loss:.4f} @ {v.best_update} "
            f"| {v.last_loss:.4f} | {v.rise:+.4f} | {relative} "
            f"| {v.since_best} | {ent} | {gap} "
            f"| {bleu[v.best_update]:.2f} / {bleu[v.last_update]:.2f} | {verdict} |"
        )
    return lines


def snapshot_update(root: Path, model: str) -> int | None:
    text = stamp_text(root / "models" / model)
    return json.loads(text)["update"] if text else None


def curve_points(root: Path, res: Results, s: Settings, level: str, seeds) -> list[dict]:
    """Per branch point of a level's λ = 4 pre-trainings: the updates (per seed) and the
    lookahead scores of the pre-trained model and its arms (per seed)."""
    out = []
    for branch in s.branches:
        point = point_name(branch)
        row = {"point": point, "updates": [], "arms": {}}
        for seed in seeds:
            tag = f"{level}-l4-s{seed}"
            update = snapshot_update(root, f"pre-{tag}-{point}")
            if update is not None:
                row["updates"].append(update)
            for arm in ("pre", "nll", "fuzzy-n2", "nll-long"):
                scores = res.get(f"{arm}-{tag}-{point}", "lookahead")
                if scores is not None:
                    row["arms"].setdefault(arm, []).append(scores)
        out.append(row)
    return out


ARM_LABELS = {
    "pre": "DA-T (pre-trained)",
    "nll": "NLL continued",
    "fuzzy-n2": "FA-DAT (n = 2)",
    "nll-long": "NLL continued (long)",
}


def tables(root: Path, s: Settings) -> str:
    """The study's tables as markdown (whatever has finished so far)."""
    res = Results(root)
    data = {level: root / "data" / level for level in LEVELS}
    crit = s.criterion(s.caps["med"], s.min_updates())
    out = [f"Study root: {root}; test split; mean ± sd over seeds ({s.seeds}).", ""]
    out += [
        f"**Convergence** (criterion, valid loss per token: {crit.text()}; caps {s.caps}; "
        f"the AT's earliest stop {s.at_min_updates})",
        "",
    ]
    out += convergence_table(root, s) + [""]

    out += [
        "**At convergence: branch point `min`** (λ = 4; DAT lookahead and greedy; test NLL per "
        "token in nats, over <s> y </s> for the DAT as its valid NLL, over y </s> for the AT)",
        "",
    ]
    for level in MAIN_LEVELS:
        p, q, _ = LEVELS[level]
        out += [f"{level}: P = {p}, Q = {q}", ""] + _header("system")
        for arm in ("pre", "nll", "fuzzy-n2"):
            for strategy in ("lookahead", "greedy"):
                runs = [res.get(f"{arm}-{level}-l4-s{x}-min", strategy) for x in s.seeds]
                out.append(_row(f"{ARM_LABELS[arm]}, {strategy}", runs))
        for strategy in ("beam5", "greedy"):
            runs = [res.get(f"at-{level}-s{x}-min", strategy) for x in s.seeds]
            out.append(_row(f"AT (valid-loss minimum), {strategy}", runs))
        out.append("")
    out += ["**FA-DAT (n = 2) − NLL continued at `min`, per seed** (lookahead)", ""]
    out += PAIRED_HEADER
    for level in MAIN_LEVELS:
        pairs = [(x, f"nll-{level}-l4-s{x}-min", f"fuzzy-n2-{level}-l4-s{x}-min") for x in s.seeds]
        out += paired(res, data[level], level, pairs, "lookahead")

    last = point_name(s.branches[-1])
    out += ["", "**The curve: branch points along the pre-training** (λ = 4, lookahead)", ""]
    for level in (*MAIN_LEVELS, "med10x"):
        seeds = s.large_seeds if level == "med10x" else s.seeds
        out += [f"{level}", ""] + _header("branch point (updates): system")
        for row in curve_points(root, res, s, level, seeds):
            where = f"{row['point']} ({_mean_sd([float(u) for u in row['updates']], 0)})"
            for arm, runs in row["arms"].items():
                out.append(_row(f"{where}: {ARM_LABELS[arm]}", runs))
        out += ["", f"FA-DAT − NLL continued per branch point, and − long NLL at `{last}`:", ""]
        out += PAIRED_HEADER
        for branch in s.branches:
            point = point_name(branch)
            pairs = [
                (x, f"nll-{level}-l4-s{x}-{point}", f"fuzzy-n2-{level}-l4-s{x}-{point}")
                for x in seeds
            ]
            out += paired(res, data[level], f"{level} {point}", pairs, "lookahead")
        pairs = [
            (x, f"nll-long-{level}-l4-s{x}-{last}", f"fuzzy-n2-{level}-l4-s{x}-{last}")
            for x in seeds
        ]
        out += paired(res, data[level], f"{level} {last} vs long NLL", pairs, "lookahead")
        out.append("")

    point = point_name(s.figure2_branch)
    out += [f"**Paper Figure 2 on med: λ** (branch point `{point}`, lookahead)", ""]
    out += _header("system")
    for lam in s.lambdas:
        for arm in ("pre", "nll", "fuzzy-n2"):
            runs = [res.get(f"{arm}-med-l{lam}-s{x}-{point}", "lookahead") for x in s.seeds]
            out.append(_row(f"λ = {lam}: {ARM_LABELS[arm]}", runs))
    out += ["", "FA-DAT − NLL continued per λ:", ""] + PAIRED_HEADER
    for lam in s.lambdas:
        pairs = [
            (x, f"nll-med-l{lam}-s{x}-{point}", f"fuzzy-n2-med-l{lam}-s{x}-{point}")
            for x in s.seeds
        ]
        out += paired(res, data["med"], f"med λ={lam}", pairs, "lookahead")

    out += ["", "**Paper Table 1 on med: n** (λ = 4, branch point `min`, lookahead)", ""]
    out += _header("system")
    for arm in ("pre", "nll"):
        runs = [res.get(f"{arm}-med-l4-s{x}-min", "lookahead") for x in s.seeds]
        out.append(_row(ARM_LABELS[arm], runs))
    for n in s.ngrams:
        runs = [res.get(f"fuzzy-n{n}-med-l4-s{x}-min", "lookahead") for x in s.seeds]
        out.append(_row(f"FA-DAT n = {n}", runs))

    times_path = root / "times.json"
    if times_path.is_file():
        groups: dict[str, float] = {}
        for entry in json.loads(times_path.read_text(encoding="utf-8")).values():
            kind = entry.get("kind", "?")
            groups[kind] = groups.get(kind, 0.0) + entry["seconds"]
        out += [
            "",
            "Wall time per kind of job (minutes, summed over jobs): "
            + ", ".join(f"{k} {v / 60:.1f}" for k, v in sorted(groups.items()))
            + f"; total {sum(groups.values()) / 60:.1f}",
        ]
    return "\n".join(out)


def _save_figure(fig, legend: dict[str, object], path: Path) -> Path:
    """One legend under the panels (the arms in ``legend``, labelled by :data:`ARM_LABELS`),
    then the figure as a PNG at ``path``, written atomically; closes the figure."""
    import matplotlib.pyplot as plt

    from fadat.outputs import atomic_path

    if legend:
        fig.legend(
            list(legend.values()),
            [ARM_LABELS[a] for a in legend],
            loc="lower center",
            ncol=len(legend),
            fontsize=9,
            frameon=False,
        )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path


def plot(root: Path, s: Settings, path: Path) -> Path:
    """PNG: exact-valid % (lookahead, mean ± sd over seeds) against the pre-training updates of
    the branch point (mean over seeds, horizontal bar ± sd), NLL continued and FA-DAT (and the
    pre-trained DA-T, dashed; the long NLL arm at ``stop``, an open square), one panel per level
    (det, med, high, med10x), one legend under the panels. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = Results(root)
    levels = (*MAIN_LEVELS, "med10x")
    fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels), 3.9), sharey=True)
    styles = {  # arm: colour, line style, marker, marker face
        "pre": ("0.5", "--", "o", "0.5"),
        "nll": ("tab:blue", "-", "o", "tab:blue"),
        "fuzzy-n2": ("tab:red", "-", "o", "tab:red"),
        "nll-long": ("tab:blue", "none", "s", "none"),
    }
    legend: dict[str, object] = {}
    for ax, level in zip(axes, levels, strict=True):
        seeds = s.large_seeds if level == "med10x" else s.seeds
        rows = [r for r in curve_points(root, res, s, level, seeds) if r["updates"]]
        rows.sort(key=lambda r: statistics.fmean(r["updates"]))
        for arm, (color, style, marker, face) in styles.items():
            xs, ys, xe, ye = [], [], [], []
            for r in rows:
                runs = r["arms"].get(arm)
                if not runs:
                    continue
                values = [x["exact_valid"] for x in runs]
                xs.append(statistics.fmean(r["updates"]))
                ys.append(statistics.fmean(values))
                xe.append(statistics.stdev(r["updates"]) if len(r["updates"]) > 1 else 0.0)
                ye.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            if xs:
                legend[arm] = ax.errorbar(
                    xs,
                    ys,
                    xerr=xe,
                    yerr=ye,
                    color=color,
                    ls=style,
                    marker=marker,
                    markerfacecolor=face,
                    markersize=7 if arm == "nll-long" else 6,
                    capsize=3,
                )
        ax.set_ylim(-2, 102)
        ax.set_title(f"{level} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
        ax.set_xlabel("pre-training updates at the branch point")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact-valid % (test, lookahead)")
    return _save_figure(fig, legend, path)


def plot_lambda(root: Path, s: Settings, path: Path) -> Path:
    """PNG, the study's paper Figure 2: on med at branch point ``figure2_branch``, exact-valid %
    and BLEU against the single reference (lookahead, mean ± sd over seeds) against the upsample
    ratio λ, for the pre-trained DA-T, NLL continued and FA-DAT (n = 2). λ values without
    results are left out. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = Results(root)
    point = point_name(s.figure2_branch)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.9))
    styles = {"pre": ("0.5", "--"), "nll": ("tab:blue", "-"), "fuzzy-n2": ("tab:red", "-")}
    legend: dict[str, object] = {}
    for ax, (name, key, _) in zip(axes, (METRICS[0], METRICS[2]), strict=True):
        for arm, (color, style) in styles.items():
            xs, ys, ye = [], [], []
            for lam in s.lambdas:
                runs = [res.get(f"{arm}-med-l{lam}-s{x}-{point}", "lookahead") for x in s.seeds]
                values = [r[key] for r in runs if r is not None]
                if values:
                    xs.append(lam)
                    ys.append(statistics.fmean(values))
                    ye.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            if xs:
                legend[arm] = ax.errorbar(
                    xs, ys, yerr=ye, color=color, ls=style, marker="o", capsize=3
                )
        ax.set_xticks(list(s.lambdas))
        ax.set_xlabel("upsample ratio λ (graph size L = λ · source length)")
        ax.set_ylabel(f"{name} (test, lookahead)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"med, branch point {point}, {len(s.seeds)} seeds", fontsize=10)
    return _save_figure(fig, legend, path)


# ----------------------------------------------------------------------------- command line


def _parse_caps(text: str) -> dict[str, int]:
    caps = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if not value.isdigit():
            _fail(f"--caps: {part!r} is not LEVEL=UPDATES")
        caps[name.strip()] = int(value)
    return caps


def settings_for(root: Path, args: argparse.Namespace) -> Settings:
    """ROOT/settings.json (or the defaults) with the command line's options on top."""
    path = root / "settings.json"
    base = (
        Settings.from_json(json.loads(path.read_text(encoding="utf-8")))
        if path.is_file()
        else Settings()
    )
    changes: dict = {}
    if getattr(args, "branches", None):
        # In the order of time as far as it is known: updates, then min, then stop (the last
        # one gets the long NLL arm).
        given = {b.strip() for b in args.branches.split(",")}
        rank = {"min": 1, "stop": 2}
        changes["branches"] = tuple(
            sorted(given, key=lambda b: (0, int(b)) if b.isdigit() else (rank.get(b, 3), 0))
        )
    if getattr(args, "phases", None):
        changes["phases"] = tuple(p.strip() for p in args.phases.split(","))
    if getattr(args, "caps", None):
        changes["caps"] = {**base.caps, **_parse_caps(args.caps)}
    s = dataclasses.replace(base, **changes)
    s.check()
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "plan": "print the jobs in start order with estimated core-hours per phase",
        "run": "run or resume the study",
        "table": "print the tables (and write ROOT/tables.md)",
    }
    for name, text in commands.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--root", default="runs/synth-study")
        p.add_argument("--phases", help=f"comma-separated subset of {','.join(PHASES)}")
        if name != "table":
            p.add_argument("--branches", help="branch points, e.g. 1200,3000,min,stop")
            p.add_argument("--caps", help="update caps, e.g. med=20000,at=8000")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="processes at once (1 thread each)")
            p.add_argument("--only", help="only jobs whose name contains this")
        if name != "plan":
            p.add_argument("--plot", help="write the curve's PNG here")
            p.add_argument("--plot-lambda", help="write Figure 2's PNG (λ) here")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    s = settings_for(root, args)
    if args.command == "plan":
        print(plan_text(root, s))
        return 0
    code = 0
    if args.command == "run":
        root.mkdir(parents=True, exist_ok=True)
        _atomic_text(root / "settings.json", json.dumps(s.to_json(), indent=1) + "\n")
        code = run(root, s, args.jobs, args.only)
    if (root / "runs").is_dir() or (root / "eval").is_dir():
        from fadat.errors import InputError

        text = tables(root, s)
        try:
            _atomic_text(root / "tables.md", text + "\n")
            print(text)
            if args.plot:
                print(f"plot: {plot(root, s, Path(args.plot).resolve())}")
            if args.plot_lambda:
                print(f"plot: {plot_lambda(root, s, Path(args.plot_lambda).resolve())}")
        except InputError as err:  # a PNG or tables.md that cannot be written: one line
            _fail(str(err))
    return code


if __name__ == "__main__":
    sys.exit(main())
