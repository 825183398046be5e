"""Tests of fadat.objectives: glancing schedule, glance count and choice, force-emit, NLL and
fuzzy losses against brute-force path enumeration, label smoothing, and the glancing acceptance
tests on the real tiny DATModel (pass 2 ≡ pass 1 at ratio 0; glanced inputs = y[best path])."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from brute_dag import log_likelihood

from fadat import dag
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, make_batch
from fadat.models.config import make_config
from fadat.models.dat import DATModel
from fadat.objectives import OBJECTIVES, ObjectiveConfig, compute_loss
from fadat.objectives.at import LabelSmoothedCEOptions
from fadat.objectives.glancing import (
    choose_glanced,
    decode_with_seed,
    draw_seed,
    forked_rng,
    glance,
    glance_count,
    oracle_tokens,
    parse_glancing_schedule,
)
from fadat.objectives.losses import (
    force_emit_match,
    fuzzy_loss,
    label_smoothed_nll,
    nll_loss,
    nll_loss_from_logits,
    target_logprobs,
)

# ---------------------------------------------------------------------------------- schedule


def test_schedule_anneal_matches_reference_formula():
    s = parse_glancing_schedule("0.5:0.1@200k")
    assert s.positions == (0, 200_000)
    for u in (0, 1, 1000, 100_000, 199_999):
        assert s(u) == pytest.approx(0.5 + (0.1 - 0.5) * u / 200_001, abs=1e-15)
    assert s(200_000) == 0.1 and s(10**7) == 0.1


def test_schedule_constant_and_multiple_knots():
    assert parse_glancing_schedule("0.1")(12345) == 0.1
    assert parse_glancing_schedule(0.3)(0) == 0.3
    assert parse_glancing_schedule("0.1:0.1@4k")(2000) == pytest.approx(0.1)
    s = parse_glancing_schedule("0.6:0.4@10:0.2@30")
    assert s(0) == 0.6
    assert s(5) == pytest.approx(0.6 - 0.2 * 5 / 11)
    assert s(10) == pytest.approx(0.4)
    assert s(20) == pytest.approx(0.4 - 0.2 * 10 / 21)
    assert s(30) == 0.2 and s(31) == 0.2


@pytest.mark.parametrize(
    "bad",
    ["", "x", "0.5:0.1", "0.5@3:0.1@4", "1.5", "0.5:0.1@-3", "0.5:0.1@10:0.2@5", "0.5:0.1@4q"],
)
def test_schedule_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_glancing_schedule(bad)


# ------------------------------------------------------------------------------ glance count


def test_glance_count_formula():
    t = torch.tensor([10, 7, 5, 3])
    c = torch.tensor([4, 7, 0, 1])
    for p in (0.0, 0.1, 0.25, 0.5, 1.0):
        expected = [
            math.floor((ti - ci) * p + 0.5) for ti, ci in zip(t.tolist(), c.tolist(), strict=True)
        ]
        assert glance_count(t, c, p).tolist() == expected


def test_choose_glanced_counts_subset_and_uniformity():
    path = torch.tensor([[0, -1, 1, -1, 2, 3, -1, 4], [0, 1, -1, -1, -1, -1, -1, 2]])
    counts = torch.tensor([2, 1])
    gen = torch.Generator().manual_seed(0)
    hits = torch.zeros(path.shape)
    trials = 4000
    for _ in range(trials):
        m = choose_glanced(path, counts, gen)
        assert m.sum(1).tolist() == [2, 1]
        assert not (m & (path < 0)).any()
        hits += m
    # each aligned vertex of row 0 is picked with probability 2/5, of row 1 with 1/3
    freq0 = hits[0][path[0] >= 0] / trials
    freq1 = hits[1][path[1] >= 0] / trials
    assert torch.allclose(freq0, torch.full_like(freq0, 0.4), atol=0.04)
    assert torch.allclose(freq1, torch.full_like(freq1, 1 / 3), atol=0.04)


def test_oracle_tokens():
    targets = torch.tensor([[BOS_ID, 7, 8, EOS_ID]])
    path = torch.tensor([[0, -1, 1, 2, -1, 3]])
    assert oracle_tokens(targets, path).tolist() == [[BOS_ID, PAD_ID, 7, 8, PAD_ID, EOS_ID]]


# ------------------------------------------------------------------ brute force over paths


def random_dag(batch, size, vocab, graph_lengths, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    token_logprobs = torch.log_softmax(torch.randn(batch, size, vocab, generator=gen), -1)
    scores = torch.randn(batch, size, size, generator=gen)
    i = torch.arange(size)
    valid = (i[None, :] > i[:, None])[None] & (i[None, None, :] < graph_lengths[:, None, None])
    links = torch.log_softmax(scores.masked_fill(~valid, -math.inf), -1)
    links = torch.nan_to_num(links, nan=-math.inf)
    return token_logprobs.to(dtype), links.to(dtype)


def test_nll_loss_matches_brute_force_and_counts_invalid():
    vocab, size = 9, 7
    graph_lengths = torch.tensor([7, 6, 4, 7])
    targets = torch.tensor(
        [[0, 5, 6, 4, 2, 1], [0, 4, 2, 1, 1, 1], [0, 5, 7, 8, 6, 2], [0, 8, 2, 1, 1, 1]]
    )
    target_lengths = torch.tensor([5, 3, 6, 3])  # sentence 2: T = 6 > L = 4
    lp, links = random_dag(4, size, vocab, graph_lengths)
    lp.requires_grad_(True)
    out = nll_loss(lp, links, targets, graph_lengths, target_lengths)
    expected = 0.0
    for b in (0, 1, 3):
        tgt = targets[b, : target_lengths[b]].tolist()
        ll = log_likelihood(lp.detach()[b], links[b], tgt, int(graph_lengths[b]))
        expected += -float(ll) / len(tgt)
    assert out.count == 4
    assert out.stats["invalid_too_long"] == 1 and out.stats["invalid_nonfinite"] == 0
    assert float(out.loss_sum.detach()) == pytest.approx(expected, rel=1e-9)
    out.loss_sum.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[2].abs().sum() == 0


def test_nll_loss_nonfinite_sentence_is_zeroed_and_counted():
    vocab, size = 6, 5
    graph_lengths = torch.tensor([5, 5])
    lp, links = random_dag(2, size, vocab, graph_lengths)
    lp = lp.clone()
    lp[1, :, 4] = -math.inf  # token 4 cannot be emitted anywhere in sentence 1
    lp.requires_grad_(True)
    targets = torch.tensor([[0, 4, 2], [0, 4, 2]])
    out = nll_loss(lp, links, targets, graph_lengths, torch.tensor([3, 3]))
    ll0 = log_likelihood(lp.detach()[0], links[0], [0, 4, 2], 5)
    assert out.stats["invalid_nonfinite"] == 1 and out.count == 2
    assert float(out.loss_sum.detach()) == pytest.approx(-float(ll0) / 3, rel=1e-9)
    out.loss_sum.backward()
    assert torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("block", [1, 5, 256])
def test_target_logprobs_equals_gathered_log_softmax_value_and_gradient(block):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, 7, 13, generator=gen, dtype=torch.float64) * 3
    logits.requires_grad_(True)
    targets = torch.randint(0, 13, (3, 5), generator=gen)
    got = target_logprobs(logits, targets, block=block)
    want = dag.gather_match(torch.log_softmax(logits, -1), targets)
    assert got.shape == (3, 5, 7) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    (g_got,) = torch.autograd.grad((got * weights).sum(), logits)
    (g_want,) = torch.autograd.grad((want * weights).sum(), logits)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: target_logprobs(x, targets, block), (logits,))


def test_target_logprobs_bf16_logits_give_fp32_match_and_bf16_gradient():
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 6, 50, generator=gen) * 4).bfloat16().requires_grad_(True)
    targets = torch.randint(0, 50, (2, 4), generator=gen)
    got = target_logprobs(logits, targets, block=4)
    want = dag.gather_match(torch.log_softmax(logits.float(), -1), targets)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    got.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        target_logprobs(logits, torch.full((2, 4), 50))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_target_logprobs_inplace_backward_gives_the_same_gradient_in_the_logits_storage(dtype):
    gen = torch.Generator().manual_seed(3)
    base = (torch.randn(3, 7, 13, generator=gen, dtype=torch.float64) * 3).to(dtype)
    targets = torch.randint(0, 13, (3, 5), generator=gen)
    weights = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    leaf = base.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(
        (target_logprobs(leaf, targets, block=4).double() * weights).sum(), leaf
    )
    leaf = base.clone().requires_grad_(True)
    logits = leaf * 1  # a non-leaf the caller owns, as the token head's output
    got = target_logprobs(logits, targets, block=4, inplace_backward=True)
    torch.testing.assert_close(got, target_logprobs(base, targets, block=4), rtol=0, atol=0)
    ((got.double() * weights).sum()).backward(retain_graph=True)
    torch.testing.assert_close(leaf.grad, want, rtol=0, atol=0)
    assert torch.equal(logits.detach(), want)  # the storage now holds the gradient
    with pytest.raises(RuntimeError, match="second backward"):
        (got.double() * weights).sum().backward()
    # an autograd node that saved the logits notices the overwrite
    leaf = base.clone().requires_grad_(True)
    logits = leaf * 1
    saved = logits.sin().sum()  # sin saves its input; created first, its backward runs last
    loss = saved + target_logprobs(logits, targets, inplace_backward=True).sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_nll_loss_from_logits_equals_nll_loss_with_force_emit():
    gen = torch.Generator().manual_seed(5)
    graph_lengths = torch.tensor([6, 4])
    logits = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    _, links = random_dag(2, 6, 8, graph_lengths, seed=4)
    targets = torch.tensor([[0, 4, 5, 2], [0, 3, 2, 1]])
    target_lengths = torch.tensor([4, 3])

    class G:
        path = torch.tensor([[0, -1, 1, -1, 2, 3], [0, 1, -1, 2, -1, -1]])
        glanced = torch.tensor([[False, False, True, False, False, False], [False] * 6])

    a = nll_loss_from_logits(logits, links, targets, graph_lengths, target_lengths, glance=G)
    b = nll_loss(torch.log_softmax(logits, -1), links, targets, graph_lengths, target_lengths, G)
    torch.testing.assert_close(a.loss_sum, b.loss_sum, rtol=1e-12, atol=0)
    (ga,) = torch.autograd.grad(a.loss_sum, logits)
    (gb,) = torch.autograd.grad(b.loss_sum, logits)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)


def test_force_emit_pins_glanced_vertex_and_detaches_it():
    vocab, size = 7, 6
    graph_lengths = torch.tensor([6])
    lp, links = random_dag(1, size, vocab, graph_lengths, seed=3)
    lp.requires_grad_(True)
    targets = torch.tensor([[0, 4, 5, 2]])
    target_lengths = torch.tensor([4])
    path = torch.tensor([[0, -1, 1, -1, 2, 3]])
    glanced_mask = torch.tensor([[False, False, True, False, False, False]])  # vertex 2 ↦ t = 1

    class G:  # the two fields nll_loss reads from a GlanceResult
        path = torch.tensor([[0, -1, 1, -1, 2, 3]])
        glanced = glanced_mask

    match = dag.gather_match(lp, targets)
    pinned = force_emit_match(match, path, glanced_mask)
    assert torch.isinf(pinned[0, [0, 2, 3], 2]).all()
    assert pinned[0, 1, 2] == match[0, 1, 2]
    out = nll_loss(lp, links, targets, graph_lengths, target_lengths, glance=G, force_emit=True)
    forbid = {(0, 2), (2, 2), (3, 2)}
    ll = log_likelihood(lp.detach()[0], links[0], [0, 4, 5, 2], 6, forbid=forbid)
    assert float(out.loss_sum.detach()) == pytest.approx(-float(ll) / 4, rel=1e-9)
    out.loss_sum.backward()
    # the pinned score is detached: no gradient to log p(y_1 = 4 | v_2); others still learn
    assert lp.grad[0, 2, 4] == 0
    assert lp.grad[0, 1, 4] != 0
    unforced = nll_loss(
        lp, links, targets, graph_lengths, target_lengths, glance=G, force_emit=False
    )
    ll_free = log_likelihood(lp.detach()[0], links[0], [0, 4, 5, 2], 6)
    assert float(unforced.loss_sum.detach()) == pytest.approx(-float(ll_free) / 4, rel=1e-9)


def test_fuzzy_loss_is_minus_bp_times_precision_and_brute_force_length():
    vocab, size = 6, 6
    graph_lengths = torch.tensor([6, 5])
    lp, links = random_dag(2, size, vocab, graph_lengths, seed=5)
    targets = torch.tensor([[0, 4, 5, 4, 2], [0, 3, 2, 1, 1]])
    target_lengths = torch.tensor([5, 3])
    out = fuzzy_loss(lp, links, targets, graph_lengths, target_lengths, order=2)
    res = dag.fuzzy_alignment(lp, links, targets, graph_lengths, target_lengths, order=2)
    assert float(out.loss_sum) == pytest.approx(-float((res.brevity_penalty * res.precision).sum()))
    # expected path length by enumerating every path 0 → L−1 (any length)
    ratio_sum = 0.0
    for b in range(2):
        n = int(graph_lengths[b])
        e_len = 0.0
        for k in range(0, n - 1):
            for middle in itertools.combinations(range(1, n - 1), k):
                p = (0, *middle, n - 1)
                e_len += math.exp(
                    sum(float(links[b, p[i], p[i + 1]]) for i in range(len(p) - 1))
                ) * len(p)
        ratio_sum += e_len / int(target_lengths[b])
    assert out.stats["length_ratio_sum"] == pytest.approx(ratio_sum, rel=1e-6)


def test_label_smoothed_nll_formula():
    gen = torch.Generator().manual_seed(1)
    lp = torch.log_softmax(torch.randn(2, 3, 5, generator=gen, dtype=torch.float64), -1)
    gold = torch.tensor([[4, 2, PAD_ID], [0, 3, 2]])
    loss, nll = label_smoothed_nll(lp, gold, 0.1)
    eps_i = 0.1 / 4
    for b in range(2):
        for t in range(3):
            if gold[b, t] == PAD_ID:
                assert loss[b, t] == 0 and nll[b, t] == 0
                continue
            n = -lp[b, t, gold[b, t]]
            want = (1 - 0.1 - eps_i) * n + eps_i * (-lp[b, t].sum())
            assert float(loss[b, t]) == pytest.approx(float(want))
            assert float(nll[b, t]) == pytest.approx(float(n))


# ------------------------------------------------------------- glancing on the real model

V = 24


def tiny_model(dropout=0.1):
    torch.manual_seed(0)
    return DATModel(make_config("tiny", V, dropout=dropout))


def toy_batch():
    sources = [[5, 6, 7, EOS_ID], [8, 9, EOS_ID]]
    targets = [[BOS_ID, 5, 6, 7, EOS_ID], [BOS_ID, 9, 8, EOS_ID]]
    return make_batch(sources, targets, [0, 1])


def test_ratio_zero_pass2_equals_pass1_bitwise_with_dropout():
    model = tiny_model(dropout=0.3).train()
    batch = toy_batch()
    gl = model.graph_lengths(batch.source_lengths)
    enc = model.encode(batch.source)
    res = glance(model, enc, batch.target, gl, batch.target_lengths, ratio=0.0, seed=1234)
    assert not res.glanced.any()
    assert torch.equal(res.decoder_tokens, model.decoder_input_tokens(gl))
    lp2, links2 = decode_with_seed(model, enc, res.decoder_tokens, 1234, logits=True)
    assert torch.equal(lp2, res.pass1[0]) and torch.equal(links2, res.pass1[1])
    # dropout is really on: another seed gives other outputs
    lp3, _ = decode_with_seed(model, enc, res.decoder_tokens, 99)
    assert not torch.equal(lp3, lp2)


def test_forked_rng_is_manual_seed_on_a_fork():
    """Inside: the stream of ``torch.manual_seed(seed)`` (the idiom the objectives wrote out
    before); after: the global stream continues as if the block had not run, seeded or not."""
    cpu = torch.device("cpu")
    ones = torch.ones(1000)
    torch.manual_seed(11)
    mask = torch.nn.functional.dropout(ones, 0.5)
    after = torch.rand(5)
    torch.manual_seed(3)
    expect_seed = int(torch.randint(0, 2**62, (1,)).item())
    expect_next = torch.rand(5)

    torch.manual_seed(3)
    with forked_rng(cpu, 11):
        assert torch.equal(torch.nn.functional.dropout(ones, 0.5), mask)
        assert torch.equal(torch.rand(5), after)
    assert draw_seed() == expect_seed
    with forked_rng(cpu):
        torch.rand(100)
    assert torch.equal(torch.rand(5), expect_next)


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_glanced_inputs_are_targets_at_best_alignment(ratio):
    model = tiny_model().train()
    batch = toy_batch()
    gl = model.graph_lengths(batch.source_lengths)
    enc = model.encode(batch.source)
    torch.manual_seed(7)
    res = glance(model, enc, batch.target, gl, batch.target_lengths, ratio=ratio, seed=5)
    logits1, links1 = res.pass1
    lp1 = torch.log_softmax(logits1.float(), dim=-1)
    path = dag.best_alignment(lp1, links1, batch.target, gl, batch.target_lengths)
    assert torch.equal(res.path, path)
    oracle = batch.target.gather(1, path.clamp(min=0))
    correct = ((lp1.argmax(-1) == oracle) & (path >= 0)).sum(1)
    assert torch.equal(res.num_correct, correct)
    want = [
        math.floor((t - c) * ratio + 0.5)
        for t, c in zip(batch.target_lengths, correct, strict=True)
    ]
    assert res.num_glanced.tolist() == want
    plain = model.decoder_input_tokens(gl)
    g = res.glanced
    assert torch.equal(res.decoder_tokens[g], oracle[g])
    assert torch.equal(res.decoder_tokens[~g], plain[~g])
    assert (path[g] >= 0).all()
    assert int(g.sum()) > 0


def test_compute_loss_dat_and_gradients_finite():
    model = tiny_model().train()
    batch = toy_batch()
    for name in ("nll", "fuzzy"):
        model.zero_grad()
        out = compute_loss(model, batch, ObjectiveConfig(name=name, glancing_ratio=0.5))
        assert out.count == 2 and torch.isfinite(out.loss_sum)
        out.loss_sum.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
    # eval mode, no glancing: nll loss equals −Σ log P / T from fadat.dag
    model.eval()
    with torch.no_grad():
        out = compute_loss(model, batch, ObjectiveConfig(name="nll"))
        gl = model.graph_lengths(batch.source_lengths)
        lp, links = model(batch.source, gl)
        ll = dag.dag_log_likelihood(lp, links, batch.target, gl, batch.target_lengths)
    assert float(out.loss_sum) == pytest.approx(float((-ll / batch.target_lengths).sum()), rel=1e-5)


def test_compute_loss_at_counts_tokens():
    from fadat.models.at import ATModel

    torch.manual_seed(0)
    model = ATModel(make_config("tiny", V, model_type="at")).eval()
    batch = toy_batch()
    options = LabelSmoothedCEOptions(label_smoothing=0.0)
    settings = ObjectiveConfig("label_smoothed_ce", 0.0, options)
    out = compute_loss(model, batch, settings)
    assert out.count == 4 + 3
    with torch.no_grad():
        lp = model(batch.source, batch.target[:, :-1])
    gold = batch.target[:, 1:]
    nll = -lp.gather(-1, gold.unsqueeze(-1)).squeeze(-1)[gold != PAD_ID].sum()
    assert float(out.loss_sum.detach()) == pytest.approx(float(nll), rel=1e-5)


def test_unknown_objective():
    with pytest.raises(ValueError):
        compute_loss(tiny_model(), toy_batch(), ObjectiveConfig(name="no-such-objective"))


@pytest.mark.parametrize("name", ["nll", "fuzzy"])
def test_dag_backend_option_reaches_the_dag_calls(monkeypatch, name):
    """``dag_backend`` (``--dag-backend``) is passed to the glancing best alignment and, for
    the NLL, to the likelihood; ``auto`` by default."""
    seen = []
    real_align, real_ll = dag.best_alignment_from_match, dag.dag_log_likelihood_from_match

    def align(*args, backend="auto", **kw):
        seen.append(("alignment", backend))
        return real_align(*args, backend="torch", **kw)

    def likelihood(*args, backend="auto", **kw):
        seen.append(("likelihood", backend))
        return real_ll(*args, backend="torch", **kw)

    monkeypatch.setattr(dag, "best_alignment_from_match", align)
    monkeypatch.setattr(dag, "dag_log_likelihood_from_match", likelihood)
    model, batch = tiny_model().train(), toy_batch()
    for backend in ("torch", "auto"):
        seen.clear()
        options = OBJECTIVES[name].options_class(dag_backend=backend)
        settings = ObjectiveConfig(name, 0.5, options)
        out = compute_loss(model, batch, settings)
        assert torch.isfinite(out.loss_sum)
        want = [("alignment", backend)] + ([("likelihood", backend)] if name == "nll" else [])
        assert seen == want
    assert ObjectiveConfig(name=name).options.dag_backend == "auto"


def test_registry_loads_each_objective_by_its_name_and_rejects_a_wrong_line():
    import fadat.objectives as objectives

    assert list(objectives.OBJECTIVES) == list(objectives.REGISTRY)
    for name in objectives.REGISTRY:
        assert objectives.OBJECTIVES[name].name == name
    wrong = objectives._LazyObjectives({"nll": "fadat.objectives.dat:FUZZY"})
    with pytest.raises(ValueError, match="REGISTRY\\['nll'\\] is the objective 'fuzzy'"):
        wrong["nll"]
    with pytest.raises(KeyError):
        objectives.OBJECTIVES["no-such-objective"]


def test_options_come_from_the_objectives_options_dataclasses():
    import dataclasses

    from fadat.objectives import OBJECTIVES, all_options
    from fadat.objectives.dat import FuzzyOptions, NLLOptions

    fuzzy = {o.name: o for o in OBJECTIVES["fuzzy"].options}
    assert list(fuzzy) == ["ngram_order", "dag_backend"]
    assert (fuzzy["ngram_order"].type, fuzzy["ngram_order"].default) == (int, 2)
    assert not fuzzy["ngram_order"].check(0) and fuzzy["ngram_order"].check(1)
    nll = {o.name: o for o in OBJECTIVES["nll"].options}
    assert nll["force_emit"].flag == "--no-force-emit"
    assert fuzzy["ngram_order"].flag == "--ngram-order"
    assert [o.name for o in OBJECTIVES["nat"].options] == []
    assert [o.name for o in all_options()] == [
        "force_emit",
        "dag_backend",
        "ngram_order",
        "label_smoothing",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        NLLOptions().force_emit = False
    assert FuzzyOptions(ngram_order=3).ngram_order == 3


def test_target_logprobs_blocks_are_larger_on_cuda():
    """On CUDA the row blocks hold up to CUDA_BLOCK_ELEMENTS logits (few large kernels: the
    256-row CPU blocks were launch-bound on an H100); on the CPU ``block`` is kept. A stand-in
    object plays the CUDA tensor (only ``is_cuda`` and the shape are read)."""
    from fadat.objectives import losses

    cpu = torch.empty(2, 3, 4000)
    assert losses._rows_per_block(cpu, 256) == 256

    class FakeCuda:
        is_cuda = True
        shape = (117, 280, 4000)

    assert losses._rows_per_block(FakeCuda(), 256) == 2**27 // 4000 == 33554
    FakeCuda.shape = (2, 3, 10**9)  # a vocabulary beyond the budget: the given block stays
    assert losses._rows_per_block(FakeCuda(), 256) == 256
