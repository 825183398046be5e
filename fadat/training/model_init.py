"""What a training run starts from: its data splits and vocabulary, and its model (a preset with
overrides, the weights of ``--init-from``, or the encoder of ``--init-encoder-from``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fadat.errors import InputError
from fadat.models.architectures import TranslationModel, model_class
from fadat.training.config import TrainConfig


def load_data(cfg: TrainConfig):
    """The train split and the valid split (None if the data has none) of ``--data``.

    Raises:
        InputError: a missing or damaged dataset, including the valid split's raw references
            (read here once, so that a damaged file stops the run before its first update
            rather than at its first validation).
    """
    from fadat.data.binarized import BinarizedDataset, raw_references

    data_dir = Path(cfg.data)
    if data_dir.exists() and not data_dir.is_dir():
        raise InputError(f"--data {data_dir}: a file, not a data directory of fadat prepare")
    if not data_dir.is_dir():
        raise InputError(f"data directory {data_dir} does not exist")
    train = BinarizedDataset(data_dir, "train")
    valid = BinarizedDataset(data_dir, "valid") if _has_split(data_dir, "valid") else None
    if valid is not None:
        raw_references(data_dir, "valid")
    return train, valid


def _has_split(data_dir: Path, split: str) -> bool:
    from fadat.data.binarized import read_meta

    return split in read_meta(data_dir).get("splits", {})


def data_vocab_size(data_dir: Path) -> int:
    """The vocabulary size recorded in ``DATA/meta.json``."""
    from fadat.data.binarized import read_meta

    meta = read_meta(data_dir)
    if "vocab_size" not in meta:
        raise InputError(f"{data_dir / 'meta.json'}: no vocab_size")
    return int(meta["vocab_size"])


def build_model(cfg: TrainConfig, vocab_size: int) -> TranslationModel:
    """A fresh model from ``--preset`` + YAML ``model`` overrides + ``--dropout``,
    ``--upsample-ratio`` and ``--upsample-ratio-range``, or the weights of ``--init-from`` (the
    FA-DAT fine-tune: weights only, the optimizer starts fresh).

    Raises:
        InputError: bad preset/overrides, or an ``--init-from`` model of the other architecture
            or another vocabulary.
    """
    from fadat.models.config import make_config
    from fadat.models.directory import load_pretrained

    if cfg.init_from:
        model = load_pretrained(cfg.init_from)
        if model.config.model_type != cfg.arch:
            raise InputError(
                f"--init-from {cfg.init_from} holds a {model.config.model_type!r} model, "
                f"not --arch {cfg.arch}"
            )
        if model.config.vocab_size != vocab_size:
            raise InputError(
                f"--init-from {cfg.init_from} has vocabulary size {model.config.vocab_size}, "
                f"the data has {vocab_size}"
            )
        changes = {"dropout": cfg.dropout, **lambda_overrides(cfg)}
        if any(getattr(model.config, k) != v for k, v in changes.items()):
            # Dropout and λ are training settings: the fine-tune's flags win.
            config = dataclasses.replace(model.config, **changes)
            fresh = model_class(cfg.arch)(config)
            fresh.load_state_dict(model.state_dict())
            model = fresh
        model.train()
        return model
    overrides = {
        "model_type": cfg.arch,
        "dropout": cfg.dropout,
        **cfg.model,
        **lambda_overrides(cfg),
    }
    config = make_config(cfg.preset, vocab_size, **overrides)
    model = model_class(cfg.arch)(config)
    if cfg.init_encoder_from:
        _load_encoder(model, cfg.init_encoder_from, cfg.init_decoder_layers)
    return model


def lambda_overrides(cfg: TrainConfig) -> dict[str, object]:
    """The model config fields set by ``--upsample-ratio`` and ``--upsample-ratio-range`` (those
    given: a flag wins over the preset, the YAML ``model`` block and an ``--init-from`` model)."""
    out: dict[str, object] = {}
    if cfg.upsample_ratio:
        out["upsample_ratio"] = cfg.upsample_ratio
    if cfg.upsample_ratio_range:
        out["upsample_ratio_range"] = tuple(cfg.upsample_ratio_range)
    return out


def _load_encoder(model: TranslationModel, directory: str, decoder_layers: bool = False) -> None:
    """Copy the encoder (with the shared token embedding, which is also the tied output
    projection) of the model in ``directory`` (any architecture) into ``model`` (initialising a
    DA-Transformer, NAT or CTC model from a trained AT baseline); with ``decoder_layers`` also
    the layers of the shared decoder stack (:class:`fadat.models.transformer.Decoder`:
    self-attention, cross-attention, FFN, and the pre-LN final LayerNorm; the AT's causal mask is
    not a weight). The decoder's position table and the architecture's own heads (links, length
    predictor, blank) stay freshly initialised.

    Any depth works (the presets cpu-small-4x2 and cpu-small-5x1 included) when the source has
    the same number of encoder layers (and, with ``decoder_layers``, decoder layers); a different
    depth is refused rather than copied in part.

    Raises:
        InputError: the directory's encoder (or decoder layers) differ in depth, naming both, or
            in shape (vocabulary, width, pre/post-norm).
    """
    from fadat.models.directory import load_pretrained

    loaded = load_pretrained(directory)
    depths = [("encoder_layers", "encoder")] + ([("decoder_layers", "decoder")] * decoder_layers)
    for key, stack in depths:
        theirs, ours = getattr(loaded.config, key), getattr(model.config, key)
        if theirs != ours:
            # No partial copy: which of 3 layers would start a 1-layer stack is not obvious,
            # and fresh layers on top of copied ones would scramble the copied representation.
            flag = "--init-encoder-from" + (" --init-decoder-layers" if stack == "decoder" else "")
            raise InputError(
                f"{flag} {directory}: its {stack} has {theirs} layers, this model's {ours}; "
                f"initialise from a model of the same depth (e.g. an AT trained with the same "
                f"--preset and --arch at)"
            )
    source = loaded.state_dict()
    own = model.state_dict()
    prefixes = ("encoder.",)
    if decoder_layers:
        prefixes += ("decoder.layers.", "decoder.final_norm.")
    names = [n for n in own if n.startswith(prefixes)]
    bad = [n for n in names if n not in source or source[n].shape != own[n].shape]
    if bad:
        raise InputError(
            f"--init-encoder-from {directory}: encoder does not fit this model "
            f"(first mismatch: {bad[0]}); use the same vocabulary, width and encoder layers"
        )
    model.load_state_dict({**own, **{n: source[n] for n in names}})
