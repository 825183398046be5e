"""``fadat snapshot`` (a compact copy of a run: float16 weights, no optimizer state) and
``fadat train --resume RUN --reset-optimizer``, on the training tests' copy task (tiny DAT, one
thread, a few updates):

- the copy's checkpoint_last holds float16 weights and no optimizer state; its size is the
  fp16 weights plus a small overhead (RNG states, configs), about 1/6 of the full checkpoint;
- the copy continued with --reset-optimizer trains exactly as the full checkpoint continued
  with --reset-optimizer after rounding its weights to float16 (update numbers, LR, losses,
  data position, RNG, final weights: all identical), and within a stated tolerance of the full
  checkpoint continued without rounding (only the fp16 rounding differs);
- the copy resumed without --reset-optimizer exits 2 with one line naming the file and the flag;
  --reset-optimizer on a full checkpoint drops its moments and says so in train.log and
  train_log.jsonl; AdamW's step counts restart with the moments;
- output rules: never the run itself or inside it, never a directory fadat did not create (with
  or without --force), an existing copy only with --force;
- the dataset at another path (``--resume RUN --data DIR``): checkpoint_last records the
  dataset's digest (the sha256 of the files a run reads, ``training_digest``) and a copy carries
  it (or computes it for an older checkpoint); a run resumed with its data moved (the original
  gone) trains bit for bit as the same resume at the original path; the digest ignores
  meta.json (whose build cache key changes with fadat's data code) and is the same for the corpus
  prepared twice, but one token id, one byte of spm.model or one reference line changes it;
  another dataset (given, or rebuilt in place at the saved path) exits 2 naming both digests and
  leaves the run untouched; a checkpoint without a digest resumes at its saved path, and
  elsewhere only where the saved path's dataset can be compared.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from copy_task import prepare_copy_data

from fadat.cli import main
from fadat.data.binarized import training_digest

LAST = "checkpoint_last.pt"
#: The run of every test: a tiny DAT, 4 updates, then continued to 7.
COMMON = [
    "--arch", "dat", "--preset", "tiny", "--max-tokens", "250", "--validate-every", "2",
    "--valid-subset", "4", "--threads", "1", "--no-progress-bar", "--seed", "3",
]  # fmt: skip
FIRST, TOTAL = 4, 7
#: |loss(full weights) − loss(weights rounded to fp16)| per update over the 3 continued updates
#: (losses ≈ 2.6; measured ≤ 4.2e-6 on this tiny model: fp16 keeps 11 significant bits, a
#: relative error ≤ 4.9e-4 per weight, which mostly averages out in the loss).
LOSS_TOL = 1e-4


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(copy_data, tmp_path_factory) -> Path:
    """A run of FIRST updates (read-only to the tests: copy it to continue it)."""
    run = tmp_path_factory.mktemp("snap") / "run"
    args = ["train", "--data", str(copy_data), "--run-dir", str(run), "--max-updates", str(FIRST)]
    assert main([*args, *COMMON]) == 0
    assert list(run.glob("checkpoint_best_u*.pt"))
    return run


def _copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _continue(run: Path, *extra: str) -> int:
    return main(["train", "--resume", str(run), "--max-updates", str(TOTAL), *extra])


def test_compact_copy_has_fp16_weights_no_optimizer_and_its_size(trained, tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(out)]) == 0
    assert "--reset-optimizer" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [".fadat-output.json", "best.json", LAST, "config.yaml", "train.log", "train_log.jsonl",
         "valid_log.jsonl"]
    )  # fmt: skip
    assert (out / "config.yaml").read_bytes() == (trained / "config.yaml").read_bytes()
    assert (out / "train_log.jsonl").read_bytes() == (trained / "train_log.jsonl").read_bytes()
    full = torch.load(trained / LAST, weights_only=True)
    light = torch.load(out / LAST, weights_only=True)
    assert "optimizer" not in light and light["optimizer_reset_required"] is True
    assert light["weights_dtype"] == "float16"
    assert {v.dtype for v in light["model"].values()} == {torch.float16}
    for name, value in full["model"].items():
        assert torch.equal(light["model"][name], value.half()), name
    for key in ("progress", "scheduler", "scaler", "train_config", "model_config", "world_size"):
        assert light[key] == full[key], key
    for key, value in full["rng"][0].items():
        assert torch.equal(light["rng"][0][key], value), key
    # best.json keeps the list; the checkpoints it names are not copied
    assert json.loads((out / "best.json").read_text())["checkpoints"] == full["progress"]["best"]
    params = sum(v.numel() for v in full["model"].values())
    fp16_bytes = 2 * params
    light_size, full_size = (out / LAST).stat().st_size, (trained / LAST).stat().st_size
    # the fp16 weights plus ≤ 64 kB (RNG states ≈ 15 kB, configs, zip records); the full file
    # holds 12 bytes per parameter (fp32 weights, AdamW's two moments)
    assert fp16_bytes < light_size < fp16_bytes + 64_000, (light_size, fp16_bytes)
    assert full_size > 12 * params
    assert light_size < full_size / 4


def test_continued_copy_matches_the_full_checkpoint_reset_with_rounded_weights(trained, tmp_path):
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy)]) == 0
    full = _copy_run(trained, tmp_path / "full")
    rounded = _copy_run(trained, tmp_path / "rounded")
    state = torch.load(rounded / LAST, weights_only=True)
    state["model"] = {k: v.half().float() for k, v in state["model"].items()}
    torch.save(state, rounded / LAST)
    for run in (copy, full, rounded):
        assert _continue(run, "--reset-optimizer") == 0
    new = {run.name: _records(run)[FIRST:] for run in (copy, full, rounded)}
    assert [r["update"] for r in new["copy"]] == list(range(FIRST + 1, TOTAL + 1))
    # same update numbers and learning rates in all three; the first update says "reset"
    for name in ("full", "rounded"):
        assert [(r["update"], r["lr"]) for r in new[name]] == [
            (r["update"], r["lr"]) for r in new["copy"]
        ]
    assert [r.get("optimizer_reset", False) for r in new["copy"]] == [True, False, False]
    # the copy is the full checkpoint with its weights rounded to fp16, nothing else: the same
    # losses, data position, RNG and weights, bit for bit
    assert [r["loss"] for r in new["copy"]] == [r["loss"] for r in new["rounded"]]
    end_copy = torch.load(copy / LAST, weights_only=True)
    end_rounded = torch.load(rounded / LAST, weights_only=True)
    # (the best list aside: the copy's restarted empty, see below)
    own = ("best", "earlier_best_bleu", "elapsed")  # elapsed: wall-clock seconds
    assert {k: v for k, v in end_copy["progress"].items() if k not in own} == {
        k: v for k, v in end_rounded["progress"].items() if k not in own
    }
    assert end_copy["progress"]["earlier_best_bleu"] == max(
        b["bleu"] for b in torch.load(trained / LAST, weights_only=True)["progress"]["best"]
    )
    for name, value in end_rounded["model"].items():
        assert end_copy["model"][name].dtype == torch.float32  # trains in fp32 again
        assert torch.equal(end_copy["model"][name], value), name
    for key, value in end_rounded["rng"][0].items():
        assert torch.equal(end_copy["rng"][0][key], value), key
    # against the unrounded weights, only the fp16 rounding differs
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(new["copy"], new["full"], strict=True)]
    assert max(diffs) < LOSS_TOL, diffs
    assert diffs != [0.0] * len(diffs)  # the rounding is there (the comparison can fail)
    # the copy's best list restarted: best.json names only checkpoints that exist
    listed = json.loads((copy / "best.json").read_text())["checkpoints"]
    assert listed and all((copy / b["file"]).is_file() and b["update"] > FIRST for b in listed)
    log = (copy / "train.log").read_text()
    assert f"optimizer reset at update {FIRST}: {LAST} is a compact copy" in log
    assert "are not kept in a compact copy" in log
    # once continued, checkpoint_last is a full one again
    assert "optimizer" in end_copy and "optimizer_reset_required" not in end_copy


def test_final_line_gives_the_best_bleu_from_before_the_copy(trained, tmp_path, capsys):
    """The best list restarts empty in a copy; the final line still reports the run's best."""
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy)]) == 0
    state = torch.load(copy / LAST, weights_only=True)
    state["progress"]["best"][0]["bleu"] = 99.0  # above anything the tiny model validates
    torch.save(state, copy / LAST)
    capsys.readouterr()
    assert _continue(copy, "--reset-optimizer") == 0
    out = capsys.readouterr().out
    kept = json.loads((copy / "best.json").read_text())["checkpoints"][0]["bleu"]
    assert "best BLEU 99.00 (before the compact copy it continued from; the best kept " in out
    assert f"checkpoint's {kept:.2f})" in out
    # without a copy, the line is the best kept checkpoint's, as before
    full = _copy_run(trained, tmp_path / "full")
    assert _continue(full) == 0
    best = json.loads((full / "best.json").read_text())["checkpoints"][0]["bleu"]
    assert f"best BLEU {best:.2f}; run directory" in capsys.readouterr().out


def test_copy_without_reset_optimizer_exits_2(trained, tmp_path, capsys):
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy)]) == 0
    capsys.readouterr()
    before = (copy / LAST).read_bytes()
    assert _continue(copy) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert str(copy / LAST) in err and "--reset-optimizer" in err, err
    assert (copy / LAST).read_bytes() == before
    # --reset-optimizer without --resume
    fresh = ["train", "--data", "x", "--run-dir", str(tmp_path / "new"), "--reset-optimizer"]
    assert main(fresh) == 2
    assert "--resume" in capsys.readouterr().err


def test_reset_optimizer_on_a_full_checkpoint_drops_the_moments(trained, tmp_path):
    run = _copy_run(trained, tmp_path / "run")
    saved_step = torch.load(run / LAST, weights_only=True)["optimizer"]["state"][0]["step"]
    assert float(saved_step) == FIRST
    assert main(["train", "--resume", str(run), "--max-updates", str(FIRST + 1),
                 "--reset-optimizer"]) == 0  # fmt: skip
    end = torch.load(run / LAST, weights_only=True)
    assert end["progress"]["update"] == FIRST + 1
    # AdamW restarted: one step since its moments were zero (bias correction of step 1), while
    # the learning rate is the schedule's at update FIRST + 1
    assert float(end["optimizer"]["state"][0]["step"]) == 1
    records = _records(run)
    assert records[-1]["update"] == FIRST + 1 and records[-1]["optimizer_reset"] is True
    from fadat.training.schedule import inverse_sqrt_lr

    sched = end["scheduler"]
    lr = inverse_sqrt_lr(FIRST + 1, sched["lr"], sched["warmup"], sched["warmup_init_lr"])
    assert records[-1]["lr"] == lr
    log = (run / "train.log").read_text()
    assert f"optimizer reset at update {FIRST}: the optimizer state of {LAST} is dropped" in log


def test_output_rules(trained, tmp_path, capsys):
    def refused(*args: str) -> str:
        assert main(["snapshot", "--run", str(trained), *args]) == 2
        return capsys.readouterr().err

    # the run itself, a directory inside it
    assert "is the --run" in refused("--output", str(trained))
    assert "lies inside the --run" in refused("--output", str(trained / "copy"))
    assert not (trained / "copy").exists()
    # a directory that fadat did not create, with or without --force
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    for force in ([], ["--force"]):
        assert "fadat did not create" in refused("--output", str(foreign), *force)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    # an existing copy: only with --force (a trailing slash names the same directory)
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", f"{copy}/"]) == 0
    assert "pass --force" in refused("--output", str(copy))
    assert main(["snapshot", "--run", str(trained), "--output", str(copy), "--force"]) == 0
    # a run with files of its own (checkpoints, tensorboard) is not replaced, --force or not
    other = _copy_run(trained, tmp_path / "other")
    assert "fadat did not write there" in refused("--output", str(other), "--force")
    # not a run
    assert main(["snapshot", "--run", str(foreign), "--output", str(tmp_path / "y")]) == 2
    assert "checkpoint_last.pt does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------ --with-best


def test_with_best_keeps_the_best_checkpoints_in_fp16(trained, tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(out), "--with-best"]) == 0
    listed = json.loads((trained / "best.json").read_text())["checkpoints"]
    assert len(listed) == 2  # validations at updates 2 and 4
    assert f"{len(listed)} best checkpoint(s)" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("checkpoint_best_u*.pt")) == sorted(
        b["file"] for b in listed
    )
    assert json.loads((out / "best.json").read_text())["checkpoints"] == listed
    for entry in listed:
        full = torch.load(trained / entry["file"], weights_only=True)
        light = torch.load(out / entry["file"], weights_only=True)
        assert light["weights_dtype"] == "float16"
        for name, value in full["model"].items():
            assert torch.equal(light["model"][name], value.half()), name
        for key in ("bleu", "update", "model_config", "arch", "data"):
            assert light[key] == full[key], key
        # 2 bytes per parameter and a small overhead, against 4
        params = sum(v.numel() for v in full["model"].values())
        size = (out / entry["file"]).stat().st_size
        assert 2 * params < size < 2 * params + 64_000, (size, params)


def test_with_best_continued_keeps_the_list_and_averages_the_same_checkpoints(
    trained, copy_data, tmp_path
):
    from fadat.training.checkpoints import average_checkpoints, best_checkpoints

    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy), "--with-best"]) == 0
    listed = json.loads((trained / "best.json").read_text())["checkpoints"]
    # the average of the copy's best checkpoints is the run's with each weight rounded to fp16,
    # averaged in float64, written in float32
    averaged, _ = average_checkpoints(best_checkpoints(copy, len(listed)))
    originals = [torch.load(trained / b["file"], weights_only=True)["model"] for b in listed]
    for name, value in averaged.items():
        expected = sum(o[name].half().double() for o in originals) / len(originals)
        assert value.dtype == torch.float32, name
        assert torch.equal(value, expected.float()), name
    model = tmp_path / "model"
    argv = ["average", "--run", str(copy), "--best", str(len(listed)), "--data", str(copy_data)]
    assert main([*argv, "--output", str(model)]) == 0
    assert (model / "model.safetensors").is_file()
    # continued, the run keeps its best list: nothing is dropped, nothing said about it
    assert _continue(copy, "--reset-optimizer") == 0
    end = torch.load(copy / LAST, weights_only=True)["progress"]
    assert end["earlier_best_bleu"] is None
    now = json.loads((copy / "best.json").read_text())["checkpoints"]
    assert now == end["best"]
    assert all((copy / b["file"]).is_file() for b in now)
    # the list holds 5 (keep_best): the 2 from before the copy and the new validations (at
    # updates 6 and the end, 7) all fit
    assert [b for b in now if b["update"] <= FIRST] == listed
    assert sorted(b["update"] for b in now if b["update"] > FIRST) == [6, 7]
    assert "not kept in a compact copy" not in (copy / "train.log").read_text()


def test_with_best_refuses_a_best_checkpoint_that_is_gone(trained, tmp_path, capsys):
    run = _copy_run(trained, tmp_path / "run")
    gone = json.loads((run / "best.json").read_text())["checkpoints"][-1]["file"]
    (run / gone).unlink()  # as if a validation had replaced it after the last checkpoint
    out = tmp_path / "copy"
    assert main(["snapshot", "--run", str(run), "--output", str(out), "--with-best"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert str(run / gone) in err and "make the copy again after its next checkpoint" in err, err
    assert not out.exists()
    # without --with-best the copy is made, and continued it says what it lacks
    assert main(["snapshot", "--run", str(run), "--output", str(out)]) == 0
    assert _continue(out, "--reset-optimizer") == 0
    log = (out / "train.log").read_text()
    assert "2 of the 2 best checkpoint(s) listed in checkpoint_last.pt" in log


# ------------------------------------------------------------------ the data at another path


def _files(run: Path) -> dict[str, str]:
    """sha256 of every file of the run directory but its lock (which holds the PID of the last
    trainer that took it: :mod:`fadat.outputs`)."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".fadat-output.lock"
    }


def _run_on_own_data(copy_data: Path, root: Path, updates: int) -> tuple[Path, Path]:
    """A run trained ``updates`` updates on a copy of the data of its own (``root/data``), so
    that a test may move, delete or rebuild it: ``(run, data)``."""
    data = shutil.copytree(copy_data, root / "data")
    run = root / "run"
    args = ["train", "--data", str(data), "--run-dir", str(run), "--max-updates", str(updates)]
    assert main([*args, *COMMON]) == 0
    return run, data


def _without_digest(run: Path) -> None:
    """Make checkpoint_last as written before fadat recorded the dataset's digest."""
    state = torch.load(run / LAST, weights_only=True)
    del state["data_digest"]
    torch.save(state, run / LAST)


def test_checkpoint_and_copy_record_the_dataset_digest(trained, copy_data, tmp_path):
    expected = training_digest(copy_data)
    assert torch.load(trained / LAST, weights_only=True)["data_digest"] == expected
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy)]) == 0
    assert torch.load(copy / LAST, weights_only=True)["data_digest"] == expected
    # a checkpoint written before fadat recorded it: the copy takes the digest of the run's data
    # directory, which is here
    old = _copy_run(trained, tmp_path / "old")
    _without_digest(old)
    assert main(["snapshot", "--run", str(old), "--output", str(tmp_path / "old-copy")]) == 0
    assert torch.load(tmp_path / "old-copy" / LAST, weights_only=True)["data_digest"] == expected


def test_copy_continues_with_the_dataset_at_another_path(trained, copy_data, tmp_path):
    """The README's recipe: a copy made where the run trained, continued where the same dataset
    was prepared at another path."""
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(trained), "--output", str(copy)]) == 0
    elsewhere = shutil.copytree(copy_data, tmp_path / "elsewhere")
    assert _continue(copy, "--reset-optimizer", "--data", str(elsewhere)) == 0
    assert _records(copy)[-1]["update"] == TOTAL
    assert f"data: {elsewhere}\n" in (copy / "config.yaml").read_text()
    state = torch.load(copy / LAST, weights_only=True)
    assert state["train_config"]["data"] == str(elsewhere)
    assert state["data_digest"] == training_digest(copy_data)


def test_resume_with_the_data_moved_is_the_resume_at_its_original_path(copy_data, tmp_path):
    run, data = _run_on_own_data(copy_data, tmp_path, FIRST)
    at_original = _copy_run(run, tmp_path / "at-original")
    assert _continue(at_original) == 0
    moved = data.rename(tmp_path / "moved")  # the original path is gone
    assert _continue(run) == 2  # (its config names the gone path)
    assert _continue(run, "--data", str(moved)) == 0
    assert f"data: {moved}\n" in (run / "config.yaml").read_text()
    assert [r["loss"] for r in _records(run)] == [r["loss"] for r in _records(at_original)]
    end, reference = (torch.load(r / LAST, weights_only=True) for r in (run, at_original))
    assert end["progress"]["update"] == TOTAL
    assert end["train_config"]["data"] == str(moved)
    assert end["data_digest"] == reference["data_digest"] == training_digest(moved)
    for name, value in reference["model"].items():
        assert torch.equal(end["model"][name], value), name
    for name, value in reference["optimizer"]["state"][0].items():
        assert torch.equal(end["optimizer"]["state"][0][name], value), name
    for key, value in reference["rng"][0].items():
        assert torch.equal(end["rng"][0][key], value), key
    # from now on the run reads the new path without --data
    assert main(["train", "--resume", str(run), "--max-updates", str(TOTAL + 1)]) == 0


def test_resume_on_another_dataset_exits_2_and_leaves_the_run(
    trained, copy_data, copy_data_repeats, tmp_path, capsys
):
    run = _copy_run(trained, tmp_path / "run")
    before = _files(run)
    assert _continue(run, "--data", str(copy_data_repeats)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "holds another dataset than the run trained on" in err, err
    for part in (
        str(run / LAST),
        str(copy_data_repeats),
        training_digest(copy_data)[:12],
        training_digest(copy_data_repeats)[:12],
    ):
        assert part in err, (part, err)
    assert _files(run) == before


def test_data_rebuilt_in_place_is_refused(copy_data, copy_data_repeats, tmp_path, capsys):
    """The directory at the run's own path now holds another dataset (prepared again with other
    inputs): a plain resume, which read it silently before, exits 2."""
    run, data = _run_on_own_data(copy_data, tmp_path, 1)
    shutil.rmtree(data)
    shutil.copytree(copy_data_repeats, data)
    before = _files(run)
    assert _continue(run) == 2
    err = capsys.readouterr().err
    assert f"data directory {data} holds another dataset" in err, err
    assert training_digest(copy_data)[:12] in err and training_digest(copy_data_repeats)[:12] in err
    assert _files(run) == before


def test_checkpoint_without_digest(trained, copy_data, copy_data_repeats, tmp_path, capsys):
    """Written before fadat recorded the dataset: resumed at its saved path as before (and
    recording the digest from then on); elsewhere only when the saved path's dataset is there
    to compare with."""
    same = _copy_run(trained, tmp_path / "same")
    _without_digest(same)
    assert main(["train", "--resume", str(same), "--max-updates", str(FIRST + 1)]) == 0
    state = torch.load(same / LAST, weights_only=True)
    assert state["data_digest"] == training_digest(copy_data)
    # another path, the saved one still there: compared with its dataset
    moved = _copy_run(trained, tmp_path / "moved")
    _without_digest(moved)
    elsewhere = shutil.copytree(copy_data, tmp_path / "elsewhere")
    before = _files(moved)
    assert _continue(moved, "--data", str(copy_data_repeats)) == 2
    err = capsys.readouterr().err
    assert "holds another dataset than the run trained on" in err
    assert f"for {copy_data}, the data directory {moved / LAST} saved" in err, err
    assert _files(moved) == before
    assert main(["train", "--resume", str(moved), "--max-updates", str(FIRST + 1),
                 "--data", str(elsewhere)]) == 0  # fmt: skip


def test_checkpoint_without_digest_and_its_data_gone(copy_data, tmp_path, capsys):
    run, data = _run_on_own_data(copy_data, tmp_path, 1)
    _without_digest(run)
    moved = data.rename(tmp_path / "moved")
    before = _files(run)
    assert _continue(run, "--data", str(moved)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"{run / LAST} does not record which dataset the run trained on" in err, err
    assert f"data directory {moved} cannot be verified" in err and f"{data}, which is gone" in err
    assert "fadat snapshot" in err
    assert _files(run) == before
    # a copy made here cannot record it either, and says so
    copy = tmp_path / "copy"
    assert main(["snapshot", "--run", str(run), "--output", str(copy)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("fadat: warning: ") and "does not record it either" in err, err
    assert torch.load(copy / LAST, weights_only=True)["data_digest"] is None
    # with the data back at the saved path, the copy records it
    moved.rename(data)
    assert main(["snapshot", "--run", str(run), "--output", str(copy), "--force"]) == 0
    assert torch.load(copy / LAST, weights_only=True)["data_digest"] == training_digest(data)


def test_the_digest_ignores_meta_json(trained, copy_data, tmp_path):
    """The point of the digest: the same dataset prepared by a later fadat, whose data-building
    code changed, has another meta.json "fingerprint" (the build cache key) but the same
    training files, and a run resumes on it with --data."""
    elsewhere = shutil.copytree(copy_data, tmp_path / "elsewhere")
    meta = json.loads((elsewhere / "meta.json").read_text())
    assert meta["fingerprint"] != "0" * 64
    meta["fingerprint"] = "0" * 64
    (elsewhere / "meta.json").write_text(json.dumps(meta))
    assert training_digest(elsewhere) == training_digest(copy_data)
    run = _copy_run(trained, tmp_path / "run")
    assert _continue(run, "--data", str(elsewhere)) == 0
    assert _records(run)[-1]["update"] == TOTAL


def _change_a_token_id(data: Path) -> None:
    ids = np.load(data / "train.tgt.ids.npy", mmap_mode="r+")
    ids[1] = 4 if ids[1] != 4 else 5  # the first target's first word (after <s>): another word
    ids.flush()


def _change_a_byte_of_spm_model(data: Path) -> None:
    """The lowest byte of the score of the piece "▁alpha" (a float: the model stays loadable)."""
    model = bytearray((data / "spm.model").read_bytes())
    # field 1 (the piece: 8 bytes, "▁" is 3 in UTF-8), then field 2 (its score, a float)
    piece = b"\n\x08" + "▁alpha".encode() + b"\x15"
    at = model.index(piece) + len(piece)
    model[at] ^= 1
    (data / "spm.model").write_bytes(bytes(model))


def _change_a_reference_line(data: Path) -> None:
    lines = (data / "raw" / "valid.ref.txt").read_text(encoding="utf-8").splitlines()
    lines[0] = "omega " + lines[0]
    (data / "raw" / "valid.ref.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    "change", [_change_a_token_id, _change_a_byte_of_spm_model, _change_a_reference_line]
)
def test_one_changed_training_file_is_another_dataset(change, trained, copy_data, tmp_path, capsys):
    other = shutil.copytree(copy_data, tmp_path / "other")
    change(other)
    assert training_digest(other) != training_digest(copy_data)
    run = _copy_run(trained, tmp_path / "run")
    before = _files(run)
    assert _continue(run, "--data", str(other)) == 2
    err = capsys.readouterr().err
    assert f"data directory {other} holds another dataset than the run trained on" in err, err
    assert training_digest(other)[:12] in err and training_digest(copy_data)[:12] in err
    assert _files(run) == before


def test_the_same_corpus_prepared_twice_has_one_digest(copy_data, tmp_path):
    again = prepare_copy_data(tmp_path, repeats=False)
    assert again != copy_data
    assert training_digest(again) == training_digest(copy_data)
