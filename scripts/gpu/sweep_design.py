"""The Python side of scripts/gpu/job-sweep.sh: one design of the speed sweep on a lent GPU.

- ``stage DESIGN``: the stage DESIGN of the sweep's experiment file
  (recipes/experiments/bible-en-es-speed-sweep.yaml), read by recipes/experiment.py's own
  :func:`load` so that the GPU run takes what ``experiment.py run`` would: its config, seed,
  ``max_updates``, ``average``, ``train`` flags and tokens per update (``max_tokens ×
  update_freq``, :func:`tokens_per_update`). Printed as bash assignments for ``eval``. An unknown
  design is an error listing the valid ones (exit 2).
- ``toy-config DESIGN PATH``: the design's config at toy widths for the dry run (d = 32, FFN 64,
  2 heads): its depths, λ and recipe stay, so a dry run checks that they come through.
- ``manifest OUT ...``: ``OUT/manifest.json`` from what the job left: the stages
  (scripts/gpu/summary.py's stage record), the design, the updates reached against
  ``max_updates`` (``complete``), why training stopped, the best valid BLEU, the checkpoints
  averaged, the training settings as the run resolved them, and every file in OUT with its size
  and SHA-256 (summary.py's :func:`list_files`); prints the same as a few lines of text.
- ``carry-data --data-root DIR --carry DIR`` (scripts/gpu/prepare.sh): the sweep's dataset (the
  experiment file's ``data``) copied from the data root into the carried folder, with a record
  of its training files' digest (:func:`carry_data`); built first with recipes/experiment.py's
  own ``make_dataset`` where the data root lacks it and the experiment derives it.
- ``check-data DIR --carry DIR`` (job-sweep.sh, before training): DIR is the sweep's dataset,
  its training files' digest the one that record holds (:func:`check_data`); exit 1 otherwise.

Needs PyYAML (in the device image) and the standard library; ``carry-data``, ``check-data`` and
the manifest's data digest also import fadat (:func:`fadat.data.binarized.training_digest`),
never torch.

Usage::

    python scripts/gpu/sweep_design.py designs [--experiment YAML]   # the stage names, one line
    python scripts/gpu/sweep_design.py dataset [--experiment YAML]   # the dataset they train on
    python scripts/gpu/sweep_design.py stage DESIGN [--experiment YAML]
    python scripts/gpu/sweep_design.py toy-config DESIGN PATH [--experiment YAML]
    python scripts/gpu/sweep_design.py manifest OUT --stages FILE --design DESIGN --run RUN_DIR
        --model MODEL_DIR --max-updates N [--data DIR] [--commit HASH] [--seconds S]
        [--budget S] [--dry-run] [--experiment YAML]
    python scripts/gpu/sweep_design.py carry-data --data-root DIR --carry DIR [--threads N]
        [--experiment YAML]
    python scripts/gpu/sweep_design.py check-data DIR --carry DIR [--experiment YAML]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
EXPERIMENT = "recipes/experiments/bible-en-es-speed-sweep.yaml"
#: the dry run's model widths (the tiny preset's); depths, λ and recipe stay the design's
TOY_WIDTHS = {"d_model": 32, "attention_heads": 2, "ffn_dim": 64, "link_heads": 2}
#: the run's settings the manifest copies from its config.yaml
TRAIN_KEYS = (
    "preset", "model", "upsample_ratio_range", "objective", "lr", "warmup", "glat_p",
    "max_tokens", "update_freq", "max_updates", "max_time", "validate_every", "valid_subset",
    "save_every", "keep_best", "seed", "device", "threads", "bf16", "fp16", "dag_backend", "data",
)  # fmt: skip
STOPPED = re.compile(r"stopped \((\w+)\) after (\d+) updates")


def _module(name: str, path: Path) -> ModuleType:
    """A script loaded from its file (registered in sys.modules: dataclasses look it up)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def experiment_module() -> ModuleType:
    """recipes/experiment.py (not a package: loaded from its file)."""
    return _module("sweep_experiment", ROOT / "recipes" / "experiment.py")


def find_design(design: str, experiment: str = EXPERIMENT) -> tuple[Any, int, list[str]]:
    """The stage ``design`` of the experiment file (its first seed) and its tokens per update.

    Returns:
        (recipes/experiment.py's ``Stage``, ``max_tokens × update_freq`` of its config with its
        ``train`` flags on top, every stage name of the file).

    Raises:
        SystemExit: (a message) no stage of that name; the message lists the stage names.
    """
    exp = experiment_module()
    _, stages = exp.load(str(ROOT / experiment))
    names = list(dict.fromkeys(s.name for s in stages))
    matches = [s for s in stages if s.name == design]
    if not matches:
        raise SystemExit(
            f"job-sweep.sh: unknown design {design!r}; the designs of {experiment} are: "
            + ", ".join(names)
        )
    stage = matches[0]
    return stage, exp.tokens_per_update(stage.config, dict(stage.train)), names


def shell_vars(design: str, experiment: str = EXPERIMENT) -> str:
    """The bash assignments job-sweep.sh evaluates: CONFIG, SEED, MAX_UPDATES, AVERAGE, TOKENS,
    DATASET (the sweep's dataset name), OPTIONS (an array: the stage's ``train`` flags as
    experiment.py passes them) and DESIGNS (every stage name)."""
    stage, tokens, names = find_design(design, experiment)
    values = {
        "CONFIG": stage.config,
        "SEED": stage.seed,
        "MAX_UPDATES": stage.max_updates,
        "AVERAGE": stage.average,
        "TOKENS": tokens,
        "DATASET": stage.data,
        "DESIGNS": " ".join(names),
    }
    lines = [f"{k}={shlex.quote(str(v))}" for k, v in values.items()]
    lines.append("OPTIONS=(" + " ".join(shlex.quote(o) for o in stage.options) + ")")
    return "\n".join(lines)


def toy_config(design: str, path: Path, experiment: str = EXPERIMENT) -> dict[str, Any]:
    """Write the design's config with :data:`TOY_WIDTHS` in its ``model`` block to ``path``;
    returns the config written."""
    stage, _, _ = find_design(design, experiment)
    config = yaml.safe_load((ROOT / stage.config).read_text(encoding="utf-8")) or {}
    config["model"] = {**(config.get("model") or {}), **TOY_WIDTHS}
    path.write_text(
        f"# {stage.config} at toy widths: the dry run of scripts/gpu/job-sweep.sh\n"
        + yaml.safe_dump(config, sort_keys=False),
        encoding="utf-8",
    )
    return config


# ---- the sweep's dataset on the device: carried by prepare.sh, checked by job-sweep.sh


def sweep_dataset(experiment: str = EXPERIMENT) -> tuple[Any, dict[str, Any], str]:
    """recipes/experiment.py's module, the experiment file and the one dataset its stages train
    on (the file's ``data`` unless a stage names its own).

    Raises:
        SystemExit: (a message) the stages train on more than one dataset.
    """
    exp = experiment_module()
    spec, stages = exp.load(str(ROOT / experiment))
    names = sorted({s.data for s in stages})
    if len(names) != 1:
        raise SystemExit(f"{experiment}: its stages train on {names}, not on one dataset")
    return exp, spec, names[0]


def record_path(carry: Path, dataset: str) -> Path:
    """Where carry_data records the digest of the carried ``dataset``: ``CARRY/DATASET.json``,
    beside the copy (not in it: a dataset directory holds only what fadat wrote)."""
    return carry / f"{dataset}.json"


def _remove_copy(carry: Path, dataset: str) -> None:
    """A copy of ``dataset`` that an earlier run carried, and its record: stale once the data
    root has no such dataset (a copy job-sweep.sh would otherwise accept)."""
    shutil.rmtree(carry / dataset, ignore_errors=True)
    record_path(carry, dataset).unlink(missing_ok=True)


def carry_data(
    data_root: Path, carry: Path, experiment: str = EXPERIMENT, threads: int = 1
) -> tuple[int, str]:
    """``CARRY/DATASET``: the sweep's dataset copied from ``DATA_ROOT/DATASET`` (the directory the
    CPU sweep trains on, ``experiment.py --data-root``), and ``CARRY/DATASET.json`` recording the
    copy's :func:`fadat.data.binarized.training_digest` (checked equal to the source's), the
    dataset's name and where it came from; job-sweep.sh trains on nothing else.

    Where the data root lacks the dataset: a dataset the experiment derives (its ``datasets``)
    is built there first by recipes/experiment.py's own ``make_dataset`` (``fadat distill`` of
    the 8k training set by the committed AT: about 20 minutes on one CPU thread; then the
    retokenizing), so that the CPU sweep uses the same directory; when building it lacks
    something it cannot build (recipes/experiment.py's ``dataset_plan``: a distilling model not
    in the checkout yet, a teacher stage's model, a sentencepiece model, an input dataset),
    nothing is built or carried (a stale copy is removed) and the message says why. Another
    dataset is not built here.

    Returns:
        (0, what was done) when carried or skipped; (1, why) when the copy's digest differs from
        the source's.

    Raises:
        SystemExit: (a message) as ``make_dataset`` (a failed ``fadat distill`` or ``prepare``).
    """
    from fadat.data.binarized import training_digest

    exp, spec, name = sweep_dataset(experiment)
    source, dest, record = data_root / name, carry / name, record_path(carry, name)
    lines = []
    if not (source / "meta.json").is_file():
        paths = exp.paths_of(argparse.Namespace(root=None, data_root=str(data_root)), spec)
        chain, absent = exp.dataset_plan(name, spec, paths)
        if not chain:
            _remove_copy(carry, name)
            return 0, (
                f"sweep data: {source} has no meta.json and {experiment} does not derive "
                f"{name}: prepare it as the CPU sweep does, then run prepare.sh again; "
                f"job-sweep.sh cannot run without it"
            )
        if absent:
            _remove_copy(carry, name)
            return 0, (
                f"sweep data: the sweep's dataset {name} cannot be built yet: it needs "
                f"{'; '.join(absent)}; skipped (job-sweep.sh refuses to train until prepare.sh "
                f"carries {name})"
            )
        steps = []
        for step, kind, s in reversed(chain):
            if kind == "distill":
                teacher = s.get("model") or f"the stage {s['teacher']}'s model"
                steps.append(
                    f"{step} = `fadat distill` of {s['data']} by {teacher} (beam "
                    f"{s.get('beam', 5)}), about 20 minutes on one CPU thread"
                )
            else:
                steps.append(f"{step} = {s['data']} with {s['spm_model_of']}'s sentencepiece model")
        print(
            f"sweep data: building {source} (recipes/experiment.py's make_dataset, {threads} "
            f"thread(s)): " + "; then ".join(steps),
            flush=True,
        )
        wait = exp.make_dataset(name, spec, paths, threads)
        if wait:
            _remove_copy(carry, name)
            return 0, f"sweep data: the sweep's dataset {name} cannot be built yet: it {wait}"
        lines.append(f"sweep data: built {source}")
    expected = training_digest(source)
    carry.mkdir(parents=True, exist_ok=True)
    partial = carry / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    copied = training_digest(partial)
    if copied != expected:
        shutil.rmtree(partial, ignore_errors=True)
        return 1, f"sweep data: the copy of {source} differs from it ({copied} != {expected})"
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    entry = {"dataset": name, "training_digest": expected, "source": str(source)}
    record.write_text(json.dumps({**entry, "experiment": experiment}, indent=1) + "\n")
    lines.append(
        f"sweep data: {dest} = {source} (the sweep's {name}; training files' sha256 "
        f"{expected[:12]}…, recorded in {record})"
    )
    return 0, "\n".join(lines)


def check_data(data: Path, carry: Path, experiment: str = EXPERIMENT) -> tuple[bool, str]:
    """Whether ``data`` is the sweep's dataset: its :func:`fadat.data.binarized.training_digest`
    equals the one :func:`carry_data` recorded in ``CARRY/DATASET.json`` for the experiment's
    dataset (the same spm.model, training and valid arrays and valid references: not merely
    data in the same vocabulary).

    Returns:
        (ok, the line to log: what was found, or why job-sweep.sh must not train on ``data``).
    """
    from fadat.data.binarized import training_digest
    from fadat.errors import InputError

    _, _, name = sweep_dataset(experiment)
    record = record_path(carry, name)
    refuse = f"job-sweep.sh: not training: the sweep's dataset is {name} ({experiment})"
    saved = read_json(record)
    if not isinstance(saved, dict) or saved.get("dataset") != name:
        what = "missing" if saved is None else "not a record of it"
        return False, (
            f"{refuse}, and {record}, the digest that scripts/gpu/prepare.sh records when it "
            f"carries {name}, is {what}: run prepare.sh here and carry .carry"
        )
    if not (data / "meta.json").is_file():
        return False, f"{refuse}, and {data} holds no dataset (no meta.json)"
    try:
        mine = training_digest(data)
    except InputError as err:
        return False, f"{refuse}, and {data} is not it: {err}"
    expected = saved.get("training_digest")
    if mine != expected:
        return False, (
            f"{refuse}: the training files of {data} (sha256 {mine[:12]}…) are not the "
            f"{str(expected)[:12]}… that prepare.sh recorded in {record} (from "
            f"{saved.get('source')}); a model trained on other data than the CPU runs' would "
            "not be a point of the sweep"
        )
    return True, (
        f"data: {data} is the sweep's dataset {name} (training files' sha256 {mine[:12]}…, as "
        f"prepare.sh recorded from {saved.get('source')})"
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines log; [] when missing, a cut last line skipped."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def training_summary(run: Path, model: Path, max_updates: int) -> dict[str, Any]:
    """What the run reached: ``updates`` (the last logged update), ``complete`` (it reached
    ``max_updates``), ``stop_reason`` (from train.log: max_updates, max_time, ...; None when the
    trainer was killed), ``train_s`` (its training seconds, validations included),
    ``target_tokens_per_s`` over the run, ``validations``, ``best_bleu`` (valid BLEU) and its
    update, ``averaged`` (the checkpoints in the model and their BLEU; [] without a model) and
    ``settings`` (TRAIN_KEYS of the run's config.yaml)."""
    train = read_jsonl(run / "train_log.jsonl")
    valid = read_jsonl(run / "valid_log.jsonl")
    updates = int(train[-1]["update"]) if train else 0
    train_s = float(train[-1]["elapsed"]) if train else 0.0
    tokens = sum(int(r.get("target_tokens", 0)) for r in train)
    stop = None
    try:
        found = STOPPED.findall((run / "train.log").read_text(encoding="utf-8"))
        stop = found[-1][0] if found else None
    except OSError:
        pass
    best = max(valid, key=lambda r: (r["bleu"], -r["update"])) if valid else None
    meta = read_json(model / "config.json") or {}
    averaged = meta.get("training", {})
    try:
        settings = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
    except OSError:
        settings = {}
    return {
        "updates": updates,
        "max_updates": max_updates,
        "complete": updates >= max_updates,
        "stop_reason": stop,
        "train_s": train_s,
        "target_tokens_per_s": round(tokens / train_s) if train_s else None,
        "validations": len(valid),
        "best_bleu": best["bleu"] if best else None,
        "best_update": best["update"] if best else None,
        "averaged": [
            {"checkpoint": c, "bleu": b}
            for c, b in zip(averaged.get("averaged", []), averaged.get("bleu", []), strict=False)
        ],
        "model_dir": model.name if meta else None,
        "settings": {k: settings[k] for k in TRAIN_KEYS if k in settings},
    }


def device_name(job_log: Path) -> str | None:
    """The GPU named in job.log by common.sh's ``versions`` (``device NAME N MiB, ...``)."""
    try:
        text = job_log.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"^device (.+?) \d+ MiB", text, re.M)
    return m.group(1) if m else ("cpu" if "device: no CUDA" in text else None)


def manifest(args: argparse.Namespace) -> dict[str, Any]:
    """Write OUT/manifest.json; returns it."""
    summary = _module("gpu_summary", Path(__file__).resolve().parent / "summary.py")
    out = Path(args.out)
    stage, tokens, _ = find_design(args.design, args.experiment)
    data = read_json(Path(args.data) / "meta.json") if args.data else None
    digest = None
    if data is not None:
        from fadat.data.binarized import training_digest
        from fadat.errors import InputError

        try:
            digest = training_digest(args.data)
        except InputError:
            pass
    files, warnings = summary.list_files(out)
    result = {
        "job": "scripts/gpu/job-sweep.sh",
        "dry_run": args.dry_run,
        "commit": args.commit,
        "seconds": args.seconds,
        "budget_s": args.budget,
        "device": device_name(out / "job.log"),
        "design": args.design,
        "experiment": args.experiment,
        "config": stage.config,
        "seed": stage.seed,
        "average": stage.average,
        "tokens_per_update": tokens,
        "dataset": stage.data,
        "data_fingerprint": (data or {}).get("fingerprint"),
        "data_digest": digest,
        "stages": summary.read_stages(Path(args.stages)),
        "training": training_summary(Path(args.run), Path(args.model), args.max_updates),
        "files": files,
        "warnings": warnings,
    }
    (out / "manifest.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def render(m: dict[str, Any]) -> str:
    """The manifest as the few lines that end job.log and the device tool's reply."""
    t = m["training"]
    lines = [f"## job-sweep.sh {m['design']} on {m['device'] or '?'} (commit {m['commit']})"]
    lines += [
        f"{s['name']}: {s['status']}, exit {s['exit']}, {s['seconds']} s" for s in m["stages"]
    ]
    bleu = "-" if t["best_bleu"] is None else f"{t['best_bleu']:.2f}"
    rate = t["target_tokens_per_s"]
    lines.append(
        f"training: {t['updates']} of {t['max_updates']} updates (complete: "
        f"{str(t['complete']).lower()}, stopped by {t['stop_reason'] or 'a kill'}) in "
        f"{t['train_s']:.0f} s, {rate if rate is not None else '-'} target tokens/s; "
        f"{t['validations']} validations, best valid BLEU {bleu} at update {t['best_update']}"
    )
    lines.append(
        f"model: {t['model_dir'] or 'none'}, {len(t['averaged'])} checkpoints averaged "
        f"(BLEU {[round(a['bleu'], 2) for a in t['averaged'] if a['bleu'] is not None]})"
    )
    summary = _module("gpu_summary", Path(__file__).resolve().parent / "summary.py")
    lines += summary.files_lines(m)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = ("stage", "toy-config", "manifest", "designs", "dataset", "carry-data", "check-data")
    for name in commands:
        p = sub.add_parser(name)
        p.add_argument("--experiment", default=EXPERIMENT, help="relative to the checkout")
        if name in ("designs", "dataset"):
            continue
        if name in ("carry-data", "check-data"):
            if name == "carry-data":
                p.add_argument("--data-root", type=Path, required=True)
                p.add_argument("--threads", type=int, default=1)
            else:
                p.add_argument("data", type=Path)
            p.add_argument("--carry", type=Path, required=True)
            continue
        if name == "manifest":
            p.add_argument("out")
            p.add_argument("--stages", required=True)
            p.add_argument("--design", required=True)
            p.add_argument("--run", required=True)
            p.add_argument("--model", required=True)
            p.add_argument("--max-updates", type=int, required=True)
            p.add_argument("--data", default=None)
            p.add_argument("--commit", default="unknown")
            p.add_argument("--seconds", type=int, default=None)
            p.add_argument("--budget", type=int, default=None)
            p.add_argument("--dry-run", action="store_true")
        else:
            p.add_argument("design")
        if name == "toy-config":
            p.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "designs":
            _, stages = experiment_module().load(str(ROOT / args.experiment))
            print(" ".join(dict.fromkeys(s.name for s in stages)))
        elif args.command == "dataset":
            print(sweep_dataset(args.experiment)[2])
        elif args.command == "stage":
            print(shell_vars(args.design, args.experiment))
        elif args.command == "toy-config":
            toy_config(args.design, args.path, args.experiment)
        elif args.command == "carry-data":
            rc, text = carry_data(args.data_root, args.carry, args.experiment, args.threads)
            print(text, file=sys.stderr if rc else sys.stdout)
            return rc
        elif args.command == "check-data":
            ok, text = check_data(args.data, args.carry, args.experiment)
            print(text)
            return 0 if ok else 1
        else:
            print(render(manifest(args)))
    except SystemExit as err:
        if isinstance(err.code, str):
            print(err.code, file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
