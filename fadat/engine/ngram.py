"""A back-off n-gram language model read from an ARPA file, for the DAG beam search's compiled
search (:mod:`fadat.engine.beam_np`): its n-grams are looked up inside the compiled search,
one table lookup per order for each new prefix, instead of one call from Python to KenLM per
prefix.

The model is the ARPA file's: log10 probabilities and back-off weights (the ARPA format:
https://cmusphinx.github.io/wiki/arpaformat/; KenLM's reading of it:
https://kheafield.com/code/kenlm/structures/). A word's score is the probability of the longest
n-gram of (context, word) in the file plus the back-off weights of the longer contexts, summed
in float32 in KenLM's order, so it equals ``kenlm.Model.BaseScore`` for the same file (tested
against KenLM). Like KenLM, a word outside the 1-grams is ``<unk>``, and a file without
``<unk>`` is given one with log10 probability −100.

Needs numba (the table and the scores are compiled, :mod:`fadat.engine._ngram_jit`); imports
numpy only until a model is read. The file is read once, as text (or gzip-compressed text):
about 4 s of one AMD Zen 4 core for the 73 MB 5-gram file of 1.65 M n-grams, whose table then
holds 61 MB. KenLM's binary files are not read here; the beam
search opens them with the ``kenlm`` package (:func:`fadat.engine.beam_np.open_model`).
"""

from __future__ import annotations

import gc
import gzip
import io
import itertools
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: log10 probability given to ``<unk>`` when the ARPA file has none (KenLM's default).
UNKNOWN_MISSING_LOGPROB = -100.0

#: The first bytes of a KenLM binary file (``build_binary``).
KENLM_BINARY_MAGIC = b"mmap lm "

_GZIP_MAGIC = b"\x1f\x8b"
_COUNT = re.compile(r"ngram\s+(\d+)\s*=\s*(\d+)$")
_SECTION = re.compile(r"\\(\d+)-grams:$")


class ArpaError(ValueError):
    """An ARPA file that cannot be read; the message names the file, the line and the
    problem."""


def is_kenlm_binary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a KenLM binary file (it begins with :data:`KENLM_BINARY_MAGIC`).

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as handle:
        return handle.read(len(KENLM_BINARY_MAGIC)) == KENLM_BINARY_MAGIC


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as handle:
        gz = handle.read(2) == _GZIP_MAGIC
    if gz:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


_CHUNK = 1 << 16  # n-gram lines parsed at once


class _Lines:
    """The lines of a text with their numbers: iterated one at a time as ``(number, line)``,
    or taken in chunks (:meth:`take`)."""

    def __init__(self, text: io.TextIOBase) -> None:
        self.text = text
        self.number = 0  # the number of the last line read

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> tuple[int, str]:
        line = next(self.text)
        self.number += 1
        return self.number, line

    def take(self, m: int) -> tuple[int, list[str]]:
        """The number of the next line and up to ``m`` lines from it (fewer at the end)."""
        chunk = list(itertools.islice(self.text, m))
        first = self.number + 1
        self.number += len(chunk)
        return first, chunk


class NgramModel:
    """A back-off n-gram language model from an ARPA file (module docstring).

    Attributes:
        path: the file.
        order: ``N``, the longest n-gram.
        counts: the number of n-grams of each order, ``(N,)``.
        vocabulary: word → word id (its 1-gram's row: the order of the 1-grams in the file).
        unk, bos, eos: the word ids of ``<unk>``, ``<s>`` and ``</s>``.
        prob, backoff: ``(R,)`` float32, log10 probability and back-off weight of each row
            (1-grams first, then each order in file order).
        keys, rows: the n-gram table (:mod:`fadat.engine._ngram_jit`) of a power-of-two size
            at least twice ``R``: int64 keys, int32 rows (int64 from 2³¹ rows on).

    Raises:
        ArpaError: the file is not an ARPA file or breaks its format: no ``\\data\\`` header,
            a count that does not match its section, a line that is not ``prob words
            [backoff]``, a number that does not parse, a word that is not a 1-gram, an n-gram
            whose first ``n − 1`` words are not an (n−1)-gram, a repeated n-gram, no ``<s>`` or
            ``</s>``, text that is not UTF-8, a damaged gzip file (each naming the file and, where
            there is one, the line).
        OSError: the file cannot be read.
        ImportError: numba is not installed.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(os.fsdecode(os.fspath(path)))
        self._token_rows: dict[int, tuple[Sequence[str], np.ndarray]] = {}
        self._section_lines: dict[int, int | None] = {}
        collecting = gc.isenabled()
        gc.disable()  # millions of short-lived lists: the cyclic collector would cost a third
        try:
            with _open_text(self.path) as text:
                self._read(text)
        except UnicodeDecodeError as err:
            raise ArpaError(f"{self.path}: not UTF-8 text ({err.reason})") from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise ArpaError(f"{self.path}: a damaged gzip file ({err})") from None
        finally:
            if collecting:
                gc.enable()

    # reading -------------------------------------------------------------------------------

    def _fail(self, line: int, problem: str) -> ArpaError:
        return ArpaError(f"{self.path}:{line}: {problem}")

    def _read(self, text: io.TextIOBase) -> None:
        lines = _Lines(text)
        counts = self._read_header(lines)
        self.order = len(counts)
        probs: list[np.ndarray] = []
        backoffs: list[np.ndarray] = []
        words_of: list[np.ndarray | None] = []
        for n in range(1, self.order + 1):
            p, b, w = self._read_section(lines, n, counts[n - 1])
            probs.append(p)
            backoffs.append(b)
            words_of.append(w)
        self._read_end(lines)
        if "<unk>" not in self.vocabulary:
            self.vocabulary["<unk>"] = len(self.vocabulary)
            probs[0] = np.append(probs[0], UNKNOWN_MISSING_LOGPROB)
            backoffs[0] = np.append(backoffs[0], 0.0)
        self.unk = self.vocabulary["<unk>"]
        self.bos = self.vocabulary["<s>"]
        self.eos = self.vocabulary["</s>"]
        self.counts = tuple(len(p) for p in probs)
        self.prob = np.concatenate(probs).astype(np.float32)
        self.backoff = np.concatenate(backoffs).astype(np.float32)
        self._build_table(words_of)

    def _read_header(self, lines: _Lines) -> list[int]:
        for number, line in lines:
            stripped = line.strip()
            if not stripped:
                continue
            if stripped != "\\data\\":
                shown = stripped if len(stripped) <= 60 else stripped[:57] + "..."
                raise self._fail(number, f'not an ARPA file: expected \\data\\, found "{shown}"')
            break
        else:
            raise ArpaError(f"{self.path}: not an ARPA file: it is empty")
        counts: list[int] = []
        for number, line in lines:
            stripped = line.strip()
            if not stripped:
                if counts:
                    return counts
                continue
            match = _COUNT.match(stripped)
            if match is None:
                raise self._fail(number, f'expected "ngram N=COUNT", found "{stripped[:60]}"')
            if int(match.group(1)) != len(counts) + 1:
                raise self._fail(number, f"expected the count of {len(counts) + 1}-grams")
            counts.append(int(match.group(2)))
        raise ArpaError(f"{self.path}: the file ends in its \\data\\ header")

    def _read_section(self, lines: _Lines, n: int, count: int):
        """The ``count`` n-grams after their ``\\n-grams:`` line: ``(count,)`` float64
        probabilities and back-off weights, ``(count, n)`` word ids (``None`` for ``n = 1``,
        whose words become :attr:`vocabulary`). Read in chunks of lines, each parsed at once;
        a chunk that does not parse is read again line by line for the message."""
        for number, line in lines:
            stripped = line.strip()
            if not stripped:
                continue
            match = _SECTION.match(stripped)
            if match is None or int(match.group(1)) != n:
                raise self._fail(number, f'expected "\\{n}-grams:", found "{stripped[:60]}"')
            break
        else:
            raise ArpaError(f"{self.path}: the file ends before its {n}-grams")
        self._section_lines[n] = lines.number + 1  # the line of the first n-gram (for messages)
        probs = np.empty(count, np.float64)
        backoffs = np.zeros(count, np.float64)
        words = None if n == 1 else np.empty((count, n), np.int64)
        if n == 1:
            self.vocabulary = {}
        k = 0
        while k < count:
            wanted = min(count - k, _CHUNK)
            first, chunk = lines.take(wanted)
            if n == 1:
                self._check_lines(chunk, first, n, k, count, probs, backoffs, None)
            else:
                try:
                    self._parse_chunk(chunk, n, k, probs, backoffs, words)
                except (ValueError, KeyError):
                    self._check_lines(chunk, first, n, k, count, probs, backoffs, words)
                    raise
            k += len(chunk)
            if len(chunk) < wanted:
                raise ArpaError(f"{self.path}: the file ends inside its {n}-grams ({k} of {count})")
        for number, line in lines:
            if line.strip():
                raise self._fail(number, f"more {n}-grams than the header's {count}")
            break
        if n == 1:
            for special in ("<s>", "</s>"):
                if special not in self.vocabulary:
                    raise ArpaError(f"{self.path}: no 1-gram {special}")
        return probs, backoffs, words

    def _parse_chunk(
        self,
        chunk: list[str],
        n: int,
        k: int,
        probs: np.ndarray,
        backoffs: np.ndarray,
        words: np.ndarray,
    ) -> None:
        """Parse ``chunk`` (n-gram lines, ``n ≥ 2``) into rows ``k …`` of the arrays at once.

        Raises:
            ValueError, KeyError: something in it does not parse (:meth:`_check_lines` says
                what and where).
        """
        parts = [line.split() for line in chunk]
        m = len(parts)
        sizes = set(map(len, parts))
        if not sizes <= {n + 1, n + 2}:
            raise ValueError("field count")
        probs[k : k + m] = np.array([p[0] for p in parts], np.float64)
        if sizes == {n + 2}:
            backoffs[k : k + m] = np.array([p[n + 1] for p in parts], np.float64)
        elif n + 2 in sizes:
            backoffs[k : k + m] = np.array(
                [p[n + 1] if len(p) == n + 2 else "0" for p in parts], np.float64
            )
        vocabulary = self.vocabulary
        ids = np.fromiter((vocabulary[w] for p in parts for w in p[1 : n + 1]), np.int64, m * n)
        words[k : k + m] = ids.reshape(m, n)

    def _check_lines(
        self,
        chunk: list[str],
        first: int,
        n: int,
        k: int,
        count: int,
        probs: np.ndarray,
        backoffs: np.ndarray,
        words: np.ndarray | None,
    ) -> None:
        """Read ``chunk`` line by line into rows ``k …`` (the 1-grams, and the message of a
        chunk of longer n-grams that :meth:`_parse_chunk` could not parse).

        Raises:
            ArpaError: the first line that breaks the format, with its number.
        """
        vocabulary = self.vocabulary
        for i, line in enumerate(chunk):
            number = first + i
            parts = line.split()
            if not parts:
                raise self._fail(number, f"{k + i} {n}-grams, the header says {count}")
            if len(parts) == n + 2:
                try:
                    backoffs[k + i] = float(parts[-1])
                except ValueError:
                    raise self._fail(
                        number, f'back-off weight "{parts[-1]}" is not a number'
                    ) from None
            elif len(parts) != n + 1:
                raise self._fail(
                    number,
                    f"expected a probability, {n} word(s) and an optional back-off weight, "
                    f"found {len(parts)} fields",
                )
            try:
                probs[k + i] = float(parts[0])
            except ValueError:
                raise self._fail(number, f'probability "{parts[0]}" is not a number') from None
            if words is None:
                if parts[1] in vocabulary:
                    raise self._fail(number, f'the 1-gram "{parts[1]}" appears twice')
                vocabulary[parts[1]] = k + i
            else:
                try:
                    words[k + i] = [vocabulary[w] for w in parts[1 : n + 1]]
                except KeyError as err:
                    raise self._fail(number, f'"{err.args[0]}" is not among the 1-grams') from None

    def _read_end(self, lines: _Lines) -> None:
        for number, line in lines:
            stripped = line.strip()
            if not stripped:
                continue
            if stripped != "\\end\\":
                raise self._fail(number, f'expected \\end\\, found "{stripped[:60]}"')
            return
        raise ArpaError(f"{self.path}: the file ends without \\end\\")

    def _build_table(self, words_of: list[np.ndarray | None]) -> None:
        import fadat.engine._ngram_jit as _ngram_jit

        V = self.counts[0]
        size = 1
        while size < 2 * len(self.prob):
            size *= 2
        keys = np.full(size, -1, np.int64)
        rows = np.empty(size, np.int32 if len(self.prob) < 2**31 else np.int64)  # half the memory
        _ngram_jit.insert_unigrams(keys, rows, V)
        first = V
        for n in range(2, self.order + 1):
            words = words_of[n - 1]
            bad = _ngram_jit.insert_order(keys, rows, words, first, V)
            if bad != -1:
                k = bad if bad >= 0 else -2 - bad
                gram = " ".join(self._word(int(w)) for w in words[k])
                line = self._section_lines[n] + k
                if bad >= 0:
                    raise self._fail(
                        line,
                        f'the {n}-gram "{gram}" has no {n - 1}-gram of its first {n - 1} words '
                        f'("{gram.rsplit(" ", 1)[0]}"); KenLM reads such a file (pass a '
                        "kenlm.Model, or its build_binary file)",
                    )
                raise self._fail(line, f'the {n}-gram "{gram}" appears twice')
            first += len(words)
        self.keys, self.rows = keys, rows

    def _word(self, w: int) -> str:
        if not hasattr(self, "_words"):
            self._words = {v: k for k, v in self.vocabulary.items()}
        return self._words[w]

    # use -----------------------------------------------------------------------------------

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is a 1-gram other than ``<unk>`` (``kenlm.Model``'s ``in``)."""
        return word in self.vocabulary and word != "<unk>"

    def __repr__(self) -> str:
        return f"NgramModel({str(self.path)!r}, order={self.order}, counts={self.counts})"

    @property
    def tables(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(V, keys, rows, prob, backoff)``, the arguments of
        :func:`fadat.engine._ngram_jit.score` after the context and word."""
        return self.counts[0], self.keys, self.rows, self.prob, self.backoff

    def word_id(self, word: str) -> int:
        """The word id of ``word``, ``<unk>``'s if it is not a 1-gram."""
        return self.vocabulary.get(word, self.unk)

    def token_word_ids(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words),)`` int64: the word id of each token id's LM word (``lm_words``).
        Computed once per ``words`` object (the verbs and the engine pass the same list or
        tuple every time)."""
        cached = self._token_rows.get(id(words))
        if cached is not None and cached[0] is words:
            return cached[1]
        ids = np.fromiter((self.word_id(w) for w in words), np.int64, len(words))
        if len(self._token_rows) > 8:
            self._token_rows.clear()
        self._token_rows[id(words)] = (words, ids)
        return ids

    def begin(self) -> np.ndarray:
        """The context of a sentence's start, ``<s>`` (KenLM's ``BeginSentenceWrite``):
        ``(N − 1,)`` int64."""
        context = self.null_context()
        if self.order > 1:
            context[0] = self.bos
        return context

    def null_context(self) -> np.ndarray:
        """The empty context (KenLM's ``NullContextWrite``): ``(N − 1,)`` int64."""
        return np.full(self.order - 1, -1, np.int64)

    def base_score(self, context: np.ndarray, word: str) -> tuple[float, np.ndarray]:
        """log10 P(``word`` | ``context``) and the context after it (KenLM's ``BaseScore``)."""
        from fadat.engine._ngram_jit import score

        out = np.empty(self.order - 1, np.int64)
        p = score(context, self.word_id(word), *self.tables, out)
        return float(p), out

    def score(self, sentence: str, bos: bool = True, eos: bool = True) -> float:
        """log10 probability of a sentence of space-separated words (``kenlm.Model.score``)."""
        context = self.begin() if bos else self.null_context()
        total = 0.0
        for word in sentence.split() + (["</s>"] if eos else []):
            p, context = self.base_score(context, word)
            total += p
        return total
