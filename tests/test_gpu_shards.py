"""scripts/gpu/shards.py: a model directory split into parts and joined again is the same
directory byte for byte; damaged or missing parts are refused, naming the part."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest

from fadat.errors import InputError

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "shards.py"


def load_shards():
    spec = importlib.util.spec_from_file_location("gpu_shards", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bible-en-es-fadat-gpu"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "dat"}\n')
    (d / "model.safetensors").write_bytes(os.urandom(10_000))
    (d / "spm.model").write_bytes(os.urandom(777))
    return d


def test_split_then_join_is_the_same_directory(tmp_path):
    shards = load_shards()
    src = model_dir(tmp_path)
    out = tmp_path / "out"
    part_mib = 3000 / 2**20  # 3000-byte parts: the tar (≈ 13 KB) spans several
    manifest = shards.split(src, out, "model", part_mib)
    parts = sorted(p for p in os.listdir(out) if ".tar.part" in p)
    assert parts == [p["name"] for p in manifest["parts"]]
    assert len(parts) == math.ceil(manifest["tar_bytes"] / 3000) >= 4
    assert all((out / p).stat().st_size <= 3000 for p in parts)
    assert sum((out / p).stat().st_size for p in parts) == manifest["tar_bytes"]
    dest = shards.join(out, tmp_path / "back", "model")
    assert dest == tmp_path / "back" / "bible-en-es-fadat-gpu"
    assert sorted(os.listdir(dest)) == sorted(os.listdir(src))
    for name in os.listdir(src):
        assert (dest / name).read_bytes() == (src / name).read_bytes()
    # the command line: exit 2 and the destination named when it exists already
    assert shards.main(["join", str(out), str(tmp_path / "back")]) == 2


def test_join_refuses_damaged_missing_and_foreign_parts(tmp_path):
    shards = load_shards()
    out = tmp_path / "out"
    shards.split(model_dir(tmp_path), out, "model", 3000 / 2**20)
    part = out / "model.tar.part01"
    good = part.read_bytes()
    part.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped, same size
    with pytest.raises(InputError, match="model.tar.part01"):
        shards.join(out, tmp_path / "a")
    part.unlink()
    with pytest.raises(InputError, match="part01: part missing"):
        shards.join(out, tmp_path / "b")
    part.write_bytes(good)
    # a manifest that promises another tar: every part matches, the whole does not
    manifest = json.loads((out / "model.manifest.json").read_text())
    manifest["tar_sha256"] = "0" * 64
    (out / "model.manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="tar whose SHA-256 differs"):
        shards.join(out, tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
