"""Decoders against brute force: hand-written walks, exhaustive path / output enumeration."""

from __future__ import annotations

import pytest
import torch
from brute_dag import all_paths

from fadat.data.contract import PAD_ID
from fadat.decoding import (
    STRATEGIES,
    Hypothesis,
    decode,
    output_tokens,
    path_score,
    vertex_top1,
)

NEG_INF = float("-inf")


def random_graph(
    B: int, L: int, V: int, lengths: list[int] | None = None, seed: int = 0, sharp: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random DAG outputs in the decoders' contract (float64 so brute force compares exactly)."""
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(2, L + 1, (B,), generator=g).tolist()
    lens = torch.tensor(lengths, dtype=torch.int64)
    tlp = (torch.randn(B, L, V, generator=g, dtype=torch.float64) * sharp).log_softmax(-1)
    ln = torch.randn(B, L, L, generator=g, dtype=torch.float64) * sharp
    i = torch.arange(L)
    valid = (i[None, :, None] < i[None, None, :]) & (i[None, None, :] < lens[:, None, None])
    ln = ln.masked_fill(~valid, NEG_INF)
    has_row = valid.any(-1, keepdim=True)
    ln = torch.where(has_row, ln.log_softmax(-1), ln)
    return tlp, ln, lens


def chosen_output(path_tokens) -> list[int]:
    """Output of lookahead with n-gram bans: intermediate tokens without pads, repeats kept."""
    return [t for t in path_tokens[1:-1] if t != PAD_ID]


def check_hypothesis(
    h: Hypothesis, lp: torch.Tensor, ln: torch.Tensor, n: int, rule=output_tokens
) -> None:
    assert h.path[0] == 0 and h.path[-1] == n - 1
    assert all(a < b for a, b in zip(h.path, h.path[1:], strict=False))
    assert len(h.path_tokens) == len(h.path)
    assert h.tokens == rule(h.path_tokens)
    assert h.score == pytest.approx(path_score(lp, ln, h.path, h.path_tokens), abs=1e-9)


# ------------------------------------------------------------------------------------------------


def test_output_tokens_rules():
    a, b = 5, 6
    assert output_tokens([0, a, a, b, 2]) == [a, b]
    assert output_tokens([0, a, PAD_ID, a, 2]) == [a, a]
    assert output_tokens([0, PAD_ID, PAD_ID, 2]) == []
    assert output_tokens([0, 2]) == []
    assert output_tokens([a, a, 2]) == [a]  # the first token is the start vertex's: dropped
    assert output_tokens([0, 0, 3, 2]) == [0, 3]  # special ids inside are kept


def hand_walk(lp: torch.Tensor, ln: torch.Tensor, n: int, beta: float | None) -> list[int]:
    s = [max(row) for row in lp[:n].tolist()]
    path, i = [0], 0
    rows = ln[:n, :n].tolist()
    while i != n - 1:
        best, best_j = NEG_INF, None
        for j in range(i + 1, n):
            v = rows[i][j] + (0.0 if beta is None else beta * s[j])
            if v > best:
                best, best_j = v, j
        path.append(best_j)
        i = best_j
    return path


@pytest.mark.parametrize("beta", [None, 0.5, 1.0, 2.0])
def test_greedy_and_lookahead_match_hand_walk(beta):
    tlp, ln, lens = random_graph(12, 9, 6, seed=1)
    hyps = (
        decode(tlp, ln, lens, "greedy")
        if beta is None
        else decode(tlp, ln, lens, "lookahead", beta=beta)
    )
    for b, h in enumerate(hyps):
        n = int(lens[b])
        path = hand_walk(tlp[b], ln[b], n, beta)
        assert h.path == path
        assert h.path_tokens == [int(tlp[b, v].argmax()) for v in path]
        check_hypothesis(h, tlp[b], ln[b], n)


def exhaustive_viterbi(lp, ln, n, joint, beta, max_length, start_score=True):
    """Best path by enumeration. Joint: the reference's objective (s_0 + Σ_intermediate s_v +
    Σ links) / k^β, or without s_0 when ``start_score`` is False; plain: Σ links / k^β."""
    s = lp.max(-1).values
    best, best_path = NEG_INF, None
    for a in all_paths(n):
        k = len(a) - 2
        if k < 1 or (max_length is not None and k > max_length):
            continue
        v = sum(float(ln[a[t], a[t + 1]]) for t in range(len(a) - 1))
        if joint:
            v += sum(float(s[x]) for x in a[1:-1]) + (float(s[0]) if start_score else 0.0)
        v /= k**beta
        if v > best:
            best, best_path = v, list(a)
    return best_path if best_path is not None else [0, n - 1]


@pytest.mark.parametrize("strategy", ["viterbi", "joint-viterbi"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 1.7])
@pytest.mark.parametrize("max_length", [None, 2])
def test_viterbi_matches_exhaustive(strategy, beta, max_length):
    tlp, ln, lens = random_graph(10, 8, 5, seed=2)
    hyps = decode(tlp, ln, lens, strategy, length_penalty=beta, max_length=max_length)
    for b, h in enumerate(hyps):
        n = int(lens[b])
        expect = exhaustive_viterbi(tlp[b], ln[b], n, strategy == "joint-viterbi", beta, max_length)
        assert h.path == expect
        assert h.path_tokens == [int(tlp[b, v].argmax()) for v in h.path]
        check_hypothesis(h, tlp[b], ln[b], n)


def test_joint_viterbi_objective_includes_the_start_vertex_score():
    # The reference's example: vertex 0 uniform over V, vertices 1-3 sure of 3, 4, </s>.
    # k = 1 (0→1→3): (log(.45·.90) − log V) / 1 = −2.98; k = 2 (0→1→2→3):
    # (log(.45·.10·1) − log V) / 2 = −2.59, so [3, 4]; without s_0 it would be [3] (−0.90 > −1.55).
    V = 8
    E = torch.tensor(
        [[0, 0.45, 0.10, 0.45], [0, 0, 0.10, 0.90], [0, 0, 0, 1.0], [0, 0, 0, 0]],
        dtype=torch.float64,
    )
    ln = E.log()[None]  # (1, 4, 4), log 0 = −inf
    tlp = torch.full((1, 4, V), -1e9, dtype=torch.float64)
    tlp[0, 0] = -torch.log(torch.tensor(float(V), dtype=torch.float64))
    tlp[0, 1, 3] = tlp[0, 2, 4] = tlp[0, 3, 2] = 0.0
    h = decode(tlp, ln, torch.tensor([4]), "joint-viterbi")[0]
    assert h.path == [0, 1, 2, 3] and h.tokens == [3, 4]
    assert decode(tlp, ln, torch.tensor([4]), "viterbi")[0].tokens == [3]


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 2.5])
def test_joint_viterbi_equals_brute_force_of_the_reference_objective(beta):
    # Random graphs in float64, padded batches, some with a flat start vertex (s_0 very low):
    # the decoded path maximises (s_0 + Σ s_v + Σ links) / k^β over every path.
    differs = 0
    for seed in range(6):
        tlp, ln, lens = random_graph(12, 9, 6, seed=100 + seed, sharp=1.5)
        tlp[::2, 0] = (tlp[::2, 0] * 0.05).log_softmax(-1)  # near-uniform start vertices
        for max_length in (None, 3):
            hyps = decode(
                tlp, ln, lens, "joint-viterbi", length_penalty=beta, max_length=max_length
            )
            for b, h in enumerate(hyps):
                n = int(lens[b])
                expect = exhaustive_viterbi(tlp[b], ln[b], n, True, beta, max_length)
                assert h.path == expect
                check_hypothesis(h, tlp[b], ln[b], n)
                without = exhaustive_viterbi(tlp[b], ln[b], n, True, beta, max_length, False)
                differs += without != expect
    # s_0 moves the chosen length when β > 0 (so leaving it out would fail above)
    assert (differs > 0) == (beta > 0)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_vertex_graph(strategy):
    tlp, ln, lens = random_graph(3, 2, 4, lengths=[2, 2, 2], seed=3)
    for h in decode(tlp, ln, lens, strategy):
        assert h.path == [0, 1] and h.tokens == []


def test_two_vertex_graph_in_a_padded_batch():
    tlp, ln, lens = random_graph(3, 6, 4, lengths=[2, 6, 4], seed=3)
    for strategy in STRATEGIES:
        h = decode(tlp, ln, lens, strategy)[0]
        assert h.path == [0, 1] and h.tokens == []


BATCH_CASES = [
    ("greedy", {}),
    ("lookahead", {}),
    ("lookahead", {"no_consecutive_repeated_ngram": 2, "no_repeated_ngram": 2, "top_p": 0.95}),
    ("viterbi", {"length_penalty": 1.2}),
    ("joint-viterbi", {"max_length": 4}),
    ("beam", {"beam_size": 8, "max_beam_per_length": 3, "top_cand_n": 3, "top_p": 0.95}),
]


@pytest.mark.parametrize(("strategy", "options"), BATCH_CASES)
def test_batched_equals_one_at_a_time(strategy, options):
    tlp, ln, lens = random_graph(9, 11, 7, seed=4, lengths=[11, 2, 5, 9, 3, 11, 7, 4, 8])
    batched = decode(tlp, ln, lens, strategy, **options)
    for b, h in enumerate(batched):
        n = int(lens[b])
        single = decode(
            tlp[b : b + 1, :n], ln[b : b + 1, :n, :n], lens[b : b + 1], strategy, **options
        )
        assert (h.tokens, h.path, h.path_tokens) == (
            single[0].tokens,
            single[0].path,
            single[0].path_tokens,
        )
        assert h.score == pytest.approx(single[0].score, abs=1e-9)
        bans = strategy == "lookahead" and options
        check_hypothesis(h, tlp[b], ln[b], n, chosen_output if bans else output_tokens)


def test_float32_and_half_inputs():
    tlp, ln, lens = random_graph(4, 8, 5, seed=5)
    ref = decode(tlp, ln, lens, "joint-viterbi")
    got = decode(tlp.float(), ln.float(), lens, "joint-viterbi")
    assert [h.path for h in got] == [h.path for h in ref]
    half = decode(tlp.half(), ln.half(), lens, "lookahead")
    for b, h in enumerate(half):
        check_hypothesis(h, tlp[b].half().double(), ln[b].half().double(), int(lens[b]))


def test_vertex_top1():
    tlp, _, _ = random_graph(2, 4, 6, seed=6)
    s, tok = vertex_top1(tlp)
    assert torch.equal(tok, tlp.argmax(-1)) and torch.equal(s, tlp.max(-1).values)


def test_bad_inputs():
    tlp, ln, lens = random_graph(2, 5, 4, seed=7)
    with pytest.raises(ValueError, match="unknown decoding strategy"):
        decode(tlp, ln, lens, "nope")
    with pytest.raises(ValueError, match="unknown option"):
        decode(tlp, ln, lens, "greedy", beta=1.0)
    with pytest.raises(ValueError, match="links must be"):
        decode(tlp, ln[:, :4], lens, "greedy")
    with pytest.raises(ValueError, match="graph lengths"):
        decode(tlp, ln, torch.tensor([6, 2]), "greedy")
    with pytest.raises(ValueError, match="max_length"):
        decode(tlp, ln, lens, "viterbi", max_length=0)
    with pytest.raises(ValueError, match="top_p"):
        decode(tlp, ln, lens, "sample", top_p=0.0)


def test_candidate_tables_in_chunks_equal_one_chunk(monkeypatch):
    import fadat.decoding.sampling as sampling

    tlp, ln, lens = random_graph(7, 10, 6, seed=8)
    opts = {"no_consecutive_repeated_ngram": 2, "no_repeated_ngram": 2}
    whole = decode(tlp, ln, lens, "lookahead", **opts)
    sampled = decode(tlp, ln, lens, "sample", seed=3)
    monkeypatch.setattr(sampling, "_PAIR_CHUNK_ELEMENTS", 10 * 10 * 5 * 2)  # 2 sentences a chunk
    assert decode(tlp, ln, lens, "lookahead", **opts) == whole
    assert decode(tlp, ln, lens, "sample", seed=3) == sampled
