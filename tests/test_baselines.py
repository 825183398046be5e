"""The NAT baselines (vanilla NAT, GLAT, CTC): CTC alignment and likelihood against brute force,
and each tiny model learning a copy task."""

from __future__ import annotations

import itertools

import pytest
import torch

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID, make_batch
from fadat.models.config import make_config
from fadat.models.ctc import CTCModel, best_alignment, collapse
from fadat.models.nat import NATModel
from fadat.models.transformer import copy_positions, decoder_input
from fadat.objectives import OBJECTIVES, ObjectiveConfig

NEG_INF = float("-inf")


def ctc_collapse(seq, blank):
    """CTC's many-to-one map, written independently: merge repeats, then drop blanks."""
    out, prev = [], None
    for c in seq:
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def brute_force_ctc(lp, y, blank):
    """(best alignment score, log-sum over alignments) of ``y`` by enumerating every sequence."""
    L, C = lp.shape
    best, total = NEG_INF, NEG_INF
    for seq in itertools.product(range(C), repeat=L):
        if ctc_collapse(seq, blank) == y:
            s = sum(float(lp[t, c]) for t, c in enumerate(seq))
            best = max(best, s)
            total = float(torch.logaddexp(torch.tensor(total), torch.tensor(s)))
    return best, total


def test_best_alignment_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    C, blank = 4, 3
    B, Lmax, Umax = 24, 6, 3
    lens = torch.randint(1, Lmax + 1, (B,), generator=g)
    ulens = torch.randint(0, Umax + 1, (B,), generator=g)
    targets = torch.randint(0, 3, (B, Umax), generator=g)
    lp = torch.randn(B, Lmax, C, generator=g, dtype=torch.float64).log_softmax(-1)
    path, score = best_alignment(lp, targets, lens, ulens, blank)
    feasible = 0
    for b in range(B):
        n, y = int(lens[b]), targets[b, : int(ulens[b])].tolist()
        best, _ = brute_force_ctc(lp[b, :n], y, blank)
        assert float(score[b]) == pytest.approx(best, abs=1e-9) or best == float(score[b])
        assert (path[b, n:] == -1).all()
        if best == NEG_INF:
            assert (path[b] == -1).all()
            continue
        feasible += 1
        # the positions' labels form an alignment of y whose score is the best
        labels = path[b, :n].tolist()
        assert [i for k, i in enumerate(labels) if i >= 0 and (k == 0 or labels[k - 1] != i)] == (
            list(range(len(y)))
        )
        seq = [y[i] if i >= 0 else blank for i in labels]
        assert sum(float(lp[b, t, c]) for t, c in enumerate(seq)) == pytest.approx(best, abs=1e-9)
    assert 0 < feasible < B  # both kinds of sentences were tested


def test_collapse_and_inputs():
    assert collapse([5, 5, 9, 5, PAD_ID, 5, 9], blank=9) == [5, 5, 5]
    unks = decoder_input(torch.tensor([3, 1]), ends=False)
    assert unks.tolist() == [[UNK_ID] * 3, [UNK_ID, PAD_ID, PAD_ID]]
    assert decoder_input(torch.tensor([4, 2])).tolist() == [
        [BOS_ID, UNK_ID, UNK_ID, EOS_ID],
        [BOS_ID, EOS_ID, PAD_ID, PAD_ID],
    ]
    # 3 source positions over 5 decoder positions: 0, 0.5, 1, 1.5, 2 rounded half to even
    assert copy_positions(torch.tensor([3]), torch.tensor([5]), 6).tolist() == [[0, 0, 1, 2, 2, 2]]


def tiny_config(model_type: str, vocab: int = 16, **overrides):
    sizes = {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "attention_heads": 2}
    sizes.update({"ffn_dim": 64, "dropout": 0.0, "max_target_positions": 64})
    sizes.update(overrides)
    return make_config("tiny", vocab, model_type=model_type, **sizes)


def test_ctc_score_batch_equals_brute_force_over_alignments():
    torch.manual_seed(0)
    model = CTCModel(tiny_config("ctc", vocab=5, upsample_ratio=1.5)).eval()
    # sources x </s> of 2 and 4 tokens: 3 and 6 positions; targets <s> y </s>
    batch = make_batch(
        [[4, EOS_ID], [4, 4, 3, EOS_ID]], [[0, 4, EOS_ID], [0, 4, 4, EOS_ID]], [0, 1]
    )
    with torch.no_grad():
        scores = model.score_batch(batch.source, batch.target, batch.target_lengths)
        lengths = model.graph_lengths(batch.source_lengths, decoding=True)
        lp = model(batch.source, lengths).double()
    for b, y in enumerate([[4], [4, 4]]):
        _, total = brute_force_ctc(lp[b, : int(lengths[b])], y, model.blank)
        assert scores.log_probs[b] == pytest.approx(total, abs=1e-4)
        assert scores.tokens[b] == len(y) and scores.problems[b] is None


def test_nat_score_batch_is_length_plus_position_terms():
    torch.manual_seed(0)
    model = NATModel(tiny_config("nat")).eval()
    batch = make_batch([[5, 6, EOS_ID]], [[BOS_ID, 7, 8, 9, EOS_ID]], [0])
    with torch.no_grad():
        got = model.score_batch(batch.source, batch.target, batch.target_lengths).log_probs[0]
        lp = model(batch.source, batch.target_lengths)[0]  # (T, V)
        length = model.length_logprobs(model.encode(batch.source))[0, 5]
    expect = float(length) + sum(float(lp[t, y]) for t, y in enumerate(batch.target[0].tolist()))
    assert got == pytest.approx(expect, abs=1e-5)


def copy_data(n: int, seed: int, vocab: int = 16):
    """Random sentences of 3-6 tokens from ids 4..vocab-1; the target is the source."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        k = int(torch.randint(3, 7, (1,), generator=g))
        y = torch.randint(4, vocab, (k,), generator=g).tolist()
        pairs.append((y + [EOS_ID], [BOS_ID, *y, EOS_ID]))
    return pairs


def train_copy(model, objective: str, updates: int, glancing_ratio: float = 0.0):
    data = copy_data(2000, seed=1)
    torch.manual_seed(2)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for u in range(updates):
        chunk = [data[(u * 32 + i) % len(data)] for i in range(32)]
        batch = make_batch([s for s, _ in chunk], [t for _, t in chunk], range(32))
        settings = ObjectiveConfig(name=objective, glancing_ratio=glancing_ratio)
        out = OBJECTIVES[objective].step(model, batch, settings)
        opt.zero_grad()
        (out.loss_sum / out.count).backward()
        opt.step()
    model.eval()
    test = copy_data(200, seed=99)
    batch = make_batch([s for s, _ in test], [t for _, t in test], range(200))
    with torch.no_grad():
        hyps = model.translate_batch(batch.source, "argmax", {})
    exact = sum(h[0][0] == t[1:-1] for h, (_, t) in zip(hyps, test, strict=True))
    return exact / len(test)


@pytest.fixture
def one_thread():
    # tiny matrices: thread hand-offs would cost more than the work (and the machine is shared)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("objective", "make", "ratio", "updates"),
    [
        ("nat", lambda: NATModel(tiny_config("nat")), 0.0, 800),
        ("glat", lambda: NATModel(tiny_config("nat")), 0.5, 800),
        ("ctc", lambda: CTCModel(tiny_config("ctc", upsample_ratio=2.0)), 0.0, 300),
        ("ctc", lambda: CTCModel(tiny_config("ctc", upsample_ratio=2.0)), 0.5, 300),
    ],
)
def test_tiny_model_learns_to_copy(one_thread, objective, make, ratio, updates):
    # updates of 32 random 3-6-token sentences; 200 held-out sentences must be copied exactly
    # (the predicted length included). NAT and GLAT need more updates: their length predictor
    # learns |x| from mean-pooled states.
    torch.manual_seed(0)
    accuracy = train_copy(make(), objective, updates, ratio)
    assert accuracy >= 0.95, f"{objective} (glancing {ratio}): {accuracy:.2f} exact copies"


def test_repetition_rate_counts_words_equal_to_their_predecessor(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "repetition_rate.py"
    spec = importlib.util.spec_from_file_location("repetition_rate", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from fadat.evaluation.scoring import repetition_counts

    assert repetition_counts(["y y el el el", "de", "", "a b a"]) == (3, 9)
    hyps = tmp_path / "h.txt"
    hyps.write_text("el el perro.\nsi, si\n", encoding="utf-8")
    assert module.main(["--lang", "es", str(hyps)]) == 0
    # sacremoses splits "perro." and "si," : el el perro . / si , si -> 1 repeat in 7 words
    assert capsys.readouterr().out.split("\t")[1:] == ["14.29 %", "1 / 7\n"]
    assert module.main(["--lang", "es", str(tmp_path / "missing.txt")]) == 2
