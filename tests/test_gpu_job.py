"""scripts/gpu/job.sh, the one device command of a GPU session (issue 47; docs/gpu-session.md),
rehearsed on the CPU with ``--dry-run``: every stage runs and writes what the summary reads, at
most 8 files come back with a manifest whose hashes are the files', a stage that would overrun
the deadline is skipped with a line saying so; and scripts/gpu/summary.py's counts and manifest
against hand-made inputs. scripts/gpu/job-sweep.sh (one speed-sweep design trained on the GPU)
the same way: its dry run brings back a model that unpack-model.sh restores with the design's
depths, an unknown design is refused with the list, its manifest reads a run cut short; its data
is the experiment file's dataset as prepare.sh carries it (sweep_design.py carry-data: a copy of
the local dataset, built by the recipe's make_dataset only where missing), and data without the
recorded digest is refused before training."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu" / "job.sh"
SWEEP_JOB = ROOT / "scripts" / "gpu" / "job-sweep.sh"
SWEEP = ROOT / "recipes" / "experiments" / "bible-en-es-speed-sweep.yaml"
STAGES = ["tests", "kernels", "train-base", "train-small", "latency", "train-torch-dag"]


def load_summary():
    return load_script("gpu_summary", ROOT / "scripts/gpu/summary.py")


def load_script(name: str, path: Path):
    """A script loaded from its file (registered in sys.modules: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_job(out: Path, *args: str, env: dict[str, str] | None = None, script: Path = JOB) -> str:
    """job.sh (or ``script``) with OUT=out and this interpreter; returns its output (exit 0
    asserted)."""
    full_env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(
        ["bash", str(script), *args], env=full_env, capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def check_manifest(out: Path) -> dict:
    """The manifest lists every other file in OUT with its size and SHA-256 (job.log, which the
    job appends to afterwards, without one); at most 8 files in all."""
    manifest = json.loads((out / "manifest.json").read_text())
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= 8, names
    assert sorted([f["name"] for f in manifest["files"]] + ["manifest.json"]) == names
    for f in manifest["files"]:
        data = (out / f["name"]).read_bytes()
        if f["name"] == "job.log":
            assert f["sha256"] is None
        else:
            assert f["bytes"] == len(data)
            assert f["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["warnings"] == []
    return manifest


@pytest.mark.slow
def test_dry_run_runs_every_stage_and_writes_a_manifest(tmp_path, toy_data, models):
    out = tmp_path / "out"
    log = run_job(out, "--dry-run", "--data", str(toy_data), "--at", str(models["at"]))
    manifest = check_manifest(out)
    assert [s["name"] for s in manifest["stages"]] == STAGES
    assert {s["name"]: s["status"] for s in manifest["stages"]} == dict.fromkeys(STAGES, "ok")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["job.log", "pytest.txt", "junit.xml", "bench.txt", "kernels.json", "bench_model.json"]
        + ["latency.json", "manifest.json"]
    )
    res = manifest["results"]
    t = res["tests"]
    assert t["passed"] > 0 and t["failures"] == t["errors"] == 0 and t["failed"] == []
    # the Triton kernels (interpreter) computed what the PyTorch DPs did
    assert [r["task"] for r in res["kernels"]] == ["likelihood", "alignment"]
    assert all(r["max_diff"] < 1e-3 for r in res["kernels"])
    variants = ["fp32-eager", "bf16-eager", "bf16-fused", "bf16-glat", "bf16-fuzzy"]
    assert [r["variant"] for r in res["train"]] == variants * 3  # base, small, base + torch DPs
    assert [r["dag_backend"] for r in res["train"]] == ["auto"] * 10 + ["torch"] * 5
    assert [r["dag_triton"] for r in res["train"]] == [False] * 15  # a CPU: never Triton
    assert all(r["tokens_per_s"] > 0 for r in res["train"])
    pieces = res["train_pieces"]
    assert len(pieces) == 3
    for p in pieces:
        assert set(p["ms"]) >= {"dag_nll_forward", "dag_nll_backward", "glancing_pass"}
        assert set(p["ms"]) >= {"fuzzy_forward", "fuzzy_backward", "token_head_log_softmax"}
        assert p["dag_nll_share_of_fused_step"] > 0
    systems = [r["name"].rsplit(":", 1)[1] for r in res["latency"]]
    assert systems == ["greedy", "lookahead", "joint-viterbi", "greedy", "beam5"] or (
        systems[:3] == ["greedy", "lookahead", "joint-viterbi"] and len(systems) == 5
    )
    assert all(r["latency_ms_median"] > 0 for r in res["latency"])
    # the summary tables end the output
    assert "| stage | status |" in log and "| system | latency ms |" in log


@pytest.mark.slow
def test_a_stage_that_would_overrun_is_skipped_with_a_line(tmp_path, toy_data):
    """--budget 25: 15 s kept for the summary leave less than any stage's minimum."""
    out = tmp_path / "out"
    run_job(out, "--dry-run", "--budget", "25", "--data", str(toy_data), env={"BUDGET_SCALE": "1"})
    manifest = check_manifest(out)
    assert {s["name"]: s["status"] for s in manifest["stages"]} == dict.fromkeys(STAGES, "skipped")
    log = (out / "job.log").read_text()
    for name in STAGES:
        assert f"[{name}] SKIPPED: it needs at least" in log
    assert manifest["results"]["tests"] is None and manifest["results"]["train"] == []


@pytest.mark.slow
def test_only_runs_the_named_stage(tmp_path, toy_data):
    """--only latency, the cheapest stage (one evaluate of the DAT on 4 sentences; no AT, so
    without the AT rows)."""
    out = tmp_path / "out"
    no_at = tmp_path / "no-at"
    log = run_job(
        out, "--dry-run", "--only", "latency", "--data", str(toy_data), "--at", str(no_at)
    )
    manifest = check_manifest(out)
    status = {s["name"]: s["status"] for s in manifest["stages"]}
    assert status == {**dict.fromkeys(STAGES, "skipped"), "latency": "ok"}
    assert "[kernels] SKIPPED: not asked for (--only latency)" in log
    assert f"[latency] no AT at {no_at}: the AT rows (greedy, beam 5) are skipped" in log
    systems = [r["name"].rsplit(":", 1)[1] for r in manifest["results"]["latency"]]
    assert systems == ["greedy", "lookahead", "joint-viterbi"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1"
failures="1" skipped="2" tests="7" time="12.5"><testcase classname="tests.test_cuda" name="a"/>
<testcase classname="tests.test_cuda" name="b"><failure message="x"/></testcase>
<testcase classname="tests.test_dag" name="c"><error message="y"/></testcase>
</testsuite></testsuites>"""


def test_summary_counts_tests_and_hashes_files(tmp_path):
    summary = load_summary()
    out = tmp_path / "out"
    out.mkdir()
    (out / "junit.xml").write_text(JUNIT)
    (out / "kernels.json").write_text('{"device": "NVIDIA H100", "rows": [{"task"')  # cut short
    (out / "job.log").write_text("grows\n")
    stages = tmp_path / "stages"
    stages.write_text(
        "tests\tfailed\t1\t80\t150\tpytest.txt\nkernels\tskipped\t\t0\t3\tbench.txt\n"
    )
    assert summary.main([str(out), "--stages", str(stages), "--commit", "abc"]) == 0
    manifest = check_manifest(out)
    assert manifest["commit"] == "abc" and manifest["device"] is None  # kernels.json unreadable
    t = manifest["results"]["tests"]
    assert (t["tests"], t["passed"], t["failures"], t["errors"], t["skipped"]) == (7, 3, 1, 1, 2)
    assert t["failed"] == ["tests.test_cuda::b", "tests.test_dag::c"]
    assert manifest["stages"][0] == {
        "name": "tests",
        "status": "failed",
        "exit": 1,
        "seconds": 80,
        "budget_s": 150,
        "file": "pytest.txt",
    }
    assert manifest["stages"][1]["exit"] is None and manifest["stages"][1]["status"] == "skipped"
    # more files than the device tool brings back: a warning
    for i in range(7):
        (out / f"extra{i}.txt").write_text(str(i))
    manifest = summary.summarize(out, [], "abc", None)
    assert manifest["warnings"] == ["11 files in OUT: the device tool brings back 8"]


# ---- scripts/gpu/job-sweep.sh


def sweep_stages() -> dict[str, dict]:
    """The sweep's stages by name, as the experiment file gives them."""
    return {st["name"]: st for st in yaml.safe_load(SWEEP.read_text())["stages"]}


def test_sweep_refuses_an_unknown_design_with_the_list(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SWEEP_JOB), "5x2", "--dry-run"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "job-sweep.sh: unknown design '5x2'; the designs of "
        "recipes/experiments/bible-en-es-speed-sweep.yaml are: " + ", ".join(sweep_stages())
    )
    assert proc.stdout == "" and not out.exists()  # refused before anything started


def test_sweep_without_a_design_prints_its_usage_and_the_designs(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SWEEP_JOB)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "usage: scripts/gpu/job-sweep.sh DESIGN [--budget S] [--dry-run [--data DIR]]",
        "DESIGN: one of " + " ".join(sweep_stages()),
    ]
    assert proc.stdout == "" and not out.exists()


@pytest.mark.slow
def test_sweep_dry_run_brings_back_the_design(tmp_path, toy_data):
    """5x1-range at toy widths: the design's depths (5 + 1) and λ range come through to the
    model that unpack-model.sh restores; the batch is the config's max_tokens × update_freq in
    one micro-batch; 4 validations, so 4 of the stage's 5 best are averaged."""
    from fadat.models.config import PRESETS
    from fadat.models.directory import load_pretrained

    design = "5x1-range"
    stage = sweep_stages()[design]
    config = yaml.safe_load((ROOT / stage["config"]).read_text())
    out = tmp_path / "out"
    log = run_job(out, design, "--dry-run", "--data", str(toy_data), script=SWEEP_JOB)
    manifest = check_manifest(out)
    name = f"{design}-s1-gpu"
    assert sorted(p.name for p in out.iterdir()) == [
        "job.log", "manifest.json", "model.manifest.json", "model.tar.part00", "run-logs.tar.gz"
    ]  # fmt: skip
    assert [(s["name"], s["status"]) for s in manifest["stages"]] == [
        ("train", "ok"), ("average", "ok"), ("pack", "ok")
    ]  # fmt: skip
    tokens = config["max_tokens"] * config["update_freq"]
    assert manifest["design"] == design and manifest["config"] == stage["config"]
    assert manifest["tokens_per_update"] == tokens and manifest["average"] == stage["average"]
    t = manifest["training"]
    assert (t["updates"], t["max_updates"], t["complete"]) == (8, 8, True)
    assert t["stop_reason"] == "max_updates" and t["validations"] == 4
    assert len(t["averaged"]) == 4 and t["model_dir"] == name
    settings = t["settings"]
    assert (settings["max_tokens"], settings["update_freq"]) == (tokens, 1)
    assert settings["seed"] == 1 and settings["save_every"] == stage["train"]["save_every"]
    assert settings["preset"] == config["preset"] and not settings["bf16"]
    assert settings["upsample_ratio_range"] == config["upsample_ratio_range"]
    # the run's logs, a run directory without checkpoints
    with tarfile.open(out / "run-logs.tar.gz") as tar:
        members = sorted(tar.getnames())
        valid = [json.loads(line) for line in tar.extractfile(f"{name}/valid_log.jsonl")]
    assert members == sorted(
        f"{name}/{f}"
        for f in ("config.yaml", "train.log", "train_log.jsonl", "valid_log.jsonl", "best.json")
    )
    assert t["best_bleu"] == max(r["bleu"] for r in valid)
    assert "training: 8 of 8 updates (complete: true" in log
    # here: joined, checked and loaded with the design's depths
    env = {**os.environ, "PY": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu/unpack-model.sh"), str(out), str(tmp_path / "models")],
        env=env, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    model = load_pretrained(tmp_path / "models" / name)
    depths = PRESETS[config["preset"]]
    assert (model.config.encoder_layers, model.config.decoder_layers) == (
        depths["encoder_layers"], depths["decoder_layers"]
    ) == (5, 1)  # fmt: skip
    assert model.config.upsample_ratio_range == tuple(config["upsample_ratio_range"])
    assert model.config.d_model == 32  # the dry run's toy width


def test_sweep_manifest_of_a_run_cut_short(tmp_path):
    """A run stopped by --max-time at update 37 of 6000: complete false, the last update, the
    best validation, the checkpoints the model averaged; the hashes of the files in OUT."""
    sweep = load_script("gpu_sweep_design", ROOT / "scripts/gpu/sweep_design.py")
    run, model, out = tmp_path / "run", tmp_path / "models" / "base-s1-gpu", tmp_path / "out"
    for d in (run, model, out):
        d.mkdir(parents=True)
    (run / "train_log.jsonl").write_text(
        "".join(
            json.dumps({"update": u, "target_tokens": 1000, "elapsed": u / 2}) + "\n"
            for u in range(1, 38)
        )
        + '{"update": 38, "targ'  # cut by the kill
    )
    (run / "valid_log.jsonl").write_text(
        '{"update": 20, "bleu": 1.5}\n{"update": 30, "bleu": 2.5}\n{"update": 37, "bleu": 2.5}\n'
    )
    (run / "train.log").write_text("x INFO stopped (max_time) after 37 updates\n")
    (run / "config.yaml").write_text("max_tokens: 4096\nupdate_freq: 1\ndevice: cuda\nother: 1\n")
    (model / "config.json").write_text(
        json.dumps({"training": {"averaged": ["a.pt", "b.pt"], "bleu": [2.5, 2.5]}})
    )
    (out / "job.log").write_text("device NVIDIA H100 80GB HBM3 81559 MiB, 132 SMs\n")
    (out / "model.tar.part00").write_bytes(b"x" * 100)
    stages = tmp_path / "stages"
    stages.write_text("train\ttimed_out\t124\t480\t480\tjob.log\n")
    args = [str(out), "--stages", str(stages), "--design", "base", "--run", str(run)]
    args += ["--model", str(model), "--max-updates", "6000", "--commit", "abc"]
    assert sweep.main(["manifest", *args]) == 0
    manifest = check_manifest(out)
    assert manifest["device"] == "NVIDIA H100 80GB HBM3" and manifest["commit"] == "abc"
    assert manifest["stages"][0]["status"] == "timed_out"
    assert manifest["training"] == {
        "updates": 37,
        "max_updates": 6000,
        "complete": False,
        "stop_reason": "max_time",
        "train_s": 18.5,
        "target_tokens_per_s": round(37_000 / 18.5),
        "validations": 3,
        "best_bleu": 2.5,
        "best_update": 30,  # the earlier of two equal BLEUs, as best.json ranks them
        "averaged": [{"checkpoint": "a.pt", "bleu": 2.5}, {"checkpoint": "b.pt", "bleu": 2.5}],
        "model_dir": "base-s1-gpu",
        "settings": {"max_tokens": 4096, "update_freq": 1, "device": "cuda"},
    }
    assert "training: 37 of 6000 updates (complete: false, stopped by max_time)" in sweep.render(
        manifest
    )


# ---- the sweep's dataset: carried by prepare.sh (sweep_design.py carry-data), checked by
# job-sweep.sh before it trains


def sweep_dataset_name() -> str:
    """The dataset the sweep trains on, as the experiment file names it."""
    return yaml.safe_load(SWEEP.read_text())["data"]


def run_sweep(out: Path, carry: Path, *args: str) -> subprocess.CompletedProcess:
    """job-sweep.sh with OUT=out, CARRY=carry and this interpreter (exit status not checked)."""
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CARRY": str(carry)}
    return subprocess.run(
        ["bash", str(SWEEP_JOB), *args], env=env, capture_output=True, text=True, cwd=ROOT
    )


def test_sweep_stage_gives_the_experiment_files_dataset():
    """job-sweep.sh's DATASET (and so its default data, CARRY/DATASET) is the experiment file's
    `data`, read by sweep_design.py, not a name in the script."""
    name = sweep_dataset_name()
    script = str(ROOT / "scripts/gpu/sweep_design.py")
    stage = subprocess.run(
        [sys.executable, script, "stage", "base"], capture_output=True, text=True, check=True
    )
    assert f"DATASET={name}" in stage.stdout.splitlines()
    dataset = subprocess.run(
        [sys.executable, script, "dataset"], capture_output=True, text=True, check=True
    )
    assert dataset.stdout == name + "\n"
    code = [line for line in SWEEP_JOB.read_text().splitlines() if not line.startswith("#")]
    assert not [line for line in code if name in line or "bible-en-es" in line]


def test_sweep_without_data_takes_the_carried_sweep_dataset_and_refuses_it_unrecorded(tmp_path):
    """No --data: the data is CARRY/<the experiment's dataset>; with no digest recorded for it
    (prepare.sh never carried it) the job stops with exit 1 before training, naming it."""
    name = sweep_dataset_name()
    out, carry = tmp_path / "out", tmp_path / "carry"
    proc = run_sweep(out, carry, "base", "--dry-run")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "job.log").read_text()
    assert f"data {carry / name} (the sweep's: {name})" in log
    refusal = (
        f"job-sweep.sh: not training: the sweep's dataset is {name} ({SWEEP.relative_to(ROOT)}), "
        f"and {carry / name}.json, the digest that scripts/gpu/prepare.sh records when it "
        f"carries {name}, is missing"
    )
    assert refusal in log and refusal in proc.stdout
    assert f"exit 1 before training, no model: {carry / name} is not shown" in log
    assert "[train]" not in log
    assert sorted(p.name for p in out.iterdir()) == ["job.log"]


def test_sweep_refuses_data_whose_digest_is_not_the_recorded_one(tmp_path, toy_data):
    """A prepared dataset at CARRY/<dataset> whose training files differ from the digest
    prepare.sh recorded for it: exit 1 before training, the line naming the dataset and both
    digests."""
    from fadat.data.binarized import training_digest

    name = sweep_dataset_name()
    out, carry = tmp_path / "out", tmp_path / "carry"
    shutil.copytree(toy_data, carry / name)
    recorded = "0" * 64
    (carry / f"{name}.json").write_text(
        json.dumps({"dataset": name, "training_digest": recorded, "source": "elsewhere"})
    )
    proc = run_sweep(out, carry, "5x1", "--dry-run")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "job.log").read_text()
    mine = training_digest(carry / name)
    assert (
        f"job-sweep.sh: not training: the sweep's dataset is {name} "
        f"({SWEEP.relative_to(ROOT)}): the training files of {carry / name} (sha256 "
        f"{mine[:12]}…) are not the {recorded[:12]}… that prepare.sh recorded in "
        f"{carry / name}.json (from elsewhere)"
    ) in log
    assert "[train]" not in log and sorted(p.name for p in out.iterdir()) == ["job.log"]


def load_sweep():
    return load_script("gpu_sweep_design", ROOT / "scripts/gpu/sweep_design.py")


def no_make_dataset(monkeypatch) -> list:
    """recipes/experiment.py's make_dataset, as sweep_design.py loads it, replaced by a stub
    that fails the test: nothing may be built (distilled). Returns the list of its calls."""
    calls = []

    def make_dataset(*args):
        calls.append(args)
        raise AssertionError("make_dataset called: the dataset would be built again")

    monkeypatch.setattr(load_sweep().experiment_module(), "make_dataset", make_dataset)
    return calls


def write_experiment(path: Path, model: str) -> str:
    """A one-stage experiment whose dataset `toy-kd` is `toy` distilled by ``model``."""
    spec = {
        "name": "toy-sweep",
        "data": "toy-kd",
        "datasets": {"toy-kd": {"distill": {"model": model, "data": "toy", "beam": 5}}},
        "stages": [{"name": "base", "config": "configs/dat-cpu-small-nll.yaml", "max_updates": 8}],
    }
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_carry_data_copies_the_local_dataset_rather_than_building_it(
    tmp_path, toy_data, monkeypatch
):
    """The data root holds the sweep's dataset: it is copied into CARRY (not distilled again,
    make_dataset is never called), with its training digest recorded; the check that
    job-sweep.sh runs then accepts the copy and refuses it once a valid reference changes."""
    from fadat.data.binarized import training_digest

    sweep = load_sweep()
    calls = no_make_dataset(monkeypatch)
    name = sweep_dataset_name()
    data_root, carry = tmp_path / "data", tmp_path / "carry"
    shutil.copytree(toy_data, data_root / name)
    (carry / name).mkdir(parents=True)
    (carry / name / "stale").write_text("an older copy")
    rc, text = sweep.carry_data(data_root, carry)
    assert rc == 0 and calls == []
    digest = training_digest(data_root / name)
    assert training_digest(carry / name) == digest
    assert not (carry / name / "stale").exists()  # replaced, not merged
    assert sorted(p.name for p in carry.iterdir()) == [name, f"{name}.json"]
    record = json.loads((carry / f"{name}.json").read_text())
    assert record == {
        "dataset": name,
        "training_digest": digest,
        "source": str(data_root / name),
        "experiment": "recipes/experiments/bible-en-es-speed-sweep.yaml",
    }
    assert text == (
        f"sweep data: {carry / name} = {data_root / name} (the sweep's {name}; training files' "
        f"sha256 {digest[:12]}…, recorded in {carry / name}.json)"
    )
    assert sweep.check_data(carry / name, carry)[0]
    ref = carry / name / "raw" / "valid.ref.txt"
    ref.write_text(ref.read_text() + "one more line\n")
    ok, line = sweep.check_data(carry / name, carry)
    assert not ok and "are not the" in line and name in line


def test_carry_data_skips_a_dataset_whose_distilling_model_is_not_committed(
    tmp_path, toy_data, monkeypatch
):
    """The data root lacks the dataset and its teacher is not in the checkout: nothing is built
    or carried, a stale copy and its record go, and the line says why (exit 0: the other jobs'
    data is still made)."""
    sweep = load_sweep()
    calls = no_make_dataset(monkeypatch)
    experiment = write_experiment(tmp_path / "toy.yaml", "models/no-such-at")
    data_root, carry = tmp_path / "data", tmp_path / "carry"
    shutil.copytree(toy_data, data_root / "toy")
    shutil.copytree(toy_data, carry / "toy-kd")
    (carry / "toy-kd.json").write_text("{}")
    rc, text = sweep.carry_data(data_root, carry, experiment)
    assert rc == 0 and calls == []
    assert text == (
        "sweep data: the sweep's dataset toy-kd cannot be built yet: it needs the teacher "
        f"{ROOT / 'models' / 'no-such-at'} (missing from this checkout: not committed yet); "
        "skipped (job-sweep.sh refuses to train until prepare.sh carries toy-kd)"
    )
    assert list(carry.iterdir()) == []


def test_carry_data_builds_a_missing_dataset_with_the_recipes_make_dataset(
    tmp_path, toy_data, monkeypatch, capsys
):
    """The data root lacks the dataset and its teacher is in the checkout: recipes/experiment.py's
    make_dataset builds it in the data root (where the CPU sweep reads it), then it is carried."""
    from fadat.data.binarized import training_digest

    sweep = load_sweep()
    calls = []

    def make_dataset(name, spec, paths, threads):
        calls.append((name, paths.dataset(name), threads))
        shutil.copytree(toy_data, paths.dataset(name))  # stands in for fadat distill
        return ""

    monkeypatch.setattr(sweep.experiment_module(), "make_dataset", make_dataset)
    experiment = write_experiment(tmp_path / "toy.yaml", "models/bible-en-es-fadat-cpu-small")
    data_root, carry = tmp_path / "data", tmp_path / "carry"
    shutil.copytree(toy_data, data_root / "toy")
    rc, text = sweep.carry_data(data_root, carry, experiment)
    assert rc == 0 and calls == [("toy-kd", data_root / "toy-kd", 1)]
    assert text.splitlines()[0] == f"sweep data: built {data_root / 'toy-kd'}"
    assert capsys.readouterr().out == (
        f"sweep data: building {data_root / 'toy-kd'} (recipes/experiment.py's make_dataset, 1 "
        "thread(s)): toy-kd = `fadat distill` of toy by models/bible-en-es-fadat-cpu-small "
        "(beam 5), about 20 minutes on one CPU thread\n"
    )
    assert training_digest(carry / "toy-kd") == training_digest(data_root / "toy-kd")
    assert json.loads((carry / "toy-kd.json").read_text())["dataset"] == "toy-kd"


@pytest.mark.slow
def test_sweep_dry_run_trains_on_the_dataset_prepare_carried(tmp_path, toy_data):
    """carry-data (prepare.sh's step) then job-sweep.sh without --data: it accepts the carried
    copy and trains on it; the manifest gives the data's training digest, the recorded one."""
    name = sweep_dataset_name()
    data_root, carry, out = tmp_path / "data", tmp_path / "carry", tmp_path / "out"
    shutil.copytree(toy_data, data_root / name)
    script = str(ROOT / "scripts/gpu/sweep_design.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, script, "carry-data", "--data-root", str(data_root)]
    subprocess.run([*argv, "--carry", str(carry)], check=True, env=env, cwd=ROOT)
    proc = run_sweep(out, carry, "5x1", "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "job.log").read_text()
    assert f"data: {carry / name} is the sweep's dataset {name}" in log
    manifest = check_manifest(out)
    assert (
        manifest["data_digest"]
        == json.loads((carry / f"{name}.json").read_text())["training_digest"]
    )
    assert manifest["training"]["updates"] == 8 and manifest["dataset"] == name
