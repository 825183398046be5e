"""``translate_batch`` returns each output's ``log P(y|x)`` from its own forward pass when asked
(``with_log_prob``) and takes λ as an argument (issue 33, item 3).

``log P(y|x)`` equals ``score_batch`` (what ``fadat score`` computes) on the same output, for
every DAT decoder on the 50 bible-en-es test sentences with the released model (batch 1 and
batched, the shortlist / pruned fast path included), and for the AT, NAT and CTC models; not
asked, it is ``None``, the outputs are the same and the DAT fast path never computes the full
token head. λ sets the graph (DAT) or decoder (CTC) length of that call only: the model's config
is the same object, unchanged, afterwards."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import fadat.models.inference
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, graph_size, pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import STRATEGIES
from fadat.models.at import ATModel
from fadat.models.config import make_config
from fadat.models.ctc import CTCModel
from fadat.models.inference import with_reduced_head
from fadat.models.nat import NATModel
from fadat.translation.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "bible-en-es-fadat-cpu-small"
TEST_50 = ROOT / "tests" / "data" / "bible-en-es-test-50.en"
TEST_50_ES = ROOT / "tests" / "data" / "bible-en-es-test-50.es"
OPTIONS = {"sample": {"seed": 3}, "beam": {"beam_size": 3}}
released_only = pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="no released model")


@pytest.fixture(scope="module")
def released():
    translator = Translator.from_pretrained(MODEL)
    lines = TEST_50.read_text(encoding="utf-8").splitlines()
    return translator.model, [encode_source(translator.sp, line) for line in lines]


def _scored(model, source, hyps, upsample_ratio=None):
    """``score_batch`` of every listed output (one row per hypothesis)."""
    rows = [b for b, sentence in enumerate(hyps) for _ in sentence]
    targets = [[BOS_ID, *h.tokens, EOS_ID] for sentence in hyps for h in sentence]
    lengths = torch.tensor([len(t) for t in targets])
    with torch.no_grad():
        return model.score_batch(
            source[rows], pad_sequences(targets), lengths, upsample_ratio=upsample_ratio
        )


def _check(model, sources, batch, strategy, options, nbest=1, upsample_ratio=None):
    """Translate ``sources`` in batches with and without ``log P(y|x)``: the same outputs and
    scores, ``None`` when not asked, ``score_batch``'s value when asked; returns the count."""
    torch.set_num_threads(1)
    checked = 0
    for k in range(0, len(sources), batch):
        source = pad_sequences(sources[k : k + batch])  # (B, S)
        run = dict(upsample_ratio=upsample_ratio)
        plain = model.translate_batch(source, strategy, options, nbest, **run)
        hyps = model.translate_batch(source, strategy, options, nbest, with_log_prob=True, **run)
        assert [[(h.tokens, h.score) for h in s] for s in plain] == [
            [(h.tokens, h.score) for h in s] for s in hyps
        ]
        assert all(h.log_prob is None for sentence in plain for h in sentence)
        want = _scored(model, source, hyps, upsample_ratio)
        got = [h for sentence in hyps for h in sentence]
        for h, lp, tokens in zip(got, want.log_probs, want.tokens, strict=True):
            assert h.log_prob == pytest.approx(lp, rel=1e-5, abs=1e-5)
            assert h.covers == tokens
            checked += 1
    return checked


@released_only
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("batch", [1, 8])
def test_dat_log_prob_is_the_score_of_the_output(released, strategy, batch):
    """Batch 1 on 6 sentences (each alone on its graph), batch 8 on 24 (padded graphs)."""
    model, sources = released
    sources = sources[:6] if batch == 1 else sources[:24]
    assert _check(model, sources, batch, strategy, OPTIONS.get(strategy, {})) == len(sources)


@released_only
def test_dat_nbest_log_probs_are_the_scores_of_every_listed_output(released):
    model, sources = released
    assert _check(model, sources[:16], 8, "sample", {"seed": 1, "temperature": 2.0}, 4) > 16


@released_only
@pytest.mark.parametrize("strategy", ["greedy", "joint-viterbi"])
def test_reduced_head_log_prob_is_the_full_models(released, strategy):
    """With a small shortlist and pruning the fast path finds other outputs, but their
    ``log P(y|x)`` is still the full model's (full-vocabulary normalisers), exactly."""
    from fadat.models.shortlist import build_shortlist, text_pairs

    model, sources = released
    translator = Translator.from_pretrained(MODEL)
    pairs = text_pairs(translator.sp, TEST_50, TEST_50_ES)
    shortlist = build_shortlist(pairs, model.config.vocab_size, top_k=5, frequent=30)
    reduced = with_reduced_head(translator.model, shortlist=shortlist, prune_threshold=1e-3)
    assert _check(reduced, sources[:24], 8, strategy, {}) == 24


def _tiny(model_type: str, **overrides):
    sizes = {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "attention_heads": 2}
    sizes.update({"ffn_dim": 64, "dropout": 0.0, "max_target_positions": 64, "init_std": 0.3})
    sizes.update(overrides)
    return make_config("tiny", 12, model_type=model_type, **sizes)


def _sources(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 8, (n,), generator=g).tolist()
    return [torch.randint(4, 12, (m,), generator=g).tolist() + [EOS_ID] for m in lengths]


@pytest.mark.parametrize("strategy,options", [("greedy", {}), ("beam", {"beam_size": 3})])
def test_at_log_prob_is_the_teacher_forced_score(strategy, options):
    torch.manual_seed(0)
    model = ATModel(_tiny("at", max_target_positions=12)).eval()
    assert _check(model, _sources(12, 1), 5, strategy, options) == 12


def test_ctc_log_prob_is_the_sum_over_alignments():
    """Not the best path's score: the log-sum over all alignments of the collapsed output."""
    torch.manual_seed(0)
    model = CTCModel(_tiny("ctc", upsample_ratio=2.0)).eval()
    sources = _sources(12, 2)
    assert _check(model, sources, 5, "argmax", {}) == 12
    hyps = model.translate_batch(pad_sequences(sources), "argmax", {}, with_log_prob=True)
    assert any(h.log_prob > h.score + 1e-3 for (h,) in hyps)


def test_nat_log_prob_is_the_score_or_none_when_a_pad_is_dropped():
    torch.manual_seed(0)
    model = NATModel(_tiny("nat")).eval()
    sources = _sources(12, 3)
    assert _check(model, sources, 5, "argmax", {}) == 12
    hyps = model.translate_batch(pad_sequences(sources), "argmax", {}, with_log_prob=True)
    # an argmax <pad> is dropped from the output: log P of that shorter y needs another pass
    assert all((h.log_prob is None) == (len(h.tokens) + 2 < h.covers) for (h,) in hyps)


@released_only
@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "viterbi", "joint-viterbi"])
def test_fast_path_computes_the_full_head_only_when_asked(released, strategy, monkeypatch):
    """Not asked for ``log P(y|x)``, the fast path costs what it cost before: the full-vocabulary
    token head (:func:`fadat.models.inference.output_match`) is never run."""
    model, sources = released
    calls = []
    real = fadat.models.inference.output_match
    monkeypatch.setattr(
        fadat.models.inference, "output_match", lambda *a: calls.append(1) or real(*a)
    )
    source = pad_sequences(sources[:8])
    model.translate_batch(source, strategy, {})
    assert calls == []
    model.translate_batch(source, strategy, {}, with_log_prob=True)
    assert calls == [1]


def _record_decoder_lengths(model, monkeypatch):
    """Lengths of every decoder input the model builds (DAT graph sizes, CTC decoder lengths)."""
    seen = []
    if isinstance(model, CTCModel):
        real = model.forward
        monkeypatch.setattr(model, "forward", lambda s, n: seen.append(n.tolist()) or real(s, n))
    else:
        real = model.decoder_input_tokens
        monkeypatch.setattr(
            model, "decoder_input_tokens", lambda n: seen.append(n.tolist()) or real(n)
        )
    return seen


@released_only
@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "sample"])
def test_dat_upsample_ratio_is_an_argument(released, strategy, monkeypatch):
    """λ given to ``translate_batch`` sets the graph sizes ``L = clip(int(λ·|x </s>|), 2, max)``
    of that call; ``log P(y|x)`` is that graph's (``score_batch`` at the same λ); the model's
    config is the same object, equal to a copy taken before."""
    model, sources = released
    config = model.config
    before = dataclasses.replace(config)
    source = pad_sequences(sources[:6])  # (B, S)
    source_lengths = source.ne(PAD_ID).sum(1)
    seen = _record_decoder_lengths(model, monkeypatch)
    outputs = {}
    for ratio in (None, 2.0, 5.5):
        seen.clear()
        hyps = model.translate_batch(
            source, strategy, OPTIONS.get(strategy, {}), upsample_ratio=ratio
        )
        lam = config.decoding_upsample_ratio if ratio is None else ratio
        want = graph_size(source_lengths, lam, config.max_target_positions).tolist()
        assert seen == [want]
        outputs[ratio] = [h.tokens for (h,) in hyps]
        assert model.batch_cost(int(source_lengths[0]), ratio) == want[0]
    assert outputs[2.0] != outputs[None] and outputs[5.5] != outputs[None]
    assert (
        _check(model, sources[:6], 3, strategy, OPTIONS.get(strategy, {}), upsample_ratio=5.5) == 6
    )
    assert model.config is config and config == before


def test_ctc_upsample_ratio_is_an_argument(monkeypatch):
    torch.manual_seed(0)
    model = CTCModel(_tiny("ctc", upsample_ratio=2.0)).eval()
    config = model.config
    before = dataclasses.replace(config)
    sources = _sources(8, 4)
    source = pad_sequences(sources)
    seen = _record_decoder_lengths(model, monkeypatch)
    for ratio in (None, 3.0, 1.5):
        seen.clear()
        model.translate_batch(source, "argmax", {}, upsample_ratio=ratio)
        lam = 2.0 if ratio is None else ratio
        want = graph_size(source.ne(PAD_ID).sum(1), lam, config.max_target_positions).tolist()
        assert seen == [want]
    assert _check(model, sources, 4, "argmax", {}, upsample_ratio=3.0) == 8
    assert model.config is config and config == before


@pytest.mark.parametrize("strategy", ["greedy", "lookahead", "joint-viterbi"])
def test_log_prob_path_checks_the_full_head_for_non_finite_outputs(strategy):
    """With a shortlist the fast path never reads the tokens outside it, so a NaN there leaves
    the translation finite; ``log P(y|x)`` normalises over the full vocabulary, reads it, and
    is refused (NonFiniteOutputError) instead of returning NaN, as ``score_batch`` is."""
    import numpy as np

    from fadat.errors import NonFiniteOutputError
    from fadat.models.dat import DATModel
    from fadat.models.shortlist import Shortlist

    torch.manual_seed(0)
    model = DATModel(_tiny("dat")).eval()
    vocab = model.config.vocab_size
    table = np.tile(np.array([4, 5, 6], dtype=np.int64), (vocab, 1))  # (V, 3)
    shortlist = Shortlist(table, np.array([0, 1, 2, 3], dtype=np.int64), {})
    with torch.no_grad():
        model.output_weight[vocab - 1] = float("nan")  # not a candidate, not in any source
    with_reduced_head(model, shortlist=shortlist)
    sources = [[4, 5, 6, 7, EOS_ID], [8, 9, EOS_ID]]
    source = pad_sequences(sources)  # (B, S)
    hyps = model.translate_batch(source, strategy, {})
    assert all(np.isfinite(h.score) and h.log_prob is None for (h,) in hyps)
    with pytest.raises(NonFiniteOutputError, match="token log-probabilities"):
        model.translate_batch(source, strategy, {}, with_log_prob=True)
    targets = pad_sequences([[BOS_ID, *h.tokens, EOS_ID] for (h,) in hyps])
    lengths = torch.tensor([len(h.tokens) + 2 for (h,) in hyps])
    with pytest.raises(NonFiniteOutputError, match="token log-probabilities"):
        model.score_batch(source, targets, lengths)
