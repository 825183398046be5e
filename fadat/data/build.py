"""The build of a dataset directory (``fadat prepare``'s work once the corpus is chosen): check
and filter the pairs, train or reuse the sentencepiece model, encode and append the ids to the
split's ``.npy`` files, the raw valid/test text to ``raw/``; the fingerprint of everything the
output depends on. Steps: :func:`build`, with the generic options of :class:`BuildOptions`;
the output directory, the corpus and ``meta.json``: :func:`fadat.data.prepare.prepare`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from fadat.data import binarized, spm
from fadat.data.contract import BOS_ID, EOS_ID, UNK_ID
from fadat.data.corpora import Corpus, PairSource, SplitText
from fadat.errors import InputError

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

FORMAT_VERSION = 1
MAX_POSITIONS_SHOWN = 10
SPM_SAMPLE_SEED = 20260101
VOCAB_SIZE = 8000  # joint sentencepiece vocabulary
MODEL_TYPES = ("bpe", "unigram", "char", "word")  # sentencepiece's model types
MAX_POSITIONS = 1024  # longest source (x </s>) and target (<s> y </s>) kept
CHUNK_PAIRS = 20_000  # pairs encoded at a time: about 50 MB of Python objects
SPM_SAMPLE_PAIRS = 1_000_000  # sentencepiece training sample (2M lines)
#: The modules whose code decides every dataset's bytes (a corpus's own module is added).
BUILD_MODULES = ("prepare", "corpora", "build", "text", "spm", "binarized", "contract")


@dataclass(frozen=True)
class BuildOptions:
    """The options of a build that do not depend on the corpus (``fadat prepare``'s
    "sentencepiece and filtering" flags but ``--force``).

    Attributes:
        spm_model: reuse this sentencepiece model (a file) instead of training one; ``None``:
            train one.
        vocab_size: the joint vocabulary of a trained model (>= 5).
        model_type: sentencepiece's model type, one of :data:`MODEL_TYPES`.
        spm_sample_pairs: train sentencepiece on this many training pairs drawn at random with
            a fixed seed (:func:`spm_sample`); 0: all pairs.
        max_source_positions: drop (``strict``: refuse) pairs whose source ``x </s>`` is
            longer, in tokens (>= 2).
        max_target_positions: the same for the target ``<s> y </s>`` (>= 3).
        strict: empty or over-long pairs are errors instead of being dropped.
        chunk_pairs: pairs encoded and written at a time (memory only; the output is the same).
        threads: sentencepiece encoding threads (speed only; 0 counts as 1).
    """

    spm_model: str | None = None
    vocab_size: int = VOCAB_SIZE
    model_type: str = "bpe"
    spm_sample_pairs: int = SPM_SAMPLE_PAIRS
    max_source_positions: int = MAX_POSITIONS
    max_target_positions: int = MAX_POSITIONS
    strict: bool = False
    chunk_pairs: int = CHUNK_PAIRS
    threads: int = 1

    def check(self) -> None:
        """Values and combinations, checked before any file is touched.

        Raises:
            InputError: naming the flag and the problem (a value out of range, a
                ``spm_model`` that is not a file).
        """
        if self.vocab_size < 5 and not self.spm_model:
            raise InputError(f"--vocab-size must be at least 5, got {self.vocab_size}")
        if self.model_type not in MODEL_TYPES:
            raise InputError(
                f"--model-type must be one of {', '.join(MODEL_TYPES)}, got {self.model_type!r}"
            )
        if self.chunk_pairs < 1:
            raise InputError(f"--chunk-pairs must be at least 1, got {self.chunk_pairs}")
        if self.spm_sample_pairs < 0:
            raise InputError(f"--spm-sample-pairs must be >= 0, got {self.spm_sample_pairs}")
        # A source holds at least x </s>, a target <s> y </s>.
        for flag, value, least in (
            ("--max-source-positions", self.max_source_positions, 2),
            ("--max-target-positions", self.max_target_positions, 3),
        ):
            if value < least:
                raise InputError(f"{flag} must be >= {least} (room for one token), got {value}")
        if self.spm_model and not Path(self.spm_model).is_file():
            what = "is a directory" if Path(self.spm_model).is_dir() else "does not exist"
            raise InputError(
                f"--spm-model {self.spm_model}: {what}, expected a sentencepiece model"
            )


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


def fingerprint(
    settings: BuildOptions,
    corpus_name: str,
    corpus_options: Mapping[str, Any],
    files: list[dict],
    code: Iterable[Path] = (),
) -> str:
    """sha256 of everything the output depends on: the corpus, its options (``corpus_options``:
    the values, not the paths, whose files are in ``files``), the input files' sha256, the
    generic options but those that change only speed and memory (``chunk_pairs``,
    ``threads``), the format version, and the code that builds the data (the modules of
    :data:`BUILD_MODULES` and the ``code`` files, the corpus's own module).

    Raises:
        InputError: an unreadable ``settings.spm_model``.
    """
    spm_sha = sha256_file(Path(settings.spm_model)) if settings.spm_model else None
    # The code that builds the data is an input too: a changed cleaner must not be "up to date".
    digest = hashlib.sha256()
    here = Path(__file__).parent
    paths = [here / f"{module}.py" for module in BUILD_MODULES] + [Path(p) for p in code]
    for path in dict.fromkeys(p.resolve() for p in paths):  # each once
        digest.update(path.read_bytes())
    key = {
        "format": FORMAT_VERSION,
        "code": digest.hexdigest(),
        "corpus": corpus_name,
        "options": dict(corpus_options),
        "files": [f["sha256"] for f in files],
        "spm_model": spm_sha,
        "vocab_size": settings.vocab_size,
        "model_type": settings.model_type,
        "spm_sample_pairs": None if settings.spm_model else settings.spm_sample_pairs,
        "max_positions": [settings.max_source_positions, settings.max_target_positions],
        "strict": settings.strict,
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
    sp, chunk: SplitText, settings: BuildOptions, drops: _Drops, dest: _SplitOutput, threads: int
) -> None:
    keep = _nonempty(chunk)
    if not keep:
        return
    src_ids = spm.encode_many(sp, [chunk.source[i] for i in keep], threads)
    tgt_ids = spm.encode_many(sp, [chunk.target[i] for i in keep], threads)
    dtype = dest.writer.dtype
    src_flat, src_len = binarized.flatten(src_ids, dtype)
    tgt_flat, tgt_len = binarized.flatten(tgt_ids, dtype)
    too_long_src = src_len + 1 > settings.max_source_positions  # (n,)
    too_long_tgt = tgt_len + 2 > settings.max_target_positions  # (n,)
    bad = too_long_src | too_long_tgt
    for j in np.flatnonzero(bad):
        where = chunk.where[keep[j]]
        if too_long_src[j]:
            n, flag = src_len[j] + 1, "--max-source-positions"
            limit = settings.max_source_positions
            drops.add("too_long", where, f"source has {n} tokens > {flag} {limit}")
        else:
            n, flag = tgt_len[j] + 2, "--max-target-positions"
            limit = settings.max_target_positions
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


def build(settings: BuildOptions, corpus: Corpus, out: Path) -> dict:
    """Check, filter, tokenize and write ``corpus`` into the (empty) directory ``out``, chunk by
    chunk (``settings.chunk_pairs`` pairs); return the part of meta.json it measured.

    Three passes over the text: (1) check every split (UTF-8, line counts, columns; empty pairs
    are dropped and counted), (2) train sentencepiece on a seeded sample of the non-empty
    training pairs (:func:`spm_sample`), (3) encode each chunk with ``settings.threads``
    sentencepiece threads, drop over-long pairs and append the rest to the ``.npy`` files. The
    output does not depend on the chunk size or the thread count.

    Returns:
        ``vocab_size``, ``ids_dtype``, ``splits`` (per split: pairs, references, token and word
        statistics, ``<unk>`` count), ``dropped`` (per reason: count and first positions),
        ``spm_seconds``, ``encode_seconds`` and ``spm_sample`` (None for a reused model).

    Raises:
        InputError: a bad input line, an empty or over-long pair with ``strict``, no training
            pair left, a sentencepiece model that cannot be trained or used.
    """
    drops = _Drops(settings.strict)
    # 1. Check everything before the long work; count the non-empty pairs.
    nonempty = _check_splits(corpus, drops, settings.chunk_pairs)
    # 2. Sentencepiece.
    t0 = time.time()
    sp, sample = _sentencepiece(settings, corpus, out, nonempty["train"])
    spm_seconds = time.time() - t0
    vocab_size = sp.get_piece_size()
    # 3. Encode, drop over-long pairs, write.
    t0 = time.time()
    splits_meta: dict[str, dict] = {}
    for split, part in corpus.splits.items():
        stats = _encode_split(sp, split, part, settings, drops, out)
        if stats is not None:
            splits_meta[split] = stats
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
        if not settings.spm_model
        else None,
    }


def _check_splits(corpus: Corpus, drops: _Drops, chunk_pairs: int) -> dict[str, int]:
    """The non-empty pairs per split, after reading and checking every split once (empty pairs
    counted in ``drops``).

    Raises:
        InputError: a bad input line (from the reader), an empty pair with ``--strict``, or no
            non-empty training pair.
    """
    nonempty: dict[str, int] = {}
    for split, part in corpus.splits.items():
        nonempty[split] = sum(len(_nonempty(c, drops)) for c in part.chunks(chunk_pairs))
    if not nonempty["train"]:
        raise InputError("empty corpus: no training pairs left")
    return nonempty


def _sentencepiece(
    settings: BuildOptions, corpus: Corpus, out: Path, train_pairs: int
) -> tuple[SentencePieceProcessor, np.ndarray | None]:
    """``(model, sample)``: ``settings.spm_model`` copied into ``out`` (with its ``.vocab`` when
    there is one), or a model trained into ``out/spm.{model,vocab}`` on the sample of the
    ``train_pairs`` non-empty training pairs (:func:`spm_sample`; None: all of them)."""
    if settings.spm_model:
        sp = spm.load_sentencepiece(settings.spm_model)
        shutil.copyfile(settings.spm_model, out / "spm.model")
        vocab_file = Path(settings.spm_model).with_suffix(".vocab")
        if vocab_file.is_file():
            shutil.copyfile(vocab_file, out / "spm.vocab")
        return sp, None
    sample = spm_sample(train_pairs, settings.spm_sample_pairs)
    sp = spm.train_sentencepiece(
        _training_lines(corpus.splits["train"], sample, settings.chunk_pairs),
        out / "spm",
        settings.vocab_size,
        settings.model_type,
    )
    return sp, sample


def _encode_split(
    sp: SentencePieceProcessor,
    split: str,
    part: PairSource,
    settings: BuildOptions,
    drops: _Drops,
    out: Path,
) -> dict | None:
    """Encode ``split`` chunk by chunk into ``out``; returns its ``meta.json`` entry (pairs,
    references, token statistics per side, ``<unk>`` count), or None (its files removed) when
    no pair is left after filtering.

    Raises:
        InputError: no training pair left after filtering, or an over-long pair with
            ``--strict``.
    """
    n_refs = 0
    dest = None
    try:
        for chunk in part.chunks(settings.chunk_pairs):
            if dest is None:
                n_refs = len(chunk.extra_refs)
                dest = _SplitOutput(out, split, sp.get_piece_size(), n_refs)
            _encode_chunk(sp, chunk, settings, drops, dest, max(1, settings.threads))
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
        return None
    lengths = {k: np.concatenate(v) for k, v in dest.lengths.items()}
    return {
        "pairs": pairs,
        "references": 1 + n_refs if split != "train" else 1,
        **{k: _stats(v) for k, v in lengths.items()},
        "unk_tokens": dest.unk,
    }


def _write_lines(f: TextIO, lines: Sequence[str]) -> None:
    for line in lines:
        # A raw line must stay one line: newlines inside TSV fields cannot occur, but a
        # stray carriage return or line separator would shift every later line.
        f.write(" ".join(line.splitlines()) + "\n")
