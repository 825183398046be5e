"""Learning-speed harness: train DA-Transformer variants for a fixed wall-clock budget (RESULTS.md,
"Learning speed on 2 CPU cores").

Each variant of ``recipes/learning_speed.yaml`` is one change against ``base``. ``run`` trains a
variant from scratch into ``RUNS/VARIANT`` for ``--budget`` of training time (validation
included, as a user would pay it) and validates every ``validate_every`` updates on the same 300
valid sentences (lookahead, sacreBLEU 13a); re-running a variant resumes it (``fadat train
--resume``), and a larger ``--budget`` extends it. ``table`` prints, per variant, the valid BLEU
and valid loss of the last validation at or before each time mark, the updates, the target
tokens/s and the final values, as a Markdown table for RESULTS.md.

Usage::

    python recipes/learning_speed.py list
    python recipes/learning_speed.py run VARIANT[,VARIANT...] [--budget 15m] [--threads 1]
    python recipes/learning_speed.py table [--marks 5,10,15] [--runs DIR] [VARIANT ...]

Run two variants at once with ``--threads 1`` each on a 2-core machine (never two with 2 threads:
oversubscription slows both several-fold); a pair shares memory bandwidth, so compare variants of
the same pair or of pairs run the same way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
VARIANTS_FILE = Path(__file__).with_suffix(".yaml")


def load_variants(path: Path = VARIANTS_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``base`` section and the ``variants`` mapping of the variants file."""
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    return spec["base"], spec["variants"]


def resolve(name: str, base: dict[str, Any], variants: dict[str, Any]) -> dict[str, Any]:
    """The training config (TrainConfig keys) and data of one variant.

    ``name`` is a variant of the file or several joined by ``,`` (``copy-source,lambda-3``):
    their changes are applied in order on top of ``base``.

    Raises:
        SystemExit: unknown variant.
    """
    parts = [name] if name in variants else name.split(",")
    unknown = [part for part in parts if part not in variants]
    if unknown:
        raise SystemExit(f"unknown variant {unknown[0]!r}; known: {', '.join(variants)}")
    config = yaml.safe_load((ROOT / base["config"]).read_text(encoding="utf-8"))
    config.update(base.get("train", {}))
    model = dict(config.get("model") or {})
    data, prepare = base["data"], []
    for part in parts:
        change = variants[part] or {}
        config.update(change.get("train", {}))
        model.update(change.get("model", {}))
        data = change.get("data", data)
        prepare = change.get("prepare", prepare)
    if model:
        config["model"] = model
    return {"config": config, "data": data, "prepare": prepare}


def fadat(*args: str) -> None:
    """Run the ``fadat`` CLI of this interpreter; exit with its code on failure."""
    cmd = [sys.executable, "-m", "fadat.cli", *args]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0:
        raise SystemExit(rc)


def run(args: argparse.Namespace) -> None:
    base, variants = load_variants()
    spec = resolve(args.variant, base, variants)
    data = ROOT / spec["data"]
    if not (data / "meta.json").exists():
        fadat("prepare", "bible-en-es", "--output", str(data), *spec["prepare"])
    run_dir = Path(args.runs) / args.variant
    common = ["--max-time", args.budget, "--threads", str(args.threads), "--no-progress-bar"]
    if (run_dir / "checkpoint_last.pt").exists():
        fadat("train", "--resume", str(run_dir), *common)
        return
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config_file = Path(args.runs) / f"{args.variant}.yaml"
    config_file.write_text(yaml.safe_dump(spec["config"], sort_keys=False), encoding="utf-8")
    fadat(
        "train",
        "--config",
        str(config_file),
        "--data",
        str(data),
        "--run-dir",
        str(run_dir),
        *common,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def at_mark(points: list[dict[str, Any]], seconds: float) -> dict[str, Any] | None:
    """The last validation at or before ``seconds`` of training time."""
    before = [p for p in points if p.get("elapsed", float("inf")) <= seconds]
    return before[-1] if before else None


def table(args: argparse.Namespace) -> None:
    _, variants = load_variants()
    marks = [float(m) for m in args.marks.split(",")]
    runs = Path(args.runs)
    found = sorted(d.name for d in runs.iterdir() if d.is_dir()) if runs.is_dir() else []
    names = args.variants or [n for n in variants if n in found] + [
        n for n in found if n not in variants
    ]
    head = ["variant"] + [f"BLEU@{m:g}m" for m in marks] + [f"loss@{m:g}m" for m in marks]
    head += ["updates", "tok/s", "final BLEU", "final loss", "minutes"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in names:
        run_dir = Path(args.runs) / name
        valid = read_jsonl(run_dir / "valid_log.jsonl")
        train = read_jsonl(run_dir / "train_log.jsonl")
        if not valid:
            continue
        cells = [name]
        points = [at_mark(valid, m * 60) for m in marks]
        cells += [f"{p['bleu']:.2f}" if p else "–" for p in points]
        cells += [f"{p['valid_loss']:.3f}" if p else "–" for p in points]
        rates = [r["tokens_per_s"] for r in train[len(train) // 10 :] if "tokens_per_s" in r]
        rate = sorted(rates)[len(rates) // 2] if rates else float("nan")
        last = valid[-1]
        cells += [
            str(last["update"]),
            f"{rate:.0f}",
            f"{last['bleu']:.2f}",
            f"{last['valid_loss']:.3f}",
            f"{last.get('elapsed', float('nan')) / 60:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default=str(ROOT / "runs" / "learning-speed"))
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the variants")
    r = sub.add_parser("run", help="train (or resume) one variant")
    r.add_argument("variant")
    r.add_argument("--budget", default="15m", help="training time, e.g. 15m (default)")
    r.add_argument("--threads", type=int, default=1)
    t = sub.add_parser("table", help="print the Markdown table of finished runs")
    t.add_argument("variants", nargs="*")
    t.add_argument("--marks", default="5,10,15", help="minutes, comma-separated")
    args = parser.parse_args(argv)
    if args.command == "list":
        base, variants = load_variants()
        for name in variants:
            print(name, json.dumps(resolve(name, base, variants)["config"]))
    elif args.command == "run":
        run(args)
    else:
        table(args)


if __name__ == "__main__":
    main()
