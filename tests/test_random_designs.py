"""bench/random_designs.py: random-weight model directories of the speed sweep's designs (for
latency before training): the shape of each config, the same weights on every run, refusals."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from fadat.models.directory import load_pretrained

ROOT = Path(__file__).resolve().parent.parent
SPM = ROOT / "models" / "bible-en-es-fadat-cpu-small" / "spm.model"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "random_designs", ROOT / "bench/random_designs.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["random_designs"] = module
    spec.loader.exec_module(module)
    return module


def test_designs_have_their_configs_shapes_and_the_same_weights_each_run(tmp_path):
    rd = load_script()
    configs = {
        "5x1-range": "configs/dat-cpu-small-5x1-range-nll.yaml",
        "base": "configs/dat-cpu-small-nll.yaml",
    }
    specs = [f"{name}={ROOT / c}" for name, c in configs.items()]
    for run in ("a", "b"):
        rd.main(["--vocab", "4000", "--spm", str(SPM), "--output", str(tmp_path / run), *specs])
    wide = load_pretrained(tmp_path / "a" / "5x1-range")
    c = wide.config
    assert (c.encoder_layers, c.decoder_layers, c.ffn_dim) == (5, 1, 1152)
    assert c.upsample_ratio_range == (3.0, 6.0) and c.copy_source
    # the parameter counts docs/speed-sweep.md gives (tests/test_depths.py pins them)
    assert sum(p.numel() for p in wide.parameters()) == 7_274_756
    base = load_pretrained(tmp_path / "a" / "base")
    assert sum(p.numel() for p in base.parameters()) == 7_408_132
    assert base.config.upsample_ratio_range is None
    for name in configs:
        a = load_file(tmp_path / "a" / name / "model.safetensors")
        b = load_file(tmp_path / "b" / name / "model.safetensors")
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert (tmp_path / "a" / "base" / "spm.model").read_bytes() == SPM.read_bytes()


def test_an_at_config_or_a_bad_spec_is_refused(tmp_path):
    rd = load_script()
    out = ["--vocab", "4000", "--spm", str(SPM), "--output", str(tmp_path)]
    with pytest.raises(SystemExit, match="not a DAT"):
        rd.main([*out, f"at={ROOT / 'configs/at-cpu-small.yaml'}"])
    with pytest.raises(SystemExit, match="NAME=CONFIG"):
        rd.main([*out, "configs/dat-cpu-small-nll.yaml"])
