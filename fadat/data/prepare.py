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

Steps (:func:`fadat.data.build.build`; the corpora: :mod:`fadat.data.corpora`), streaming: the
text files are read in blocks and processed in chunks of ``--chunk-pairs`` pairs, so memory does
not grow with the corpus. (1) Read and check every split (:class:`~fadat.errors.InputError`
naming file and line for invalid UTF-8, NUL bytes, a line-count mismatch, a bad TSV line; missing
files; an empty corpus) and drop empty pairs. (2) Train a joint sentencepiece model (or reuse one
with ``--spm-model``) on a random sample of ``--spm-sample-pairs`` training pairs (default
1,000,000; drawn by :func:`fadat.data.build.spm_sample` with a fixed seed, because
sentencepiece's own ``shuffle_input_sentence`` sampling is not reproducible from run to run).
(3) Encode each chunk with ``--threads`` sentencepiece threads, drop pairs over
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
import json
import shutil
import sys
import time
from pathlib import Path

from fadat import outputs
from fadat.data.build import FORMAT_VERSION, _write_valid_sets, build, fingerprint, sha256_file
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.data.corpora import (
    BUILTIN,
    SPLITS,
    SWORD_DIR,
    Corpus,
    bible_corpus,
    generic_corpus,
    lohelp_corpus,
    source_files,
    synth_config,
    synth_corpus,
)
from fadat.errors import InputError
from fadat.options import check_threads, positive_int, thread_count, usable_cores
from fadat.process import terminate_as_interrupt

CHUNK_PAIRS = 20_000  # pairs encoded at a time: about 50 MB of Python objects
SPM_SAMPLE_PAIRS = 1_000_000  # sentencepiece training sample (2M lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat prepare``, in the order ``--help`` lists them (the order of
    :meth:`~argparse.ArgumentParser.add_argument` calls is the order of the usage line)."""
    parser.add_argument(
        "corpus", nargs="?", choices=BUILTIN, help="a built-in corpus (else give text files)"
    )
    parser.add_argument("--output", "-o", required=True, help="output directory")
    parser.add_argument("--direction", help="built-in corpora: e.g. en-es or es-en")
    _add_text_arguments(parser)
    s = _add_spm_arguments(parser)
    _add_synth_arguments(parser)
    # Listed under "sentencepiece and filtering" but added after the synth group, so that they
    # stay last on the usage line.
    s.add_argument("--sword-dir", default=None, help=f"bible-en-es: SWORD modules ({SWORD_DIR})")
    s.add_argument(
        "--cache-dir",
        default=None,
        help="lohelp: where .deb files are downloaded (default ~/.cache/fadat/debs)",
    )


def _add_text_arguments(parser: argparse.ArgumentParser) -> None:
    """The "parallel text" group: per split source/target files or a TSV, extra references of
    valid/test, and the language codes."""
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


def _add_spm_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "sentencepiece and filtering" group (vocabulary, length filter, ``--strict``,
    ``--force``, chunk size and threads); returns the group."""
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
        type=thread_count,
        default=min(4, usable_cores()),
        help="sentencepiece encoding threads (the output is the same; default: cores, at most 4)",
    )
    return s


def _add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    """The "synth-multimodal" group: the options of :class:`fadat.data.synth.SynthConfig`."""
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


def _read_meta(path: Path) -> tuple[dict, str | None]:
    """``(meta.json of an existing dataset, None)``, or ``({}, why it cannot be read)``."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        return {}, err.strerror or str(err)
    except ValueError as err:  # invalid UTF-8 or JSON
        return {}, f"not valid JSON: {err}"
    if not isinstance(meta, dict):
        return {}, f"a JSON {type(meta).__name__}, expected an object"
    return meta, None


def run(args: argparse.Namespace) -> int:
    """Run ``fadat prepare``; returns the exit code (0).

    A second ``fadat prepare`` into the same ``--output`` while this one runs is refused
    (:func:`fadat.outputs.output_lock`).
    """
    with contextlib.ExitStack() as stack:
        return _run(args, stack)


def _run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    """The stages of ``fadat prepare``: check the options, claim the output (under a lock held
    by ``stack``), fingerprint the inputs, stop if the output is up to date, build the corpus
    and the dataset, report. Returns 0."""
    start = time.time()
    out = Path(args.output)
    _check_options(args)
    # Encoding threads beyond the cores only share them (the output is the same): a warning,
    # since --force here means replacing the dataset.
    warning = check_threads(args.threads, force=True)
    if warning:
        log(f"warning: {warning}")
    existing = _claim_output(args, out, stack)
    corpus, files, fp = _fingerprint_inputs(args)
    if existing and _up_to_date(args, out, fp):
        log(f"{out} is up to date (same inputs and options); nothing to do")
        return 0
    if corpus is None:
        corpus = _builtin_corpus(args)
    meta = _build_dataset(args, corpus, out, fp, files, start)
    _log_summary(out, meta, start)
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """Option values and combinations, checked before any file is touched.

    Raises:
        InputError: naming the flag and the problem (a value out of range, a ``--spm-model``
            that is not a file, a built-in corpus together with input files, ``--direction``
            without a built-in corpus, an option of another corpus).
    """
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


def _claim_output(args: argparse.Namespace, out: Path, stack: contextlib.ExitStack) -> bool:
    """Check ``out`` and take its lock (held until ``stack`` closes); returns whether it holds a
    dataset already.

    Before any work: the output must be new, empty or a fadat dataset whose files are all
    fadat's own (:mod:`fadat.outputs`), not an input, and its location writable.

    Raises:
        InputError: from :mod:`fadat.outputs`, naming ``--output`` and the problem.
    """
    outputs.check_not_input(out, _input_flags(args), "--output")
    outputs.check_output_dir(out, "dataset", "--output")
    stack.enter_context(outputs.output_lock(out, "--output"))
    return outputs.check_output_dir(out, "dataset", "--output")  # as it is under the lock


def _fingerprint_inputs(args: argparse.Namespace) -> tuple[Corpus | None, list[dict], str]:
    """``(corpus, files, fingerprint)``: the parallel-text corpus (None for a built-in one, which
    is built later, only when the output is not up to date), its input files as ``{"path",
    "sha256"}`` and the fingerprint (:func:`fadat.data.build.fingerprint`).

    Raises:
        InputError: a missing or unreadable input file.
    """
    corpus = None
    inputs = source_files(args)
    if inputs is None:
        corpus = generic_corpus(args)
        inputs = corpus.source_files
    files = [{"path": str(p), "sha256": sha256_file(p)} for p in inputs]
    return corpus, files, fingerprint(args, args.corpus or "parallel-text", files)


def _up_to_date(args: argparse.Namespace, out: Path, fp: str) -> bool:
    """Whether the dataset in ``out`` was built with fingerprint ``fp`` (nothing to do);
    otherwise checks that ``--force`` may replace it.

    Raises:
        InputError: a different fingerprint or an unreadable meta.json without ``--force``,
            or (from
            :func:`fadat.outputs.check_replaceable`) a dataset that may not be replaced.
    """
    meta, unreadable = _read_meta(out / "meta.json")
    if meta.get("fingerprint") == fp:
        return True
    if not args.force and unreadable:
        raise InputError(
            f"--output {out}: exists, a fadat dataset whose meta.json is unreadable "
            f"({unreadable}); use --force to replace it"
        )
    if not args.force:
        raise InputError(
            f"--output {out}: exists, a fadat dataset built from different inputs or options "
            "(use --force to replace it)"
        )
    outputs.check_replaceable(out, "dataset", "--output")
    return False


def _builtin_corpus(args: argparse.Namespace) -> Corpus:
    """The built-in corpus ``args.corpus`` (:data:`fadat.data.corpora.BUILTIN`)."""
    if args.corpus == "bible-en-es":
        return bible_corpus(args)
    if args.corpus in ("lohelp-en-de", "lohelp-en-es"):
        return lohelp_corpus(args, args.corpus.rsplit("-", 1)[1])
    if args.corpus == "synth-multimodal":
        return synth_corpus(args)
    raise AssertionError(f"no built-in corpus {args.corpus!r}")


def _build_dataset(
    args: argparse.Namespace, corpus: Corpus, out: Path, fp: str, files: list[dict], start: float
) -> dict:
    """Build the dataset of ``corpus`` in a staging directory and rename it to ``out``; returns
    its ``meta.json`` (:func:`_meta`). Ctrl-C or SIGTERM leaves ``out`` as it was.

    Raises:
        InputError: from the build (a bad input line, --strict), or a write error naming
            ``--output`` (disk full, the output's directory removed).
    """
    valid_sets = corpus.extra.pop("valid_sets", None)
    # Named .NAME.tmp-PID-*: if this process is killed, the next check of the output removes it
    # (fadat.outputs.remove_stale, run by check_output_dir in _claim_output).
    tmp = outputs.staging_dir(out)
    try:
        with terminate_as_interrupt():
            built = build(args, corpus, tmp)
            if valid_sets is not None:
                _write_valid_sets(tmp, built, valid_sets, synth_config(args).seed)
            meta = _meta(args, corpus, built, fp, files, time.time() - start)
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
    return meta


def _meta(
    args: argparse.Namespace,
    corpus: Corpus,
    built: dict,
    fp: str,
    files: list[dict],
    seconds: float,
) -> dict:
    """The dataset's ``meta.json``: format, fingerprint, corpus, vocabulary, special ids,
    sentencepiece, limits, splits and dropped pairs (``built``, from
    :func:`fadat.data.build.build`), input files, licence, and timings (``seconds`` since the
    start of the run)."""
    return {
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
        "seconds": round(seconds, 2),
        "spm_seconds": built["spm_seconds"],
        "encode_seconds": built["encode_seconds"],
    }


def _log_summary(out: Path, meta: dict, start: float) -> None:
    """Log the dropped pairs per reason and, per split, the pairs and mean tokens per side."""
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
