"""The experiment recipes' plumbing: variant composition and adopting a model from another run."""

from __future__ import annotations

import importlib.util
import json
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
    link = tmp_path / "runs" / "experiments" / "t" / "pretrain-s1" / "model"
    assert link.is_symlink() and (link / "config.json").exists()
    with pytest.raises(SystemExit, match="exists"):
        adopt()
    assert ex.evaluate_int("N+M", {"N": 1400, "M": 240}) == 1640
