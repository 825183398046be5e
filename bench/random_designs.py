"""Model directories of DAT designs with random weights, for measuring latency before training.

A DAT's batch-1 time depends on its shape (depths, widths, vocabulary) and on the decoding λ,
not on its weights: the network runs over all L = λ·|x </s>| vertices whatever it has learnt, and
only the decoders' walk along the graph (O(L) for lookahead) follows the weights. So the
latency axis of the speed frontier (docs/speed-sweep.md) can be measured from these directories
while the designs train; their translations and BLEU mean nothing.

Each design is a training config as ``fadat train --config`` reads it: its ``preset``, its
``model`` block, ``dropout`` and ``upsample_ratio_range`` give the model config
(:func:`fadat.training.model_init.build_model`'s fresh-model branch), at the vocabulary size of
``--vocab``; weights are drawn with the preset's initialisation after ``torch.manual_seed(0)``,
so every run builds the same models. The directory holds config.json, model.safetensors (fp32)
and the ``--spm`` sentencepiece model, as ``fadat average`` writes one.

Usage::

    python bench/random_designs.py --vocab 4000 \\
        --spm models/bible-en-es-fadat-cpu-small/spm.model --output runs/frontier-rand/models \\
        base=configs/dat-cpu-small-nll.yaml 4x2=configs/dat-cpu-small-4x2-nll.yaml \\
        5x1=configs/dat-cpu-small-5x1-nll.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fadat.training.config import config_from_dict, load_yaml_config  # noqa: E402
from fadat.training.model_init import build_model  # noqa: E402


def build_random_design(config: str | Path, vocab_size: int, spm_model: str | Path, output: Path):
    """Write a model directory of the training config's DAT with random weights (seed 0).

    Args:
        config: a training config (YAML) of ``arch: dat``.
        vocab_size: the vocabulary size the model is built for.
        spm_model: the sentencepiece model copied into the directory (its vocabulary size
            should be ``vocab_size``; not checked here).
        output: the model directory to write (created; existing files are replaced).

    Returns:
        The model (``fadat.models.dat.DATModel``), for its parameter count.

    Raises:
        SystemExit: the config is not a DAT's, or starts from another model's weights.
        fadat.errors.InputError: an unreadable or invalid config.
    """
    # data and run_dir are required fields of a training config; no data is read here
    values = {"data": "", "run_dir": "", **load_yaml_config(config)}
    cfg = config_from_dict(values, str(config))
    if cfg.arch != "dat" or cfg.init_from or cfg.init_encoder_from:
        raise SystemExit(f"{config}: not a DAT trained from scratch (arch {cfg.arch!r})")
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size)
    model.eval()
    model.save_pretrained(output, spm_model=str(spm_model))
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("designs", nargs="+", metavar="NAME=CONFIG")
    p.add_argument("--vocab", type=int, required=True, help="vocabulary size")
    p.add_argument("--spm", required=True, help="sentencepiece model of that vocabulary")
    p.add_argument("--output", type=Path, required=True, help="one directory per NAME in here")
    args = p.parse_args(argv)
    for spec in args.designs:
        name, sep, config = spec.partition("=")
        if not sep or not name or not config:
            raise SystemExit(f"{spec!r}: expected NAME=CONFIG")
        model = build_random_design(config, args.vocab, args.spm, args.output / name)
        c = model.config
        params = sum(t.numel() for t in model.parameters())
        print(
            f"{name}: {c.encoder_layers}+{c.decoder_layers} layers, d={c.d_model}, "
            f"FFN {c.ffn_dim}, λ={c.upsample_ratio} range {c.upsample_ratio_range}, "
            f"V={c.vocab_size}, {params:,} parameters -> {args.output / name}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
