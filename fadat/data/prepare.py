"""``fadat prepare``: parallel text or a built-in corpus → a binarized dataset directory.

Forms:

- ``fadat prepare --source-file F --target-file F [--valid-source-file … --test-…]
  --source-lang xx --target-lang yy --output DIR`` (plain text, one sentence per line), or the
  same with ``--tsv F [--valid-tsv F --test-tsv F]`` (columns: source, target, extra references);
- ``fadat prepare bible-en-es --output DIR [--direction en-es|es-en]``;
- ``fadat prepare lohelp-en-de|lohelp-en-es --output DIR [--direction …]``.

Steps: read and check the input (:class:`~fadat.errors.InputError` for line-count mismatch,
invalid UTF-8, NUL bytes, missing files, an empty corpus), drop empty pairs, train (or reuse with
``--spm-model``) a joint sentencepiece model on the training split, encode, drop pairs over
``--max-source-positions`` / ``--max-target-positions`` (``--strict``: error instead), write the
binarized splits (:mod:`fadat.data.binarized`), the raw valid/test text and ``meta.json``.
Everything is written to a temporary directory that is renamed into place at the end, so an
interrupted run leaves nothing half-written. Re-running with the same inputs and options finds
the same fingerprint in ``meta.json`` and does nothing; different inputs are refused unless
``--force``. The output is checked before the corpus is read (:mod:`fadat.outputs`): a regular
file, a directory that ``fadat prepare`` did not build, or a dataset directory holding files that
``fadat prepare`` did not write is never replaced, ``--force`` or not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fadat import outputs
from fadat.data import binarized, spm
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.errors import InputError

FORMAT_VERSION = 1
BUILTIN = ("bible-en-es", "lohelp-en-de", "lohelp-en-es")
SPLITS = ("train", "valid", "test")
MAX_POSITIONS_SHOWN = 10


@dataclass
class SplitText:
    """Raw pairs of one split; ``where[i]`` is ``"file:line"`` (or a verse/paragraph id)."""

    source: list[str] = field(default_factory=list)
    target: list[str] = field(default_factory=list)
    extra_refs: list[list[str]] = field(default_factory=list)  # ref2, ref3, … streams
    where: list[str] = field(default_factory=list)


@dataclass
class Corpus:
    """Everything ``prepare`` needs besides the options."""

    name: str
    source_lang: str
    target_lang: str
    splits: dict[str, SplitText]
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
    s.add_argument("--vocab-size", type=int, default=8000, help="joint vocabulary (default 8000)")
    s.add_argument("--model-type", default="bpe", choices=("bpe", "unigram", "char", "word"))
    s.add_argument(
        "--max-source-positions",
        type=int,
        default=1024,
        help="drop pairs whose source (with </s>) is longer (default 1024)",
    )
    s.add_argument(
        "--max-target-positions",
        type=int,
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
    s.add_argument("--sword-dir", default="/usr/share/sword", help="bible-en-es: SWORD modules")
    s.add_argument(
        "--cache-dir",
        default=None,
        help="lohelp: where .deb files are downloaded (default ~/.cache/fadat/debs)",
    )


def log(message: str) -> None:
    print(f"fadat prepare: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- reading input


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (``\\n`` or ``\\r\\n``; a final newline is optional).

    Raises:
        InputError: missing file, NUL byte or invalid UTF-8 (file, line and byte offset).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        raise InputError(f"{path}: file not found") from err
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror})") from err
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise InputError(f"{path}:{line}: NUL byte at byte offset {nul}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"{path}:{line}: invalid UTF-8 at byte offset {err.start} ({err.reason})"
        ) from err
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_parallel(source: str, target: str, extra: list[str]) -> SplitText:
    """Two (or more) line-aligned files → a :class:`SplitText`.

    Raises:
        InputError: any file problem, or files whose line counts differ (names both files).
    """
    src, tgt = read_lines(source), read_lines(target)
    if len(src) != len(tgt):
        raise InputError(
            f"line counts differ: {source} has {len(src)} lines, {target} has {len(tgt)}"
        )
    refs = []
    for f in extra:
        r = read_lines(f)
        if len(r) != len(src):
            raise InputError(f"line counts differ: {source} has {len(src)} lines, {f} has {len(r)}")
        refs.append(r)
    return SplitText(src, tgt, refs, [f"{source}:{i + 1}" for i in range(len(src))])


def read_tsv(path: str) -> SplitText:
    """TSV pairs (source, target, extra references…) → a :class:`SplitText`.

    Raises:
        InputError: file problems, or a line whose column count differs (file:line).
    """
    lines = read_lines(path)
    cols = None
    out = SplitText()
    for i, line in enumerate(lines, 1):
        fields = line.split("\t")
        if cols is None:
            cols = len(fields)
            if cols < 2:
                raise InputError(f"{path}:{i}: expected at least 2 tab-separated columns")
            out.extra_refs = [[] for _ in range(cols - 2)]
        if len(fields) != cols:
            raise InputError(f"{path}:{i}: {len(fields)} columns, line 1 has {cols}")
        out.source.append(fields[0])
        out.target.append(fields[1])
        for k, ref in enumerate(fields[2:]):
            out.extra_refs[k].append(ref)
        out.where.append(f"{path}:{i}")
    return out


def generic_corpus(args: argparse.Namespace) -> Corpus:
    """The corpus given as files on the command line."""
    if not args.source_lang or not args.target_lang:
        raise InputError("--source-lang and --target-lang are required for parallel text")
    splits: dict[str, SplitText] = {}
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
            splits[split] = read_tsv(tsv)
            files.append(Path(tsv))
        elif src or tgt:
            if not (src and tgt):
                raise InputError(f"--{flag}source-file and --{flag}target-file go together")
            splits[split] = read_parallel(src, tgt, extra)
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
    sword = Path(args.sword_dir)
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
        return bible_files(Path(args.sword_dir))
    if args.corpus in ("lohelp-en-de", "lohelp-en-es"):
        from fadat.data import lohelp

        langs = ["en", args.corpus.rsplit("-", 1)[1]]
        cache = Path(args.cache_dir) if args.cache_dir else lohelp.DEFAULT_CACHE
        lohelp.fetch_packages(langs, cache)
        return lohelp.deb_files(langs, cache)
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


# ----------------------------------------------------------------------------- writing


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint(args: argparse.Namespace, corpus_name: str, files: list[dict]) -> str:
    """sha256 of everything the output depends on (inputs, options, format version)."""
    spm_sha = sha256_file(Path(args.spm_model)) if args.spm_model else None
    # The code that builds the data is an input too: a changed cleaner must not be "up to date".
    code = hashlib.sha256()
    for module in ("prepare", "bible", "lohelp", "spm", "binarized", "contract"):
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
        "max_positions": [args.max_source_positions, args.max_target_positions],
        "strict": args.strict,
    }
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


def build(args: argparse.Namespace, corpus: Corpus, out: Path) -> dict:
    """Filter, tokenize and write ``corpus`` into the (empty) directory ``out``; return meta."""
    drops = _Drops(args.strict)
    # 1. Empty pairs.
    for part in corpus.splits.values():
        keep = []
        for i, (s, t) in enumerate(zip(part.source, part.target, strict=True)):
            if not s.strip() or not t.strip():
                side = "source" if not s.strip() else "target"
                drops.add("empty", part.where[i], f"empty {side}")
            else:
                keep.append(i)
        _select(part, keep)
    train = corpus.splits["train"]
    if not train.source:
        raise InputError("empty corpus: no training pairs left")

    # 2. Sentencepiece.
    t0 = time.time()
    if args.spm_model:
        sp = spm.load_sentencepiece(args.spm_model)
        shutil.copyfile(args.spm_model, out / "spm.model")
        vocab_file = Path(args.spm_model).with_suffix(".vocab")
        if vocab_file.is_file():
            shutil.copyfile(vocab_file, out / "spm.vocab")
    else:
        sp = spm.train_sentencepiece(
            train.source + train.target, out / "spm", args.vocab_size, args.model_type
        )
    spm_seconds = time.time() - t0
    vocab_size = sp.get_piece_size()

    # 3. Encode, drop over-long pairs, write.
    splits_meta: dict[str, dict] = {}
    for split, part in corpus.splits.items():
        src_ids = spm.encode_many(sp, part.source)
        tgt_ids = spm.encode_many(sp, part.target)
        keep = []
        for i in range(len(part.source)):
            ns, nt = len(src_ids[i]) + 1, len(tgt_ids[i]) + 2
            if ns > args.max_source_positions:
                drops.add(
                    "too_long",
                    part.where[i],
                    f"source has {ns} tokens > --max-source-positions {args.max_source_positions}",
                )
            elif nt > args.max_target_positions:
                drops.add(
                    "too_long",
                    part.where[i],
                    f"target has {nt} tokens > --max-target-positions {args.max_target_positions}",
                )
            else:
                keep.append(i)
        _select(part, keep)
        sources = [src_ids[i] + [EOS_ID] for i in keep]
        targets = [[BOS_ID] + tgt_ids[i] + [EOS_ID] for i in keep]
        if not sources:
            if split == "train":
                raise InputError("empty corpus: no training pairs left after filtering")
            continue
        binarized.write_split(out, split, sources, targets, vocab_size)
        if split != "train":
            raw = out / "raw"
            raw.mkdir(exist_ok=True)
            _write_lines(raw / f"{split}.src.txt", part.source)
            _write_lines(raw / f"{split}.ref.txt", part.target)
            for k, ref in enumerate(part.extra_refs, 2):
                _write_lines(raw / f"{split}.ref{k}.txt", ref)
        unk = sum(x.count(UNK_ID) for x in sources) + sum(x.count(UNK_ID) for x in targets)
        splits_meta[split] = {
            "pairs": len(sources),
            "references": 1 + len(part.extra_refs) if split != "train" else 1,
            "source_tokens": _stats([len(x) - 1 for x in sources]),
            "target_tokens": _stats([len(x) - 2 for x in targets]),
            "source_words": _stats([len(s.split()) for s in part.source]),
            "target_words": _stats([len(t.split()) for t in part.target]),
            "unk_tokens": unk,
        }
    return {
        "vocab_size": vocab_size,
        "splits": splits_meta,
        "dropped": drops.reasons,
        "spm_seconds": round(spm_seconds, 2),
    }


def _select(part: SplitText, keep: list[int]) -> None:
    part.source = [part.source[i] for i in keep]
    part.target = [part.target[i] for i in keep]
    part.extra_refs = [[r[i] for i in keep] for r in part.extra_refs]
    part.where = [part.where[i] for i in keep]


def _write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            # A raw line must stay one line: newlines inside TSV fields cannot occur, but a
            # stray carriage return or line separator would shift every later line.
            f.write(" ".join(line.splitlines()) + "\n")


def _read_meta(path: Path) -> dict:
    """``meta.json`` of an existing dataset, or ``{}`` when it cannot be read."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def run(args: argparse.Namespace) -> int:
    """Run ``fadat prepare``; returns the exit code (0)."""
    start = time.time()
    out = Path(args.output)
    if args.vocab_size < 5 and not args.spm_model:
        raise InputError(f"--vocab-size must be at least 5, got {args.vocab_size}")
    if args.corpus and (args.source_file or args.target_file or args.tsv):
        raise InputError(f"give either the built-in corpus {args.corpus} or input files, not both")
    if args.corpus is None and args.direction:
        raise InputError("--direction is for built-in corpora; use --source-lang/--target-lang")
    # Before any work: the output must be new, empty or a fadat dataset whose files are all
    # fadat's own (fadat.outputs), and its location writable.
    existing = outputs.check_output_dir(out, "dataset", "--output")
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
    assert corpus is not None
    tmp = outputs.staging_dir(out)
    try:
        built = build(args, corpus, tmp)
        meta = {
            "format": FORMAT_VERSION,
            "fingerprint": fp,
            "corpus": corpus.name,
            "source_lang": corpus.source_lang,
            "target_lang": corpus.target_lang,
            "vocab_size": built["vocab_size"],
            "special_ids": {"<s>": BOS_ID, "<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": UNK_ID},
            "layout": {"source": "x </s>", "target": "<s> y </s>"},
            "spm": {
                "model": "spm.model",
                "model_type": None if args.spm_model else args.model_type,
                "reused": str(args.spm_model) if args.spm_model else None,
                "character_coverage": None if args.spm_model else 1.0,
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
        }
        (tmp / "meta.json").write_text(
            json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        outputs.replace_dir(tmp, out, "dataset", "--output")
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
