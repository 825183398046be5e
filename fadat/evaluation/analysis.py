"""``fadat analyze``: how confident is a DAG model? The numbers and pictures of the paper's §4.4.

- **Table 3** (paper §4.4, "Generation Confidence"): for each decoding strategy, the mean over the
  test set of ``−log P(a|x)`` (the decoded vertex path), ``−log P(y|a,x)`` (its tokens given the
  path) and ``−log P(y|x)`` (the same tokens marginalised over every path, paper Eq. 3 via
  :func:`fadat.dag.dag_log_likelihood`). FA-DAT's claim is that all three are far lower than
  DA-Transformer's.
- **Figure 1**: the 2-D density of every vertex's passing probability (the probability that a path
  drawn from the transition matrix visits it, :func:`fadat.dag.passing_probabilities`) against its
  largest token probability, with marginal histograms. FA-DAT's vertices sit near (0 or 1, 1).
- **Table 5** (paper appendix, "Sequence Length"): tokenized BLEU per reference-length bucket
  (< 20, 20–40, 40–60, ≥ 60 13a tokens of the first reference), scored by
  :func:`fadat.evaluation.scoring.bucket_scores` (the same numbers ``fadat evaluate`` reports).

The numbers live in small pure functions (:func:`path_statistics`, :func:`vertex_confidence`,
:func:`vertex_density`; the length buckets are :mod:`fadat.evaluation.scoring`'s);
:func:`analyze_model` runs one model over a split (batches as ``fadat translate`` makes them,
:func:`model_outputs`) and :func:`plot_vertex_density` / :func:`format_table3` /
:func:`format_table5` present them. :func:`analyze` is the verb (the command line:
:mod:`fadat.cli.analyze`): several model directories analysed side by side, Figure 1 and the
numbers written to a directory.

Only run on CPU; the code is device-agnostic but CUDA was not run.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fadat import outputs
from fadat.data.contract import PAD_ID, pad_sequences
from fadat.data.spm import decode as spm_decode
from fadat.errors import InputError
from fadat.evaluation.scoring import DEFAULT_STRATEGIES, bucket_labels
from fadat.translation.pipeline import DEFAULT_MAX_TOKENS

# ---------------------------------------------------------------------------------------------
# Pure functions on model outputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathStatistics:
    """Per-sentence negative log-probabilities of decoded paths (nats, summed over the sentence).

    Attributes:
        path_nll: ``(B,)`` float32, ``−log P(a|x) = −Σ_k log E[a_k, a_{k+1}]``.
        token_nll: ``(B,)`` float32, ``−log P(y|a,x) = −Σ_k log P(y_k | v_{a_k})`` with
            ``y = path_tokens`` (one token per path vertex, endpoints included).
        marginal_nll: ``(B,)`` float32, ``−log P(y|x)``: the same ``y`` summed over every path of
            its length (paper Eq. 3). Always ``≤ path_nll + token_nll`` up to rounding.
        lengths: ``(B,)`` int64, number of path vertices ``T`` (endpoints included).
    """

    path_nll: torch.Tensor
    token_nll: torch.Tensor
    marginal_nll: torch.Tensor
    lengths: torch.Tensor


def _pad_paths(
    hypotheses: Sequence[Any], graph_lengths: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check every hypothesis' path and stack paths and path tokens into padded tensors.

    Returns ``(paths (B, T) int64 padded with 0, tokens (B, T) int64 padded with PAD_ID,
    lengths (B,) int64)``; raises ValueError for a path that is not a DAG path of its graph.
    """
    paths, tokens = [], []
    for b, hyp in enumerate(hypotheses):
        path = [int(v) for v in hyp.path]
        toks = [int(t) for t in hyp.path_tokens]
        size = int(graph_lengths[b])
        if len(path) < 2 or path[0] != 0 or path[-1] != size - 1:
            raise ValueError(f"hypothesis {b}: path must run from vertex 0 to {size - 1}: {path}")
        if any(nxt <= cur for cur, nxt in pairwise(path)):
            raise ValueError(f"hypothesis {b}: path vertices must increase: {path}")
        if len(toks) != len(path):
            raise ValueError(
                f"hypothesis {b}: {len(toks)} path tokens for a path of {len(path)} vertices"
            )
        paths.append(path)
        tokens.append(toks)
    width = max(len(p) for p in paths)
    path_t = torch.zeros(len(paths), width, dtype=torch.int64)  # (B, T)
    tok_t = torch.full((len(paths), width), PAD_ID, dtype=torch.int64)  # (B, T)
    for b, (p, t) in enumerate(zip(paths, tokens, strict=True)):
        path_t[b, : len(p)] = torch.as_tensor(p)
        tok_t[b, : len(t)] = torch.as_tensor(t)
    lengths = torch.as_tensor([len(p) for p in paths], dtype=torch.int64)
    return path_t.to(device), tok_t.to(device), lengths.to(device)


def path_statistics(
    token_logprobs: torch.Tensor,
    links: torch.Tensor,
    graph_lengths: torch.Tensor,
    hypotheses: Sequence[Any],
) -> PathStatistics:
    """``−log P(a|x)``, ``−log P(y|a,x)`` and ``−log P(y|x)`` of decoded paths (paper Table 3).

    ``y`` is ``hypothesis.path_tokens``: the token read at every vertex of the path, including the
    start and end vertices and before de-duplication, so that ``(y, a)`` is one joint event of the
    DAG model and ``P(y|x) = Σ_a' P(y, a'|x) ≥ P(y, a|x)``. (The paper does not say whether its
    ``y`` is de-duplicated; the de-duplicated output is not aligned one token per vertex.)

    Args:
        token_logprobs: ``(B, L, V)`` float32 log-probabilities of each vertex's token.
        links: ``(B, L, L)`` float32 ``log E`` (−inf where there is no transition).
        graph_lengths: ``(B,)`` int64 graph size ``L_b``.
        hypotheses: ``B`` objects with ``path`` (vertex ids ``0 … L_b−1``, increasing) and
            ``path_tokens`` (same length), e.g. :class:`fadat.decoding.Hypothesis`.

    Returns:
        :class:`PathStatistics` (per sentence; sums over the sentence, in nats, on the CPU).

    Raises:
        ValueError: hypothesis count differs from ``B``, or a path is not a path of its graph.
    """
    from fadat.dag import dag_log_likelihood

    if len(hypotheses) != token_logprobs.shape[0]:
        raise ValueError(f"{len(hypotheses)} hypotheses for a batch of {token_logprobs.shape[0]}")
    device = token_logprobs.device
    paths, tokens, lengths = _pad_paths(hypotheses, graph_lengths, device)  # (B, T) (B, T) (B,)
    steps = torch.arange(paths.shape[1], device=device)  # (T,)
    on_path = steps[None, :] < lengths[:, None]  # (B, T)
    has_next = steps[None, 1:] < lengths[:, None]  # (B, T-1): edge a_k -> a_{k+1} exists
    rows = torch.arange(paths.shape[0], device=device)[:, None]  # (B, 1)
    edge_logp = links[rows, paths[:, :-1], paths[:, 1:]]  # (B, T-1) = log E[a_k, a_{k+1}]
    path_logp = torch.where(has_next, edge_logp, torch.zeros_like(edge_logp)).sum(1)  # (B,)
    token_logp = token_logprobs[rows, paths, tokens]  # (B, T) = log P(y_k | a_k)
    token_logp = torch.where(on_path, token_logp, torch.zeros_like(token_logp)).sum(1)  # (B,)
    marginal_logp = dag_log_likelihood(
        token_logprobs, links, tokens, graph_lengths.to(device), lengths
    )  # (B,)
    return PathStatistics(
        path_nll=(-path_logp).float().cpu(),
        token_nll=(-token_logp).float().cpu(),
        marginal_nll=(-marginal_logp).float().cpu(),
        lengths=lengths.cpu(),
    )


def vertex_confidence(
    token_logprobs: torch.Tensor, links: torch.Tensor, graph_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Passing probability and largest token probability of every vertex (paper Figure 1).

    Every vertex ``j < L_b`` of every sentence counts, including the start and end vertices (whose
    passing probability is 1); padding vertices are dropped.

    Args:
        token_logprobs: ``(B, L, V)`` float32 log-probabilities.
        links: ``(B, L, L)`` float32 ``log E``.
        graph_lengths: ``(B,)`` int64 graph size ``L_b``.

    Returns:
        ``(passing, max_token)``, each ``(N,)`` float32 on the CPU with ``N = Σ_b L_b``, in
        sentence-major, vertex-minor order. ``passing`` is
        :func:`fadat.dag.passing_probabilities`; ``max_token = max_v P(v | vertex)``.
    """
    from fadat.dag import passing_probabilities

    passing = passing_probabilities(links, graph_lengths.to(links.device))  # (B, L)
    max_token = token_logprobs.max(dim=-1).values.exp()  # (B, L)
    vertices = torch.arange(links.shape[1], device=links.device)  # (L,)
    valid = vertices[None, :] < graph_lengths.to(links.device)[:, None]  # (B, L)
    return passing[valid].float().cpu(), max_token[valid].float().cpu()


def vertex_density(
    passing: np.ndarray | torch.Tensor, max_token: np.ndarray | torch.Tensor, bins: int = 50
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """2-D histogram of (passing probability, max token probability) on ``[0, 1]²``.

    Values are clipped into ``[0, 1]`` first: a passing probability computed in float32 can exceed
    1 by rounding and would otherwise fall out of the histogram.

    Args:
        passing: ``(N,)`` passing probabilities.
        max_token: ``(N,)`` max token probabilities.
        bins: number of bins per axis.

    Returns:
        ``(counts (bins, bins) float64 indexed [passing bin, token bin], passing edges (bins+1,),
        token edges (bins+1,))``, as :func:`numpy.histogram2d`. ``counts.sum() == N``.
    """
    x = np.clip(np.asarray(passing, dtype=np.float64), 0.0, 1.0)
    y = np.clip(np.asarray(max_token, dtype=np.float64), 0.0, 1.0)
    counts, x_edges, y_edges = np.histogram2d(x, y, bins=bins, range=[[0.0, 1.0], [0.0, 1.0]])
    return counts, x_edges, y_edges


# ---------------------------------------------------------------------------------------------
# Running a model over a split
# ---------------------------------------------------------------------------------------------


def load_dat_model(
    directory: str | Path, device: str | torch.device | None = "cpu"
) -> tuple[Any, Any]:
    """Load a DAT model directory and its sentencepiece model
    (:func:`fadat.models.directory.load_model`).

    Raises:
        InputError: as :func:`fadat.models.directory.load_model`, or the directory holds an AT model
            (it has no graph to analyse).
    """
    from fadat.models.directory import load_model

    model, sp = load_model(directory, device)
    if not model.has_graph:
        raise InputError(
            f"{directory}: holds a {model.config.model_type.upper()} model; "
            "only DAT models have a graph to analyse"
        )
    return model, sp


def model_outputs(
    model: Any,
    sp: Any,
    lines: Sequence[str],
    max_tokens: int | None = None,
    warn: Callable[[str], None] | None = None,
    upsample_ratio: float | None = None,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The DAT's raw outputs for raw text lines, batch by batch.

    Encoding, truncation and batching are :func:`fadat.translation.pipeline.translate_lines`' own
    (:func:`~fadat.translation.pipeline.encode_sources`, the model's ``batch_cost``,
    :func:`~fadat.translation.pipeline.make_batches`), so the graphs analysed are the graphs ``fadat
    translate`` decodes. Empty (all-blank) lines are skipped, as translate skips them.

    Args:
        model: a DAT model in eval mode.
        sp: its sentencepiece processor.
        lines: raw source sentences.
        max_tokens: batch budget in padded graph vertices; default translate's.
        warn: receives truncation warnings; default :func:`warnings.warn`.
        upsample_ratio: the decoding λ; ``None`` = the model's.

    Yields:
        ``(rows, token_logprobs (B, L, V) fp32, links (B, L, L) fp32, graph_lengths (B,) int64)``
        with ``rows`` the indices into ``lines`` of the batch's sentences. Tensors are on the
        model's device, computed under ``torch.inference_mode``.
    """
    from fadat.models.architectures import naming_inputs
    from fadat.models.directory import model_device
    from fadat.translation.pipeline import DEFAULT_MAX_TOKENS, encode_sources, make_batches

    warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    budget = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    encoded = encode_sources(sp, lines, model.config.max_source_positions, warn)
    todo = [i for i, ids in enumerate(encoded) if ids is not None]
    costs = [model.batch_cost(len(encoded[i]), upsample_ratio) for i in todo]
    device = model_device(model)
    for batch in make_batches(costs, budget):
        rows = [todo[k] for k in batch]
        with torch.inference_mode(), naming_inputs(model, [i + 1 for i in rows]):
            source = pad_sequences([encoded[i] for i in rows]).to(device)  # (B, S)
            token_logprobs, links, graph_lengths = model.graph_outputs(source, upsample_ratio)
        yield rows, token_logprobs, links, graph_lengths


@dataclass(frozen=True)
class StrategyReport:
    """Table 3 row of one decoding strategy.

    Attributes:
        path_nll, token_nll, marginal_nll: means over the analysed sentences of the
            per-sentence sums of :class:`PathStatistics` (nats per sentence, as the paper's
            Table 3).
        path_length: mean number of path vertices (endpoints included).
        bleu: sacreBLEU corpus BLEU of the outputs (:func:`fadat.evaluation.scoring.corpus_scores`).
        tok_bleu: tokenized BLEU (sacremoses + sacreBLEU ``tokenize="none"``), the papers' number.
    """

    path_nll: float
    token_nll: float
    marginal_nll: float
    path_length: float
    bleu: float
    tok_bleu: float


@dataclass
class ModelReport:
    """Everything ``fadat analyze`` measures for one model.

    Attributes:
        name: label in tables and plots.
        sentences: number of sentences of the split.
        analysed: sentences with a non-empty source (the others translate to "" and are left
            out of Table 3 and Figure 1).
        strategies: Table 3 row per decoding strategy.
        passing: ``(N,)`` float32 passing probability of every vertex of every analysed graph
            (``N = Σ L_b``; sentences in batch order, not split order).
        max_token: ``(N,)`` float32 max token probability of the same vertices.
        bucket_strategy: the strategy whose outputs Table 5 scores.
        buckets: Table 5 column, ``[{"bucket", "count", "tok_bleu"}, …]``
            (:func:`fadat.evaluation.scoring.bucket_scores`); counts add up to ``sentences``.
        translations: detokenised outputs per strategy, in split order.
    """

    name: str
    sentences: int
    analysed: int
    strategies: dict[str, StrategyReport]
    passing: np.ndarray
    max_token: np.ndarray
    bucket_strategy: str
    buckets: list[dict[str, Any]]
    translations: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-serialisable numbers (no per-vertex arrays, no translations)."""
        return {
            "name": self.name,
            "sentences": self.sentences,
            "analysed": self.analysed,
            "vertices": int(self.passing.shape[0]),
            "strategies": {k: asdict(v) for k, v in self.strategies.items()},
            "bucket_strategy": self.bucket_strategy,
            "buckets": self.buckets,
        }


def analyze_model(
    model: Any,
    sp: Any,
    name: str,
    sources: Sequence[str],
    references: Sequence[Sequence[str]],
    target_lang: str,
    strategies: Sequence[str] = DEFAULT_STRATEGIES,
    bucket_strategy: str = "lookahead",
    options: dict[str, dict[str, Any]] | None = None,
    max_tokens: int | None = None,
    warn: Callable[[str], None] | None = None,
    upsample_ratio: float | None = None,
) -> ModelReport:
    """Run one DAT model over a split and collect Table 3, Figure 1 and Table 5.

    One decoder pass per batch feeds every strategy (decoding never re-runs the network, as in
    the reference).

    Args:
        model: a DAT model in eval mode (e.g. from :func:`load_dat_model`), on any device.
        sp: its sentencepiece processor.
        name: label in tables and plots.
        sources: raw source sentences.
        references: reference streams (sacreBLEU layout: each stream one line per sentence).
        target_lang: target language code (tokenizers of the BLEU scores).
        strategies: decoding strategies of Table 3 (:data:`fadat.decoding.STRATEGIES` names).
        bucket_strategy: strategy whose outputs are scored per length bucket (added to
            ``strategies`` if missing).
        options: per strategy, its keyword options (default: the decoders' defaults).
        max_tokens: batch budget in graph vertices (see :func:`model_outputs`).
        warn: receives truncation warnings.
        upsample_ratio: the decoding λ; ``None`` = the model's.

    Returns:
        :class:`ModelReport`.

    Raises:
        InputError: an AT model, no sentences, streams of another length than ``sources``,
            unknown strategy or invalid options.
    """
    from fadat.evaluation.scoring import bucket_scores, moses_tokenize
    from fadat.translation.pipeline import check_strategy

    if not sources:
        raise InputError("no sentences to analyse")
    if not references or any(len(stream) != len(sources) for stream in references):
        raise InputError(f"need reference streams of {len(sources)} lines each")
    strategies = list(dict.fromkeys([*strategies, bucket_strategy]))
    options = options or {}
    if not model.has_graph:
        raise InputError(f"{name}: only DAT models have a graph to analyse")
    for strategy in strategies:
        check_strategy(model, strategy, options.get(strategy, {}), cli=True)
    stats, texts, passing, max_token = _decode_split(
        model, sp, sources, strategies, options, max_tokens, warn, upsample_ratio
    )
    tok_refs = [moses_tokenize(stream, target_lang) for stream in references]
    rows_out, tok_hyps = {}, {}
    for strategy in strategies:
        tok_hyps[strategy] = moses_tokenize(texts[strategy], target_lang)
        rows_out[strategy] = _strategy_report(
            stats[strategy], texts[strategy], tok_hyps[strategy], references, tok_refs, target_lang
        )
    return ModelReport(
        name=name,
        sentences=len(sources),
        analysed=int(sum(len(s.lengths) for s in stats[strategies[0]])),
        strategies=rows_out,
        passing=np.concatenate(passing),
        max_token=np.concatenate(max_token),
        bucket_strategy=bucket_strategy,
        buckets=bucket_scores(tok_hyps[bucket_strategy], tok_refs, references[0]),
        translations=texts,
    )


_STAT_FIELDS = ("path_nll", "token_nll", "marginal_nll", "lengths")


def _decode_split(
    model: Any,
    sp: Any,
    sources: Sequence[str],
    strategies: list[str],
    options: dict[str, dict[str, Any]],
    max_tokens: int | None,
    warn: Callable[[str], None] | None,
    upsample_ratio: float | None,
) -> tuple[dict[str, list[PathStatistics]], dict[str, list[str]], list[Any], list[Any]]:
    """One decoder pass per batch, decoded by every strategy: per strategy its path statistics
    (one :class:`PathStatistics` per batch) and its detokenised outputs (one per source, ``""``
    for a sentence not analysed); per batch the vertices' passing and max-token probabilities
    (:func:`vertex_confidence`, NumPy).

    Raises:
        InputError: every source sentence is empty.
    """
    from fadat.decoding import decode

    stats: dict[str, list[PathStatistics]] = {s: [] for s in strategies}
    texts: dict[str, list[str]] = {s: [""] * len(sources) for s in strategies}
    passing, max_token = [], []
    for rows, token_logprobs, links, graph_lengths in model_outputs(
        model, sp, sources, max_tokens, warn, upsample_ratio
    ):
        p, m = vertex_confidence(token_logprobs, links, graph_lengths)
        passing.append(p.numpy())
        max_token.append(m.numpy())
        for strategy in strategies:
            hyps = decode(
                token_logprobs, links, graph_lengths, strategy, **options.get(strategy, {})
            )
            stats[strategy].append(path_statistics(token_logprobs, links, graph_lengths, hyps))
            for i, hyp in zip(rows, hyps, strict=True):
                texts[strategy][i] = spm_decode(sp, hyp.tokens)
    if not passing:
        raise InputError("every source sentence is empty: nothing to analyse")
    return stats, texts, passing, max_token


def _strategy_report(
    stats: list[PathStatistics],
    texts: list[str],
    tok_hyps: list[str],
    references: Sequence[Sequence[str]],
    tok_refs: list[list[str]],
    target_lang: str,
) -> StrategyReport:
    """One strategy's row of Table 3: mean path statistics over every analysed sentence and
    the corpus BLEU of its outputs ``texts`` (``tok_hyps`` Moses-tokenised)."""
    from fadat.evaluation.scoring import corpus_scores

    cat = {k: torch.cat([getattr(s, k) for s in stats]) for k in _STAT_FIELDS}
    scores = corpus_scores(texts, references, target_lang, tok_hyps, tok_refs)
    return StrategyReport(
        path_nll=float(cat["path_nll"].double().mean()),
        token_nll=float(cat["token_nll"].double().mean()),
        marginal_nll=float(cat["marginal_nll"].double().mean()),
        path_length=float(cat["lengths"].double().mean()),
        bleu=float(scores["bleu"]),
        tok_bleu=float(scores["tok_bleu"]),
    )


# ---------------------------------------------------------------------------------------------
# The verb
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    """What :func:`analyze` measured and wrote.

    Attributes:
        reports: one :class:`ModelReport` per model, in the order given: Table 3's rows and
            Table 5's columns as Markdown with :func:`format_table3` / :func:`format_table5`.
        figure: Figure 1 as written, ``OUTPUT_DIR/vertex_density.png``
            (:func:`plot_vertex_density`).
        numbers: the JSON file written, ``OUTPUT_DIR/analysis.json``; it holds :attr:`summary`.
        summary: ``{"data", "split", "target_lang", "models"}``, ``models`` holding each
            report's :meth:`ModelReport.summary` (no per-vertex arrays, no translations).
    """

    reports: list[ModelReport]
    figure: Path
    numbers: Path
    summary: dict[str, Any]


def analyze(
    models: str | Path | Sequence[str | Path],
    *,
    data: str | Path,
    names: Sequence[str] | None = None,
    split: str = "test",
    strategies: str | Sequence[str] = DEFAULT_STRATEGIES,
    bucket_strategy: str = "lookahead",
    subset: int = 0,
    output_dir: str | Path = "analysis",
    upsample_ratio: float | None = None,
    device: str = "cpu",
    threads: int = 0,
    force: bool = False,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    options: Mapping[str, Any] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Analysis:
    """The confidence of DAT models on one split of a prepared dataset, side by side
    (``fadat analyze``; every keyword's default is the flag's): Table 3 and Table 5 of the
    FA-DAT paper (Ma et al. 2023, §4.4 "Analysis and Discussion" and Appendix D "Sequence
    Length") as :class:`ModelReport` per model, and Figure 1 (§4.4, the vertices' passing
    against max token probability) and the numbers written to ``output_dir``: the directory is
    marked as fadat's ``analysis`` and only its two files are written there, each all-or-nothing
    (:mod:`fadat.outputs`).

    Example::

        from fadat.evaluation.analysis import analyze, format_table3

        result = analyze(["models/nll", "models/fadat"], data="data/bible-en-es",
                         names=["DA-T", "FA-DAT"], output_dir="analysis")
        print(format_table3(result.reports))

    Args:
        models: DAT model directories, one path or several; compared side by side.
        data: a dataset directory written by ``fadat prepare`` (its ``meta.json`` and
            ``raw/<split>.*``).
        names: the models' labels in tables, plots and JSON (default: their directory names,
            :func:`fadat.models.directory.model_labels`); as many as ``models``, all different.
        split: the split to analyse.
        strategies: the decoding strategies of Table 3, a sequence of names or one
            comma-separated string.
        bucket_strategy: the strategy whose outputs Table 5 scores per reference-length bucket
            (added to the strategies decoded if missing).
        subset: only the first N sentences (0 = all).
        output_dir: the directory for ``vertex_density.png`` and ``analysis.json``; absent,
            empty or an earlier analysis (:func:`fadat.outputs.check_output_dir`).
        upsample_ratio: the decoding λ (graph size ``L = λ·|x|``); ``None`` = each model's own.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        threads: torch's intra-op threads, set for the whole process (0 = torch's default;
            :func:`fadat.process.apply_threads`).
        force: allow ``threads`` above the cores this process may use.
        max_tokens: batch budget in padded graph vertices (:func:`model_outputs`).
        options: decoding options by their command-line names (``{"beta": 1.0}``: the keys of
            :data:`fadat.options.DECODING_OPTIONS`); every strategy gets those it takes.
        warn: receives the warnings about over-long source lines (truncated); default
            :func:`warnings.warn`.

    Returns:
        :class:`Analysis`: the reports, and where Figure 1 and the numbers went.

    Warns:
        ThreadsAboveCoresWarning: ``force`` lets more threads than cores through.

    Raises:
        InputError: named by their ``fadat analyze`` flags: ``names`` not one per model or not
            all different, a negative ``subset`` or ``max_tokens``, no strategies, ``threads``
            out of range or above the cores without ``force``; an ``output_dir`` that is an
            input, lies inside one, or is not empty and not an earlier analysis (all checked
            before any work); a missing or non-DAT model directory
            (:func:`load_dat_model`); a missing split or dataset; a strategy or options that a
            model does not take (:func:`analyze_model`); the figure cannot be written.
        NonFiniteOutputError: a model's outputs are NaN or infinite (corrupt weights).
    """
    from fadat.evaluation.scoring import load_split, read_languages
    from fadat.models.directory import model_labels
    from fadat.options import decoding_keywords
    from fadat.process import apply_threads
    from fadat.translation.pipeline import strategy_options

    apply_threads(threads, force)
    directories = [models] if isinstance(models, str | Path) else list(models)
    if not directories:
        raise InputError("give at least one model directory")
    if names is not None and len(names) != len(directories):
        raise InputError(f"--names has {len(names)} labels for {len(directories)} models")
    if subset < 0:
        raise InputError(f"--subset must be >= 0, got {subset}")
    if max_tokens < 0:
        raise InputError(f"--max-tokens must be >= 0, got {max_tokens}")
    listed = strategies.split(",") if isinstance(strategies, str) else list(strategies)
    if not all(isinstance(name, str) for name in listed):
        raise InputError(f"--strategies must be strategy names, got {strategies!r}")
    chosen = [s.strip() for s in listed if s.strip()]
    if not chosen:
        raise InputError("--strategies is empty")
    out = Path(output_dir)
    # Before any work (fadat.outputs).
    outputs.check_not_input(
        out, [("--data", data), *(("--model", m) for m in directories)], "--output-dir"
    )
    outputs.check_output_dir(out, "analysis", "--output-dir")
    labels = list(names) if names else model_labels(directories)
    if len(set(labels)) != len(labels):
        raise InputError(f"model labels must differ, got {labels}")
    sources, references = load_split(data, split, subset)
    _, target_lang = read_languages(data)
    reports = []
    for directory, name in zip(directories, labels, strict=True):
        model, sp = load_dat_model(directory, device)
        accepted = strategy_options(model)
        # Every strategy takes the options that it accepts (as fadat evaluate does).
        per_strategy = {
            s: {
                k: v
                for k, v in decoding_keywords(options, model.flag_aliases.get(s)).items()
                if k in accepted.get(s, ())
            }
            for s in [*chosen, bucket_strategy]
        }
        reports.append(
            analyze_model(
                model,
                sp,
                name,
                sources,
                references,
                target_lang,
                strategies=chosen,
                bucket_strategy=bucket_strategy,
                options=per_strategy,
                max_tokens=max_tokens,
                warn=warn,
                upsample_ratio=upsample_ratio,
            )
        )
    outputs.mark_dir(out, "analysis")
    figure = out / "vertex_density.png"
    with outputs.atomic_path(figure) as tmp:
        plot_vertex_density([(r.name, r.passing, r.max_token) for r in reports], tmp)
    summary = {
        "data": str(data),
        "split": split,
        "target_lang": target_lang,
        "models": [r.summary() for r in reports],
    }
    numbers = out / "analysis.json"
    outputs.atomic_write(numbers, json.dumps(summary, indent=2) + "\n")
    return Analysis(reports=reports, figure=figure, numbers=numbers, summary=summary)


# ---------------------------------------------------------------------------------------------
# Presentation
# ---------------------------------------------------------------------------------------------


def format_table3(reports: Sequence[ModelReport]) -> str:
    """Table 3 as Markdown: one row per (model, strategy)."""
    lines = [
        "| model | decoding | −log P(a\\|x) | −log P(y\\|a,x) | −log P(y\\|x) | path vertices "
        "| BLEU | tok BLEU |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for report in reports:
        for strategy, row in report.strategies.items():
            lines.append(
                f"| {report.name} | {strategy} | {row.path_nll:.2f} | {row.token_nll:.2f} | "
                f"{row.marginal_nll:.2f} | {row.path_length:.1f} | {row.bleu:.2f} | "
                f"{row.tok_bleu:.2f} |"
            )
    return "\n".join(lines)


def format_table5(reports: Sequence[ModelReport]) -> str:
    """Table 5 as Markdown: one row per reference-length bucket, tokenized BLEU (sentences) per
    model."""
    header = "| reference length | " + " | ".join(
        f"{r.name} ({r.bucket_strategy})" for r in reports
    )
    lines = [header + " |", "|---|" + "---:|" * len(reports)]
    for k, label in enumerate(bucket_labels()):
        cells = []
        for report in reports:
            bucket = report.buckets[k]
            bleu = "–" if bucket["tok_bleu"] is None else f"{bucket['tok_bleu']:.2f}"
            cells.append(f"{bleu} ({bucket['count']})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_vertex_density(
    reports: Sequence[tuple[str, np.ndarray, np.ndarray]], output: str | Path, bins: int = 50
) -> list[np.ndarray]:
    """Figure 1: per model, the density of (passing probability, max token probability) with
    marginal histograms on the top and the right; models side by side. Darker = more vertices
    (logarithmic colour scale). Written with matplotlib's Agg backend.

    Args:
        reports: ``(name, passing (N,), max_token (N,))`` per model.
        output: image file (``.png``, ``.svg`` or ``.pdf``).
        bins: histogram bins per axis.

    Returns:
        The ``(bins, bins)`` counts drawn for each model (from :func:`vertex_density`).

    Raises:
        InputError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig = plt.figure(figsize=(4.6 * len(reports), 4.6))
    outer = fig.add_gridspec(1, len(reports), wspace=0.35)
    drawn = []
    for k, (name, passing, max_token) in enumerate(reports):
        counts, x_edges, y_edges = vertex_density(passing, max_token, bins)
        drawn.append(counts)
        grid = outer[k].subgridspec(
            2, 2, width_ratios=(4, 1), height_ratios=(1, 4), wspace=0.05, hspace=0.05
        )
        main = fig.add_subplot(grid[1, 0])
        top = fig.add_subplot(grid[0, 0], sharex=main)
        right = fig.add_subplot(grid[1, 1], sharey=main)
        masked = np.ma.masked_equal(counts.T, 0)  # rows = token bins (y), columns = passing (x)
        vmax = max(1.0, float(counts.max()))
        main.pcolormesh(x_edges, y_edges, masked, cmap="Greys", norm=LogNorm(1.0, vmax))
        main.set_xlabel("passing probability")
        main.set_ylabel("max token probability")
        main.set_xlim(0, 1)
        main.set_ylim(0, 1)
        widths = np.diff(x_edges)
        top.bar(x_edges[:-1], counts.sum(axis=1), width=widths, align="edge", color="0.35")
        right.barh(
            y_edges[:-1], counts.sum(axis=0), height=np.diff(y_edges), align="edge", color="0.35"
        )
        top.set_title(f"{name} ({int(counts.sum())} vertices)", fontsize=10)
        # The marginals show shapes; their count axes would collide with the main axes' labels.
        top.tick_params(labelbottom=False, labelleft=False)
        right.tick_params(labelleft=False, labelbottom=False)
    try:
        fig.savefig(output, dpi=110, bbox_inches="tight")
    except OSError as err:
        raise InputError(f"{output}: cannot write the figure: {err}") from err
    finally:
        plt.close(fig)
    return drawn
