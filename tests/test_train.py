"""End-to-end tests of ``fadat train`` / ``fadat average`` on a copy task built with the real
``fadat prepare`` (word-level sentencepiece, vocabulary 12):

- a tiny DAT and a tiny AT model learn to copy held-out sentences exactly;
- a run killed with SIGKILL at a random update and resumed logs the same per-update losses as an
  uninterrupted run; Ctrl-C writes a clean checkpoint and exits 130;
- a 2-process torchrun run (gloo) across an epoch boundary with unequal shards matches a
  1-process run of the same global batches (losses and parameters, tol 1e-5);
- fuzzy fine-tuning from a model directory starts from its weights with a fresh optimizer;
- bad input (corrupt checkpoint, changed config on resume, unknown YAML key) exits 2.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fadat.cli import main
from fadat.data.batching import TokenBatchSampler
from fadat.data.binarized import BinarizedDataset, raw_sources
from fadat.data.spm import decode as spm_decode
from fadat.data.spm import load_sentencepiece
from fadat.decoding import decode
from fadat.models.config import make_config
from fadat.models.directory import load_pretrained
from fadat.objectives import ObjectiveConfig, compute_loss

PY = sys.executable


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "train_log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _train_cmd(*args: str) -> list[str]:
    return [PY, "-m", "fadat.cli", "train", *args]


# ------------------------------------------------------------------------ learning to copy


def _exact_copies(model_dir: Path, data: Path) -> tuple[int, int]:
    model = load_pretrained(model_dir)
    sp = load_sentencepiece(model_dir / "spm.model")
    valid = BinarizedDataset(data, "valid")
    sources = raw_sources(data, "valid")
    batch = valid.collate(list(range(len(valid))))
    with torch.no_grad():
        if model.config.model_type == "dat":
            gl = model.graph_lengths(batch.source_lengths, decoding=True)
            lp, links = model(batch.source, gl)
            outputs = [h.tokens for h in decode(lp, links, gl, "lookahead")]
        else:
            outputs = [h.tokens for h in model.greedy(batch.source)]
    hyps = [spm_decode(sp, toks) for toks in outputs]
    return sum(h == s for h, s in zip(hyps, sources, strict=True)), len(sources)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "updates"), [("dat", 500), ("at", 500)], ids=["dat", "at"])
def test_tiny_model_learns_copy_task_exactly(request, tmp_path, arch, updates):
    copy_data = request.getfixturevalue("copy_data" if arch == "dat" else "copy_data_repeats")
    run = tmp_path / "run"
    rc = main(
        [
            "train", "--data", str(copy_data), "--run-dir", str(run), "--arch", arch,
            "--preset", "tiny", "--lr", "5e-3", "--warmup", "10", "--max-tokens", "600",
            "--max-updates", str(updates), "--validate-every", "100",
            "--dropout", "0", "--clip-norm", "1", "--threads", "1", "--no-progress-bar",
            "--keep-best", "2",
            *(["--glat-p", "0.3"] if arch == "dat" else []),  # an AT does not glance
        ]
    )  # fmt: skip
    assert rc == 0
    best = json.loads((run / "best.json").read_text())["checkpoints"]
    assert len(best) == 2 and best[0]["bleu"] >= best[1]["bleu"]
    assert sorted(p.name for p in run.glob("checkpoint_best_*.pt")) == sorted(
        b["file"] for b in best
    )
    model_dir = tmp_path / "model"
    assert main(["average", "--run", str(run), "--best", "1", "--output", str(model_dir)]) == 0
    meta = json.loads((model_dir / "config.json").read_text())
    assert meta["data"]["licence"] and meta["training"]["averaged"] == [best[0]["file"]]
    exact, total = _exact_copies(model_dir, copy_data)
    assert exact == total, f"{exact}/{total} held-out sentences copied exactly"
    valid = [json.loads(line) for line in (run / "valid_log.jsonl").read_text().splitlines()]
    assert valid[-1]["valid_loss"] < valid[0]["valid_loss"]
    # the TensorBoard events and the resolved config are in the run directory
    assert list((run / "tensorboard").iterdir())
    assert "arch: " + arch in (run / "config.yaml").read_text()


# ------------------------------------------------------------------------------ resume


@pytest.mark.parametrize(
    "extra", [[], ["--upsample-ratio-range", "2", "4"]], ids=["fixed-lambda", "lambda-range"]
)
def test_sigkill_at_random_update_then_resume_reproduces_losses(copy_data, tmp_path, extra):
    common = [
        "--data", str(copy_data), "--arch", "dat", "--preset", "tiny", "--max-updates", "12",
        "--max-tokens", "300", "--update-freq", "2", "--save-every", "1", "--validate-every",
        "0", "--glat-p", "0.5:0.1@12", "--dropout", "0.1", "--lr", "3e-3", "--warmup", "4",
        "--threads", "1", "--no-progress-bar", "--seed", "3", *extra,
    ]  # fmt: skip
    # The uninterrupted run in this process (a process start costs more than its 12 updates);
    # the killed run and its resume each run in a fresh process, as after a real crash.
    full = tmp_path / "full"
    assert main(["train", "--run-dir", str(full), *common]) == 0
    reference = _losses(full)
    assert len(reference) == 12

    kill_at = random.randint(2, 10)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd("--run-dir", str(killed), *common), env=_env())
    ckpt = killed / "checkpoint_last.pt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if torch.load(ckpt, weights_only=True)["progress"]["update"] >= kill_at:
                break
        except (FileNotFoundError, RuntimeError, EOFError, KeyError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"run ended before the kill at {kill_at}"
    done = torch.load(ckpt, weights_only=True)["progress"]["update"]
    assert kill_at <= done < 12
    subprocess.run(_train_cmd("--resume", str(killed)), check=True, env=_env())
    assert _losses(killed) == reference, f"killed after update {done}"


def test_resumed_mid_epoch_run_sees_the_batches_of_an_uninterrupted_run(
    copy_data, tmp_path, monkeypatch
):
    from fadat.training import trainer as train_module

    seen: list[list[list[int]]] = []
    update = train_module.Trainer.train_update

    def recording(self, group, stop_flag):
        seen.append([list(b) for b in group])
        return update(self, group, stop_flag)

    monkeypatch.setattr(train_module.Trainer, "train_update", recording)
    common = [
        "--data", str(copy_data), "--arch", "dat", "--preset", "tiny", "--max-tokens", "250",
        "--update-freq", "2", "--validate-every", "0", "--valid-subset", "4", "--threads", "1",
        "--no-progress-bar", "--seed", "5",
    ]  # fmt: skip
    assert main(["train", "--run-dir", str(tmp_path / "full"), "--max-epochs", "2", *common]) == 0
    reference, seen[:] = list(seen), []
    per_epoch = len(reference) // 2
    assert per_epoch >= 4 and len(reference) == 2 * per_epoch
    run = tmp_path / "resumed"
    stops = [per_epoch // 2, per_epoch + 1, per_epoch + per_epoch // 2 + 1]  # all mid-epoch
    assert main(["train", "--run-dir", str(run), "--max-updates", str(stops[0]), *common]) == 0
    for stop in stops[1:]:
        assert main(["train", "--resume", str(run), "--max-updates", str(stop)]) == 0
        assert len(seen) == stop  # no update replayed
    assert main(["train", "--resume", str(run), "--max-updates", str(len(reference))]) == 0
    assert seen == reference
    assert sorted(i for group in reference[:per_epoch] for b in group for i in b) == list(
        range(len(BinarizedDataset(copy_data, "train")))
    )  # one epoch is every sentence once


def test_lambda_range_draws_of_a_resumed_run_are_those_of_the_uninterrupted_run(
    copy_data, tmp_path, monkeypatch
):
    """--upsample-ratio-range: a run stopped at updates 3 and 7 and resumed draws every
    sentence's graph size as the uninterrupted run does and logs the same losses; the sizes lie
    in [int(2 n), int(4 n)) (or are the target length), vary between sentences of one length,
    and differ with another seed."""
    from fadat.training import trainer as train_module

    drawn: list[tuple[int, list[int], list[int]]] = []
    collate = train_module.Trainer._collate

    def recording(self, indices):
        batch = collate(self, indices)
        drawn.append((self.progress.update, batch.ids.tolist(), batch.graph_lengths.tolist()))
        return batch

    monkeypatch.setattr(train_module.Trainer, "_collate", recording)

    def flags(seed: int) -> list[str]:
        return [
            "--data", str(copy_data), "--arch", "dat", "--preset", "tiny", "--max-tokens", "250",
            "--update-freq", "2", "--validate-every", "0", "--valid-subset", "4", "--threads",
            "1", "--no-progress-bar", "--seed", str(seed), "--upsample-ratio-range", "2", "4",
            "--lr", "3e-3", "--warmup", "4",
        ]  # fmt: skip

    common = flags(5)
    full = tmp_path / "full"
    assert main(["train", "--run-dir", str(full), "--max-updates", "10", *common]) == 0
    reference, drawn[:] = list(drawn), []
    run = tmp_path / "resumed"
    assert main(["train", "--run-dir", str(run), "--max-updates", "3", *common]) == 0
    for stop in (7, 10):
        assert main(["train", "--resume", str(run), "--max-updates", str(stop)]) == 0
    assert drawn == reference
    assert _losses(run) == _losses(full)
    data = BinarizedDataset(copy_data, "train")
    sizes_of: dict[int, set[int]] = {}  # source length -> the sizes drawn for it
    for _, ids, sizes in reference:
        for i, size in zip(ids, sizes, strict=True):
            n, t = int(data.source_lengths[i]), int(data.target_lengths[i])
            assert size == max(t, size) and (size == t or 2 * n <= size < 4 * n)
            sizes_of.setdefault(n, set()).add(size)
    assert all(len(s) > 1 for n, s in sizes_of.items() if n > 2)  # not one λ for all
    drawn[:] = []
    seed6 = ["train", "--run-dir", str(tmp_path / "seed6"), "--max-updates", "2", *flags(6)]
    assert main(seed6) == 0
    assert [d[2] for d in drawn] != [d[2] for d in reference[: len(drawn)]]


def test_ctrl_c_writes_checkpoint_and_exits_130(copy_data, tmp_path):
    run = tmp_path / "run"
    args = [
        "--run-dir", str(run), "--data", str(copy_data), "--max-updates", "100000",
        "--max-tokens", "300", "--save-every", "1000", "--validate-every", "0",
        "--threads", "1", "--no-progress-bar",
    ]  # fmt: skip
    proc = subprocess.Popen(_train_cmd(*args), env=_env())
    log = run / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130
    state = torch.load(run / "checkpoint_last.pt", weights_only=True)
    assert state["progress"]["update"] == len(_losses(run)) >= 3
    # resumable, with a new stop criterion
    rc = main(
        ["train", "--resume", str(run), "--max-updates", str(state["progress"]["update"] + 2)]
    )
    assert rc == 0 and len(_losses(run)) == state["progress"]["update"] + 2


# ------------------------------------------------------------------------- distributed


def test_other_ranks_leave_a_new_run_directory_to_rank_0(copy_data, tmp_path, monkeypatch):
    """Under torchrun, rank 0 creates a new run directory (its lock file first) and marks it
    later; a rank > 0 that starts in between must not take it for a directory that fadat did not
    create (the race that failed the torchrun test once). It goes on to the trainer, where rank
    0 is the one that checks; a resumed run's directory is still checked on every rank."""
    from fadat import outputs
    from fadat.errors import InputError
    from fadat.training import trainer as trainer_module
    from fadat.training.config import TrainConfig

    class Reached(Exception):
        pass

    def no_trainer(*_a, **_k):
        raise Reached

    monkeypatch.setattr(trainer_module, "Trainer", no_trainer)
    monkeypatch.setenv("RANK", "1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # rank 0 holds the lock and probes that it can write there; it has not marked the directory
    (run_dir / outputs.LOCK).write_text("12345\n", encoding="utf-8")
    (run_dir / ".fadat-probe-abc123").write_bytes(b"")
    cfg = TrainConfig(data=str(copy_data), run_dir=str(run_dir), arch="dat")
    with pytest.raises(Reached):
        trainer_module.train(cfg)
    with pytest.raises(InputError, match="did not create"):  # resuming: checked on every rank
        trainer_module.train(cfg, resume=True)


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(copy_data, tmp_path):
    max_tokens, update_freq, updates = 1200, 2, 12
    # The data must give what the test is about: unequal shards and an epoch boundary.
    ds = BinarizedDataset(copy_data, "train")
    tiny = make_config("tiny", 12)
    two, other = (
        TokenBatchSampler(
            ds.source_lengths, ds.target_lengths, max_tokens, tiny.upsample_ratio,
            tiny.max_target_positions, seed=5, rank=rank, world_size=2,
        )
        for rank in (0, 1)
    )  # fmt: skip
    shards = zip(two.batches(1), other.batches(1), strict=True)
    assert any(len(a) != len(b) for a, b in shards), "no unequal shards"
    assert two.num_batches() < updates * update_freq, "no epoch boundary"
    common = [
        "--data", str(copy_data), "--arch", "dat", "--max-updates", str(updates),
        "--validate-every", "0", "--glat-p", "0", "--dropout", "0", "--lr", "3e-3",
        "--warmup", "3", "--threads", "1", "--no-progress-bar", "--seed", "5",
        "--update-freq", str(update_freq),
    ]  # fmt: skip
    one, dist = tmp_path / "one", tmp_path / "two"
    # the one-process run in this process: a process start costs more than its 12 updates
    assert main(["train", "--run-dir", str(one), "--max-tokens", str(2 * max_tokens), *common]) == 0
    cmd = [
        PY, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(_free_port()), "-m", "fadat.cli", "train",
        "--run-dir", str(dist), "--max-tokens", str(max_tokens), *common,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=_env())
    log1 = [json.loads(x) for x in (one / "train_log.jsonl").read_text().splitlines()]
    log2 = [json.loads(x) for x in (dist / "train_log.jsonl").read_text().splitlines()]
    assert len(log1) == len(log2) == updates
    assert log1[-1]["epoch"] > 1
    for a, b in zip(log1, log2, strict=True):
        assert a["sentences"] == b["sentences"] and a["epoch"] == b["epoch"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    s1 = torch.load(one / "checkpoint_last.pt", weights_only=True)
    s2 = torch.load(dist / "checkpoint_last.pt", weights_only=True)
    assert s2["world_size"] == 2 and len(s2["rng"]) == 2
    for key, value in s1["model"].items():
        assert torch.allclose(value, s2["model"][key], atol=1e-5, rtol=0), key


# ------------------------------------------------------------------- fine-tune, precision


def test_fuzzy_finetune_starts_from_init_weights_with_fresh_optimizer(copy_data, tmp_path):
    base = tmp_path / "base"
    common = ["--data", str(copy_data), "--threads", "2", "--force", "--no-progress-bar"]
    common += ["--dropout", "0"]  # --force: 2 threads on a machine with 1 core too
    assert main(["train", "--run-dir", str(base), "--max-updates", "3", *common]) == 0
    init = tmp_path / "init"
    assert (
        main(["average", "--checkpoints", str(base / "checkpoint_last.pt"), "--output", str(init)])
        == 0
    )
    ft = tmp_path / "ft"
    rc = main(
        [
            "train", "--run-dir", str(ft), "--objective", "fuzzy", "--init-from", str(init),
            "--glat-p", "0", "--max-updates", "2", "--validate-every", "0", "--lr", "2e-4",
            "--warmup", "5", *common,
        ]
    )  # fmt: skip
    assert rc == 0
    first = json.loads((ft / "train_log.jsonl").read_text().splitlines()[0])
    assert {"precision", "bp", "length_ratio"} <= set(first)
    assert first["lr"] == pytest.approx(1e-7 + (2e-4 - 1e-7) / 5)  # fresh schedule: update 1
    # the first update's loss is the fuzzy loss of the init model on that update's batches
    model = load_pretrained(init).train()
    ds = BinarizedDataset(copy_data, "train")
    cfg = make_config("tiny", 12)
    sampler = TokenBatchSampler(
        ds.source_lengths, ds.target_lengths, 4096, cfg.upsample_ratio, cfg.max_target_positions,
        seed=1,
    )  # fmt: skip
    batch = ds.collate(sampler.batches(1)[0])
    with torch.no_grad():
        out = compute_loss(model, batch, ObjectiveConfig(name="fuzzy"))
    assert first["loss"] == pytest.approx(float(out.loss_sum) / out.count, rel=1e-5)
    state = torch.load(ft / "checkpoint_last.pt", weights_only=True)
    assert state["progress"]["update"] == 2
    assert all(int(s["step"]) == 2 for s in state["optimizer"]["state"].values())


def test_bf16_autocast_trains_with_finite_losses(copy_data, tmp_path, monkeypatch):
    # bf16 even on a CPU that emulates it (slow there, but 3 tiny updates)
    monkeypatch.setattr("fadat.process.native_bf16", lambda device_type="cpu": True)
    run = tmp_path / "run"
    rc = main(
        [
            "train", "--data", str(copy_data), "--run-dir", str(run), "--bf16",
            "--max-updates", "3", "--validate-every", "0", "--threads", "2", "--force",
            "--no-progress-bar",
        ]
    )  # fmt: skip
    assert rc == 0
    losses = _losses(run)
    assert len(losses) == 3 and all(0 < x < 100 for x in losses)


def test_bf16_is_turned_off_where_the_cpu_has_no_bf16_hardware(monkeypatch, caplog):
    from fadat.training.trainer import autocast_options

    monkeypatch.setattr("fadat.process.native_bf16", lambda device_type="cpu": True)
    assert autocast_options(True, False, "cpu") == dict(
        device_type="cpu", dtype=torch.bfloat16, enabled=True
    )
    monkeypatch.setattr("fadat.process.native_bf16", lambda device_type="cpu": False)
    with caplog.at_level("WARNING", logger="fadat.training.trainer"):
        options = autocast_options(True, False, "cpu")
    assert options["enabled"] is False
    assert "no bf16 hardware" in caplog.text and "trains in fp32" in caplog.text
    caplog.clear()
    assert autocast_options(False, False, "cpu")["enabled"] is False
    assert autocast_options(False, True, "cpu") == dict(
        device_type="cpu", dtype=torch.float16, enabled=True
    )
    assert not caplog.text


def test_native_bf16_reads_the_cpu_flags(monkeypatch):
    from fadat.process import native_bf16

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert native_bf16("cpu") is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert native_bf16("cpu") is True


# --------------------------------------------------------------------------- bad input


def test_bad_input_exits_2(copy_data, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--data", str(copy_data), "--threads", "1", "--no-progress-bar"]
    assert main(["train", "--run-dir", str(run), "--max-updates", "1", *base]) == 0
    # a second fresh run into the same directory
    assert main(["train", "--run-dir", str(run), "--max-updates", "1", *base]) == 2
    # resume with a changed training setting
    assert main(["train", "--resume", str(run), "--lr", "1"]) == 2
    assert "only stop criteria" in capsys.readouterr().err
    # corrupt checkpoint
    (run / "checkpoint_last.pt").write_bytes(b"\x00garbage")
    assert main(["train", "--resume", str(run)]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err
    # missing data, unknown YAML key
    missing = ["--run-dir", str(tmp_path / "x"), "--max-updates", "1"]
    assert main(["train", "--data", str(tmp_path / "nope"), *missing]) == 2
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("learning_rate: 3\n")
    assert main(["train", "--config", str(bad_yaml), *base, *missing]) == 2
    assert "unknown config key" in capsys.readouterr().err


# ------------------------------------------------------------------------- one trainer per run

_HELD_IN_ITS_LOOP = """
import sys
from fadat.training import trainer

def held(self):
    print("training", flush=True)
    sys.stdin.read()  # until the test kills this process

trainer.Trainer.run = held
from fadat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _trainer_in_its_loop(*args: str) -> subprocess.Popen:
    """A real ``fadat train`` process held where its training loop starts (set up, run
    directory locked and written); returns once it is there."""
    env = {**_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [PY, "-c", _HELD_IN_ITS_LOOP, "train", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if proc.stdout.readline() != "training\n":
        proc.kill()
        raise AssertionError(f"the held trainer failed: {proc.communicate()[1]}")
    return proc


@pytest.mark.slow
def test_one_trainer_per_run_directory(copy_data, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--data", str(copy_data), "--threads", "1", "--no-progress-bar", "--valid-subset", "4"]
    fresh = ["train", "--run-dir", str(run), "--max-updates", "1", *base]

    def refused(argv: list[str], pid: int) -> None:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert str(run) in err and f"PID {pid}" in err, err

    # A second fresh run into a directory that a trainer started in.
    holder = _trainer_in_its_loop(*fresh[1:])
    try:
        refused(fresh, holder.pid)
    finally:
        holder.kill()  # kill -9: the kernel releases the lock, no stale lock stays
        holder.wait()
    assert main(fresh) == 0
    capsys.readouterr()
    # A run that is still training: --resume, a second --resume, a fresh run.
    holder = _trainer_in_its_loop("--resume", str(run), "--max-updates", "2")
    try:
        refused(["train", "--resume", str(run), "--max-updates", "2"], holder.pid)
        refused(fresh, holder.pid)
    finally:
        holder.kill()
        holder.wait()
    # Temporaries of killed writers go with the next train (whatever their PID: 1 runs); the
    # user's file stays.
    stale = [
        run / f".checkpoint_last.pt.tmp-{holder.pid}-k2x.pt",
        run / ".config.yaml.tmp-1-a9",
        run / f".best.json.tmp-{holder.pid}-zz",
    ]
    for path in stale:
        path.write_bytes(b"half")
    (run / "notes.txt").write_text("mine\n")
    assert main(["train", "--resume", str(run), "--max-updates", "2"]) == 0
    assert not any(path.exists() for path in stale)
    assert (run / "notes.txt").read_text() == "mine\n"
    assert len(_losses(run)) == 2


# ------------------------------------------------------------------------- stop criteria


def test_max_epochs_and_patience_stop_where_expected(copy_data, tmp_path):
    from fadat.training.trainer import TrainConfig, train

    ds = BinarizedDataset(copy_data, "train")
    tiny = make_config("tiny", 12)
    sampler = TokenBatchSampler(
        ds.source_lengths, ds.target_lengths, 2048, tiny.upsample_ratio, tiny.max_target_positions
    )
    per_epoch = -(-sampler.num_batches() // 2)  # update-freq 2: the last update may be short
    base = dict(data=str(copy_data), threads=1, progress_bar=False, max_tokens=2048)
    summary = train(
        TrainConfig(
            run_dir=str(tmp_path / "e"), max_epochs=2, update_freq=2, validate_every=0, **base
        )
    )
    assert summary["stop_reason"] == "max_epochs" and summary["update"] == 2 * per_epoch
    epochs = [json.loads(x)["epoch"] for x in (tmp_path / "e" / "train_log.jsonl").open()]
    assert epochs == [1] * per_epoch + [2] * per_epoch
    # lr ≈ 0: BLEU cannot improve after the first validation, patience 1 stops at update 2
    summary = train(
        TrainConfig(
            run_dir=str(tmp_path / "p"), max_updates=50, validate_every=1, patience=1, lr=1e-9,
            warmup=0, valid_subset=8, **base,
        )
    )  # fmt: skip
    assert summary["stop_reason"] == "patience" and summary["update"] == 2
