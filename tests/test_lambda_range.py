"""Tests of training over a range of λ (issue 44, item 1; DA-Transformer v2's ``--upsample-scale
a~b``): the per-sentence draws (:func:`fadat.data.contract.uniform_draws`,
:func:`fadat.data.contract.drawn_graph_size`) follow the range and the seed, graphs are never
smaller than their target, the DAG objectives and glancing take per-sentence sizes padded to
``max_b L_b``, the token budget counts the range's top, the config and flags reach the model, and a
fixed λ is what it was. The resume test is in tests/test_train.py."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from fadat.data.contract import (
    drawn_graph_size,
    graph_size,
    make_batch,
    uniform_draws,
)
from fadat.errors import InputError
from fadat.models.config import ModelConfig, make_config
from fadat.models.dat import DATModel
from fadat.objectives import ObjectiveConfig, compute_loss

# ------------------------------------------------------------------------------ the draws


def test_draws_are_a_pure_function_of_seed_update_and_sentence():
    ids = torch.arange(500)
    first = uniform_draws(7, 12, ids)
    assert first.dtype == torch.float64 and first.shape == (500,)
    assert torch.equal(first, uniform_draws(7, 12, ids))  # same key, same draws
    perm = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    assert torch.equal(uniform_draws(7, 12, perm), first[perm])  # batch order is irrelevant
    for other in (uniform_draws(8, 12, ids), uniform_draws(7, 13, ids)):
        # another seed or update: unrelated numbers (equal only by chance, 2^-53 each)
        assert not torch.isclose(other, first).any()
    assert len(set(first.tolist())) == 500
    # pinned values: a change of the hash would silently change every range-trained run
    assert uniform_draws(1, 0, [0, 1, 2]).tolist() == [
        0.6935121390102292,
        0.42321144819582723,
        0.11309113019536587,
    ]
    with pytest.raises(ValueError, match=">= 0"):
        uniform_draws(1, -1, [0])


def test_draws_are_uniform_in_the_unit_interval():
    """Kolmogorov–Smirnov and χ² against U[0, 1) on 20,000 draws of one (seed, update) and on
    20,000 draws of one sentence over updates (fixed seeds: deterministic)."""
    n = 20_000
    for u in (
        uniform_draws(3, 5, torch.arange(n)).numpy(),
        np.array([float(uniform_draws(3, k, [17])[0]) for k in range(n)]),
    ):
        assert u.min() >= 0.0 and u.max() < 1.0
        xs = np.sort(u)
        grid = np.arange(1, n + 1) / n
        ks = max(np.max(grid - xs), np.max(xs - (grid - 1 / n)))
        assert ks < 1.95 / math.sqrt(n)  # the 0.1 % critical value
        counts = np.histogram(u, bins=20, range=(0.0, 1.0))[0]
        chi2 = float(((counts - n / 20) ** 2 / (n / 20)).sum())
        assert chi2 < 43.8  # χ²(19) 0.1 % critical value


def test_drawn_sizes_follow_the_range():
    """λ_b = a + u_b (b − a) and L_b = int(λ_b n_b): with long sources (n = 1000, no clip) the
    implied λ_b = L_b / n_b covers [a, b] uniformly (mean (a + b) / 2, spread (b − a)/√12)."""
    n = 10_000
    src = torch.full((n,), 1000)
    tgt = torch.full((n,), 3)
    u = uniform_draws(11, 0, torch.arange(n))
    sizes = drawn_graph_size(src, tgt, (2.0, 6.0), u)
    assert sizes.dtype == torch.int64
    assert torch.equal(sizes, (1000 * (2.0 + 4.0 * u)).floor().long())
    ratio = sizes.double() / 1000
    assert ratio.min() >= 2.0 and ratio.max() < 6.0
    assert abs(float(ratio.mean()) - 4.0) < 4 * (4 / math.sqrt(12)) / math.sqrt(n)
    assert float(ratio.std()) == pytest.approx(4 / math.sqrt(12), rel=0.03)
    quarters = np.histogram(ratio.numpy(), bins=4, range=(2.0, 6.0))[0]
    assert (abs(quarters - n / 4) < 4 * math.sqrt(n * 0.25 * 0.75)).all()


def test_graphs_are_never_smaller_than_the_target():
    """A drawn size below T_b is raised to T_b (the fewest vertices a path of T_b tokens needs);
    a target longer than the decoder's positions stays too long (clipped at max_positions)."""
    src = torch.tensor([5, 5, 5, 5, 10, 2])
    tgt = torch.tensor([3, 12, 21, 40, 30, 2])
    u = torch.tensor([0.0, 0.5, 0.99, 0.3, 0.0, 0.0], dtype=torch.float64)
    sizes = drawn_graph_size(src, tgt, (2.0, 4.0), u, max_positions=32)
    # int(λ n): 10, 15, 19, 13, 20, 4 → raised to T where smaller → clipped to 32
    assert sizes.tolist() == [10, 15, 21, 32, 30, 4]
    assert (sizes >= torch.minimum(tgt, torch.tensor(32))).all()
    many = drawn_graph_size(
        torch.randint(1, 30, (2000,)),
        torch.randint(2, 120, (2000,)),
        (1.0, 3.0),
        uniform_draws(1, 0, torch.arange(2000)),
    )
    assert (many >= 2).all()
    for bad in ((0.0, 2.0), (3.0, 2.0)):
        with pytest.raises(ValueError, match="0 < a <= b"):
            drawn_graph_size(src, tgt, bad, u)


def test_a_one_point_range_is_the_fixed_lambda_where_targets_fit():
    src = torch.arange(1, 60)
    tgt = torch.full_like(src, 2)
    u = uniform_draws(4, 9, torch.arange(len(src)))
    fixed = graph_size(src, 4.0, max_positions=100)
    assert torch.equal(drawn_graph_size(src, tgt, (4.0, 4.0), u, max_positions=100), fixed)


# ------------------------------------------------------------------------------ the model


def _model(ratio_range=(2.0, 6.0), **overrides) -> DATModel:
    torch.manual_seed(0)
    config = make_config(
        "tiny", 12, upsample_ratio_range=ratio_range, dropout=0.0, copy_source=True, **overrides
    )
    return DATModel(config)


def _pairs():
    sources = [[4, 5, 6, 2], [7, 2], [4, 4, 5, 6, 7, 8, 2], [5, 6, 7, 2]]
    targets = [[0, 4, 5, 6, 2], [0, 7, 8, 9, 10, 11, 2], [0, 4, 2], [0, 5, 6, 7, 8, 2]]
    return sources, targets


def test_a_range_model_draws_each_sentence_and_a_fixed_one_does_not():
    sources, targets = _pairs()
    batch = make_batch(sources, targets, [10, 11, 12, 13])
    model = _model()
    sizes = model.training_graph_lengths(batch, seed=3, update=7)
    expected = drawn_graph_size(
        batch.source_lengths,
        batch.target_lengths,
        (2.0, 6.0),
        uniform_draws(3, 7, [10, 11, 12, 13]),
        model.config.max_target_positions,
    )
    assert torch.equal(sizes, expected)
    assert (sizes >= batch.target_lengths).all()
    ratios = 2.0 + 4.0 * uniform_draws(3, 7, [10, 11, 12, 13])
    by_lambda = (batch.source_lengths * ratios).floor().long()  # int(λ_b n_b)
    assert torch.equal(sizes, torch.maximum(by_lambda, batch.target_lengths))
    fixed = DATModel(make_config("tiny", 12))
    assert fixed.training_graph_lengths(batch, 3, 7) is None
    assert fixed.length_budget() == (4.0, 256)
    assert model.length_budget() == (6.0, 256)  # the range's top bounds every drawn size


def _per_sentence_losses(model, batch, objective):
    losses = []
    for b in range(len(batch)):
        one = make_batch(
            [batch.source[b, : batch.source_lengths[b]].tolist()],
            [batch.target[b, : batch.target_lengths[b]].tolist()],
            [int(batch.ids[b])],
        )
        one = dataclasses.replace(one, graph_lengths=batch.graph_lengths[b : b + 1])
        losses.append(float(compute_loss(model, one, objective).loss_sum))
    return losses


@pytest.mark.parametrize("objective", ["nll", "fuzzy"])
def test_per_sentence_graphs_padded_to_the_longest_give_each_sentences_own_loss(objective):
    """A batch whose rows have drawn sizes (padded to L = max_b L_b) gives the sum of the losses
    of each sentence alone on its own graph: the padding vertices take no part. And the step
    uses the drawn sizes, not the fixed λ's (another loss)."""
    sources, targets = _pairs()
    model = _model().eval()  # no dropout
    batch = make_batch(sources, targets, [0, 1, 2, 3])
    sizes = model.training_graph_lengths(batch, seed=1, update=0)
    drawn = dataclasses.replace(batch, graph_lengths=sizes)
    assert len(set(sizes.tolist())) > 1  # rows of different sizes: padding is exercised
    settings = ObjectiveConfig(objective, 0.0)
    with torch.no_grad():
        total = compute_loss(model, drawn, settings)
        alone = _per_sentence_losses(model, drawn, settings)
        fixed = compute_loss(model, batch, settings)
    assert float(total.loss_sum) == pytest.approx(sum(alone), rel=1e-5, abs=1e-5)
    assert total.stats["invalid_too_long"] == 0
    assert float(fixed.loss_sum) != pytest.approx(float(total.loss_sum), rel=1e-4)


def test_glancing_with_drawn_sizes_glances_only_real_vertices():
    from fadat.objectives.glancing import glance

    sources, targets = _pairs()
    model = _model().train()
    batch = make_batch(sources, targets, [0, 1, 2, 3])
    sizes = model.training_graph_lengths(batch, seed=2, update=5)
    torch.manual_seed(0)
    result = glance(
        model, model.encode(batch.source), batch.target, sizes, batch.target_lengths, 0.9, 123
    )
    width = int(sizes.max())
    assert result.decoder_tokens.shape == (4, width)
    real = torch.arange(width)[None, :] < sizes[:, None]  # (B, L)
    assert not (result.glanced & ~real).any()
    assert ((result.path >= 0).sum(1) == batch.target_lengths).all()  # one vertex per token
    assert (result.decoder_tokens[~real] == 1).all()  # padding stays <pad>
    assert (result.num_glanced > 0).any()


def test_the_trainer_step_reads_the_drawn_sizes(monkeypatch):
    """nll's forward sizes the graph with ``batch.graph_lengths`` when set, else with the fixed
    λ of the model (the behaviour of every fixed-λ run)."""
    from fadat.objectives import dat as dat_objective

    sources, targets = _pairs()
    model = _model().eval()
    batch = make_batch(sources, targets, [0, 1, 2, 3])
    seen = []
    real = model.links_head.forward

    def record(states, graph_lengths):
        seen.append(graph_lengths.clone())
        return real(states, graph_lengths)

    monkeypatch.setattr(model.links_head, "forward", record)
    sizes = model.training_graph_lengths(batch, 1, 0)
    with torch.no_grad():
        dat_objective.forward(model, dataclasses.replace(batch, graph_lengths=sizes), 0.0)
        dat_objective.forward(model, batch, 0.0)
    assert torch.equal(seen[0], sizes)
    assert torch.equal(seen[1], graph_size(batch.source_lengths, 4.0, 256))


# ------------------------------------------------------------------------------ config


def test_model_config_range_round_trips_and_is_checked(tmp_path):
    config = make_config("tiny", 12, upsample_ratio_range=[2, 6])
    assert config.upsample_ratio_range == (2.0, 6.0)
    d = config.to_dict()
    assert d["upsample_ratio_range"] == [2.0, 6.0]
    assert ModelConfig.from_dict(json.loads(json.dumps(d))) == config
    # a fixed-λ config.json is what earlier versions wrote (and read)
    assert "upsample_ratio_range" not in make_config("tiny", 12).to_dict()
    model = DATModel(config)
    model.save_pretrained(tmp_path / "m")
    assert DATModel.from_pretrained(tmp_path / "m").config.upsample_ratio_range == (2.0, 6.0)
    for bad, match in [
        ([6, 2], "0 < a <= b"),
        ([0, 2], "0 < a <= b"),
        ([2, 4, 6], "wrong type"),
        (["2", "4"], "wrong type"),
        ([2, float("nan")], "finite"),
    ]:
        with pytest.raises(InputError, match=match):
            make_config("tiny", 12, upsample_ratio_range=bad)
    with pytest.raises(InputError, match="'dat' only"):
        make_config("tiny", 12, model_type="at", upsample_ratio_range=[2, 6])


def test_flag_yaml_and_init_from_set_the_range(tmp_path):
    import argparse

    from fadat.cli.train import add_arguments, resolve_config
    from fadat.training.config import TrainConfig, validate_config
    from fadat.training.model_init import build_model

    def parse(argv):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return parser.parse_args(argv)

    argv = ["--data", "D", "--run-dir", "R", "--max-updates", "1"]
    cfg, _ = resolve_config(parse([*argv, "--upsample-ratio-range", "2", "6"]))
    assert cfg.upsample_ratio_range == (2.0, 6.0)
    model = build_model(cfg, 12)
    assert model.config.upsample_ratio_range == (2.0, 6.0) and model.config.upsample_ratio == 4.0
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("upsample_ratio_range: [3, 5]\nmax_updates: 1\n")
    cfg, _ = resolve_config(parse(["--data", "D", "--run-dir", "R", "--config", str(yaml_file)]))
    assert build_model(cfg, 12).config.upsample_ratio_range == (3.0, 5.0)
    # a fine-tune keeps the range of its --init-from model unless the flag changes it
    model.save_pretrained(tmp_path / "m")
    init = dict(data="d", run_dir="r", init_from=str(tmp_path / "m"))
    assert build_model(TrainConfig(**init), 12).config.upsample_ratio_range == (2.0, 6.0)
    tuned = build_model(TrainConfig(**init, upsample_ratio_range=(4.0, 8.0)), 12)
    assert tuned.config.upsample_ratio_range == (4.0, 8.0)
    for bad in (["6", "2"], ["0", "2"]):
        with pytest.raises(InputError, match="upsample-ratio-range"):
            resolve_config(parse([*argv, "--upsample-ratio-range", *bad]))
    with pytest.raises(InputError, match="applies to --arch dat"):
        resolve_config(parse([*argv, "--arch", "at", "--upsample-ratio-range", "2", "6"]))
    fixed = TrainConfig(data="d", run_dir="r", max_updates=1)
    validate_config(fixed)
    assert fixed.upsample_ratio_range == ()
    assert build_model(fixed, 12).config.upsample_ratio_range is None
