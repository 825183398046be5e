"""Tests of encoder and decoder depth as design choices (issue 44, item 2): the deep-encoder /
shallow-decoder presets are within ±5 % of cpu-small's parameter count (counts pinned), the fast
inference path (:func:`fadat.models.inference.graph_top1`) gives the full path's outputs at every
depth, and ``--init-encoder-from --init-decoder-layers`` copies a model of the same depth and
refuses another depth."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fadat.data.contract import pad_sequences
from fadat.decoding import decode
from fadat.errors import InputError
from fadat.models.at import ATModel
from fadat.models.config import make_config
from fadat.models.dat import DATModel

#: DAT parameters per preset at the released model's vocabulary (4000) and at 8000
#: (copy_source adds none). Changing a preset changes these on purpose only.
PARAMETERS = {
    "cpu-small": {4000: 7_408_132, 8000: 8_432_132},
    "cpu-small-4x2": {4000: 7_144_452, 8000: 8_168_452},
    "cpu-small-5x1": {4000: 7_274_756, 8000: 8_298_756},
}

DEPTHS = [(5, 1), (4, 2), (3, 3)]


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("vocab", [4000, 8000])
def test_shallow_decoder_presets_have_about_cpu_smalls_parameters(vocab):
    counts = {}
    for preset, expected in PARAMETERS.items():
        config = make_config(preset, vocab, copy_source=True)
        counts[preset] = _count(DATModel(config))
        assert counts[preset] == expected[vocab], preset
    base = counts["cpu-small"]
    for preset in ("cpu-small-4x2", "cpu-small-5x1"):
        assert abs(counts[preset] - base) <= 0.05 * base, preset
    assert [make_config(p, vocab).encoder_layers for p in PARAMETERS] == [3, 4, 5]
    assert [make_config(p, vocab).decoder_layers for p in PARAMETERS] == [3, 2, 1]
    # the same 5+1 at FFN 1024 would be outside ±5 %: why cpu-small-5x1 has FFN 1152
    narrow = _count(DATModel(make_config("cpu-small", vocab, encoder_layers=5, decoder_layers=1)))
    assert abs(narrow - base) > 0.05 * base


def _tiny(encoder_layers: int, decoder_layers: int, seed: int) -> DATModel:
    torch.manual_seed(seed)
    config = make_config(
        "tiny",
        40,
        d_model=32,
        ffn_dim=64,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        copy_source=True,
    )
    model = DATModel(config).eval()
    with torch.no_grad():  # sharper than the N(0, 0.02) start: distinct argmaxes and links
        for p in model.parameters():
            p.mul_(20.0 if p.dim() > 1 else 1.0)
    return model


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), DEPTHS, ids=["5+1", "4+2", "3+3"])
@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "viterbi", "joint-viterbi"])
def test_fast_path_gives_the_full_paths_outputs_at_every_depth(
    encoder_layers, decoder_layers, strategy
):
    """On random models of each depth (scaled weights, so the outputs are not uniform):
    ``translate_batch`` (the fast path: only the vertices' best tokens) gives the outputs and
    scores of the decoder on the full ``(B, L, V)`` log-probs, at the model's λ and at λ = 2."""
    model = _tiny(encoder_layers, decoder_layers, seed=encoder_layers)
    g = torch.Generator().manual_seed(1)
    sources = [[*torch.randint(4, 40, (n,), generator=g).tolist(), 2] for n in (1, 3, 6, 9, 12)]
    source = pad_sequences(sources)
    for ratio in (None, 2.0):
        lengths = model.graph_lengths(source.ne(1).sum(1), True, ratio)
        with torch.no_grad():
            token_logprobs, links = model(source, lengths)  # the full path
        expected = decode(token_logprobs, links, lengths, strategy)
        got = model.translate_batch(source, strategy, {}, upsample_ratio=ratio)
        assert len({tuple(e.tokens) for e in expected}) > 1  # not one output for every source
        for e, (hyp,) in zip(expected, got, strict=True):
            assert hyp.tokens == list(e.tokens)
            assert hyp.score == pytest.approx(float(e.score), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), DEPTHS, ids=["5+1", "4+2", "3+3"])
def test_init_decoder_layers_copies_an_at_of_the_same_depth(
    tmp_path, encoder_layers, decoder_layers
):
    """An AT trained with the same depth (``--arch at`` with the same preset) starts the DAT's
    encoder and decoder layers; an AT of another depth is refused with both depths named."""
    from fadat.training.config import TrainConfig
    from fadat.training.model_init import build_model

    sizes = dict(d_model=16, ffn_dim=32, attention_heads=2, link_heads=2)
    depth = dict(encoder_layers=encoder_layers, decoder_layers=decoder_layers)
    torch.manual_seed(0)
    at = ATModel(make_config("tiny", 12, model_type="at", **sizes, **depth))
    at.save_pretrained(tmp_path / "at")
    common = dict(data="d", run_dir="r", preset="tiny", model={**sizes, **depth})
    cfg = TrainConfig(**common, init_encoder_from=str(tmp_path / "at"), init_decoder_layers=True)
    state = build_model(cfg, 12).state_dict()
    source = at.state_dict()
    copied = [n for n in state if n.startswith(("encoder.", "decoder.layers."))]
    assert {n.split(".")[2] for n in copied if n.startswith("encoder.layers.")} == {
        str(i) for i in range(encoder_layers)
    }
    assert {n.split(".")[2] for n in copied if n.startswith("decoder.layers.")} == {
        str(i) for i in range(decoder_layers)
    }
    assert all(torch.equal(state[n], source[n]) for n in copied)
    other = (3, 3) if (encoder_layers, decoder_layers) != (3, 3) else (4, 2)
    at_other = ATModel(
        make_config(
            "tiny", 12, model_type="at", **sizes, encoder_layers=other[0], decoder_layers=other[1]
        )
    )
    at_other.save_pretrained(tmp_path / "other")
    bad = TrainConfig(**common, init_encoder_from=str(tmp_path / "other"), init_decoder_layers=True)
    with pytest.raises(InputError, match=r"its encoder has \d layers, this model's \d"):
        build_model(bad, 12)
    # the same encoder, another decoder depth: the encoder alone is copied; with the decoder
    # layers asked for, refused
    deeper = ATModel(
        make_config("tiny", 12, model_type="at", **sizes, **{**depth, "decoder_layers": 4})
    )
    deeper.save_pretrained(tmp_path / "deeper")
    encoder_only = TrainConfig(**common, init_encoder_from=str(tmp_path / "deeper"))
    state = build_model(encoder_only, 12).state_dict()
    assert all(torch.equal(state[n], deeper.state_dict()[n]) for n in state if "encoder." in n)
    with pytest.raises(InputError, match=r"its decoder has 4 layers, this model's \d"):
        build_model(dataclasses.replace(encoder_only, init_decoder_layers=True), 12)


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), DEPTHS, ids=["5+1", "4+2", "3+3"])
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_low_precision_fast_path_gives_its_full_paths_outputs_at_every_depth(
    encoder_layers, decoder_layers, precision
):
    """The bf16 and int8 copies (:func:`fadat.models.inference.with_precision`) of each depth:
    lookahead on the fast path gives the outputs of lookahead on the same copy's full
    ``(B, L, V)`` outputs: the same tokens; scores within 1e-3 in bf16 and 2 % in int8, whose
    activations are quantized per call with the scale of what the call sees (the fast path's
    real vertices, the full path's padded batch)."""
    from fadat.models.inference import precision_autocast, with_precision

    model = with_precision(_tiny(encoder_layers, decoder_layers, seed=encoder_layers), precision)
    g = torch.Generator().manual_seed(2)
    sources = [[*torch.randint(4, 40, (n,), generator=g).tolist(), 2] for n in (2, 5, 8, 11)]
    source = pad_sequences(sources)
    with torch.inference_mode(), precision_autocast(model):
        token_logprobs, links, lengths = model.graph_outputs(source)
    expected = decode(token_logprobs, links, lengths, "lookahead")
    got = model.translate_batch(source, "lookahead", {})
    for e, (hyp,) in zip(expected, got, strict=True):
        assert hyp.tokens == list(e.tokens)
        tolerance = 2e-2 if precision == "int8" else 1e-3
        assert hyp.score == pytest.approx(float(e.score), rel=tolerance, abs=1e-3)


#: The sweep's configs (docs/speed-sweep.md) → what they change in the NLL recipe.
SWEEP = {
    "dat-cpu-small-range-nll.yaml": {"upsample_ratio_range": (3.0, 6.0), "max_tokens": 3072},
    "dat-cpu-small-5x1-nll.yaml": {"preset": "cpu-small-5x1"},
    "dat-cpu-small-5x1-range-nll.yaml": {
        "preset": "cpu-small-5x1",
        "upsample_ratio_range": (3.0, 6.0),
        "max_tokens": 3072,
    },
    "dat-cpu-small-4x2-nll.yaml": {"preset": "cpu-small-4x2"},
    "dat-cpu-small-4x2-range-nll.yaml": {
        "preset": "cpu-small-4x2",
        "upsample_ratio_range": (3.0, 6.0),
        "max_tokens": 3072,
    },
}


def test_sweep_configs_are_the_nll_recipe_with_only_depth_and_lambda_changed():
    """Every sweep config is configs/dat-cpu-small-nll.yaml with only the preset, the λ range and
    (with a range) max_tokens × 6/4 changed, so that a batch holds as many sentences."""
    from pathlib import Path

    from fadat.training.config import load_yaml_config

    configs = Path(__file__).resolve().parent.parent / "configs"
    recipe = load_yaml_config(configs / "dat-cpu-small-nll.yaml")
    for name, changes in SWEEP.items():
        values = load_yaml_config(configs / name)
        changed = {k: v for k, v in values.items() if recipe.get(k) != v}
        assert changed == changes, name
        assert set(recipe) <= set(values), name
        if "max_tokens" in changes:
            assert changes["max_tokens"] == recipe["max_tokens"] * 6 // 4


#: The chosen design's plateau configs → what they change in the release's recipe.
PLATEAU = {
    "dat-cpu-small-5x1-range-nll-fast.yaml": (
        "dat-cpu-small-nll-fast.yaml",
        {
            "preset": "cpu-small-5x1",
            "model": {"copy_source": True, "decode_upsample_ratio": 3},
            "upsample_ratio_range": (3.0, 6.0),
            "max_tokens": 3072,
        },
    ),
    "dat-cpu-small-5x1-range-fuzzy-plateau.yaml": (
        "dat-cpu-small-fuzzy-plateau.yaml",
        {"preset": "cpu-small-5x1", "upsample_ratio_range": (3.0, 6.0), "max_tokens": 3072},
    ),
}


def test_plateau_configs_are_the_release_recipe_with_only_the_design_changed():
    """The chosen design's pre-training and FA-DAT configs are the release's with only the shape,
    the λ range (max_tokens × 6/4) and the decoding λ changed (its experiment file:
    tests/test_recipes.py)."""
    from pathlib import Path

    from fadat.training.config import load_yaml_config

    configs = Path(__file__).resolve().parent.parent / "configs"
    for name, (base, changes) in PLATEAU.items():
        recipe = load_yaml_config(configs / base)
        values = load_yaml_config(configs / name)
        changed = {k: v for k, v in values.items() if recipe.get(k) != v}
        assert changed == changes, name
        assert set(recipe) <= set(values), name
