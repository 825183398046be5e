"""Tests of ``fadat analyze`` and ``fadat show-graph``: the numbers behind the tables and
pictures against brute-force enumeration of DAG paths, and the verbs end to end on a tiny
randomly initialised model with a tiny sentencepiece model."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from itertools import pairwise
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from brute_dag import all_paths, path_prob
from brute_dag import passing as brute_passing

from fadat.evaluation.analysis import path_statistics, vertex_confidence, vertex_density
from fadat.evaluation.scoring import bucket_labels, length_buckets, reference_lengths
from fadat.evaluation.show_graph import graph_view

# ---------------------------------------------------------------------------------------------
# Brute force over every path of small graphs


def random_graph(
    graph_lengths: list[int], vocab: int = 5, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``(token_logprobs (B, L, V), links (B, L, L), graph_lengths (B,))`` with the model's
    layout: transitions strictly forward within ``L_b``, rows without a successor all −inf."""
    gen = torch.Generator().manual_seed(seed)
    batch, size = len(graph_lengths), max(graph_lengths)
    lengths = torch.tensor(graph_lengths)
    token_logprobs = torch.log_softmax(2 * torch.randn(batch, size, vocab, generator=gen), -1)
    scores = 2 * torch.randn(batch, size, size, generator=gen)
    i = torch.arange(size)[:, None]
    j = torch.arange(size)[None, :]
    valid = (j > i)[None] & (j[None] < lengths[:, None, None])  # (B, L, L)
    links = torch.log_softmax(scores.masked_fill(~valid, -math.inf), dim=-1)
    links = torch.nan_to_num(links, nan=-math.inf)  # rows with no valid j
    return token_logprobs, links, lengths


def brute_marginal(token_logprobs, links, size, tokens) -> float:
    """P(y|x) = Σ over paths with len(y) vertices of P(a|x) Π P(y_k|a_k)."""
    total = 0.0
    for path in all_paths(size):
        if len(path) == len(tokens):
            emit = sum(float(token_logprobs[v, t]) for v, t in zip(path, tokens, strict=True))
            total += path_prob(links, path) * math.exp(emit)
    return total


# ---------------------------------------------------------------------------------------------
# Table 3: path statistics


def test_path_statistics_match_brute_force():
    token_logprobs, links, lengths = random_graph([6, 4, 7, 2], vocab=4, seed=1)
    gen = torch.Generator().manual_seed(2)
    hyps = []
    for size in lengths.tolist():
        paths = all_paths(size)
        path = paths[int(torch.randint(len(paths), (1,), generator=gen))]
        tokens = torch.randint(4, (len(path),), generator=gen).tolist()
        hyps.append(SimpleNamespace(path=path, path_tokens=tokens))
    stats = path_statistics(token_logprobs, links, lengths, hyps)
    for b, hyp in enumerate(hyps):
        size = int(lengths[b])
        want_path = -math.log(path_prob(links[b], hyp.path))
        want_tokens = -sum(
            float(token_logprobs[b, v, t]) for v, t in zip(hyp.path, hyp.path_tokens, strict=True)
        )
        want_marginal = -math.log(
            brute_marginal(token_logprobs[b], links[b], size, hyp.path_tokens)
        )
        assert stats.path_nll[b].item() == pytest.approx(want_path, rel=1e-4, abs=1e-4)
        assert stats.token_nll[b].item() == pytest.approx(want_tokens, rel=1e-4, abs=1e-4)
        assert stats.marginal_nll[b].item() == pytest.approx(want_marginal, rel=1e-4, abs=1e-4)
        assert stats.lengths[b].item() == len(hyp.path)
    # P(y|x) sums P(y, a'|x) over every path a', so it is at least P(y, a|x).
    assert (stats.marginal_nll <= stats.path_nll + stats.token_nll + 1e-4).all()


def test_path_statistics_reject_bad_paths():
    token_logprobs, links, lengths = random_graph([5], seed=3)
    bad = [
        SimpleNamespace(path=[1, 4], path_tokens=[0, 2]),  # does not start at 0
        SimpleNamespace(path=[0, 3], path_tokens=[0, 2]),  # does not end at L-1
        SimpleNamespace(path=[0, 2, 2, 4], path_tokens=[0, 1, 1, 2]),  # not increasing
        SimpleNamespace(path=[0, 4], path_tokens=[0]),  # token count differs
    ]
    for hyp in bad:
        with pytest.raises(ValueError):
            path_statistics(token_logprobs, links, lengths, [hyp])
    with pytest.raises(ValueError):
        path_statistics(token_logprobs, links, lengths, [])


# ---------------------------------------------------------------------------------------------
# Figure 1: vertex confidence and density


def test_vertex_confidence_is_dag_passing_probability():
    from fadat.dag import passing_probabilities

    token_logprobs, links, lengths = random_graph([5, 3, 6], vocab=6, seed=4)
    passing, max_token = vertex_confidence(token_logprobs, links, lengths)
    assert passing.shape == max_token.shape == (int(lengths.sum()),)
    dag_passing = passing_probabilities(links, lengths)
    want_passing, want_max = [], []
    for b, size in enumerate(lengths.tolist()):
        want_passing += dag_passing[b, :size].tolist()
        want_max += [float(token_logprobs[b, v].exp().max()) for v in range(size)]
        # and fadat.dag agrees with enumerating every path
        assert dag_passing[b, :size].tolist() == pytest.approx(
            brute_passing(links[b], size).tolist(), abs=1e-5
        )
    assert passing.tolist() == want_passing
    assert max_token.tolist() == pytest.approx(want_max, abs=1e-6)


def test_vertex_density_counts_every_vertex_in_the_right_bin():
    passing = np.array([0.0, 1.0, 1.0000002, 0.49, 0.51, 0.02])
    max_token = np.array([1.0, 0.99, 1.0, 0.5, 0.5, 0.97])
    counts, x_edges, y_edges = vertex_density(passing, max_token, bins=2)
    assert counts.sum() == len(passing)  # 1.0000002 is clipped in, not dropped
    assert x_edges.tolist() == y_edges.tolist() == [0.0, 0.5, 1.0]
    # [passing bin, token bin]: (0.0,1.0),(0.02,0.97) low/high; (0.49,0.5) low/high;
    # (1.0,.99),(1.0,1.0),(0.51,0.5) high/high
    assert counts.tolist() == [[0, 3], [0, 3]]


# ---------------------------------------------------------------------------------------------
# Table 5: length buckets


def test_length_buckets_edges():
    lengths = [0, 19, 20, 39, 40, 59, 60, 200]
    assert length_buckets(lengths) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert bucket_labels() == ["< 20", "20-40", "40-60", ">= 60"]
    with pytest.raises(ValueError):
        length_buckets([1], edges=(20, 20))


def test_reference_lengths_count_13a_tokens():
    assert reference_lengths(["Hello, world.", "", "a b  c"]) == [4, 0, 3]


# ---------------------------------------------------------------------------------------------
# show-graph: the selected vertices and edges


def test_graph_view_numbers():
    token_logprobs, links, lengths = random_graph([7], vocab=6, seed=6)
    tlp, lk = token_logprobs[0], links[0]
    path = [0, 2, 5, 6]
    view = graph_view(tlp, lk, path, top_k=2, min_passing=0.3, min_flow=0.2)
    brute = brute_passing(lk, 7).tolist()
    want_vertices = sorted({v for v in range(7) if brute[v] >= 0.3} | set(path))
    assert view.vertices == want_vertices
    assert view.passing == pytest.approx([brute[v] for v in want_vertices], abs=1e-5)
    for i, j, flow in view.edges:
        assert i < j and i in view.vertices and j in view.vertices
        # flow = probability that a path uses the edge, by enumeration
        used = sum(
            path_prob(lk, p) for p in all_paths(7) if any(a == i and b == j for a, b in pairwise(p))
        )
        assert flow == pytest.approx(used, abs=1e-5)
    drawn = {(i, j) for i, j, _ in view.edges}
    assert set(pairwise(path)) <= drawn
    for v in view.vertices:  # nothing hangs loose
        assert v == 0 or any(j == v for _, j in drawn)
        assert v == 6 or any(i == v for i, _ in drawn)
    flows = [f for _, _, f in view.edges]
    assert flows == sorted(flows, reverse=True)
    for v, tops in zip(view.vertices, view.top_tokens, strict=True):
        probs = tlp[v].exp()
        assert [t for t, _ in tops] == probs.argsort(descending=True)[:2].tolist()
        assert [p for _, p in tops] == pytest.approx(
            probs.sort(descending=True).values[:2].tolist()
        )
    with pytest.raises(ValueError):
        graph_view(tlp, lk, [0, 3])


def test_graph_view_draws_other_paths():
    token_logprobs, links, _ = random_graph([7], vocab=6, seed=6)
    tlp, lk = token_logprobs[0], links[0]
    # thresholds of 1: only the endpoints and the given paths' vertices and edges qualify
    view = graph_view(tlp, lk, [0, 2, 6], min_passing=1.0, min_flow=1.0, other_paths=[[0, 1, 4, 6]])
    assert view.vertices == [0, 1, 2, 4, 6]
    assert view.path == [0, 2, 6]
    drawn = {(i, j) for i, j, _ in view.edges}
    assert {(0, 2), (2, 6), (0, 1), (1, 4), (4, 6)} <= drawn
    with pytest.raises(ValueError):
        graph_view(tlp, lk, [0, 2, 6], other_paths=[[0, 4, 2, 6]])


# ---------------------------------------------------------------------------------------------
# End to end: a prepared tiny corpus, two randomly initialised tiny DAT models

WORDS = "the cat dog sat on a mat and ran to house big small red blue green".split()
# Reference lengths that fill every bucket of Table 5 (< 20, 20-40, 40-60, >= 60 tokens).
TEST_LENGTHS = [3, 5, 8, 12, 19, 20, 25, 33, 39, 40, 47, 59, 60, 61]


def sentences(lengths: list[int], seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=n)) for n in lengths]


def write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A `fadat prepare`d directory (test split of 14 pairs) and two tiny DAT model directories."""
    from fadat.cli import main
    from fadat.models.config import make_config
    from fadat.models.dat import DATModel

    root = tmp_path_factory.mktemp("analysis")
    rng = np.random.default_rng(0)
    train = sentences([int(n) for n in rng.integers(2, 12, size=200)], 1)
    # Short sources keep the graphs small; the references' lengths fill the buckets.
    test = sentences([int(n) for n in rng.integers(2, 7, size=len(TEST_LENGTHS))], 2)
    refs = [s.upper() for s in sentences(TEST_LENGTHS, 3)]
    data = root / "data"
    argv = [
        "prepare",
        "--source-file", write(root / "train.en", train),
        "--target-file", write(root / "train.xx", [s.upper() for s in train]),
        "--test-source-file", write(root / "test.en", test),
        "--test-target-file", write(root / "test.xx", refs),
        "--source-lang", "en", "--target-lang", "xx", "--vocab-size", "100",
        "--output", str(data),
    ]  # fmt: skip
    assert main(argv) == 0
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = DATModel(make_config("tiny", 100))
        directory = root / f"model{seed}"
        model.save_pretrained(directory, spm_model=data / "spm.model")
        models.append(directory)
    return SimpleNamespace(data=data, models=models, test=test, root=root)


def single_sentence_outputs(model, sp, sentences_):
    """Model outputs one sentence at a time (no batching, no padding)."""
    from fadat.data.spm import encode_source

    for sentence in sentences_:
        source = torch.tensor([encode_source(sp, sentence)])
        graph_lengths = model.graph_lengths(torch.tensor([source.shape[1]]), decoding=True)
        with torch.inference_mode():
            token_logprobs, links = model(source, graph_lengths)
        yield token_logprobs, links, graph_lengths


def test_analyze_numbers_match_direct_computation(setup):
    from fadat.dag import passing_probabilities
    from fadat.decoding import decode
    from fadat.evaluation.analysis import analyze_model, load_dat_model, plot_vertex_density
    from fadat.evaluation.scoring import load_split

    sources, references = load_split(setup.data, "test", 0)
    model, sp = load_dat_model(setup.models[0])
    strategies = ["greedy", "lookahead", "joint-viterbi"]
    report = analyze_model(model, sp, "m0", sources, references, "xx", strategies=strategies)
    assert report.sentences == report.analysed == len(setup.test)

    # Figure 1's input is fadat.dag's passing probability of every vertex (batching aside).
    direct_passing, direct_max, stats = [], [], {s: [] for s in strategies}
    for token_logprobs, links, graph_lengths in single_sentence_outputs(model, sp, sources):
        size = int(graph_lengths[0])
        direct_passing += passing_probabilities(links, graph_lengths)[0, :size].tolist()
        direct_max += token_logprobs[0, :size].exp().max(-1).values.tolist()
        for strategy in strategies:
            hyps = decode(token_logprobs, links, graph_lengths, strategy)
            s = path_statistics(token_logprobs, links, graph_lengths, hyps)
            # −log P(y|x) ≤ −log P(y, a|x) for y = the decoded path's tokens
            assert s.marginal_nll[0] <= s.path_nll[0] + s.token_nll[0] + 1e-4
            stats[strategy].append(s)
    assert len(report.passing) == len(direct_passing)
    np.testing.assert_allclose(np.sort(report.passing), np.sort(direct_passing), atol=1e-5)
    np.testing.assert_allclose(np.sort(report.max_token), np.sort(direct_max), atol=1e-5)
    counts = plot_vertex_density([("m0", report.passing, report.max_token)], setup.root / "d.png")
    want, _, _ = np.histogram2d(
        np.clip(direct_passing, 0, 1), np.clip(direct_max, 0, 1), bins=50, range=[[0, 1], [0, 1]]
    )
    assert np.abs(counts[0] - want).sum() <= 2  # at most one vertex moved across a bin edge
    assert counts[0].sum() == len(direct_passing)

    # Table 3 means are the means of the per-sentence statistics.
    for strategy in strategies:
        row = report.strategies[strategy]
        for attr in ("path_nll", "token_nll", "marginal_nll"):
            want_mean = float(torch.cat([getattr(s, attr) for s in stats[strategy]]).mean())
            assert getattr(row, attr) == pytest.approx(want_mean, rel=1e-3)
        assert row.marginal_nll <= row.path_nll + row.token_nll

    # Table 5: bucket counts add up to the test set and follow the reference lengths.
    assert sum(b["count"] for b in report.buckets) == len(setup.test)
    buckets = length_buckets(reference_lengths(references[0]))
    assert [b["count"] for b in report.buckets] == [buckets.count(k) for k in range(4)]
    assert [b["count"] for b in report.buckets] == [5, 4, 3, 2]


def test_analyze_cli_writes_tables_figure_and_json(setup, tmp_path, capsys):
    import json

    from matplotlib.image import imread

    from fadat.cli import main

    out = tmp_path / "out"
    argv = [
        "analyze", "--model", *map(str, setup.models), "--names", "DA-T", "FA-DAT",
        "--data", str(setup.data), "--split", "test", "--strategies", "greedy,lookahead",
        "-o", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| DA-T | greedy |" in printed and "| FA-DAT | lookahead |" in printed
    assert "| >= 60 |" in printed
    image = imread(out / "vertex_density.png")
    # two side-by-side panels: wider than high
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 1.5 * image.shape[0]
    summary = json.loads((out / "analysis.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["DA-T", "FA-DAT"]
    for m in summary["models"]:
        assert sum(b["count"] for b in m["buckets"]) == len(setup.test)
        assert set(m["strategies"]) == {"greedy", "lookahead"}
        for row in m["strategies"].values():
            assert row["marginal_nll"] <= row["path_nll"] + row["token_nll"]


def test_show_graph_png_and_svg(setup, tmp_path, capsys):
    from matplotlib.image import imread

    from fadat.cli import main

    png, svg = tmp_path / "graph.png", tmp_path / "graph.svg"
    sentence = "the cat sat on a mat"
    assert main(["show-graph", "--model", str(setup.models[0]), sentence, "-o", str(png)]) == 0
    image = imread(png)
    assert image.ndim == 3 and min(image.shape[:2]) > 100
    argv = ["show-graph", "--model", str(setup.models[0]), sentence, "-o", str(svg),
            "--strategy", "greedy", "--top-k", "2"]  # fmt: skip
    assert main(argv) == 0
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert "graph:" in capsys.readouterr().out


def test_show_graph_from_python_draws_what_the_cli_draws(setup, tmp_path, capsys):
    """:func:`fadat.evaluation.show_graph.show_graph` with keyword arguments: the picture and the
    translation of ``fadat show-graph`` with the same flags, the path of the strategy's decode."""
    from matplotlib.image import imread

    from fadat.cli import main
    from fadat.decoding import decode
    from fadat.errors import InputError
    from fadat.evaluation.analysis import load_dat_model, model_outputs
    from fadat.evaluation.show_graph import GraphPicture, show_graph

    sentence = "the cat sat on a mat"
    cli_png, py_png = tmp_path / "cli.png", tmp_path / "py.png"
    argv = ["show-graph", "--model", str(setup.models[1]), sentence, "-o", str(cli_png),
            "--strategy", "lookahead", "--beta", "0.5", "--top-k", "2",
            "--min-flow", "0.1"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    picture = show_graph(
        setup.models[1],
        sentence,
        py_png,
        strategy="lookahead",
        options={"beta": 0.5},
        top_k=2,
        min_flow=0.1,
    )
    assert isinstance(picture, GraphPicture) and picture.output == py_png
    assert printed == [picture.translation, f"graph: {cli_png}"]
    assert (imread(py_png) == imread(cli_png)).all()
    model, sp = load_dat_model(setup.models[1])
    ((_, token_logprobs, links, graph_lengths),) = model_outputs(model, sp, [sentence])
    (hyp,) = decode(token_logprobs, links, graph_lengths, "lookahead", beta=0.5)
    assert picture.view.path == hyp.path and picture.size == int(graph_lengths[0])
    assert all(len(tops) == 2 for tops in picture.view.top_tokens)
    # Checked before any work, as on the command line; nothing is written.
    with pytest.raises(InputError, match="does not take --beam-size"):
        show_graph(setup.models[1], sentence, tmp_path / "x.png", options={"beam_size": 3})
    with pytest.raises(InputError, match=r"--top-k must be in \[1, 50\]"):
        show_graph(setup.models[1], sentence, tmp_path / "x.png", top_k=0)
    with pytest.raises(InputError, match="sentence is empty"):
        show_graph(setup.models[1], "  ", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["show-graph", "--model", "MISSING", "a b", "-o", "g.png"], "does not exist"),
        (["show-graph", "--model", "MODEL", "   ", "-o", "g.png"], "sentence is empty"),
        (["show-graph", "--model", "MODEL", "a b", "-o", "g.jpg"], ".png or .svg"),
        (["show-graph", "--model", "MODEL", "a b", "-o", "g.png", "--strategy", "x"], "'x'"),
        (["analyze", "--model", "MISSING", "--data", "DATA"], "does not exist"),
        (["analyze", "--model", "MODEL", "--data", "DATA", "--split", "nope"], "missing"),
        (["analyze", "--model", "MODEL", "--data", "DATA", "--strategies", "x"], "'x'"),
        (["analyze", "--model", "MODEL", "MODEL", "--names", "a", "a", "--data", "DATA"], "differ"),
    ],
)
def test_bad_input_exits_2_with_one_line(setup, tmp_path, capsys, argv_tail, message):
    from fadat.cli import main

    replace = {
        "MISSING": str(tmp_path / "missing"),
        "MODEL": str(setup.models[0]),
        "DATA": str(setup.data),
    }
    argv = [replace.get(a, a) for a in argv_tail]
    argv = [str(tmp_path / a) if a.startswith("g.") else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fadat: error:") and message in err[0]
