"""A DAT engine directory (``fadat export --format onnx``) run by ONNX Runtime, with the numpy
decoders of :mod:`fadat.engine.decoding_np`: :class:`OnnxDAT`.

Imports onnxruntime, numpy and sentencepiece only (no torch, no other fadat package), so the
same class serves ``fadat translate --engine onnxruntime`` and a deployment without torch
(examples/onnx_translate.py, docs/engine.md). The directory's layout and the graph's contract:
:mod:`fadat.translation.onnx_export`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fadat.engine.decoding_np import STRATEGIES, Hypothesis, decode

METADATA = "metadata.json"
FORMAT = "fadat-onnx-engine"


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
    """An exported DAT: one ONNX Runtime session of its graph, its sentencepiece model and the
    numpy top-1 decoders.

    Example::

        engine = OnnxDAT("exports/dat-onnx", intra_threads=1)
        engine.translate(["In the beginning God created the heavens and the earth."])

    Args:
        directory: written by ``fadat export --format onnx``.
        intra_threads: threads of one session run (ONNX Runtime's ``intra_op_num_threads``;
            0 = ONNX Runtime's default, all cores).
        providers: ONNX Runtime execution providers (default the CPU provider).

    Attributes:
        metadata: the directory's ``metadata.json``.
        upsample_ratio: the decoding λ (graph size ``L = λ·|x </s>|``).
        precision: ``fp32`` or ``int8``.
        pad_id, eos_id: the special ids of the contract (``metadata["special_ids"]``).
        sp: the sentencepiece processor.

    Raises:
        EngineDirectoryError: not an export, a newer format, or a file missing.
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
        if int(meta.get("format_version", 0)) > 1:
            raise EngineDirectoryError(
                f"{directory}: format version {meta['format_version']} is newer than this "
                "fadat reads (1)"
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
        self.session = create_session(
            directory / meta["graph"], intra_threads=intra_threads, providers=providers
        )
        self.sp = spm.SentencePieceProcessor(model_file=str(directory / "spm.model"))

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
            int64)``.

        Raises:
            ValueError: ``S`` above ``max_source_positions``.
            NonFiniteGraphError: NaN or +inf outputs (corrupt weights).
        """
        source = np.ascontiguousarray(source, dtype=np.int64)
        if source.shape[1] > self.max_source_positions:
            raise ValueError(
                f"source length {source.shape[1]} exceeds the model's max_source_positions "
                f"{self.max_source_positions}"
            )
        lengths = self.graph_lengths((source != self.pad_id).sum(axis=1), upsample_ratio)
        tokens = self.decoder_tokens(lengths)
        s, tok, links = self.session.run(None, {"source": source, "decoder_tokens": tokens})
        if np.isnan(links).any() or np.isposinf(links).any():
            raise NonFiniteGraphError("link scores")
        if not np.isfinite(s).all():
            raise NonFiniteGraphError("token log-probabilities")
        return s, tok, links, lengths

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
            strategy: one of :data:`fadat.engine.decoding_np.STRATEGIES`.
            upsample_ratio: the decoding λ; ``None`` = the export's.
            **options: the strategy's options (``beta=``, ``length_penalty=``, ``max_length=``).

        Returns:
            One :class:`~fadat.engine.decoding_np.Hypothesis` per source.

        Raises:
            ValueError: unknown strategy or option; as :meth:`run`.
        """
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy {strategy!r} is not available in the onnxruntime engine; "
                f"choose one of {', '.join(STRATEGIES)}"
            )
        if not sources:
            return []
        width = max(len(ids) for ids in sources)
        source = np.full((len(sources), width), self.pad_id, dtype=np.int64)  # (B, S)
        for b, ids in enumerate(sources):
            source[b, : len(ids)] = ids
        s, tok, links, lengths = self.run(source, upsample_ratio)
        return decode(s, tok, links, lengths, strategy, **options)

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
        ``max_sentences``.

        Raises:
            ValueError: as :meth:`translate_ids`.
        """
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
