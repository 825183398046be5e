"""Paper-comparison experiments (RESULTS.md), resumable across sessions.

An experiment file (``recipes/experiments/*.yaml``) describes a whole experiment: its datasets,
integer variables (N, M), seeds and an ordered list of training stages, each trained once per
seed, and what ``evaluate`` compares. ``run`` trains the pending stages in order for at most
``--slice`` of training time, then stops; running it again continues where it stopped
(``fadat train --resume RUN --max-time ...``), also after a kill (the runs save
``checkpoint_last.pt`` every ``save_every`` updates; a run whose train log changed in the last
5 minutes is taken to be training elsewhere and left alone), and from a compact copy of the run
(``fadat snapshot --with-best``, put in the run's place after its run directory was lost: it
continues with ``--reset-optimizer`` on the stage's dataset). A finished stage is averaged into
``RUNS/models/STAGE-sSEED``, beside its run. ``evaluate`` runs ``fadat evaluate`` per seed on the
whole test split (the seed's models plus the ``shared`` stages), with sacreBLEU's paired
bootstrap against the first listed model and the short-word drift statistics of every system's
hypotheses; ``table`` prints the
reports, the time per arm and the plateau curves as Markdown for RESULTS.md (``--plot PNG``).

Usage (``--root`` and ``--data-root`` are accepted by every command)::

    python recipes/experiment.py run EXPERIMENT [--slice 150m] [--only pretrain-s1,at-s1]
        [--root DIR (runs in DIR/NAME/STAGE-sSEED; default runs/experiments)]
        [--data-root DIR (datasets; default data/)]
    python recipes/experiment.py status EXPERIMENT
    python recipes/experiment.py link EXPERIMENT STAGE RUN_DIR [--seed 1]
    python recipes/experiment.py adopt EXPERIMENT STAGE MODEL_DIR [--run RUN_DIR] [--seed 1]
    python recipes/experiment.py evaluate EXPERIMENT [--subset N] [--force]
    python recipes/experiment.py table EXPERIMENT [--plot curves.png]

fadat is run as ``sys.executable -m fadat.cli`` with this process's environment, and the few
in-process uses (the test references of the drift statistics, the text export of
``retokenize``) import ``fadat`` from the same ``sys.path``: ``PYTHONPATH=/path/to/frozen/copy
python recipes/experiment.py ...`` runs the whole experiment on that copy of the library while
the checkout changes (configs and the experiment file are read from this checkout).

Experiment file
---------------
Top level: ``name``; ``data`` (dataset directory, relative to ``--data-root``) and ``prepare``
(its ``fadat prepare`` arguments, run when the directory has no ``meta.json``); ``vars``;
``seeds``; ``stages``; ``evaluate: {models, shared, strategies, data}`` (or a list of such
comparisons, each after the first with a ``name``); ``datasets``: derived datasets that a
stage's ``data`` may name, built when a stage needs them (``distill`` by a stage's AT model or
a model directory of the checkout,
``retokenize`` with another dataset's sentencepiece model; see :func:`make_dataset`).

A stage: ``name``, ``config`` (relative to the checkout), ``seeds`` (default: the top level's),
``average`` (K: the K best checkpoints by valid BLEU are averaged), ``train`` (extra
``fadat train`` flags of a fresh start), ``data``/``prepare`` (its own dataset), ``optional``
(run only when ``--only`` names it), and

- ``max_updates``: an integer, a sum of variables (``"N+M"``), or a fine-tuning budget
  ``{share_of_pretrain_tokens: s, batch_ratio: r}`` of the ``init_from`` stage's plateau update N:
  ``round(N * s / r)`` updates, r being the ratio of the two stages' tokens per update
  (``max_tokens * update_freq``, checked against the configs). The paper fine-tunes 5k updates of
  256k tokens after 300k of 64k: s = 5k * 256k / (300k * 64k) = 0.0667 at r = 4.
- ``until: {plateau: {min_updates, window, gain}}``: train until the plateau criterion holds
  (below) or ``max_updates``. While it trains, ``run`` reads the run's ``valid_log.jsonl`` every
  few seconds and stops the run (SIGINT: it saves ``checkpoint_last.pt``) once it holds. The
  stage's model averages the K best checkpoints validated at updates <= N.
- ``init_from``: a stage name (the same seed's model) or ``{stage: NAME, seed: S}`` (that seed's
  model for every seed of this stage: fine-tuning seeds that differ from the pre-training's).
- ``warmup_share``/``validations``: ``--warmup round(share * max_updates)`` and
  ``--validate-every max_updates // validations`` (for budgets known only at run time).

**Plateau criterion.** With b(u) the best valid BLEU of the validations at updates <= u, the
stage's plateau update N is the first validated update with N >= ``min_updates`` and
b(N) - b((1 - ``window``) * N) < ``gain`` (exact rational arithmetic on ``window``; a window
that reaches before the first validation never holds).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 5.0  # how often a plateau stage's valid log is read while it trains
# A run whose train log changed this recently is taken to be training in another process (a run
# started by hand, or the child of a killed harness): resuming it too would corrupt it. Longer
# than a validation of the whole valid set on one thread.
BUSY_SECONDS = 300.0

STAGE_KEYS = {
    "name", "config", "seeds", "average", "train", "data", "prepare", "optional",
    "max_updates", "until", "init_from", "warmup_share", "validations",
}  # fmt: skip
# Training settings that may differ between an adopted/linked run and the stage: they change
# neither the model nor the optimisation.
UNCHECKED_KEYS = {
    "validate_every", "valid_subset", "threads", "save_every", "max_time", "max_tokens_valid",
    "device", "progress_bar", "log_every", "run_dir", "data",
}  # fmt: skip


@dataclass(frozen=True)
class Plateau:
    min_updates: int
    window: Fraction  # share of the updates looked back over, 0 < window < 1
    gain: float  # valid BLEU points


@dataclass(frozen=True)
class Budget:
    share: float  # of the init_from stage's training tokens up to its plateau
    batch_ratio: float  # this stage's tokens per update / the init_from stage's


@dataclass(frozen=True)
class Stage:
    name: str
    config: str
    seed: int
    max_updates: int  # the cap; 0 for a Budget stage (known once init_from has plateaued)
    budget: Budget | None
    plateau: Plateau | None
    init_from: str  # stage name or ""
    init_seed: int  # seed of the init_from stage's model
    average: int
    train: tuple[tuple[str, Any], ...]  # extra fadat train settings of a fresh start
    data: str
    prepare: tuple[str, ...]
    warmup_share: float
    validations: int
    optional: bool

    @property
    def key(self) -> str:
        return f"{self.name}-s{self.seed}"

    @property
    def init_key(self) -> str:
        return f"{self.init_from}-s{self.init_seed}"

    @property
    def options(self) -> list[str]:
        return _flags(dict(self.train))


@dataclass(frozen=True)
class Paths:
    runs: Path  # runs of the experiment: runs / STAGE-sSEED
    data: Path  # relative dataset directories are resolved here

    def dataset(self, name: str) -> Path:
        return self.data / name

    def model(self, key: str) -> Path:
        """The averaged model of stage ``key`` (``STAGE-sSEED``): ``runs / models / key``, beside
        the run rather than inside it (fadat never writes an output inside a run it reads)."""
        return self.runs / "models" / key


def evaluate_int(expr: Any, variables: dict[str, int]) -> int:
    """``3000``, ``"N"`` or ``"N+M"``: a sum of integers and variable names."""
    if isinstance(expr, int):
        return expr
    total = 0
    for term in str(expr).split("+"):
        term = term.strip()
        if re.fullmatch(r"\d+", term):
            total += int(term)
        elif term in variables:
            total += int(variables[term])
        else:
            raise SystemExit(f"unknown variable {term!r} in {expr!r}")
    return total


def _flags(train: dict[str, Any]) -> list[str]:
    options = []
    for key, value in train.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            options.append(flag)
        elif value is not False:
            options += [flag, str(value)]
    return options


def _config(path: str, train: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stage's training settings: its config YAML with its ``train`` flags on top."""
    values = yaml.safe_load((ROOT / path).read_text(encoding="utf-8")) or {}
    values.update({k.replace("-", "_"): v for k, v in (train or {}).items()})
    return values


def tokens_per_update(path: str, train: dict[str, Any] | None = None) -> int:
    """``max_tokens * update_freq`` of a stage (its batch budget in tokens)."""
    values = _config(path, train)
    if "max_tokens" not in values:
        raise SystemExit(f"{path}: no max_tokens (needed for a fine-tuning budget)")
    return int(values["max_tokens"]) * int(values.get("update_freq", 1))


def load(path: str) -> tuple[dict[str, Any], list[Stage]]:
    """The experiment file and its stages, one per (stage, seed), in file order.

    Raises:
        SystemExit: unknown keys, an ``init_from`` that is not an earlier stage, a fine-tuning
            budget whose ``batch_ratio`` disagrees with the configs, a bad plateau window.
    """
    spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    variables = spec.get("vars", {})
    for name, recipe in (spec.get("datasets") or {}).items():
        if sorted(recipe) not in (["distill"], ["retokenize"]):
            raise SystemExit(f"{path}: dataset {name!r}: give one of distill, retokenize")
        if "distill" in recipe and len({"teacher", "model"} & set(recipe["distill"])) != 1:
            raise SystemExit(
                f"{path}: dataset {name!r}: distill needs one of teacher (a stage) or model (a "
                "model directory in the checkout)"
            )
    items = {item["name"]: item for item in spec["stages"]}
    stages: list[Stage] = []
    for item in spec["stages"]:
        where = f"{path}: stage {item['name']!r}"
        unknown = sorted(set(item) - STAGE_KEYS)
        if unknown:
            raise SystemExit(f"{where}: unknown key(s) {', '.join(unknown)}")
        init = item.get("init_from", "")
        init_name = init["stage"] if isinstance(init, dict) else init
        init_seed = init.get("seed") if isinstance(init, dict) else None
        if init_name and init_name not in {s.name for s in stages}:
            raise SystemExit(f"{where}: init_from {init_name!r} is not an earlier stage")
        plateau = None
        if "until" in item:
            p = item["until"]["plateau"]
            plateau = Plateau(int(p["min_updates"]), Fraction(str(p["window"])), float(p["gain"]))
            if not 0 < plateau.window < 1:
                raise SystemExit(f"{where}: plateau window must be in (0, 1), got {p['window']}")
        budget, max_updates = None, item["max_updates"]
        if isinstance(max_updates, dict):
            if not init_name or "until" not in items[init_name]:
                raise SystemExit(f"{where}: a token-share budget needs init_from a plateau stage")
            budget = Budget(
                float(max_updates["share_of_pretrain_tokens"]), float(max_updates["batch_ratio"])
            )
            ratio = tokens_per_update(item["config"], item.get("train")) / tokens_per_update(
                items[init_name]["config"], items[init_name].get("train")
            )
            if not math.isclose(ratio, budget.batch_ratio):
                raise SystemExit(
                    f"{where}: batch_ratio {budget.batch_ratio:g} but the configs' tokens per "
                    f"update (max_tokens * update_freq) are in ratio {ratio:g}"
                )
            max_updates = 0
        for seed in item.get("seeds", spec.get("seeds", [1])):
            stages.append(
                Stage(
                    name=item["name"],
                    config=item["config"],
                    seed=int(seed),
                    max_updates=evaluate_int(max_updates, variables),
                    budget=budget,
                    plateau=plateau,
                    init_from=init_name,
                    init_seed=int(seed if init_seed is None else init_seed),
                    average=int(item.get("average", 5)),
                    train=tuple((item.get("train") or {}).items()),
                    data=str(item.get("data", spec.get("data", ""))),
                    prepare=tuple(map(str, item.get("prepare", spec.get("prepare", [])))),
                    warmup_share=float(item.get("warmup_share", 0)),
                    validations=int(item.get("validations", 0)),
                    optional=bool(item.get("optional", False)),
                )
            )
    return spec, stages


def paths_of(args: argparse.Namespace, spec: dict[str, Any]) -> Paths:
    runs = Path(args.root) if getattr(args, "root", None) else ROOT / "runs" / "experiments"
    data = Path(args.data_root) if getattr(args, "data_root", None) else ROOT / "data"
    return Paths(runs / spec["name"], data)


def fadat(*args: str) -> int:
    cmd = [sys.executable, "-m", "fadat.cli", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


# ---- logs of a run


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines log ([] when absent); a half-written last line (a run killed
    while writing) is skipped."""
    if not path.exists():
        return []
    records = []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for k, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if k != len(lines) - 1:
                raise SystemExit(f"{path}:{k + 1}: not JSON") from None
    return records


def progress(run_dir: Path) -> tuple[int, float]:
    """(updates, training seconds) of a run from its train log (0, 0 when it has none)."""
    records = read_jsonl(run_dir / "train_log.jsonl")
    if not records:
        return 0, 0.0
    return int(records[-1].get("update", 0)), float(records[-1].get("elapsed", 0.0))


def valid_curve(run_dir: Path) -> list[dict[str, Any]]:
    """The run's validations ``{update, elapsed (s), valid_loss, bleu}`` by update."""
    return sorted(read_jsonl(run_dir / "valid_log.jsonl"), key=lambda r: r["update"])


# ---- the plateau criterion and the fine-tuning budget


def best_up_to(curve: list[dict[str, Any]], update: Fraction | int) -> float:
    """Best valid BLEU of the validations at updates <= ``update`` (-inf when none)."""
    return max((r["bleu"] for r in curve if r["update"] <= update), default=-math.inf)


def plateau_gain(curve: list[dict[str, Any]], update: int, window: Fraction) -> float:
    """b(N) - b((1 - window) * N) at N = ``update``: the criterion's value (inf when no
    validation lies at or before (1 - window) * N)."""
    earlier = best_up_to(curve, (1 - window) * update)
    return math.inf if earlier == -math.inf else best_up_to(curve, update) - earlier


def plateau_update(curve: list[dict[str, Any]], plateau: Plateau) -> int | None:
    """The first validated update N >= min_updates with b(N) - b((1 - window) N) < gain."""
    for record in curve:
        n = int(record["update"])
        if n >= plateau.min_updates and plateau_gain(curve, n, plateau.window) < plateau.gain:
            return n
    return None


def stage_end(stage: Stage, run_dir: Path) -> tuple[int | None, str]:
    """Where a plateau stage ended: (N, how) with N the plateau update, or its last update when
    it reached max_updates without a plateau; (None, "") while it trains."""
    assert stage.plateau is not None
    n = plateau_update(valid_curve(run_dir), stage.plateau)
    if n is not None:
        return n, "plateau"
    updates, _ = progress(run_dir)
    if updates >= stage.max_updates:
        return updates, "max_updates (no plateau)"
    return None, ""


def fine_tune_budget(n: int, budget: Budget) -> tuple[int, str]:
    """``round(N * share / batch_ratio)`` updates and the arithmetic as text."""
    updates = round(n * budget.share / budget.batch_ratio)
    text = (
        f"{n} × {budget.share:g} / {budget.batch_ratio:g} = "
        f"{n * budget.share / budget.batch_ratio:.1f} → {updates} updates"
    )
    return updates, text


def resolve(
    stage: Stage, stages: list[Stage], paths: Paths
) -> tuple[int | None, dict[str, int], str]:
    """A stage's update budget, its derived fresh-start settings (``warmup``,
    ``validate_every``) and how they were reached; (None, {}, why) while the budget waits for
    the init_from stage's plateau."""
    if stage.budget is None:
        max_updates, text = stage.max_updates, ""
    else:
        parent = next(s for s in stages if s.key == stage.init_key)
        n, how = stage_end(parent, paths.runs / parent.key)
        if n is None:
            return None, {}, f"waits for the plateau of {parent.key}"
        max_updates, text = fine_tune_budget(n, stage.budget)
        text = f"{parent.key} {how} at N = {n}: {text}"
    derived = {}
    if stage.warmup_share:
        derived["warmup"] = round(stage.warmup_share * max_updates)
        text += f"; warm-up {stage.warmup_share:g} × {max_updates} = {derived['warmup']}"
    if stage.validations:
        derived["validate_every"] = max(1, max_updates // stage.validations)
        text += f"; validate every {derived['validate_every']}"
    return max_updates, derived, text.lstrip("; ")


# ---- run


def train_until_plateau(cmd: list[str], run_dir: Path, plateau: Plateau) -> int:
    """Run ``cmd`` (fadat train); SIGINT it once the run's valid log meets the criterion (fadat
    train then saves checkpoint_last and exits 130). Returns its exit status, 0 when stopped."""
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    while True:
        try:
            return proc.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        if plateau_update(valid_curve(run_dir), plateau) is not None:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            return 0


def checkpoints_to_average(run_dir: Path, k: int, last_update: int) -> list[Path]:
    """The ``k`` best checkpoints (``best.json``, by valid BLEU, earlier first on ties) validated
    at updates <= ``last_update`` that are on disk."""
    if not (run_dir / "best.json").exists():
        raise SystemExit(f"{run_dir}: no best.json (no validated checkpoints to average)")
    index = json.loads((run_dir / "best.json").read_text(encoding="utf-8"))
    entries = sorted(index["checkpoints"], key=lambda b: (-b["bleu"], b["update"]))
    files = [run_dir / e["file"] for e in entries if e["update"] <= last_update]
    chosen = [f for f in files if f.is_file()][:k]
    if not chosen:
        raise SystemExit(f"{run_dir}: no checkpoint validated at update <= {last_update} is left")
    return chosen


def export_text(data: Path, out: Path) -> list[str]:
    """Write a prepared dataset's train pairs as text (ids decoded by its sentencepiece model) to
    ``out/train.{src,tgt}``; returns the ``fadat prepare`` flags for them and for the dataset's
    raw valid and test text (references untouched), so that the pairs can be prepared again with
    another vocabulary."""
    from fadat.data.binarized import BinarizedDataset
    from fadat.data.spm import decode, load_sentencepiece

    sp = load_sentencepiece(data / "spm.model")
    train = BinarizedDataset(data, "train")
    out.mkdir(parents=True, exist_ok=True)
    pairs = [train[i] for i in range(len(train))]
    for k, side in enumerate(("src", "tgt")):
        lines = "".join(decode(sp, pair[k]) + "\n" for pair in pairs)
        (out / f"train.{side}").write_text(lines, encoding="utf-8")
    flags = ["--source-file", str(out / "train.src"), "--target-file", str(out / "train.tgt")]
    raw = data / "raw"
    for split in ("valid", "test"):
        if (raw / f"{split}.src.txt").exists():
            flags += [f"--{split}-source-file", str(raw / f"{split}.src.txt"),
                      f"--{split}-target-file", str(raw / f"{split}.ref.txt")]  # fmt: skip
            k = 2
            while (raw / f"{split}.ref{k}.txt").exists():
                flags += [f"--{split}-extra-ref", str(raw / f"{split}.ref{k}.txt")]
                k += 1
    return flags


def dataset_plan(
    name: str, spec: dict[str, Any], paths: Paths
) -> tuple[list[tuple[str, str, dict[str, Any]]], list[str]]:
    """What building the dataset ``name`` takes (see :func:`make_dataset`), before building any.

    Returns:
        (chain, lacks). ``chain`` (``list[tuple[str, str, dict]]``): ``(dataset, kind,
        settings)`` for ``name`` and then for each input it derives from, while that input is
        one of the experiment's ``datasets`` and has no ``meta.json`` yet (``kind`` is
        ``"distill"`` or ``"retokenize"``, ``settings`` the recipe's mapping); built last to
        first; empty when ``name`` is built or not derived. ``lacks`` (``list[str]``): what the
        chain needs and cannot build itself, one noun phrase each: a distilling
        ``model: PATH`` that is not in the checkout, a ``teacher`` stage's averaged model that
        does not exist yet, the sentencepiece model of a retokenizing's ``spm_model_of`` dataset,
        and the dataset the chain starts from when the experiment does not derive it and it has
        no ``meta.json`` (``name`` itself when it is neither built nor derived). Both empty:
        ``name`` is ready.

    Raises:
        SystemExit: a dataset derived, through its ``data``, from itself.
    """
    datasets = spec.get("datasets") or {}
    chain: list[tuple[str, str, dict[str, Any]]] = []
    while name in datasets and not (paths.dataset(name) / "meta.json").exists():
        if name in (step for step, _, _ in chain):
            raise SystemExit(f"dataset {name!r}: derived from itself")
        kind = "distill" if "distill" in datasets[name] else "retokenize"
        chain.append((name, kind, datasets[name][kind]))
        name = datasets[name][kind]["data"]
    lacks = []
    for k, (_, kind, settings) in enumerate(chain):
        if kind == "distill":
            teacher = _distilling_model(settings, paths)
            if not (teacher / "config.json").exists():
                lacks.append(f"the teacher {teacher}")
                if "model" in settings:
                    lacks[-1] += " (missing from this checkout: not committed yet)"
        elif settings["spm_model_of"] not in (step for step, _, _ in chain[k + 1 :]):
            spm_model = paths.dataset(settings["spm_model_of"]) / "spm.model"
            if not spm_model.exists():
                lacks.append(f"{spm_model} (the vocabulary of {settings['spm_model_of']})")
    first = paths.dataset(name)
    if not (first / "meta.json").exists():
        lacks.append(f"the dataset {first} (no meta.json)")
    return chain, lacks


def _distilling_model(settings: dict[str, Any], paths: Paths) -> Path:
    """The AT model directory of a ``distill`` recipe: ``ROOT / model``, or the averaged model
    of the ``teacher`` stage's ``seed`` (default 1)."""
    if "model" in settings:
        return ROOT / settings["model"]
    return paths.model(f"{settings['teacher']}-s{settings.get('seed', 1)}")


def make_dataset(name: str, spec: dict[str, Any], paths: Paths, threads: int) -> str:
    """Build the derived dataset ``name`` of the experiment's ``datasets`` and the derived inputs
    it lacks, once everything else they need exists (:func:`dataset_plan`: checked before any
    is built, so that a missing sentencepiece model of a retokenizing is not found only after
    the distillation before it).

    Returns:
        (str) ``""`` when the dataset is ready (built now or before), else ``"waits for "`` and
        what it lacks (:func:`dataset_plan`'s phrases, ``"; "``-joined), nothing built.

    ``distill: {teacher: STAGE, seed: S, data: DATASET, beam: 5}``: ``fadat distill`` by the
    stage's averaged AT model (resumable after a kill; not cut into slices); with
    ``model: PATH`` instead of ``teacher``/``seed``, by that AT model directory of the checkout
    (a released model, e.g. ``models/bible-en-es-at-cpu-small``: the dataset then rebuilds from a
    clone without training the teacher).
    ``retokenize: {data: DATASET, spm_model_of: DATASET}``: the first dataset's pairs prepared
    again with the second's sentencepiece model (a 4k DAT on data distilled by an 8k AT), with
    the first's licence and attribution; its test references must come out identical.

    Raises:
        SystemExit: a ``fadat distill`` or ``fadat prepare`` failed; a retokenized dataset's
            references differ from its source's.
    """
    chain, lacks = dataset_plan(name, spec, paths)
    if lacks:
        return "waits for " + "; ".join(lacks)
    for step, kind, settings in reversed(chain):
        out, source = paths.dataset(step), paths.dataset(settings["data"])
        if kind == "distill":
            rc = fadat(
                "distill", "--model", str(_distilling_model(settings, paths)),
                "--data", str(source), "--output", str(out),
                "--beam", str(settings.get("beam", 5)), "--threads", str(threads),
                "--no-progress-bar",
            )  # fmt: skip
        else:
            spm_model = paths.dataset(settings["spm_model_of"]) / "spm.model"
            meta = json.loads((source / "meta.json").read_text(encoding="utf-8"))
            flags = export_text(source, out.parent / f"{step}.text")
            # the pairs' licence and attribution travel with them (else parallel text's
            # "unknown" would reach every model trained on the retokenized dataset)
            for key in ("licence", "attribution"):
                if meta.get(key):
                    flags += [f"--{key}", meta[key]]
            rc = fadat(
                "prepare", "--output", str(out), *flags, "--spm-model", str(spm_model),
                "--source-lang", meta["source_lang"], "--target-lang", meta["target_lang"],
            )  # fmt: skip
            for ref in sorted((source / "raw").glob("*.ref*.txt")) if rc == 0 else []:
                if not (out / "raw" / ref.name).is_file() or (
                    (out / "raw" / ref.name).read_bytes() != ref.read_bytes()
                ):
                    raise SystemExit(f"{out / 'raw' / ref.name}: differs from {ref}")
        if rc != 0:
            raise SystemExit(f"{out}: fadat {kind} exited {rc}")
    return ""


def run(args: argparse.Namespace) -> None:
    spec, stages = load(args.experiment)
    paths = paths_of(args, spec)
    budget = parse_minutes(args.slice)
    spent = 0.0
    only = set(args.only.split(",")) if args.only else None
    waiting = []
    for stage in stages:
        if (only is not None and stage.key not in only) or (stage.optional and only is None):
            continue
        run_dir = paths.runs / stage.key
        model_dir = paths.model(stage.key)
        if (model_dir / "config.json").exists():
            continue
        init = paths.model(stage.init_key)
        if stage.init_from and not (init / "config.json").exists():
            print(f"{stage.key}: waits for {init}")
            waiting.append(stage.key)
            continue
        max_updates, derived, text = resolve(stage, stages, paths)
        if max_updates is None:
            print(f"{stage.key}: {text}")
            waiting.append(stage.key)
            continue
        end = stage_end(stage, run_dir)[0] if stage.plateau else None
        updates, elapsed = progress(run_dir)
        if end is None and updates < max_updates:
            left = budget - spent
            if left <= 0:
                print(f"slice of {args.slice} used up; run again to continue")
                return
            log = run_dir / "train_log.jsonl"
            age = time.time() - log.stat().st_mtime if log.exists() else math.inf
            if age < BUSY_SECONDS:
                raise SystemExit(
                    f"{stage.key}: {log} was written {age:.0f} s ago: another process seems to "
                    f"train {run_dir}; let it finish (or kill it and wait {BUSY_SECONDS:.0f} s)"
                )
            data = paths.dataset(stage.data)
            if stage.data in spec.get("datasets", {}):
                wait = make_dataset(stage.data, spec, paths, args.threads)
                if wait:
                    print(f"{stage.key}: {wait}")
                    waiting.append(stage.key)
                    continue
            elif not (data / "meta.json").exists():
                if fadat("prepare", *stage.prepare, "--output", str(data)) != 0:
                    raise SystemExit(f"{stage.key}: fadat prepare failed")
            limit = ["--max-updates", str(max_updates), "--max-time", f"{elapsed + left:.0f}"]
            common = ["--threads", str(args.threads), "--no-progress-bar", *limit]
            if (run_dir / "checkpoint_last.pt").exists():
                reset = []
                if is_compact(run_dir):
                    # A run directory restored from a compact copy (fadat snapshot): it
                    # continues only with fresh AdamW moments, on this experiment's dataset
                    # (checked by the digest the copy records).
                    print(
                        f"{stage.key}: {run_dir} holds a compact copy (fadat snapshot): "
                        f"continued with --reset-optimizer on {data}"
                    )
                    reset = ["--reset-optimizer", "--data", str(data)]
                cmd = ["train", "--resume", str(run_dir), *reset, *common]
            else:
                cmd = [
                    "train", "--config", str(ROOT / stage.config), "--data", str(data),
                    "--run-dir", str(run_dir), "--seed", str(stage.seed),
                    *(["--init-from", str(init)] if stage.init_from else []),
                    *stage.options, *_flags(derived), *common,
                ]  # fmt: skip
            if text:
                print(f"{stage.key}: {text}")
            if stage.plateau:
                full = [sys.executable, "-m", "fadat.cli", *cmd]
                rc = train_until_plateau(full, run_dir, stage.plateau)
            else:
                rc = fadat(*cmd)
            if rc != 0:
                raise SystemExit(f"{stage.key}: fadat train exited {rc}")
            new_updates, new_elapsed = progress(run_dir)
            spent += new_elapsed - elapsed
            end = stage_end(stage, run_dir)[0] if stage.plateau else None
            if end is None and new_updates < max_updates:
                print(f"{stage.key}: {new_updates}/{max_updates} updates; run again")
                return
        if stage.plateau:
            assert end is not None  # trained to its plateau or to max_updates
            files = checkpoints_to_average(run_dir, stage.average, end)
            source = ["--checkpoints", *map(str, files)]
        else:
            source = ["--run", str(run_dir), "--best", str(stage.average)]
        model_dir.parent.mkdir(parents=True, exist_ok=True)
        if fadat("average", *source, "--output", str(model_dir)) != 0:
            raise SystemExit(f"{stage.key}: fadat average failed")
    print(f"waiting: {', '.join(waiting)}" if waiting else "all stages finished")


def is_compact(run_dir: Path) -> bool:
    """Whether ``run_dir``'s checkpoint_last is a compact copy's (``fadat snapshot``: no
    optimizer state); ``False`` for one that cannot be read (``fadat train`` then says why)."""
    from fadat.errors import InputError
    from fadat.training.checkpoints import is_light, load_checkpoint

    try:
        return is_light(load_checkpoint(run_dir / "checkpoint_last.pt"))
    except InputError:
        return False


def parse_minutes(text: str) -> float:
    """Seconds of a duration ``90s``, ``30m``, ``2.5h`` or plain seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?)([smh]?)", text)
    if not m:
        raise SystemExit(f"bad duration {text!r} (e.g. 90m, 2h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# ---- adopt / link


def find_stage(args: argparse.Namespace) -> tuple[dict[str, Any], list[Stage], Stage, Paths]:
    spec, stages = load(args.experiment)
    matches = [s for s in stages if s.name == args.stage and s.seed == args.seed]
    if not matches:
        raise SystemExit(f"{args.experiment}: no stage {args.stage!r} for seed {args.seed}")
    return spec, stages, matches[0], paths_of(args, spec)


def check_run_config(
    run_dir: Path, stage: Stage, stages: list[Stage], paths: Paths, resumed: bool = False
) -> None:
    """Fail unless the run's ``config.yaml`` has the stage's config values, ``train`` flags,
    seed, update cap and (when it names one) dataset: otherwise the arms are not comparable.
    Settings in :data:`UNCHECKED_KEYS` (validation, saving, threads, time cap) may differ.
    ``resumed``: the run will be resumed to the stage's cap (:func:`link`), so a lower cap is
    fine as long as the run has not trained past the stage's."""
    run_config = run_dir / "config.yaml"
    if not run_config.exists():
        raise SystemExit(f"{run_config}: no training config to check the stage against")
    trained = yaml.safe_load(run_config.read_text(encoding="utf-8"))
    max_updates, derived, _ = resolve(stage, stages, paths)
    if max_updates is None:
        raise SystemExit(f"{stage.key}: its budget is not known yet (init_from has no plateau)")
    wanted = _config(stage.config, dict(stage.train))
    wanted.update(derived, seed=stage.seed, max_updates=max_updates)
    if resumed and isinstance(trained.get("max_updates"), int):
        done, _ = progress(run_dir)
        if trained["max_updates"] <= max_updates and done <= max_updates:
            trained = {**trained, "max_updates": max_updates}
    diff = {
        k: (trained.get(k), v)
        for k, v in wanted.items()
        if k not in UNCHECKED_KEYS and trained.get(k) != v
    }
    if diff:
        raise SystemExit(f"{run_config}: differs from stage {stage.key}: {diff}")
    data = paths.dataset(stage.data).resolve()
    if "data" in trained and Path(trained["data"]).resolve() != data:
        raise SystemExit(f"{run_config}: trained on {trained['data']}, stage {stage.key} on {data}")


def adopt(args: argparse.Namespace) -> None:
    """Use an averaged model trained elsewhere (the main job) as STAGE's model for one seed,
    after :func:`check_run_config` on its training run."""
    _, stages, stage, paths = find_stage(args)
    source = Path(args.model).resolve()
    run_dir = Path(args.run) if args.run else source.parent / source.name.replace("-model", "")
    if not (source / "config.json").exists():
        raise SystemExit(f"{source}: not a model directory (no config.json)")
    check_run_config(run_dir, stage, stages, paths)
    target = paths.model(stage.key)
    if target.exists() or target.is_symlink():
        raise SystemExit(f"{target} exists; remove it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(source)
    print(f"{target} -> {source}")


def link(args: argparse.Namespace) -> None:
    """Use a run started by hand (``fadat train --run-dir RUN``) as STAGE's run for one seed,
    after :func:`check_run_config`; ``run`` then resumes it and averages it."""
    _, stages, stage, paths = find_stage(args)
    source = Path(args.run_dir).resolve()
    if not (source / "train_log.jsonl").exists():
        raise SystemExit(f"{source}: not a run directory of fadat train (no train_log.jsonl)")
    check_run_config(source, stage, stages, paths, resumed=True)
    target = paths.runs / stage.key
    if target.exists() or target.is_symlink():
        raise SystemExit(f"{target} exists; remove it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(source, target_is_directory=True)
    print(f"{target} -> {source}")


# ---- status


def status(args: argparse.Namespace) -> None:
    """Per stage: updates, training hours, best valid BLEU, the plateau criterion's current
    value (plateau stages) or the derived budget with its arithmetic (fine-tuning stages)."""
    spec, stages = load(args.experiment)
    paths = paths_of(args, spec)
    for stage in stages:
        run_dir = paths.runs / stage.key
        updates, elapsed = progress(run_dir)
        curve = valid_curve(run_dir)
        best = max((r["bleu"] for r in curve), default=float("nan"))
        max_updates, _, text = resolve(stage, stages, paths)
        cap = "?" if max_updates is None else str(max_updates)
        done = "averaged" if (paths.model(stage.key) / "config.json").exists() else ""
        line = (
            f"{stage.key:24} {updates:7d}/{cap:<7} updates {elapsed / 3600:6.2f} h  "
            f"best valid BLEU {best:6.2f}  {done}"
        )
        if stage.plateau and curve:
            p = stage.plateau
            gain = plateau_gain(curve, curve[-1]["update"], p.window)
            n, how = stage_end(stage, run_dir)
            line += (
                f"\n{'':24} b({curve[-1]['update']}) - b({float(1 - p.window):g}·"
                f"{curve[-1]['update']}) = {gain:.2f} (plateau: < {p.gain:g} at "
                f">= {p.min_updates} updates){f'; {how} at N = {n}' if n else ''}"
            )
        if text:
            line += f"\n{'':24} {text}"
        if stage.optional:
            line += f"\n{'':24} optional: run with --only {stage.key}"
        print(line)


# ---- evaluate and the short-word statistics


def hypotheses_file(directory: Path, system: str) -> Path:
    # Copied from fadat/evaluation/evaluate.py (evaluate, --save-hypotheses): the file of one
    # system.
    return directory / (system.replace("/", "_").replace(":", ".") + ".txt")


def drift_statistics(lines: list[str], reference: list[str] | None = None) -> dict[str, float]:
    """The short-word drift of RESULTS.md ("Why FA-DAT's chrF falls") over whitespace words.

    Returns ``{words, characters, short_share, distinct}``: word and character counts (the
    latter without newlines; both also ``*_ratio`` to ``reference`` when given), the share of
    words with 1 or 2 letters (letters: ``str.isalpha`` characters, so "y," and "á" are short,
    "3:16" and "—" are words but not short), and the number of distinct words.
    """
    words = [w for line in lines for w in line.split()]
    short = sum(1 for w in words if 1 <= sum(c.isalpha() for c in w) <= 2)
    stats = {
        "words": len(words),
        "characters": sum(len(line) for line in lines),
        "short_share": short / max(len(words), 1),
        "distinct": len(set(words)),
    }
    if reference is not None:
        ref = drift_statistics(reference)
        stats["words_ratio"] = stats["words"] / max(ref["words"], 1)
        stats["characters_ratio"] = stats["characters"] / max(ref["characters"], 1)
    return stats


def length_ratio(bleu_verbose: str) -> float:
    """BLEU's hyp_len / ref_len from sacreBLEU's verbose score string (nan when absent)."""
    m = re.search(r"ratio = ([\d.]+)", bleu_verbose)
    return float(m.group(1)) if m else float("nan")


def write_drift(report_file: Path, hyps_dir: Path, data: Path, subset: int) -> Path:
    """``drift-sSEED.json`` next to the report: reference and per-system statistics
    (:func:`drift_statistics`, BLEU's length ratio, and the repetition rate: the share of
    tokenized-BLEU words equal to the word before them, ``fadat.evaluation.scoring``'s
    ``repetition_counts``)."""
    try:
        from fadat.evaluation.scoring import load_split
    except ModuleNotFoundError:
        # PYTHONPATH names a frozen library from before the package layout (issue 33), whose
        # modules sat flat in fadat/: the runs of this session's experiments use one.
        from fadat.scoring import load_split
    try:
        from fadat.evaluation.scoring import moses_tokenize, read_languages, repetition_counts
    except ImportError:  # a frozen library from before repetition_counts: no repetition rate
        repetition_counts = None

    def repetition(lines: list[str]) -> float | None:
        """The share of words (tokenized BLEU's) equal to the word before them."""
        if repetition_counts is None:
            return None
        repeated, total = repetition_counts(moses_tokenize(lines, target_lang))
        return repeated / total if total else 0.0

    report = json.loads(report_file.read_text(encoding="utf-8"))
    target_lang = read_languages(data)[1] if repetition_counts else ""
    reference = load_split(data, report["data"]["split"], subset)[1][0]
    drift: dict[str, Any] = {"reference": drift_statistics(reference), "systems": {}}
    drift["reference"]["repetition"] = repetition(reference)
    for system in report["systems"]:
        lines = hypotheses_file(hyps_dir, system["name"]).read_text(encoding="utf-8")
        stats = drift_statistics(lines.splitlines(), reference)
        stats["length_ratio"] = length_ratio(system.get("bleu_verbose", ""))
        stats["repetition"] = repetition(lines.splitlines())
        drift["systems"][system["name"]] = stats
    out = report_file.with_name(report_file.name.replace("report-", "drift-"))
    out.write_text(json.dumps(drift, indent=1) + "\n", encoding="utf-8")
    return out


def comparisons(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``evaluate`` comparisons as (file prefix, settings): one mapping (prefix ""), or a
    list of them, each after the first with a ``name`` (prefix ``NAME-``)."""
    ev = spec.get("evaluate") or {}
    items = ev if isinstance(ev, list) else [ev]
    return [(f"{item['name']}-" if k else "", item) for k, item in enumerate(items)]


def eval_models(ev: dict[str, Any], stages: list[Stage]) -> dict[int, list[Stage]]:
    """Per seed of the comparison's ``models`` stages: those stages of that seed, then the
    ``shared`` stages (each at its first seed)."""
    seeds = sorted({s.seed for s in stages if s.name in ev["models"]})
    shared = [next(s for s in stages if s.name == name) for name in ev.get("shared", [])]
    return {
        seed: [s for name in ev["models"] for s in stages if s.name == name and s.seed == seed]
        + shared
        for seed in seeds
    }


def evaluate(args: argparse.Namespace) -> None:
    spec, stages = load(args.experiment)
    paths = paths_of(args, spec)
    for prefix, ev in comparisons(spec):
        data = paths.dataset(ev.get("data", spec.get("data", "")))
        for seed, chosen in eval_models(ev, stages).items():
            models = [paths.model(s.key) for s in chosen]
            missing = [str(m) for m in models if not (m / "config.json").exists()]
            if missing:
                print(f"{prefix}seed {seed}: missing {', '.join(missing)}")
                continue
            report = paths.runs / f"report-{prefix}s{seed}.json"
            hyps = paths.runs / f"hypotheses-{prefix}s{seed}"
            if args.force or not report.exists():
                rc = fadat(
                    "evaluate", "--model", *map(str, models), "--data", str(data),
                    "--split", "test",
                    "--strategies", ev.get("strategies", "greedy,lookahead,joint-viterbi"),
                    "--subset", str(args.subset), "--report", str(report),
                    "--save-hypotheses", str(hyps), "--threads", str(args.threads),
                    "--latency-subset", str(args.latency_subset),
                    *(["--force"] if report.exists() else []),  # a report of an older fadat
                )  # fmt: skip
                if rc != 0:
                    raise SystemExit(f"{report}: fadat evaluate exited {rc}")
            if not hyps.is_dir():
                print(f"{report}: no {hyps.name} (evaluated before this harness saved them); "
                      "`evaluate --force` for the short-word statistics")  # fmt: skip
                continue
            print(f"{prefix}seed {seed}: {write_drift(report, hyps, data, args.subset)}")


# ---- tables


def _cell(value: Any, fmt: str) -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "–" if missing else fmt.format(value)


def _percent(share: float | None) -> str:
    return _cell(None if share is None else 100 * share, "{:.2f} %")


def from_scratch_curves(stages: list[Stage], paths: Paths) -> list[tuple[Stage, list[dict]]]:
    """The validation curves of the stages trained from scratch (no ``init_from``) that have
    one, in file order."""
    series = [(s, valid_curve(paths.runs / s.key)) for s in stages if not s.init_from]
    return [(stage, curve) for stage, curve in series if curve]


def equal_updates_table(series: list[tuple[Stage, list[dict[str, Any]]]]) -> list[str]:
    """Markdown: valid BLEU of each from-scratch stage at each validated update (the paper's
    comparisons at equal updates; "–" where a stage did not validate at that update)."""
    if len(series) < 2:
        return []
    bleu = {stage.key: {r["update"]: r["bleu"] for r in curve} for stage, curve in series}
    updates = sorted({u for by_update in bleu.values() for u in by_update})
    keys = list(bleu)
    rows = [
        "\nvalid BLEU at equal updates (stages trained from scratch; each on its own data's "
        "valid set, the same raw references)\n",
        "| update | " + " | ".join(keys) + " |",
        "|---:|" + "---:|" * len(keys),
    ]
    for u in updates:
        cells = " | ".join(_cell(bleu[k].get(u), "{:.2f}") for k in keys)
        rows.append(f"| {u} | {cells} |")
    return rows


def curve_table(stage: Stage, curve: list[dict[str, Any]]) -> list[str]:
    """Markdown rows of a plateau stage's validation ``curve`` (:func:`valid_curve`): update,
    hours, valid loss, valid BLEU, best so far, the criterion's value at that update; the plateau
    update marked."""
    assert stage.plateau is not None
    n = plateau_update(curve, stage.plateau)
    w = stage.plateau.window
    rows = [
        f"\n{stage.key}: valid BLEU and loss (plateau: b(N) - b({float(1 - w):g}·N) < "
        f"{stage.plateau.gain:g} at N >= {stage.plateau.min_updates}; "
        f"{'N = ' + str(n) if n else 'not reached'})\n",
        "| update | hours | valid loss | valid BLEU | best | b(N) - b((1-w)N) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in curve:
        gain = plateau_gain(curve, r["update"], w)
        mark = " ← N" if r["update"] == n else ""
        rows.append(
            f"| {r['update']}{mark} | {r['elapsed'] / 3600:.2f} | {r['valid_loss']:.3f} | "
            f"{r['bleu']:.2f} | {best_up_to(curve, r['update']):.2f} | "
            f"{_cell(gain if math.isfinite(gain) else None, '{:.2f}')} |"
        )
    return rows


def plot_curves(series: list[tuple[Stage, list[dict[str, Any]]]], out: Path) -> None:
    """Valid BLEU and loss against updates and training hours, one line per stage, the plateau
    update of a plateau stage dashed; a PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="row")
    for stage, curve in series:
        n = plateau_update(curve, stage.plateau) if stage.plateau else None
        for col, x_of in enumerate((lambda r: r["update"], lambda r: r["elapsed"] / 3600)):
            xs = [x_of(r) for r in curve]
            axes[0][col].plot(xs, [r["bleu"] for r in curve], marker=".", label=stage.key)
            axes[1][col].plot(xs, [r["valid_loss"] for r in curve], marker=".", label=stage.key)
            if n is not None:
                x_n = x_of(next(r for r in curve if r["update"] == n))
                for row in (0, 1):
                    axes[row][col].axvline(x_n, linestyle="--", linewidth=0.8, color="grey")
    for col, label in enumerate(("updates", "training hours")):
        axes[1][col].set_xlabel(label)
    axes[0][0].set_ylabel("valid BLEU")
    axes[1][0].set_ylabel("valid loss")
    axes[0][0].legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def table(args: argparse.Namespace) -> None:
    """Per comparison (``evaluate``): its reports' tables; then the plateau curves, the valid
    BLEU of the stages trained from scratch at equal updates (and ``--plot``: their curves)."""
    spec, stages = load(args.experiment)
    paths = paths_of(args, spec)
    for prefix, ev in comparisons(spec):
        if prefix:
            print(f"\n## comparison {prefix[:-1]}")
        comparison_table(eval_models(ev, stages), prefix, paths)
    series = from_scratch_curves(stages, paths)
    for stage, curve in series:
        if stage.plateau:
            print("\n".join(curve_table(stage, curve)))
    if rows := equal_updates_table(series):
        print("\n".join(rows))
    if args.plot and series:
        plot_curves(series, Path(args.plot))
        print(f"\nplot: {args.plot}")


def comparison_table(per_seed: dict[int, list[Stage]], prefix: str, paths: Paths) -> None:
    """Per seed: every system's scores; the seeds side by side with the p-values of the paired
    bootstrap of each model against the first listed one (same strategy); training time per arm;
    the short-word statistics."""
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    seeds, first = [], ""
    drift_rows: list[str] = []
    for seed, chosen in per_seed.items():
        report_file = paths.runs / f"report-{prefix}s{seed}.json"
        if not report_file.exists():
            continue
        seeds.append(seed)
        report = json.loads(report_file.read_text(encoding="utf-8"))
        # model labels are directory names; name the rows by stage instead (same order)
        labels = [m["label"] for m in report["models"]]
        stage_of = dict(zip(labels, [s.name for s in chosen], strict=True))
        first = stage_of[labels[0]]
        print(f"\n{report_file.name}: {report['data'].get('sentences', '?')} test sentences\n")
        print("| system | tok BLEU | sacreBLEU | chrF | latency ms | speed-up | sent/s | tput × |")
        print("|---|---|---|---|---|---|---|---|")
        for system in report["systems"]:
            stage_name = stage_of.get(system["model"], system["model"])
            label = system["name"].replace(system["model"], stage_name, 1)
            print(
                f"| {label} | {system['tok_bleu']:.2f} | {system['bleu']:.2f} | "
                f"{system['chrf']:.1f} | {system.get('latency_ms_median', float('nan')):.1f} | "
                f"{system.get('speedup_latency', float('nan')):.2f}× | "
                f"{system['throughput']:.1f} | "
                f"{system.get('speedup_throughput', float('nan')):.2f}× |"
            )
            rows.setdefault(label, {})[seed] = dict(system, p_first=None)
            for key, value in system.get("p_value_tok_bleu", {}).items():
                if stage_of.get(key.split(":")[0]) == first and stage_name != first:
                    rows[label][seed]["p_first"] = value
        drift_file = paths.runs / f"drift-{prefix}s{seed}.json"
        if drift_file.exists():
            drift = json.loads(drift_file.read_text(encoding="utf-8"))
            ref = drift["reference"]
            drift_rows += [
                f"\nseed {seed}: short-word drift (whitespace words of the whole output)\n",
                "| system | words | words / ref | characters / ref | words of ≤ 2 letters | "
                "distinct words | BLEU length ratio | repeated words (tokenized) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|",
                f"| reference | {ref['words']:,} | 1.00 | 1.00 | {100 * ref['short_share']:.1f} % "
                f"| {ref['distinct']:,} | – | {_percent(ref.get('repetition'))} |",
            ]
            for name, st in drift["systems"].items():
                model = name.split(":")[0]
                label = name.replace(model, stage_of.get(model, model), 1)
                drift_rows.append(
                    f"| {label} | {st['words']:,} | {st['words_ratio']:.2f} | "
                    f"{st['characters_ratio']:.2f} | {100 * st['short_share']:.1f} % | "
                    f"{st['distinct']:,} | {_cell(st['length_ratio'], '{:.2f}')} | "
                    f"{_percent(st.get('repetition'))} |"
                )
    if rows:
        print(f"\nseeds side by side (p: paired bootstrap of tokenized BLEU against {first})\n")
        head = ["system"]
        for key in ("tok BLEU", "sacreBLEU", "chrF", "p"):
            head += [f"{key} s{s}" for s in seeds]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        formats = (("tok_bleu", "{:.2f}"), ("bleu", "{:.2f}"), ("chrf", "{:.1f}"))
        for label, by_seed in rows.items():
            cells = [label]
            for key, fmt in (*formats, ("p_first", "{:.4f}")):
                cells += [_cell(by_seed.get(seed, {}).get(key), fmt) for seed in seeds]
            print("| " + " | ".join(cells) + " |")
        print("\ntraining time per arm (train logs; hours of training incl. validation)\n")
        print("| stage | updates | hours | s / update |")
        print("|---|---:|---:|---:|")
        for stage in dict.fromkeys(s for seed in seeds for s in per_seed[seed]):
            updates, elapsed = progress(paths.runs / stage.key)
            print(
                f"| {stage.key} | {updates} | {elapsed / 3600:.2f} | "
                f"{_cell(elapsed / updates if updates else None, '{:.2f}')} |"
            )
        print("\n".join(drift_rows))
    else:
        print("no reports yet: run `evaluate` first")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("experiment")
    common.add_argument("--root", help="runs in ROOT/NAME/STAGE-sSEED (runs/experiments)")
    common.add_argument("--data-root", help="relative dataset directories (data/)")
    p = sub.add_parser("adopt", parents=[common], help="a model trained elsewhere as a stage's")
    p.add_argument("stage")
    p.add_argument("model", help="averaged model directory")
    p.add_argument("--run", help="its training run directory (default: MODEL without -model)")
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("link", parents=[common], help="a run started by hand as a stage's run")
    p.add_argument("stage")
    p.add_argument("run_dir", help="run directory of fadat train")
    p.add_argument("--seed", type=int, default=1)
    for name in ("run", "status", "evaluate", "table"):
        p = sub.add_parser(name, parents=[common])
        if name == "run":
            p.add_argument("--slice", default="60m", help="training time of this call (60m)")
            p.add_argument("--threads", type=int, default=2)
            p.add_argument(
                "--only", default="", help="comma-separated stage keys, e.g. pretrain-s2"
            )
        if name == "evaluate":
            p.add_argument("--subset", type=int, default=0, help="first N test sentences")
            p.add_argument("--threads", type=int, default=2)
            p.add_argument(
                "--latency-subset", type=int, default=200, help="batch-1 latency sentences (200)"
            )
            p.add_argument("--force", action="store_true", help="evaluate again over a report")
        if name == "table":
            p.add_argument("--plot", help="PNG of the plateau curves")
    args = parser.parse_args(argv)
    commands = {
        "run": run, "status": status, "evaluate": evaluate, "table": table, "adopt": adopt,
        "link": link,
    }  # fmt: skip
    commands[args.command](args)


if __name__ == "__main__":
    main()
