"""The model behind ``fadat serve``: checked options, translation with a confidence, the graph.

:class:`Engine` wraps one model directory and offers what the HTTP layer needs, with no HTTP
in it and no architecture named (it uses the translation-model interface,
:class:`fadat.models.architectures.TranslationModel`, and the translation core of
:mod:`fadat.translation.pipeline`): the strategies and their options (:meth:`Engine.check` turns a
request's strategy and options into decoder keywords or an :class:`~fadat.errors.InputError`
naming the problem), the batch cost of a sentence (:meth:`Engine.cost`), translation of a list
of sentences with a score and a confidence each (:meth:`Engine.translate`), and the graph of
one sentence's translation as plain numbers (:meth:`Engine.graph`, DA-Transformers only).

**Confidence** (:func:`confidence`): the geometric mean of the model's probability of each
token of its own output, ``exp(log P(y|x) / T)``, where ``log P(y|x)`` is the model's score of
its output tokens (paper Eq. 3 for a DAT: every path of the graph; the chain rule for an AT),
taken from the pass that translated them
(:meth:`~fadat.models.architectures.TranslationModel.translate_batch` with ``with_log_prob``), and
``T`` the number of tokens that score covers (:class:`fadat.models.architectures.Scored`:
``|<s> y </s>|`` for DAT, ``|y </s>|`` for AT). It is in ``(0, 1]``; 1 means the model is sure of
every token. Its use as a quality estimate is measured in ``bench/qe_confidence.py``.

Until issue 33 the server scored the detokenised output in a second forward pass
(:func:`fadat.translation.pipeline.score_pairs`). The one-pass value is the same wherever
sentencepiece re-encodes the text to the decoded tokens (``tests/test_serve.py`` compares both to
1e-5); where it does not (a non-canonical segmentation, an ``<unk>``), it is the probability of the
tokens the model produced rather than of another segmentation of their text. A model that
cannot score its output from the translating pass (a vanilla NAT that dropped a ``<pad>``: the
output is shorter than the predicted length) has that sentence scored by
:func:`~fadat.translation.pipeline.score_pairs`, a second pass for that sentence only.

Not thread-safe: the server calls :meth:`Engine.translate` and :meth:`Engine.graph` from one
worker thread (:mod:`fadat.serve.batching`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from fadat.errors import InputError, NonFiniteOutputError
from fadat.options import DECODING_OPTIONS

if TYPE_CHECKING:
    from fadat.show_graph import GraphView

log = logging.getLogger("fadat.serve")

#: Translated once when a model is loaded (:meth:`Engine.from_directory`); any text will do.
PROBE_SENTENCE = "This is a test."


@dataclass(frozen=True)
class Result:
    """One sentence's translation.

    Attributes:
        text: detokenised output (``""`` for a blank input).
        score: the strategy's score in nats (:class:`fadat.translation.pipeline.Translation`);
            ``None`` for a blank input.
        log_prob: ``log P(y|x)`` of ``text`` in nats (``None`` for a blank input).
        confidence: :func:`confidence` of ``log_prob`` (``None`` for a blank input).
    """

    text: str
    score: float | None
    log_prob: float | None
    confidence: float | None


def confidence(log_prob: float, tokens: int) -> float | None:
    """Per-sentence confidence ``exp(log P(y|x) / T)``: the geometric mean token probability.

    Args:
        log_prob: ``log P(y|x)`` in nats (−inf allowed: the model cannot produce ``y``).
        tokens: ``T ≥ 1``, the tokens ``log_prob`` covers.

    Returns:
        A float in ``[0, 1]``, or ``None`` when ``log_prob`` is NaN (not scored).
    """
    if math.isnan(log_prob):
        return None
    return math.exp(min(0.0, log_prob / max(1, tokens)))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _layers(vertices: Sequence[int], edges: Sequence[tuple[int, int, float]]) -> dict[int, int]:
    """Each drawn vertex's layer: the number of drawn transitions on the longest drawn path
    from vertex 0 to it (0 for a vertex no drawn transition enters). ``edges`` are ``(i, j,
    flow)`` with ``i < j``: vertex ids are a topological order, so one pass in sorted order
    sees every vertex's predecessors first."""
    layer = {v: 0 for v in vertices}
    for i, j, _ in sorted(edges):
        layer[j] = max(layer[j], layer[i] + 1)
    return layer


def _path_json(
    strategy: str,
    path: Sequence[int],
    score: float,
    text: str,
    tokens: int,
    log_prob: float,
) -> dict[str, Any]:
    """One strategy's path in :meth:`Engine.graph`'s answer; ``tokens`` is ``|y|`` without the
    endpoints, ``score`` and ``log_prob`` in nats (None when not finite)."""
    return {
        "strategy": strategy,
        "vertices": list(path),
        "text": text,
        "score": _finite(score),
        "log_prob": _finite(log_prob),
        "confidence": confidence(log_prob, tokens + 2),  # |<s> y </s>|
    }


#: The largest integer an HTTP request may give (2**53 - 1): I-JSON (RFC 7493) integers, which
#: every JSON reader holds exactly; JSON-schema validators compare numbers as doubles, so a
#: published maximum of 2**63 - 1 would admit 2**63 + 100.
MAX_JSON_INT = 2**53 - 1


def http_range(name: str) -> tuple[float, float]:
    """The range of decoder option ``name`` over HTTP: its ``http_range``
    (:data:`fadat.options.DECODING_OPTIONS`), integers within ±:data:`MAX_JSON_INT`."""
    option = DECODING_OPTIONS[name]
    low, high = option.http_range
    if option.kind is int:
        low, high = max(low, -MAX_JSON_INT), min(high, MAX_JSON_INT)
    return low, high


class Engine:
    """A loaded model directory as the server uses it.

    Attributes:
        model: DAT or AT model in eval mode.
        sp: its sentencepiece processor.
        name: shown by ``GET /health`` (the directory's name).
        language_model: the beam search's ``lm`` and ``lm_words`` keywords
            (:func:`fadat.translation.language_model.language_model_options`), added to every
            request of a strategy that takes them; ``None`` without a language model, and then
            requests cannot set the options that weigh one (``gamma``).
    """

    def __init__(self, model: nn.Module, sp: Any, name: str = "model", lm: Any = None) -> None:
        """Raises :class:`~fadat.errors.InputError`: as
        :func:`~fadat.models.directory.check_vocabulary`; ``lm`` (a file, an ``NgramModel`` or a
        ``kenlm.Model``) for a model none of whose strategies takes one, or an LM that cannot be
        used (:func:`fadat.translation.language_model.language_model_options`).
        """
        from fadat.models.directory import check_vocabulary

        check_vocabulary(sp, model)
        self.model = model
        self.sp = sp
        self.name = name
        self.language_model: dict[str, Any] | None = None
        if lm is not None:
            from fadat.translation.language_model import (
                check_takes_language_model,
                language_model_options,
            )

            check_takes_language_model(model, list(model.strategies()), cli=True)
            self.language_model = language_model_options(lm, model, sp, cli=True)

    @classmethod
    def from_directory(
        cls,
        directory: str | Path,
        device: str = "cpu",
        engine: str = "auto",
        intra_threads: int = 1,
        lm: str | Path | None = None,
    ) -> Engine:
        """Load a model directory or an ONNX export (``engine`` ``auto``: the directory's; see
        :func:`fadat.translation.engines.load_translation_model`) and translate
        :data:`PROBE_SENTENCE` once with the default strategy, so that a model whose outputs are
        not finite (corrupt weights, finite ones included) is refused before the server starts
        instead of answering 500. ``lm``: a KenLM file for the beam search, opened once
        (:attr:`language_model`).

        Raises:
            InputError: as :func:`fadat.translation.engines.load_translation_model` and the
                constructor (``lm``).
            NonFiniteOutputError: the probe's outputs are NaN or infinite.
        """
        from fadat.translation.engines import load_translation_model

        model, sp = load_translation_model(directory, engine, device, intra_threads=intra_threads)
        engine = cls(model, sp, name=Path(directory).name, lm=lm)
        try:
            engine.translate([PROBE_SENTENCE], engine.default_strategy, {})
        except NonFiniteOutputError as err:
            raise NonFiniteOutputError(err.what, model=str(directory)) from None
        return engine

    # -- what the model offers ------------------------------------------------------------------

    @property
    def model_type(self) -> str:
        """The architecture's registry name (reported, never branched on)."""
        return self.model.model_type

    @property
    def strategies(self) -> dict[str, list[str]]:
        """Strategy → the options a request may set for it (those of
        :data:`fadat.options.DECODING_OPTIONS`, the table the command line reads too; the ones
        that weigh a language model only when the server has one)."""
        from fadat.translation.language_model import WEIGHT_OPTIONS

        refused = () if self.language_model is not None else WEIGHT_OPTIONS
        return {
            name: [o for o in options if o in DECODING_OPTIONS and o not in refused]
            for name, options in self.model.strategies().items()
        }

    def _with_language_model(self, strategy: str, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` plus :attr:`language_model` for a strategy that takes it."""
        if self.language_model is None or "lm" not in self.model.strategies().get(strategy, ()):
            return options
        return {**options, **self.language_model}

    @property
    def default_strategy(self) -> str:
        """The strategy of a request that names none (the model's ``default_strategy``)."""
        return self.model.default_strategy

    @property
    def has_graph(self) -> bool:
        """Whether :meth:`graph` can draw this model's translations (the model's ``has_graph``:
        a DA-Transformer)."""
        return self.model.has_graph

    # -- checking requests -----------------------------------------------------------------------

    def check(self, strategy: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A request's strategy and options as decoder keywords.

        Args:
            strategy: a name of :attr:`strategies`, or ``None`` for :attr:`default_strategy`.
            options: option name → JSON value.

        Returns:
            ``(strategy, options)`` with ``float`` options as floats.

        Raises:
            InputError: unknown strategy, unknown option, an option the strategy does not take,
                a value of the wrong type or outside its ``http_range``
                (:data:`fadat.options.DECODING_OPTIONS`), or a value the decoder rejects.
        """
        from fadat.translation.pipeline import check_strategy

        strategies = self.strategies
        strategy = self.default_strategy if strategy is None else strategy
        if strategy not in strategies:
            raise InputError(
                f"unknown strategy {strategy!r}; this model offers {', '.join(strategies)}"
            )
        checked: dict[str, Any] = {}
        for name, value in options.items():
            if name not in DECODING_OPTIONS:
                raise InputError(
                    f"unknown option {name!r}; options: {', '.join(sorted(DECODING_OPTIONS))}"
                )
            if name not in strategies[strategy]:
                takes = ", ".join(strategies[strategy]) or "no options"
                raise InputError(f"strategy {strategy!r} does not take {name!r} (it takes {takes})")
            kind = DECODING_OPTIONS[name].kind
            low, high = http_range(name)
            if kind is int and isinstance(value, float) and value.is_integer():
                value = int(value)  # 4.0 is an integer in JSON Schema, as in the schema we publish
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if kind is int and not is_int:
                raise InputError(f"option {name!r} must be an integer, got {value!r}")
            if kind is float:
                if not (is_int or isinstance(value, float)) or not math.isfinite(value):
                    raise InputError(f"option {name!r} must be a finite number, got {value!r}")
                value = float(value)
            if not low <= value <= high:
                raise InputError(f"option {name!r} must be in [{low:g}, {high:g}], got {value!r}")
            checked[name] = value
        check_strategy(self.model, strategy, self._with_language_model(strategy, checked))
        return strategy, checked

    def cost(self, sentence: str) -> int:
        """Batch cost of one sentence: graph vertices (DAT) or source tokens (AT), as
        the model's ``batch_cost``, of its (truncated) encoding; 0 for a blank one."""
        from fadat.data.spm import encode_source

        if not sentence.strip():
            return 0
        length = min(len(encode_source(self.sp, sentence)), self.model.config.max_source_positions)
        return self.model.batch_cost(length)

    # -- running the model -----------------------------------------------------------------------

    def translate(
        self,
        sentences: Sequence[str],
        strategy: str,
        options: dict[str, Any],
        max_tokens: int | None = None,
    ) -> list[Result]:
        """Translate and score sentences (options already :meth:`check`-ed), in input order.

        One call of :func:`fadat.translation.pipeline.translate_lines` (``max_tokens`` its batch
        budget; ``None`` = one batch) with ``log P(y|x)`` of the outputs from the same forward pass
        (see the module docstring for the one exception).

        With a ``seed`` option each sentence is translated alone, with a generator of its own
        seeded ``seed``: a sampler draws from one generator for its whole batch, so a sentence's
        draw would otherwise depend on the sentences that share its batch (other requests', in
        the server). A seeded sentence's translation thus depends on the sentence and the
        options only, whatever request or batch it comes in.
        """
        if "seed" in options and len(sentences) > 1:
            return [
                r for s in sentences for r in self.translate([s], strategy, options, max_tokens)
            ]
        from fadat.translation.pipeline import score_pairs, translate_lines

        results = translate_lines(
            self.model,
            self.sp,
            sentences,
            strategy=strategy,
            options=self._with_language_model(strategy, options),
            max_tokens=max_tokens,
            warn=log.warning,
            check=False,
            with_log_prob=True,
        )
        best = [hyps[0] for hyps in results]
        rows = [i for i, s in enumerate(sentences) if s.strip()]
        scored = {i: (best[i].log_prob, best[i].covers) for i in rows}
        unscored = [i for i in rows if best[i].log_prob is None]
        # the model could not score these outputs from the translating pass (and can score pairs)
        if unscored and getattr(self.model, "scores_pairs", True):
            pairs = score_pairs(
                self.model,
                self.sp,
                [sentences[i] for i in unscored],
                [best[i].text for i in unscored],
                max_tokens=max_tokens,
                warn=log.warning,
            )
            scored.update((i, (p.log_prob, p.tokens)) for i, p in zip(unscored, pairs, strict=True))
        out = [Result("", None, None, None) for _ in sentences]
        for i in rows:
            log_prob, tokens = scored[i]
            out[i] = Result(
                text=best[i].text,
                score=_finite(best[i].score),
                log_prob=None if log_prob is None else _finite(log_prob),
                confidence=None if log_prob is None else confidence(log_prob, tokens),
            )
        return out

    def _vertices_json(self, view: GraphView) -> list[dict[str, Any]]:
        """The drawn vertices of ``view`` for :meth:`graph`: id, layer (:func:`_layers`),
        passing probability and top tokens (piece, id, probability)."""
        layer = _layers(view.vertices, view.edges)
        return [
            {
                "id": v,
                "layer": layer[v],
                "passing": passing,
                "tokens": [{"token": self.sp.id_to_piece(t), "id": t, "p": p} for t, p in tops],
            }
            for v, passing, tops in zip(view.vertices, view.passing, view.top_tokens, strict=True)
        ]

    def graph(
        self,
        sentence: str,
        strategies: Sequence[str],
        top_k: int = 5,
        min_passing: float = 0.05,
        min_flow: float = 0.05,
    ) -> dict[str, Any]:
        """The graph behind one sentence's translation, for drawing (DAT only).

        Vertices, transitions and their thresholds are those of
        :func:`fadat.evaluation.show_graph.graph_view`, with the paths of every strategy in
        ``strategies`` drawn. Each drawn vertex also gets its ``layer``: the number of drawn
        transitions on the longest drawn path from vertex 0 to it (networkx's topological
        generations, as ``fadat show-graph`` lays it out), so a page can draw alternatives for one
        output position one above the other.

        Args:
            sentence: raw source text, not blank.
            strategies: checked strategy names (default options; the beam search with the
                server's language model), at least one.
            top_k: tokens listed per vertex.
            min_passing: passing-probability threshold for drawing a vertex.
            min_flow: flow threshold for drawing a transition.

        Returns:
            JSON-ready dict: ``source``, ``graph_size`` (``L``), ``vertices`` (``id``,
            ``layer``, ``passing``, ``tokens``: ``[{"token", "id", "p"}]``), ``links``
            (``from``, ``to``, ``flow``), ``paths`` (per strategy: ``strategy``, ``vertices``,
            ``text``, ``score``, ``log_prob``, ``confidence``).

        Raises:
            InputError: the model has no graph, or the sentence is blank.
        """
        from fadat.dag import outputs_log_prob
        from fadat.data.spm import decode as detokenize
        from fadat.decoding import decode
        from fadat.evaluation.analysis import model_outputs
        from fadat.evaluation.show_graph import graph_view

        if not self.has_graph:
            raise InputError(f"a {self.model_type.upper()} model has no graph to show")
        if not sentence.strip():
            raise InputError("the sentence is blank")
        ((_, token_logprobs, links, graph_lengths),) = model_outputs(
            self.model, self.sp, [sentence], warn=log.warning
        )
        size = int(graph_lengths[0])
        hyps = [
            decode(token_logprobs, links, graph_lengths, s, **self._with_language_model(s, {}))[0]
            for s in strategies
        ]
        texts = [detokenize(self.sp, h.tokens) for h in hyps]
        outputs = [list(h.tokens) for h in hyps]
        # log P(y|x) of every drawn path's output on the graph just computed: no second pass
        log_probs = outputs_log_prob(token_logprobs, links, graph_lengths, [0] * len(hyps), outputs)
        view = graph_view(
            token_logprobs[0, :size],
            links[0, :size, :size],
            hyps[0].path,
            top_k=top_k,
            min_passing=min_passing,
            min_flow=min_flow,
            other_paths=[h.path for h in hyps[1:]],
        )
        return {
            "source": sentence,
            "graph_size": size,
            "vertices": self._vertices_json(view),
            "links": [{"from": i, "to": j, "flow": flow} for i, j, flow in view.edges],
            "paths": [
                _path_json(s, h.path, h.score, text, len(y), log_prob)
                for s, h, text, y, log_prob in zip(
                    strategies, hyps, texts, outputs, log_probs, strict=True
                )
            ],
        }
