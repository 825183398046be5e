"""``fadat show-graph``: draw the directed acyclic graph behind one translation.

Each drawn vertex is a box listing its most probable tokens with their probabilities; its fill
colour gives its passing probability (the probability that a path drawn from the transitions visits
it, :func:`fadat.dag.passing_probabilities`). Drawn edges are the strongest transitions, ranked by
their *flow* ``P(pass i) · E[i, j]`` (the probability that a random path uses the edge), and the
decoded path is highlighted in red. This is the picture of DA-Transformer's graph demo
(docs/reference-behaviour.md, "Evaluation" "Visualisation": per-vertex passing probability, top-5
tokens, transition matrix, the vertices chosen for the output), laid out with networkx's layered
layout (``multipartite_layout`` over topological generations; networkx comes with torch) and drawn
with matplotlib (Agg backend); ``.png`` and ``.svg`` outputs.

:func:`graph_view` holds the numbers (tested); :func:`draw_graph` only draws them.
Only run on CPU; the code is device-agnostic but CUDA was not run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from fadat import outputs
from fadat.cli.common import add_decoding_arguments, add_force_argument, add_upsample_argument
from fadat.errors import InputError
from fadat.options import int_range, probability

SUFFIXES = (".png", ".svg")
#: The most tokens ``--top-k`` lists per vertex: each is a line of the vertex's label, and
#: graphviz took 40 s to lay out a graph with ``--top-k 1000000`` (every token of the vocabulary).
MAX_TOP_K = 50


@dataclass(frozen=True)
class GraphView:
    """What :func:`draw_graph` draws, for one sentence.

    Attributes:
        vertices: drawn vertex ids, increasing (always includes 0, ``L−1`` and the path).
        passing: passing probability of each drawn vertex (same order as ``vertices``).
        top_tokens: per drawn vertex, its ``top_k`` ``(token id, probability)`` pairs, most
            probable first.
        edges: drawn transitions ``(i, j, flow)`` with ``flow = P(pass i) · E[i, j]``, strongest
            first.
        path: the decoded vertex path (``0 … L−1``).
    """

    vertices: list[int]
    passing: list[float]
    top_tokens: list[list[tuple[int, float]]]
    edges: list[tuple[int, int, float]]
    path: list[int]


def graph_view(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    path: Sequence[int],
    top_k: int = 3,
    min_passing: float = 0.05,
    min_flow: float = 0.05,
    other_paths: Sequence[Sequence[int]] = (),
) -> GraphView:
    """Select the vertices and transitions worth drawing for one sentence.

    Drawn vertices: every vertex with passing probability ``≥ min_passing``, plus the start, end
    and decoded-path vertices (of ``path`` and of every path in ``other_paths``). Drawn edges
    between drawn vertices: every transition with flow ``≥ min_flow``, every edge of those
    paths, and, so that no drawn vertex hangs loose, each drawn vertex's strongest incoming and
    outgoing transition among drawn vertices.

    Args:
        token_logprobs: ``(L, V)`` float32 token log-probabilities of one sentence's graph (no
            padding vertices).
        links: ``(L, L)`` float32 ``log E`` of that graph.
        path: decoded vertex path, ``0 … L−1``, increasing.
        top_k: tokens listed per vertex.
        min_passing: passing-probability threshold for drawing a vertex.
        min_flow: flow threshold for drawing an edge.
        other_paths: further paths of the graph to draw (e.g. other strategies' choices); checked
            like ``path``. ``GraphView.path`` stays ``path``.

    Returns:
        :class:`GraphView`.

    Raises:
        ValueError: shapes disagree, or ``path`` is not a path of the graph.
    """
    from fadat.dag import passing_probabilities

    size = links.shape[-1]
    if links.shape != (size, size) or token_logprobs.shape[0] != size:
        raise ValueError(
            f"expected links (L, L) and token_logprobs (L, V), got {tuple(links.shape)} "
            f"and {tuple(token_logprobs.shape)}"
        )
    path = [int(v) for v in path]
    paths = [path, *([int(v) for v in other] for other in other_paths)]
    for each in paths:
        if len(each) < 2 or each[0] != 0 or each[-1] != size - 1:
            raise ValueError(f"path must run from vertex 0 to {size - 1}: {each}")
        if any(nxt <= cur for cur, nxt in pairwise(each)):
            raise ValueError(f"path vertices must increase: {each}")
    links = links.float().cpu()
    lengths = torch.tensor([size])
    passing = passing_probabilities(links[None], lengths)[0]  # (L,)
    flow = passing[:, None] * links.exp()  # (L, L): P(path uses i -> j)
    drawn = passing >= min_passing  # (L,)
    for each in paths:
        drawn[torch.tensor(each)] = True
    drawn[0] = drawn[size - 1] = True
    vertices = torch.nonzero(drawn).flatten()  # (K,)
    sub = flow[vertices][:, vertices]  # (K, K)
    keep = sub >= min_flow  # (K, K)
    # Strongest incoming / outgoing edge of every drawn vertex (zero flow = no transition).
    keep[sub.argmax(0), torch.arange(len(vertices))] |= sub.max(0).values > 0
    keep[torch.arange(len(vertices)), sub.argmax(1)] |= sub.max(1).values > 0
    position = {int(v): k for k, v in enumerate(vertices)}
    for each in paths:
        for a, b in pairwise(each):
            keep[position[a], position[b]] = True
    rows, cols = torch.nonzero(keep, as_tuple=True)
    edges = [
        (int(vertices[r]), int(vertices[c]), float(sub[r, c]))
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True)
    ]
    edges.sort(key=lambda edge: -edge[2])
    top_p, top_id = token_logprobs[vertices].float().exp().topk(min(top_k, token_logprobs.shape[1]))
    return GraphView(
        vertices=[int(v) for v in vertices],
        passing=[float(passing[v]) for v in vertices],
        top_tokens=[
            [(int(t), float(p)) for t, p in zip(ids, probs, strict=True)]
            for ids, probs in zip(top_id.tolist(), top_p.tolist(), strict=True)
        ],
        edges=edges,
        path=path,
    )


def _piece_label(piece: str) -> str:
    # sentencepiece marks a word start with U+2581, which common fonts lack: show it as "_".
    return piece.replace("\u2581", "_")


def draw_graph(
    view: GraphView,
    piece: Callable[[int], str],
    output: str | Path,
    title: str = "",
) -> None:
    """Draw a :class:`GraphView` to ``output`` (``.png`` or ``.svg``) with matplotlib (Agg).

    Layout: networkx's multipartite layout over the topological generations of the drawn edges,
    so alternatives for the same output position stack vertically and the graph reads left to
    right.

    Args:
        view: from :func:`graph_view`.
        piece: maps a token id to its text (e.g. sentencepiece's ``id_to_piece``).
        output: file to write; its suffix chooses the format.
        title: figure title (e.g. source and translation).

    Raises:
        InputError: ``output`` has another suffix or cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = Path(output)
    if output.suffix.lower() not in SUFFIXES:
        raise InputError(f"{output}: output must end in .png or .svg")
    graph, positions, n_layers, n_rows = _layout(view)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * n_layers + 1.5), max(3.0, 1.0 * n_rows + 1.5)))
    _draw_edges(ax, graph, positions, view)
    cmap = plt.get_cmap("Blues")
    _draw_vertices(ax, positions, view, piece, cmap)
    scale = matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(0.0, 1.0), cmap=cmap)
    fig.colorbar(scale, ax=ax, fraction=0.03, pad=0.01, shrink=0.8, label="passing probability")
    ys = [y for _, y in positions.values()]
    if max(ys) - min(ys) < 1e-9:  # one row (a confident model): leave room for the boxes
        ax.set_ylim(min(ys) - 1.0, max(ys) + 1.0)
    else:
        ax.margins(x=0.04, y=0.15)
    ax.set_title(title, fontsize=9)
    ax.axis("off")
    fig.tight_layout()
    try:
        fig.savefig(output, dpi=110)
    except OSError as err:
        raise InputError(f"{output}: cannot write the picture: {err}") from err
    finally:
        plt.close(fig)


def _layout(view: GraphView) -> tuple[Any, dict[int, Any], int, int]:
    """The drawn graph (networkx ``DiGraph``, edge attribute ``flow``), its vertices' positions
    (multipartite layout over topological generations), and its numbers of columns and of
    rows in the fullest column."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(view.vertices)
    graph.add_weighted_edges_from(view.edges, weight="flow")
    for layer, members in enumerate(nx.topological_generations(graph)):
        for v in members:
            graph.nodes[v]["layer"] = layer
    positions = nx.multipartite_layout(graph, subset_key="layer", align="vertical")
    n_layers = 1 + max(graph.nodes[v]["layer"] for v in graph)
    n_rows = max(sum(1 for v in graph if graph.nodes[v]["layer"] == k) for k in range(n_layers))
    return graph, positions, n_layers, n_rows


def _draw_edges(ax: Any, graph: Any, positions: dict[int, Any], view: GraphView) -> None:
    """Grey edges, opacity and width by flow, then the drawn path's edges in red."""
    import networkx as nx

    path_edges = set(pairwise(view.path))
    other = [(i, j) for i, j, _ in view.edges if (i, j) not in path_edges]
    flows = {(i, j): f for i, j, f in view.edges}
    # node_size only tells the arrows where to stop: the vertices are drawn as text boxes.
    common = dict(ax=ax, connectionstyle="arc3,rad=0.12", node_size=2400)
    if other:
        nx.draw_networkx_edges(
            graph,
            positions,
            edgelist=other,
            edge_color="0.4",
            alpha=[0.3 + 0.7 * min(1.0, flows[e]) for e in other],
            width=[0.6 + 3.0 * flows[e] for e in other],
            arrowsize=8,
            **common,
        )
    nx.draw_networkx_edges(
        graph,
        positions,
        edgelist=sorted(path_edges),
        edge_color="tab:red",
        width=2.2,
        arrowsize=12,
        **common,
    )


def _draw_vertices(
    ax: Any,
    positions: dict[int, Any],
    view: GraphView,
    piece: Callable[[int], str],
    cmap: Any,
) -> None:
    """Each vertex as a text box (passing probability, top tokens) shaded by its passing
    probability; the path's vertices framed in red."""
    on_path = set(view.path)
    for v, pas, tops in zip(view.vertices, view.passing, view.top_tokens, strict=True):
        # Two decimals hide the small passing probabilities of alternative vertices.
        lines = [f"v{v}  p={pas:.2f}" if pas >= 0.01 or pas == 0 else f"v{v}  p={pas:.1e}"]
        lines += [f"{_piece_label(piece(t))} {p:.2f}" for t, p in tops]
        x, y = positions[v]
        ax.text(
            x,
            y,
            "\n".join(lines),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if pas > 0.55 else "black",
            bbox=dict(
                boxstyle="round,pad=0.35",
                facecolor=cmap(0.1 + 0.9 * pas),
                edgecolor="tab:red" if v in on_path else "0.35",
                linewidth=2.0 if v in on_path else 0.8,
            ),
            zorder=3,
        )


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat show-graph``."""
    parser.add_argument("sentence", help="the source sentence (raw text)")
    parser.add_argument("--model", required=True, metavar="DIR", help="DAT model directory")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="picture to write: FILE.png or FILE.svg",
    )
    add_force_argument(parser)
    parser.add_argument(
        "--strategy",
        default="lookahead",
        help="decoding strategy whose path is highlighted (default: lookahead)",
    )
    parser.add_argument(
        "--top-k",
        type=int_range(1, MAX_TOP_K, "the tokens listed in each vertex of the picture"),
        default=3,
        metavar="K",
        help=f"tokens listed per vertex (default: 3, at most {MAX_TOP_K})",
    )
    parser.add_argument(
        "--min-passing",
        type=probability,
        default=0.05,
        metavar="P",
        help="draw vertices with at least this passing probability (default: 0.05)",
    )
    parser.add_argument(
        "--min-flow",
        type=probability,
        default=0.05,
        metavar="P",
        help="draw transitions used by at least this share of paths (default: 0.05)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps")
    add_upsample_argument(parser)
    add_decoding_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``fadat show-graph``: translate one sentence and draw its graph."""
    from fadat.cli.common import decoding_options, stderr_warner
    from fadat.data.spm import decode as detokenize
    from fadat.decoding import decode
    from fadat.evaluation.analysis import load_dat_model, model_outputs
    from fadat.translation.pipeline import check_strategy

    if not args.sentence.strip():
        raise InputError("the source sentence is empty")
    # Before any work: the output can be written (fadat.outputs).
    outputs.check_output_file(args.output, "--output", [("--model", args.model)], args.force)
    if Path(args.output).suffix.lower() not in SUFFIXES:
        raise InputError(f"{args.output}: output must end in .png or .svg")
    if not 1 <= args.top_k <= MAX_TOP_K:
        raise InputError(f"--top-k must be in [1, {MAX_TOP_K}], got {args.top_k}")
    for name in ("min_passing", "min_flow"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise InputError(f"--{name.replace('_', '-')} must be in [0, 1]")
    model, sp = load_dat_model(args.model, args.device)
    options = decoding_options(args, model, args.strategy)
    check_strategy(model, args.strategy, options, cli=True)
    ((_, token_logprobs, links, graph_lengths),) = model_outputs(
        model,
        sp,
        [args.sentence],
        warn=stderr_warner("sentence"),
        upsample_ratio=args.upsample_ratio,
    )
    (hyp,) = decode(token_logprobs, links, graph_lengths, args.strategy, **options)
    size = int(graph_lengths[0])
    view = graph_view(
        token_logprobs[0, :size],
        links[0, :size, :size],
        hyp.path,
        top_k=args.top_k,
        min_passing=args.min_passing,
        min_flow=args.min_flow,
    )
    translation = detokenize(sp, hyp.tokens)
    title = (
        f"{args.sentence}\n→ {translation}   ({args.strategy}; {size} vertices, "
        f"{len(view.vertices)} drawn)"
    )
    with outputs.atomic_path(args.output, "--output", record=True) as tmp:
        draw_graph(view, sp.id_to_piece, tmp, title=title)
    print(translation)
    print(f"graph: {args.output}")
    return 0
