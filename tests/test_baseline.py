"""Tests of fadat.models.at: causal teacher forcing, cached incremental decoding against full
recomputation, beam search (beam 1 = greedy, exhaustive search on a tiny vocabulary), the model
directory round trip."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID
from fadat.errors import InputError
from fadat.models.at import ATHypothesis, ATModel
from fadat.models.config import make_config
from fadat.models.dat import DATModel
from fadat.models.directory import load_pretrained

V = 30


def tiny_at(seed: int = 0, **overrides) -> ATModel:
    torch.manual_seed(seed)
    # With the default N(0, 0.02) init a random model repeats one token and never stops; a wider
    # init gives varied outputs of varied length, so the tests cover </s> and reordering.
    config = make_config("tiny", V, model_type="at", init_std=0.3, **overrides)
    return ATModel(config).eval()


SOURCE = torch.tensor(
    [
        [5, 6, 7, 8, 9, EOS_ID],
        [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
        [12, 13, 14, EOS_ID, PAD_ID, PAD_ID],
    ]
)


@torch.no_grad()
def full_recompute_greedy(
    model: ATModel, source: torch.Tensor, limit: int
) -> tuple[list[int], float]:
    """Greedy decoding of one sentence by re-running the whole prefix each step (no cache)."""
    prefix = [BOS_ID]
    total = 0.0
    for step in range(limit):
        lp = model(source, torch.tensor([prefix]))[0, -1].clone()  # (V,)
        lp[PAD_ID] = lp[BOS_ID] = float("-inf")
        if step == limit - 1:
            keep = lp[EOS_ID].item()
            lp[:] = float("-inf")
            lp[EOS_ID] = keep
        token = int(lp.argmax())
        total += float(lp[token])
        if token == EOS_ID:
            return prefix[1:], total
        prefix.append(token)
    raise AssertionError("no </s>")


@torch.no_grad()
def sequence_log_prob(model: ATModel, source: torch.Tensor, tokens: list[int]) -> float:
    """Σ log p(y </s>) by one teacher-forced forward pass."""
    prev = torch.tensor([[BOS_ID, *tokens]])
    gold = torch.tensor([[*tokens, EOS_ID]])
    lp = model(source, prev)  # (1, T, V)
    return float(lp.gather(-1, gold[..., None]).sum())


def test_teacher_forcing_is_causal_and_padding_safe():
    model = tiny_at()
    prev = torch.tensor([[BOS_ID, 5, 6, 7], [BOS_ID, 8, PAD_ID, PAD_ID]])
    lp = model(SOURCE[:2], prev)
    assert lp.shape == (2, 4, V) and lp.dtype == torch.float32
    changed = prev.clone()
    changed[0, 3] = 20
    lp2 = model(SOURCE[:2], changed)
    torch.testing.assert_close(lp2[0, :3], lp[0, :3])  # the future does not leak
    assert not torch.allclose(lp2[0, 3], lp[0, 3])
    alone = model(SOURCE[1:2, :3], prev[1:2, :2])
    torch.testing.assert_close(alone[0], lp[1, :2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_cached_greedy_equals_full_recomputation(pre_norm):
    model = tiny_at(seed=3, pre_norm=pre_norm)
    hyps = model.greedy(SOURCE, max_len_a=1.0, max_len_b=4)
    lengths = []
    for row, hyp in enumerate(hyps):
        src = SOURCE[row : row + 1, : int(SOURCE[row].ne(PAD_ID).sum())]
        limit = int(1.0 * src.shape[1] + 4)
        tokens, total = full_recompute_greedy(model, src, limit)
        assert hyp.tokens == tokens
        assert hyp.log_prob == pytest.approx(total, abs=1e-4)
        assert hyp.log_prob == pytest.approx(sequence_log_prob(model, src, tokens), abs=1e-4)
        assert hyp.score == pytest.approx(hyp.log_prob / (len(tokens) + 1))
        lengths.append(len(tokens))
    assert max(lengths) > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy(seed):
    model = tiny_at(seed=seed)
    greedy = model.greedy(SOURCE, max_len_a=1.0, max_len_b=3)
    beam = model.beam_search(SOURCE, beam_size=1, max_len_a=1.0, max_len_b=3)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b.tokens
        assert g.log_prob == pytest.approx(b.log_prob, abs=1e-5)


def test_beam_search_scores_and_beats_greedy():
    model = tiny_at(seed=5)
    greedy = model.greedy(SOURCE, max_len_b=4, length_penalty=1.0)
    beam = model.beam_search(SOURCE, beam_size=5, length_penalty=1.0, max_len_b=4)
    for row, (g, b) in enumerate(zip(greedy, beam, strict=True)):
        assert isinstance(b, ATHypothesis)
        src = SOURCE[row : row + 1, : int(SOURCE[row].ne(PAD_ID).sum())]
        # the cached beam's scores agree with a full teacher-forced recomputation
        assert b.log_prob == pytest.approx(sequence_log_prob(model, src, b.tokens), abs=1e-4)
        assert b.score == pytest.approx(b.log_prob / (len(b.tokens) + 1))
        assert b.score >= g.score - 1e-6 or b.tokens == g.tokens
        assert EOS_ID not in b.tokens and BOS_ID not in b.tokens and PAD_ID not in b.tokens


# seeds where the exact optimum differs from the greedy output
@pytest.mark.parametrize("seed", [0, 3, 9, 11])
def test_wide_beam_finds_the_exhaustive_optimum_on_a_small_vocabulary(seed):
    """With beam ≥ the number of possible outputs, beam search is exact: compare with brute force
    over every output of length ≤ 2 (limit 3 tokens incl. </s>) on a 6-token vocabulary."""
    torch.manual_seed(seed)
    model = ATModel(make_config("tiny", 6, model_type="at", init_std=0.3)).eval()
    src = torch.tensor([[4, 5, EOS_ID]])
    alpha = 0.7
    best = None
    for n in range(3):
        for body in itertools.product([3, 4, 5], repeat=n):
            lp = sequence_log_prob(model, src, list(body))
            score = lp / (n + 1) ** alpha
            if best is None or score > best[0]:
                best = (score, list(body))
    # 1 + 3 + 9 = 13 possible outputs: a beam of 13 keeps every prefix and finishes every one
    hyp = model.beam_search(src, beam_size=13, length_penalty=alpha, max_len_a=0.0, max_len_b=3)[0]
    assert hyp.tokens == best[1]
    assert hyp.score == pytest.approx(best[0], abs=1e-4)
    greedy = model.greedy(src, max_len_a=0.0, max_len_b=3, length_penalty=alpha)[0]
    assert greedy.tokens != hyp.tokens and greedy.score < hyp.score


def test_length_limit_forces_eos():
    model = tiny_at(seed=1)
    for hyp in model.greedy(SOURCE, max_len_a=0.0, max_len_b=2):
        assert len(hyp.tokens) <= 1
    for hyp in model.beam_search(SOURCE, beam_size=3, max_len_a=0.0, max_len_b=1):
        assert hyp.tokens == []
    with pytest.raises(ValueError):
        model.beam_search(SOURCE, beam_size=0)


def test_at_save_load_round_trip(tmp_path):
    model = tiny_at(seed=2)
    model.save_pretrained(tmp_path / "at", extra={"data": {"licence": "CC0", "attribution": "x"}})
    meta = json.loads((tmp_path / "at" / "config.json").read_text())
    assert meta["model_type"] == "at" and meta["config"]["model_type"] == "at"
    loaded = load_pretrained(tmp_path / "at")
    assert isinstance(loaded, ATModel)
    assert loaded.output_weight is loaded.encoder.embed_tokens.weight
    assert loaded.metadata["data"]["licence"] == "CC0"
    prev = torch.tensor([[BOS_ID, 5, 6]] * 3)
    assert torch.equal(model(SOURCE, prev), loaded(SOURCE, prev))
    assert [h.tokens for h in model.beam_search(SOURCE, 3)] == [
        h.tokens for h in loaded.beam_search(SOURCE, 3)
    ]
    with pytest.raises(InputError, match="expected 'dat'"):
        DATModel.from_pretrained(tmp_path / "at")
    with pytest.raises(InputError, match="model_type 'at'"):
        ATModel(make_config("tiny", V))
