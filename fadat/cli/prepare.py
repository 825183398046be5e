"""``fadat prepare``: its flags and the call of :func:`fadat.data.prepare.prepare`.

Forms:

- ``fadat prepare --source-file F --target-file F [--valid-source-file … --test-…]
  --source-lang xx --target-lang yy --output DIR`` (plain text, one sentence per line), or the
  same with ``--tsv F [--valid-tsv F --test-tsv F]`` (columns: source, target, extra references):
  the corpus ``parallel-text``;
- ``fadat prepare CORPUS --output DIR [its options]``: a built-in corpus (``bible-en-es``,
  ``lohelp-en-de``, ``lohelp-en-es``, ``synth-multimodal``).

The corpora's flags are derived from their records (:data:`fadat.data.corpora.CORPORA`): each
:class:`~fadat.data.corpora.CorpusOption` is a flag that defaults to ``None`` (or ``[]``), so
that only the flags given reach :func:`~fadat.data.prepare.prepare`, which refuses those of
another corpus.
"""

from __future__ import annotations

import argparse

from fadat.data.build import (
    CHUNK_PAIRS,
    MAX_POSITIONS,
    MODEL_TYPES,
    SPM_SAMPLE_PAIRS,
    VOCAB_SIZE,
)
from fadat.data.corpora import CORPORA, PARALLEL_TEXT, CorpusOption, all_options, builtin
from fadat.data.prepare import default_threads, prepare
from fadat.options import positive_int, thread_count

SPM_GROUP = "sentencepiece and filtering"
#: Options of the built-in corpora listed outside their corpus's group, where they stood before
#: the registry, so that ``--help`` and the usage line did not change: option → the group's
#: title (``None``: with ``--output``). A new corpus's options go to its own group.
PLACED: dict[str, str | None] = {"direction": None, "sword_dir": SPM_GROUP, "cache_dir": SPM_GROUP}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat prepare``, in the order ``--help`` lists them (the order of
    :meth:`~argparse.ArgumentParser.add_argument` calls is the order of the usage line): the
    corpus and ``--output``; the options placed with them (``--direction``); the parallel-text
    group; the generic "sentencepiece and filtering" group; each built-in corpus's group; the
    options placed in the generic group."""
    parser.add_argument(
        "corpus", nargs="?", choices=builtin(), help="a built-in corpus (else give text files)"
    )
    parser.add_argument("--output", "-o", required=True, help="output directory")
    options = all_options()
    for option in options:
        if option.name in PLACED and PLACED[option.name] is None:
            _add_option(parser, option)
    text = CORPORA[PARALLEL_TEXT]
    _add_group(parser, text.group or text.name, text.options)
    generic = _add_generic_arguments(parser)
    for name in builtin():
        spec = CORPORA[name]
        _add_group(parser, spec.group or spec.name, spec.options)
    for option in options:
        if PLACED.get(option.name) == SPM_GROUP:
            _add_option(generic, option)


def _add_group(
    parser: argparse.ArgumentParser, title: str, options: tuple[CorpusOption, ...]
) -> None:
    """A group of a corpus's options, but those placed elsewhere (:data:`PLACED`) and those
    already added (by another corpus that takes them); no group when none is left."""
    added = {a.dest for a in parser._actions}
    own = [o for o in options if o.name not in PLACED and o.name not in added]
    if own:
        group = parser.add_argument_group(title)
        for option in own:
            _add_option(group, option)


def _add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, option: CorpusOption):
    """The flag of one corpus option, defaulting to ``None`` (``[]`` when repeatable), so that
    a flag left out is not passed on."""
    if option.repeatable:
        parser.add_argument(option.flag, action="append", default=[], help=option.help)
    elif option.type is str:
        parser.add_argument(option.flag, default=None, help=option.help)
    else:
        parser.add_argument(option.flag, type=option.type, default=None, help=option.help)


def _add_generic_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "sentencepiece and filtering" group (vocabulary, length filter, ``--strict``,
    ``--force``, chunk size and threads): the keywords of :func:`fadat.data.prepare.prepare`
    that every corpus has; returns the group."""
    s = parser.add_argument_group(SPM_GROUP)
    s.add_argument("--spm-model", help="reuse this sentencepiece model instead of training one")
    s.add_argument(
        "--vocab-size",
        type=positive_int,
        default=VOCAB_SIZE,
        help=f"joint vocabulary (default {VOCAB_SIZE})",
    )
    s.add_argument("--model-type", default="bpe", choices=MODEL_TYPES)
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
        default=MAX_POSITIONS,
        help=f"drop pairs whose source (with </s>) is longer (default {MAX_POSITIONS})",
    )
    s.add_argument(
        "--max-target-positions",
        type=positive_int,
        default=MAX_POSITIONS,
        help=f"drop pairs whose target (with <s> </s>) is longer (default {MAX_POSITIONS})",
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
        default=default_threads(),
        help="sentencepiece encoding threads (the output is the same; default: cores, at most 4)",
    )
    return s


def run(args: argparse.Namespace) -> int:
    """Run ``fadat prepare``: the corpus (``parallel-text`` when none is named), the generic
    flags and the corpus flags given, passed to :func:`fadat.data.prepare.prepare`; returns the
    exit code (0)."""
    given = {o.name: getattr(args, o.name) for o in all_options()}
    prepare(
        args.corpus or PARALLEL_TEXT,
        args.output,
        spm_model=args.spm_model,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        spm_sample_pairs=args.spm_sample_pairs,
        max_source_positions=args.max_source_positions,
        max_target_positions=args.max_target_positions,
        strict=args.strict,
        force=args.force,
        chunk_pairs=args.chunk_pairs,
        threads=args.threads,
        **{name: value for name, value in given.items() if value is not None and value != []},
    )
    return 0
