"""Models saved by earlier versions load and give the same outputs, bit for bit.

The fixture (tests/data/legacy, written by main at 890da67 with
tests/data/legacy/make_legacy_models.py) holds tiny models of every architecture saved before the
decoder stack was shared: the DAT's and AT's decoder parameters were then named
``embed_positions.*``, ``layers.*``, ``final_norm.*`` (today ``decoder.…``), so loading them
exercises :meth:`fadat.models.architectures.TranslationModel.upgrade_state_dict`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fadat.models.architectures import ARCHITECTURES, model_class
from fadat.models.directory import load_pretrained

LEGACY = Path(__file__).resolve().parent / "data" / "legacy"
_spec = importlib.util.spec_from_file_location("make_legacy", LEGACY / "make_legacy_models.py")
make_legacy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_legacy)
NAMES = list(make_legacy.MODELS)


def _as_json(value):
    """Tuples as lists, as the fixture's JSON holds them."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("name", NAMES)
def test_model_saved_by_an_earlier_version_gives_identical_outputs(name):
    model = load_pretrained(LEGACY / name)
    source, target, target_lengths = make_legacy.batch()
    expected = load_file(str(LEGACY / f"{name}.outputs.safetensors"))
    got = make_legacy.forward_outputs(model, source, target)
    assert sorted(got) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), f"{name}: {key} differs"
    want = json.loads((LEGACY / f"{name}.translations.json").read_text(encoding="utf-8"))
    assert _as_json(make_legacy.translations(model, source, target, target_lengths)) == want


@pytest.mark.parametrize("name", NAMES)
def test_old_parameter_names_load_into_a_fresh_model(name):
    """The checkpoint path (``load_state_dict`` of a resumed or averaged run): a state dict with
    the names of the earlier version loads into today's class with every tensor in place."""
    old = load_file(str(LEGACY / name / "model.safetensors"))
    kind = json.loads((LEGACY / name / "config.json").read_text(encoding="utf-8"))["model_type"]
    model = load_pretrained(LEGACY / name)
    renamed = model_class(kind).renamed_parameters
    if kind in ("dat", "at"):
        assert any(n.startswith(("layers.", "embed_positions.")) for n in old)
        assert renamed
    else:  # NAT and CTC already kept their decoder under ``decoder.``
        assert not renamed and set(old) == set(model.state_dict())
    fresh = model_class(kind)(model.config)
    fresh.load_state_dict(old)  # strict: every name maps
    for (n, a), (m, b) in zip(fresh.state_dict().items(), model.state_dict().items(), strict=True):
        assert n == m and torch.equal(a, b), n
    # one parameter followed by hand: the first decoder layer's FFN
    assert torch.equal(
        fresh.decoder.layers[0].fc1.weight,
        old["decoder.layers.0.fc1.weight" if not renamed else "layers.0.fc1.weight"],
    )


@pytest.mark.parametrize("name", NAMES)
def test_parameter_order_unchanged_for_optimizer_states(name):
    """An optimizer state refers to parameters by position: today's ``named_parameters()`` are
    the earlier version's, renamed, in the same order (a run's checkpoint resumes)."""
    model = load_pretrained(LEGACY / name)
    old = json.loads((LEGACY / f"{name}.parameters.json").read_text(encoding="utf-8"))
    renamed = list(type(model).upgrade_state_dict(dict.fromkeys(old)))
    assert renamed == [n for n, _ in model.named_parameters()]


def test_every_architecture_is_in_the_fixture():
    kinds = {make_legacy.MODELS[n]["model_type"] for n in NAMES}
    assert kinds == set(ARCHITECTURES)


@pytest.mark.parametrize("name", make_legacy.CHECKPOINTS)
def test_checkpoint_last_of_an_earlier_version_resumes_exactly(name):
    """A run of an earlier version resumes: its checkpoint_last (one AdamW update, names of that
    version, optimizer state by parameter position) restores into today's model, and the next
    update gives the weights the earlier version gave, bit for bit."""
    from fadat.models.config import ModelConfig
    from fadat.training.checkpoints import (
        capture_rng_state,
        load_checkpoint,
        restore_last,
        restore_rng_state,
    )
    from fadat.training.distributed import DistInfo

    path = LEGACY / f"{name}.checkpoint_last.pt"
    state = load_checkpoint(path)
    assert any(n.startswith("layers.") for n in state["model"])  # the earlier names
    config = ModelConfig.from_dict(dict(state["model_config"]))
    model = model_class(config.model_type)(config)
    optimizer = make_legacy.make_optimizer(model)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    rng = capture_rng_state()
    try:
        info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
        progress = restore_last(
            state, path, state["train_config"], set(), info, model, optimizer, scaler
        )
        assert progress.update == 1
        source, target, _ = make_legacy.batch()
        make_legacy.train_step(model, optimizer, source, target)
    finally:
        restore_rng_state(rng)
    want = type(model).upgrade_state_dict(
        load_file(str(LEGACY / f"{name}.after_step2.safetensors"))
    )
    got = model.state_dict()
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key


def test_average_mixes_checkpoints_of_an_earlier_version_and_of_today(tmp_path):
    """``fadat average`` over a run that spans the rename: an old-named checkpoint and a
    today-named one average name by name (today's names)."""
    from fadat.training.checkpoints import atomic_save, average_checkpoints, load_checkpoint

    old_path = LEGACY / "dat.checkpoint_last.pt"
    old = load_checkpoint(old_path)
    renamed = model_class("dat").upgrade_state_dict(old["model"])
    new = {**old, "model": {k: 3 * v for k, v in renamed.items()}}
    atomic_save(new, tmp_path / "new.pt")
    averaged, _ = average_checkpoints([old_path, tmp_path / "new.pt"])
    assert sorted(averaged) == sorted(renamed)
    for key, value in renamed.items():
        assert torch.allclose(averaged[key], 2 * value, rtol=1e-6, atol=0), key
