"""Tests of the DAT's fast inference path (fadat.models.inference): in fp32 it gives the current
decoders' outputs on 50 real bible-en-es test sentences with the released model; bf16 and int8
copies translate without touching the fp32 model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fadat.data.contract import pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import VertexTop1, decode
from fadat.models.inference import graph_top1, with_precision
from fadat.translation.translator import Translator

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


# the fast path's decoders that read every vertex's top-1, not only the argmax-link path's
NOT_PATH_ONLY = ["lookahead", "joint-viterbi", "viterbi"]


@pytest.mark.parametrize("batch", [1, 16])
def test_fp32_fast_path_gives_the_decoders_outputs(released, batch):
    """Greedy, lookahead, joint-Viterbi and Viterbi on the fast path give their outputs on the
    full path. The passes do not depend on the decoder (the fast path's only option is greedy's
    path-only top-1), so each batch gets one full and two fast passes, which every decoder
    reads: the same comparisons as one test per decoder, without recomputing the same passes."""
    model, sources = released
    torch.set_num_threads(1)
    for source in _batches(sources, batch):
        graph_lengths = model.graph_lengths(source.ne(1).sum(1), decoding=True)
        with torch.no_grad():
            token_logprobs, links = model(source, graph_lengths)  # the full path
        for path_only, strategies in ((True, ["greedy"]), (False, NOT_PATH_ONLY)):
            top1, fast_links, fast_lengths = graph_top1(model, source, path_only)
            assert torch.equal(fast_lengths, graph_lengths) and torch.equal(fast_links, links)
            for strategy in strategies:
                expected = decode(token_logprobs, links, graph_lengths, strategy)
                got = decode(top1, fast_links, fast_lengths, strategy)
                for e, g in zip(expected, got, strict=True):
                    assert (g.tokens, g.path, g.path_tokens) == (
                        e.tokens, e.path, e.path_tokens
                    ), strategy  # fmt: skip
                    assert g.score == pytest.approx(e.score, rel=1e-6, abs=1e-5), strategy
            if not path_only:  # every real vertex's s and argmax, not only the path's
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


@pytest.fixture(scope="module")
def fp32_lookahead_in_tens(released):
    """The 50 sources sorted by length in batches of 10, each with the fp32 model's lookahead
    outputs on it (computed once for both low precisions). Batches of similar lengths are still
    ragged but pad less than batches in file order (2,420 positions for 2,159 tokens, not
    2,960): emulated bf16 spends its time in the token head, over every padded vertex."""
    model, sources = released
    return [
        (source, decode(*graph_top1(model, source), "lookahead"))
        for source in _batches(sorted(sources, key=len), 10)
    ]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_low_precision_copies_translate_close_to_fp32(released, fp32_lookahead_in_tens, precision):
    model, _ = released
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = with_precision(model, precision)
    assert fast is not model and fast.inference_precision == precision
    same = 0
    for source, reference in fp32_lookahead_in_tens:
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


@pytest.mark.parametrize("hardware", [False, True])
def test_bf16_without_bf16_hardware_warns(tmp_path, capsys, monkeypatch, hardware):
    """bf16 on a CPU without AVX-512 BF16 or AMX (emulated, slower than fp32) still converts
    but warns: an EmulatedBF16Warning from the library, one ``fadat: warning:`` line from the
    command line; nothing on a CPU with bf16 hardware. The CPU is pinned by monkeypatching, so
    both branches run on every machine."""
    import warnings

    from test_translate import random_models

    from fadat import cli
    from fadat.errors import EmulatedBF16Warning
    from fadat.models import inference

    monkeypatch.setattr(inference, "native_bf16", lambda device_type="cpu": hardware)
    models = random_models(str(tmp_path / "random"))
    model = Translator.from_pretrained(models["dat"]).model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert with_precision(model, "bf16").inference_precision == "bf16"
        with_precision(model, "int8")
    emulated = [w for w in caught if issubclass(w.category, EmulatedBF16Warning)]
    assert len(emulated) == (0 if hardware else 1)
    if emulated:
        assert "without bf16 hardware" in str(emulated[0].message)
        assert emulated[0].filename == __file__  # points at the caller
    src = tmp_path / "in.txt"
    src.write_text("ab cd ef\n", encoding="utf-8")
    argv = ["translate", "--model", str(models["dat"]), "--input", str(src), "--precision"]
    assert cli.main([*argv, "bf16", "--output", str(tmp_path / "out.txt")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "bf16 hardware" in line]
    if hardware:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith("fadat: warning: bf16 precision on a CPU ")


def test_low_precision_refuses_a_model_off_the_cpu():
    """bf16 (CPU autocast) and int8 (dynamic quantization) copies exist on the CPU only: a model
    on another device (here "meta", as a CUDA one would be) is a clear error, not a copy that
    fails later inside autocast or quantization; fp32 returns the model itself."""
    from fadat.models.config import make_config
    from fadat.models.dat import DATModel

    model = DATModel(make_config("tiny", 16)).to("meta")
    for precision in ("bf16", "int8"):
        with pytest.raises(ValueError, match="on the CPU; this one is on meta"):
            with_precision(model, precision)
    assert with_precision(model, "fp32") is model


# ----------------------------------------------------------------------------------------------
# Less of the token head (issue 34): a vocabulary shortlist and pruning by passing probability

TEST_50_ES = ROOT / "tests" / "data" / "bible-en-es-test-50.es"


@pytest.fixture(scope="module")
def small_shortlist(released, tmp_path_factory):
    """A small shortlist (10 candidates per source token, 100 frequent) built from the 50 test
    sources paired with the model's own greedy translations (a shortlist "from the model's own
    outputs"), so that some sentences' path tokens fall outside it and others do not (with the
    released model 7–8 of the first 21 sentences are covered, per strategy). One built from the
    50 references covers none: the model's outputs use pieces the references do not."""
    from fadat.models.shortlist import build_shortlist, text_pairs

    translator = Translator.from_pretrained(MODEL)
    sources = TEST_50.read_text(encoding="utf-8").splitlines()
    own = tmp_path_factory.mktemp("shortlist") / "own-greedy.es"
    own.write_text("\n".join(translator.translate(sources, strategy="greedy")) + "\n", "utf-8")
    pairs = text_pairs(translator.sp, TEST_50, own)
    return build_shortlist(pairs, translator.model.config.vocab_size, top_k=10, frequent=100)


def _full(model, source):
    graph_lengths = model.graph_lengths(source.ne(1).sum(1), decoding=True)
    with torch.no_grad():
        token_logprobs, links = model(source, graph_lengths)  # (B, L, V), (B, L, L)
    return token_logprobs, links, graph_lengths


# The reduced-head tests use the first 21 sentences: batches of 1, and ragged batches of 7.
REDUCED_SENTENCES = 21


@pytest.fixture(scope="module")
def full_passes(released):
    """Batch size -> [(source, token_logprobs, links, graph_lengths)] of the full path."""
    model, sources = released
    torch.set_num_threads(1)
    return {
        size: [(s, *_full(model, s)) for s in _batches(sources[:REDUCED_SENTENCES], size)]
        for size in (1, 7)
    }


def _same(got, expected):
    for e, g in zip(expected, got, strict=True):
        assert (g.tokens, g.path, g.path_tokens) == (e.tokens, e.path, e.path_tokens)
        assert g.score == pytest.approx(e.score, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "joint-viterbi", "viterbi"])
@pytest.mark.parametrize("batch", [1, 7])  # 7: ragged batches of unsorted sentences
def test_shortlist_path_is_the_full_head_renormalised_over_the_shortlist(
    released, full_passes, small_shortlist, strategy, batch
):
    """The reference: the full (B, L, V) log-probabilities with every token outside a sentence's
    shortlist removed and the rest renormalised, decoded by the same decoder. Greedy and
    Viterbi (whose path does not read s) also give the full head's outputs whenever its path
    tokens are in the shortlist."""
    model, _ = released
    torch.set_num_threads(1)
    covered = 0
    for source, token_logprobs, links, lengths in full_passes[batch]:
        mask = torch.zeros_like(token_logprobs[:, 0, :], dtype=torch.bool)  # (B, V)
        for row in range(source.shape[0]):
            mask[row, torch.from_numpy(small_shortlist.candidates(source[row]))] = True
        restricted = token_logprobs.masked_fill(~mask[:, None, :], float("-inf"))
        restricted = torch.log_softmax(restricted, dim=-1)  # (B, L, V)
        expected = decode(restricted, links, lengths, strategy)
        top1, fast_links, fast_lengths = graph_top1(
            model, source, strategy == "greedy", shortlist=small_shortlist
        )
        got = decode(top1, fast_links, fast_lengths, strategy)
        _same(got, expected)
        full = decode(token_logprobs, links, lengths, strategy)
        for row, (f, g) in enumerate(zip(full, got, strict=True)):
            if set(f.path_tokens) <= set(small_shortlist.candidates(source[row]).tolist()):
                covered += 1
                if strategy in ("greedy", "viterbi"):
                    assert (g.tokens, g.path) == (f.tokens, f.path)
    assert 0 < covered < REDUCED_SENTENCES  # both cases occur with this small shortlist


@pytest.mark.parametrize("strategy", ["lookahead", "joint-viterbi", "viterbi"])
@pytest.mark.parametrize("batch", [1, 7])
def test_pruned_path_gives_the_full_outputs_when_its_path_is_kept(
    released, full_passes, strategy, batch
):
    """Exact above the threshold: with τ at most the passing probability of every vertex of the
    full head's path, and at a fixed τ for every sentence whose full path stays on kept
    vertices; and τ = 1e-3 does prune."""
    from fadat.dag import passing_probabilities
    from fadat.models.inference import kept_vertices

    model, _ = released
    torch.set_num_threads(1)
    kept = real = checked = 0
    for source, token_logprobs, links, lengths in full_passes[batch]:
        full = decode(token_logprobs, links, lengths, strategy)
        passing = passing_probabilities(links, lengths)  # (B, L)
        tau = min(float(passing[row, f.path].min()) for row, f in enumerate(full))
        _same(decode(*graph_top1(model, source, prune_threshold=tau), strategy), full)
        top1, _, _ = graph_top1(model, source, prune_threshold=1e-3)
        keep = kept_vertices(links, lengths, 1e-3)  # (B, L)
        real_vertex = torch.arange(links.shape[1])[None, :] < lengths[:, None]  # (B, L)
        assert torch.equal(torch.isfinite(top1.s) | ~real_vertex, keep | ~real_vertex)
        got = decode(top1, links, lengths, strategy)
        for row, (f, g) in enumerate(zip(full, got, strict=True)):
            if bool(keep[row, f.path].all()):
                checked += 1
                assert (g.tokens, g.path, g.path_tokens) == (f.tokens, f.path, f.path_tokens)
        kept += int(keep.sum())
        real += int(lengths.sum())
    assert checked >= 0.8 * REDUCED_SENTENCES and kept < 0.9 * real, (checked, kept, real)


def test_kept_vertices_at_the_extremes_and_errors(full_passes):
    """τ = 0 keeps every real vertex; τ = 1 keeps the argmax-link walk (the greedy path)."""
    from fadat.decoding import walk_links
    from fadat.models.inference import kept_vertices

    _, _, links, lengths = full_passes[7][0]
    real = torch.arange(links.shape[1])[None, :] < lengths[:, None]
    assert torch.equal(kept_vertices(links, lengths, 0.0), real)
    paths, _ = walk_links(links, lengths)
    walk = torch.zeros_like(real).scatter_(1, paths, True)
    assert torch.equal(kept_vertices(links, lengths, 1.0), walk)
    with pytest.raises(ValueError, match="prune threshold"):
        kept_vertices(links, lengths, 1.5)


def test_translator_takes_a_shortlist_and_a_threshold(released, small_shortlist, tmp_path):
    from fadat.errors import InputError
    from fadat.models.shortlist import SHORTLIST_NAME

    lines = TEST_50.read_text(encoding="utf-8").splitlines()[:4]
    path = small_shortlist.save(tmp_path / SHORTLIST_NAME)
    plain = Translator.from_pretrained(MODEL)
    reduced = Translator.from_pretrained(MODEL, shortlist=path, prune_threshold=0.0)
    assert reduced.model.inference_prune_threshold == 0.0
    # the pipeline runs graph_top1 with both: the same outputs as calling it directly
    sources = [encode_source(plain.sp, line) for line in lines]
    for strategy in ("greedy", "lookahead"):
        direct = decode(
            *graph_top1(
                plain.model,
                pad_sequences(sources),
                strategy == "greedy",
                shortlist=small_shortlist,
                prune_threshold=0.0,
            ),
            strategy,
        )
        expected = [plain.sp.decode(h.tokens) for h in direct]
        assert reduced.translate(lines, strategy, max_tokens=0) == expected
    with pytest.raises(InputError, match="shortlist"):
        reduced.translate(lines, "sample", seed=1)
    with pytest.raises(InputError, match="shortlist"):
        reduced.translate(lines, "lookahead", no_repeated_ngram=2)
    with pytest.raises(InputError, match="no shortlist"):
        Translator.from_pretrained(MODEL, shortlist=True)  # the released dir has none
