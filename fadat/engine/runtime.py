"""A DAT engine directory (``fadat export --format onnx``) run by ONNX Runtime, with the numpy
decoders of :mod:`fadat.engine.decoding_np` and the beam search of :mod:`fadat.engine.beam_np`:
:class:`OnnxDAT`.

Imports onnxruntime, numpy and sentencepiece only (no torch, no other fadat package; the beam
search imports numba, and kenlm with a KenLM binary language model, when it runs), so the same
class serves ``fadat translate --engine onnxruntime`` and a deployment without torch
(examples/onnx_translate.py, docs/engine.md). The directory's layout and the graph's contract:
:mod:`fadat.translation.onnx_export`.

Format versions (``metadata.json``'s ``format_version``): 1, the graph's outputs ``s``, ``tok``
and ``links`` (the top-1 decoders only); 2 (:data:`FORMAT_VERSION`, what ``fadat export``
writes), also ``top_lp`` and ``top_tok``, each vertex's ``top_k`` best tokens, which the beam
search reads. Both are read; a version-1 export refuses the beam search with a message to export
it again.

A shortlisted export (``fadat export --format onnx --shortlist``; ``metadata.json``'s
``shortlist``) holds a copy of the shortlist file and a graph with a third input,
``candidates``: :class:`OnnxDAT` reads the file with numpy (:mod:`fadat.engine.shortlist`),
computes each batch's candidates from its source ids and feeds them; the graph's outputs keep
their meaning, over the candidates (the log-softmax renormalised over them). Every strategy runs
on it. Its format version stays 2: it adds an input and a file, and a reader that does not know
it fails on the missing input rather than reading anything else into the outputs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fadat.engine.beam_np as beam_np
import fadat.engine.decoding_np as decoding_np
from fadat.engine.decoding_np import Hypothesis
from fadat.engine.shortlist import Shortlist, ShortlistError, read_shortlist

METADATA = "metadata.json"
FORMAT = "fadat-onnx-engine"
#: The format version ``fadat export --format onnx`` writes, and the newest this engine reads
#: (module docstring).
FORMAT_VERSION = 2
#: Tokens per vertex in the graph's ``top_lp``/``top_tok`` by default (``fadat export --top-k``):
#: the beam search's default ``top_cand_n``, DAG-Search's ``--decode-top-cand-n``.
TOP_K = 5
#: The strategy that reads ``top_lp``/``top_tok`` (format version 2).
BEAM = "beam"
#: The third input of a shortlisted export's graph: each sentence's candidate ids.
CANDIDATES = "candidates"
#: Strategy name → the engine's decoder: the top-1 decoders of
#: :data:`fadat.engine.decoding_np.STRATEGIES` ``fn(s, tok, links, graph_lengths, **options)``
#: and the beam search :func:`fadat.engine.beam_np.beam_search` ``fn(top_lp, top_tok, links,
#: graph_lengths, **options)``.
STRATEGIES: dict[str, Any] = {**decoding_np.STRATEGIES, BEAM: beam_np.beam_search}


def is_engine_dir(directory: str | Path) -> bool:
    """Whether ``directory`` holds an export of ``fadat export --format onnx``."""
    path = Path(directory) / METADATA
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


# ONNX Runtime graph optimizers left off. SkipLayerNormFusion replaces Add + LayerNormalization
# by the contrib op SkipLayerNormalization, which on the AMD EPYC Zen 3 (AVX2, onnxruntime 1.32,
# one thread, the released DAT in int8, batch 1) took 0.29 ms per call against 0.04 ms for the
# standard LayerNormalization kernel: leaving the fusion off made a sentence 2.1 ms (6 %) faster
# (interleaved A/B over 100 test sentences × 3).
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def create_session(
    graph: str | Path,
    *,
    intra_threads: int = 1,
    providers: Sequence[str] | None = None,
    profile_prefix: str | None = None,
) -> Any:
    """The ``onnxruntime.InferenceSession`` of an engine graph as :class:`OnnxDAT` runs it: one
    inter-op thread, ``intra_threads`` intra-op threads (0 = ONNX Runtime's default), the
    optimizers of :data:`DISABLED_OPTIMIZERS` off; ``profile_prefix`` turns ONNX Runtime's
    profiler on (``SessionOptions.enable_profiling``) and names its JSON file.

    Raises:
        onnxruntime's errors (e.g. ``InvalidGraph``) for a graph it cannot load.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_threads
    options.inter_op_num_threads = 1
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(
        str(graph),
        options,
        providers=list(providers or ["CPUExecutionProvider"]),
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


class EngineDirectoryError(ValueError):
    """A directory that is not a usable engine export (missing or unreadable files)."""


class NonFiniteGraphError(ValueError):
    """The graph's outputs hold NaN or +inf (corrupt weights).

    Attributes:
        what: ``"link scores"`` or ``"token log-probabilities"``.
    """

    def __init__(self, what: str) -> None:
        super().__init__(f"the graph's {what} are NaN or +inf: its weights are probably corrupt")
        self.what = what


class OnnxDAT:
    """An exported DAT: one ONNX Runtime session of its graph, its sentencepiece model, the
    numpy top-1 decoders and the beam search (format version 2).

    Example::

        engine = OnnxDAT("exports/dat-onnx", intra_threads=1)
        engine.translate(["In the beginning God created the heavens and the earth."])
        engine.translate(["In the beginning ..."], "beam", lm="lm.arpa", gamma=1.0)

    Args:
        directory: written by ``fadat export --format onnx``.
        intra_threads: threads of one session run (ONNX Runtime's ``intra_op_num_threads``;
            0 = ONNX Runtime's default, all cores).
        providers: ONNX Runtime execution providers (default the CPU provider).

    Attributes:
        metadata: the directory's ``metadata.json``.
        upsample_ratio: the decoding λ (graph size ``L = λ·|x </s>|``).
        precision: ``fp32`` or ``int8``.
        format_version: 1 or 2 (module docstring).
        top_k: tokens per vertex in the graph's ``top_lp``/``top_tok`` (the largest
            ``top_cand_n`` the beam search can take); 0 for a version-1 export (no beam search).
        pad_id, eos_id: the special ids of the contract (``metadata["special_ids"]``).
        shortlist: the export's vocabulary shortlist
            (:class:`~fadat.engine.shortlist.Shortlist`, read from its copy in the directory)
            whose candidates every run feeds the graph, or ``None`` (the full token head).
        sp: the sentencepiece processor.

    Raises:
        EngineDirectoryError: not an export, a newer format, a file missing, a version-2
            graph without the ``top_lp``/``top_tok`` outputs; a shortlisted export whose
            shortlist file is missing, unreadable or for another vocabulary size, or whose
            graph lacks the ``candidates`` input (or a graph with that input and no shortlist
            in ``metadata.json``).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        intra_threads: int = 1,
        providers: Sequence[str] | None = None,
    ) -> None:
        import sentencepiece as spm

        directory = Path(directory)
        if not is_engine_dir(directory):
            raise EngineDirectoryError(
                f"{directory}: not an engine directory of fadat export --format onnx "
                f"(no {METADATA} of format {FORMAT!r})"
            )
        meta = json.loads((directory / METADATA).read_text(encoding="utf-8"))
        self.format_version = int(meta.get("format_version", 1))
        if self.format_version > FORMAT_VERSION:
            raise EngineDirectoryError(
                f"{directory}: format version {meta['format_version']} is newer than this "
                f"fadat reads ({FORMAT_VERSION})"
            )
        for name in (meta["graph"], "spm.model"):
            if not (directory / name).is_file():
                raise EngineDirectoryError(f"{directory}: {name} is missing")
        self.directory = directory
        self.metadata: dict[str, Any] = meta
        self.upsample_ratio = float(meta["upsample_ratio"])
        self.precision: str = meta["precision"]
        self.max_source_positions = int(meta["max_source_positions"])
        self.max_target_positions = int(meta["max_target_positions"])
        ids = meta["special_ids"]
        self.bos_id, self.pad_id = int(ids["bos"]), int(ids["pad"])
        self.eos_id, self.unk_id = int(ids["eos"]), int(ids["unk"])
        self.top_k = int(meta.get("top_k", 0)) if self.format_version >= 2 else 0
        self.session = create_session(
            directory / meta["graph"], intra_threads=intra_threads, providers=providers
        )
        outputs = {o.name for o in self.session.get_outputs()}
        if self.format_version >= 2 and not {"top_lp", "top_tok"} <= outputs:
            raise EngineDirectoryError(
                f"{directory}: a format-version-{self.format_version} graph without the outputs "
                "top_lp and top_tok (export it again: fadat export --format onnx)"
            )
        self.shortlist: Shortlist | None = None
        takes_candidates = CANDIDATES in {i.name for i in self.session.get_inputs()}
        if meta.get("shortlist") is not None:
            name = meta["shortlist"]["file"]
            if not (directory / name).is_file():
                raise EngineDirectoryError(f"{directory}: {name} is missing")
            try:
                self.shortlist = read_shortlist(directory / name, int(meta["vocab_size"]))
            except ShortlistError as err:
                raise EngineDirectoryError(f"{directory}: its shortlist: {err}") from None
        if takes_candidates != (self.shortlist is not None):
            has = "has" if takes_candidates else "lacks"
            raise EngineDirectoryError(
                f"{directory}: the graph {has} the input {CANDIDATES!r} but metadata.json "
                f"{'has no' if takes_candidates else 'names a'} shortlist (export it again: "
                "fadat export --format onnx [--shortlist])"
            )
        self.sp = spm.SentencePieceProcessor(model_file=str(directory / "spm.model"))
        self._lm_words: tuple[str, ...] | None = None

    # -- what the export offers ---------------------------------------------------------------

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategies this export runs: the top-1 decoders, and the beam search for a
        format-version-2 export."""
        return tuple(name for name in STRATEGIES if name != BEAM or self.top_k)

    def check_beam(self, top_cand_n: int = TOP_K) -> None:
        """Check that this export feeds the beam search with ``top_cand_n`` tokens per vertex
        (``min(top_cand_n, V)``, as :func:`fadat.decoding.beam.beam_search` takes them).

        Raises:
            ValueError: a format-version-1 export (its graph gives each vertex's best token
                only); ``top_cand_n`` above the export's :attr:`top_k`.
        """
        if not self.top_k:
            raise ValueError(
                f"{self.directory}: a format-version-{self.format_version} export gives each "
                "vertex's best token only; the beam search needs its top tokens (format "
                "version 2): export the model again with fadat export --format onnx"
            )
        wanted = min(int(top_cand_n), int(self.metadata["vocab_size"]))
        if wanted > self.top_k:
            raise ValueError(
                f"top_cand_n = {top_cand_n}: this export gives {self.top_k} tokens per vertex "
                f"(exported with --top-k {self.top_k}); lower top_cand_n or export again with "
                f"--top-k {wanted}"
            )

    def lm_words(self) -> tuple[str, ...]:
        """The LM word of every token id of the export's sentencepiece model, for the beam
        search's ``lm_words`` (:func:`fadat.engine.beam_np.lm_words` with the export's special
        ids: the rule of :func:`fadat.translation.language_model.lm_words`), ``V`` strings
        indexed by token id.

        Read from the sentencepiece model on the first call and kept: reading ``V`` = 4000
        pieces takes about a millisecond, which :meth:`translate_ids` would otherwise spend on
        every batch (at batch 1 a third of the beam search's time with an LM)."""
        if self._lm_words is None:
            special = (self.bos_id, self.pad_id, self.eos_id, self.unk_id)
            self._lm_words = tuple(beam_np.lm_words(self.sp, special))
        return self._lm_words

    # -- the graph ----------------------------------------------------------------------------

    def graph_lengths(
        self, source_lengths: np.ndarray, upsample_ratio: float | None = None
    ) -> np.ndarray:
        """``(B,)`` int64 graph sizes ``clip(floor(λ·n), 2, max_target_positions)`` of
        ``source_lengths`` ``(B,)`` (with ``</s>``), as :func:`fadat.data.contract.graph_size`
        (the product in float64). ``upsample_ratio`` ``None`` = the export's λ.

        Raises:
            ValueError: λ ≤ 0 or a source length < 1.
        """
        ratio = self.upsample_ratio if upsample_ratio is None else float(upsample_ratio)
        if ratio <= 0:
            raise ValueError(f"upsample ratio λ must be > 0, got {ratio}")
        n = np.asarray(source_lengths, dtype=np.int64)
        if (n < 1).any():
            raise ValueError("source lengths must be >= 1 (they include </s>)")
        sizes = np.floor(n.astype(np.float64) * ratio).astype(np.int64)
        return np.clip(sizes, 2, self.max_target_positions)

    def decoder_tokens(self, graph_lengths: np.ndarray) -> np.ndarray:
        """``(B, max L_b)`` int64 decoder input ``[<s>, <unk> × (L_b − 2), </s>, <pad> …]`` of
        ``graph_lengths`` ``(B,)`` (:func:`fadat.models.transformer.decoder_input`)."""
        width = int(graph_lengths.max()) if graph_lengths.size else 2
        idx = np.arange(width)[None, :]  # (1, L)
        lengths = graph_lengths[:, None]  # (B, 1)
        tokens = np.where(idx < lengths, self.unk_id, self.pad_id).astype(np.int64)  # (B, L)
        tokens[:, 0] = self.bos_id
        return np.where(idx == lengths - 1, self.eos_id, tokens)

    def candidates(self, source: np.ndarray) -> np.ndarray:
        """The graph's ``candidates`` input for a batch of a shortlisted export: each sentence's
        candidates (:meth:`fadat.engine.shortlist.Shortlist.candidates`, the rule the torch
        engine uses), sorted, padded with −1 to the batch's width and to at least
        :attr:`top_k` columns (:meth:`~fadat.engine.shortlist.Shortlist.batch_candidates`).

        Args:
            source: ``(B, S)`` int64 ``x </s>`` right-padded with ``<pad>``.

        Returns:
            ``(B, K)`` int64.

        Raises:
            ValueError: an export without a shortlist.
        """
        if self.shortlist is None:
            raise ValueError(f"{self.directory}: an export without a shortlist")
        return self.shortlist.batch_candidates(source, max(self.top_k, 1))

    def run(
        self, source: np.ndarray, upsample_ratio: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One run of the graph on a padded batch.

        Args:
            source: ``(B, S)`` int64 ``x </s>`` right-padded with ``<pad>``, ``S`` ≤
                ``max_source_positions``.
            upsample_ratio: the decoding λ; ``None`` = the export's.

        Returns:
            ``(s (B, L) float32, tok (B, L) int64, links (B, L, L) float32, graph_lengths (B,)
            int64)``; on a shortlisted export (:attr:`shortlist`) ``s`` and ``tok`` over each
            sentence's candidates, ``s`` renormalised over them.

        Raises:
            ValueError: ``S`` above ``max_source_positions``.
            NonFiniteGraphError: NaN or +inf outputs (corrupt weights).
        """
        s, tok, links, lengths = self._run(("s", "tok", "links"), source, upsample_ratio)
        if not np.isfinite(s).all():
            raise NonFiniteGraphError("token log-probabilities")
        return s, tok, links, lengths

    def run_top_k(
        self, source: np.ndarray, upsample_ratio: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One run of the graph on a padded batch for the beam search: each vertex's
        :attr:`top_k` best tokens instead of its best one.

        Args:
            source, upsample_ratio: as :meth:`run`.

        Returns:
            ``(top_lp (B, L, k) float32, top_tok (B, L, k) int64, links (B, L, L) float32,
            graph_lengths (B,) int64)``: ``top_lp`` descending, ties by the lower id (0 and
            ``<pad>`` at padding vertices). On a shortlisted export (:attr:`shortlist`) over
            each sentence's candidates, renormalised; a sentence with fewer than ``k``
            candidates has −inf and ``<pad>`` in its last columns.

        Raises:
            ValueError: a format-version-1 export (:meth:`check_beam`); as :meth:`run`.
            NonFiniteGraphError: NaN or +inf outputs (corrupt weights).
        """
        self.check_beam(1)
        top_lp, top_tok, links, lengths = self._run(
            ("top_lp", "top_tok", "links"), source, upsample_ratio
        )
        if (
            np.isnan(top_lp).any()
            or np.isposinf(top_lp).any()
            or not np.isfinite(top_lp[..., 0]).all()
        ):
            raise NonFiniteGraphError("token log-probabilities")
        return top_lp, top_tok, links, lengths

    def _run(
        self, names: Sequence[str], source: np.ndarray, upsample_ratio: float | None
    ) -> list[np.ndarray]:
        """The graph's outputs ``names`` on ``source`` (the last one the links, checked), then
        the graph lengths; a shortlisted export is fed the batch's :meth:`candidates`."""
        source = np.ascontiguousarray(source, dtype=np.int64)
        if source.shape[1] > self.max_source_positions:
            raise ValueError(
                f"source length {source.shape[1]} exceeds the model's max_source_positions "
                f"{self.max_source_positions}"
            )
        lengths = self.graph_lengths((source != self.pad_id).sum(axis=1), upsample_ratio)
        feeds = {"source": source, "decoder_tokens": self.decoder_tokens(lengths)}
        if self.shortlist is not None:
            feeds[CANDIDATES] = self.candidates(source)
        outputs = self.session.run(list(names), feeds)
        links = outputs[-1]
        if np.isnan(links).any() or np.isposinf(links).any():
            raise NonFiniteGraphError("link scores")
        return [*outputs, lengths]

    # -- translation --------------------------------------------------------------------------

    def encode(self, line: str) -> list[int]:
        """Source ids ``x </s>`` of a raw line, cut to ``max_source_positions`` (the last kept
        piece replaced by ``</s>``, as ``fadat translate`` does)."""
        ids = list(self.sp.encode(line, out_type=int)) + [self.eos_id]
        if len(ids) > self.max_source_positions:
            ids = ids[: self.max_source_positions - 1] + [self.eos_id]
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of output ids without ``<s>``/``<pad>``/``</s>`` (:func:`fadat.data.spm.decode`)."""
        drop = (self.bos_id, self.pad_id, self.eos_id)
        return self.sp.decode([int(i) for i in ids if int(i) not in drop])

    def translate_ids(
        self,
        sources: Sequence[Sequence[int]],
        strategy: str = "lookahead",
        upsample_ratio: float | None = None,
        **options: Any,
    ) -> list[Hypothesis]:
        """Decode source ids (each ``x </s>``) as one batch.

        Args:
            sources: ``B`` id lists.
            strategy: one of :data:`STRATEGIES` (``beam``: a format-version-2 export).
            upsample_ratio: the decoding λ; ``None`` = the export's.
            **options: the strategy's options: ``beta=``, ``length_penalty=``,
                ``max_length=`` (:mod:`fadat.engine.decoding_np`); for ``beam`` those of
                :func:`fadat.engine.beam_np.beam_search` (``beam_size=``, ``top_cand_n=`` up
                to :attr:`top_k`, ``lm=`` an ARPA or KenLM binary file or an opened model,
                ``gamma=`` ...), ``lm_words=`` defaulting to :meth:`lm_words` when ``lm`` is given.

        Returns:
            One :class:`~fadat.engine.decoding_np.Hypothesis` per source.

        Raises:
            ValueError: unknown strategy or option, bad option value; ``beam`` on a
                format-version-1 export or with ``top_cand_n`` above :attr:`top_k`
                (:meth:`check_beam`); as :meth:`run`.
            ImportError: ``beam`` without numba.
            LanguageModelError: ``lm`` is a file :func:`fadat.engine.beam_np.open_model`
                refuses (a KenLM binary without kenlm among them).
        """
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy {strategy!r} is not available in the onnxruntime engine; "
                f"choose one of {', '.join(STRATEGIES)}"
            )
        if strategy == BEAM:
            self.check_beam(options.get("top_cand_n", TOP_K))
        if not sources:
            return []
        width = max(len(ids) for ids in sources)
        source = np.full((len(sources), width), self.pad_id, dtype=np.int64)  # (B, S)
        for b, ids in enumerate(sources):
            source[b, : len(ids)] = ids
        if strategy == BEAM:
            top_lp, top_tok, links, lengths = self.run_top_k(source, upsample_ratio)
            return self.beam_search(top_lp, top_tok, links, lengths, **options)
        s, tok, links, lengths = self.run(source, upsample_ratio)
        return decoding_np.decode(s, tok, links, lengths, strategy, **options)

    def beam_search(
        self,
        top_lp: np.ndarray,
        top_tok: np.ndarray,
        links: np.ndarray,
        graph_lengths: np.ndarray,
        **options: Any,
    ) -> list[Hypothesis]:
        """:func:`fadat.engine.beam_np.beam_search` on the outputs of :meth:`run_top_k`, with
        ``lm_words`` defaulting to :meth:`lm_words` when ``lm`` is given.

        Raises:
            ValueError: an unknown option (naming the strategy), a bad value; as
                :func:`~fadat.engine.beam_np.beam_search`.
        """
        if options.get("lm") is not None and options.get("lm_words") is None:
            options = {**options, "lm_words": self.lm_words()}
        try:
            return beam_np.beam_search(top_lp, top_tok, links, graph_lengths, **options)
        except TypeError as err:
            raise ValueError(f"strategy {BEAM!r}: {err}") from err

    def translate(
        self,
        sentences: Sequence[str],
        strategy: str = "lookahead",
        *,
        max_sentences: int = 64,
        upsample_ratio: float | None = None,
        **options: Any,
    ) -> list[str]:
        """Translate raw sentences; one detokenised string each, in order (an empty or blank
        line gives ``""``). Sentences are sorted by length into batches of at most
        ``max_sentences``. A language model given as a file (``lm=``, strategy ``beam``) is
        opened once for all batches (:func:`fadat.engine.beam_np.open_model`).

        Raises:
            ValueError: as :meth:`translate_ids`; a language model file that cannot be used
                (:class:`fadat.engine.beam_np.LanguageModelError`, naming the file).
            ImportError: as :meth:`translate_ids`.
        """
        if strategy == BEAM and options.get("lm") is not None:
            self.check_beam(options.get("top_cand_n", TOP_K))
            options = {**options, "lm": beam_np.open_model(options["lm"])}
        encoded = {i: self.encode(line) for i, line in enumerate(sentences) if line.strip()}
        order = sorted(encoded, key=lambda i: -len(encoded[i]))
        out = [""] * len(sentences)
        for start in range(0, len(order), max(1, max_sentences)):
            rows = order[start : start + max(1, max_sentences)]
            hyps = self.translate_ids(
                [encoded[i] for i in rows], strategy, upsample_ratio, **options
            )
            for i, h in zip(rows, hyps, strict=True):
                out[i] = self.detokenize(h.tokens)
        return out
