"""The corpora ``fadat prepare`` reads: raw pairs by split (:class:`SplitText`, read chunk by
chunk from :class:`ParallelFiles` or a :class:`TsvFile`) and the adapters that turn the
command line's choice into a :class:`Corpus`: parallel text given as files
(:func:`generic_corpus`) and the built-in corpora (bible-en-es, lohelp-en-de/es,
synth-multimodal). Reading the text files themselves is :mod:`fadat.data.text`'s.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fadat.data.text import iter_lines
from fadat.errors import InputError

BUILTIN = ("bible-en-es", "lohelp-en-de", "lohelp-en-es", "synth-multimodal")
SPLITS = ("train", "valid", "test")


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
    """Everything ``prepare`` needs besides the options."""

    name: str
    source_lang: str
    target_lang: str
    splits: dict[str, PairSource]
    source_files: list[Path]
    licence: str
    attribution: str
    extra: dict = field(default_factory=dict)


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


def generic_corpus(args: argparse.Namespace) -> Corpus:
    """The corpus given as files on the command line."""
    if not args.source_lang or not args.target_lang:
        raise InputError("--source-lang and --target-lang are required for parallel text")
    splits: dict[str, PairSource] = {}
    files: list[Path] = []
    for split in SPLITS:
        prefix = "" if split == "train" else f"{split}_"
        src = getattr(args, f"{prefix}source_file")
        tgt = getattr(args, f"{prefix}target_file")
        tsv = getattr(args, f"{prefix}tsv")
        extra = getattr(args, f"{split}_extra_ref", []) if split != "train" else []
        flag = "" if split == "train" else f"{split}-"
        if tsv and (src or tgt):
            raise InputError(f"give either --{flag}tsv or --{flag}source-file/--{flag}target-file")
        if tsv:
            splits[split] = TsvFile(tsv)
            files.append(Path(tsv))
        elif src or tgt:
            if not (src and tgt):
                raise InputError(f"--{flag}source-file and --{flag}target-file go together")
            splits[split] = ParallelFiles(src, tgt, extra)
            files += [Path(src), Path(tgt)] + [Path(f) for f in extra]
        elif split == "train":
            raise InputError(
                "no input: give a built-in corpus (" + ", ".join(BUILTIN) + ") or "
                "--source-file/--target-file (or --tsv)"
            )
    return Corpus(
        name="parallel-text",
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        splits=splits,
        source_files=files,
        licence="unknown (user-supplied text)",
        attribution="user-supplied parallel text",
    )


def _direction(args: argparse.Namespace, a: str, b: str) -> tuple[str, str]:
    direction = args.direction or f"{a}-{b}"
    if direction not in (f"{a}-{b}", f"{b}-{a}"):
        raise InputError(f"--direction must be {a}-{b} or {b}-{a}, got {direction}")
    src, tgt = direction.split("-")
    return src, tgt


def bible_corpus(args: argparse.Namespace) -> Corpus:
    """bible-en-es from Debian's SWORD modules (see :mod:`fadat.data.bible`)."""
    from fadat.data import bible

    src_lang, tgt_lang = _direction(args, "en", "es")
    sword = Path(args.sword_dir or SWORD_DIR)
    corpus = bible.build_bible(sword)
    files = bible_files(sword)
    text = {"en": corpus.english, "es": corpus.spanish}
    splits = {s: SplitText() for s in SPLITS}
    for i, osis in enumerate(corpus.ids):
        part = splits[bible.split_of(osis)]
        part.source.append(text[src_lang][i])
        part.target.append(text[tgt_lang][i])
        part.where.append(osis)
        if tgt_lang == "en":
            if not part.extra_refs:
                part.extra_refs = [[]]
            part.extra_refs[0].append(corpus.kjv[i])
    splits["train"].extra_refs = []  # the KJV is a reference for evaluation only
    return Corpus(
        name="bible-en-es",
        source_lang=src_lang,
        target_lang=tgt_lang,
        splits=splits,
        source_files=files,
        licence=bible.LICENCE,
        attribution=bible.ATTRIBUTION,
        extra={
            "verse_slots": corpus.slots,
            "dropped_verses": {k: {"count": len(v), "ids": v} for k, v in corpus.dropped.items()},
            "split_books": {"test": sorted(bible.TEST_BOOKS), "valid": sorted(bible.VALID_BOOKS)},
            "ref2": "King James Version" if tgt_lang == "en" else None,
        },
    )


def bible_files(sword: Path) -> list[Path]:
    """The SWORD module files bible-en-es is read from (their sha256 go into meta.json)."""
    from fadat.data import bible

    bible.check_sword_dir(sword)
    return sorted(
        {
            p
            for module in bible.MODULES
            for p in [sword / "mods.d" / f"{module}.conf"]
            + sorted((sword / "modules" / "texts" / "ztext" / module.lower()).glob("*"))
            + sorted((sword / "modules" / "texts" / "ztext" / module).glob("*"))
            if p.is_file()
        }
    )


def source_files(args: argparse.Namespace) -> list[Path] | None:
    """Input files of a built-in corpus, known before it is built (None for parallel text)."""
    if args.corpus == "bible-en-es":
        return bible_files(Path(args.sword_dir or SWORD_DIR))
    if args.corpus in ("lohelp-en-de", "lohelp-en-es"):
        from fadat.data import lohelp

        langs = ["en", args.corpus.rsplit("-", 1)[1]]
        cache = Path(args.cache_dir) if args.cache_dir else lohelp.DEFAULT_CACHE
        lohelp.fetch_packages(langs, cache)
        return lohelp.deb_files(langs, cache)
    if args.corpus == "synth-multimodal":
        return []  # generated: the options (in the fingerprint) are the whole input
    return None


def lohelp_corpus(args: argparse.Namespace, other: str) -> Corpus:
    """lohelp-en-<other> from Debian's LibreOffice help packages (see :mod:`fadat.data.lohelp`)."""
    from fadat.data import lohelp

    src_lang, tgt_lang = _direction(args, "en", other)
    cache = Path(args.cache_dir) if args.cache_dir else lohelp.DEFAULT_CACHE
    corpus = lohelp.build_help(other, cache)
    text = {"en": corpus.english, other: corpus.other}
    splits = {s: SplitText() for s in SPLITS}
    for i, key in enumerate(corpus.keys):
        part = splits[lohelp.split_of(corpus.files[i])]
        part.source.append(text[src_lang][i])
        part.target.append(text[tgt_lang][i])
        part.where.append(key)
    packages = [lohelp.PACKAGES["en"], lohelp.PACKAGES[other]]
    return Corpus(
        name=f"lohelp-en-{other}",
        source_lang=src_lang,
        target_lang=tgt_lang,
        splits=splits,
        source_files=lohelp.deb_files(["en", other], cache),
        licence=lohelp.LICENCE,
        attribution=lohelp.ATTRIBUTION.format(packages=", ".join(packages)),
        extra={"pairing": corpus.counts},
    )


SWORD_DIR = "/usr/share/sword"


def synth_config(args: argparse.Namespace):
    """The :class:`~fadat.data.synth.SynthConfig` of the command line (checked); options not
    given keep SynthConfig's defaults."""
    from fadat.data.synth import SynthConfig

    names = ("seed", "swap_prob", "synonym_prob", "source_types", "min_words", "max_words")
    names += tuple(f"{split}_size" for split in SPLITS)
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    cfg = SynthConfig(**given)
    cfg.check()
    return cfg


def synth_corpus(args: argparse.Namespace) -> Corpus:
    """synth-multimodal (see :mod:`fadat.data.synth`); its valid sets go into ``extra``."""
    from fadat.data import synth

    if args.vocab_size != 8000 or args.model_type != "bpe" or args.spm_model:
        raise InputError(
            "synth-multimodal has a word-level vocabulary of its own: "
            "--vocab-size, --model-type and --spm-model do not apply"
        )
    cfg = synth_config(args)
    lex, generated = synth.generate(cfg)
    splits = {}
    for split, part in generated.items():
        splits[split] = SplitText(
            list(part.sources),
            list(part.targets),
            [],
            [f"{split}:{i + 1}" for i in range(len(part.sources))],
        )
    # One piece per word: every word of the training text, plus the 4 special pieces.
    train = generated["train"]
    args.model_type = "word"
    args.vocab_size = len({w for line in train.sources + train.targets for w in line.split()}) + 4
    return Corpus(
        name=synth.NAME,
        source_lang="src",
        target_lang="tgt",
        splits=splits,
        source_files=[],
        licence="generated (no third-party text)",
        attribution="synthetic corpus generated by fadat.data.synth",
        extra={
            "synth": synth.corpus_stats(lex, generated, cfg),
            "valid_sets": {s: generated[s].valid_sets for s in ("valid", "test")},
        },
    )
