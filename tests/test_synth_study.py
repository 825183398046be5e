"""The synthetic study recipe (recipes/synth_study.py): its statistics against closed forms, the
convergence criterion on synthetic curves, the plan (branch points, phases, order, estimates),
the job state (done, stale inputs), the resumption of a killed pre-training (a tiny real run),
and the tables and plot from fake results."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from test_recipes import load_recipe


@pytest.fixture(scope="module")
def study():
    return load_recipe("synth_study")


def test_paired_t_test_and_mcnemar_against_closed_forms(study):
    # Student's t with 2 degrees of freedom: P(|T| > t) = 1 − t / sqrt(t² + 2).
    for diffs in ([1.0, 2.0, 3.0], [0.5, -0.1, 0.2], [-3.0, -2.5, -2.9]):
        mean = sum(diffs) / 3
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
        t = abs(mean) / (sd / math.sqrt(3))
        assert study.t_test_p(diffs) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-4)
    # Student's t with 1 degree of freedom (Cauchy): P(|T| > t) = 1 − 2 atan(t) / π.
    assert study.t_test_p([1.0, 3.0]) == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, abs=1e-4)
    # Exact McNemar: 5 discordant pairs all one way: 2 · 2⁻⁵.
    a = [True] * 5 + [True, False] * 3
    b = [False] * 5 + [True, False] * 3
    assert study.mcnemar_p(a, b) == pytest.approx(2 / 32)
    assert study.mcnemar_p(a, a) == 1.0
    assert study.mcnemar_p([True, False], [False, True]) == 1.0


# ----------------------------------------------------------------------------- the criterion


def _first_stop(study, losses, crit, entropy=None, every=200):
    """The verdict at the first validation where the run stops (or at the end of the curve)."""
    curve = [((i + 1) * every, x) for i, x in enumerate(losses)]
    for k in range(1, len(curve) + 1):
        verdict = study.judge(curve[:k], crit, entropy)
        if verdict.stop:
            return verdict
    return verdict


def test_criterion_stops_after_a_minimum_followed_by_overfitting(study):
    crit = study.Criterion(patience=3, rise_rel=0.02, rise_abs=0.002, min_updates=600, cap=10_000)
    # Falls to 0.50 at update 1000 (5th validation), then rises 0.004 per validation: the margin
    # is max(2 % of 0.50, 0.002) = 0.010, reached at 0.512 (update 1600, 3 validations later).
    losses = [0.9, 0.7, 0.6, 0.55, 0.50, 0.504, 0.508, 0.512, 0.516]
    v = _first_stop(study, losses, crit)
    assert (v.reason, v.best_update, v.best_loss, v.last_update) == ("overfit", 1000, 0.50, 1600)
    assert v.since_best == 3 and v.rise == pytest.approx(0.012)
    # A slower rise (0.002 per validation) reaches the margin later: 0.510 at update 2000.
    slow = [0.9, 0.7, 0.6, 0.55, 0.50, 0.502, 0.504, 0.506, 0.508, 0.510, 0.512]
    assert _first_stop(study, slow, crit).last_update == 2000
    # The same curve, but the minimum comes before min_updates: no stop before update 2000.
    late = dataclasses.replace(crit, min_updates=2000)
    v = _first_stop(study, [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4], late)
    assert (v.reason, v.best_update, v.last_update) == ("overfit", 200, 2000)


def test_criterion_does_not_stop_a_falling_or_noisy_curve_before_the_cap(study):
    crit = study.Criterion(patience=3, rise_rel=0.02, rise_abs=0.002, min_updates=600, cap=4000)
    falling = [1.0 / (1 + 0.1 * i) for i in range(20)]  # still falling at the cap (update 4000)
    v = _first_stop(study, falling, crit)
    assert (v.reason, v.last_update, v.best_update) == ("cap", 4000, 4000)
    # A falling curve with one spike far above its minimum: the minimum is recent, no stop.
    spiky = [1.0, 0.9, 0.8, 0.7, 1.5, 0.65, 0.6, 0.58, 0.57, 0.56]
    assert not study.judge([((i + 1) * 200, x) for i, x in enumerate(spiky)], crit, None).stop
    # A plateau with noise below the margin (±0.004 around 0.50, margin 0.010): no overfit;
    # the cap stops it.
    noise = [0.004, -0.003, 0.002, -0.004, 0.003, 0.0, -0.002, 0.004, -0.001, 0.001]
    plateau = [0.8, 0.6] + [0.5 + noise[i % 10] for i in range(18)]
    v = _first_stop(study, plateau, crit)
    assert v.reason == "cap" and v.best_loss == pytest.approx(0.496)
    # The same noise on a rising curve: stops once the rise exceeds the margin.
    rising = [0.8, 0.6, 0.5] + [0.5 + 0.003 * (i + 1) + noise[i] for i in range(10)]
    v = _first_stop(study, rising, crit)
    assert v.reason == "overfit" and v.best_update == 600
    assert v.rise >= 0.010 and v.since_best >= 3
    # Ties: the earliest minimum is the one early stopping keeps.
    assert study.judge([(200, 0.5), (400, 0.5), (600, 0.6)], crit, None).best_update == 200
    assert not study.judge([], crit, None).stop


def test_criterion_floor_at_the_data_entropy(study):
    crit = study.Criterion(patience=5, rise_rel=0.02, rise_abs=0.002, min_updates=600, cap=4000)
    det = [0.5, 0.01, 0.0015, 0.0012, 0.0011]  # entropy 0: within 0.002 from update 600 on
    v = _first_stop(study, det, crit, entropy=0.0)
    assert (v.reason, v.last_update) == ("floor", 600)
    # Without a known entropy (the AT's smoothed loss) the floor never applies.
    assert _first_stop(study, det, crit, entropy=None).reason == ""
    # med: 0.05 nats above its entropy is no floor.
    assert _first_stop(study, [0.6, 0.4, 0.25, 0.24], crit, entropy=0.19).reason == ""


# ----------------------------------------------------------------------------- the plan


def test_branch_points_arms_and_phases(study, tmp_path):
    s = study.Settings()
    jobs = {j.name: j for j in study.plan(tmp_path, s)}
    assert len(jobs) == len(study.plan(tmp_path, s))  # unique names
    pre = jobs["pre-med-l4-s2"]
    t = pre.training
    assert [p for p, _ in t.snapshots] == ["u1200", "u3000", "min", "stop"]
    assert t.criterion.min_updates == 3000 and t.criterion.cap == s.caps["med"]
    assert pre.early == (tmp_path / "models" / "pre-med-l4-s2-u1200", t.snapshots[1][1])
    # Both arms at every branch point; the long NLL arm only at the last one.
    for point in ("u1200", "u3000", "min", "stop"):
        for arm in ("nll", "fuzzy-n2"):
            job = jobs[f"{arm}-high-l4-s3-{point}"]
            assert job.training.init == tmp_path / "models" / f"pre-high-l4-s3-{point}"
            assert job.training.max_updates == s.finetune_updates
    assert jobs["nll-long-high-l4-s3-stop"].training.max_updates == s.long_updates
    assert "nll-long-high-l4-s3-min" not in jobs
    # The two arms are identical but for the objective.
    a = study.yaml.safe_load(jobs["nll-med-l4-s1-min"].training.config.read_text())
    b = study.yaml.safe_load(jobs["fuzzy-n2-med-l4-s1-min"].training.config.read_text())
    differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differ == {"objective", "ngram_order"}
    assert jobs["nll-med-l4-s1-min"].phase == "main"
    assert jobs["nll-med-l4-s1-u1200"].phase == "curve"
    # The large level: one seed, every branch point, ten times the training pairs.
    assert {"pre-med10x-l4-s1", "fuzzy-n2-med10x-l4-s1-u3000", "eval-med10x-l4-s1-stop"} <= set(
        jobs
    )
    assert "pre-med10x-l4-s2" not in jobs
    prepare = jobs["data-med10x"].commands[0]
    assert prepare[prepare.index("--train-size") + 1] == str(10 * s.train_size)
    # Figure 2: every λ ≠ 4 pre-trained to convergence, arms only at its branch point.
    assert jobs["pre-med-l8-s1"].training.criterion is not None
    assert "fuzzy-n2-med-l2-s3-min" in jobs and "fuzzy-n2-med-l2-s3-u1200" not in jobs
    assert "pre-high-l8-s1" not in jobs
    # The AT: to its own convergence, no entropy floor, evaluated at its minimum.
    at = jobs["at-det-s2"].training
    assert at.criterion.cap == s.caps["at"] and not at.floor
    assert jobs["eval-at-det-s2"].inputs[1] == tmp_path / "models" / "at-det-s2-min"
    at_cfg = study.yaml.safe_load(at.config.read_text())
    assert at_cfg["lr"] == 0.0005 and at_cfg["validate_every"] == s.validate_every
    # Other branch points from the command line's form.
    other = study.Settings(branches=("600", "min", "stop"))
    other.check()
    names = {j.name for j in study.plan(tmp_path, other)}
    assert "nll-det-l4-s1-u600" in names and "nll-det-l4-s1-u1200" not in names
    for bad in (("min", "1100"), ("stop",), ("12a", "min")):
        with pytest.raises(SystemExit):
            study.Settings(branches=bad).check()
    with pytest.raises(SystemExit):
        study.Settings(phases=("main", "nope")).check()


def test_phase_subsets_pull_in_their_inputs_and_keep_the_order(study, tmp_path):
    s = study.Settings()
    every = study.plan(tmp_path, s)
    curve = study.select(every, ("curve",))
    names = [j.name for j in curve]
    # The curve needs the main pre-trainings and their data, not the main fine-tunes.
    assert {"data-med", "pre-med-l4-s1", "nll-med-l4-s1-u3000"} <= set(names)
    assert "nll-med-l4-s1-min" not in names and "pre-med10x-l4-s1" not in names
    order = [j.name for j in study.select(every, study.PHASES)]
    assert order[:3] == ["data-det", "data-med", "data-high"]
    assert order.index("eval-high-l4-s1-min") < order.index("pre-det-l4-s2")
    assert order.index("eval-high-l4-s3-min") < order.index("nll-det-l4-s1-u1200")
    last = {
        p: max(i for i, j in enumerate(study.select(every, study.PHASES)) if j.phase == p)
        for p in study.PHASES
    }
    assert [last[p] for p in study.PHASES] == sorted(last.values())
    # Every input is written by a job of the plan that comes no later in the order.
    made = study.producers(every)
    position = {n: i for i, n in enumerate(order)}
    for job in study.select(every, study.PHASES):
        for path in job.inputs:
            assert position[made[path].name] < position[job.name]


def test_inputs_are_available_early_only_for_fixed_branch_points(study, tmp_path):
    jobs = {j.name: j for j in study.plan(tmp_path, study.Settings())}
    pre = jobs["pre-med-l4-s1"]
    u1200, minimum = (tmp_path / "models" / f"pre-med-l4-s1-{p}" for p in ("u1200", "min"))
    for d in (u1200, minimum):
        d.mkdir(parents=True)
        (d / "snapshot.json").write_text(json.dumps({"update": 1}))
    assert study.available(u1200, pre, done=set())  # written once, final: the curve starts
    assert not study.available(minimum, pre, done=set())  # may still move
    assert study.available(minimum, pre, done={pre.name})
    assert not study.available(tmp_path / "models" / "pre-med-l4-s1-u3000", pre, done={pre.name})


def test_done_state_follows_settings_and_input_snapshots(study, tmp_path):
    s = study.Settings()
    jobs = {j.name: j for j in study.plan(tmp_path, s)}
    job = jobs["nll-med-l4-s1-min"]
    init, model = job.training.init, job.outputs[0]
    for d, text in ((init, '{"update": 3400}'), (model, '{"update": 100}')):
        d.mkdir(parents=True)
        (d / "snapshot.json").write_text(text)
    (tmp_path / "data" / "med").mkdir(parents=True)
    (tmp_path / "data" / "med" / "meta.json").write_text("{}")
    assert not study.is_done(tmp_path, job)
    study.mark_done(tmp_path, job)
    assert study.is_done(tmp_path, job)
    # A larger budget: not done (the run continues).
    longer = dataclasses.replace(s, finetune_updates=200)
    job2 = {j.name: j for j in study.plan(tmp_path, longer)}["nll-med-l4-s1-min"]
    assert not study.is_done(tmp_path, job2)
    study.plan(tmp_path, s)  # the configs back as they were
    assert study.is_done(tmp_path, job)
    # The pre-training moved its minimum: the fine-tune is stale, and its run starts afresh.
    run = job.training.run_dir
    study._prepare_run_dir(job.training)
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"")
    study._prepare_run_dir(job.training)
    assert (run / "checkpoint_last.pt").exists()  # same inputs: resumes
    (init / "snapshot.json").write_text('{"update": 3600}')
    assert not study.is_done(tmp_path, job)
    study._prepare_run_dir(job.training)
    assert not run.exists()


def test_plan_estimates_use_measurements_when_there_are_some(study, tmp_path):
    s = study.Settings()
    jobs = {j.name: j for j in study.plan(tmp_path, s)}
    pre = jobs["pre-med-l4-s1"]
    low, high = study.estimate(pre, {})
    validations = s.min_updates() / s.validate_every * study.SECONDS_PER_VALIDATION
    assert low == pytest.approx(s.min_updates() * study.SECONDS_PER_UPDATE["pre"] + validations)
    # λ = 8 costs twice λ = 4 per update (estimate).
    assert study.estimate(jobs["pre-med-l8-s1"], {})[0] == pytest.approx(
        2 * s.min_updates() * study.SECONDS_PER_UPDATE["pre"] + validations
    )
    times = {"pre-det-l4-s1": {"seconds": 500.0, "updates": 4000, "kind": "pre"}}
    (tmp_path / "times.json").write_text(json.dumps(times))
    rates = study.measured_rates(tmp_path)
    assert rates == {"pre": 0.125}
    assert study.estimate(pre, rates) == (s.min_updates() * 0.125, s.caps["med"] * 0.125)
    text = study.plan_text(tmp_path, dataclasses.replace(s, phases=("main", "at")))
    assert "pre 0.125 (measured)" in text and "## curve" not in text
    assert text.index("## main") < text.index("## at")


def test_two_schedulers_on_one_root_do_not_share_temporaries(study, tmp_path):
    # Another scheduler is midway through writing settings.json: its temporary (here a
    # directory, so that reusing its name fails) must not be this writer's temporary.
    (tmp_path / "settings.json.tmp").mkdir()
    study._atomic_text(tmp_path / "settings.json", "{}\n")
    assert (tmp_path / "settings.json").read_text() == "{}\n"
    assert (tmp_path / "settings.json.tmp").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["settings.json", "settings.json.tmp"]
    # times.json adds up what each scheduler records (read, add, write under one lock).
    jobs = {j.name: j for j in study.plan(tmp_path, study.Settings())}
    study._record_time(tmp_path, jobs["pre-med-l4-s1"], 10.0, 100)
    study._record_time(tmp_path, jobs["pre-med-l4-s1"], 5.0, 50)
    study._record_time(tmp_path, jobs["at-med-s1"], 2.0, 20)
    times = json.loads((tmp_path / "times.json").read_text())
    assert times["pre-med-l4-s1"] == {"seconds": 15.0, "updates": 150, "kind": "pre"}
    assert times["at-med-s1"] == {"seconds": 2.0, "updates": 20, "kind": "at"}


def test_scheduler_starts_a_curve_arm_while_its_pretraining_runs(study, tmp_path):
    every = study.plan(tmp_path, study.Settings())
    made = study.producers(every)
    done = set()
    for level in study.LEVELS:
        (tmp_path / "data" / level).mkdir(parents=True)
        (tmp_path / "data" / level / "meta.json").write_text("{}")
        done.add(f"data-{level}")
    pending = [j for j in study.select(every, study.PHASES) if j.name not in done]
    first = study.startable(pending, made, done, 2)
    assert [j.name for j in first] == ["pre-det-l4-s1", "pre-med-l4-s1"]
    pending = [j for j in pending if j not in first]
    # While pre-med-l4-s1 runs, its update-1200 snapshot appears: the curve's arms there can
    # start (after the main phase's startable jobs), its `min` arms and evaluations cannot.
    snap = tmp_path / "models" / "pre-med-l4-s1-u1200"
    snap.mkdir(parents=True)
    (snap / "snapshot.json").write_text('{"update": 1200}')
    assert study.startable(pending, made, done, 1)[0].name == "pre-high-l4-s1"
    names = [j.name for j in study.startable(pending, made, done, 10_000)]
    assert {"nll-med-l4-s1-u1200", "fuzzy-n2-med-l4-s1-u1200"} <= set(names)
    assert names.index("pre-med10x-l4-s1") > names.index("fuzzy-n2-med-l4-s1-u1200")
    assert not {"nll-med-l4-s1-min", "eval-med-l4-s1-u1200", "nll-det-l4-s1-u1200"} & set(names)
    assert study.startable(pending, made, done, 0) == []


def test_a_job_waits_for_another_process_running_it(study, tmp_path):
    import fcntl
    import threading

    s = study.Settings(**TINY)
    job = {j.name: j for j in study.plan(tmp_path, s)}["data-det"]
    lock = study.state_path(tmp_path, job).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    result = []
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # another session runs the job
        thread = threading.Thread(target=lambda: result.append(study.run_job(tmp_path, job)))
        thread.start()
        thread.join(2.0)
        assert thread.is_alive() and not result and not study.is_done(tmp_path, job)
    thread.join(120)
    assert result[0][1] == 0 and study.is_done(tmp_path, job)


# ----------------------------------------------------------------------------- a real tiny run

TINY = dict(
    seeds=(1,),
    large_seeds=(1,),
    train_size=120,
    data_options=(
        "--source-types", "16", "--max-words", "5", "--seed", "1",
        "--valid-size", "12", "--test-size", "12",
    ),
    validate_every=2,
    patience=1,
    rise_rel=0.0,
    rise_abs=0.0,
    caps={"det": 6, "med": 6, "high": 6, "med10x": 6, "at": 6},
    at_min_updates=2,
    branches=("2", "min", "stop"),
    finetune_updates=2,
    long_updates=2,
)  # fmt: skip


def test_a_killed_pretraining_resumes_to_the_same_run(study, tmp_path, monkeypatch):
    s = study.Settings(**TINY)
    s.check()
    roots = {"a": tmp_path / "a", "b": tmp_path / "b"}
    jobs = {k: {j.name: j for j in study.plan(root, s)} for k, root in roots.items()}
    assert study.run_job(roots["a"], jobs["a"]["data-med"])[1] == 0
    study.shutil.copytree(roots["a"] / "data", roots["b"] / "data")
    study.mark_done(roots["b"], jobs["b"]["data-med"])
    # a: uninterrupted.
    assert study.run_job(roots["a"], jobs["a"]["pre-med-l4-s1"])[1:4:2] == (0, 6)
    # b: killed right after its second segment (checkpoint at update 4 written, the recipe's
    # bookkeeping not done), run again and killed right after its last segment (update 6, the
    # minimum of this falling curve, not yet kept), then run a third time.
    real, calls = study._train_to, []

    def killed(t, target):
        real(t, target)
        calls.append(target)
        if len(calls) in (2, 3):
            raise KeyboardInterrupt

    monkeypatch.setattr(study, "_train_to", killed)
    job = jobs["b"]["pre-med-l4-s1"]
    with pytest.raises(KeyboardInterrupt):
        study.run_job(roots["b"], job)
    assert not study.is_done(roots["b"], job)
    assert study.exists(job.early[0])  # the update-2 snapshot was written before the kill
    assert not study.exists(roots["b"] / "models" / "pre-med-l4-s1-min")
    with pytest.raises(KeyboardInterrupt):
        study.run_job(roots["b"], job)
    assert calls == [2, 4, 6] and not study.is_done(roots["b"], job)
    assert study.run_job(roots["b"], job)[1:4:2] == (0, 0)  # nothing left to train
    assert calls == [2, 4, 6] and study.is_done(roots["b"], job)
    curves = [
        [(e["update"], e["valid_loss"]) for e in study.read_curve(r / "runs" / "pre-med-l4-s1")]
        for r in roots.values()
    ]
    assert [u for u, _ in curves[0]] == [2, 4, 6]
    assert curves[0] == curves[1]  # exact resumption
    verdicts = [
        json.loads((r / "runs/pre-med-l4-s1/verdict.json").read_text()) for r in roots.values()
    ]
    assert verdicts[0] == verdicts[1]
    best = min(curves[0], key=lambda e: e[1])
    for root in roots.values():
        snap = json.loads((root / "models/pre-med-l4-s1-min/snapshot.json").read_text())
        assert (snap["update"], snap["valid_loss"]) == best
        stop = json.loads((root / "models/pre-med-l4-s1-stop/snapshot.json").read_text())
        assert stop["update"] == verdicts[0]["last_update"]
    # The min snapshot holds the weights of the checkpoint at the minimum.
    from safetensors.torch import load_file

    a = load_file(str(roots["a"] / "models/pre-med-l4-s1-min/model.safetensors"))
    b = load_file(str(roots["b"] / "models/pre-med-l4-s1-min/model.safetensors"))
    assert all(study.np.array_equal(a[k].float().numpy(), b[k].float().numpy()) for k in a)
    # A fixed branch point added after the run passed it cannot be made: a clear error.
    added = dataclasses.replace(s, branches=("2", "4", "min", "stop"))
    late = {j.name: j for j in study.plan(roots["b"], added)}["pre-med-l4-s1"]
    assert not study.is_done(roots["b"], late)
    with pytest.raises(RuntimeError, match="branch point u4 is before the run's update 6"):
        study.run_job(roots["b"], late)


# ----------------------------------------------------------------------------- tables and plot


def _fake_results(study, root, s):
    """Valid sets of a small generated corpus and evaluations of two seeds at two branch
    points: NLL continued outputs valid translations for the first k sentences, FA-DAT for
    more."""
    from fadat.data import synth
    from fadat.evaluation import validset_metrics

    cfg = synth.SynthConfig(train_size=5, valid_size=10, test_size=10, source_types=12, max_words=6)
    _, splits = synth.generate(cfg)
    data = root / "data" / "med"
    (data / "raw").mkdir(parents=True)
    rng = study.np.random.default_rng(0)
    for split in ("valid", "test"):
        synth.write_valid_sets(
            data / "raw" / f"{split}.validset.jsonl", splits[split].valid_sets, 64, rng
        )
    sets = splits["test"].valid_sets
    valid = [" ".join(next(vs.enumerate())) for vs in sets]
    wrong = [" ".join(reversed(next(vs.enumerate()))) + " x" for vs in sets]
    (root / "eval").mkdir(parents=True)
    exact = {("nll", 1): 6, ("fuzzy-n2", 1): 9, ("nll", 2): 5, ("fuzzy-n2", 2): 10}
    updates = {("min", 1): 3400, ("min", 2): 3800, ("u1200", 1): 1200, ("u1200", 2): 1200}
    nll = {}
    for (point, seed), update in updates.items():
        tag = f"med-l4-s{seed}-{point}"
        systems = []
        hyp_dir = root / "eval" / tag
        hyp_dir.mkdir()
        for arm in ("pre", "nll", "fuzzy-n2"):
            k = exact.get((arm, seed), 4) - (2 if point == "u1200" else 0)
            hyps = valid[:k] + wrong[k:]
            name = f"{arm}-{tag}:lookahead"
            (hyp_dir / f"{arm}-{tag}.lookahead.txt").write_text("".join(h + "\n" for h in hyps))
            listed = synth.read_listed_references(data, "test")
            scores = validset_metrics.validset_scores(hyps, sets, listed, valid)
            assert scores["exact_valid"] == pytest.approx(10 * k)
            systems.append({"name": name, "validset": scores})
            nll[f"{arm}-{tag}"] = {"nll_per_token": 0.5 + 0.1 * seed + (arm == "fuzzy-n2")}
        (root / "eval" / f"{tag}.json").write_text(json.dumps({"systems": systems}))
        snap = root / "models" / f"pre-med-l4-s{seed}-{point}"
        snap.mkdir(parents=True)
        (snap / "snapshot.json").write_text(json.dumps({"update": update}))
    (root / "eval" / "all.nll.json").write_text(json.dumps(nll))
    # A pre-training log: minimum 0.40 at update 3400, then rising to 0.43.
    run = root / "runs" / "pre-med-l4-s1"
    run.mkdir(parents=True)
    losses = [0.9, 0.6, 0.45, 0.40, 0.41, 0.42, 0.43]
    log = [
        {"update": 2200 + 400 * i, "valid_loss": x, "bleu": 50.0 + i} for i, x in enumerate(losses)
    ]
    (run / "valid_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))


def test_tables_and_plot_from_fake_results(study, tmp_path, capsys):
    s = study.Settings(branches=("1200", "min", "stop"), patience=3)
    _fake_results(study, tmp_path, s)
    text = study.tables(tmp_path, s)
    lines = text.splitlines()
    row = next(x for x in lines if x.startswith("| FA-DAT (n = 2), lookahead | 2 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2] == "95.00 ± 7.07"  # 90 and 100 % exact-valid
    assert cells[-1] == "1.6500 ± 0.0707"  # test NLL 1.6 and 1.7
    nll_row = next(x for x in lines if x.startswith("| NLL continued, lookahead | 2 |"))
    assert nll_row.split("|")[3].strip() == "55.00 ± 7.07"
    # Paired: seed 1 FA-DAT 9 valid against NLL 6 (3 discordant, one way): McNemar 2 · 2⁻³.
    paired = next(x for x in lines if x.startswith("| med s1 |"))
    cells = [c.strip() for c in paired.split("|")[1:-1]]
    assert cells[3] == "+30.00" and float(cells[4]) == pytest.approx(0.25)
    assert cells[6] == "+1.0000"
    mean = next(x for x in lines if x.startswith("| med mean |"))
    assert "+40.00 | t-test p = " + f"{study.t_test_p([30.0, 50.0]):.3f}" in mean
    # The curve: branch points with the seeds' mean update.
    assert any(x.startswith("| u1200 (1200 ± 0): FA-DAT (n = 2) | 2 | 75.00 ± 7.07") for x in lines)
    assert any(x.startswith("| min (3600 ± 283): NLL continued | 2 |") for x in lines)
    # The convergence table: the minimum, the rise, the verdict.
    conv = next(x for x in lines if x.startswith("| pre-med-l4-s1 |"))
    cells = [c.strip() for c in conv.split("|")[1:-1]]
    assert cells[1:7] == ["4600", "0.4000 @ 3400", "0.4300", "+0.0300", "+7.5 %", "3"]
    assert cells[-1] == "converged: overfit (min at 3400)"
    points = study.curve_points(tmp_path, study.Results(tmp_path), s, "med", s.seeds)
    assert [(p["point"], p["updates"]) for p in points] == [
        ("u1200", [1200, 1200]),
        ("min", [3400, 3800]),
        ("stop", []),
    ]
    png = study.plot(tmp_path, s, tmp_path / "docs" / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    assert Image.open(png).size == (1920, 468)
    assert [p.name for p in png.parent.iterdir()] == ["curve.png"]  # no temporary left
    # Figure 2's picture: the λ with results (here only λ = 4, from the fake main phase).
    lam = study.plot_lambda(tmp_path, s, tmp_path / "docs" / "lambda.png")
    assert Image.open(lam).size == (1080, 468)
    # The command line: `table` writes ROOT/tables.md and the plots where it is told.
    argv = ["table", "--root", str(tmp_path), "--plot", str(tmp_path / "c2.png")]
    assert study.main([*argv, "--plot-lambda", str(tmp_path / "l2.png")]) == 0
    assert "**The curve" in (tmp_path / "tables.md").read_text()
    assert (tmp_path / "c2.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "l2.png").read_bytes()[:4] == b"\x89PNG"
    # A picture that cannot be written: one line naming it, exit 2, the earlier ones kept.
    bad = tmp_path / "missing" / "dir"
    (tmp_path / "missing").write_text("a file, not a directory")
    with pytest.raises(SystemExit) as exit_info:
        study.main([*argv, "--plot-lambda", str(bad / "l3.png")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("synth_study: error: ") and "l3.png" in err[0]
    assert (tmp_path / "c2.png").read_bytes()[:4] == b"\x89PNG"


def test_command_line_plan_orders_branch_points_and_rejects_bad_ones(study, tmp_path, capsys):
    assert study.main(["plan", "--root", str(tmp_path), "--branches", "stop,min,3000,600"]) == 0
    out = capsys.readouterr().out
    assert "branch points 600, 3000, min, stop" in out
    assert "  nll-long-det-l4-s1-stop  [" in out and "nll-long-det-l4-s1-min" not in out
    assert not (tmp_path / "settings.json").exists()  # only `run` stores its settings
    for argv in (["--branches", "600x,min"], ["--phases", "main,figure9"], ["--caps", "med=10"]):
        with pytest.raises(SystemExit) as err:
            study.main(["plan", "--root", str(tmp_path), *argv])
        assert err.value.code == 2
