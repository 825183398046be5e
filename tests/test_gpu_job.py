"""scripts/gpu/job.sh, the one device command of a GPU session (issue 47; docs/gpu-session.md),
rehearsed on the CPU with ``--dry-run``: every stage runs and writes what the summary reads, at
most 8 files come back with a manifest whose hashes are the files', a stage that would overrun
the deadline is skipped with a line saying so; and scripts/gpu/summary.py's counts and manifest
against hand-made inputs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu" / "job.sh"
STAGES = ["tests", "kernels", "train-base", "train-small", "latency", "train-torch-dag"]
TEST_50 = ROOT / "tests" / "data" / "bible-en-es-test-50"
RELEASED = ROOT / "models" / "bible-en-es-fadat-cpu-small"


def load_summary():
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "scripts/gpu/summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_job(out: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """job.sh with OUT=out and this interpreter; returns its output (exit 0 asserted)."""
    full_env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(
        ["bash", str(JOB), *args], env=full_env, capture_output=True, text=True, cwd=ROOT
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


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> Path:
    """50 Bible test sentences as every split, in the released DAT's vocabulary."""
    out = tmp_path_factory.mktemp("toy") / "data"
    files = [f"{TEST_50}.en", f"{TEST_50}.es"]
    cmd = [sys.executable, "-m", "fadat.cli", "prepare", "--output", str(out)]
    for split in ("", "valid-", "test-"):
        cmd += [f"--{split}source-file", files[0], f"--{split}target-file", files[1]]
    cmd += ["--spm-model", str(RELEASED / "spm.model"), "--source-lang", "en"]
    cmd += ["--target-lang", "es"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return out


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
    out = tmp_path / "out"
    log = run_job(out, "--dry-run", "--only", "kernels", "--data", str(toy_data))
    manifest = check_manifest(out)
    status = {s["name"]: s["status"] for s in manifest["stages"]}
    assert status == {**dict.fromkeys(STAGES, "skipped"), "kernels": "ok"}
    assert "[latency] SKIPPED: not asked for (--only kernels)" in log
    assert len(manifest["results"]["kernels"]) == 2


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
