"""The DAG beam search (prefix merging, optional KenLM n-gram language model) over numpy arrays:
the compiled search that both engines run. :func:`fadat.decoding.beam.beam_search` (torch) takes
each vertex's top tokens from the model's log-probabilities and calls :func:`beam_search` here;
the ONNX Runtime engine (:class:`fadat.engine.runtime.OnnxDAT`) feeds it the ``top_lp`` and
``top_tok`` outputs of its graph (:mod:`fadat.translation.onnx_export`). The objective, the
search, its candidates and its deviations from thu-coai/DAG-Search are described in
:mod:`fadat.decoding.beam`.

Per sentence, in float64, the compiled search (:mod:`fadat.engine._beam_jit`) keeps prefixes as
nodes of an array trie and states as array rows found through a hash table; one compiled step
per vertex ranks, prunes and expands. Without an LM, or with an ARPA file's
(:class:`fadat.engine.ngram.NgramModel`, whose n-grams the compiled search looks up itself), the
whole sentence is one compiled call. With a ``kenlm.Model`` (a KenLM binary file), Python calls
the step vertex by vertex and scores the trie nodes each step created with KenLM (which
compiled code cannot call) before the next step ranks them; the scores, and so the outputs, are
the same for the same model.

This module imports numpy only; numba (the compiled search) and ``kenlm`` (a binary language
model) are imported when a search runs, so the engine imports with onnxruntime, numpy and
sentencepiece alone. numba compiles the search on the first call in a process, about 13 s of
CPU time (about 3 s more for the search with an ARPA language model and its table), and caches
it on disk (``cache=True``: in ``__pycache__`` next to
``fadat/engine/_beam_jit.py``, else in numba's user-wide cache directory, or in
``NUMBA_CACHE_DIR``); a later process loads it in about 0.3 s of CPU time. Where no cache
directory is writable (a read-only install), every process compiles.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fadat.engine.decoding_np import PAD_ID, Hypothesis, check_inputs, path_score

#: The LM word of the special ids ``<s>``, ``<pad>``, ``</s>`` and ``<unk>``
#: (:func:`lm_words`; why: :mod:`fadat.translation.language_model`).
SPECIAL_WORD = "<unk>"


def lm_words(sp: Any, special_ids: Sequence[int]) -> list[str]:
    """The LM word of every token id of a sentencepiece model: its piece (``▁el``), and
    :data:`SPECIAL_WORD` for the ids in ``special_ids``. The one rule:
    :func:`fadat.translation.language_model.lm_words` calls it with fadat's special ids, the
    ONNX Runtime engine with its export's (:meth:`fadat.engine.runtime.OnnxDAT.lm_words`).

    Args:
        sp: a ``sentencepiece.SentencePieceProcessor``.
        special_ids: the ids of ``<s>``, ``<pad>``, ``</s>`` and ``<unk>``.

    Returns:
        ``sp.get_piece_size()`` strings, indexed by token id (:func:`beam_search`'s
        ``lm_words``).
    """
    words = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    for i in special_ids:
        words[i] = SPECIAL_WORD
    return words


class LanguageModelError(ValueError):
    """A language model file that cannot be used: ``kenlm`` not installed, the file missing,
    not a file, unreadable, or not a KenLM model (the message names the file and the reason)."""


def open_model(lm: Any, name: str = "lm") -> Any:
    """The beam search's language model: ``lm`` itself (a ``kenlm.Model`` or an
    :class:`~fadat.engine.ngram.NgramModel`), or, for the path of a file (``str``, ``bytes`` or
    path-like), that file opened once: an ARPA file (text, or gzip-compressed text) as an
    :class:`~fadat.engine.ngram.NgramModel`, whose n-grams the compiled search looks up itself;
    a KenLM binary file (``build_binary``) with ``kenlm``, quietly (no progress bar on stderr).
    The one opener: the verbs reach it through
    :func:`fadat.translation.language_model.open_language_model`.

    Args:
        lm: a ``kenlm.Model``, an ``NgramModel`` or the path of a file.
        name: how messages name the option (``lm``, or ``--lm`` for a command line).

    Raises:
        LanguageModelError: the file does not exist, is a directory or cannot be read; it is
            not an ARPA file (naming the line and the problem) nor a KenLM binary; a KenLM
            binary file and the ``kenlm`` package is not installed, or KenLM cannot read it
            (naming the file and KenLM's reason).
    """
    if not (isinstance(lm, (str, bytes)) or hasattr(lm, "__fspath__")):
        return lm
    path = os.fspath(lm)
    file = Path(os.fsdecode(path))
    if not file.exists():
        raise LanguageModelError(f"{file}: language model ({name}) not found")
    if not file.is_file():
        raise LanguageModelError(f"{file}: language model ({name}) is not a file")
    import fadat.engine.ngram as ngram

    try:
        binary = ngram.is_kenlm_binary(path)
    except OSError as err:
        raise LanguageModelError(
            f"{file}: cannot read the language model ({name}): {err.strerror}"
        ) from None
    if not binary:
        try:
            return ngram.NgramModel(path)
        except ngram.ArpaError as err:
            raise LanguageModelError(
                f"{err} ({name} takes an ARPA file or a KenLM binary)"
            ) from None
        except OSError as err:
            raise LanguageModelError(
                f"{file}: cannot read the language model ({name}): {err.strerror or err}"
            ) from None
    if importlib.util.find_spec("kenlm") is None:
        raise LanguageModelError(
            f"{file}: a KenLM binary language model ({name}) needs the kenlm package, not "
            'installed: pip install -e ".[lm]" in a checkout of fadat (or pip install kenlm; it '
            "compiles KenLM, with g++ and cmake), or give the ARPA file instead"
        )
    import kenlm

    config = kenlm.Config()
    config.show_progress = False
    config.arpa_complain = kenlm.ARPALoadComplain.NONE
    try:
        return kenlm.Model(path, config)
    except (OSError, RuntimeError, ValueError) as err:
        raise LanguageModelError(
            f"{file}: not a KenLM language model ({name}): {_kenlm_reason(err)}"
        ) from None


def _kenlm_reason(err: BaseException) -> str:
    """The useful end of a KenLM loading error (``first non-empty line was "a b" not \\data\\``),
    without its C++ source location; one line of at most 200 characters."""
    text = " ".join(str(err).split())
    match = re.search(r"threw \w+(?: because `[^`']*')?\.?\s*(.+?)\)?$", text)
    reason = match.group(1) if match else text
    return reason if len(reason) <= 200 else reason[:197] + "..."


class _LanguageModel:
    """KenLM scores (log10) of output prefixes, cached per trie node."""

    def __init__(self, lm: Any, words: Sequence[str]) -> None:
        import kenlm

        self.model = lm
        self.words = words if isinstance(words, (list, tuple)) else list(words)  # no copy per call
        self._kenlm = kenlm

    def begin(self) -> Any:
        state = self._kenlm.State()
        self.model.BeginSentenceWrite(state)
        return state

    def step(self, state: Any, token: int) -> tuple[float, Any]:
        out = self._kenlm.State()
        return self.model.BaseScore(state, self.words[token], out), out

    def finish(self, state: Any) -> float:
        return self.model.BaseScore(state, "</s>", self._kenlm.State())

    def extend(self, states: list[Any], parents: list[int], tokens: list[int]) -> list[float]:
        """Append to ``states`` the state of each new trie node (node ``parents[k]``'s state,
        then word ``tokens[k]``) and return the log10 score of each word (:meth:`step` for a
        batch of nodes, in a tight loop: the compiled search calls it every vertex)."""
        base, state, words = self.model.BaseScore, self._kenlm.State, self.words
        scores = []
        for p, t in zip(parents, tokens, strict=True):
            out = state()
            scores.append(base(states[p], words[t], out))
            states.append(out)
        return scores


class _NgramLanguageModel:
    """The scores of an :class:`~fadat.engine.ngram.NgramModel`, the same interface as
    :class:`_LanguageModel` (for the reference search), which the compiled search
    (:func:`fadat.engine._beam_jit.search_ngram`) replaces with its own lookups."""

    def __init__(self, lm: Any, words: Sequence[str]) -> None:
        self.model = lm
        self.words = words if isinstance(words, (list, tuple)) else list(words)
        self.token_words = lm.token_word_ids(self.words)  # (V_model,) int64

    def begin(self) -> np.ndarray:
        return self.model.begin()

    def step(self, state: np.ndarray, token: int) -> tuple[float, np.ndarray]:
        return self.model.base_score(state, self.words[token])

    def finish(self, state: np.ndarray) -> float:
        return self.model.base_score(state, "</s>")[0]


def language_model(lm: Any, words: Sequence[str]) -> _LanguageModel | _NgramLanguageModel:
    """The search's view of ``lm`` (:func:`open_model`'s: a path is opened here) with the LM
    word of each token id ``words``."""
    from fadat.engine.ngram import NgramModel

    model = open_model(lm)
    if isinstance(model, NgramModel):
        return _NgramLanguageModel(model, words)
    return _LanguageModel(model, words)


def check_options(
    beam_size: int,
    max_beam_per_length: int,
    top_cand_n: int,
    top_p: float,
    max_successors: int | None,
) -> None:
    """Raise ValueError for :func:`beam_search`'s out-of-range pruning options."""
    if beam_size < 1 or max_beam_per_length < 1 or top_cand_n < 1:
        raise ValueError("beam_size, max_beam_per_length and top_cand_n must be >= 1")
    if max_successors is not None and max_successors < 1:
        raise ValueError(f"max_successors must be >= 1, got {max_successors}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def beam_search(
    top_lp: np.ndarray,
    top_tok: np.ndarray,
    links: np.ndarray,
    graph_lengths: np.ndarray,
    *,
    beam_size: int = 100,
    max_beam_per_length: int = 10,
    top_cand_n: int = 5,
    top_p: float = 0.9,
    max_successors: int | None = 5,
    alpha: float = 1.1,
    lm: Any = None,
    lm_words: Sequence[str] | None = None,
    gamma: float = 0.1,
) -> list[Hypothesis]:
    """Prefix-merging beam search over the DAG from each vertex's top tokens
    (thu-coai/DAG-Search; the objective and the search: :mod:`fadat.decoding.beam`).

    The search reads nothing but these arrays: its candidates are among each vertex's first
    ``top_cand_n`` tokens, and the endpoints read their best token (the first column). Runs per
    sentence on the CPU in float64 (float32 inputs are widened exactly), in the compiled search
    (module docstring). :func:`fadat.decoding.beam.beam_search_candidates` is this search on
    torch tensors, with the same results on the same values.

    Args:
        top_lp: ``(B, L, n)`` float, the log-probabilities of ``top_tok``.
        top_tok: ``(B, L, n)`` integer, each vertex's ``n`` most likely token ids, by
            log-probability descending, ties by the lower id
            (:func:`fadat.decoding.beam.top_candidates`; the ONNX Runtime engine's graph
            outputs ``top_lp`` and ``top_tok``).
        links: ``(B, L, L)`` float, ``log E[i, j]`` (−inf where there is no edge).
        graph_lengths: ``(B,)`` integer graph sizes ``L_b`` in ``[2, L]``; entries beyond
            ``L_b`` are not read.
        beam_size: states kept per vertex (``--decode-beamsize``).
        max_beam_per_length: states kept per vertex and prefix length.
        top_cand_n: tokens per destination vertex: the first ``top_cand_n`` of the ``n``.
        top_p: candidate mass per source vertex in (0, 1]; 1 keeps all.
        max_successors: cap on candidate pairs per source vertex (None = no cap).
        alpha: α, length-normalisation exponent (``--decode-alpha``).
        lm: optional n-gram language model: a ``kenlm.Model``, an
            :class:`~fadat.engine.ngram.NgramModel`, or the path of an ARPA or KenLM binary
            file (opened at every call: open it once for many, :func:`open_model`); a binary
            file needs the optional ``kenlm`` package.
        lm_words: with ``lm``: the LM word of every token id (:func:`lm_words`).
        gamma: γ, the LM weight (``--decode-gamma``; used only with ``lm``).

    Returns:
        ``B`` :class:`~fadat.engine.decoding_np.Hypothesis`. ``score`` is the score of the
        single best (path, tokens) inside the chosen output's merged states, with the endpoints
        reading their best tokens; ``path``/``path_tokens`` are that path.

    Raises:
        ValueError: a non-positive beam/candidate count, ``top_p`` outside (0, 1]
            (:func:`check_options`); ``top_lp`` and ``top_tok`` of different shapes or not
            3-D; fewer than ``top_cand_n`` tokens per vertex; ``links`` or ``graph_lengths``
            of the wrong shape or lengths outside ``[2, L]``; ``lm`` without ``lm_words``; no
            path from vertex 0 to the end vertex.
        LanguageModelError: ``lm`` is a path that :func:`open_model` refuses.
        ImportError: numba is not installed.
    """
    check_options(beam_size, max_beam_per_length, top_cand_n, top_p, max_successors)
    top_lp, top_tok = np.asarray(top_lp), np.asarray(top_tok)
    if top_lp.shape != top_tok.shape or top_lp.ndim != 3:
        raise ValueError(
            "top_logprobs and top_tokens must both be (B, L, n), got "
            f"{tuple(top_lp.shape)} and {tuple(top_tok.shape)}"
        )
    if top_tok.shape[-1] < top_cand_n:
        raise ValueError(
            f"top_tokens has {top_tok.shape[-1]} tokens per vertex, fewer than "
            f"top_cand_n = {top_cand_n}"
        )
    links, graph_lengths = np.asarray(links), np.asarray(graph_lengths)
    check_inputs(top_lp[..., 0], top_tok[..., 0], links, graph_lengths)
    searched_lm = None
    if lm is not None:
        if lm_words is None:
            raise ValueError("lm_words (the LM word of each token id) is required with lm")
        searched_lm = language_model(lm, lm_words)
    options = (beam_size, max_beam_per_length, top_p, max_successors, alpha)
    out = []
    for b, n in enumerate(graph_lengths.tolist()):
        # one compiled specialisation: C-contiguous float64 and int64 arrays only
        tl = np.ascontiguousarray(top_lp[b, :n, :top_cand_n], dtype=np.float64)  # (L_b, n)
        tt = np.ascontiguousarray(top_tok[b, :n, :top_cand_n], dtype=np.int64)  # (L_b, n)
        ln = np.ascontiguousarray(links[b, :n, :n], dtype=np.float64)  # (L_b, L_b)
        out.append(_beam_one_compiled(tl, tt, ln, *options, searched_lm, gamma))
    return out


def _compiled():
    """The compiled search module (:mod:`fadat.engine._beam_jit`), imported on first use.

    Raises:
        ImportError: numba is not installed.
    """
    try:
        import fadat.engine._beam_jit as jit
    except ModuleNotFoundError as err:
        if err.name != "numba":
            raise
        raise ImportError(
            "the DAG beam search needs numba (pip install numba; a dependency of fadat)"
        ) from err
    return jit


def _beam_one_compiled(
    top_lp: np.ndarray,
    top_tok: np.ndarray,
    ln: np.ndarray,
    beam_size: int,
    max_beam_per_length: int,
    top_p: float,
    max_successors: int | None,
    alpha: float,
    lm: _LanguageModel | _NgramLanguageModel | None,
    gamma: float,
) -> Hypothesis:
    """Beam search of one sentence in the compiled search (:mod:`fadat.engine._beam_jit`):
    ``top_lp`` ``(L_b, n)`` float64, ``top_tok`` ``(L_b, n)`` int64, ``ln`` ``(L_b, L_b)``
    float64, all C-contiguous. Same results as :func:`fadat.decoding.beam._beam_one_reference`.

    Without an LM, or with an :class:`~fadat.engine.ngram.NgramModel`, one compiled call runs
    the sentence (:func:`~fadat.engine._beam_jit.search`,
    :func:`~fadat.engine._beam_jit.search_ngram`). With KenLM, Python calls the compiled
    :func:`~fadat.engine._beam_jit.step_grown` vertex by vertex and scores the trie nodes each step
    created with KenLM (a state per node in ``states``) before the next step ranks anything.

    Raises:
        ValueError: no path from vertex 0 to the end vertex.
    """
    jit = _compiled()
    L = ln.shape[0]
    if L == 2:
        return _two_vertex_hypothesis(top_lp, ln, top_tok[:, 0], np.zeros(2, np.int64))
    pw = np.array([max(1, k) ** alpha for k in range(L + 1)])  # (L + 1,) as the reference's
    succ = -1 if max_successors is None else max_successors
    options = (top_lp, top_tok, ln, pw, beam_size, max_beam_per_length, top_p, succ)
    cap = _arena_capacity(L)
    arena = jit.new_arena(L, int(top_tok[0, 0]), cap, cap)
    if lm is None:
        path, ptoks, cols, out = jit.search(*options, PAD_ID, arena)
    elif isinstance(lm, _NgramLanguageModel):
        contexts = np.empty((cap, max(lm.model.order - 1, 0)), np.int64)
        contexts[0] = lm.begin()
        tables = (lm.model.eos, *lm.model.tables)
        path, ptoks, cols, out = jit.search_ngram(
            *options, gamma, PAD_ID, arena, contexts, lm.token_words, *tables
        )
    else:
        states = [lm.begin()]  # the KenLM state of every trie node
        for i in range(L - 1):
            first = int(arena[-1][0])  # the id of the first node this step creates
            new, arena = jit.step_grown(i, *options, gamma, PAD_ID, arena)
            if new:
                rows = arena[0][first : first + new]  # (new, 3) parent, token, length
                scores = lm.extend(states, rows[:, 0].tolist(), rows[:, 1].tolist())
                node_lm = arena[1]
                node_lm[first : first + new] = node_lm[rows[:, 0]] + np.array(scores)
        final_lm = np.zeros(arena[0].shape[0])  # (N,) the LM's </s> at the end vertex
        for node in set(jit.vertex_nodes(L - 1, arena).tolist()):
            final_lm[node] = lm.finish(states[node])
        path, ptoks, cols, out = jit.best_path(top_tok, pw, gamma, final_lm, arena)
    score = path_score(top_lp, ln, path, cols)
    return Hypothesis(out.tolist(), path.tolist(), ptoks.tolist(), score)


def _arena_capacity(L: int) -> int:
    """The compiled search's first capacity of trie nodes and of states for a graph of ``L``
    vertices: 64 a vertex (the released model's graphs use 10-50 with the defaults), a power of
    two, at least 1024; the arena doubles when a step needs more."""
    return 1 << max(10, (64 * L - 1).bit_length())


def _two_vertex_hypothesis(
    lp: np.ndarray, ln: np.ndarray, path_tokens: np.ndarray, cols: np.ndarray
) -> Hypothesis:
    """The only path of a graph with just the start and the end vertex: an empty output; its
    tokens ``path_tokens`` ``(2,)`` are columns ``cols`` ``(2,)`` of ``lp``."""
    path, ptoks = [0, 1], [int(path_tokens[0]), int(path_tokens[1])]
    return Hypothesis([], path, ptoks, path_score(lp, ln, path, cols[:2]))
