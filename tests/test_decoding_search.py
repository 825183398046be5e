"""Beam search, sampling and n-gram bans against exhaustive enumeration and crafted graphs."""

from __future__ import annotations

import inspect
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from brute_dag import all_paths
from test_decoding import check_hypothesis, chosen_output, random_graph

from fadat.data.contract import PAD_ID
from fadat.decoding import BANNED_WEIGHT, beam_search, decode
from fadat.decoding.beam import _beam_one_reference

NEG_INF = float("-inf")


def logaddexp(a: float, b: float) -> float:
    return float(np.logaddexp(a, b))


def reference_output(z) -> tuple[int, ...]:
    """The output of intermediate tokens z, written independently of the library: keep a token
    if it differs from the previous vertex's token and is not <pad>."""
    return tuple(t for k, t in enumerate(z) if (k == 0 or t != z[k - 1]) and t != PAD_ID)


def output_marginals(lp, ln, n, allowed=None):
    """``log P(y|x)`` of every output y by enumerating every path and every token choice."""
    lp, ln = lp.tolist(), ln.tolist()
    V = len(lp[0])
    out: dict[tuple[int, ...], float] = {}
    for a in all_paths(n):
        base = sum(ln[a[k]][a[k + 1]] for k in range(len(a) - 1))
        if base == NEG_INF:
            continue
        inner = a[1:-1]
        choices = [allowed[v] if allowed is not None else range(V) for v in inner]
        for z in itertools.product(*choices):
            y = reference_output(z)
            s = base + sum(lp[v][t] for v, t in zip(inner, z, strict=True))
            out[y] = logaddexp(out.get(y, NEG_INF), s)
    return out


def objective(marg, alpha, lm=None, gamma=0.0):
    return {
        y: (s + (gamma * lm(y) if lm else 0.0)) / max(1, len(y)) ** alpha for y, s in marg.items()
    }


# No pruning: beams larger than the number of states, every candidate pair kept.
EXACT = {"beam_size": 10**6, "max_beam_per_length": 10**6, "top_p": 1.0, "max_successors": None}


@pytest.mark.parametrize("alpha", [0.0, 1.1, 2.0])
@pytest.mark.parametrize("seed", [10, 11, 12])
def test_beam_without_pruning_is_exhaustive_search(alpha, seed):
    V = 4  # includes <pad> = 1: pads vanish from outputs and break duplicate runs
    tlp, ln, lens = random_graph(6, 7, V, seed=seed, sharp=1.0)
    hyps = decode(tlp, ln, lens, "beam", top_cand_n=V, alpha=alpha, **EXACT)
    for b, h in enumerate(hyps):
        n = int(lens[b])
        J = objective(output_marginals(tlp[b], ln[b], n), alpha)
        best = max(J, key=J.get)
        assert tuple(h.tokens) == best
        assert J[tuple(h.tokens)] == pytest.approx(J[best], abs=1e-9)
        check_hypothesis(h, tlp[b], ln[b], n)


def test_beam_marginal_sums_to_one():
    # The enumeration of the objective itself: Σ_y P(y|x) = 1 over all outputs.
    tlp, ln, _ = random_graph(1, 6, 3, lengths=[6], seed=13)
    marg = output_marginals(tlp[0], ln[0], 6)
    assert sum(math.exp(v) for v in marg.values()) == pytest.approx(1.0, abs=1e-9)


def test_beam_top_cand_n_restricts_tokens_exactly():
    V, m = 5, 2
    tlp, ln, lens = random_graph(5, 7, V, seed=14, sharp=1.0)
    hyps = decode(tlp, ln, lens, "beam", top_cand_n=m, alpha=1.0, **EXACT)
    for b, h in enumerate(hyps):
        n = int(lens[b])
        allowed = {v: tlp[b, v].topk(m).indices.tolist() for v in range(n)}
        J = objective(output_marginals(tlp[b], ln[b], n, allowed), 1.0)
        assert J[tuple(h.tokens)] == pytest.approx(max(J.values()), abs=1e-9)


def test_beam_small_beam_is_valid_and_no_better_than_exhaustive():
    V = 4
    tlp, ln, lens = random_graph(6, 8, V, seed=15, sharp=1.0)
    hyps = decode(
        tlp,
        ln,
        lens,
        "beam",
        beam_size=2,
        max_beam_per_length=1,
        top_cand_n=2,
        top_p=0.8,
        alpha=1.1,
    )
    for b, h in enumerate(hyps):
        n = int(lens[b])
        check_hypothesis(h, tlp[b], ln[b], n)
        J = objective(output_marginals(tlp[b], ln[b], n), 1.1)
        assert J[tuple(h.tokens)] <= max(J.values()) + 1e-12


ARPA = """\\data\\
ngram 1=6
ngram 2=5

\\1-grams:
-1.0\t<unk>\t0
0\t<s>\t-0.30
-0.40\t</s>\t0
-0.50\tw0\t-0.20
-0.70\tw2\t-0.10
-0.60\tw3\t-0.25

\\2-grams:
-0.10\t<s> w3
-0.20\tw3 w0
-0.15\tw0 </s>
-0.30\tw2 w2
-0.25\tw0 w3

\\end\\
"""


@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_beam_with_kenlm_is_exhaustive_search(tmp_path, gamma):
    kenlm = pytest.importorskip("kenlm")
    path = tmp_path / "tiny.arpa"
    path.write_text(ARPA)
    model = kenlm.Model(str(path))
    words = ["w0", "w1", "w2", "w3"]  # w1 is out of the LM's vocabulary: scored as <unk>

    def lm(y):
        return model.score(" ".join(words[t] for t in y), bos=True, eos=True)

    tlp, ln, lens = random_graph(5, 6, 4, seed=16, sharp=1.0)
    hyps = decode(
        tlp,
        ln,
        lens,
        "beam",
        top_cand_n=4,
        alpha=1.1,
        lm=str(path),
        lm_words=words,
        gamma=gamma,
        **EXACT,
    )
    for b, h in enumerate(hyps):
        n = int(lens[b])
        J = objective(output_marginals(tlp[b], ln[b], n), 1.1, lm, gamma)
        assert J[tuple(h.tokens)] == pytest.approx(max(J.values()), abs=1e-9)
        check_hypothesis(h, tlp[b], ln[b], n)


def test_beam_lm_requires_words():
    tlp, ln, lens = random_graph(1, 4, 4, seed=17)
    with pytest.raises(ValueError, match="lm_words"):
        decode(tlp, ln, lens, "beam", lm="x.arpa")


# ------------------------------------------------------------------------------------------------
# Sampling


# χ² critical values at significance 0.001 (upper tail), from standard tables: df -> value.
# (scipy is not in the environment.) Above df = 15 the Wilson-Hilferty approximation is used.
CHI2_CRIT_001 = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
    12: 32.91,
    13: 34.53,
    14: 36.12,
    15: 37.70,
}


def chi2_critical(df: int) -> float:
    if df in CHI2_CRIT_001:
        return CHI2_CRIT_001[df]
    z = 3.090  # upper 0.001 quantile of N(0, 1)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(observed: Counter, expected: dict, draws: int) -> tuple[float, int]:
    """Pearson χ² over categories with expected count ≥ 5; rarer categories are pooled."""
    stat, df, pooled_o, pooled_e = 0.0, -1, 0, 0.0
    for cat, p in expected.items():
        e = p * draws
        if e >= 5:
            stat += (observed.get(cat, 0) - e) ** 2 / e
            df += 1
        else:
            pooled_o += observed.get(cat, 0)
            pooled_e += e
    if pooled_e >= 5:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        df += 1
    assert set(observed) <= set(expected), "a draw the sampler can never make"
    return stat, df


DRAWS = 20_000


def test_sample_path_frequencies_match_path_probabilities():
    # τ = 1, no truncation, no bans: a path is drawn with probability P(a|x) = Π E.
    L, V = 5, 3
    tlp, ln, lens = random_graph(1, L, V, lengths=[L], seed=20, sharp=1.0)
    expected = {
        a: math.exp(sum(float(ln[0, a[k], a[k + 1]]) for k in range(len(a) - 1)))
        for a in all_paths(L)
    }
    assert sum(expected.values()) == pytest.approx(1.0)
    B = DRAWS
    hyps = decode(
        tlp.expand(B, -1, -1),
        ln.expand(B, -1, -1),
        lens.expand(B),
        "sample",
        top_cand_n=L * V,
        top_p=1.0,
        seed=1234,
        no_consecutive_repeated_ngram=0,
    )
    observed = Counter(tuple(h.path) for h in hyps)
    stat, df = chi2_statistic(observed, expected, DRAWS)
    assert df == len(expected) - 1
    assert stat < chi2_critical(df)
    for h in hyps[:200]:
        check_hypothesis(h, tlp[0], ln[0], L)


def reference_sampler_distribution(lp, ln, n, tau, beta, top_cand_n, top_p, ban_previous):
    """Exact distribution of (path, tokens) under the documented sampling rule, by recursion."""
    lp, ln = np.asarray(lp), np.asarray(ln)
    V = lp.shape[1]
    k_tok = min(top_cand_n, V)
    top = {j: list(np.argsort(-lp[j], kind="stable")[:k_tok]) for j in range(n)}
    dist: dict[tuple, float] = {}

    def candidates(i):
        row = ln[i, :n] / tau
        valid = np.arange(n) > i
        trans = row - np.logaddexp.reduce(row[valid])
        cands = []
        for j in range(i + 1, n):
            if j == n - 1:
                cands.append((trans[j], j, None))
            else:
                for y in top[j]:
                    cands.append((trans[j] + beta * lp[j, y], j, int(y)))
        cands.sort(key=lambda c: -c[0])
        cands = cands[:top_cand_n]
        kept, mass = [], 0.0
        for c in cands:
            if mass >= top_p:
                break
            kept.append(c)
            mass += math.exp(c[0])
        return kept

    def walk(i, path, toks, out, prob):
        # out: the output so far (reference_output of the drawn intermediate tokens toks)
        if i == n - 1:
            key = (tuple(path), tuple(toks))
            dist[key] = dist.get(key, 0.0) + prob
            return
        kept = candidates(i)
        weights = []
        for s, _j, y in kept:
            banned = ban_previous and y is not None and out and out[-1] == y
            weights.append(BANNED_WEIGHT if banned else math.exp(s))
        total = sum(weights)
        for (_, j, y), w in zip(kept, weights, strict=True):
            new_toks = toks + ([y] if y is not None else [])
            walk(j, path + [j], new_toks, list(reference_output(new_toks)), prob * w / total)

    walk(0, [0], [], [], 1.0)
    return dist


def test_sample_with_temperature_truncation_and_ban_matches_exact_distribution():
    L, V = 6, 3
    tlp, ln, lens = random_graph(1, L, V, lengths=[L], seed=23, sharp=1.0)
    opts = {"temperature": 1.5, "beta": 0.8, "top_cand_n": 6, "top_p": 0.9}
    joint = reference_sampler_distribution(tlp[0], ln[0], L, 1.5, 0.8, 6, 0.9, ban_previous=True)
    assert sum(joint.values()) == pytest.approx(1.0)
    expected: dict[tuple, float] = {}
    for (path, _), p in joint.items():
        expected[path] = expected.get(path, 0.0) + p
    B = DRAWS
    hyps = decode(
        tlp.expand(B, -1, -1), ln.expand(B, -1, -1), lens.expand(B), "sample", seed=99, **opts
    )
    observed = Counter(tuple(h.path) for h in hyps)
    stat, df = chi2_statistic(observed, expected, DRAWS)
    assert df >= 3
    assert stat < chi2_critical(df)
    # The drawn intermediate tokens follow the same law: test the joint (path, tokens) too.
    observed_joint = Counter((tuple(h.path), tuple(h.path_tokens[1:-1])) for h in hyps)
    stat, df = chi2_statistic(observed_joint, joint, DRAWS)
    assert df >= 3
    assert stat < chi2_critical(df)


def test_sample_is_reproducible_with_a_seed():
    tlp, ln, lens = random_graph(8, 9, 5, seed=22)
    a = decode(tlp, ln, lens, "sample", seed=7)
    b = decode(tlp, ln, lens, "sample", seed=7)
    assert a == b


# ------------------------------------------------------------------------------------------------
# n-gram bans on crafted graphs


def chain_graph(token_probs: list[dict[int, float]], skip: float = 0.0, V: int = 10):
    """A graph whose vertex i links to i+1 (prob 1 − skip) and i+2 (prob skip); vertex v's token
    distribution is ``token_probs[v]`` (rest of the mass spread over unlisted tokens)."""
    L = len(token_probs)
    ln = torch.full((1, L, L), NEG_INF, dtype=torch.float64)
    for i in range(L - 1):
        if skip > 0 and i + 2 < L:
            ln[0, i, i + 1] = math.log(1 - skip)
            ln[0, i, i + 2] = math.log(skip)
        else:
            ln[0, i, i + 1] = 0.0
    tlp = torch.empty(1, L, V, dtype=torch.float64)
    for v, probs in enumerate(token_probs):
        rest = [t for t in range(V) if t not in probs]
        left = 1.0 - sum(probs.values())
        row = [probs.get(t, left / len(rest)) for t in range(V)]
        tlp[0, v] = torch.tensor(row, dtype=torch.float64).log()
    return tlp, ln, torch.tensor([L])


A, B_, C, D = 4, 5, 6, 7


def test_lookahead_no_consecutive_repeated_ngram():
    # Vertices 1..5 read a b a b c; vertex 4's runner-up is d.
    tlp, ln, lens = chain_graph(
        [{0: 0.9}, {A: 0.9}, {B_: 0.9}, {A: 0.9}, {B_: 0.7, D: 0.25}, {C: 0.9}, {2: 0.9}], skip=0.1
    )
    plain = decode(tlp, ln, lens, "lookahead")[0]
    assert plain.tokens == [A, B_, A, B_, C]
    banned = decode(tlp, ln, lens, "lookahead", no_consecutive_repeated_ngram=2)[0]
    # (4, b) would repeat "a b"; skipped mass 0.9·0.7 = 0.63 ≤ top_p; next is (4, d).
    assert banned.tokens == [A, B_, A, D, C]
    assert banned.path == [0, 1, 2, 3, 4, 5, 6] and banned.path_tokens[4] == D
    # With top_p = 0.5 the skipped mass 0.63 is too large: fall back to the top candidate.
    fallback = decode(tlp, ln, lens, "lookahead", no_consecutive_repeated_ngram=2, top_p=0.5)[0]
    assert fallback.tokens == [A, B_, A, B_, C]


def test_lookahead_no_repeated_ngram():
    # a b c a b: the bigram "a b" repeats at vertex 5; its runner-up is d.
    tlp, ln, lens = chain_graph(
        [{0: 0.9}, {A: 0.9}, {B_: 0.9}, {C: 0.9}, {A: 0.9}, {B_: 0.6, D: 0.35}, {2: 0.9}]
    )
    assert decode(tlp, ln, lens, "lookahead")[0].tokens == [A, B_, C, A, B_]
    got = decode(tlp, ln, lens, "lookahead", no_repeated_ngram=2)[0]
    assert got.tokens == [A, B_, C, A, D]
    # order 3: "c a b" is new, so nothing is banned (the previous-token ban does not apply)
    assert decode(tlp, ln, lens, "lookahead", no_repeated_ngram=3)[0].tokens == [A, B_, C, A, B_]


def test_lookahead_ban_on_bans_the_previous_token():
    # a a c: with any ban on, the second a is banned (runner-up d), as in the reference.
    tlp, ln, lens = chain_graph([{0: 0.9}, {A: 0.9}, {A: 0.6, D: 0.3}, {C: 0.9}, {2: 0.9}])
    assert decode(tlp, ln, lens, "lookahead")[0].tokens == [A, C]
    got = decode(tlp, ln, lens, "lookahead", no_repeated_ngram=4)[0]
    assert got.tokens == [A, D, C]


def test_lookahead_ban_after_a_pad_bans_the_pad_not_the_token_before_it():
    # Chosen a, <pad>: the previous chosen token is <pad>, so at vertex 3 the pad is banned
    # (runner-up a) and a is free again, as in the reference: output a a c.
    tlp, ln, lens = chain_graph(
        [{0: 0.9}, {A: 0.9}, {PAD_ID: 0.9}, {PAD_ID: 0.6, A: 0.3}, {C: 0.9}, {2: 0.9}]
    )
    assert decode(tlp, ln, lens, "lookahead")[0].tokens == [A, C]
    got = decode(tlp, ln, lens, "lookahead", no_repeated_ngram=4)[0]
    assert got.path_tokens == [0, A, PAD_ID, A, C, 2]
    assert got.tokens == [A, A, C]
    # a <pad> then {a 0.6, d 0.3}: a is not banned after the pad (the output's last token is a)
    tlp, ln, lens = chain_graph([{0: 0.9}, {A: 0.9}, {PAD_ID: 0.9}, {A: 0.6, D: 0.3}, {2: 0.9}])
    got = decode(tlp, ln, lens, "lookahead", no_consecutive_repeated_ngram=1)[0]
    assert got.path_tokens == [0, A, PAD_ID, A, 2] and got.tokens == [A, A]


def test_lookahead_fallback_to_a_banned_token_keeps_the_repeat():
    # a then {a 0.6, d 0.3}: a is banned, but its skipped mass 0.6 exceeds top_p = 0.5, so the
    # walk falls back to a; the reference outputs the repeat (no de-duplication): a a c.
    tlp, ln, lens = chain_graph([{0: 0.9}, {A: 0.9}, {A: 0.6, D: 0.3}, {C: 0.9}, {2: 0.9}])
    got = decode(tlp, ln, lens, "lookahead", no_repeated_ngram=4, top_p=0.5)[0]
    assert got.path_tokens == [0, A, A, C, 2]
    assert got.tokens == [A, A, C]
    # and the repeat is history: a third a would repeat the previous chosen token and the bigram
    tlp, ln, lens = chain_graph([{0: 0.9}, {A: 0.9}, {A: 0.6, D: 0.3}, {A: 0.5, C: 0.4}, {2: 0.9}])
    got = decode(tlp, ln, lens, "lookahead", no_repeated_ngram=2, top_p=0.55)[0]
    assert got.path_tokens == [0, A, A, C, 2] and got.tokens == [A, A, C]


def reference_ban_walk(lp, ln, n, beta, top_cand_n, top_p, consecutive, repeated):
    """The reference's lookahead with n-gram bans, restated plainly for one sentence.

    Candidates of vertex i: every (j, y) with j > i and y among j's top ``top_cand_n`` tokens,
    scored ln[i, j] + β·lp[j, y], best ``top_cand_n`` kept. History = the start vertex's token,
    then every chosen token. Returns (path, path tokens, output, fallbacks taken).
    """
    lp, ln = np.asarray(lp)[:n], np.asarray(ln)[:n, :n]
    k_tok = min(top_cand_n, lp.shape[1])
    top = np.argsort(-lp, axis=1, kind="stable")[:, :k_tok]
    start = int(lp[0].argmax())
    hist, chosen, seen, path, fallbacks = [start], [], set(), [0], 0
    i = 0
    while i != n - 1:
        cands = sorted(
            ((ln[i, j] + beta * lp[j, y], j, int(y)) for j in range(i + 1, n) for y in top[j]),
            reverse=True,
        )[:top_cand_n]
        banned = {hist[-1]} if chosen else set()  # the start token is never banned
        for m in range(2, min(consecutive, (len(hist) + 1) // 2) + 1):
            if all(hist[-q] == hist[-m - q] for q in range(1, m)):
                banned.add(hist[-m])

        def free(y, banned=banned):
            if y in banned:
                return False
            if repeated == 0 or len(chosen) < repeated - 1:
                return True
            return (*chosen[len(chosen) - repeated + 1 :], y) not in seen

        pick, skipped = None, 0.0
        for c in cands:
            if free(c[2]):
                pick = c
                break
            skipped += math.exp(c[0])
            if skipped > top_p:
                break
        if pick is None:
            pick, fallbacks = cands[0], fallbacks + 1
        _, i, y = pick
        path.append(i)
        hist.append(y)
        chosen.append(y)
        if repeated and len(chosen) >= repeated:
            seen.add(tuple(chosen[-repeated:]))
    output = [y for y in chosen[:-1] if y != PAD_ID]
    return path, [start, *chosen], output, fallbacks


@pytest.mark.parametrize(
    ("beta", "top_cand_n", "top_p", "consecutive", "repeated"),
    [
        (1.0, 5, 0.9, 1, 0),
        (1.0, 5, 0.9, 3, 2),
        (0.5, 4, 0.4, 2, 3),
        (2.0, 8, 0.95, 0, 2),
        (1.0, 3, 0.2, 4, 0),
    ],
)
def test_lookahead_with_bans_equals_the_reference_walk(
    beta, top_cand_n, top_p, consecutive, repeated
):
    # Random float64 graphs over 4 tokens (pads, repeats and fallbacks are frequent).
    tlp, ln, lens = random_graph(40, 14, 4, seed=40, sharp=1.0)
    hyps = decode(
        tlp,
        ln,
        lens,
        "lookahead",
        beta=beta,
        top_cand_n=top_cand_n,
        top_p=top_p,
        no_consecutive_repeated_ngram=consecutive,
        no_repeated_ngram=repeated,
    )
    fallbacks = pads = repeats = 0
    for b, h in enumerate(hyps):
        n = int(lens[b])
        path, toks, output, fell = reference_ban_walk(
            tlp[b], ln[b], n, beta, top_cand_n, top_p, max(1, consecutive), repeated
        )
        assert (h.path, h.path_tokens, h.tokens) == (path, toks, output)
        check_hypothesis(h, tlp[b], ln[b], n, chosen_output)
        fallbacks += fell
        pads += PAD_ID in toks[1:-1]
        repeats += any(x == y for x, y in zip(output, output[1:], strict=False))
    # the reference's behaviours are exercised: chosen pads, repeats in the output, and (with a
    # small top_p) fallbacks to a banned top candidate
    assert pads > 0 and repeats > 0
    assert (fallbacks > 0) == (top_p < 0.5)


def test_sample_bans_previous_token_by_default():
    # Two vertices both read a (0.6) or b (0.4). Banning the previous token: P(a a) ≈ 0.
    tlp, ln, lens = chain_graph([{0: 1.0}, {A: 0.6, B_: 0.4}, {A: 0.6, B_: 0.4}, {2: 1.0}], V=6)
    n = 4000
    batch = (tlp.expand(n, -1, -1), ln.expand(n, -1, -1), lens.expand(n))
    common = {"top_cand_n": 2, "top_p": 1.0, "seed": 5}
    counts = Counter(tuple(h.path_tokens[1:3]) for h in decode(*batch, "sample", **common))
    assert counts[(A, A)] + counts[(B_, B_)] == 0  # weight 1e-5: expected 0.02 draws
    assert abs(counts[(A, B_)] / n - 0.6) < 0.03
    free = Counter(
        tuple(h.path_tokens[1:3])
        for h in decode(*batch, "sample", no_consecutive_repeated_ngram=0, **common)
    )
    assert abs(free[(A, A)] / n - 0.36) < 0.03


def test_sample_no_repeated_ngram():
    # a b a b with bigram ban: the second "a b" is (almost) never drawn.
    probs = [
        {0: 1.0},
        {A: 0.5, B_: 0.5},
        {A: 0.5, B_: 0.5},
        {A: 0.5, B_: 0.5},
        {A: 0.5, B_: 0.5},
        {2: 1.0},
    ]
    tlp, ln, lens = chain_graph(probs, V=6)
    n = 2000
    hyps = decode(
        tlp.expand(n, -1, -1),
        ln.expand(n, -1, -1),
        lens.expand(n),
        "sample",
        top_cand_n=2,
        top_p=1.0,
        seed=3,
        no_repeated_ngram=2,
        no_consecutive_repeated_ngram=0,
    )
    for h in hyps:
        grams = list(zip(h.tokens, h.tokens[1:], strict=False))
        assert len(grams) == len(set(grams))
    # a b a is allowed (and frequent: the a/b draws are fair coins otherwise)
    assert Counter(tuple(h.tokens) for h in hyps)[(A, B_, A)] > n // 10
    free = decode(
        tlp.expand(n, -1, -1),
        ln.expand(n, -1, -1),
        lens.expand(n),
        "sample",
        top_cand_n=2,
        top_p=1.0,
        seed=3,
        no_consecutive_repeated_ngram=0,
    )
    assert Counter(tuple(h.tokens) for h in free)[(A, B_, A, B_)] > 0


def plain_beam(tlp, ln, lens, **options):
    """The trie/dict search (:func:`_beam_one_reference`) of every sentence, without a language
    model, with :func:`beam_search`'s defaults for the options not given."""
    opts = {
        p.name: p.default
        for p in inspect.signature(beam_search).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    }
    opts.update(options)
    order = ("beam_size", "max_beam_per_length", "top_cand_n", "top_p", "max_successors", "alpha")
    args = [opts[k] for k in order]
    return [
        _beam_one_reference(tlp[b, :n].numpy(), ln[b, :n, :n].numpy(), *args, None, 0.0)
        for b, n in enumerate(lens.tolist())
    ]


@pytest.mark.parametrize("alpha", [0.0, 1.1])
def test_plain_beam_without_pruning_is_exhaustive_search(alpha):
    tlp, ln, lens = random_graph(4, 6, 4, seed=31, sharp=1.0)
    for b, h in enumerate(plain_beam(tlp, ln, lens, top_cand_n=4, alpha=alpha, **EXACT)):
        J = objective(output_marginals(tlp[b], ln[b], int(lens[b])), alpha)
        assert J[tuple(h.tokens)] == pytest.approx(max(J.values()), abs=1e-9)


@pytest.mark.parametrize("plain", [False, True])
def test_beam_pad_breaks_a_duplicate_run(plain):
    # One path; vertex 2 reads a (0.6) or <pad> (0.4): "a a a" -> [a] (0.6), "a <pad> a" -> [a, a]
    # (0.4). With α = 1: J([a]) = log 0.6 = -0.51 < J([a, a]) = log 0.4 / 2 = -0.46.
    tlp, ln, lens = chain_graph([{0: 1.0}, {A: 1.0}, {A: 0.6, PAD_ID: 0.4}, {A: 1.0}, {2: 1.0}])
    tlp = tlp.clamp(min=-1e4)  # log 0 of the unlisted tokens

    def search(**options):
        if plain:
            return plain_beam(tlp, ln, lens, **options, **EXACT)[0]
        return decode(tlp, ln, lens, "beam", **options, **EXACT)[0]

    h = search(alpha=1.0)
    assert h.tokens == [A, A]
    assert h.path_tokens == [0, A, PAD_ID, A, 2]
    h = search(alpha=2.0)  # J([a, a]) = log 0.4 / 4 wins too
    assert h.tokens == [A, A]
    h = search(alpha=0.0)  # plain probability: [a] wins
    assert h.tokens == [A]


def test_sample_ban_history_follows_the_output_rule():
    # "a <pad> a" outputs [a, a], so the bigram (a, a) is in the history and a third a (which
    # would complete it again) is banned at vertex 4; b is free.
    probs = [{0: 1.0}, {A: 1.0}, {PAD_ID: 1.0}, {A: 1.0}, {A: 0.5, B_: 0.5}, {2: 1.0}]
    tlp, ln, lens = chain_graph(probs, V=6)
    tlp = tlp.clamp(min=-1e4)
    n = 400
    hyps = decode(
        tlp.expand(n, -1, -1),
        ln.expand(n, -1, -1),
        lens.expand(n),
        "sample",
        top_cand_n=2,
        top_p=1.0,
        seed=4,
        no_consecutive_repeated_ngram=0,
        no_repeated_ngram=2,
    )
    assert all(h.path_tokens[4] == B_ for h in hyps)
    assert all(h.tokens == [A, A, B_] for h in hyps)
