"""``fadat prepare``: parallel text or a built-in corpus → a binarized dataset directory.

Forms:

- ``fadat prepare --source-file F --target-file F [--valid-source-file … --test-…]
  --source-lang xx --target-lang yy --output DIR`` (plain text, one sentence per line), or the
  same with ``--tsv F [--valid-tsv F --test-tsv F]`` (columns: source, target, extra references);
- ``fadat prepare bible-en-es --output DIR [--direction en-es|es-en]``;
- ``fadat prepare lohelp-en-de|lohelp-en-es --output DIR [--direction …]``;
- ``fadat prepare synth-multimodal --output DIR [--seed S] [--swap-prob P] [--synonym-prob Q]
  [--train-size N]``: the synthetic multi-modal corpus of :mod:`fadat.data.synth` (word-level
  vocabulary; valid/test also get ``raw/{split}.validset.jsonl``, their sets of valid
  translations).

Steps (:func:`build`), streaming: the text files are read in blocks and processed in chunks of
``--chunk-pairs`` pairs, so memory does not grow with the corpus. (1) Read and check every split
(:class:`~fadat.errors.InputError` naming file and line for invalid UTF-8, NUL bytes, a
line-count mismatch, a bad TSV line; missing files; an empty corpus) and drop empty pairs.
(2) Train a joint sentencepiece model (or reuse one with ``--spm-model``) on a random sample of
``--spm-sample-pairs`` training pairs (default 1,000,000; drawn by :func:`spm_sample` with a
fixed seed, because sentencepiece's own ``shuffle_input_sentence`` sampling is not reproducible
from run to run). (3) Encode each chunk with ``--threads`` sentencepiece threads, drop pairs over
``--max-source-positions`` / ``--max-target-positions`` (``--strict``: error instead) and append
the ids straight to the split's ``.npy`` files (:class:`fadat.data.binarized.SplitWriter`; ids in
the smallest dtype that holds the vocabulary), the raw valid/test text to ``raw/``; then
``meta.json``. The output does not depend on the chunk size or the thread count.
Everything is written to a temporary directory next to the output that is renamed into place at
the end, so an interrupted run (Ctrl-C, SIGTERM) leaves nothing half-written; the temporary
directory of a killed run (SIGKILL) is removed by the next run. Re-running with the same inputs
and options finds the same fingerprint in ``meta.json`` and does nothing; different inputs are
refused unless ``--force``. The output is checked before the corpus is read (:mod:`fadat.outputs`):
a regular file, a directory that ``fadat prepare`` did not build, or a dataset directory holding
files that ``fadat prepare`` did not write is never replaced, ``--force`` or not.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from fadat import outputs
from fadat.data import binarized, spm
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.data.text import iter_lines
from fadat.errors import InputError
from fadat.options import positive_int
from fadat.process import terminate_as_interrupt

FORMAT_VERSION = 1
BUILTIN = ("bible-en-es", "lohelp-en-de", "lohelp-en-es", "synth-multimodal")
SPLITS = ("train", "valid", "test")
MAX_POSITIONS_SHOWN = 10
CHUNK_PAIRS = 20_000  # pairs encoded at a time: about 50 MB of Python objects
SPM_SAMPLE_PAIRS = 1_000_000  # sentencepiece training sample (2M lines)
SPM_SAMPLE_SEED = 20260101


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat prepare``."""
    parser.add_argument(
        "corpus", nargs="?", choices=BUILTIN, help="a built-in corpus (else give text files)"
    )
    parser.add_argument("--output", "-o", required=True, help="output directory")
    parser.add_argument("--direction", help="built-in corpora: e.g. en-es or es-en")
    g = parser.add_argument_group("parallel text")
    for split in SPLITS:
        prefix = "" if split == "train" else f"{split}-"
        g.add_argument(f"--{prefix}source-file", help=f"{split} source text, one line per sentence")
        g.add_argument(f"--{prefix}target-file", help=f"{split} target text")
        g.add_argument(f"--{prefix}tsv", help=f"{split} pairs as TSV: source, target, extra refs")
        if split != "train":
            g.add_argument(
                f"--{split}-extra-ref",
                action="append",
                default=[],
                help=f"an extra {split} reference file (ref2, ref3, … in order); repeatable",
            )
    g.add_argument("--source-lang", help="source language code")
    g.add_argument("--target-lang", help="target language code")
    s = parser.add_argument_group("sentencepiece and filtering")
    s.add_argument("--spm-model", help="reuse this sentencepiece model instead of training one")
    s.add_argument(
        "--vocab-size", type=positive_int, default=8000, help="joint vocabulary (default 8000)"
    )
    s.add_argument("--model-type", default="bpe", choices=("bpe", "unigram", "char", "word"))
    s.add_argument(
        "--spm-sample-pairs",
        type=int,
        default=SPM_SAMPLE_PAIRS,
        help="train sentencepiece on this many training pairs (source and target line each), "
        f"drawn at random with a fixed seed; 0: all pairs (default {SPM_SAMPLE_PAIRS:,})",
    )
    s.add_argument(
        "--max-source-positions",
        type=positive_int,
        default=1024,
        help="drop pairs whose source (with </s>) is longer (default 1024)",
    )
    s.add_argument(
        "--max-target-positions",
        type=positive_int,
        default=1024,
        help="drop pairs whose target (with <s> </s>) is longer (default 1024)",
    )
    s.add_argument(
        "--strict",
        action="store_true",
        help="empty or over-long pairs are errors instead of being dropped",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="replace a dataset directory (of fadat prepare) built from different inputs",
    )
    s.add_argument(
        "--chunk-pairs",
        type=int,
        default=CHUNK_PAIRS,
        help=f"pairs encoded and written at a time (memory; the output is the same; default "
        f"{CHUNK_PAIRS:,})",
    )
    s.add_argument(
        "--threads",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="sentencepiece encoding threads (the output is the same; default: cores, at most 4)",
    )
    from fadat.data.synth import SynthConfig

    # Defaults are None so that a flag given with another corpus is an error, not ignored
    # (_refuse_inapplicable); synth_config fills in SynthConfig's defaults.
    d = SynthConfig()
    y = parser.add_argument_group("synth-multimodal (fadat.data.synth)")
    y.add_argument("--seed", type=int, default=None, help=f"random seed ({d.seed})")
    y.add_argument(
        "--swap-prob",
        type=float,
        default=None,
        help=f"P: adjacent phrase pairs swapped with this probability ({d.swap_prob})",
    )
    y.add_argument(
        "--synonym-prob",
        type=float,
        default=None,
        help=f"Q: fraction of source word types with two synonyms ({d.synonym_prob})",
    )
    y.add_argument(
        "--source-types",
        type=int,
        default=None,
        help=f"source vocabulary in words ({d.source_types})",
    )
    y.add_argument("--min-words", type=int, default=None, help=f"shortest source ({d.min_words})")
    y.add_argument("--max-words", type=int, default=None, help=f"longest source ({d.max_words})")
    for split in SPLITS:
        default = getattr(d, f"{split}_size")
        y.add_argument(f"--{split}-size", type=int, default=None, help=f"{split} pairs ({default})")
    s.add_argument("--sword-dir", default=None, help=f"bible-en-es: SWORD modules ({SWORD_DIR})")
    s.add_argument(
        "--cache-dir",
        default=None,
        help="lohelp: where .deb files are downloaded (default ~/.cache/fadat/debs)",
    )


def _input_flags(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """``(flag, path)`` of every input file given on the command line (for
    :func:`fadat.outputs.check_not_input`)."""
    found: list[tuple[str, str | None]] = [("--spm-model", args.spm_model)]
    for split in SPLITS:
        prefix = "" if split == "train" else f"{split}-"
        for name in ("source-file", "target-file", "tsv"):
            flag = f"--{prefix}{name}"
            found.append((flag, getattr(args, flag[2:].replace("-", "_"), None)))
        if split != "train":
            found += [(f"--{split}-extra-ref", p) for p in getattr(args, f"{split}_extra_ref", [])]
    return found


def log(message: str) -> None:
    print(f"fadat prepare: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- reading input
# (the text files themselves: fadat.data.text)


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


#: Options of only some corpora: flag → the corpora that read it (None: parallel text).
CORPUS_OPTIONS: dict[str, tuple[str | None, ...]] = {
    **{
        f"--{name}": ("synth-multimodal",)
        for name in (
            "seed",
            "swap-prob",
            "synonym-prob",
            "source-types",
            "min-words",
            "max-words",
            *(f"{split}-size" for split in SPLITS),
        )
    },
    "--sword-dir": ("bible-en-es",),
    "--cache-dir": ("lohelp-en-de", "lohelp-en-es"),
    "--direction": ("bible-en-es", "lohelp-en-de", "lohelp-en-es"),
    "--source-lang": (None,),
    "--target-lang": (None,),
}

SWORD_DIR = "/usr/share/sword"


def _refuse_inapplicable(args: argparse.Namespace) -> None:
    """An option of another corpus is an error, not silently ignored.

    Raises:
        InputError: naming the flag and the corpora it applies to.
    """
    for flag, corpora in CORPUS_OPTIONS.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and args.corpus not in corpora:
            names = ["parallel text" if c is None else c for c in corpora]
            chosen = args.corpus or "parallel text (--source-file/--target-file, --tsv)"
            raise InputError(f"{flag} applies to {' and '.join(names)}, not to {chosen}")


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


# ----------------------------------------------------------------------------- writing


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes.

    Raises:
        InputError: missing or unreadable file.
    """
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as err:  # the same message as fadat.data.text's reader
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from err
    return h.hexdigest()


def fingerprint(args: argparse.Namespace, corpus_name: str, files: list[dict]) -> str:
    """sha256 of everything the output depends on (inputs, options, format version); not the
    options that change only speed and memory (``--chunk-pairs``, ``--threads``)."""
    spm_sha = sha256_file(Path(args.spm_model)) if args.spm_model else None
    # The code that builds the data is an input too: a changed cleaner must not be "up to date".
    code = hashlib.sha256()
    for module in ("prepare", "bible", "lohelp", "synth", "spm", "binarized", "contract"):
        code.update((Path(__file__).parent / f"{module}.py").read_bytes())
    key = {
        "format": FORMAT_VERSION,
        "code": code.hexdigest(),
        "corpus": corpus_name,
        "direction": args.direction,
        "langs": [args.source_lang, args.target_lang] if corpus_name == "parallel-text" else None,
        "files": [f["sha256"] for f in files],
        "spm_model": spm_sha,
        "vocab_size": args.vocab_size,
        "model_type": args.model_type,
        "spm_sample_pairs": None if args.spm_model else args.spm_sample_pairs,
        "max_positions": [args.max_source_positions, args.max_target_positions],
        "strict": args.strict,
    }
    if corpus_name == "synth-multimodal":
        key["synth"] = synth_config(args).__dict__
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _stats(lengths: list[int] | np.ndarray) -> dict:
    a = np.asarray(lengths, dtype=np.float64)
    if len(a) == 0:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0, "max": 0}
    return {
        "mean": round(float(a.mean()), 2),
        "median": float(np.median(a)),
        "p95": round(float(np.percentile(a, 95)), 2),
        "max": int(a.max()),
    }


class _Drops:
    """Dropped pairs per reason: count and the first positions."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.reasons: dict[str, dict] = {}

    def add(self, reason: str, where: str, detail: str) -> None:
        if self.strict:
            raise InputError(f"{where}: {detail} (--strict)")
        entry = self.reasons.setdefault(reason, {"count": 0, "first": []})
        entry["count"] += 1
        if len(entry["first"]) < MAX_POSITIONS_SHOWN:
            entry["first"].append(where)


def _nonempty(chunk: SplitText, drops: _Drops | None = None) -> list[int]:
    """Positions of the chunk's pairs with text on both sides; the others go to ``drops``."""
    keep = []
    for i, (s, t) in enumerate(zip(chunk.source, chunk.target, strict=True)):
        if s.strip() and t.strip():
            keep.append(i)
        elif drops is not None:
            side = "source" if not s.strip() else "target"
            drops.add("empty", chunk.where[i], f"empty {side}")
    return keep


def spm_sample(n_pairs: int, sample_pairs: int) -> np.ndarray | None:
    """Sorted positions (among the non-empty training pairs) of the pairs sentencepiece is
    trained on: ``sample_pairs`` drawn uniformly without replacement with the fixed seed
    ``SPM_SAMPLE_SEED``; ``None`` (every pair) when the corpus is not larger."""
    if sample_pairs <= 0 or n_pairs <= sample_pairs:
        return None
    rng = np.random.default_rng(SPM_SAMPLE_SEED)
    return np.sort(rng.choice(n_pairs, size=sample_pairs, replace=False))


def _training_lines(part: PairSource, sample: np.ndarray | None, chunk_pairs: int) -> Iterator[str]:
    """Source and target line of each sampled non-empty pair, pair by pair, in corpus order."""
    k = 0  # position among the non-empty pairs
    j = 0  # next entry of sample
    for chunk in part.chunks(chunk_pairs):
        for i in _nonempty(chunk):
            if sample is None or (j < len(sample) and sample[j] == k):
                yield chunk.source[i]
                yield chunk.target[i]
                j += 1
            k += 1


def _add_specials(
    flat: np.ndarray, lengths: np.ndarray, bos: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``x`` → ``x </s>`` (or ``<s> x </s>`` with ``bos``) for concatenated sentences
    ``flat`` ``(Σ n_i,)`` with ``lengths`` ``(N,)``."""
    ends = np.cumsum(lengths)  # (N,)
    n = len(lengths)
    if bos:
        # <s>_i, </s>_i in sentence order: at a position shared by </s>_i and <s>_{i+1}
        # (or by <s>_i and </s>_i of an empty sentence) np.insert keeps this order.
        where = np.stack([ends - lengths, ends], axis=1).reshape(-1)  # (2N,)
        values = np.tile([BOS_ID, EOS_ID], n)
    else:
        where, values = ends, np.full(n, EOS_ID)
    return np.insert(flat, where, values.astype(flat.dtype)), lengths + (2 if bos else 1)


class _SplitOutput:
    """One split's writers (ids, raw text) and running statistics."""

    def __init__(self, out: Path, split: str, vocab_size: int, n_refs: int) -> None:
        self.writer = binarized.SplitWriter(out, split, vocab_size)
        self.raw = []
        if split != "train":
            (out / "raw").mkdir(exist_ok=True)
            names = [f"{split}.src.txt", f"{split}.ref.txt"]
            names += [f"{split}.ref{k}.txt" for k in range(2, 2 + n_refs)]
            self.raw = [open(out / "raw" / n, "w", encoding="utf-8", newline="\n") for n in names]  # noqa: SIM115
        self.lengths: dict[str, list[np.ndarray]] = {
            k: [] for k in ("source_tokens", "target_tokens", "source_words", "target_words")
        }
        self.unk = 0

    def close(self) -> None:
        self.writer.close()
        for f in self.raw:
            f.close()


def _encode_chunk(
    sp, chunk: SplitText, args: argparse.Namespace, drops: _Drops, dest: _SplitOutput, threads: int
) -> None:
    keep = _nonempty(chunk)
    if not keep:
        return
    src_ids = spm.encode_many(sp, [chunk.source[i] for i in keep], threads)
    tgt_ids = spm.encode_many(sp, [chunk.target[i] for i in keep], threads)
    dtype = dest.writer.dtype
    src_flat, src_len = binarized.flatten(src_ids, dtype)
    tgt_flat, tgt_len = binarized.flatten(tgt_ids, dtype)
    too_long_src = src_len + 1 > args.max_source_positions  # (n,)
    too_long_tgt = tgt_len + 2 > args.max_target_positions  # (n,)
    bad = too_long_src | too_long_tgt
    for j in np.flatnonzero(bad):
        where = chunk.where[keep[j]]
        if too_long_src[j]:
            n, flag, limit = src_len[j] + 1, "--max-source-positions", args.max_source_positions
            drops.add("too_long", where, f"source has {n} tokens > {flag} {limit}")
        else:
            n, flag, limit = tgt_len[j] + 2, "--max-target-positions", args.max_target_positions
            drops.add("too_long", where, f"target has {n} tokens > {flag} {limit}")
    if bad.any():
        ok = np.flatnonzero(~bad)
        src_flat, src_len = binarized.flatten([src_ids[j] for j in ok], dtype)
        tgt_flat, tgt_len = binarized.flatten([tgt_ids[j] for j in ok], dtype)
        keep = [keep[j] for j in ok]
    if not keep:
        return
    dest.writer.append(
        *_add_specials(src_flat, src_len, False), *_add_specials(tgt_flat, tgt_len, True)
    )
    dest.unk += int(np.count_nonzero(src_flat == UNK_ID) + np.count_nonzero(tgt_flat == UNK_ID))
    sources = [chunk.source[i] for i in keep]
    targets = [chunk.target[i] for i in keep]
    dest.lengths["source_tokens"].append(src_len)
    dest.lengths["target_tokens"].append(tgt_len)
    dest.lengths["source_words"].append(_word_counts(sources))
    dest.lengths["target_words"].append(_word_counts(targets))
    if dest.raw:
        streams = [sources, targets] + [[r[i] for i in keep] for r in chunk.extra_refs]
        for f, lines in zip(dest.raw, streams, strict=True):
            _write_lines(f, lines)


def _word_counts(lines: Sequence[str]) -> np.ndarray:
    return np.fromiter((len(x.split()) for x in lines), dtype=np.int32, count=len(lines))


def build(args: argparse.Namespace, corpus: Corpus, out: Path) -> dict:
    """Check, filter, tokenize and write ``corpus`` into the (empty) directory ``out``, chunk by
    chunk (``args.chunk_pairs`` pairs); return the part of meta.json it measured.

    Three passes over the text: (1) check every split (UTF-8, line counts, columns; empty pairs
    are dropped and counted), (2) train sentencepiece on a seeded sample of the non-empty
    training pairs (:func:`spm_sample`), (3) encode each chunk with ``args.threads``
    sentencepiece threads, drop over-long pairs and append the rest to the ``.npy`` files. The
    output does not depend on the chunk size or the thread count.
    """
    drops = _Drops(args.strict)
    chunk_pairs = args.chunk_pairs
    threads = max(1, args.threads)
    # 1. Check everything before the long work; count the non-empty pairs.
    nonempty: dict[str, int] = {}
    for split, part in corpus.splits.items():
        nonempty[split] = sum(len(_nonempty(c, drops)) for c in part.chunks(chunk_pairs))
    if not nonempty["train"]:
        raise InputError("empty corpus: no training pairs left")

    # 2. Sentencepiece.
    t0 = time.time()
    sample = None
    if args.spm_model:
        sp = spm.load_sentencepiece(args.spm_model)
        shutil.copyfile(args.spm_model, out / "spm.model")
        vocab_file = Path(args.spm_model).with_suffix(".vocab")
        if vocab_file.is_file():
            shutil.copyfile(vocab_file, out / "spm.vocab")
    else:
        sample = spm_sample(nonempty["train"], args.spm_sample_pairs)
        sp = spm.train_sentencepiece(
            _training_lines(corpus.splits["train"], sample, chunk_pairs),
            out / "spm",
            args.vocab_size,
            args.model_type,
        )
    spm_seconds = time.time() - t0
    vocab_size = sp.get_piece_size()

    # 3. Encode, drop over-long pairs, write.
    t0 = time.time()
    splits_meta: dict[str, dict] = {}
    for split, part in corpus.splits.items():
        n_refs = 0
        dest = None
        try:
            for chunk in part.chunks(chunk_pairs):
                if dest is None:
                    n_refs = len(chunk.extra_refs)
                    dest = _SplitOutput(out, split, vocab_size, n_refs)
                _encode_chunk(sp, chunk, args, drops, dest, threads)
        finally:
            if dest is not None:
                dest.close()
        pairs = dest.writer.pairs if dest is not None else 0
        if not pairs:
            if split == "train":
                raise InputError("empty corpus: no training pairs left after filtering")
            for f in out.glob(f"{split}.*.npy"):
                f.unlink()
            for f in (out / "raw").glob(f"{split}.*"):
                f.unlink()
            continue
        lengths = {k: np.concatenate(v) for k, v in dest.lengths.items()}
        splits_meta[split] = {
            "pairs": pairs,
            "references": 1 + n_refs if split != "train" else 1,
            **{k: _stats(v) for k, v in lengths.items()},
            "unk_tokens": dest.unk,
        }
    return {
        "vocab_size": vocab_size,
        "ids_dtype": str(binarized.ids_dtype(vocab_size)),
        "splits": splits_meta,
        "dropped": drops.reasons,
        "spm_seconds": round(spm_seconds, 2),
        "encode_seconds": round(time.time() - t0, 2),
        "spm_sample": {
            "pairs": int(len(sample)) if sample is not None else nonempty["train"],
            "of": nonempty["train"],
            "seed": SPM_SAMPLE_SEED,
        }
        if not args.spm_model
        else None,
    }


def _write_lines(f: TextIO, lines: Sequence[str]) -> None:
    for line in lines:
        # A raw line must stay one line: newlines inside TSV fields cannot occur, but a
        # stray carriage return or line separator would shift every later line.
        f.write(" ".join(line.splitlines()) + "\n")


def _write_valid_sets(out: Path, built: dict, valid_sets: dict, seed: int) -> None:
    """``raw/{split}.validset.jsonl`` of a generated corpus, aligned with ``raw/{split}.*.txt``."""
    from fadat.data import synth

    for k, (split, sets) in enumerate(valid_sets.items()):
        if len(sets) != built["splits"][split]["pairs"]:
            raise InputError(f"{split}: pairs were dropped, the valid sets no longer align")
        rng = np.random.default_rng([seed, 10 + k])
        path = out / "raw" / f"{split}.{synth.VALIDSET_SUFFIX}"
        synth.write_valid_sets(path, sets, synth.SynthConfig.max_listed, rng)


def _read_meta(path: Path) -> dict:
    """``meta.json`` of an existing dataset, or ``{}`` when it cannot be read."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def run(args: argparse.Namespace) -> int:
    """Run ``fadat prepare``; returns the exit code (0).

    A second ``fadat prepare`` into the same ``--output`` while this one runs is refused
    (:func:`fadat.outputs.output_lock`).
    """
    with contextlib.ExitStack() as stack:
        return _run(args, stack)


def _run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    start = time.time()
    out = Path(args.output)
    if args.vocab_size < 5 and not args.spm_model:
        raise InputError(f"--vocab-size must be at least 5, got {args.vocab_size}")
    if args.chunk_pairs < 1:
        raise InputError(f"--chunk-pairs must be at least 1, got {args.chunk_pairs}")
    if args.spm_sample_pairs < 0:
        raise InputError(f"--spm-sample-pairs must be >= 0, got {args.spm_sample_pairs}")
    # A source holds at least x </s>, a target <s> y </s>.
    for flag, value, least in (
        ("--max-source-positions", args.max_source_positions, 2),
        ("--max-target-positions", args.max_target_positions, 3),
    ):
        if value < least:
            raise InputError(f"{flag} must be >= {least} (room for one token), got {value}")
    if args.spm_model and not Path(args.spm_model).is_file():
        what = "is a directory" if Path(args.spm_model).is_dir() else "does not exist"
        raise InputError(f"--spm-model {args.spm_model}: {what}, expected a sentencepiece model")
    if args.corpus and (args.source_file or args.target_file or args.tsv):
        raise InputError(f"give either the built-in corpus {args.corpus} or input files, not both")
    if args.corpus is None and args.direction:
        raise InputError("--direction is for built-in corpora; use --source-lang/--target-lang")
    _refuse_inapplicable(args)
    # Before any work: the output must be new, empty or a fadat dataset whose files are all
    # fadat's own (fadat.outputs), and its location writable.
    outputs.check_not_input(out, _input_flags(args), "--output")
    outputs.check_output_dir(out, "dataset", "--output")
    stack.enter_context(outputs.output_lock(out, "--output"))
    existing = outputs.check_output_dir(out, "dataset", "--output")  # as it is under the lock
    # Built-in corpora: fingerprint their input files first, so an up-to-date output is
    # recognised without rebuilding the corpus.
    corpus = None
    inputs = source_files(args)
    if inputs is None:
        corpus = generic_corpus(args)
        inputs = corpus.source_files
    files = [{"path": str(p), "sha256": sha256_file(p)} for p in inputs]
    fp = fingerprint(args, args.corpus or "parallel-text", files)

    if existing:
        old = _read_meta(out / "meta.json").get("fingerprint")
        if old == fp:
            log(f"{out} is up to date (same inputs and options); nothing to do")
            return 0
        if not args.force:
            raise InputError(
                f"--output {out}: exists, a fadat dataset built from different inputs or options "
                "(use --force to replace it)"
            )
        outputs.check_replaceable(out, "dataset", "--output")

    if args.corpus == "bible-en-es":
        corpus = bible_corpus(args)
    elif args.corpus in ("lohelp-en-de", "lohelp-en-es"):
        corpus = lohelp_corpus(args, args.corpus.rsplit("-", 1)[1])
    elif args.corpus == "synth-multimodal":
        corpus = synth_corpus(args)
    assert corpus is not None
    valid_sets = corpus.extra.pop("valid_sets", None)
    # Named .NAME.tmp-PID-*: if this process is killed, the next check of the output removes it
    # (fadat.outputs.remove_stale, run by check_output_dir above).
    tmp = outputs.staging_dir(out)
    try:
        with terminate_as_interrupt():
            built = build(args, corpus, tmp)
            if valid_sets is not None:
                _write_valid_sets(tmp, built, valid_sets, synth_config(args).seed)
            meta = {
                "format": FORMAT_VERSION,
                "fingerprint": fp,
                "corpus": corpus.name,
                "source_lang": corpus.source_lang,
                "target_lang": corpus.target_lang,
                "vocab_size": built["vocab_size"],
                "ids_dtype": built["ids_dtype"],
                "special_ids": {"<s>": BOS_ID, "<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": UNK_ID},
                "layout": {"source": "x </s>", "target": "<s> y </s>"},
                "spm": {
                    "model": "spm.model",
                    "model_type": None if args.spm_model else args.model_type,
                    "reused": str(args.spm_model) if args.spm_model else None,
                    "character_coverage": None if args.spm_model else 1.0,
                    "trained_on": built["spm_sample"],
                },
                "max_source_positions": args.max_source_positions,
                "max_target_positions": args.max_target_positions,
                "splits": built["splits"],
                "dropped": built["dropped"],
                "source_files": files,
                "licence": corpus.licence,
                "attribution": corpus.attribution,
                **({"corpus_details": corpus.extra} if corpus.extra else {}),
                "seconds": round(time.time() - start, 2),
                "spm_seconds": built["spm_seconds"],
                "encode_seconds": built["encode_seconds"],
            }
            if valid_sets is not None:
                # A generated corpus is byte-identical for the same options: no timings.
                del meta["seconds"], meta["spm_seconds"], meta["encode_seconds"]
            (tmp / "meta.json").write_text(
                json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        outputs.replace_dir(tmp, out, "dataset", "--output")
    except OSError as err:
        # Disk full, the output's directory removed, ...; an input's read error names its own.
        if err.filename is not None and not str(err.filename).startswith(str(tmp)):
            raise
        raise outputs.write_error(out, err, "--output") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    for reason, entry in meta["dropped"].items():
        log(f"dropped {entry['count']} {reason} pair(s), first at {', '.join(entry['first'])}")
    parts = []
    for split, m in meta["splits"].items():
        parts.append(
            f"{split} {m['pairs']} pairs (tokens/side {m['source_tokens']['mean']:.1f} / "
            f"{m['target_tokens']['mean']:.1f})"
        )
    log(
        f"wrote {out}: " + "; ".join(parts) + f"; vocab {meta['vocab_size']}; "
        f"{time.time() - start:.1f} s"
    )
    return 0
