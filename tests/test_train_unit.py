"""Unit tests of fadat.training.trainer that need no prepared dataset: config resolution,
learning-rate schedule, RNG state round trip, checkpoint I/O (weights_only), checkpoint
averaging, the resume data check (on small synthetic dataset files), shipped YAML files."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from fadat.cli.train import add_arguments, resolve_config
from fadat.data.binarized import training_digest
from fadat.errors import InputError
from fadat.models.config import make_config
from fadat.models.dat import DATModel
from fadat.objectives.dat import FuzzyOptions
from fadat.training.checkpoints import (
    CHECKPOINT_FORMAT,
    atomic_save,
    average_checkpoints,
    capture_rng_state,
    check_resume_data,
    load_checkpoint,
    restore_rng_state,
)
from fadat.training.config import (
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_yaml_config,
    parse_duration,
    validate_config,
)
from fadat.training.schedule import inverse_sqrt_lr

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def parse(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_inverse_sqrt_schedule_matches_fairseq():
    lr, warm, init = 5e-4, 100, 1e-7
    assert inverse_sqrt_lr(0, lr, warm, init) == init
    assert inverse_sqrt_lr(50, lr, warm, init) == pytest.approx(init + (lr - init) * 0.5)
    assert inverse_sqrt_lr(100, lr, warm, init) == pytest.approx(lr)
    assert inverse_sqrt_lr(400, lr, warm, init) == pytest.approx(lr * 0.5)
    assert inverse_sqrt_lr(4, lr, 0, init) == pytest.approx(lr / 2)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), (5, 5.0)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_duration_rejects():
    for bad in ("soon", "-3", "3d"):
        with pytest.raises(InputError):
            parse_duration(bad)


def test_rng_round_trip_through_weights_only_checkpoint(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    random.gauss(0, 1)  # leaves a cached gauss value in python's state
    state = capture_rng_state()
    path = tmp_path / "rng.pt"
    atomic_save({"format": CHECKPOINT_FORMAT, "rng": [state]}, path)
    expected = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    restore_rng_state(load_checkpoint(path)["rng"][0])
    got = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    assert got[:3] == expected[:3]
    assert torch.equal(got[3], expected[3])


def test_checkpoint_io_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(InputError, match="cannot read"):
        load_checkpoint(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": {}}, foreign)
    with pytest.raises(InputError, match="not a fadat"):
        load_checkpoint(foreign)
    assert not list(tmp_path.glob("*.tmp"))


def _ckpt(tmp_path: Path, name: str, seed: int, bleu: float) -> Path:
    torch.manual_seed(seed)
    model = DATModel(make_config("tiny", 16))
    path = tmp_path / name
    atomic_save(
        {
            "format": CHECKPOINT_FORMAT,
            "arch": "dat",
            "model_config": model.config.to_dict(),
            "model": model.state_dict(),
            "bleu": bleu,
            "update": seed,
        },
        path,
    )
    return path


def test_average_checkpoints_is_the_arithmetic_mean(tmp_path):
    paths = [_ckpt(tmp_path, f"c{i}.pt", i, 10.0 + i) for i in range(3)]
    states = [load_checkpoint(p)["model"] for p in paths]
    averaged, meta = average_checkpoints(paths)
    assert meta["bleu"] == 10.0
    for key, value in averaged.items():
        want = sum(s[key].double() for s in states) / 3
        assert value.dtype == states[0][key].dtype
        assert torch.allclose(value.double(), want, atol=1e-7), key
    other = tmp_path / "other.pt"
    torch.manual_seed(0)
    small = DATModel(make_config("tiny", 20))
    atomic_save(
        {
            "format": CHECKPOINT_FORMAT,
            "model_config": small.config.to_dict(),
            "model": small.state_dict(),
        },
        other,
    )
    with pytest.raises(InputError, match="different model"):
        average_checkpoints([paths[0], other])


def test_resolve_config_yaml_then_flags(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("lr: 0.001\nmax-updates: 50\nglat_p: '0.5:0.1@10'\nmodel: {d_model: 64}\n")
    cfg, resume = resolve_config(
        parse(["--config", str(yaml_file), "--data", "D", "--run-dir", "R", "--lr", "0.002"])
    )
    assert not resume
    assert cfg.lr == 0.002 and cfg.max_updates == 50 and cfg.glat_p == "0.5:0.1@10"
    assert cfg.model == {"d_model": 64} and cfg.data == "D"
    assert config_from_dict(config_to_dict(cfg), "x") == cfg


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: 1\n", "unknown config key"),
        ("lr: fast\n", "must be a number"),
        ("max_updates: 1.5\n", "must be an integer"),
        ("glat_p: '2:0.1@5'\n", "glat_p"),
        ("- a\n- b\n", "mapping"),
        ("lr: [\n", "invalid YAML"),
    ],
)
def test_bad_yaml_is_input_error(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_yaml_config(path)


def test_validate_config_rejects_bad_combinations():
    base = dict(data="d", run_dir="r", max_updates=10)
    validate_config(TrainConfig(**base))
    for extra, message in [
        ({"arch": "rnn"}, "--arch"),
        ({"arch": "at", "objective": "fuzzy"}, "does not train"),
        ({"bf16": True, "fp16": True}, "exclude"),
        ({"max_updates": 0}, "stop criterion"),
        ({"update_freq": 0}, "update-freq"),
        ({"dag_backend": "cuda"}, "dag.backend must be one of auto, torch, triton, got .cuda."),
    ]:
        with pytest.raises(InputError, match=message):
            validate_config(config_from_dict({**base, **extra}, "test"))
    with pytest.raises(InputError, match="FuzzyOptions, not the options of the objective 'nll'"):
        validate_config(TrainConfig(**base, objective_options=FuzzyOptions()))


def test_resume_requires_checkpoint(tmp_path):
    with pytest.raises(InputError, match="cannot resume"):
        resolve_config(parse(["--resume", str(tmp_path)]))


def test_resume_may_change_the_dag_backend_but_not_the_objective_options(tmp_path):
    """``--dag-backend`` picks an implementation of the same DAG programmes (a run moved to a
    GPU may switch), so a resumed run may change it; a run saved before the option existed
    (no ``dag_backend`` key) resumes with ``auto``."""
    import yaml

    saved = config_to_dict(TrainConfig(data="d", run_dir=str(tmp_path), max_updates=5))
    del saved["dag_backend"]  # as written before the option existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")  # only its existence is checked here
    cfg, resumed = resolve_config(parse(["--resume", str(tmp_path)]))
    assert resumed and cfg.objective_options.dag_backend == "auto"
    cfg, _ = resolve_config(parse(["--resume", str(tmp_path), "--dag-backend", "torch"]))
    assert cfg.objective_options.dag_backend == "torch"
    with pytest.raises(InputError, match="only stop criteria"):
        resolve_config(parse(["--resume", str(tmp_path), "--ngram-order", "3"]))


def test_resume_may_give_another_data_path(tmp_path):
    """``--data`` may change on resume (the trainer then checks the dataset's digest,
    :func:`check_resume_data`); the other fixed keys may not."""
    import yaml

    saved = config_to_dict(TrainConfig(data="data/a", run_dir=str(tmp_path), max_updates=5))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")  # only its existence is checked here
    cfg, resumed = resolve_config(parse(["--resume", str(tmp_path), "--data", "elsewhere/a"]))
    assert resumed and cfg.data == "elsewhere/a" and cfg.max_updates == 5
    with pytest.raises(InputError, match="only stop criteria, logging, device and the data's"):
        resolve_config(parse(["--resume", str(tmp_path), "--data", "b", "--seed", "9"]))


def _dataset(path: Path, word: int = 4, build_key: str = "f" * 64) -> Path:
    """A small synthetic dataset with every file that :func:`training_digest` reads (train and
    valid splits by the real writer, an spm.model of a few bytes, one reference file) and a
    meta.json whose ``"fingerprint"`` (fadat prepare's build cache key) is ``build_key``;
    ``word`` is the first source word."""
    import json

    from fadat.data.binarized import write_split

    (path / "raw").mkdir(parents=True)
    for split in ("train", "valid"):
        write_split(path, split, [[word, 5, 2], [6, 2]], [[0, 7, 2], [0, 8, 9, 2]], 12)
    (path / "spm.model").write_bytes(b"not parsed by the digest")
    (path / "raw" / "valid.ref.txt").write_text("a b\nc\n", encoding="utf-8")
    (path / "meta.json").write_text(json.dumps({"format": 1, "fingerprint": build_key}))
    return path


def test_check_resume_data_follows_the_rules(tmp_path, monkeypatch):
    """The matrix of :func:`check_resume_data`, in its order: a recorded digest must be the
    data's (path changed or not; meta.json plays no part); without one, the saved path is
    accepted as it is, and another path only against the saved path's dataset."""
    monkeypatch.chdir(tmp_path)
    a = _dataset(tmp_path / "a")
    a2 = _dataset(tmp_path / "a2", build_key="0" * 64)  # a's content, another build key
    b = _dataset(tmp_path / "b", word=7)  # one token id differs
    empty = tmp_path / "empty"  # a directory without a dataset
    empty.mkdir()
    da, db = training_digest(a), training_digest(b)
    assert training_digest(a2) == da != db
    where = tmp_path / "run" / "checkpoint_last.pt"

    def state(saved: Path | str, digest: str | None = None, key: bool = True) -> dict:
        out = {"train_config": {"data": str(saved)}}
        if key:
            out["data_digest"] = digest
        return out

    recorded = state(a, da)
    for data in (a, a2, "a"):  # the same path, another path, the same one spelled otherwise
        check_resume_data(recorded, where, data)
    with pytest.raises(InputError) as err:
        check_resume_data(recorded, where, b)
    message = str(err.value)
    assert f"data directory {b} holds another dataset than the run trained on" in message
    assert f"its training files' sha256 {db[:12]}…, {da[:12]}… recorded by {where}" in message
    assert "\n" not in message
    # the caller's digest of the data is used as given (the trainer computes it once)
    check_resume_data(recorded, where, b, digest=da)
    with pytest.raises(InputError, match="holds another dataset"):
        check_resume_data(recorded, where, a, digest=db)
    # the saved path rebuilt in place
    with pytest.raises(InputError, match="holds another dataset"):
        check_resume_data(state(b, da), where, b)
    # no digest recorded (a checkpoint written before fadat recorded it, or a copy of one made
    # where its data was not): the saved path is accepted as it is, even gone or empty
    for old in (state(b, key=False), state(b, None), state(empty, key=False)):
        check_resume_data(old, where, old["train_config"]["data"])
    check_resume_data(state(tmp_path / "gone", key=False), where, tmp_path / "gone")
    check_resume_data(state(a, key=False), where, "./a")  # the same directory
    # ... another path: compared with the saved path's dataset
    check_resume_data(state(a, key=False), where, a2)
    with pytest.raises(InputError) as err:
        check_resume_data(state(a, key=False), where, b)
    assert f"sha256 {db[:12]}…, {da[:12]}… for {a}, the data directory {where} saved" in str(
        err.value
    )
    for saved, why in ((tmp_path / "gone", "is gone"), (empty, "no longer holds a readable")):
        with pytest.raises(InputError) as err:
            check_resume_data(state(saved, key=False), where, a)
        message = str(err.value)
        assert message.startswith(f"{where} does not record which dataset the run trained on")
        assert f"data directory {a} cannot be verified against the saved {saved}, which {why}" in (
            message
        )
        assert f"make that dataset available at {saved}" in message
        assert "fadat snapshot" in message and "\n" not in message
    # the data's training files are read: a directory without them, or none, is named
    with pytest.raises(InputError, match=r"empty/train\.src\.ids\.npy: missing"):
        check_resume_data(recorded, where, empty)
    with pytest.raises(InputError, match="gone does not exist"):
        check_resume_data(recorded, where, tmp_path / "gone")


def test_missing_data_flag():
    with pytest.raises(InputError, match="--data"):
        resolve_config(parse(["--run-dir", "R"]))


def test_shipped_configs_load_and_validate():
    files = sorted(CONFIGS.glob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        values = load_yaml_config(path)
        cfg = config_from_dict({"data": "d", "run_dir": "r", **values}, str(path))
        validate_config(cfg)
        make_config(cfg.preset, 100, model_type=cfg.arch, **cfg.model)
        if cfg.resolved_objective() == "fuzzy":
            assert cfg.init_from == "" and not math.isnan(cfg.lr)


def test_glancing_default_follows_the_stage():
    assert TrainConfig(data="d", run_dir="r").resolved_glat_p() == "0.5:0.1@200k"
    assert TrainConfig(data="d", run_dir="r", objective="fuzzy").resolved_glat_p() == "0.1"
    assert TrainConfig(data="d", run_dir="r", glat_p="0.2").resolved_glat_p() == "0.2"


def test_init_encoder_from_at_copies_encoder_and_embedding_only(tmp_path):
    from fadat.models.at import ATModel
    from fadat.models.directory import save_model_directory
    from fadat.training.trainer import TrainConfig, build_model

    torch.manual_seed(3)
    at = ATModel(make_config("tiny", 12, model_type="at"))
    save_model_directory(at, tmp_path / "at")
    cfg = TrainConfig(data="d", run_dir="r", preset="tiny", init_encoder_from=str(tmp_path / "at"))
    torch.manual_seed(5)
    dat = build_model(cfg, 12)
    torch.manual_seed(5)
    fresh = build_model(TrainConfig(data="d", run_dir="r", preset="tiny"), 12)
    at_state, dat_state = at.state_dict(), dat.state_dict()
    encoder = [n for n in dat_state if n.startswith("encoder.")]
    assert "encoder.embed_tokens.weight" in encoder
    assert all(torch.equal(dat_state[n], at_state[n]) for n in encoder)
    assert dat.output_weight.data_ptr() == dat.encoder.embed_tokens.weight.data_ptr()
    others = [n for n in dat_state if not n.startswith("encoder.")]
    assert others and all(torch.equal(dat_state[n], fresh.state_dict()[n]) for n in others)
    small = build_model(TrainConfig(data="d", run_dir="r", preset="tiny"), 10)
    save_model_directory(small, tmp_path / "v10")
    with pytest.raises(InputError, match="does not fit"):
        build_model(TrainConfig(data="d", run_dir="r", init_encoder_from=str(tmp_path / "v10")), 12)


@pytest.mark.parametrize("arch", ["dat", "nat", "ctc", "at"])
def test_init_decoder_layers_copies_the_shared_stack_into_every_architecture(arch):
    """--init-encoder-from an AT saved by an earlier version (its decoder parameters then named
    ``layers.*``, ``final_norm.*``) with --init-decoder-layers: the encoder and the layers and
    final LayerNorm of the shared decoder stack are the AT's tensors in every architecture; the
    decoder's positions and the architecture's own heads are the fresh model's."""
    from safetensors.torch import load_file

    from fadat.training.trainer import TrainConfig, build_model

    at_dir = Path(__file__).resolve().parent / "data" / "legacy" / "at-prenorm"
    old = load_file(str(at_dir / "model.safetensors"))  # names of the earlier version
    sizes = dict(
        d_model=16, encoder_layers=1, decoder_layers=2, attention_heads=2, ffn_dim=32,
        link_heads=2, max_source_positions=16, max_target_positions=48, pre_norm=True,
    )  # fmt: skip
    common = dict(data="d", run_dir="r", preset="tiny", arch=arch, model=sizes)
    cfg = TrainConfig(**common, init_encoder_from=str(at_dir), init_decoder_layers=True)
    torch.manual_seed(5)
    state = build_model(cfg, 12).state_dict()
    torch.manual_seed(5)
    fresh = build_model(TrainConfig(**common), 12).state_dict()
    stack = ("encoder.", "decoder.layers.", "decoder.final_norm.")
    copied = [n for n in state if n.startswith(stack)]
    # self-attention, cross-attention and FFN: 10 weights and biases per layer
    assert len([n for n in copied if n.startswith("decoder.layers.1.")]) == 20
    assert "decoder.final_norm.weight" in copied
    for name in copied:
        old_name = name.removeprefix("decoder.") if name.startswith("decoder.") else name
        assert torch.equal(state[name], old[old_name]), name
        # the fixture's weights are noisy: none equals a fresh initialisation
        assert not torch.equal(state[name], fresh[name]), name
    own = [n for n in state if n not in copied]
    assert "decoder.embed_positions.weight" in own
    assert all(torch.equal(state[n], fresh[n]) for n in own)
    assert not torch.equal(state["decoder.embed_positions.weight"], old["embed_positions.weight"])


def test_upsample_ratio_flag_sets_lambda_of_a_fresh_and_a_fine_tuned_model(tmp_path):
    """fadat train --upsample-ratio (the reference's --upsample-scale): λ of a fresh model, and of
    an --init-from model whose weights are kept."""
    from fadat.models.directory import save_model_directory
    from fadat.training.trainer import build_model

    argv = ["--data", "D", "--run-dir", "R", "--max-updates", "1", "--upsample-ratio", "2.5"]
    cfg, _ = resolve_config(parse(argv))
    assert cfg.upsample_ratio == 2.5
    model = build_model(cfg, 12)
    assert model.config.upsample_ratio == 2.5
    assert build_model(TrainConfig(data="d", run_dir="r"), 12).config.upsample_ratio == 4.0
    save_model_directory(model, tmp_path / "m")
    tuned = build_model(
        TrainConfig(data="d", run_dir="r", init_from=str(tmp_path / "m"), upsample_ratio=3.0), 12
    )
    assert tuned.config.upsample_ratio == 3.0
    pairs = zip(tuned.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    with pytest.raises(InputError, match="upsample-ratio"):
        validate_config(TrainConfig(data="d", run_dir="r", max_updates=1, upsample_ratio=-1.0))


def test_a_config_saved_with_every_objectives_keys_resumes_with_its_own(tmp_path):
    """config.yaml of runs started before objectives owned their options lists every objective's
    keys, flat; the run resumes with its own objective's values and drops the others."""
    import yaml

    saved = {"data": "d", "run_dir": str(tmp_path), "max_updates": 5, "objective": "fuzzy"}
    saved.update(force_emit=True, ngram_order=3, dag_backend="torch", label_smoothing=0.1)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")  # only its existence is checked here
    cfg, resumed = resolve_config(parse(["--resume", str(tmp_path)]))
    assert resumed and cfg.objective_options == FuzzyOptions(ngram_order=3, dag_backend="torch")
    flat = config_to_dict(cfg)
    assert (flat["ngram_order"], flat["dag_backend"]) == (3, "torch")
    assert "force_emit" not in flat and "label_smoothing" not in flat
    assert config_from_dict(flat, "round trip") == cfg


def test_python_built_config_names_the_option_field():
    from fadat.training.config import field_sources

    cfg = TrainConfig(
        data="d", run_dir="r", max_updates=1, lr=1e-3, objective="fuzzy",
        objective_options=FuzzyOptions(ngram_order=0),
    )  # fmt: skip
    sources = field_sources(cfg)
    assert sources["lr"] == "TrainConfig.lr" and "seed" not in sources
    assert sources["ngram_order"] == "TrainConfig.objective_options.ngram_order"
    assert "dag_backend" not in sources  # at its default
    message = r"^TrainConfig\.objective_options\.ngram_order must be >= 1, got 0$"
    with pytest.raises(InputError, match=message):
        validate_config(cfg, sources)


@pytest.mark.parametrize(("device", "current", "want"), [("cuda", 3, 3), ("cuda:1", 3, 1)])
def test_single_process_cuda_device_gets_an_index(monkeypatch, device, current, want):
    """``--device cuda`` in one process means the current CUDA device: torch.cuda.set_device
    refuses a device without an index (torch 2.11 on an H100: "Expected a torch.device with a
    specified index"), so setup_distributed passes it one; an explicit index is kept."""
    from fadat.training import distributed

    calls = []
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    info = distributed.setup_distributed(device)
    assert calls == [torch.device("cuda", want)] and info.device == torch.device("cuda", want)
    assert info.world_size == 1 and info.is_main
