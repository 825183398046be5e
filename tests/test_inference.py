"""Tests of the DAT's fast inference path (fadat.inference): in fp32 it gives the current
decoders' outputs on 50 real bible-en-es test sentences with the released model; bf16 and int8
copies translate without touching the fp32 model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fadat.data.contract import pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import VertexTop1, decode
from fadat.inference import graph_top1, with_precision
from fadat.translate import Translator

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "bible-en-es-fadat-cpu-small"
TEST_50 = ROOT / "tests" / "data" / "bible-en-es-test-50.en"

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="no released model")


@pytest.fixture(scope="module")
def released():
    translator = Translator.from_pretrained(MODEL)
    lines = TEST_50.read_text(encoding="utf-8").splitlines()
    return translator.model, [encode_source(translator.sp, line) for line in lines]


def _batches(sources, size):
    return [pad_sequences(sources[k : k + size]) for k in range(0, len(sources), size)]


@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "joint-viterbi", "viterbi"])
@pytest.mark.parametrize("batch", [1, 16])
def test_fp32_fast_path_gives_the_decoders_outputs(released, strategy, batch):
    model, sources = released
    torch.set_num_threads(1)
    for source in _batches(sources, batch):
        graph_lengths = model.graph_lengths(source.ne(1).sum(1), decoding=True)
        with torch.no_grad():
            token_logprobs, links = model(source, graph_lengths)  # the full path
        expected = decode(token_logprobs, links, graph_lengths, strategy)
        top1, fast_links, fast_lengths = graph_top1(model, source, strategy == "greedy")
        assert torch.equal(fast_lengths, graph_lengths) and torch.equal(fast_links, links)
        got = decode(top1, fast_links, fast_lengths, strategy)
        for e, g in zip(expected, got, strict=True):
            assert (g.tokens, g.path, g.path_tokens) == (e.tokens, e.path, e.path_tokens)
            assert g.score == pytest.approx(e.score, rel=1e-6, abs=1e-5)
        if strategy != "greedy":  # every real vertex's s and argmax, not only the path's
            s, tok = token_logprobs.max(-1)
            real = torch.arange(s.shape[1])[None, :] < graph_lengths[:, None]
            assert torch.equal(top1.tok[real], tok[real])
            assert torch.allclose(top1.s[real], s[real], rtol=0, atol=1e-5)


def test_top1_refuses_the_strategies_that_read_more(released):
    model, sources = released
    top1, links, lengths = graph_top1(model, pad_sequences(sources[:2]))
    assert isinstance(top1, VertexTop1) and top1.s.dtype == torch.float32
    for strategy, options in (
        ("sample", {}),
        ("beam", {}),
        ("lookahead", {"no_repeated_ngram": 2}),
    ):
        with pytest.raises(ValueError, match="VertexTop1"):
            decode(top1, links, lengths, strategy, **options)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_low_precision_copies_translate_close_to_fp32(released, precision):
    model, sources = released
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = with_precision(model, precision)
    assert fast is not model and fast.inference_precision == precision
    same = 0
    for source in _batches(sources, 10):
        reference = decode(*graph_top1(model, source), "lookahead")
        got = decode(*graph_top1(fast, source), "lookahead")
        same += sum(r.tokens == g.tokens for r, g in zip(reference, got, strict=True))
        assert all(len(g.tokens) > 0 for g in got)
    # Rounding moves some argmax decisions, not most (measured: see RESULTS.md for BLEU).
    assert same >= 20, same
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="precision"):
        with_precision(model, "fp8")


def test_translate_verb_and_translator_take_a_precision(tmp_path, capsys):
    from test_translate import random_models

    from fadat import cli

    models = random_models(str(tmp_path / "random"))
    src = tmp_path / "in.txt"
    src.write_text("ab cd ef\ngh ij\n", encoding="utf-8")
    outputs = {}
    for precision in ("fp32", "int8"):
        out = tmp_path / f"{precision}.txt"
        argv = ["translate", "--model", str(models["dat"]), "--input", str(src)]
        assert cli.main([*argv, "--output", str(out), "--precision", precision]) == 0
        outputs[precision] = out.read_text(encoding="utf-8").splitlines()
    assert len(outputs["int8"]) == 2
    argv = ["translate", "--model", str(models["at"]), "--input", str(src), "--precision", "bf16"]
    assert cli.main(argv) == 2
    assert "DAT models" in capsys.readouterr().err
    translator = Translator.from_pretrained(models["dat"], precision="bf16")
    assert translator.model.inference_precision == "bf16"
    assert len(translator.translate(["ab cd"], strategy="joint-viterbi")) == 1
    assert len(translator.translate(["ab cd"], strategy="sample", seed=1)) == 1  # full path


def test_low_precision_refuses_a_model_off_the_cpu():
    """bf16 (CPU autocast) and int8 (dynamic quantization) copies exist on the CPU only: a model
    on another device (here "meta", as a CUDA one would be) is a clear error, not a copy that
    fails later inside autocast or quantization; fp32 returns the model itself."""
    from fadat.model import DATModel
    from fadat.transformer import make_config

    model = DATModel(make_config("tiny", 16)).to("meta")
    for precision in ("bf16", "int8"):
        with pytest.raises(ValueError, match="on the CPU; this one is on meta"):
            with_precision(model, precision)
    assert with_precision(model, "fp32") is model
