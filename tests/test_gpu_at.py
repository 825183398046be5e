"""scripts/gpu/job-at.sh (the AT's plateau run continued on a lent GPU; docs/gpu-session.md) and
its helper scripts/gpu/at_plateau.py: the plateau criterion of the ``at`` stage on hand-made
valid logs (held, not held, held only from 10,000 updates), the checkpoints averaged (validated
at <= N, as many as there are up to 5), the config keys put back into the returned copy; and the
job's dry run: a toy AT continued from its compact copy, the files and the manifest, and
unpack-at.sh restoring the model and the copy."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu" / "job-at.sh"


def load_helper():
    name = "gpu_at_plateau"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts/gpu/at_plateau.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def curve(points: list[tuple[int, float]]) -> list[dict]:
    return [{"update": u, "bleu": b} for u, b in points]


def test_the_stage_is_the_experiment_files():
    """10,000 updates, a 0.3 window, a 0.3 gain, 5 averaged: read from the experiment file."""
    stage = load_helper().at_stage()
    p = stage.plateau
    assert (p.min_updates, float(p.window), p.gain, stage.average) == (10000, 0.3, 0.3, 5)
    assert stage.config == "configs/at-cpu-small.yaml"


def test_criterion_holds_at_the_first_flat_validation_from_10000():
    """b(N) - b(0.7 N) < 0.3: still climbing at 10,000 to 13,000 (gains 1.8 to 2.5); flat from
    the start, it holds at the first validation from 10,000 (gain 0.03)."""
    h = load_helper()
    plateau = h.at_stage().plateau
    points = [(1000 * k, 10 + k) for k in range(1, 9)]  # 11 .. 18 at 1,000 .. 8,000
    points += [(9000, 19.0), (10000, 19.5), (11000, 19.8), (12000, 19.7), (13000, 19.9)]
    c = h.criterion(curve(points), plateau)
    assert not c["held"] and c["n"] is None
    flat = [(1000 * k, 20.0 + 0.01 * k) for k in range(1, 16)]
    c = h.criterion(curve(flat), plateau)
    assert c["held"] and c["n"] == 10000 and c["gain"] == pytest.approx(0.03)
    assert c["best_bleu"] == pytest.approx(20.15) and c["best_update"] == 15000


def test_criterion_does_not_hold_while_bleu_climbs():
    """+0.5 BLEU per 1,000 updates: the last 30 % always gain more than 0.3; the gain reported
    is the last validation's."""
    h = load_helper()
    c = h.criterion(curve([(1000 * k, 0.5 * k) for k in range(1, 21)]), h.at_stage().plateau)
    assert not c["held"] and c["n"] is None
    assert c["last_validated"] == 20000 and c["gain"] == pytest.approx(10 - 7)


def test_criterion_holds_only_from_10000_updates():
    """Flat from 3,000 on: the gain is 0 from 5,000, but N is the first validated update >=
    10,000; with --min-updates 4000 (the dry run's kind of override) it is 5,000."""
    h = load_helper()
    points = curve([(1000, 5.0), (2000, 9.0)] + [(1000 * k, 12.0) for k in range(3, 13)])
    assert h.criterion(points, h.at_stage().plateau)["n"] == 10000
    assert h.criterion(points, h.at_stage(min_updates=4000).plateau)["n"] == 5000
    # a window that reaches before the first validation never holds
    late = curve([(9000, 12.0), (10000, 12.0), (11000, 12.0), (13000, 12.0)])
    assert h.criterion(late, h.at_stage().plateau)["n"] == 13000


def write_run(run: Path, valid: list[tuple[int, float]], best: list[tuple[int, float]]) -> None:
    run.mkdir(parents=True)
    (run / "valid_log.jsonl").write_text(
        "".join(json.dumps({"update": u, "bleu": b}) + "\n" for u, b in valid)
    )
    (run / "train_log.jsonl").write_text(json.dumps({"update": valid[-1][0], "elapsed": 99}) + "\n")
    entries = []
    for u, b in best:
        name = f"checkpoint_best_u{u:08d}.pt"
        (run / name).write_bytes(b"x")
        entries.append({"file": name, "update": u, "bleu": b})
    (run / "best.json").write_text(json.dumps({"checkpoints": entries}))
    (run / "config.yaml").write_text("data: /data/8k\ndevice: cuda\nmax_time: 9999.0\n")


def test_choose_averages_what_is_validated_at_or_before_n(tmp_path):
    """Plateau at 10,000 (20.2 - b(7,000) = 0.2): the best checkpoints of 11,000 to 13,000 are
    left out; the 2 at or before it are all there are (fewer than 5); without a plateau, the
    best up to the last update."""
    h = load_helper()
    stage = h.at_stage()
    run = tmp_path / "run"
    flat = [(1000 * k, 20.0) for k in range(1, 9)] + [(9000, 20.1), (10000, 20.2)]
    flat += [(11000, 20.5), (12000, 21.0), (13000, 21.2)]
    write_run(run, flat, [(10000, 20.2), (11000, 20.5), (12000, 21.0), (13000, 21.2), (9000, 20.1)])
    files, end, how = h.choose(run, stage)
    assert (end, how) == (10000, "plateau")
    assert [f.name for f in files] == [
        "checkpoint_best_u00010000.pt",
        "checkpoint_best_u00009000.pt",
    ]
    climbing = tmp_path / "climbing"
    write_run(climbing, [(1000 * k, float(k)) for k in range(1, 8)], [(6000, 6.0), (7000, 7.0)])
    files, end, how = h.choose(climbing, stage)
    assert (end, how) == (7000, "last update") and len(files) == 2
    none = tmp_path / "none"
    write_run(none, [(1000, 1.0)], [])
    assert h.main(["choose", str(none)]) == 1


def test_restore_config_puts_back_the_resumable_keys(tmp_path):
    h = load_helper()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.yaml").write_text("data: /d\ndevice: cuda\nmax_time: 700.0\nthreads: 2\n")
    original = tmp_path / "original.yaml"
    original.write_text("data: /d\ndevice: cpu\nmax_time: 180000.0\nthreads: 2\n")
    assert h.restore_config(copy, original) == {
        "device": ["cuda", "cpu"], "max_time": [700.0, 180000.0]
    }  # fmt: skip
    assert yaml.safe_load((copy / "config.yaml").read_text()) == {
        "data": "/d", "device": "cpu", "max_time": 180000.0, "threads": 2
    }  # fmt: skip


@pytest.mark.slow
def test_dry_run_continues_a_toy_copy_and_brings_back_model_and_copy(tmp_path, toy_data):
    """A toy AT trained to update 4 and snapshotted, its data behind a link the job restores;
    continued to update 12 (validations every 2, the criterion's minimum 8): the manifest says
    where it started and ended and the criterion; the model averages the best validated at
    <= N; the copy comes back with its config.yaml's max_time put back; unpack-at.sh restores
    both and the model translates."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(JOB), "--dry-run", "--data", str(toy_data)],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "job.log", "manifest.json", "model.manifest.json", "model.tar.part00",
        "snapshot.manifest.json", "snapshot.tar.part00",
    ]  # fmt: skip
    m = json.loads((out / "manifest.json").read_text())
    assert m["dry_run"] and m["job"] == "scripts/gpu/job-at.sh" and m["warnings"] == []
    for f in m["files"]:  # job.log without a hash: the job appends to it afterwards
        data = (out / f["name"]).read_bytes()
        if f["name"] == "job.log":
            assert f["sha256"] is None
        else:
            assert (f["bytes"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert [(s["name"], s["status"]) for s in m["stages"]] == [
        ("train", "ok"), ("average", "ok"), ("snapshot", "ok"), ("pack", "ok")
    ]  # fmt: skip
    assert m["start"]["update"] == 4 and m["training"]["updates"] >= 8
    assert [v["update"] for v in m["training"]["validations"]][:2] == [6, 8]
    p = m["plateau"]
    assert p["min_updates"] == 8 and p["window"] == 0.3 and p["max_gain"] == 0.3
    end = p["n"] if p["held"] else m["training"]["updates"]
    assert m["model"]["up_to_update"] == end and m["model"]["dir"] == "bible-en-es-at-cpu-small"
    assert 1 <= len(m["model"]["averaged"]) <= 5
    assert all(int(a["checkpoint"][-11:-3]) <= end for a in m["model"]["averaged"])
    assert m["snapshot"] == "bible-en-es-at-plateau"
    assert "data: " in proc.stdout and "(a link)" in proc.stdout
    # here: both restored
    model, snap = tmp_path / "models" / "at", tmp_path / "snap"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu/unpack-at.sh"), str(out), str(model), str(snap)],
        env={**os.environ, "PY": sys.executable}, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (model / "config.json").is_file() and (snap / "checkpoint_last.pt").is_file()
    config = yaml.safe_load((snap / "config.yaml").read_text())
    assert config["max_time"] == 0.0 and config["device"] == "cpu"  # the toy's, put back
    valid = [json.loads(line) for line in (snap / "valid_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in valid][:3] == [2, 4, 6]
