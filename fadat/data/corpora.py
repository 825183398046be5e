"""The corpora :func:`fadat.data.prepare.prepare` reads, one record each, in one registry.

- What a built corpus is: raw pairs by split (:class:`SplitText`, read chunk by chunk from
  :class:`ParallelFiles` or a :class:`TsvFile`; reading the text files themselves is
  :mod:`fadat.data.text`'s) with its languages, input files and licence (:class:`Corpus`).
- What a kind of corpus is: a :class:`CorpusSpec` (its name, its options as
  :class:`CorpusOption` records, the generic options that do not apply to it, the function that
  builds its :class:`Corpus`), registered by one line in :data:`REGISTRY`. ``fadat prepare``'s
  flags, the refusal of an option given with a corpus that does not read it
  (:func:`corpus_options`) and the dispatch (:data:`CORPORA`) are derived from the records; no
  other module knows a corpus's quirks.

The records: ``parallel-text`` (the user's text files, :data:`PARALLEL_TEXT_CORPUS`, here),
``bible-en-es`` (:mod:`fadat.data.bible`), ``lohelp-en-de`` / ``lohelp-en-es``
(:mod:`fadat.data.lohelp`), ``synth-multimodal`` (:mod:`fadat.data.synth`). To add a corpus: its
module with a record and one line in :data:`REGISTRY` (docs/extending.md, "A new corpus").
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fadat.data.text import iter_lines
from fadat.errors import InputError

SPLITS = ("train", "valid", "test")
#: The corpus of the user's own text files: ``fadat prepare`` without a corpus name.
PARALLEL_TEXT = "parallel-text"

#: name → ``"module:attribute"`` of its :class:`CorpusSpec`: one line per corpus, imported only
#: when :data:`CORPORA` is asked for it. The order is the order of messages that list corpora.
REGISTRY: dict[str, str] = {
    "bible-en-es": "fadat.data.bible:BIBLE_EN_ES",
    "lohelp-en-de": "fadat.data.lohelp:LOHELP_EN_DE",
    "lohelp-en-es": "fadat.data.lohelp:LOHELP_EN_ES",
    "synth-multimodal": "fadat.data.synth:SYNTH_MULTIMODAL",
    PARALLEL_TEXT: "fadat.data.corpora:PARALLEL_TEXT_CORPUS",
}


@dataclass
class SplitText:
    """Raw pairs of one split held in memory; ``where[i]`` is ``"file:line"`` (or a verse or
    paragraph id). Built-in corpora come this way; chunks of streamed files too."""

    source: list[str] = field(default_factory=list)
    target: list[str] = field(default_factory=list)
    extra_refs: list[list[str]] = field(default_factory=list)  # ref2, ref3, … streams
    where: Sequence[str] = field(default_factory=list)

    def chunks(self, size: int) -> Iterator[SplitText]:
        """Consecutive pieces of at most ``size`` pairs."""
        for start in range(0, len(self.source), size):
            stop = start + size
            yield SplitText(
                self.source[start:stop],
                self.target[start:stop],
                [r[start:stop] for r in self.extra_refs],
                self.where[start:stop],
            )


class LinePositions(Sequence[str]):
    """``"file:line"`` of the pairs of a chunk, made when asked (a drop or an error)."""

    def __init__(self, path: str | Path, first_line: int, count: int) -> None:
        self.path, self.first_line, self.count = path, first_line, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.count))]
        if not 0 <= i < self.count:
            raise IndexError(i)
        return f"{self.path}:{self.first_line + i}"


@dataclass
class Corpus:
    """A corpus ready to build: everything :func:`fadat.data.build.build` needs besides the
    generic options (:class:`fadat.data.build.BuildOptions`).

    Attributes:
        name: the registry name (``meta.json``'s ``"corpus"``).
        source_lang, target_lang: language codes.
        splits: ``"train"`` (required), ``"valid"``, ``"test"`` → its pairs.
        source_files: the files it is read from (their sha256 go into ``meta.json`` and the
            fingerprint); ``[]`` for a generated corpus.
        licence, attribution: for ``meta.json``.
        extra: more facts for ``meta.json`` (``"corpus_details"``).
        model_type, vocab_size: the sentencepiece model type and vocabulary size the corpus
            fixes (synth-multimodal: one piece per word); ``None``: the options'.
        write_files: ``(directory, measured)`` → writes the corpus's own files into the dataset
            directory after the build (``measured``: :func:`fadat.data.build.build`'s result);
            ``None``: none.
        timings: ``meta.json`` records the build's seconds; ``False`` for a generated corpus, so
            that the same options give a byte-identical dataset.
    """

    name: str
    source_lang: str
    target_lang: str
    splits: dict[str, PairSource]
    source_files: list[Path]
    licence: str
    attribution: str
    extra: dict = field(default_factory=dict)
    model_type: str | None = None
    vocab_size: int | None = None
    write_files: Callable[[Path, dict], None] | None = None
    timings: bool = True


class ParallelFiles:
    """Line-aligned files (source, target, extra references…) read chunk by chunk."""

    def __init__(self, source: str, target: str, extra: Sequence[str] = ()) -> None:
        self.files = [source, target, *extra]

    def chunks(self, size: int) -> Iterator[SplitText]:
        """Chunks of at most ``size`` pairs, in file order.

        Raises:
            InputError: any file problem, or files whose line counts differ (names both files).
        """
        streams = [iter_lines(f) for f in self.files]
        done = 0
        while True:
            rows = [list(itertools.islice(s, size)) for s in streams]
            counts = [len(r) for r in rows]
            if len(set(counts)) > 1:
                total = [done + c + sum(1 for _ in s) for c, s in zip(counts, streams, strict=True)]
                k = next(k for k in range(1, len(total)) if total[k] != total[0])
                raise InputError(
                    f"line counts differ: {self.files[0]} has {total[0]} lines, "
                    f"{self.files[k]} has {total[k]}"
                )
            if counts[0]:
                where = LinePositions(self.files[0], done + 1, counts[0])
                yield SplitText(rows[0], rows[1], rows[2:], where)
            done += counts[0]
            if counts[0] < size:
                return


class TsvFile:
    """TSV pairs (source, target, extra references…) read chunk by chunk."""

    def __init__(self, path: str) -> None:
        self.path = path

    def chunks(self, size: int) -> Iterator[SplitText]:
        """Chunks of at most ``size`` pairs, in file order.

        Raises:
            InputError: file problems, or a line whose column count differs (file:line).
        """
        cols = None
        out = None
        for i, line in enumerate(iter_lines(self.path), 1):
            fields = line.split("\t")
            if cols is None:
                cols = len(fields)
                if cols < 2:
                    raise InputError(f"{self.path}:{i}: expected at least 2 tab-separated columns")
            if len(fields) != cols:
                raise InputError(f"{self.path}:{i}: {len(fields)} columns, line 1 has {cols}")
            if out is None:
                out = SplitText(
                    [], [], [[] for _ in range(cols - 2)], LinePositions(self.path, i, 0)
                )
            out.source.append(fields[0])
            out.target.append(fields[1])
            for k, ref in enumerate(fields[2:]):
                out.extra_refs[k].append(ref)
            out.where.count += 1
            if len(out.source) == size:
                yield out
                out = None
        if out is not None:
            yield out


PairSource = SplitText | ParallelFiles | TsvFile  # anything with .chunks(size)


# ----------------------------------------------------------------------------------------------
# The records


@dataclass(frozen=True)
class CorpusOption:
    """One option of a corpus: a keyword of :func:`fadat.data.prepare.prepare` and of the
    corpus's ``make``, and a ``fadat prepare`` flag (``--swap-prob`` for ``swap_prob``).

    Attributes:
        name: the keyword.
        type: ``str``, ``int`` or ``float``: what the flag converts its value to.
        default: what ``make`` receives when the option is not given (``None``: not set, e.g.
            a default location).
        help: the flag's help text.
        path: ``"file"``: an input file (never the output; its bytes, not its name, are
            fingerprinted); ``"dir"``: a directory the corpus is read or downloaded into (not
            fingerprinted: the files read from it are); ``""``: a value, part of the dataset's
            fingerprint.
        repeatable: a list of values (``--valid-extra-ref`` given several times).
        refusal: the message when the option is given with a corpus that does not read it
            (``{corpus}`` is that corpus); ``""``: "``FLAG`` applies to ..., not to ...".
    """

    name: str
    type: type
    default: Any
    help: str
    path: str = ""
    repeatable: bool = False
    refusal: str = ""

    @property
    def flag(self) -> str:
        """``--swap-prob``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class CorpusSpec:
    """A kind of corpus, registered by name in :data:`REGISTRY`.

    Attributes:
        name: the registry key: ``fadat prepare NAME``, ``prepare(NAME, ...)``, ``meta.json``'s
            ``"corpus"``.
        help: one line: what the corpus is.
        make: ``make(**options) -> Corpus``, called with every option of ``options`` (the
            defaults filled in); raises :class:`~fadat.errors.InputError` for bad input.
        options: its own options (:class:`CorpusOption`), in ``--help`` order. Two corpora that
            take one option (``direction``) declare it identically.
        inputs: ``inputs(**options) -> list[Path]``: the files the corpus will be read from,
            known before it is built (the fingerprint of an up-to-date dataset needs no build);
            ``None``: ``make(**options).source_files`` (a corpus that is cheap to make).
        check: ``check(**options)``: raises :class:`~fadat.errors.InputError` for bad option
            values, before the output is touched; ``None``: none.
        excludes: the generic options (keywords of :func:`fadat.data.prepare.prepare`) that do
            not apply to it, refused when given a value other than their default ...
        excludes_reason: ... with the message "NAME has REASON: FLAGS do not apply".
        instead: other corpora's options that callers give to this one by mistake → the message
            that points to this corpus's own (parallel text: ``direction`` → "use
            --source-lang/--target-lang").
        title: how messages name it ("" = ``name``); ``usage``: how to choose it, added after
            the title where a message says what was chosen ("" = nothing).
        group: the title of its flags' group in ``fadat prepare --help`` ("" = ``name``).
    """

    name: str
    help: str
    make: Callable[..., Corpus]
    options: tuple[CorpusOption, ...] = ()
    inputs: Callable[..., list[Path]] | None = None
    check: Callable[..., None] | None = None
    excludes: tuple[str, ...] = ()
    excludes_reason: str = ""
    instead: Mapping[str, str] = field(default_factory=dict)
    title: str = ""
    usage: str = ""
    group: str = ""

    def option_names(self) -> tuple[str, ...]:
        """The keywords of its options, in order."""
        return tuple(o.name for o in self.options)

    def defaults(self) -> dict[str, Any]:
        """``{option: default}`` of its options (repeatable ones as ``[]``)."""
        return {o.name: list(o.default or ()) if o.repeatable else o.default for o in self.options}

    def described(self, chosen: bool = False) -> str:
        """``title``, with ``usage`` after it when ``chosen`` (what a refusal names)."""
        title = self.title or self.name
        return f"{title} ({self.usage})" if chosen and self.usage else title


class _LazyCorpora(Mapping[str, CorpusSpec]):
    """:data:`REGISTRY` as ``name → CorpusSpec``, importing a corpus's module when it is asked
    for (its names and their order need no import). Looked up on every access, so that a test
    may replace a record in its module."""

    def __init__(self, registry: dict[str, str]) -> None:
        self._registry = registry

    def __getitem__(self, name: str) -> CorpusSpec:
        module, attribute = self._registry[name].split(":")  # KeyError: unknown name
        spec = getattr(importlib.import_module(module), attribute)
        if spec.name != name:
            raise ValueError(f"REGISTRY[{name!r}] is the corpus {spec.name!r}")
        return spec

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry)


#: name → corpus record (a read-only mapping over :data:`REGISTRY`, loaded lazily).
CORPORA: Mapping[str, CorpusSpec] = _LazyCorpora(REGISTRY)


def builtin() -> tuple[str, ...]:
    """The corpora named on the command line (``fadat prepare CORPUS``): all but parallel
    text, in registry order."""
    return tuple(name for name in REGISTRY if name != PARALLEL_TEXT)


def corpus_spec(name: str) -> CorpusSpec:
    """The record of the corpus ``name``.

    Raises:
        InputError: no such corpus (naming the registered ones).
    """
    if name not in REGISTRY:
        raise InputError(f"unknown corpus {name!r}: the corpora are {', '.join(REGISTRY)}")
    return CORPORA[name]


def corpus_module_file(name: str) -> Path:
    """The source file of the module that defines the corpus ``name`` (its code is part of a
    dataset's fingerprint)."""
    origin = importlib.util.find_spec(REGISTRY[name].split(":")[0]).origin
    return Path(origin)


def all_options() -> tuple[CorpusOption, ...]:
    """The options of every registered corpus, each once, in registry order.

    Raises:
        ValueError: two corpora declare one name differently.
    """
    seen: dict[str, CorpusOption] = {}
    for spec in CORPORA.values():
        for option in spec.options:
            if seen.setdefault(option.name, option) != option:
                raise ValueError(f"two corpora declare different options {option.name!r}")
    return tuple(seen.values())


def readers(name: str) -> list[CorpusSpec]:
    """The corpora that take the option ``name``, in registry order."""
    return [spec for spec in CORPORA.values() if name in spec.option_names()]


def _given(value: Any) -> bool:
    """Whether an option was given: ``None`` and an empty list mean "not given" (a flag left
    out)."""
    return value is not None and not (isinstance(value, list | tuple) and not value)


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def corpus_options(
    spec: CorpusSpec, given: Mapping[str, Any], generic: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``spec.make``: its options' defaults, updated with the given
    ones, after checking that every given option applies to it.

    Args:
        spec: the chosen corpus.
        given: option → value, of any corpus; ``None`` and ``[]`` count as not given.
        generic: generic option (a keyword of :func:`fadat.data.prepare.prepare`) → whether it
            was set to something other than its default (for ``spec.excludes``).

    Returns:
        ``{option: value}`` for every option of ``spec``; a path as ``str``, a repeatable
        option as a list.

    Raises:
        TypeError: an option that no registered corpus takes.
        InputError: an option of another corpus (its ``refusal``, or ``spec.instead``'s message,
            or "FLAG applies to A and B, not to CHOSEN"; the first in registry order), a generic
            option in ``spec.excludes``, or a bad value (``spec.check``).
    """
    options = all_options()
    known = {o.name for o in options}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"unknown corpus option {unknown[0]!r}: the options of {spec.name} are "
            f"{', '.join(spec.option_names()) or 'none'}"
        )
    own = set(spec.option_names())
    foreign = [o for o in options if o.name not in own and _given(given.get(o.name))]
    for option in foreign:  # the messages that say what to do instead come first
        if option.refusal:
            raise InputError(option.refusal.format(corpus=spec.described()))
        if option.name in spec.instead:
            raise InputError(spec.instead[option.name])
    for option in foreign:
        names = " and ".join(r.described() for r in readers(option.name))
        raise InputError(f"{option.flag} applies to {names}, not to {spec.described(True)}")
    excluded = [name for name in spec.excludes if (generic or {}).get(name)]
    if excluded:
        flags = _and(["--" + name.replace("_", "-") for name in spec.excludes])
        raise InputError(f"{spec.name} has {spec.excludes_reason}: {flags} do not apply")
    values = spec.defaults()
    for option in spec.options:
        value = given.get(option.name)
        if not _given(value):
            continue
        if option.repeatable:
            value = [os.fspath(v) if option.path else v for v in value]
        elif option.path:
            value = os.fspath(value)
        values[option.name] = value
    if spec.check is not None:
        spec.check(**values)
    return values


# ----------------------------------------------------------------------------------------------
# Parallel text: the user's files


#: The refusal of an input file given with a built-in corpus.
EITHER = "give either the built-in corpus {corpus} or input files, not both"


UNKNOWN_LICENCE = "unknown (user-supplied text)"
"""What a parallel-text dataset records as its licence when ``--licence`` is not given."""
UNKNOWN_ATTRIBUTION = "user-supplied parallel text"
"""What a parallel-text dataset records as its source when ``--attribution`` is not given."""


def _text_options() -> tuple[CorpusOption, ...]:
    """The input files of every split, then the languages (the "parallel text" group)."""
    found = []
    for split in SPLITS:
        prefix = "" if split == "train" else f"{split}_"
        found += [
            CorpusOption(
                f"{prefix}source_file",
                str,
                None,
                f"{split} source text, one line per sentence",
                path="file",
                refusal=EITHER,
            ),
            CorpusOption(
                f"{prefix}target_file",
                str,
                None,
                f"{split} target text",
                path="file",
                refusal=EITHER,
            ),
            CorpusOption(
                f"{prefix}tsv",
                str,
                None,
                f"{split} pairs as TSV: source, target, extra refs",
                path="file",
                refusal=EITHER,
            ),
        ]
        if split != "train":
            found.append(
                CorpusOption(
                    f"{split}_extra_ref",
                    str,
                    None,
                    f"an extra {split} reference file (ref2, ref3, … in order); repeatable",
                    path="file",
                    repeatable=True,
                    refusal=EITHER,
                )
            )
    found += [
        CorpusOption("source_lang", str, None, "source language code"),
        CorpusOption("target_lang", str, None, "target language code"),
        CorpusOption(
            "licence",
            str,
            None,
            "the text's licence, kept in meta.json and in every model trained on the dataset "
            f"(default: {UNKNOWN_LICENCE!r})",
        ),
        CorpusOption(
            "attribution",
            str,
            None,
            f"where the text comes from, kept like --licence (default: {UNKNOWN_ATTRIBUTION!r})",
        ),
    ]
    return tuple(found)


def parallel_text_corpus(
    source_file: str | Path | None = None,
    target_file: str | Path | None = None,
    tsv: str | Path | None = None,
    valid_source_file: str | Path | None = None,
    valid_target_file: str | Path | None = None,
    valid_tsv: str | Path | None = None,
    valid_extra_ref: Sequence[str | Path] | None = None,
    test_source_file: str | Path | None = None,
    test_target_file: str | Path | None = None,
    test_tsv: str | Path | None = None,
    test_extra_ref: Sequence[str | Path] | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    licence: str | None = None,
    attribution: str | None = None,
) -> Corpus:
    """The corpus of the user's text files: per split, line-aligned source and target files
    (with extra references of valid/test, ref2, ref3, …) or one TSV file (columns: source,
    target, extra references); nothing is read yet. ``licence`` and ``attribution`` are what
    the dataset's ``meta.json`` records, and with it every model averaged from a run on it
    (``config.json``'s ``data``); not given: :data:`UNKNOWN_LICENCE`,
    :data:`UNKNOWN_ATTRIBUTION`.

    Raises:
        InputError: no training input, a missing language code, a TSV together with text files
            of one split, a source file without its target file (or the reverse).
    """
    if not source_lang or not target_lang:
        raise InputError("--source-lang and --target-lang are required for parallel text")
    inputs = {
        "train": (source_file, target_file, tsv, ()),
        "valid": (valid_source_file, valid_target_file, valid_tsv, valid_extra_ref or ()),
        "test": (test_source_file, test_target_file, test_tsv, test_extra_ref or ()),
    }
    splits: dict[str, PairSource] = {}
    files: list[Path] = []
    for split, (src, tgt, tsv_file, extra_refs) in inputs.items():
        extra = [os.fspath(f) for f in extra_refs]
        flag = "" if split == "train" else f"{split}-"
        if tsv_file and (src or tgt):
            raise InputError(f"give either --{flag}tsv or --{flag}source-file/--{flag}target-file")
        if tsv_file:
            splits[split] = TsvFile(os.fspath(tsv_file))
            files.append(Path(tsv_file))
        elif src or tgt:
            if not (src and tgt):
                raise InputError(f"--{flag}source-file and --{flag}target-file go together")
            splits[split] = ParallelFiles(os.fspath(src), os.fspath(tgt), extra)
            files += [Path(src), Path(tgt)] + [Path(f) for f in extra]
        elif split == "train":
            raise InputError(
                "no input: give a built-in corpus (" + ", ".join(builtin()) + ") or "
                "--source-file/--target-file (or --tsv)"
            )
    return Corpus(
        name=PARALLEL_TEXT,
        source_lang=source_lang,
        target_lang=target_lang,
        splits=splits,
        source_files=files,
        licence=" ".join((licence or "").split()) or UNKNOWN_LICENCE,
        attribution=" ".join((attribution or "").split()) or UNKNOWN_ATTRIBUTION,
    )


PARALLEL_TEXT_CORPUS = CorpusSpec(
    name=PARALLEL_TEXT,
    help="your own parallel text: line-aligned files or TSV, per split",
    make=parallel_text_corpus,
    options=_text_options(),
    instead={"direction": "--direction is for built-in corpora; use --source-lang/--target-lang"},
    title="parallel text",
    usage="--source-file/--target-file, --tsv",
    group="parallel text",
)


# ----------------------------------------------------------------------------------------------
# What the built-in corpora share

#: The translation direction of a built-in corpus of two languages (bible, lohelp).
DIRECTION = CorpusOption("direction", str, None, "built-in corpora: e.g. en-es or es-en")


def direction_of(direction: str | None, a: str, b: str) -> tuple[str, str]:
    """``(source, target)`` language of ``direction`` (``"a-b"`` or ``"b-a"``; ``None``:
    ``a-b``).

    Raises:
        InputError: another direction.
    """
    direction = direction or f"{a}-{b}"
    if direction not in (f"{a}-{b}", f"{b}-{a}"):
        raise InputError(f"--direction must be {a}-{b} or {b}-{a}, got {direction}")
    src, tgt = direction.split("-")
    return src, tgt
