"""Paper-comparison experiments (RESULTS.md), resumable across sessions.

An experiment file (``recipes/experiments/*.yaml``) names a dataset, integer variables (N, M),
seeds and an ordered list of training stages; a stage may start from another stage's averaged
model (``init_from``) and runs once per seed. ``run`` trains the pending stages in order for at
most ``--slice`` of training time, then stops; running it again continues where it stopped
(``fadat train --resume``). A finished stage is averaged into ``STAGE-sSEED/model`` (its
``average`` best checkpoints). ``evaluate`` runs ``fadat evaluate`` per seed on the test split
(the seed's models plus the stages listed as ``shared`` from the first seed), with sacreBLEU's
paired bootstrap against the first listed model, and ``table`` prints the reports as Markdown
tables for RESULTS.md.

Usage::

    python recipes/experiment.py run recipes/experiments/bible-en-es.yaml [--slice 60m]
    python recipes/experiment.py status recipes/experiments/bible-en-es.yaml
    python recipes/experiment.py adopt EXPERIMENT STAGE MODEL_DIR [--run RUN_DIR] [--seed 1]
    python recipes/experiment.py evaluate recipes/experiments/bible-en-es.yaml [--subset N]
    python recipes/experiment.py table recipes/experiments/bible-en-es.yaml
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stage:
    name: str
    config: str
    max_updates: int
    seed: int
    init_from: str  # stage name or ""
    average: int
    options: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.name}-s{self.seed}"


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


def load(path: str) -> tuple[dict[str, Any], list[Stage]]:
    spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    variables = spec.get("vars", {})
    stages = []
    for item in spec["stages"]:
        for seed in item.get("seeds", spec.get("seeds", [1])):
            options = []
            for key, value in (item.get("train") or {}).items():
                flag = f"--{key.replace('_', '-')}"
                if value is True:
                    options.append(flag)
                elif value is not False:
                    options += [flag, str(value)]
            stages.append(
                Stage(
                    name=item["name"],
                    config=item["config"],
                    max_updates=evaluate_int(item["max_updates"], variables),
                    seed=int(seed),
                    init_from=item.get("init_from", ""),
                    average=int(item.get("average", 5)),
                    options=tuple(options),
                )
            )
    return spec, stages


def run_root(spec: dict[str, Any]) -> Path:
    return ROOT / "runs" / "experiments" / spec["name"]


def fadat(*args: str) -> int:
    cmd = [sys.executable, "-m", "fadat.cli", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def progress(run_dir: Path) -> tuple[int, float]:
    """(updates, training seconds) of a run from its train log (0, 0 when it has none)."""
    log = run_dir / "train_log.jsonl"
    if not log.exists():
        return 0, 0.0
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line]
    if not lines:
        return 0, 0.0
    last = json.loads(lines[-1])
    return int(last.get("update", 0)), float(last.get("elapsed", 0.0))


def parse_minutes(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d*)?)([smh]?)", text)
    if not m:
        raise SystemExit(f"bad duration {text!r} (e.g. 90m, 2h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def run(args: argparse.Namespace) -> None:
    spec, stages = load(args.experiment)
    data = ROOT / spec["data"]
    if not (data / "meta.json").exists():
        if fadat("prepare", *spec["prepare"], "--output", str(data)) != 0:
            raise SystemExit("prepare failed")
    root = run_root(spec)
    budget = parse_minutes(args.slice)
    spent = 0.0
    only = set(args.only.split(",")) if args.only else None
    for stage in stages:
        if only is not None and stage.key not in only:
            continue
        run_dir = root / stage.key
        model_dir = run_dir / "model"
        if (model_dir / "config.json").exists():
            continue
        if stage.init_from:
            init = root / f"{stage.init_from}-s{stage.seed}" / "model"
            if not (init / "config.json").exists():
                print(f"{stage.key}: waits for {init}")
                continue
        updates, elapsed = progress(run_dir)
        if updates < stage.max_updates:
            left = budget - spent
            if left <= 0:
                print(f"slice of {args.slice} used up; run again to continue")
                return
            limit = ["--max-updates", str(stage.max_updates), "--max-time", f"{elapsed + left:.0f}"]
            common = ["--threads", str(args.threads), "--no-progress-bar", *limit]
            if (run_dir / "checkpoint_last.pt").exists():
                rc = fadat("train", "--resume", str(run_dir), *common)
            else:
                init = []
                if stage.init_from:
                    init = ["--init-from", str(root / f"{stage.init_from}-s{stage.seed}" / "model")]
                rc = fadat(
                    "train", "--config", str(ROOT / stage.config), "--data", str(data),
                    "--run-dir", str(run_dir), "--seed", str(stage.seed), *init,
                    *stage.options, *common,
                )  # fmt: skip
            if rc != 0:
                raise SystemExit(f"{stage.key}: fadat train exited {rc}")
            new_updates, new_elapsed = progress(run_dir)
            spent += new_elapsed - elapsed
            if new_updates < stage.max_updates:
                print(f"{stage.key}: {new_updates}/{stage.max_updates} updates; run again")
                return
        best = ["--best", str(stage.average)]
        if fadat("average", "--run", str(run_dir), *best, "--output", str(model_dir)) != 0:
            raise SystemExit(f"{stage.key}: fadat average failed")
    print("all stages finished")


def adopt(args: argparse.Namespace) -> None:
    """Use an averaged model trained elsewhere (the main job) as STAGE's model for one seed.

    The model's training config must name the stage's config values, seed and update budget;
    otherwise the arms would not be comparable and the call fails.
    """
    spec, stages = load(args.experiment)
    matches = [s for s in stages if s.name == args.stage and s.seed == args.seed]
    if not matches:
        raise SystemExit(f"{args.experiment}: no stage {args.stage!r} for seed {args.seed}")
    stage = matches[0]
    source = Path(args.model).resolve()
    run_dir = Path(args.run) if args.run else source.parent / source.name.replace("-model", "")
    run_config = run_dir / "config.yaml"
    if not (source / "config.json").exists():
        raise SystemExit(f"{source}: not a model directory (no config.json)")
    if run_config.exists():
        trained = yaml.safe_load(run_config.read_text(encoding="utf-8"))
        wanted = yaml.safe_load((ROOT / stage.config).read_text(encoding="utf-8"))
        wanted.update(seed=stage.seed, max_updates=stage.max_updates)
        diff = {
            k: (trained.get(k), v)
            for k, v in wanted.items()
            if k not in ("validate_every", "valid_subset", "threads") and trained.get(k) != v
        }
        if diff:
            raise SystemExit(f"{run_config}: differs from stage {stage.key}: {diff}")
    else:
        raise SystemExit(f"{run_config}: no training config next to {source} to check against")
    target = run_root(spec) / stage.key / "model"
    if target.exists() or target.is_symlink():
        raise SystemExit(f"{target} exists; remove it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(source)
    print(f"{target} -> {source}")


def status(args: argparse.Namespace) -> None:
    spec, stages = load(args.experiment)
    root = run_root(spec)
    for stage in stages:
        updates, elapsed = progress(root / stage.key)
        done = (root / stage.key / "model" / "config.json").exists()
        print(
            f"{stage.key:24} {updates:6d}/{stage.max_updates:<6d} updates "
            f"{elapsed / 60:7.1f} min  {'averaged' if done else ''}"
        )


def evaluate(args: argparse.Namespace) -> None:
    spec, stages = load(args.experiment)
    root = run_root(spec)
    ev = spec["evaluate"]
    seeds = sorted({s.seed for s in stages if s.name in ev["models"]})
    for seed in seeds:
        models = [root / f"{name}-s{seed}" / "model" for name in ev["models"]]
        models += [root / f"{name}-s{seeds[0]}" / "model" for name in ev.get("shared", [])]
        missing = [str(m) for m in models if not (m / "config.json").exists()]
        if missing:
            print(f"seed {seed}: missing {', '.join(missing)}")
            continue
        report = root / f"report-s{seed}.json"
        rc = fadat(
            "evaluate", "--model", *map(str, models), "--data", str(ROOT / spec["data"]),
            "--split", "test",
            "--strategies", ev.get("strategies", "greedy,lookahead,joint-viterbi"),
            "--subset", str(args.subset), "--report", str(report),
            "--threads", str(args.threads), "--latency-subset", str(args.latency_subset),
        )  # fmt: skip
        if rc != 0:
            raise SystemExit(f"seed {seed}: fadat evaluate exited {rc}")


def table(args: argparse.Namespace) -> None:
    """Per seed: every system's scores; then the seeds side by side with the p-values of the
    paired bootstrap of each model against the first listed one (same strategy)."""
    spec, _ = load(args.experiment)
    ev = spec["evaluate"]
    stage_names = list(ev["models"]) + list(ev.get("shared", []))
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    seeds = []
    for report_file in sorted(run_root(spec).glob("report-s*.json")):
        seed = int(report_file.stem.split("-s")[1])
        seeds.append(seed)
        report = json.loads(report_file.read_text(encoding="utf-8"))
        # model labels are directory names; name the rows by stage instead (same order)
        labels = [m["label"] for m in report["models"]]
        stage_of = dict(zip(labels, stage_names, strict=True))
        first = stage_of[report["models"][0]["label"]]
        print(f"\n{report_file.name}: {report['data'].get('sentences', '?')} test sentences\n")
        print("| system | tok BLEU | sacreBLEU | chrF | latency ms | speed-up | sent/s | tput × |")
        print("|---|---|---|---|---|---|---|---|")
        for system in report["systems"]:
            stage = stage_of.get(system["model"], system["model"])
            label = system["name"].replace(system["model"], stage, 1)
            print(
                f"| {label} | {system['tok_bleu']:.2f} | {system['bleu']:.2f} | "
                f"{system['chrf']:.1f} | {system.get('latency_ms_median', float('nan')):.1f} | "
                f"{system.get('speedup_latency', float('nan')):.2f}× | "
                f"{system['throughput']:.1f} | "
                f"{system.get('speedup_throughput', float('nan')):.2f}× |"
            )
            against = {
                stage_of.get(k.split(":")[0], k): v
                for k, v in system.get("p_value_tok_bleu", {}).items()
            }
            rows.setdefault(label, {})[seed] = dict(system, p_first=None)
            for key, value in against.items():
                if key == first and stage != first:
                    rows[label][seed]["p_first"] = value
    if not rows:
        print("no reports yet: run `evaluate` first")
        return
    print(f"\nseeds side by side (p: paired bootstrap of tokenized BLEU against {first})\n")
    head = ["system"]
    head += [f"tok BLEU s{s}" for s in seeds] + [f"sacreBLEU s{s}" for s in seeds]
    head += [f"p s{s}" for s in seeds]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, by_seed in rows.items():
        cells = [label]
        for key, fmt in (("tok_bleu", "{:.2f}"), ("bleu", "{:.2f}"), ("p_first", "{:.4f}")):
            for seed in seeds:
                value = by_seed.get(seed, {}).get(key)
                cells.append(fmt.format(value) if value is not None else "–")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("adopt", help="link a model trained elsewhere as a stage's model")
    p.add_argument("experiment")
    p.add_argument("stage")
    p.add_argument("model", help="averaged model directory")
    p.add_argument("--run", help="its training run directory (default: MODEL without -model)")
    p.add_argument("--seed", type=int, default=1)
    for name in ("run", "status", "evaluate", "table"):
        p = sub.add_parser(name)
        p.add_argument("experiment")
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
    args = parser.parse_args(argv)
    commands = {"run": run, "status": status, "evaluate": evaluate, "table": table, "adopt": adopt}
    commands[args.command](args)


if __name__ == "__main__":
    main()
