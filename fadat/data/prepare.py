"""The dataset builder: a corpus (the user's parallel text or a registered corpus) → a binarized
dataset directory, :func:`prepare` (``fadat prepare``'s library function; its command line is
:mod:`fadat.cli.prepare`).

The corpora (:mod:`fadat.data.corpora`):

- ``parallel-text``: plain text files, one sentence per line (``source_file=``, ``target_file=``,
  ``valid_source_file=``, …), or one TSV file per split (``tsv=``, ``valid_tsv=``, ``test_tsv=``;
  columns: source, target, extra references), with ``source_lang=`` and ``target_lang=``;
- ``bible-en-es`` (``direction="en-es"|"es-en"``, ``sword_dir=``): :mod:`fadat.data.bible`;
- ``lohelp-en-de``, ``lohelp-en-es`` (``direction=``, ``cache_dir=``): :mod:`fadat.data.lohelp`;
- ``synth-multimodal`` (``seed=``, ``swap_prob=``, ``synonym_prob=``, ``train_size=``, …): the
  synthetic multi-modal corpus of :mod:`fadat.data.synth` (word-level vocabulary; valid/test
  also get ``raw/{split}.validset.jsonl``, their sets of valid translations).

Steps (:func:`fadat.data.build.build`), streaming: the text files are read in blocks and
processed in chunks of ``chunk_pairs`` pairs, so memory does not grow with the corpus. (1) Read
and check every split (:class:`~fadat.errors.InputError` naming file and line for invalid UTF-8,
NUL bytes, a line-count mismatch, a bad TSV line; missing files; an empty corpus) and drop empty
pairs. (2) Train a joint sentencepiece model (or reuse one: ``spm_model``) on a random sample of
``spm_sample_pairs`` training pairs (default 1,000,000; drawn by
:func:`fadat.data.build.spm_sample` with a fixed seed, because sentencepiece's own
``shuffle_input_sentence`` sampling is not reproducible from run to run). (3) Encode each chunk
with ``threads`` sentencepiece threads, drop pairs over ``max_source_positions`` /
``max_target_positions`` (``strict``: error instead) and append the ids straight to the split's
``.npy`` files (:class:`fadat.data.binarized.SplitWriter`; ids in the smallest dtype that holds
the vocabulary), the raw valid/test text to ``raw/``; then ``meta.json``. The output does not
depend on the chunk size or the thread count. Everything is written to a temporary directory
next to the output that is renamed into place at the end, so an interrupted run (Ctrl-C,
SIGTERM) leaves nothing half-written; the temporary directory of a killed run (SIGKILL) is
removed by the next run. Re-running with the same inputs and options finds the same fingerprint
in ``meta.json`` and does nothing; different inputs are refused unless ``force``. The output is
checked before the corpus is read (:mod:`fadat.outputs`): a regular file, a directory that
``fadat prepare`` did not build, or a dataset directory holding files that ``fadat prepare`` did
not write is never replaced, ``force`` or not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from fadat import outputs
from fadat.data.build import (
    CHUNK_PAIRS,
    FORMAT_VERSION,
    MAX_POSITIONS,
    SPM_SAMPLE_PAIRS,
    VOCAB_SIZE,
    BuildOptions,
    build,
    fingerprint,
    sha256_file,
)
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from fadat.data.corpora import (
    Corpus,
    CorpusSpec,
    corpus_module_file,
    corpus_options,
    corpus_spec,
)
from fadat.errors import InputError
from fadat.options import check_threads, usable_cores
from fadat.process import terminate_as_interrupt


def log(message: str) -> None:
    """One progress line on stderr (``fadat prepare: ...``)."""
    print(f"fadat prepare: {message}", file=sys.stderr, flush=True)


def default_threads() -> int:
    """Sentencepiece encoding threads when none are asked for: the usable cores, at most 4."""
    return min(4, usable_cores())


def prepare(
    corpus: str,
    output: str | Path,
    *,
    spm_model: str | Path | None = None,
    vocab_size: int = VOCAB_SIZE,
    model_type: str = "bpe",
    spm_sample_pairs: int = SPM_SAMPLE_PAIRS,
    max_source_positions: int = MAX_POSITIONS,
    max_target_positions: int = MAX_POSITIONS,
    strict: bool = False,
    force: bool = False,
    chunk_pairs: int = CHUNK_PAIRS,
    threads: int | None = None,
    **options: Any,
) -> Path:
    """Build the dataset directory ``output`` from ``corpus`` (``fadat prepare``).

    For example ``prepare("parallel-text", "data/mine", source_file="train.en",
    target_file="train.de", source_lang="en", target_lang="de")`` or
    ``prepare("synth-multimodal", "data/synth", seed=5, swap_prob=0.5)``.

    Args:
        corpus: a name of :data:`fadat.data.corpora.REGISTRY`: ``"parallel-text"`` (the
            files given as options), ``"bible-en-es"``, ``"lohelp-en-de"``, ``"lohelp-en-es"``,
            ``"synth-multimodal"``.
        output: the dataset directory: new, empty, or a dataset of an earlier ``prepare``.
        spm_model: reuse this sentencepiece model instead of training one.
        vocab_size: the joint vocabulary of a trained model (>= 5; small corpora cannot fill
            a large one).
        model_type: ``"bpe"``, ``"unigram"``, ``"char"`` or ``"word"``.
        spm_sample_pairs: train sentencepiece on this many training pairs (source and target
            line each) drawn at random with a fixed seed; 0: all pairs.
        max_source_positions: drop pairs whose source (with ``</s>``) is longer, in tokens.
        max_target_positions: drop pairs whose target (with ``<s> </s>``) is longer.
        strict: empty or over-long pairs are errors instead of being dropped.
        force: replace a dataset of ``prepare`` built from different inputs or options (never a
            directory or file that ``prepare`` did not write).
        chunk_pairs: pairs encoded and written at a time (memory; the output is the same).
        threads: sentencepiece encoding threads (the output is the same; default
            :func:`default_threads`; more than the usable cores: a warning on stderr).
        **options: the corpus's own options (its :class:`~fadat.data.corpora.CorpusSpec`'s
            ``options``: ``source_file``, ``valid_extra_ref`` (a list), ``source_lang``, …
            for parallel text; ``direction``; ``seed``, ``swap_prob``, … for
            synth-multimodal); ``None`` or an empty list is the same as leaving one out.

    Returns:
        ``Path(output)``, holding ``{split}.{src,tgt}.ids.npy`` and their offsets
        (:mod:`fadat.data.binarized`), ``spm.model`` (and ``spm.vocab``), ``raw/`` (the
        valid/test source and reference text; synth-multimodal's ``{split}.validset.jsonl``)
        and ``meta.json`` (format, fingerprint, corpus, languages, vocabulary, special ids,
        sentencepiece, limits, pairs and token statistics per split, dropped pairs, input
        files with their sha256, licence, timings). When ``output`` already holds a dataset
        with the same fingerprint (inputs, options, code), nothing is written.

    Raises:
        InputError: an unknown corpus (naming the registered ones); an option of another
            corpus ("--seed applies to synth-multimodal, not to parallel text"); a value out of
            range or a bad combination (naming the flag, as ``fadat prepare`` does); an output
            that may not be written or replaced (:mod:`fadat.outputs`; a dataset of different
            inputs without ``force``; another ``prepare`` writing it); a missing or bad input
            file (file and line); an empty corpus; a write error (disk full).
        TypeError: an option that no registered corpus takes.
        KeyboardInterrupt: Ctrl-C or SIGTERM during the build (``output`` is left as it was).
    """
    start = time.time()
    spec = corpus_spec(corpus)
    out = Path(output)
    settings = BuildOptions(
        spm_model=os.fspath(spm_model) if spm_model else None,
        vocab_size=vocab_size,
        model_type=model_type,
        spm_sample_pairs=spm_sample_pairs,
        max_source_positions=max_source_positions,
        max_target_positions=max_target_positions,
        strict=strict,
        chunk_pairs=chunk_pairs,
        threads=default_threads() if threads is None else threads,
    )
    settings.check()
    defaults = BuildOptions()
    changed = {n: getattr(settings, n) != getattr(defaults, n) for n in spec.excludes}
    values = corpus_options(spec, options, changed)
    # Encoding threads beyond the cores only share them (the output is the same): a warning,
    # since force here means replacing the dataset.
    warning = check_threads(settings.threads, force=True)
    if warning:
        log(f"warning: {warning}")
    # A second prepare into the same output while this one runs is refused
    # (fadat.outputs.output_lock, held until the stack closes).
    with contextlib.ExitStack() as stack:
        existing = _claim_output(out, _input_files(spec, values, settings), stack)
        made, files, fp = _fingerprint_inputs(spec, values, settings)
        if existing and _up_to_date(out, fp, force):
            log(f"{out} is up to date (same inputs and options); nothing to do")
            return out
        if made is None:
            made = spec.make(**values)
        meta = _build_dataset(settings, made, out, fp, files, start)
        _log_summary(out, meta, start)
    return out


def _input_files(
    spec: CorpusSpec, values: dict[str, Any], settings: BuildOptions
) -> list[tuple[str, str | None]]:
    """``(flag, path)`` of every input file (for :func:`fadat.outputs.check_not_input`):
    ``--spm-model`` and the corpus's file options."""
    found: list[tuple[str, str | None]] = [("--spm-model", settings.spm_model)]
    for option in spec.options:
        if option.path == "file":
            value = values[option.name]
            found += [(option.flag, p) for p in (value if option.repeatable else [value])]
    return found


def _claim_output(
    out: Path, inputs: list[tuple[str, str | None]], stack: contextlib.ExitStack
) -> bool:
    """Check ``out`` and take its lock (held until ``stack`` closes); returns whether it holds a
    dataset already.

    Before any work: the output must be new, empty or a fadat dataset whose files are all
    fadat's own (:mod:`fadat.outputs`), not an input, and its location writable.

    Raises:
        InputError: from :mod:`fadat.outputs`, naming ``--output`` and the problem.
    """
    outputs.check_not_input(out, inputs, "--output")
    outputs.check_output_dir(out, "dataset", "--output")
    stack.enter_context(outputs.output_lock(out, "--output"))
    return outputs.check_output_dir(out, "dataset", "--output")  # as it is under the lock


def _fingerprint_inputs(
    spec: CorpusSpec, values: dict[str, Any], settings: BuildOptions
) -> tuple[Corpus | None, list[dict], str]:
    """``(corpus, files, fingerprint)``: the corpus when making it is how its input files are
    known (``spec.inputs`` is None: parallel text), else None (it is made later, only when the
    output is not up to date); its input files as ``{"path", "sha256"}``; the fingerprint
    (:func:`fadat.data.build.fingerprint`).

    Raises:
        InputError: a missing or unreadable input file, or bad options (from ``spec``).
    """
    made = None
    if spec.inputs is None:
        made = spec.make(**values)
        inputs = made.source_files
    else:
        inputs = spec.inputs(**values)
    files = [{"path": str(p), "sha256": sha256_file(p)} for p in inputs]
    fingerprinted = {o.name: values[o.name] for o in spec.options if not o.path}
    code = [corpus_module_file(spec.name)]
    return made, files, fingerprint(settings, spec.name, fingerprinted, files, code)


def _up_to_date(out: Path, fp: str, force: bool) -> bool:
    """Whether the dataset in ``out`` was built with fingerprint ``fp`` (nothing to do);
    otherwise checks that ``force`` may replace it.

    Raises:
        InputError: a different fingerprint or an unreadable meta.json without ``--force``,
            or (from
            :func:`fadat.outputs.check_replaceable`) a dataset that may not be replaced.
    """
    meta, unreadable = _read_meta(out / "meta.json")
    if meta.get("fingerprint") == fp:
        return True
    if not force and unreadable:
        raise InputError(
            f"--output {out}: exists, a fadat dataset whose meta.json is unreadable "
            f"({unreadable}); use --force to replace it"
        )
    if not force:
        raise InputError(
            f"--output {out}: exists, a fadat dataset built from different inputs or options "
            "(use --force to replace it)"
        )
    outputs.check_replaceable(out, "dataset", "--output")
    return False


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


def _build_dataset(
    settings: BuildOptions, corpus: Corpus, out: Path, fp: str, files: list[dict], start: float
) -> dict:
    """Build the dataset of ``corpus`` in a staging directory and rename it to ``out``; returns
    its ``meta.json`` (:func:`_meta`). Ctrl-C or SIGTERM leaves ``out`` as it was.

    Raises:
        InputError: from the build (a bad input line, ``strict``), or a write error naming
            ``--output`` (disk full, the output's directory removed).
    """
    # A corpus with a vocabulary of its own (synth-multimodal: one piece per word).
    if corpus.model_type is not None:
        settings = dataclasses.replace(settings, model_type=corpus.model_type)
    if corpus.vocab_size is not None:
        settings = dataclasses.replace(settings, vocab_size=corpus.vocab_size)
    # Named .NAME.tmp-PID-*: if this process is killed, the next check of the output removes it
    # (fadat.outputs.remove_stale, run by check_output_dir in _claim_output).
    tmp = outputs.staging_dir(out)
    try:
        with terminate_as_interrupt():
            built = build(settings, corpus, tmp)
            if corpus.write_files is not None:
                corpus.write_files(tmp, built)
            meta = _meta(settings, corpus, built, fp, files, time.time() - start)
            if not corpus.timings:
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
    settings: BuildOptions,
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
            "model_type": None if settings.spm_model else settings.model_type,
            "reused": str(settings.spm_model) if settings.spm_model else None,
            "character_coverage": None if settings.spm_model else 1.0,
            "trained_on": built["spm_sample"],
        },
        "max_source_positions": settings.max_source_positions,
        "max_target_positions": settings.max_target_positions,
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
