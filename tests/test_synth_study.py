"""The synthetic study recipe's plumbing: its statistics against closed forms, its plan, and the
resumption of an interrupted training job."""

from __future__ import annotations

import math

import pytest
from test_recipes import load_recipe


def test_paired_t_test_and_mcnemar_against_closed_forms():
    study = load_recipe("synth_study")
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


def test_plan_covers_every_arm_and_resumes_interrupted_runs(tmp_path):
    study = load_recipe("synth_study")
    jobs = study.plan(tmp_path)
    names = {j.name for j in jobs}
    assert len(names) == len(jobs)
    seeds = len(study.SEEDS)
    # Pre-training: 3 levels at λ = 4 plus 4 more λ on med, per seed.
    assert sum(n.startswith("pre-") for n in names) == (3 + len(study.LAMBDAS) - 1) * seeds
    assert {"fuzzy-n1-med-l4-s1", "fuzzy-n4-med-l4-s3", "nll-high-l4-s2"} <= names
    assert "fuzzy-n2-med-l8-s1" in names and "nll-med-l2-s3" in names
    assert "fuzzy-n3-high-l4-s1" not in names
    assert sum(n.startswith("at-") for n in names) == 3 * seeds
    job = next(j for j in jobs if j.name == "nll-med-l4-s1")
    assert job.commands[0][0] == "train" and "--init-from" in job.commands[0]
    assert study._commands(job) == job.commands
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "checkpoint_last.pt").write_bytes(b"")
    resumed = study._commands(job)
    assert resumed[0][:3] == ["train", "--resume", str(job.run_dir)]
    assert resumed[0][-2:] == ["--max-updates", str(study.FINETUNE_UPDATES)]
    assert resumed[1:] == job.commands[1:]
    # Done = the model exists and the run reached the current budget (a larger one continues).
    model = job.done
    model.parent.mkdir(parents=True)
    model.write_text("{}")
    assert not study.is_done(job)
    (job.run_dir / "DONE").write_text(f"{study.FINETUNE_UPDATES}\n")
    assert study.is_done(job)
    (job.run_dir / "DONE").write_text(f"{study.FINETUNE_UPDATES - 1}\n")
    assert not study.is_done(job)
    # A run killed before its first checkpoint starts again from scratch.
    (job.run_dir / "checkpoint_last.pt").unlink()
    assert study._commands(job) == job.commands and not job.run_dir.exists()


def test_dependencies_follow_the_data_and_models(tmp_path):
    study = load_recipe("synth_study")
    jobs = study.plan(tmp_path)
    needs = study.dependencies(jobs)
    assert needs["data-med"] == set()
    assert needs["pre-med-l4-s1"] == {"data-med"}
    assert needs["fuzzy-n2-med-l8-s3"] == {"data-med", "pre-med-l8-s3"}
    assert needs["eval-med-l4-s2"] == {
        "data-med",
        "pre-med-l4-s2",
        "nll-med-l4-s2",
        "fuzzy-n2-med-l4-s2",
    }
    assert needs["eval-at-high-s1"] == {"data-high", "at-high-s1"}
    # Every dependency comes no later in the priority order (phase) than what needs it.
    phase = {j.name: j.phase for j in jobs}
    assert all(phase[d] <= phase[n] for n, ds in needs.items() for d in ds)


def test_priority_finishes_a_seed_of_the_main_comparison_first(tmp_path):
    study = load_recipe("synth_study")
    order = [j.name for j in sorted(study.plan(tmp_path), key=study.priority)]
    assert order[:3] == ["data-det", "data-med", "data-high"]
    first_seed = order[: order.index("pre-det-l4-s2")]
    assert {"pre-high-l4-s1", "fuzzy-n2-high-l4-s1", "eval-high-l4-s1"} <= set(first_seed)
    assert order.index("eval-high-l4-s3") < order.index("at-det-s1")
    assert order.index("eval-at-high-s3") < order.index("fuzzy-n1-med-l4-s1")
    assert order.index("eval-n-med-l4-s3") < order.index("pre-med-l2-s1")
