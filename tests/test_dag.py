"""fadat.dag against brute-force enumeration of every path (and every output string) on tiny
random graphs, in float64: values, gradients (autograd and gradcheck), invariants, underflow."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from brute_dag import all_paths, log_likelihood, passing, path_logprob, paths_with

from fadat import dag
from fadat.dag import _shared, likelihood

F64 = torch.float64
NEG_INF = float("-inf")

# ---------------------------------------------------------------------------------------------
# Random "model outputs": free parameters → log_softmax / masked log_softmax
# ---------------------------------------------------------------------------------------------


def link_logprobs(scores: torch.Tensor, graph_lengths: torch.Tensor) -> torch.Tensor:
    """Masked log_softmax over destinations (docs/reference-behaviour.md, "Links"): −inf outside i <
    j < L_b."""
    size = scores.shape[1]
    idx = torch.arange(size)
    valid = (idx[None, :, None] < idx[None, None, :]) & (
        idx[None, None, :] < graph_lengths[:, None, None]
    )  # (B, L, L)
    # A large finite fill keeps rows without valid entries NaN-free; they become −inf after.
    logp = torch.log_softmax(scores.masked_fill(~valid, -1e9), dim=-1)
    return logp.masked_fill(~valid, NEG_INF)


def make_case(seed, graph_lengths, target_lengths, vocab=5, steps=None, size=None, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    glen = torch.tensor(graph_lengths)
    tlen = torch.tensor(target_lengths)
    batch = len(graph_lengths)
    size = size or max(graph_lengths)
    steps = steps or max(target_lengths)
    logits = (torch.randn(batch, size, vocab, generator=gen, dtype=dtype) * 1.5).requires_grad_()
    scores = (torch.randn(batch, size, size, generator=gen, dtype=dtype) * 1.5).requires_grad_()
    targets = torch.randint(0, vocab, (batch, steps), generator=gen)
    pad = torch.arange(steps)[None, :] >= tlen[:, None]
    targets = targets.masked_fill(pad, 1)  # <pad> beyond T_b
    return logits, scores, targets, glen, tlen


# ---------------------------------------------------------------------------------------------
# Brute force
# ---------------------------------------------------------------------------------------------


def brute_log_likelihood(logp, links, targets, glen, tlen):
    """``(B,)``: :func:`brute_dag.log_likelihood` of each sentence."""
    return torch.stack(
        [
            log_likelihood(logp[b], links[b], targets[b, : int(tlen[b])].tolist(), int(glen[b]))
            for b in range(logp.shape[0])
        ]
    )


def brute_alignment(logp, links, targets, glen, tlen):
    batch, size, _ = logp.shape
    out = torch.full((batch, size), -1, dtype=torch.int64)
    for b in range(batch):
        best, best_path = NEG_INF, None
        for path in paths_with(int(glen[b]), int(tlen[b])):
            emit = sum(float(logp[b, v, targets[b, t]]) for t, v in enumerate(path))
            score = float(path_logprob(links[b], path)) + emit
            if score > best:
                best, best_path = score, path
        if best_path is not None:
            for t, v in enumerate(best_path):
                out[b, v] = t
    return out


def brute_passing(links, glen):
    """``(B, L)``: :func:`brute_dag.passing` of each graph, 0 beyond its L_b vertices."""
    size = links.shape[1]
    rows = [passing(links[b], int(g)) for b, g in enumerate(glen.tolist())]
    return torch.stack([torch.cat([r, r.new_zeros(size - len(r))]) for r in rows])


def ref_counts(seq, order):
    return Counter(tuple(seq[k : k + order]) for k in range(len(seq) - order + 1))


def brute_fuzzy(logp, links, targets, glen, tlen, order):
    """Eq. 11/17/18/19 by enumerating every path (expectations over tokens in closed form)."""
    probs = logp.exp()
    fields = {k: [] for k in dag.FuzzyAlignment._fields}
    for b in range(logp.shape[0]):
        ref = ref_counts(targets[b, : int(tlen[b])].tolist(), order)
        length = ngrams = logp.new_zeros(())
        expect = {g: logp.new_zeros(()) for g in ref}
        for path in all_paths(int(glen[b])):
            prob = path_logprob(links[b], path).exp()
            length = length + prob * len(path)
            ngrams = ngrams + prob * max(len(path) - order + 1, 0)
            for g in ref:
                for k in range(len(path) - order + 1):
                    term = prob
                    for i in range(order):
                        term = term * probs[b, path[k + i], g[i]]
                    expect[g] = expect[g] + term
        clipped = sum((torch.clamp(expect[g], max=float(c)) for g, c in ref.items()), 0 * length)
        precision = clipped / ngrams if float(ngrams.detach()) > 0 else 0 * clipped
        brevity = torch.clamp(torch.exp(1 - int(tlen[b]) / length), max=1.0)
        for name, value in zip(
            dag.FuzzyAlignment._fields,
            (length, ngrams, clipped, precision, brevity, brevity * precision),
            strict=True,
        ):
            fields[name].append(value)
    return dag.FuzzyAlignment(**{k: torch.stack(v) for k, v in fields.items()})


def brute_fuzzy_strings(logp, links, targets, glen, tlen, order):
    """E[C_g(y')] and E[#n-grams of y'] by enumerating every path AND every output string."""
    probs = logp.exp().detach()
    out = []
    vocab = logp.shape[2]
    for b in range(logp.shape[0]):
        ref = ref_counts(targets[b, : int(tlen[b])].tolist(), order)
        expect = dict.fromkeys(ref, 0.0)
        ngrams = 0.0
        for path in all_paths(int(glen[b])):
            p_path = float(path_logprob(links[b], path).exp())
            for ys in itertools.product(range(vocab), repeat=len(path)):
                p = p_path * math.prod(float(probs[b, v, y]) for v, y in zip(path, ys, strict=True))
                counts = ref_counts(list(ys), order)
                ngrams += p * sum(counts.values())
                for g in ref:
                    expect[g] += p * counts.get(g, 0)
        clipped = sum(min(expect[g], c) for g, c in ref.items())
        out.append((ngrams, clipped))
    return torch.tensor(out, dtype=F64)


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

# Ragged: a full graph, short graphs, T_b = L_b (one path), T_b > L_b (no path), L_b = 2.
GLEN = [8, 5, 6, 3, 2, 7]
TLEN = [5, 3, 6, 4, 2, 2]


def model_outputs(seed=0, **kw):
    logits, scores, targets, glen, tlen = make_case(seed, GLEN, TLEN, **kw)
    return logits, scores, targets, glen, tlen


def test_gather_match_indexes_token_logprobs():
    logits, _, targets, _, _ = model_outputs()
    logp = logits.log_softmax(-1)
    match = dag.gather_match(logp, targets)
    for b, t, j in itertools.product(range(3), range(targets.shape[1]), range(logp.shape[1])):
        assert match[b, t, j] == logp[b, j, targets[b, t]]


def test_log_likelihood_matches_enumeration_value_and_gradient():
    logits, scores, targets, glen, tlen = model_outputs(1)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    ours, stats = dag.dag_log_likelihood(logp, links, targets, glen, tlen, return_stats=True)
    brute = brute_log_likelihood(logp, links, targets, glen, tlen)
    finite = torch.isfinite(brute)
    assert finite.tolist() == [True, True, True, False, True, True]
    assert torch.isneginf(ours[~finite]).all()
    torch.testing.assert_close(ours[finite], brute[finite], rtol=1e-10, atol=1e-10)
    assert stats == dag.LikelihoodStats(too_short=1, underflow_recomputed=0)

    weights = torch.linspace(0.5, 2.0, len(GLEN), dtype=F64)
    g_ours = torch.autograd.grad(
        (ours[finite] * weights[finite]).sum(), (logits, scores), retain_graph=True
    )
    g_brute = torch.autograd.grad((brute[finite] * weights[finite]).sum(), (logits, scores))
    for a, b in zip(g_ours, g_brute, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_log_likelihood_no_path_gives_neg_inf_and_zero_gradient():
    logits, scores, targets, glen, tlen = model_outputs(2)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    ours = dag.dag_log_likelihood(logp, links, targets, glen, tlen)
    assert not torch.isnan(ours).any()
    dead = tlen > glen
    # The trainer zeroes such entries (docs/reference-behaviour.md, "DAG likelihood"); the backward
    # must not produce NaN even when it is handed the full vector.
    g_logits, g_scores = torch.autograd.grad(ours.sum(), (logits, scores))
    assert torch.isfinite(g_logits).all() and torch.isfinite(g_scores).all()
    assert (g_logits[dead] == 0).all() and (g_scores[dead] == 0).all()


def test_log_likelihood_ignores_padding_content():
    logits, scores, targets, glen, tlen = model_outputs(3)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    clean = dag.dag_log_likelihood(logp, links, targets, glen, tlen)
    gen = torch.Generator().manual_seed(9)
    noisy_links = torch.where(torch.isinf(links), torch.randn(links.shape, generator=gen), links)
    idx = torch.arange(logp.shape[1])
    pad_v = idx[None, :, None] >= glen[:, None, None]
    noisy_logp = torch.where(pad_v, torch.randn(logp.shape, generator=gen, dtype=F64), logp)
    pad_t = torch.arange(targets.shape[1])[None, :] >= tlen[:, None]
    noisy_targets = targets.masked_fill(pad_t, -100)
    noisy = dag.dag_log_likelihood(noisy_logp, noisy_links, noisy_targets, glen, tlen)
    torch.testing.assert_close(noisy, clean, rtol=0, atol=0)


def test_log_likelihood_float32_close_to_float64():
    logits, scores, targets, glen, tlen = model_outputs(4)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    ref = dag.dag_log_likelihood(logp, links, targets, glen, tlen)
    low = dag.dag_log_likelihood(logp.float(), links.float(), targets, glen, tlen)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low.double(), ref, rtol=1e-5, atol=1e-5)


def test_flushed_exp_zeroes_only_below_the_normal_range():
    for dtype in (torch.float32, F64):
        floor = math.log(torch.finfo(dtype).tiny)
        x = torch.tensor(
            [0.0, -5.0, floor + 0.6, floor + 0.4, floor - 1, -1e4, NEG_INF], dtype=dtype
        )
        out = _shared._flushed_exp(x)
        torch.testing.assert_close(out[:3], x[:3].exp(), rtol=0, atol=0)
        assert out[3:].tolist() == [0.0] * 4, out  # flushed: smaller than ~1.6 × tiny
        keep = torch.tensor([False, True, True, True, True, True, True])
        assert _shared._flushed_exp(x, keep)[0] == 0


def test_float32_likelihood_and_fuzzy_with_far_jumps_below_the_normal_range():
    """Link log-probs far below log(tiny) (flushed to E = 0 in float32) change neither value
    nor gradient beyond float32 precision (float64 log-space DP as reference), in the fast
    exp-space path: jumps of ≈ 3 are likely, longer ones mostly below −100 as in a trained
    model."""
    logits, scores, targets, glen, tlen = make_case(11, [24, 20, 24], [9, 7, 9], vocab=6)
    logp = logits.log_softmax(-1).detach()
    jump = torch.arange(24.0)[None, :] - torch.arange(24.0)[:, None]  # (L, L)
    links = link_logprobs(scores.detach() - 6.0 * (jump - 2.5) ** 2, glen)
    valid = torch.isfinite(links)
    assert (links[valid] < -87.4).float().mean() > 0.5
    ref_links = links.clone().requires_grad_()
    ref = likelihood._likelihood(dag.gather_match(logp, targets), ref_links, glen, tlen, True)[0]
    (g_ref,) = torch.autograd.grad(ref.sum(), ref_links)
    low_links = links.float().requires_grad_()
    low, stats = dag.dag_log_likelihood(
        logp.float(), low_links, targets, glen, tlen, return_stats=True
    )
    assert stats.underflow_recomputed == 0  # the exp-space path itself, not the float64 redo
    (g_low,) = torch.autograd.grad(low.sum(), low_links)
    torch.testing.assert_close(low.double(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g_low.double(), g_ref, rtol=1e-4, atol=1e-5)
    fz_ref = dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=2).score
    fz_low = dag.fuzzy_alignment(logp.float(), links.float(), targets, glen, tlen, order=2).score
    torch.testing.assert_close(fz_low.double(), fz_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("force_logspace", [False, True])
def test_log_likelihood_gradcheck(force_logspace):
    """Exactness of both hand-written backwards (scaled exp space and float64 log space)."""
    logits, scores, targets, glen, tlen = make_case(5, [6, 4, 5], [4, 3, 5], vocab=4)
    logits, scores = logits.detach().requires_grad_(), scores.detach().requires_grad_()
    weights = torch.tensor([0.7, -1.3, 2.0], dtype=F64)

    def fn(lg, sc):
        match = dag.gather_match(lg.log_softmax(-1), targets)
        logz, _, _ = likelihood._likelihood(
            match, link_logprobs(sc, glen), glen, tlen, force_logspace
        )
        return (logz * weights).sum()

    assert torch.autograd.gradcheck(fn, (logits, scores), eps=1e-6, atol=1e-7)


def test_log_likelihood_from_edited_match():
    """Force-emit edits match before the DP; check the edited DP against enumeration."""
    logits, scores, targets, glen, tlen = model_outputs(6)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    match = dag.gather_match(logp, targets).detach().clone()
    match[0, 2, :] = NEG_INF
    match[0, 2, 4] = 0.0  # pin target 2 of sentence 0 to vertex 4, score log 1
    ours = dag.dag_log_likelihood_from_match(match, links, glen, tlen)
    brute = []
    for b in range(len(GLEN)):
        terms = [
            path_logprob(links[b], p) + sum(match[b, t, v] for t, v in enumerate(p))
            for p in paths_with(int(glen[b]), int(tlen[b]))
        ]
        brute.append(torch.logsumexp(torch.stack(terms), 0) if terms else torch.tensor(NEG_INF))
    brute = torch.stack(brute).to(F64)
    finite = torch.isfinite(brute)
    torch.testing.assert_close(ours[finite], brute[finite], rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Underflow: long graph, short target, sharply peaked links
# ---------------------------------------------------------------------------------------------


def logspace_reference(match, links):
    """Plain float64 log-space forward DP under autograd (the docs/reference-behaviour.md, "DAG
    likelihood" torch reference).

    −inf is replaced by −1e5 (exp underflows to exactly 0 in float64) so that logsumexp's
    gradient stays NaN-free on unreachable vertices."""
    links = links.clamp(min=-1e5)
    f = torch.full_like(match[:, 0], -1e5)
    f[:, 0] = match[:, 0, 0]
    for t in range(1, match.shape[1]):
        f = torch.logsumexp(f[:, :, None] + links, dim=1) + match[:, t]
    return f[:, -1]


def peaked_case(sharpness, preferred_jump=1):
    """Links that prefer jumps of ``preferred_jump`` with log-penalty ``sharpness`` per vertex
    of deviation (L = 240, T = 12: a path needs jumps of ≈ 21)."""
    size, steps, vocab, batch = 240, 12, 7, 2
    gen = torch.Generator().manual_seed(11)
    glen = torch.full((batch,), size)
    tlen = torch.full((batch,), steps)
    idx = torch.arange(size, dtype=F64)
    jump = (idx[None, :] - idx[:, None] - preferred_jump).abs()  # (L, L)
    scores = (-sharpness * jump).expand(batch, size, size).clone()
    scores = scores + 0.1 * torch.randn(scores.shape, generator=gen, dtype=F64)
    logits = torch.randn(batch, size, vocab, generator=gen, dtype=F64) * 3
    targets = torch.randint(0, vocab, (batch, steps), generator=gen)
    return logits, scores, targets, glen, tlen


def test_float32_gradient_finite_with_subnormal_normaliser_past_target_end():
    """In a ragged batch the scaled DP runs past a short sentence's T_b. If the forward mass
    there becomes subnormal (here: the step maximum sits at unreachable vertex 0 and every
    reachable vertex is 95 nats lower), 1/c_t overflows float32; it must not turn the
    sentence's link gradient into NaN (regression: NaN gradients skipped most training
    updates once glancing force-emit was on)."""
    logits, scores, targets, glen, tlen = make_case(5, [6, 6], [3, 5], size=6, steps=5)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    match = dag.gather_match(logp, targets).detach().clone()  # (B, T, L) float64
    match[0, 3, 0] = 0.0  # past T_0 = 3
    match[0, 3, 1:] = -95.0
    grads = {}
    for dtype in (torch.float32, F64):
        m = match.to(dtype).requires_grad_()
        lk = links.detach().to(dtype).requires_grad_()
        ll = dag.dag_log_likelihood_from_match(m, lk, glen, tlen)
        ll.sum().backward()
        grads[dtype] = (ll.detach(), m.grad, lk.grad)
    for ours, ref in zip(grads[torch.float32], grads[F64], strict=True):
        finite = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(ours), finite)
        torch.testing.assert_close(ours.to(F64)[finite], ref[finite], rtol=1e-4, atol=1e-5)


def test_underflow_float32_recomputed_and_exact():
    logits, scores, targets, glen, tlen = peaked_case(sharpness=8.0)
    links64 = link_logprobs(scores, glen)
    logp64 = logits.log_softmax(-1)
    ref = logspace_reference(dag.gather_match(logp64, targets), links64)
    assert (ref < -1000).all() and torch.isfinite(ref).all()  # far below float32's exp range

    logits32 = logits.float().requires_grad_()
    links32 = link_logprobs(scores.float(), glen).detach().requires_grad_()
    ours, stats = dag.dag_log_likelihood(
        logits32.log_softmax(-1), links32, targets, glen, tlen, return_stats=True
    )
    assert ours.dtype == torch.float32
    assert stats == dag.LikelihoodStats(too_short=0, underflow_recomputed=2)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=0)

    # Gradients of the float32 call against float64 autograd through the log-space reference.
    g32 = torch.autograd.grad(ours.sum(), (logits32, links32))
    l64 = links64.detach().requires_grad_()
    lg64 = logits.detach().requires_grad_()
    ref2 = logspace_reference(dag.gather_match(lg64.log_softmax(-1), targets), l64)
    g64 = torch.autograd.grad(ref2.sum(), (lg64, l64))
    valid = torch.isfinite(links64)
    torch.testing.assert_close(g32[0].double(), g64[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g32[1].double()[valid], g64[1][valid], rtol=1e-4, atol=1e-5)


def test_model_like_float32_stays_in_fast_path():
    logits, scores, targets, glen, tlen = peaked_case(sharpness=0.5, preferred_jump=20)
    links64 = link_logprobs(scores, glen)
    ref = logspace_reference(dag.gather_match(logits.log_softmax(-1), targets), links64)
    ours, stats = dag.dag_log_likelihood(
        logits.float().log_softmax(-1), links64.float(), targets, glen, tlen, return_stats=True
    )
    assert stats.underflow_recomputed == 0
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------------------------
# Best alignment
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_alignment_matches_enumeration(seed):
    logits, scores, targets, glen, tlen = model_outputs(10 + seed)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    ours = dag.best_alignment(logp, links, targets, glen, tlen)
    assert ours.dtype == torch.int64
    assert torch.equal(ours, brute_alignment(logp, links, targets, glen, tlen))
    ours32 = dag.best_alignment(logp.float(), links.float(), targets, glen, tlen)
    assert torch.equal(ours32, ours)
    # Exactly T_b vertices aligned where a path exists; none where T_b > L_b.
    aligned = (ours >= 0).sum(-1)
    assert torch.equal(aligned, torch.where(tlen <= glen, tlen, 0))


def test_chunks_split_evenly_across_workers():
    size, elem = 240, 4
    tensor = torch.empty(0)
    for batch, workers in [(64, 2), (7, 2), (64, 3), (1, 2), (64, 1)]:
        chunks = _shared._chunks(batch, size, tensor, workers)
        covered = [i for c in chunks for i in range(c.start, c.stop)]
        assert covered == list(range(batch))
        sizes = [c.stop - c.start for c in chunks]
        assert max(sizes) * size * size * elem <= max(_shared._CHUNK_BYTES, size * size * elem)
        if batch >= workers:
            assert len(chunks) % workers == 0 or len(chunks) == batch
            assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1


def test_threaded_chunks_match_enumeration(monkeypatch):
    """One sentence per chunk on two worker threads: values, gradients, alignments exact."""
    monkeypatch.setattr(_shared, "_CHUNK_BYTES", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        logits, scores, targets, glen, tlen = model_outputs(3)
        logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
        ours = dag.dag_log_likelihood(logp, links, targets, glen, tlen)
        assert torch.get_num_threads() == 2  # restored after the serial section
        brute = brute_log_likelihood(logp, links, targets, glen, tlen)
        finite = torch.isfinite(brute)
        torch.testing.assert_close(ours[finite], brute[finite], rtol=1e-10, atol=1e-10)
        g_ours = torch.autograd.grad(ours[finite].sum(), (logits, scores), retain_graph=True)
        g_brute = torch.autograd.grad(brute[finite].sum(), (logits, scores))
        for a, b in zip(g_ours, g_brute, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
        logp, links = logp.detach(), links.detach()
        path = dag.best_alignment(logp, links, targets, glen, tlen)
        assert torch.equal(path, brute_alignment(logp, links, targets, glen, tlen))
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------
# Passing probabilities and fuzzy alignment
# ---------------------------------------------------------------------------------------------


def test_passing_probabilities_match_enumeration_and_invariants():
    _, scores, _, glen, _ = model_outputs(20)
    links = link_logprobs(scores, glen)
    ours = dag.passing_probabilities(links, glen)
    torch.testing.assert_close(ours, brute_passing(links, glen), rtol=1e-10, atol=1e-12)
    rows = torch.arange(len(GLEN))
    torch.testing.assert_close(ours[:, 0], torch.ones(len(GLEN), dtype=F64))
    torch.testing.assert_close(ours[rows, glen - 1], torch.ones(len(GLEN), dtype=F64))
    pad = torch.arange(links.shape[1])[None, :] >= glen[:, None]
    assert (ours[pad] == 0).all()
    g_ours = torch.autograd.grad(
        (ours * torch.arange(8.0, dtype=F64)).sum(), scores, retain_graph=True
    )[0]
    g_brute = torch.autograd.grad(
        (brute_passing(links, glen) * torch.arange(8.0, dtype=F64)).sum(), scores
    )[0]
    torch.testing.assert_close(g_ours, g_brute, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_fuzzy_alignment_matches_path_enumeration(order):
    logits, scores, targets, glen, tlen = model_outputs(30 + order)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    ours = dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=order)
    brute = brute_fuzzy(logp, links, targets, glen, tlen, order)
    for name in dag.FuzzyAlignment._fields:
        torch.testing.assert_close(
            getattr(ours, name), getattr(brute, name), rtol=1e-10, atol=1e-12, msg=name
        )
    torch.testing.assert_close(ours.expected_length, dag.passing_probabilities(links, glen).sum(1))
    if order == 2:  # every path of |A| vertices has |A| − 1 bigrams
        torch.testing.assert_close(ours.expected_ngrams, ours.expected_length - 1)
    weights = torch.linspace(-1.0, 2.0, len(GLEN), dtype=F64)
    g_ours = torch.autograd.grad((ours.score * weights).sum(), (logits, scores), retain_graph=True)
    g_brute = torch.autograd.grad((brute.score * weights).sum(), (logits, scores))
    for a, b in zip(g_ours, g_brute, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_fuzzy_alignment_matches_string_enumeration(order):
    """Eq. 17/18 against the definition: enumerate every path and every output string."""
    logits, scores, targets, glen, tlen = make_case(40 + order, [6, 5, 3, 4], [4, 5, 3, 2], vocab=3)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    ours = dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=order)
    brute = brute_fuzzy_strings(logp, links, targets, glen, tlen, order)
    torch.testing.assert_close(ours.expected_ngrams, brute[:, 0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.clipped_matches, brute[:, 1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_fuzzy_alignment_gradcheck(order):
    logits, scores, targets, glen, tlen = make_case(50, [5, 4, 3], [4, 2, 3], vocab=4)
    logits, scores = logits.detach().requires_grad_(), scores.detach().requires_grad_()

    def fn(lg, sc):
        res = dag.fuzzy_alignment(
            lg.log_softmax(-1), link_logprobs(sc, glen), targets, glen, tlen, order
        )
        return -res.score.mean()

    assert torch.autograd.gradcheck(fn, (logits, scores), eps=1e-6, atol=1e-7)


def test_fuzzy_alignment_graph_too_short_is_zero_and_finite():
    logits, scores, targets, glen, tlen = make_case(60, [2, 3, 6], [3, 2, 4], vocab=4)
    logp, links = logits.log_softmax(-1), link_logprobs(scores, glen)
    res = dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=4)
    # L_b = 2, 3 cannot hold a 4-gram; T_b = 2, 3, 4 give 0, 0, 1 reference 4-grams.
    assert res.expected_ngrams[:2].tolist() == [0.0, 0.0]
    assert res.precision[:2].tolist() == [0.0, 0.0] and res.score[:2].tolist() == [0.0, 0.0]
    grads = torch.autograd.grad(-res.score.mean(), (logits, scores), retain_graph=True)
    assert all(torch.isfinite(g).all() for g in grads)
    float32 = dag.fuzzy_alignment(logp.float(), links.float(), targets, glen, tlen, order=4)
    torch.testing.assert_close(float32.score.double(), res.score, rtol=1e-5, atol=1e-6)


def test_fuzzy_alignment_float32_close_to_float64():
    logits, scores, targets, glen, tlen = model_outputs(70)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    ref = dag.fuzzy_alignment(logp, links, targets, glen, tlen)
    low = dag.fuzzy_alignment(logp.float(), links.float(), targets, glen, tlen)
    for name in dag.FuzzyAlignment._fields:
        assert getattr(low, name).dtype == torch.float32
        torch.testing.assert_close(
            getattr(low, name).double(), getattr(ref, name), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("order,vocab", [(1, 6), (2, 6), (3, 4), (5, 20_000)])
def test_reference_ngrams_match_counter(order, vocab):
    """The tensor-built table equals Counter over windows (packed keys, and unique(dim=0) when
    the packed key would overflow int64: V = 20000, n = 5)."""
    gen = torch.Generator().manual_seed(order)
    tlen = torch.tensor([9, 1, 6, 12, 4])
    targets = torch.randint(0, vocab, (5, 12), generator=gen)
    targets[:, 3:7] = targets[:, :4]  # force repeated n-grams
    targets = targets.masked_fill(torch.arange(12)[None, :] >= tlen[:, None], 1)
    grams, counts = dag.reference_ngrams(targets, tlen, order)
    for b in range(5):
        expected = ref_counts(targets[b, : int(tlen[b])].tolist(), order)
        pairs = zip(grams[b].tolist(), counts[b].tolist(), strict=True)
        got = Counter({tuple(g): int(c) for g, c in pairs if c > 0})
        assert got == expected


def test_bad_inputs_raise():
    logits, scores, targets, glen, tlen = model_outputs(80)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    with pytest.raises(ValueError, match="graph_lengths"):
        dag.dag_log_likelihood(logp, links, targets, glen + 5, tlen)
    with pytest.raises(ValueError, match="target_lengths"):
        dag.fuzzy_alignment(logp, links, targets, glen, tlen * 0)
    with pytest.raises(ValueError, match="out of range"):
        dag.best_alignment(logp, links, targets + 10, glen, tlen)
    with pytest.raises(ValueError, match="order"):
        dag.fuzzy_alignment(logp, links, targets, glen, tlen, order=0)


def test_backend_argument_is_checked_and_auto_on_cpu_imports_no_triton():
    """``backend="auto"`` on CPU tensors is the PyTorch path and imports nothing of Triton
    (checked in a fresh process); an unknown backend is a ValueError naming the choices."""
    import subprocess
    import sys

    logits, scores, targets, glen, tlen = model_outputs(81)
    logp, links = logits.log_softmax(-1).detach(), link_logprobs(scores, glen).detach()
    with pytest.raises(ValueError, match="auto, torch, triton"):
        dag.dag_log_likelihood(logp, links, targets, glen, tlen, backend="cuda")
    with pytest.raises(ValueError, match="auto, torch, triton"):
        dag.best_alignment(logp, links, targets, glen, tlen, backend="")
    code = (
        "import sys, torch; from fadat import dag; "
        "m = torch.zeros(1, 2, 3); l = torch.zeros(1, 3, 3); n = torch.tensor([3]); "
        "t = torch.tensor([2]); dag.dag_log_likelihood_from_match(m, l, n, t); "
        "dag.best_alignment_from_match(m, l, n, t); print('triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
