"""The Python side of scripts/gpu/job-at.sh: the AT's plateau run continued on a lent GPU.

The plateau criterion and the choice of checkpoints are recipes/experiment.py's own
(:func:`plateau_update`, :func:`checkpoints_to_average`, :func:`train_until_plateau`), with the
settings of the ``at`` stage of recipes/experiments/bible-en-es-plateau.yaml read by its
:func:`load`: with b(u) the best valid BLEU of the validations at updates <= u, the plateau
update N is the first validated N >= 10,000 with b(N) - b(0.7 N) < 0.3; the model averages the
5 best checkpoints validated at <= N. Nothing here restates those numbers.

- ``stage``: the stage's settings as bash assignments (MIN_UPDATES, WINDOW, GAIN, AVERAGE,
  MAX_UPDATES, CONFIG).
- ``status RUN [--shell]``: where the run stands: its last update and training seconds (from
  train_log.jsonl), its validations, best valid BLEU, the plateau update N if the criterion
  holds, the data directory of its config.yaml.
- ``train RUN -- CMD...``: run CMD (``fadat train --resume RUN ...``) and stop it with SIGINT
  once the criterion holds (the trainer saves checkpoint_last and exits); 0 when so stopped.
- ``choose RUN``: the checkpoints to average: a line ``END HOW: ...`` (the update they are
  validated at or before; HOW ``plateau`` or ``last update``), then one path a line: the
  min(AVERAGE, on disk) best validated at <= N, or at <= the last update when the criterion
  does not hold. Exit 1 when there are none (a continued compact copy keeps no best
  checkpoints from before it).
- ``restore-config COPY ORIGINAL``: put ORIGINAL's ``device``, ``max_time`` and ``threads``
  (keys a resumed run may change) back into COPY/config.yaml, so that the copy continues on
  the CPU as the run did before the GPU.
- ``manifest OUT ...``: OUT/manifest.json (the stages, where the run started and ended, the
  criterion, the model, every file's size and SHA-256) and its summary lines.

``--min-updates N`` (before the command) overrides the stage's 10,000: the dry
run's toy runs use 8. Needs PyYAML and the standard library (recipes/experiment.py's), not
fadat or torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# The sibling scripts of scripts/gpu (not a package): sweep_design.py's loader of
# recipes/experiment.py and its log readers serve this job too.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import sweep_design as sweep  # noqa: E402

EXPERIMENT = "recipes/experiments/bible-en-es-plateau.yaml"
STAGE = "at"
#: keys of the run's config.yaml that restore-config puts back (resumable keys: fadat train's
#: RESUMABLE_KEYS)
RESTORED_KEYS = ("device", "max_time", "threads")


def at_stage(experiment: str = EXPERIMENT, min_updates: int | None = None) -> Any:
    """The ``at`` stage of the experiment file (recipes/experiment.py's ``Stage``), its
    plateau's ``min_updates`` replaced when given."""
    _, stages = sweep.experiment_module().load(str(ROOT / experiment))
    stage = next((s for s in stages if s.name == STAGE), None)
    if stage is None or stage.plateau is None:
        raise SystemExit(f"{experiment}: no plateau stage {STAGE!r}")
    if min_updates is not None:
        stage = dataclasses.replace(
            stage, plateau=dataclasses.replace(stage.plateau, min_updates=min_updates)
        )
    return stage


def criterion(curve: list[dict[str, Any]], plateau: Any) -> dict[str, Any]:
    """The criterion on a valid curve (``{update, bleu}`` records by update): ``held``, the
    plateau update ``n`` (None when it does not hold), the ``gain`` b(N) - b(0.7 N) at N, or at
    the last validation when it does not hold (None where no validation lies that early), the
    best BLEU and its update (the earlier of equal ones) and the last validated update."""
    exp = sweep.experiment_module()
    n = exp.plateau_update(curve, plateau)
    at = n if n is not None else (int(curve[-1]["update"]) if curve else None)
    gain = exp.plateau_gain(curve, at, plateau.window) if at is not None else math.inf
    best = max(curve, key=lambda r: (r["bleu"], -r["update"])) if curve else None
    return {
        "held": n is not None,
        "n": n,
        "gain": None if math.isinf(gain) else round(gain, 4),
        "min_updates": plateau.min_updates,
        "window": float(plateau.window),
        "max_gain": plateau.gain,
        "best_bleu": best["bleu"] if best else None,
        "best_update": int(best["update"]) if best else None,
        "last_validated": at if n is None else int(curve[-1]["update"]),
        "validations": len(curve),
    }


def status(run: Path, stage: Any) -> dict[str, Any]:
    """Where the run stands: ``updates`` and ``elapsed`` (training seconds, resumes included)
    of its last train-log record, ``data`` (its config.yaml's), and :func:`criterion`."""
    exp = sweep.experiment_module()
    updates, elapsed = exp.progress(run)
    try:
        config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
    except OSError:
        config = {}
    return {
        "updates": updates,
        "elapsed": elapsed,
        "data": config.get("data"),
        **criterion(exp.valid_curve(run), stage.plateau),
    }


def choose(run: Path, stage: Any) -> tuple[list[Path], int, str]:
    """(the checkpoints to average, the update they are validated at or before, why that one:
    "plateau" or "last update").

    Raises:
        SystemExit: no validated checkpoint at or before that update is on disk.
    """
    s = status(run, stage)
    end, how = (s["n"], "plateau") if s["held"] else (s["updates"], "last update")
    return sweep.experiment_module().checkpoints_to_average(run, stage.average, end), end, how


def restore_config(copy: Path, original: Path) -> dict[str, Any]:
    """Put :data:`RESTORED_KEYS` of ``original`` (a config.yaml) into ``copy``/config.yaml;
    returns what changed ``{key: [was, now]}``."""
    before = yaml.safe_load(original.read_text(encoding="utf-8")) or {}
    path = copy / "config.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = {}
    for key in RESTORED_KEYS:
        if key in before and config.get(key) != before[key]:
            changed[key] = [config.get(key), before[key]]
            config[key] = before[key]
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return changed


def manifest(args: argparse.Namespace, stage: Any) -> dict[str, Any]:
    """Write OUT/manifest.json; returns it."""
    summary = sweep._module("gpu_summary", HERE / "summary.py")
    out, run, model = Path(args.out), Path(args.run), Path(args.model)
    end = status(run, stage)
    train = sweep.read_jsonl(run / "train_log.jsonl")
    new = [r for r in train if r.get("update", 0) > args.start_update]
    seconds = end["elapsed"] - args.start_elapsed if new else 0.0
    stop = None
    try:
        found = sweep.STOPPED.findall((run / "train.log").read_text(encoding="utf-8"))
        stop = found[-1][0] if found else None
    except OSError:
        pass
    meta = sweep.read_json(model / "config.json") or {}
    averaged = meta.get("training", {})
    data = sweep.read_json(Path(args.data) / "meta.json") if args.data else None
    files, warnings = summary.list_files(out)
    valid = sweep.read_jsonl(run / "valid_log.jsonl")
    result = {
        "job": "scripts/gpu/job-at.sh",
        "dry_run": args.dry_run,
        "commit": args.commit,
        "seconds": args.seconds,
        "budget_s": args.budget,
        "device": sweep.device_name(out / "job.log"),
        "experiment": args.experiment,
        "stage": STAGE,
        "data_fingerprint": (data or {}).get("fingerprint"),
        "stages": summary.read_stages(Path(args.stages)),
        "start": {"update": args.start_update, "elapsed": args.start_elapsed},
        "training": {
            "updates": end["updates"],
            "new_updates": end["updates"] - args.start_update,
            "stop_reason": stop,
            "train_s": round(seconds, 1),
            "updates_per_s": round((end["updates"] - args.start_update) / seconds, 2)
            if seconds > 0
            else None,
            "validations": [
                {"update": r["update"], "bleu": r["bleu"]}
                for r in valid
                if r["update"] > args.start_update
            ],
        },
        "plateau": {k: v for k, v in end.items() if k not in ("updates", "elapsed", "data")},
        "best_bleu": end["best_bleu"],
        "best_update": end["best_update"],
        "model": {
            "dir": model.name if meta else None,
            "up_to_update": args.average_end,
            "averaged": [
                {"checkpoint": c, "bleu": b}
                for c, b in zip(
                    averaged.get("averaged", []), averaged.get("bleu", []), strict=False
                )
            ],
        },
        "snapshot": args.snapshot_name,
        "files": files,
        "warnings": warnings,
    }
    (out / "manifest.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def render(m: dict[str, Any]) -> str:
    """The manifest as the few lines that end job.log and the device tool's reply."""
    t, p = m["training"], m["plateau"]
    lines = [f"## job-at.sh on {m['device'] or '?'} (commit {m['commit']})"]
    lines += [
        f"{s['name']}: {s['status']}, exit {s['exit']}, {s['seconds']} s" for s in m["stages"]
    ]
    lines.append(
        f"training: updates {m['start']['update']} -> {t['updates']} ({t['new_updates']} new, "
        f"{t['updates_per_s'] or '-'}/s, stopped by {t['stop_reason'] or 'a kill'}); "
        f"{len(t['validations'])} new validations: "
        + ", ".join(f"{v['update']}: {v['bleu']:.2f}" for v in t["validations"])
    )
    held = f"HELD at N = {p['n']}" if p["held"] else "not held"
    bleu = "-" if m["best_bleu"] is None else f"{m['best_bleu']:.2f}"
    lines.append(
        f"plateau (N >= {p['min_updates']}, gain over the last {p['window']:g} < "
        f"{p['max_gain']:g}): {held}, gain {p['gain']}; best valid BLEU {bleu} at update "
        f"{m['best_update']}"
    )
    a = m["model"]
    lines.append(
        f"model: {a['dir'] or 'none'}, {len(a['averaged'])} checkpoints validated at <= "
        f"{a['up_to_update']} averaged (BLEU {[round(x['bleu'], 2) for x in a['averaged']]})"
    )
    lines.append(f"snapshot: {m['snapshot'] or 'none'}")
    lines += sweep._module("gpu_summary", HERE / "summary.py").files_lines(m)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default=EXPERIMENT, help="relative to the checkout")
    parser.add_argument("--min-updates", type=int, default=None)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("stage", "status", "train", "choose", "restore-config", "manifest"):
        p = sub.add_parser(name)
        if name in ("status", "train", "choose"):
            p.add_argument("run", type=Path)
        if name == "status":
            p.add_argument("--shell", action="store_true")
        if name == "restore-config":
            p.add_argument("copy", type=Path)
            p.add_argument("original", type=Path)
        if name == "manifest":
            p.add_argument("out")
            p.add_argument("--stages", required=True)
            p.add_argument("--run", required=True)
            p.add_argument("--model", required=True)
            p.add_argument("--snapshot-name", default=None)
            p.add_argument("--start-update", type=int, required=True)
            p.add_argument("--start-elapsed", type=float, required=True)
            p.add_argument("--average-end", type=int, default=None)
            p.add_argument("--data", default=None)
            p.add_argument("--commit", default="unknown")
            p.add_argument("--seconds", type=int, default=None)
            p.add_argument("--budget", type=int, default=None)
            p.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if command and args.command != "train":
        parser.error("a command after -- goes with train only")
    try:
        stage = at_stage(args.experiment, args.min_updates)
        if args.command == "stage":
            values = {
                "MIN_UPDATES": stage.plateau.min_updates,
                "WINDOW": float(stage.plateau.window),
                "GAIN": stage.plateau.gain,
                "AVERAGE": stage.average,
                "MAX_UPDATES": stage.max_updates,
                "CONFIG": stage.config,
            }
            print("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()))
        elif args.command == "status":
            s = status(args.run, stage)
            if args.shell:
                values = {
                    "UPDATES": s["updates"],
                    "ELAPSED": int(math.ceil(s["elapsed"])),
                    "PLATEAU_N": s["n"] if s["held"] else "",
                    "RUN_DATA": s["data"] or "",
                    "BEST_BLEU": s["best_bleu"] if s["best_bleu"] is not None else "",
                }
                print("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()))
            else:
                print(json.dumps(s))
        elif args.command == "train":
            if not command:
                parser.error("train needs the command after --")
            return sweep.experiment_module().train_until_plateau(command, args.run, stage.plateau)
        elif args.command == "choose":
            files, end, how = choose(args.run, stage)
            print(f"{end} {how}: {len(files)} checkpoints validated at <= {end}")
            print("\n".join(map(str, files)))
        elif args.command == "restore-config":
            print(json.dumps(restore_config(args.copy, args.original)))
        else:
            print(render(manifest(args, stage)))
    except SystemExit as err:
        if isinstance(err.code, str):
            print(f"at_plateau.py: {err.code}", file=sys.stderr)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
