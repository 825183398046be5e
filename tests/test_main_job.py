"""scripts/main-job.sh's wiring, run for real with ``fadat`` replaced by a stub that logs its
command lines (the job itself takes minutes to an hour; what each verb does is tested with the
verb): without TEACHER the job runs the commands it always ran, in runs/main; with TEACHER it
distils the training set (beam 5, the job's threads, the first QUICK_KD_PAIRS pairs in --quick)
into a dataset named after the teacher, trains on it in runs of their own, and evaluates on the
real data; runs with and without a teacher, or with another teacher, never resume each other's.
DESIGN picks the NLL config and names the runs; THREADS reaches every verb.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Stands in for .venv/bin/fadat: logs its arguments, and writes what the job reads next.
STUB_FADAT = r"""#!/usr/bin/env bash
set -eu
printf '%s\n' "$*" >> "$FADAT_LOG"
out=""; run=""; prev=""
for a in "$@"; do
    case "$prev" in --output) out=$a ;; --run-dir) run=$a ;; esac
    prev=$a
done
case "$1" in
    prepare)
        if [ "${2:-}" = --help ]; then echo "corpora: bible-en-es synth-multimodal"; exit 0; fi
        mkdir -p "$out/raw"; echo '{}' > "$out/meta.json"
        printf 'one\ntwo\nthree\n' > "$out/raw/test.src.txt" ;;
    distill) mkdir -p "$out"; echo '{}' > "$out/meta.json"; echo "stub statistics of $out" ;;
    train) if [ -n "$run" ]; then mkdir -p "$run"; fi ;;
    average) mkdir -p "$out"; echo '{}' > "$out/config.json" ;;
    translate) printf 'uno\ndos\ntres\n' > "$out" ;;
esac
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the job in a directory of its own, with a set-up that does nothing, the stub
    fadat, and a python that reports a passed learning check (valid BLEU 97.0)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "main-job.sh", tmp_path / "scripts" / "main-job.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("true\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "fadat").write_text(STUB_FADAT)
    (bin_dir / "python").write_text("#!/usr/bin/env bash\necho 97.0\n")
    for name in ("fadat", "python"):
        (bin_dir / name).chmod(0o755)
    return tmp_path


def teacher(root: Path, name: str, weights: bytes) -> tuple[Path, str]:
    """A teacher directory (only its weights matter to the job) and the first 8 hex digits of
    their SHA-256."""
    directory = root / "teachers" / name
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(weights)
    return directory, hashlib.sha256(weights).hexdigest()[:8]


def run_job(root: Path, *args: str, code: int = 0, **env: str) -> tuple[list[list[str]], str]:
    """The job's fadat command lines (each split into words) and its output."""
    log = root / f"fadat-{len(list(root.glob('fadat-*.log')))}.log"
    log.touch()
    chosen = ("TEACHER", "THREADS", "DESIGN", "KD_BEAM")  # the job's knobs: only from **env
    full_env = {k: v for k, v in os.environ.items() if k not in chosen}
    full_env.update(FADAT_LOG=str(log), **env)
    proc = subprocess.run(
        ["bash", "scripts/main-job.sh", *args],
        cwd=root,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line.split() for line in log.read_text().splitlines()], proc.stdout + proc.stderr


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def verbs(commands: list[list[str]], verb: str) -> list[list[str]]:
    return [c for c in commands if c[0] == verb]


def test_without_a_teacher_the_job_is_the_raw_one(root):
    commands, output = run_job(root, THREADS="1")
    assert [c[0] for c in commands] == [
        "prepare", "train", "average", "train", "average", "translate", "evaluate"
    ]  # fmt: skip
    nll, fuzzy = verbs(commands, "train")
    assert (flag(nll, "--run-dir"), flag(fuzzy, "--run-dir")) == (
        "runs/main/nll",
        "runs/main/fuzzy",
    )
    assert flag(nll, "--data") == flag(fuzzy, "--data") == "data/bible-en-es"
    assert flag(fuzzy, "--init-from") == "runs/main/nll-model"
    evaluate = verbs(commands, "evaluate")[0]
    assert evaluate[2:4] == ["runs/main/nll-model", "runs/main/fadat-model"]
    assert flag(evaluate, "--data") == "data/bible-en-es"
    assert "distil" not in output and "trained on" not in output


def test_quick_translates_and_evaluates_the_first_subset_sentences(root):
    """--quick is a smoke test kept within CI's budget: translate reads the first SUBSET test
    sentences (the ones evaluate scores), not the whole test set; the full job reads them all."""
    commands, _ = run_job(root, "--quick", THREADS="1", SUBSET="2")
    translate = verbs(commands, "translate")[0]
    first = root / flag(translate, "--input")
    assert first.parent == root / "runs" / "main-quick"
    assert first.read_text() == "one\ntwo\n"
    evaluate = verbs(commands, "evaluate")[0]
    assert (flag(evaluate, "--subset"), flag(evaluate, "--warmup")) == ("2", "2")
    commands, _ = run_job(root, THREADS="1")
    translate = verbs(commands, "translate")[0]
    assert flag(translate, "--input") == "data/bible-en-es/raw/test.src.txt"
    assert flag(verbs(commands, "evaluate")[0], "--warmup") == "20"


def test_the_teacher_distils_and_the_stages_train_on_its_data(root):
    at, digest = teacher(root, "at-cpu-small", b"weights")
    commands, output = run_job(root, THREADS="1", TEACHER=str(at))
    assert [c[0] for c in commands] == [
        "prepare", "distill", "train", "average", "train", "average", "translate", "evaluate"
    ]  # fmt: skip
    kd, runs = f"data/bible-en-es-kd-at-cpu-small-{digest}", f"runs/main-kd-at-cpu-small-{digest}"
    distill = verbs(commands, "distill")[0]
    assert distill[1:] == [
        "--model", str(at), "--data", "data/bible-en-es", "--output", kd,
        "--beam", "5", "--engine", "auto", "--threads", "1",
    ]  # fmt: skip
    nll, fuzzy = verbs(commands, "train")
    assert (flag(nll, "--run-dir"), flag(fuzzy, "--run-dir")) == (f"{runs}/nll", f"{runs}/fuzzy")
    assert flag(nll, "--data") == flag(fuzzy, "--data") == kd
    assert flag(fuzzy, "--init-from") == f"{runs}/nll-kd-model"
    # The final table's rows are named after the distilled data; the test set is the real one.
    evaluate = verbs(commands, "evaluate")[0]
    assert evaluate[2:4] == [f"{runs}/nll-kd-model", f"{runs}/fadat-kd-model"]
    assert flag(evaluate, "--data") == "data/bible-en-es"
    translate = verbs(commands, "translate")[0]
    assert flag(translate, "--input") == "data/bible-en-es/raw/test.src.txt"
    assert f"stub statistics of {kd}" in output
    assert "   distillation stage: " in output
    assert (
        f"nll-kd-model, fadat-kd-model: trained on {kd}, training targets translated by" in output
    )


def test_quick_distils_a_prefix_with_the_jobs_threads(root):
    at, digest = teacher(root, "at", b"weights")
    commands, output = run_job(root, "--quick", TEACHER=str(at), QUICK_KD_PAIRS="7")
    distill = verbs(commands, "distill")[0]
    kd = f"data/bible-en-es-kd7-at-{digest}"
    assert flag(distill, "--output") == kd and flag(distill, "--max-pairs") == "7"
    # THREADS unset: all the cores the job may use
    assert flag(distill, "--threads") == str(len(os.sched_getaffinity(0)))
    runs = f"runs/main-quick-kd7-at-{digest}"
    # the learning check does not depend on the Bible data: the raw quick run's, shared
    assert {flag(c, "--run-dir") for c in verbs(commands, "train")} == {
        "runs/main-quick/learn",
        f"{runs}/nll",
        f"{runs}/fuzzy",
    }
    assert "(its first 7 pairs only)" in output


def test_runs_with_and_without_a_teacher_never_resume_each_other(root):
    """Each job finds its own runs: with another teacher (other weights, same name) or none, the
    training stages run again; the same teacher again finds its stages finished."""
    first, digest_1 = teacher(root, "at", b"weights 1")
    second = root / "elsewhere" / "at"
    second.parent.mkdir()
    shutil.copytree(first, second)
    (second / "model.safetensors").write_bytes(b"weights 2")
    digest_2 = hashlib.sha256(b"weights 2").hexdigest()[:8]
    trained = {}
    for name, env in (
        ("raw", {}),
        ("first", {"TEACHER": str(first)}),
        ("second", {"TEACHER": str(second)}),
        ("first again", {"TEACHER": str(first)}),
        ("raw again", {}),
    ):
        commands, _ = run_job(root, THREADS="1", **env)
        trained[name] = [flag(c, "--data") for c in verbs(commands, "train")]
    assert trained["raw"] == ["data/bible-en-es"] * 2
    assert trained["first"] == [f"data/bible-en-es-kd-at-{digest_1}"] * 2
    assert trained["second"] == [f"data/bible-en-es-kd-at-{digest_2}"] * 2
    assert trained["first again"] == trained["raw again"] == []


def test_a_teacher_without_weights_stops_the_job_before_anything_runs(root):
    commands, output = run_job(root, code=2, TEACHER=str(root / "missing"))
    assert commands == []
    assert f"TEACHER={root / 'missing'} holds no model.safetensors" in output


def test_the_jobs_threads_reach_translate_and_evaluate(root):
    """THREADS=1 is one thread for every stage, the translation and the evaluation included (their
    own defaults would use more)."""
    commands, _ = run_job(root, THREADS="1")
    for verb in ("train", "translate", "evaluate"):
        assert {flag(c, "--threads") for c in verbs(commands, verb)} == {"1"}, verb


def test_a_design_trains_its_config_in_runs_of_its_own(root):
    (root / "configs").mkdir()
    for name in ("dat-cpu-small-nll.yaml", "dat-cpu-small-5x1-nll.yaml"):
        (root / "configs" / name).write_text("arch: dat\n")
    commands, output = run_job(root, THREADS="1", DESIGN="5x1")
    nll, fuzzy = verbs(commands, "train")
    assert flag(nll, "--config") == "configs/dat-cpu-small-5x1-nll.yaml"
    assert (flag(nll, "--run-dir"), flag(fuzzy, "--run-dir")) == (
        "runs/main-5x1/nll",
        "runs/main-5x1/fuzzy",
    )
    assert flag(fuzzy, "--init-from") == "runs/main-5x1/nll-model"
    assert "configs/dat-cpu-small-5x1-nll.yaml" in output
    # the default design trains the 3+3 config in runs/main; the learning check is shared
    commands, _ = run_job(root, THREADS="1")
    assert flag(verbs(commands, "train")[0], "--config") == "configs/dat-cpu-small-nll.yaml"
    commands, _ = run_job(root, "--quick", THREADS="1", DESIGN="5x1")
    assert [flag(c, "--run-dir") for c in verbs(commands, "train")] == [
        "runs/main-quick/learn",
        "runs/main-quick-5x1/nll",
        "runs/main-quick-5x1/fuzzy",
    ]


@pytest.mark.parametrize("design", ["7x0", "../configs/dat-cpu-small", ""])
def test_an_unknown_design_stops_the_job_before_anything_runs(root, design):
    (root / "configs").mkdir()
    (root / "configs" / "dat-cpu-small-5x1-nll.yaml").write_text("arch: dat\n")
    (root / "configs" / "dat-cpu-small-nll.yaml").write_text("arch: dat\n")
    if not design:  # empty: the default design
        commands, _ = run_job(root, THREADS="1", DESIGN=design)
        assert flag(verbs(commands, "train")[0], "--config") == "configs/dat-cpu-small-nll.yaml"
        return
    commands, output = run_job(root, code=2, DESIGN=design)
    assert commands == []
    assert f"DESIGN={design}: no configs/dat-cpu-small-{design}-nll.yaml (designs: 5x1)" in output


def test_a_distillation_beam_names_its_data_and_runs(root):
    at, digest = teacher(root, "at", b"weights")
    commands, _ = run_job(root, THREADS="1", TEACHER=str(at), KD_BEAM="1")
    distill = verbs(commands, "distill")[0]
    assert flag(distill, "--beam") == "1"
    kd = f"data/bible-en-es-kd-beam1-at-{digest}"
    assert flag(distill, "--output") == kd
    nll, _ = verbs(commands, "train")
    assert flag(nll, "--data") == kd
    assert flag(nll, "--run-dir") == f"runs/main-kd-beam1-at-{digest}/nll"


@pytest.mark.parametrize("beam", ["0", "five", "1/2"])
def test_a_bad_distillation_beam_stops_the_job_before_anything_runs(root, beam):
    at, _ = teacher(root, "at", b"weights")
    commands, output = run_job(root, code=2, TEACHER=str(at), KD_BEAM=beam)
    assert commands == []
    assert f"KD_BEAM={beam}: the beam size must be a positive integer" in output
