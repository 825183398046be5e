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

Needs PyYAML (in the device image) and the standard library; not fadat or torch.

Usage::

    python scripts/gpu/sweep_design.py designs [--experiment YAML]   # the stage names, one line
    python scripts/gpu/sweep_design.py stage DESIGN [--experiment YAML]
    python scripts/gpu/sweep_design.py toy-config DESIGN PATH [--experiment YAML]
    python scripts/gpu/sweep_design.py manifest OUT --stages FILE --design DESIGN --run RUN_DIR
        --model MODEL_DIR --max-updates N [--data DIR] [--commit HASH] [--seconds S]
        [--budget S] [--dry-run] [--experiment YAML]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
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
    for name in ("stage", "toy-config", "manifest", "designs"):
        p = sub.add_parser(name)
        p.add_argument("--experiment", default=EXPERIMENT, help="relative to the checkout")
        if name == "designs":
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
        elif args.command == "stage":
            print(shell_vars(args.design, args.experiment))
        elif args.command == "toy-config":
            toy_config(args.design, args.path, args.experiment)
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
