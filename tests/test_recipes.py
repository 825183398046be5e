"""The experiment recipes' plumbing: variant composition and adopting a model from another run."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def model_of(run_dir):
    """Where the harness averages the run ``RUNS/STAGE-sSEED``: ``RUNS/models/STAGE-sSEED``."""
    return run_dir.parent / "models" / run_dir.name


def test_learning_speed_variants_compose_in_order():
    ls = load_recipe("learning_speed")
    base, variants = ls.load_variants()
    single = ls.resolve("lambda-3", base, variants)
    assert single["config"]["model"] == {"copy_source": False, "upsample_ratio": 3.0}
    both = ls.resolve("copy-source,lambda-3,lr-1e-3", base, variants)
    assert both["config"]["model"] == {"copy_source": True, "upsample_ratio": 3.0}
    assert both["config"]["lr"] == 0.001
    assert both["data"] == base["data"]
    vocab = ls.resolve("copy-source,vocab-4k", base, variants)
    assert vocab["data"] == "data/bible-en-es-4k"
    assert vocab["prepare"] == ["--vocab-size", "4000"]
    # a variant whose own name holds the separator characters stays one variant
    assert ls.resolve("layers-2+2", base, variants)["config"]["model"]["encoder_layers"] == 2
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        ls.resolve("copy-source,nope", base, variants)


def test_experiment_adopt_checks_the_training_config(tmp_path, monkeypatch):
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path)
    (tmp_path / "configs").mkdir()
    stage_config = {"arch": "dat", "objective": "nll", "lr": 0.0005, "max_updates": 6000}
    (tmp_path / "configs" / "nll.yaml").write_text(yaml.safe_dump(stage_config))
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "data": "data/x",
                "vars": {"N": 1400, "M": 240},
                "seeds": [1, 2],
                "stages": [{"name": "pretrain", "config": "configs/nll.yaml", "max_updates": "N"}],
            }
        )
    )
    model = tmp_path / "runs" / "main" / "nll-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "dat"}))
    trained = dict(stage_config, max_updates=1400, seed=1, threads=1, validate_every=200)
    run_config = tmp_path / "runs" / "main" / "nll" / "config.yaml"
    run_config.parent.mkdir()
    run_config.write_text(yaml.safe_dump(dict(trained, lr=0.001)))

    def adopt(seed=1):
        ex.main(["adopt", str(experiment), "pretrain", str(model), "--seed", str(seed)])

    with pytest.raises(SystemExit, match="differs from stage pretrain-s1.*'lr'"):
        adopt()
    run_config.write_text(yaml.safe_dump(dict(trained, seed=2)))
    with pytest.raises(SystemExit, match="'seed'"):
        adopt()
    run_config.write_text(yaml.safe_dump(trained))
    adopt()
    link = model_of(tmp_path / "runs" / "experiments" / "t" / "pretrain-s1")
    assert link.is_symlink() and (link / "config.json").exists()
    with pytest.raises(SystemExit, match="exists"):
        adopt()
    assert ex.evaluate_int("N+M", {"N": 1400, "M": 240}) == 1640


# ---- recipes/experiment.py: plateau stages, fine-tuning budgets, resume, reports (issue 29)

PLATEAU_EXPERIMENT = ROOT / "recipes" / "experiments" / "bible-en-es-plateau.yaml"


def curve(points):
    """Valid-log records from (update, bleu) pairs (loss falls with BLEU; 1 s per update)."""
    return [
        {"update": u, "elapsed": float(u), "valid_loss": 10.0 - b / 10, "bleu": b}
        for u, b in points
    ]


def brute_force_plateau(points, min_updates, window_tenths, gain):
    """The criterion written out with integers: N >= min_updates and
    max{b(u): u <= N} - max{b(u): 10 u <= (10 - window_tenths) N} < gain."""
    for n, _ in points:
        if n < min_updates:
            continue
        now = max(b for u, b in points if u <= n)
        before = [b for u, b in points if 10 * u <= (10 - window_tenths) * n]
        if before and now - max(before) < gain:
            return n
    return None


def test_plateau_criterion_on_synthetic_curves():
    ex = load_recipe("experiment")
    from fractions import Fraction

    p = ex.Plateau(min_updates=10000, window=Fraction("0.3"), gain=0.3)
    grid = range(500, 60001, 500)
    # rising 1 BLEU per 1,000 updates: 30 % of N gains 0.3 N / 1000 >= 3 points; never holds
    assert ex.plateau_update(curve([(u, u / 1000) for u in grid]), p) is None
    # rising to 21,000, flat after: b(0.7 N) reaches 21 only once 0.7 N >= 21,000, N = 30,000
    flat = [(u, min(u, 21000) / 1000) for u in grid]
    assert ex.plateau_update(curve(flat), p) == 30000
    assert ex.plateau_gain(curve(flat), 29500, p.window) == pytest.approx(21 - 20.5)
    # flat from the start: holds at the first validation at or past min_updates ...
    assert ex.plateau_update(curve([(u, 5.0) for u in grid]), p) == 10000
    # ... unless the window reaches before the first validation (b = -inf there): 0.7 N >= 8,000
    late = [(u, 5.0) for u in range(8000, 20001, 500)]
    assert ex.plateau_update(curve(late), p) == 11500
    assert ex.plateau_gain(curve(late), 11000, p.window) == float("inf")
    # the cutoff is exact: (1 - 0.3) * 5,500 is 3,850, not float's 3849.9999999999995, so the
    # validation at 3,850 counts
    cut = [(1000, 1.0), (3850, 9.9), (5500, 10.0)]
    assert ex.plateau_update(curve(cut), ex.Plateau(5000, Fraction("0.3"), 0.3)) == 5500
    # the gain must be strictly below: exactly representable 10.5 - 10.25 = 0.25 does not hold
    assert (
        ex.plateau_update(
            curve([(5000, 10.25), (10000, 10.5)]), ex.Plateau(10000, Fraction("0.5"), 0.25)
        )
        is None
    )
    # noisy curves (a rise, a plateau with ±0.4 noise, drops): against the brute force
    rng = random.Random(0)
    for _ in range(200):
        points, bleu = [], 0.0
        for u in range(250, 40001, 250):
            bleu = max(0.0, bleu + rng.choice([1.0, 0.3, 0.0, -0.4]) * (1 if u < 15000 else 0.3))
            points.append((u, round(bleu + rng.uniform(-0.4, 0.4), 2)))
        want = brute_force_plateau(points, 10000, 3, 0.3)
        assert ex.plateau_update(curve(points), p) == want


def write_jsonl(path, records, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def plateau_setup(tmp_path, monkeypatch):
    """The real experiment file and configs under a fake checkout; runs and data in tmp."""
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path)
    (tmp_path / "configs").mkdir()
    for name in (
        "dat-cpu-small-nll-fast",
        "at-cpu-small",
        "dat-cpu-small-nll-plateau-finetune",
        "dat-cpu-small-fuzzy-plateau",
    ):
        src = ROOT / "configs" / f"{name}.yaml"
        (tmp_path / "configs" / src.name).write_text(src.read_text(encoding="utf-8"))
    for data in ("bible-en-es", "bible-en-es-4k"):
        (tmp_path / "data" / data).mkdir(parents=True)
        (tmp_path / "data" / data / "meta.json").write_text(
            json.dumps({"source_lang": "en", "target_lang": "es"})
        )
    where = [str(PLATEAU_EXPERIMENT), "--root", str(tmp_path / "runs"),
             "--data-root", str(tmp_path / "data")]  # fmt: skip
    return ex, where, tmp_path / "runs" / "bible-en-es-plateau"


def test_the_speed_plateau_experiment_file():
    """The speed sweep's chosen design to its plateau: pre-training on the distilled data to the
    release's criterion, FA-DAT from it with the release's budget (batch ratio 4, checked
    against the two configs by ``load``)."""
    ex = load_recipe("experiment")
    spec, stages = ex.load(str(ROOT / "recipes" / "experiments" / "bible-en-es-speed-plateau.yaml"))
    by_key = {s.key: s for s in stages}
    assert list(by_key) == ["pretrain-s1", "ft-fadat-s1"]
    pretrain, fadat = by_key["pretrain-s1"], by_key["ft-fadat-s1"]
    assert (pretrain.data, fadat.data) == ("bible-en-es-4k-kd", "bible-en-es-4k-kd")
    assert (pretrain.plateau.min_updates, pretrain.plateau.gain) == (10000, 0.3)
    assert fadat.init_key == "pretrain-s1"
    assert fadat.budget == ex.Budget(0.0667, 4)
    assert [p for p, _ in ex.comparisons(spec)] == [""]


def test_fine_tune_budget_arithmetic_and_the_experiment_file(tmp_path, monkeypatch):
    ex, _, runs = plateau_setup(tmp_path, monkeypatch)
    # the paper: 5k updates × 256k tokens after 300k × 64k = 6.67 % at a 4× batch
    assert ex.fine_tune_budget(300000, ex.Budget(0.0667, 4))[0] == 5002
    assert ex.fine_tune_budget(30000, ex.Budget(0.0667, 4)) == (
        500,
        "30000 × 0.0667 / 4 = 500.2 → 500 updates",
    )
    assert ex.fine_tune_budget(31000, ex.Budget(0.0667, 4))[0] == 517  # 516.9 rounds up
    spec, stages = ex.load(str(PLATEAU_EXPERIMENT))
    by_key = {s.key: s for s in stages}
    assert list(by_key) == [
        "pretrain-s1", "at-s1", "ft-nll-s1", "ft-nll-s2", "ft-fadat-s1", "ft-fadat-s2",
        "kd-pretrain-s1", "kd-ft-nll-s1", "kd-ft-nll-s2", "kd-ft-fadat-s1", "kd-ft-fadat-s2",
        "nat-s1", "glat-s1", "ctc-s1",
    ]  # fmt: skip
    assert [s.key for s in stages if s.optional] == list(by_key)[6:]
    # the Table 2 baselines: the pre-training's update count, no init_from, the 4k data
    for key in ("nat-s1", "glat-s1", "ctc-s1"):
        stage = by_key[key]
        assert (stage.max_updates, stage.init_from, stage.data) == (16500, "", "bible-en-es-4k")
    assert [p for p, _ in ex.comparisons(spec)] == ["", "kd-", "baselines-"]
    assert by_key["kd-ft-fadat-s1"].init_key == "kd-pretrain-s1"
    assert (by_key["pretrain-s1"].data, by_key["at-s1"].data) == ("bible-en-es-4k", "bible-en-es")
    assert by_key["at-s1"].prepare == ("bible-en-es",)
    assert by_key["pretrain-s1"].prepare == ("bible-en-es", "--vocab-size", "4000")
    # fine-tuning seed 2 starts from pre-training seed 1
    assert by_key["ft-fadat-s2"].init_key == "pretrain-s1"
    paths = ex.Paths(runs, tmp_path / "data")
    assert ex.resolve(by_key["ft-nll-s2"], stages, paths)[0] is None  # no plateau yet
    write_jsonl(runs / "pretrain-s1" / "valid_log.jsonl",
                curve([(u, min(u, 21000) / 1000) for u in range(500, 32001, 500)]))  # fmt: skip
    updates, derived, text = ex.resolve(by_key["ft-nll-s2"], stages, paths)
    assert (updates, derived) == (500, {"warmup": 50, "validate_every": 50})
    assert text.startswith("pretrain-s1 plateau at N = 30000: 30000 × 0.0667 / 4")
    # a batch_ratio that the configs do not have is refused (2048 × 8 / (2048 × 2) = 4)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        PLATEAU_EXPERIMENT.read_text(encoding="utf-8").replace("batch_ratio: 4", "batch_ratio: 2")
    )
    with pytest.raises(SystemExit, match="batch_ratio 2 but .* ratio 4"):
        ex.load(str(bad))
    bad.write_text(
        PLATEAU_EXPERIMENT.read_text(encoding="utf-8").replace("warmup_share", "warmup_shar")
    )
    with pytest.raises(SystemExit, match="unknown key.*warmup_shar"):
        ex.load(str(bad))


class FakeFadat:
    """Records fadat calls; ``train`` advances the run's logs by ``script`` (a function of the
    run directory and the call), ``average`` writes a model directory."""

    def __init__(self, script):
        self.calls, self.script = [], script

    def __call__(self, *args):
        args = list(args)
        self.calls.append(args)
        if args[0] == "average":
            out = Path(args[args.index("--output") + 1])
            out.mkdir(parents=True)
            (out / "config.json").write_text("{}")
        if args[0] == "train":
            flag = "--resume" if "--resume" in args else "--run-dir"
            self.script(Path(args[args.index(flag) + 1]), args)
        return 0

    def until_plateau(self, cmd, run_dir, plateau):
        assert cmd[:3] == [sys.executable, "-m", "fadat.cli"]
        return self(*cmd[3:])


def test_run_resumes_a_plateau_stage_then_averages_up_to_n(tmp_path, monkeypatch, capsys):
    ex, where, runs = plateau_setup(tmp_path, monkeypatch)
    run_dir = runs / "pretrain-s1"
    # a run killed at update 1,200 after 600 s: a partial log and checkpoint_last
    write_jsonl(
        run_dir / "train_log.jsonl", [{"update": u, "elapsed": u / 2} for u in (1100, 1200)]
    )
    (run_dir / "train_log.jsonl").open("a").write('{"update": 12')  # half-written line
    write_jsonl(run_dir / "valid_log.jsonl", curve([(500, 5.0), (1000, 7.0)]))
    (run_dir / "checkpoint_last.pt").write_bytes(b"")

    def rising(run, args):  # one slice of 600 s: 1,200 more updates, still rising
        # fadat train --resume first truncates the logs to the checkpoint's records
        kept = ex.read_jsonl(run / "train_log.jsonl")
        write_jsonl(run / "train_log.jsonl", [*kept, {"update": 2400, "elapsed": 1200.0}])
        write_jsonl(run / "valid_log.jsonl", curve([(2000, 9.0)]), "a")

    fake = FakeFadat(rising)
    monkeypatch.setattr(ex, "fadat", fake)
    monkeypatch.setattr(ex, "train_until_plateau", fake.until_plateau)
    # a log written moments ago: another process trains the run; it is left alone
    with pytest.raises(SystemExit, match="written 0 s ago: another process seems to train"):
        ex.main(["run", *where, "--slice", "10m", "--only", "pretrain-s1"])
    assert fake.calls == []
    monkeypatch.setattr(ex, "BUSY_SECONDS", 0.0)
    ex.main(["run", *where, "--slice", "10m", "--threads", "1", "--only", "pretrain-s1"])
    assert fake.calls == [[
        "train", "--resume", str(run_dir), "--threads", "1", "--no-progress-bar",
        "--max-updates", "100000", "--max-time", "1200",
    ]]  # fmt: skip
    assert "pretrain-s1: 2400/100000 updates; run again" in capsys.readouterr().out

    def plateau(run, args):  # flat from 21,000: the criterion holds at N = 30,000
        points = [(u, min(u, 21000) / 1000) for u in range(2500, 30001, 500)]
        write_jsonl(run / "valid_log.jsonl", curve(points), "a")
        write_jsonl(run / "train_log.jsonl", [{"update": 30003, "elapsed": 15000.0}], "a")
        best = [(21000, 21.0), (30000, 21.0), (20500, 20.5), (31000, 21.5), (20000, 20.0),
                (19500, 19.5)]  # fmt: skip
        index = {"checkpoints": [
            {"file": f"checkpoint_best_u{u:08d}.pt", "bleu": b, "update": u} for u, b in best
        ]}  # fmt: skip
        (run / "best.json").write_text(json.dumps(index))
        for u, _ in best:
            if u != 20000:  # one listed file is gone: skipped
                (run / f"checkpoint_best_u{u:08d}.pt").write_bytes(b"")

    fake.script, fake.calls = plateau, []
    ex.main(["run", *where, "--slice", "150m", "--threads", "1", "--only", "pretrain-s1"])
    assert fake.calls[0][:3] == ["train", "--resume", str(run_dir)]
    assert fake.calls[0][-1] == str(1200 + 150 * 60)
    # the 5 best validated at <= N = 30,000 that exist, by BLEU (earlier first on ties)
    files = [str(run_dir / f"checkpoint_best_u{u:08d}.pt") for u in (21000, 30000, 20500, 19500)]
    assert fake.calls[1] == ["average", "--checkpoints", *files, "--output", str(model_of(run_dir))]
    # a finished stage is not trained again
    fake.calls = []
    ex.main(["run", *where, "--slice", "150m", "--only", "pretrain-s1"])
    assert fake.calls == []


def test_run_continues_a_compact_copy_with_a_fresh_optimizer_on_the_stage_data(
    tmp_path, monkeypatch, capsys
):
    """A stage's run directory lost and put back from its compact copy (fadat snapshot):
    ``run`` continues it with --reset-optimizer on the stage's dataset (a plain --resume would
    be refused); a full checkpoint resumes as before."""
    import torch

    from fadat.training.checkpoints import CHECKPOINT_FORMAT as FORMAT

    ex, where, runs = plateau_setup(tmp_path, monkeypatch)
    monkeypatch.setattr(ex, "BUSY_SECONDS", 0.0)
    run_dir = runs / "pretrain-s1"
    run_dir.mkdir(parents=True)
    write_jsonl(run_dir / "train_log.jsonl", [{"update": 1200, "elapsed": 600.0}])
    light = {"format": FORMAT, "model": {}, "optimizer_reset_required": True}
    torch.save(light, run_dir / "checkpoint_last.pt")

    def more(run, args):
        write_jsonl(run / "train_log.jsonl", [{"update": 2400, "elapsed": 1200.0}], "a")

    fake = FakeFadat(more)
    monkeypatch.setattr(ex, "fadat", fake)
    monkeypatch.setattr(ex, "train_until_plateau", fake.until_plateau)
    ex.main(["run", *where, "--slice", "10m", "--threads", "1", "--only", "pretrain-s1"])
    data = tmp_path / "data" / "bible-en-es-4k"
    assert fake.calls == [[
        "train", "--resume", str(run_dir), "--reset-optimizer", "--data", str(data),
        "--threads", "1", "--no-progress-bar", "--max-updates", "100000", "--max-time", "1200",
    ]]  # fmt: skip
    assert "holds a compact copy (fadat snapshot): continued with --reset-optimizer" in (
        capsys.readouterr().out
    )
    # once continued, checkpoint_last is a full one: a plain resume
    torch.save({"format": FORMAT, "model": {}, "optimizer": {}}, run_dir / "checkpoint_last.pt")
    fake.calls = []
    ex.main(["run", *where, "--slice", "10m", "--threads", "1", "--only", "pretrain-s1"])
    assert fake.calls[0][:4] == ["train", "--resume", str(run_dir), "--threads"]


def test_run_starts_fine_tunes_from_another_seed_with_the_derived_budget(
    tmp_path, monkeypatch, capsys
):
    ex, where, runs = plateau_setup(tmp_path, monkeypatch)
    pre = runs / "pretrain-s1"
    monkeypatch.setattr(ex, "fadat", None)  # nothing may run while pretrain-s1 has no model
    ex.main(["run", *where, "--only", "ft-nll-s1,ft-fadat-s2"])
    out = capsys.readouterr().out
    assert f"ft-nll-s1: waits for {model_of(pre)}" in out
    assert out.endswith("waiting: ft-nll-s1, ft-fadat-s2\n")
    write_jsonl(
        pre / "valid_log.jsonl", curve([(u, min(u, 21000) / 1000) for u in range(500, 30001, 500)])
    )
    model_of(pre).mkdir(parents=True)
    (model_of(pre) / "config.json").write_text("{}")

    def finish(run, args):
        n = int(args[args.index("--max-updates") + 1])
        write_jsonl(run / "train_log.jsonl", [{"update": n, "elapsed": 1800.0}])

    fake = FakeFadat(finish)
    monkeypatch.setattr(ex, "fadat", fake)
    monkeypatch.setattr(ex, "train_until_plateau", fake.until_plateau)
    ex.main(["run", *where, "--slice", "60m", "--threads", "1", "--only", "ft-fadat-s2"])
    data = tmp_path / "data" / "bible-en-es-4k"
    assert fake.calls[0] == [
        "train", "--config", str(tmp_path / "configs" / "dat-cpu-small-fuzzy-plateau.yaml"),
        "--data", str(data), "--run-dir", str(runs / "ft-fadat-s2"), "--seed", "2",
        "--init-from", str(model_of(pre)),
        "--bf16", "--valid-subset", "0", "--save-every", "10",
        "--warmup", "50", "--validate-every", "50",
        "--threads", "1", "--no-progress-bar", "--max-updates", "500", "--max-time", "3600",
    ]  # fmt: skip
    assert fake.calls[1] == [
        "average", "--run", str(runs / "ft-fadat-s2"), "--best", "5",
        "--output", str(model_of(runs / "ft-fadat-s2")),
    ]  # fmt: skip
    # a stage whose init model is missing waits; the at stage trains on its own 8k data
    fake.calls = []
    with pytest.raises(SystemExit, match="at-s1.*no best.json"):  # (this fake validates nothing)
        ex.main(["run", *where, "--slice", "60m", "--only", "at-s1"])
    assert fake.calls[0][fake.calls[0].index("--data") + 1] == str(
        tmp_path / "data" / "bible-en-es"
    )


def test_train_until_plateau_interrupts_the_run(tmp_path, monkeypatch):
    """A real child process that validates every 20 ms: SIGINT once the criterion holds."""
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "POLL_SECONDS", 0.05)
    from fractions import Fraction

    child = tmp_path / "child.py"
    child.write_text(
        "import json, signal, sys, time\n"
        "def stop(*_):\n"
        "    open(sys.argv[1] + '/interrupted', 'w').write('yes')\n"
        "    sys.exit(130)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "for u in range(500, 10**6, 500):\n"
        "    rec = {'update': u, 'elapsed': u, 'valid_loss': 1.0, 'bleu': min(u, 3000) / 1000}\n"
        "    open(sys.argv[1] + '/valid_log.jsonl', 'a').write(json.dumps(rec) + '\\n')\n"
        "    time.sleep(0.02)\n"
        "sys.exit(3)\n"
    )
    p = ex.Plateau(1000, Fraction("0.5"), 0.3)  # flat from 3,000: N = 6,000
    rc = ex.train_until_plateau([sys.executable, str(child), str(tmp_path)], tmp_path, p)
    assert rc == 0 and (tmp_path / "interrupted").read_text() == "yes"
    assert ex.plateau_update(ex.valid_curve(tmp_path), p) == 6000
    assert ex.valid_curve(tmp_path)[-1]["update"] < 500_000  # stopped, not run to the end
    # a child that fails before the plateau: its exit status
    (tmp_path / "valid_log.jsonl").unlink()
    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert ex.train_until_plateau(failing, tmp_path, p) == 3


REFERENCE = ["El Señor es mi pastor; nada me faltará.", "Y Dios dijo: sea la luz."]


def test_drift_statistics_by_hand():
    ex = load_recipe("experiment")
    # 14 words; ≤ 2 letters: El es mi me Y la (6); "pastor;" and "luz." are not short
    ref = ex.drift_statistics(REFERENCE)
    assert ref == {"words": 14, "characters": 63, "short_share": 6 / 14, "distinct": 14}
    # letters, not characters: "3:16" has none (a word, not short); "y,", "de," and "á" are short
    hyp = ex.drift_statistics(["y, de, la y de", "3:16 á luz."], REFERENCE)
    assert hyp["words"] == 8 and hyp["distinct"] == 8 and hyp["short_share"] == 6 / 8
    assert hyp["words_ratio"] == 8 / 14 and hyp["characters_ratio"] == 25 / 63
    verbose = "BLEU = 10.00 40.0/20.0/10.0/5.0 (BP = 0.90 ratio = 0.91 hyp_len = 91 ref_len = 100)"
    assert ex.length_ratio(verbose) == 0.91


def test_link_status_evaluate_and_table_from_fake_runs(tmp_path, monkeypatch, capsys):
    ex, where, runs = plateau_setup(tmp_path, monkeypatch)
    from fadat.models.directory import model_labels

    # the pre-training started by hand elsewhere, linked after checking its config
    hand = tmp_path / "hand" / "dat-plateau"
    hand.mkdir(parents=True)
    trained = yaml.safe_load((ROOT / "configs" / "dat-cpu-small-nll-fast.yaml").read_text())
    trained.update(
        data=str(tmp_path / "data" / "bible-en-es-4k"), run_dir=str(hand), bf16=True, seed=1,
        max_updates=100000, validate_every=500, valid_subset=0, save_every=100, threads=1,
        max_time=9000.0, ngram_order=2,
    )  # fmt: skip
    write_jsonl(hand / "train_log.jsonl", [{"update": 30000, "elapsed": 36000.0}])
    write_jsonl(hand / "valid_log.jsonl",
                curve([(u, min(u, 21000) / 1000) for u in range(500, 30001, 500)]))  # fmt: skip
    other_data = str(tmp_path / "data" / "bible-en-es")
    for change, match in (
        ({"lr": 0.001}, "'lr'"),
        ({"bf16": False}, "'bf16'"),
        ({"data": other_data}, "trained on"),
    ):
        (hand / "config.yaml").write_text(yaml.safe_dump({**trained, **change}))
        with pytest.raises(SystemExit, match=match):
            ex.main(["link", *where, "pretrain", str(hand)])
    (hand / "config.yaml").write_text(yaml.safe_dump(trained))
    with pytest.raises(SystemExit, match="budget is not known"):  # ft stages wait for N
        ex.main(["link", *where, "ft-nll", str(hand)])
    # a lower update cap is fine for a run that `run` resumes to the stage's; a run that trained
    # past the stage's cap is not the stage's
    stage_cap = trained["max_updates"]
    (hand / "config.yaml").write_text(yaml.safe_dump({**trained, "max_updates": stage_cap + 1}))
    with pytest.raises(SystemExit, match="'max_updates'"):
        ex.main(["link", *where, "pretrain", str(hand)])
    write_jsonl(hand / "train_log.jsonl", [{"update": stage_cap + 5, "elapsed": 1.0}])
    (hand / "config.yaml").write_text(yaml.safe_dump({**trained, "max_updates": 600}))
    with pytest.raises(SystemExit, match="'max_updates'"):
        ex.main(["link", *where, "pretrain", str(hand)])
    write_jsonl(hand / "train_log.jsonl", [{"update": 30000, "elapsed": 36000.0}])
    ex.main(["link", *where, "pretrain", str(hand)])
    assert (runs / "pretrain-s1").resolve() == hand.resolve()
    (hand / "config.yaml").write_text(yaml.safe_dump(trained))
    with pytest.raises(SystemExit, match="exists"):
        ex.main(["link", *where, "pretrain", str(hand)])

    for key, updates, seconds in (("ft-nll-s1", 500, 1800.0), ("ft-fadat-s1", 500, 2160.0),
                                  ("at-s1", 20000, 30000.0)):  # fmt: skip
        write_jsonl(runs / key / "train_log.jsonl", [{"update": updates, "elapsed": seconds}])
    for key in ("pretrain-s1", "at-s1", "ft-nll-s1", "ft-fadat-s1"):
        model_of(runs / key).mkdir(parents=True)
        (model_of(runs / key) / "config.json").write_text("{}")
    capsys.readouterr()
    ex.main(["status", *where])
    out = capsys.readouterr().out
    line = "pretrain-s1                30000/100000  updates  10.00 h  best valid BLEU  21.00"
    assert line + "  averaged" in out
    assert (
        "b(30000) - b(0.7·30000) = 0.00 (plateau: < 0.3 at >= 10000 updates); plateau at N = 30000"
        in out
    )
    assert (
        "pretrain-s1 plateau at N = 30000: 30000 × 0.0667 / 4 = 500.2 → 500 updates; "
        "warm-up 0.1 × 500 = 50; validate every 50"
    ) in out

    raw = tmp_path / "data" / "bible-en-es-4k" / "raw"
    raw.mkdir()
    (raw / "test.src.txt").write_text("The Lord is my shepherd.\nGod said: let there be light.\n")
    (raw / "test.ref.txt").write_text("\n".join(REFERENCE) + "\n")
    hyps_of = {"ft-nll": ["El Señor es es mi pastor;", "Y Dios dijo: luz."],
               "ft-fadat": ["y, de la y de", "3:16 á luz."]}  # fmt: skip

    def fake_evaluate(*args):
        args = list(args)
        assert args[0] == "evaluate"
        models = args[args.index("--model") + 1 : args.index("--data")]
        assert args[args.index("--subset") + 1] == "0"  # the whole test set
        assert args[args.index("--data") + 1] == str(tmp_path / "data" / "bible-en-es-4k")
        labels = model_labels(models)
        systems = []
        for label, model in zip(labels, models, strict=True):
            stage = Path(model).name.rsplit("-s", 1)[0]
            strategies = ("greedy", "beam5") if stage == "at" else ("greedy", "lookahead")
            for k, strategy in enumerate(strategies):
                p = {f"{labels[-1]}:beam5": 0.001}
                if stage in ("ft-fadat", "pretrain"):
                    p[f"{labels[0]}:{strategy}"] = {"ft-fadat": 0.012, "pretrain": 0.5}[
                        stage
                    ] + k / 10
                systems.append({
                    "name": f"{label}:{strategy}", "model": label, "tok_bleu": 20.0 + k,
                    "bleu": 19.0 + k, "chrf": 45.0, "throughput": 10.0, "p_value_tok_bleu": p,
                    "bleu_verbose": "BLEU = 1 (BP = 0.90 ratio = 0.93 hyp_len = 9 ref_len = 10)",
                })  # fmt: skip
                hyps = Path(args[args.index("--save-hypotheses") + 1])
                hyps.mkdir(parents=True, exist_ok=True)
                lines = hyps_of.get(stage, REFERENCE)
                name = f"{label}:{strategy}".replace("/", "_").replace(":", ".")
                (hyps / f"{name}.txt").write_text("\n".join(lines) + "\n")
        report = {"data": {"split": "test", "sentences": 2},
                  "models": [{"label": label} for label in labels], "systems": systems}  # fmt: skip
        Path(args[args.index("--report") + 1]).write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(ex, "fadat", fake_evaluate)
    ex.main(["evaluate", *where])
    out = capsys.readouterr().out
    assert "seed 2: missing" in out and (runs / "report-s1.json").exists()
    drift = json.loads((runs / "drift-s1.json").read_text())
    fadat_label = model_labels([str(model_of(runs / "ft-fadat-s1"))])[0]
    assert drift["systems"][f"{fadat_label}:lookahead"]["short_share"] == 6 / 8
    # repetition: tokenized words equal to the word before them ("es es"; Moses splits ";" ":"
    # "." off: 7 + 6 words), none in the reference or FA-DAT's "y , de la y de" / "3:16 á luz ."
    nll_label = model_labels([str(model_of(runs / "ft-nll-s1"))])[0]
    assert drift["systems"][f"{nll_label}:greedy"]["repetition"] == 1 / 13
    assert drift["systems"][f"{fadat_label}:greedy"]["repetition"] == 0.0
    assert drift["reference"]["repetition"] == 0.0
    monkeypatch.setattr(ex, "fadat", None)  # a second evaluate reuses the report
    ex.main(["evaluate", *where])
    # a report of an older evaluation without hypotheses: no drift statistics, no crash
    shutil.move(runs / "hypotheses-s1", tmp_path / "hypotheses-s1")
    capsys.readouterr()
    ex.main(["evaluate", *where])
    assert "report-s1.json: no hypotheses-s1" in capsys.readouterr().out
    shutil.move(tmp_path / "hypotheses-s1", runs / "hypotheses-s1")

    # the AT (trained from scratch, validated every 1,000 updates) beside the pre-training in
    # the table at equal updates; the fine-tuning stages (init_from) are not in it
    write_jsonl(runs / "at-s1" / "valid_log.jsonl", curve([(1000, 5.0), (2000, 8.25)]))
    write_jsonl(runs / "ft-nll-s1" / "valid_log.jsonl", curve([(50, 30.0)]))
    plot = tmp_path / "out" / "curves.png"
    capsys.readouterr()
    ex.main(["table", *where, "--plot", str(plot)])
    out = capsys.readouterr().out
    head = "| system | tok BLEU s1 | sacreBLEU s1 | chrF s1 | p s1 |"
    assert head in out
    assert "| ft-nll:greedy | 20.00 | 19.00 | 45.0 | – |" in out
    assert "| ft-fadat:greedy | 20.00 | 19.00 | 45.0 | 0.0120 |" in out
    assert "| ft-fadat:lookahead | 21.00 | 20.00 | 45.0 | 0.1120 |" in out
    assert "| pretrain:greedy | 20.00 | 19.00 | 45.0 | 0.5000 |" in out
    assert "| at:beam5 | 21.00 | 20.00 | 45.0 | – |" in out
    assert "| ft-fadat-s1 | 500 | 0.60 | 4.32 |" in out  # time per arm: 2,160 s / 500 updates
    assert "| pretrain-s1 | 30000 | 10.00 | 1.20 |" in out
    assert "| reference | 14 | 1.00 | 1.00 | 42.9 % | 14 | – | 0.00 % |" in out
    assert "| ft-fadat:lookahead | 8 | 0.57 | 0.38 | 75.0 % | 7 | 0.93 | 0.00 % |" in out
    assert "| ft-nll:greedy | 10 | 0.71 | 0.67 | 50.0 % | 9 | 0.93 | 7.69 % |" in out
    assert "| update | pretrain-s1 | at-s1 |" in out
    assert "| 500 | 0.50 | – |" in out and "| 2000 | 2.00 | 8.25 |" in out
    assert "| 30000 | 21.00 | – |" in out and "| 50 |" not in out
    assert "| 30000 ← N | 8.33 | 7.900 | 21.00 | 21.00 | 0.00 |" in out
    assert "| 29500 | 8.19 | 7.900 | 21.00 | 21.00 | 0.50 |" in out
    assert "| 500 | 0.14 | 9.950 | 0.50 | 0.50 | – |" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_plateau_experiment_end_to_end_with_real_fadat(tmp_path, monkeypatch):
    """Real fadat on the copy task of test_train: a plateau stage stopped by SIGINT once its
    criterion holds and averaged up to N, then a fine-tune from another seed with the derived
    budget, warm-up and validation interval."""
    from copy_task import prepare_copy_data

    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path)
    monkeypatch.setattr(ex, "POLL_SECONDS", 0.2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    data = prepare_copy_data(tmp_path, repeats=False)
    (tmp_path / "configs").mkdir()
    base = {"arch": "dat", "preset": "tiny", "lr": 0.001, "dropout": 0.1, "valid_subset": 0}
    for name, extra in (
        ("pre", {"objective": "nll", "warmup": 10, "max_tokens": 300, "update_freq": 1}),
        ("ft", {"objective": "fuzzy", "glat_p": "0.1", "max_tokens": 300, "update_freq": 2}),
    ):
        (tmp_path / "configs" / f"{name}.yaml").write_text(yaml.safe_dump({**base, **extra}))
    experiment = tmp_path / "exp.yaml"
    plateau = {"plateau": {"min_updates": 4, "window": 0.5, "gain": 1000}}  # holds at N = 4
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "e2e",
                "data": "data",
                "stages": [
                    {"name": "pre", "config": "configs/pre.yaml", "until": plateau,
                     "max_updates": 100000, "average": 2, "train": {"validate_every": 2}},
                    {"name": "ft", "config": "configs/ft.yaml", "seeds": [3],
                     "init_from": {"stage": "pre", "seed": 1}, "average": 1,
                     "max_updates": {"share_of_pretrain_tokens": 2.0, "batch_ratio": 2},
                     "warmup_share": 0.5, "validations": 2},
                ],
            }
        )
    )  # fmt: skip
    where = [str(experiment), "--root", str(tmp_path / "runs"), "--data-root", str(data.parent)]
    ex.main(["run", *where, "--slice", "5m", "--threads", "1"])
    runs = tmp_path / "runs" / "e2e"
    pre = runs / "pre-s1"
    assert ex.plateau_update(ex.valid_curve(pre), ex.load(str(experiment))[1][0].plateau) == 4
    assert ex.progress(pre)[0] < 100000  # interrupted, not run to max_updates
    averaged = json.loads((model_of(pre) / "config.json").read_text())
    assert averaged["model_type"] == "dat"
    ft = runs / "ft-s3"
    config = yaml.safe_load((ft / "config.yaml").read_text())
    # round(4 × 2.0 / 2) = 4 updates, warm-up 0.5 × 4 = 2, validate every 4 // 2 = 2
    assert (config["max_updates"], config["warmup"], config["validate_every"]) == (4, 2, 2)
    assert (config["seed"], config["init_from"]) == (3, str(model_of(pre)))
    assert ex.progress(ft)[0] == 4 and (model_of(ft) / "config.json").exists()


def test_distilled_dataset_is_built_when_a_stage_needs_it(tmp_path, monkeypatch, capsys):
    ex, where, runs = plateau_setup(tmp_path, monkeypatch)
    data = tmp_path / "data"
    (data / "bible-en-es" / "raw").mkdir()
    (data / "bible-en-es" / "raw" / "test.ref.txt").write_text("a\nb\n")
    (data / "bible-en-es" / "meta.json").write_text('{"source_lang": "en", "target_lang": "es"}')
    (data / "bible-en-es-4k" / "spm.model").write_text("")  # the retokenizing's vocabulary
    test_refs = {"bible-en-es-4k-kd": "a\nb\n"}

    def fake(*args):
        args = list(args)
        calls.append(args)
        out = Path(args[args.index("--output") + 1])
        (out / "raw").mkdir(parents=True)
        (out / "meta.json").write_text('{"source_lang": "en", "target_lang": "es"}')
        (out / "raw" / "test.ref.txt").write_text(test_refs.get(out.name, "a\nb\n"))
        return 0

    calls: list[list[str]] = []
    monkeypatch.setattr(ex, "fadat", fake)
    monkeypatch.setattr(ex, "export_text", lambda source, out: ["--source-file", str(out)])
    # named, an optional stage waits for the AT teacher
    ex.main(["run", *where, "--only", "kd-pretrain-s1"])
    teacher = tmp_path / "models" / "bible-en-es-at-cpu-small"  # in the (fake) checkout
    assert f"kd-pretrain-s1: waits for the teacher {teacher}" in capsys.readouterr().out
    for model in (teacher, model_of(runs / "at-s1"), model_of(runs / "pretrain-s1")):
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    # not named, it does not run (the others wait for the pre-training's plateau)
    ex.main(["run", *where])
    assert calls == []
    assert capsys.readouterr().out.endswith(
        "waiting: ft-nll-s1, ft-nll-s2, ft-fadat-s1, ft-fadat-s2\n"
    )
    monkeypatch.setattr(ex, "train_until_plateau", lambda cmd, run_dir, p: calls.append(cmd) or 1)
    with pytest.raises(SystemExit, match="kd-pretrain-s1: fadat train exited 1"):
        ex.main(["run", *where, "--threads", "1", "--only", "kd-pretrain-s1"])
    kd, kd4 = data / "bible-en-es-kd", data / "bible-en-es-4k-kd"
    assert calls[0] == [
        "distill", "--model", str(teacher), "--data", str(data / "bible-en-es"),
        "--output", str(kd), "--beam", "5", "--threads", "1", "--no-progress-bar",
    ]  # fmt: skip
    assert calls[1] == [
        "prepare", "--output", str(kd4), "--source-file", str(data / "bible-en-es-4k-kd.text"),
        "--spm-model", str(data / "bible-en-es-4k" / "spm.model"),
        "--source-lang", "en", "--target-lang", "es",
    ]  # fmt: skip
    assert calls[2][calls[2].index("--data") + 1] == str(kd4)  # the DAT trains on it
    # a re-prepared dataset whose test references changed is refused
    for d in (kd, kd4):
        shutil.rmtree(d)
    test_refs["bible-en-es-4k-kd"] = "a\nB\n"
    with pytest.raises(SystemExit, match="test.ref.txt: differs from"):
        ex.main(["run", *where, "--only", "kd-pretrain-s1"])


def test_distilled_dataset_by_a_model_of_the_checkout(tmp_path, monkeypatch):
    """``distill: {model: PATH}``: the teacher is a model directory of the checkout (a released
    model), so the dataset rebuilds from a clone; it waits while the model is not there."""
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path / "checkout")
    (tmp_path / "data" / "raw8k").mkdir(parents=True)
    (tmp_path / "data" / "raw8k" / "meta.json").write_text("{}")
    spec = {"datasets": {"kd": {"distill": {"model": "models/at", "data": "raw8k", "beam": 1}}}}
    paths = ex.Paths(tmp_path / "runs", tmp_path / "data")
    calls: list[list[str]] = []

    def fake(*args):
        calls.append(list(args))
        return 0

    monkeypatch.setattr(ex, "fadat", fake)
    teacher = tmp_path / "checkout" / "models" / "at"
    assert ex.make_dataset("kd", spec, paths, 2) == (
        f"waits for the teacher {teacher} (missing from this checkout: not committed yet)"
    )
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text("{}")
    assert ex.make_dataset("kd", spec, paths, 2) == "" and calls == [
        ["distill", "--model", str(teacher), "--data", str(tmp_path / "data" / "raw8k"),
         "--output", str(tmp_path / "data" / "kd"), "--beam", "1", "--threads", "2",
         "--no-progress-bar"],
    ]  # fmt: skip
    # one of teacher and model, not both or neither
    both = {"distill": {"model": "models/at", "teacher": "at", "data": "raw8k"}}
    for recipe in (both, {"distill": {"data": "raw8k"}}):
        experiment = tmp_path / "e.yaml"
        experiment.write_text(
            yaml.safe_dump({"name": "e", "datasets": {"kd": recipe}, "stages": []})
        )
        with pytest.raises(SystemExit, match="distill needs one of teacher"):
            ex.load(str(experiment))


def kd_then_4k_experiment(ex, tmp_path, teacher: dict):
    """Datasets ``raw8k`` and ``raw4k`` (its ``spm.model`` left to the test), the experiment's
    ``kd`` (``raw8k`` distilled by ``teacher``) and ``kd4k`` (``kd`` retokenized with raw4k's
    vocabulary); returns (spec, paths)."""
    for name in ("raw8k", "raw4k"):
        (tmp_path / "data" / name).mkdir(parents=True)
        (tmp_path / "data" / name / "meta.json").write_text(
            '{"source_lang": "en", "target_lang": "es"}'
        )
    spec = {
        "datasets": {
            "kd": {"distill": {**teacher, "data": "raw8k", "beam": 1}},
            "kd4k": {"retokenize": {"data": "kd", "spm_model_of": "raw4k"}},
        }
    }
    return spec, ex.Paths(tmp_path / "runs", tmp_path / "data")


def test_dataset_plan_gives_the_chain_and_what_it_lacks(tmp_path, monkeypatch):
    """dataset_plan: the derived datasets to build (the one asked for first) and what they need
    that nothing builds, before anything is built."""
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path / "checkout")
    spec, paths = kd_then_4k_experiment(ex, tmp_path, {"teacher": "at", "seed": 2})
    data, teacher = tmp_path / "data", tmp_path / "runs" / "models" / "at-s2"
    kd = ("kd", "distill", {"teacher": "at", "seed": 2, "data": "raw8k", "beam": 1})
    kd4k = ("kd4k", "retokenize", {"data": "kd", "spm_model_of": "raw4k"})
    spm = f"{data / 'raw4k' / 'spm.model'} (the vocabulary of raw4k)"
    # the teacher stage not trained yet, no 4k vocabulary: both, in chain order
    assert ex.dataset_plan("kd4k", spec, paths) == ([kd4k, kd], [spm, f"the teacher {teacher}"])
    assert ex.dataset_plan("kd", spec, paths) == ([kd], [f"the teacher {teacher}"])
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text("{}")
    assert ex.dataset_plan("kd4k", spec, paths) == ([kd4k, kd], [spm])
    # everything present
    (data / "raw4k" / "spm.model").write_text("")
    assert ex.dataset_plan("kd4k", spec, paths) == ([kd4k, kd], [])
    # kd built: only the retokenizing is left; both built: nothing
    (data / "kd").mkdir()
    (data / "kd" / "meta.json").write_text("{}")
    assert ex.dataset_plan("kd4k", spec, paths) == ([kd4k], [])
    (data / "kd4k").mkdir()
    (data / "kd4k" / "meta.json").write_text("{}")
    assert ex.dataset_plan("kd4k", spec, paths) == ([], [])
    # the dataset the chain starts from is missing (the experiment does not derive it)
    shutil.rmtree(data / "kd")
    shutil.rmtree(data / "kd4k")
    shutil.rmtree(data / "raw8k")
    assert ex.dataset_plan("kd4k", spec, paths) == (
        [kd4k, kd],
        [f"the dataset {data / 'raw8k'} (no meta.json)"],
    )
    # neither built nor derived
    assert ex.dataset_plan("other", spec, paths) == (
        [],
        [f"the dataset {data / 'other'} (no meta.json)"],
    )
    # a distilling model of the checkout that is not there
    spec, paths = kd_then_4k_experiment(ex, tmp_path / "m", {"model": "models/at"})
    (tmp_path / "m" / "data" / "raw4k" / "spm.model").write_text("")
    chain, lacks = ex.dataset_plan("kd4k", spec, paths)
    assert [step for step, _, _ in chain] == ["kd4k", "kd"]
    assert lacks == [
        f"the teacher {tmp_path / 'checkout' / 'models' / 'at'} (missing from this checkout: "
        "not committed yet)"
    ]
    # a retokenizing with the vocabulary of a dataset that the chain builds before it
    spec["datasets"]["kd4k"]["retokenize"]["spm_model_of"] = "kd"
    (tmp_path / "checkout" / "models" / "at").mkdir(parents=True)
    (tmp_path / "checkout" / "models" / "at" / "config.json").write_text("{}")
    assert ex.dataset_plan("kd4k", spec, paths)[1] == []


def test_make_dataset_reports_a_missing_vocabulary_before_distilling(tmp_path, monkeypatch):
    """The retokenizing's sentencepiece model is missing: make_dataset says so without running
    the (20-minute) ``fadat distill`` that comes first; once it is there, both steps run."""
    ex = load_recipe("experiment")
    monkeypatch.setattr(ex, "ROOT", tmp_path / "checkout")
    spec, paths = kd_then_4k_experiment(ex, tmp_path, {"model": "models/at"})
    teacher = tmp_path / "checkout" / "models" / "at"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text("{}")
    data = tmp_path / "data"
    calls: list[list[str]] = []

    def fake(*args):
        calls.append(list(args))
        out = Path(args[args.index("--output") + 1])
        out.mkdir(parents=True)
        (out / "meta.json").write_text('{"source_lang": "en", "target_lang": "es"}')
        return 0

    monkeypatch.setattr(ex, "fadat", fake)
    monkeypatch.setattr(ex, "export_text", lambda source, out: ["--source-file", str(out)])
    spm = data / "raw4k" / "spm.model"
    assert ex.make_dataset("kd4k", spec, paths, 1) == f"waits for {spm} (the vocabulary of raw4k)"
    assert calls == [] and not (data / "kd").exists()
    spm.write_text("")
    assert ex.make_dataset("kd4k", spec, paths, 1) == ""
    assert [c[0] for c in calls] == ["distill", "prepare"]
    assert calls[1][calls[1].index("--spm-model") + 1] == str(spm)


def test_retokenize_round_trips_a_prepared_dataset(tmp_path, capsys):
    """The copy task of test_train prepared by the real fadat prepare (word pieces): exported as
    text and prepared again with its own sentencepiece model, it gives the same ids."""
    import numpy as np
    from copy_task import prepare_copy_data

    ex = load_recipe("experiment")
    data = prepare_copy_data(tmp_path, repeats=False)
    flags = ex.export_text(data, tmp_path / "text")
    assert (tmp_path / "text" / "train.src").read_text() == (tmp_path / "train.src").read_text()
    assert (tmp_path / "text" / "train.tgt").read_text() == (tmp_path / "train.tgt").read_text()
    raw = data / "raw"
    assert flags[4:] == [
        "--valid-source-file", str(raw / "valid.src.txt"),
        "--valid-target-file", str(raw / "valid.ref.txt"),
    ]  # fmt: skip
    # a source dataset with a known licence and attribution (the copy data has the defaults)
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    assert meta["licence"] == "unknown (user-supplied text)"
    meta.update(licence="CC0-1.0", attribution="copy pairs, generated")
    (data / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    spec = {"datasets": {"again": {"retokenize": {"data": "data", "spm_model_of": "data"}}}}
    assert ex.make_dataset("again", spec, ex.Paths(tmp_path / "runs", tmp_path), 1) == ""
    again = json.loads((tmp_path / "again" / "meta.json").read_text(encoding="utf-8"))
    assert (again["licence"], again["attribution"]) == ("CC0-1.0", "copy pairs, generated")
    for name in ("train.src.ids.npy", "train.tgt.ids.npy", "valid.src.ids.npy"):
        assert np.array_equal(np.load(data / name), np.load(tmp_path / "again" / name))
    assert (tmp_path / "again" / "raw" / "valid.ref.txt").read_text() == (
        raw / "valid.ref.txt"
    ).read_text()
