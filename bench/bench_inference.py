"""DAT inference in torch and in ONNX Runtime against the AT in CTranslate2, measured fairly
(issues 34 and 45): one run, one table.

The full table of issue 45 (item 5), on a quiet machine (two free cores; say what else ran)::

    fadat prepare bible-en-es --spm-model models/bible-en-es-fadat-cpu-small/spm.model \\
        --output data/bible-en-es-4k                             # the DAT's vocabulary
    fadat shortlist --model models/bible-en-es-fadat-cpu-small --data data/bible-en-es-4k \\
        --output shortlist-dat.safetensors                       # optional: +sl and +vmap rows
    taskset -c 0,1 python bench/bench_inference.py --dat models/bible-en-es-fadat-cpu-small \\
        --at random --data data/bible-en-es-4k --threads 1 2 --repeats 3 \\
        --batch-sentences 256 [--shortlist shortlist-dat.safetensors] \\
        --profile fastest --json inference.json | tee inference.txt

The AT of that size is released: ``--at models/bible-en-es-at-cpu-small`` (with
``--at-shortlist`` for its ``+vmap`` rows) gives CTranslate2's rows on the AT's own outputs, with
their BLEU, and forced to the references' lengths. ``--at random`` stands for it where it is
missing: an AT of the DAT's shape and vocabulary with random weights (:func:`build_random_at`,
seeded), of which only the rows forced to the references' lengths are kept. Two exports are
made into a temporary directory first (≈ 30 s of CPU, not timed), or taken from ``--onnx-dir
DIR`` (``DIR/fp32``, ``DIR/int8``: ``fadat export --format onnx [--precision int8] --output
DIR/PRECISION``); with ``--shortlist FILE`` two more, made with it (``DIR/fp32-sl``,
``DIR/int8-sl``: ``fadat export --format onnx [--precision int8] --shortlist FILE --output
DIR/PRECISION-sl``).
Duration, estimated from the rates of
docs/results/cpu-speed.md (2-core AMD, 1,516 test sentences; 15 torch rows with bf16, 6 ONNX
Runtime rows, 2 CTranslate2 rows): one thread ≈ 5–6 min per repeat, two cores ≈ 2 min per
repeat (256 sentences, two settings per row), peak memory ≈ 2 min, exports ≈ 1 min: ≈ 30 min
for three repeats (bf16 rows left out on a CPU without bf16 units: ≈ 25 min); with
``--shortlist`` (+15 torch rows and their coverage passes, +6 ONNX Runtime rows, +2
CTranslate2 rows) ≈ 55 min.

Usage::

    python bench/bench_inference.py --dat [NAME=]DAT_DIR [--dat NAME=DIR ...] --at AT_DIR|random \\
        --data data/bible-en-es [--threads 1 2] [--repeats 3] [--latency-sentences 100] \\
        [--batch-sentences 512] [--batch-size 64] [--test-sentences 0] \\
        [--precisions fp32 bf16 int8] [--upsample-ratios 4 3] [--prune-thresholds 1e-2] \\
        [--shortlist FILE] [--at-shortlist FILE] [--onnx-dir DIR] \\
        [--onnx-precisions fp32 int8] [--memory-batches 2] \\
        [--beam] [--lm FILE [--gamma 1.0]] [--beam-size 100] \\
        [--only REGEX] [--profile ROW|fastest] [--json out.json]
    python bench/bench_inference.py --smoke --dat DAT --at AT --src SRC --ref REF   # seconds

Several DATs in one run (the speed sweep's frontier, docs/speed-sweep.md): ``--dat NAME=DIR``
once per design. Every design's rows (``--precisions``, ``--upsample-ratios``, ONNX Runtime
exports, each design's own ``shortlist.safetensors`` or ``--shortlist`` for all) and the
CTranslate2 rows are timed in one interleaved run on the same sentences (each design encodes
them with its own sentencepiece model); their names start with the design's (``5x1-range: DAT
lookahead int8 λ=3``). A single bare ``--dat DIR`` names its rows as before (``DAT lookahead
int8 λ=3``); bare and named values do not mix. ``--at random`` builds the AT of the first
design's shape; ``+vmap`` without ``--at-shortlist`` uses the first design's shortlist;
``--onnx-dir DIR`` holds a named design's exports in ``DIR/NAME/PRECISION``. Designs may differ
in depth, width and trained λ (range): a row without ``λ=`` decodes at its model's own
``decoding_upsample_ratio``. Duration at one thread: about 15 s per row and repeat on the
2-core AMD of docs/results/cpu-speed.md (its 23-row one-thread table, ≈ 5–6 min per repeat);
more for λ = 6, less for λ = 2 and for a one-layer decoder. A beam search row (``--beam``,
``--lm``) takes 1.2–1.4× a torch lookahead row's time at batch 1 and 1.5–1.8× in batches
(docs/results/lm-beam.md: int8, one thread, AMD Zen 4, the compiled search): with both, about
three lookahead rows' time more per λ and precision.

``--json FILE``: per row (the row's name is the key) its ``command``; what it measures:
``design`` (the name; ``None`` for a bare ``--dat`` and the CTranslate2 rows), ``model`` (the
directory it loads, ``AT_RANDOM`` for ``--at random``), ``system`` (``torch``, ``onnxruntime``,
``ctranslate2``), ``strategy`` (``greedy``, ``lookahead``, ``joint-viterbi``, ``beam``;
CTranslate2 ``greedy``, ``beam5``), ``lm`` (the beam search's language model file as given to
``--lm``; ``None`` for every other row), ``gamma`` (its weight γ; ``None`` without an LM),
``beam_size`` (the beam search's beam, ``--beam-size``; ``None`` for every other row),
``precision`` (CTranslate2: its compute type), ``upsample_ratio`` (the
λ asked for, ``None`` = the model's), ``lambda`` (the λ decoded with; ``None`` for
CTranslate2), ``shortlist``, ``prune`` (τ or ``None``), ``vmap``, ``forced`` (``=ref len``);
at the first thread count (``threads``) ``latency_ms`` and ``sent_s`` (median, min, max over
repeats) of the setting with the best median (``latency_setting``, ``throughput_setting``),
and ``tok_bleu``, ``bleu`` (rows with BLEU); per thread count (key ``"T"``) every setting's
times; ``same_as_full``, ``cover``, ``disk_mib``, ``memory``, ``profile`` where measured.
``machine``: the CPU and versions; ``run``: ``designs`` (name → directory), ``at``,
``source``, ``test_sentences``, ``latency_sentences``, ``threads``, ``repeats``, ``beam``,
``lm``, ``gamma``, ``beam_size`` (``None`` without ``--beam`` and ``--lm``).
bench/speed_frontier.py turns such files into the frontier's table and picture.

Rows (``--only REGEX`` keeps the rows whose name matches):

- ``DAT``: the DAT through fadat's torch fast path (fadat.models.inference): greedy / lookahead /
  joint-Viterbi × fp32 / bf16 / int8 weights (bf16 by default only where the CPU has bf16
  units: :func:`fadat.process.native_bf16`) × without and with the vocabulary shortlist
  (``+sl``; the DAT directory's ``shortlist.safetensors`` or ``--shortlist``; ``fadat
  shortlist`` builds one) × without and with pruning at each ``--prune-thresholds`` τ (``+prune
  τ``; greedy computes the token head on its path only and is not pruned), at the model's λ and
  at each ``--upsample-ratios`` λ (``λ=x``; decode-time λ below the training λ);
- ``DAT beam`` (``--beam``) and ``DAT beam+LM`` (``--lm FILE``, weight ``--gamma``, default
  1.0, the tuned γ of docs/results/lm-beam.md; the verbs' default is 0.1): the DAT's beam
  search (strategy ``beam`` with its defaults: beam 100, 10 per length, 5 candidates per
  vertex, α = 1.1) through ``DATModel.translate_batch`` as ``fadat translate --strategy beam
  [--lm FILE --gamma γ]`` runs it (:func:`beam_translate`): the full ``(B, L, V)`` token
  log-probabilities (not the top-1 fast path), so no ``+sl`` or ``+prune`` rows; × the
  ``--precisions`` (fp32, bf16 and int8 copies of ``with_precision`` all run it) × the same λ
  values. ``--beam-size K`` sets the beam of every beam row (torch and ONNX Runtime, their
  ``inter t`` workers and memory probes); the rows keep their names, their command says
  ``--beam-size K`` where K is not the strategy's default, their JSON ``beam_size`` always.
  The LM (a KenLM file, opened once before any model is loaded; a missing or unreadable
  file stops the run with ``open_language_model``'s message) reads each design's outputs as
  that design's sentencepiece pieces (``lm_words`` of its own ``spm.model``); a design of whose
  pieces the LM holds fewer than 10 % is refused
  (:func:`fadat.translation.language_model.language_model_options`). ``--gamma`` without
  ``--lm`` is refused, and so is ``--beam-size`` without ``--beam`` or ``--lm``. Its memory
  column includes the LM;
- ``ORT``: the DAT exported with ``fadat export --format onnx`` and run by ONNX Runtime with
  the numpy decoders (:class:`fadat.engine.runtime.OnnxDAT`, docs/engine.md): greedy /
  lookahead / joint-Viterbi × the ``--onnx-precisions`` exports (fp32; int8 = ONNX Runtime's
  dynamic quantization) × without and with the vocabulary shortlist (``+sl``, with
  ``--shortlist FILE`` only, as each such row needs an export of its own: ``fadat export
  --format onnx --shortlist FILE``, whose graph computes the token head over each sentence's
  candidates; docs/engine.md) × the same λ values; no pruning (the graph computes the token head
  on every vertex). An ``ORT ... +sl`` row's ``=full`` compares it with the same row without
  the shortlist; its ``cover`` is left to the torch row of the same strategy.
  int8 quantizes activations per tensor over the whole batch, so an int8 row's outputs depend
  on how sentences are batched (its BLEU is that of the batched pass, its ``inter t`` outputs
  those of the halves). With ``--beam`` and ``--lm`` also ``ORT beam`` and ``ORT beam+LM`` rows
  per export and λ: the same beam search (the same options, beam and γ, the same LM file
  opened once) on each vertex's top 5 tokens that the export's graph gives (format version 2;
  ``fadat export --top-k``), as ``fadat translate --engine onnxruntime --strategy beam
  [--beam-size K] [--lm FILE --gamma γ]`` runs it (:func:`ort_beam_translate`); an export of
  ``--onnx-dir`` of format version 1 stops the run with a message to export it again. Their
  memory column includes the LM and numba. Left out, with a message, when onnxruntime is not
  installed;
- ``CT2``: the AT exported to CTranslate2 (fadat.translation.export; ``--ct2-compute``, default
  int8): greedy and beam 5; the same with CTranslate2's vocabulary map written from a shortlist
  built the same way for the AT's vocabulary (``+vmap``; ``--at-shortlist``, default the AT
  directory's ``shortlist.safetensors``, else the DAT's when both share a vocabulary;
  CTranslate2 takes the union over a batch's sentences); and with every output forced to its
  reference's length (``=ref len``, also ``+vmap =ref len``: ``n + 1`` decoding steps for a
  reference of ``n`` pieces, the work of an AT whose outputs have the references' lengths; for
  when no trained AT exists; their BLEU is meaningless and not shown).

Protocol: token ids in, token ids out (sentencepiece excluded). Threads: for each of ``--threads``:
at 1 thread, torch's one intra-op thread for the DAT, ONNX Runtime's ``intra_op_num_threads=1``
and CTranslate2's ``intra_threads=1``; at t > 1 two settings each, and the table shows the
better of the two per column, named: ``torch t`` / ``intra t`` (``t`` intra-op threads: torch's,
ONNX Runtime's ``intra_op_num_threads``, CTranslate2's ``intra_threads``) and ``inter t`` (``t``
replicas of one thread each, a batch split into ``t`` parts run side by side: CTranslate2's
``inter_threads=t``; for the DAT in torch and in ONNX Runtime ``t`` worker processes,
:class:`Replicas`). Latency: batch 1 on the first ``--latency-sentences`` test sentences after
warm-up; throughput: at the first thread count all test sentences, at the others the first
``--batch-sentences``, sorted by source length in batches of ``--batch-size``. Every row (and
every setting) takes its turn on every sentence (latency) and every batch (throughput), and
this is repeated ``--repeats`` times: the table gives the median over repeats of each repeat's
median latency (ms) and sentences/s, with the spread (min–max over repeats). BLEU (tokenized
with the Moses tokenizer, and sacreBLEU) of each row's batched outputs at the first thread
count, on the first ``--test-sentences`` (0 = all). ``=full``: share of sentences whose output
equals the same row without shortlist and pruning; ``cover``: share of sentences whose
full-head path tokens are all in the shortlist (``+sl``) and whose full-head path stays on kept
vertices (``+prune``), from an untimed pass.

Memory and size, after the timed passes: ``peakMiB`` is the peak resident set size
(``VmHWM`` of ``/proc/self/status``) of a child process (bench/rss_probe.py) that loads the row's
system alone on one thread and translates batch 1 and then the ``--memory-batches`` batches of
the longest sources (the largest working set of the throughput pass); ``ΔMiB`` is that peak
minus the child's peak after its imports (torch rows and CTranslate2 rows import torch; ONNX
Runtime rows import onnxruntime, numpy and sentencepiece only), i.e. the model and its working
memory. An ``inter t`` setting runs t such processes. ``diskMiB``: the files of the directory
the row loads (the export for ONNX Runtime and CTranslate2; the model directory, fp16 weights,
for torch).

``--profile ROW``: instead of the table, where the batch-1 time of that row (its exact name, at
the first thread count) goes over the latency sentences: torch rows through
``torch.profiler`` (operators by self CPU time), ONNX Runtime rows through the session's own
profiler (``SessionOptions.enable_profiling``: kernel time per op type and per part of the
network, the encoder, the decoder, the links head and the token head (:func:`onnx_node_parts`),
ONNX Runtime's time between kernels, and the time outside ``session.run``: padding, the numpy
decoder, Python).
``--profile fastest``: the table, then the profile of its fastest DAT or ORT row at batch 1.
``--profile ROW --profile-batch B``: the same for the first ``--batch-sentences`` sentences,
sorted by length into batches of ``B`` (where the batched time goes).

The header and the footer name the CPU (model name and its matrix units:
:func:`fadat.process.describe_cpu`); the load average and the busiest other processes are
printed with the table; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fadat.data.contract import pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import decode, strategies
from fadat.errors import InputError
from fadat.evaluation.scoring import corpus_scores
from fadat.models.directory import load_model
from fadat.models.inference import PRECISIONS, graph_top1, kept_vertices, with_precision
from fadat.options import positive_int
from fadat.outputs import atomic_write
from fadat.process import describe_cpu, native_bf16
from fadat.translation.language_model import language_model_options, open_language_model
from fadat.translation.pipeline import check_strategy

Translate = Callable[[list[list[int]]], list[list[int]]]
DAT_STRATEGIES = ("greedy", "lookahead", "joint-viterbi")
#: The DAG beam search's strategy name (fadat.decoding.strategies); its rows are ``DAT beam``
#: (``--beam``) and ``DAT beam+LM`` (``--lm``).
BEAM = "beam"
#: The beam rows' beam size without ``--beam-size``: the DAG beam strategy's own default (100).
#: Every beam row, torch and ONNX Runtime, is given its beam size explicitly.
DEFAULT_BEAM_SIZE = strategies.BEAM.defaults["beam_size"]
#: The LM's weight γ of the ``beam+LM`` rows without ``--gamma``: the best of 0.1–1.5 on the
#: released model's valid sentences (docs/results/lm-beam.md); the verbs' default is 0.1.
DEFAULT_GAMMA = 1.0


@dataclass
class Row:
    """One row of the table: a system, its command, and per thread count its settings."""

    name: str
    kind: str  # "dat" (torch), "ort" (ONNX Runtime) or "at" (CTranslate2)
    command: str
    # threads -> [(setting label, factory of the translate function)]
    settings: Callable[[int], list[tuple[str, Callable[[], Translate]]]]
    bleu: bool = True
    baseline: str | None = None  # the row without shortlist/pruning (for "=full")
    dat: dict = field(default_factory=dict)  # model, strategy, shortlist, prune (for "cover")
    probe: dict = field(default_factory=dict)  # what bench/rss_probe.py loads (peak memory)
    disk: Path | None = None  # the directory the system is loaded from (its size on disk)
    design: Design | None = None  # the DAT of a "dat" or "ort" row (its sources, its vocabulary)
    info: dict = field(default_factory=dict)  # what the row measures (the JSON; module docstring)


#: A design's name in ``--dat NAME=DIR``: a word of letters, digits and ``_ . + -``.
DESIGN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


@dataclass(eq=False)
class Design:
    """One DAT of the run (``--dat [NAME=]DIR``) and what is loaded for it in :func:`main`.

    ``name`` is ``None`` for a single bare ``--dat DIR``: its rows keep the names they had
    before several DATs could be given (``DAT lookahead int8``); a named design's rows carry
    the name (``5x1-range: DAT lookahead int8``).
    """

    name: str | None
    directory: Path
    model: Any = None  # the fp32 model (fadat.models.directory.load_model)
    sp: Any = None  # its sentencepiece processor
    sources: list[list[int]] = field(default_factory=list)  # the test sources in its vocabulary
    shortlist_path: Path | None = None
    shortlist: Any = None  # the loaded shortlist, or None: no +sl rows
    onnx_dirs: dict[str, Path] = field(default_factory=dict)  # precision -> export directory
    # precision -> the export made with the design's shortlist (the "ORT ... +sl" rows)
    onnx_sl_dirs: dict[str, Path] = field(default_factory=dict)
    # the beam search's LM keywords for its vocabulary (lm, lm_words; language_model_options)
    lm_options: dict[str, Any] | None = None

    @property
    def prefix(self) -> str:
        """What its rows' names start with: ``"NAME: "``, or ``""`` for a bare ``--dat``."""
        return "" if self.name is None else f"{self.name}: "


def parse_designs(values: Sequence[str]) -> list[Design]:
    """The designs of ``--dat`` values, in order: ``NAME=DIR`` (named) or ``DIR`` (bare; the
    value is a directory, or has no ``=``, or what stands before its first ``=`` is no
    :data:`DESIGN_NAME`).

    Raises:
        SystemExit: several values and one of them bare, an empty directory, or a name given
            twice.
    """
    designs = []
    for value in values:
        name, sep, directory = value.partition("=")
        if sep and not Path(value).is_dir() and DESIGN_NAME.fullmatch(name):
            if not directory:
                raise SystemExit(f"--dat {value}: NAME=DIR needs a directory after '='")
            designs.append(Design(name, Path(directory)))
        else:
            designs.append(Design(None, Path(value)))
    if len(designs) > 1 and any(d.name is None for d in designs):
        bare = next(str(d.directory) for d in designs if d.name is None)
        raise SystemExit(
            f"--dat given {len(designs)} times: name every DAT (NAME=DIR), {bare} has no name"
        )
    names = [d.name for d in designs]
    for name in names:
        if names.count(name) > 1:
            raise SystemExit(f"--dat: the name {name!r} is given twice")
    return designs


def dat_translate(
    model, strategy: str, shortlist, prune: float | None, ratio: float | None = None
) -> Translate:
    def run(sources):
        top1, links, lengths = graph_top1(
            model,
            pad_sequences(sources),
            strategy == "greedy",
            shortlist,
            prune,
            upsample_ratio=ratio,
        )
        return [h.tokens for h in decode(top1, links, lengths, strategy)]

    return run


def beam_translate(model, options: dict[str, Any], ratio: float | None = None) -> Translate:
    """Token ids in, token ids out through the DAT's beam search, the way the pipeline runs it
    (:func:`fadat.translation.pipeline.iter_translations`): ``model.translate_batch(source,
    "beam", options)`` in inference mode, which reads the full ``(B, L, V)`` token
    log-probabilities (``graph_outputs``, in the precision of
    :func:`fadat.models.inference.with_precision`) and runs
    :func:`fadat.decoding.beam.beam_search`; the best hypothesis of each sentence.

    Args:
        model: a DAT model (fp32, or a :func:`~fadat.models.inference.with_precision` copy).
        options: the beam search's keywords, checked by the caller
            (:func:`fadat.translation.pipeline.check_strategy`): ``{}`` for its defaults (beam
            100), ``{"beam_size": k}``, and with an LM also ``{"gamma": γ, "lm": kenlm.Model,
            "lm_words": [...]}`` (:func:`fadat.translation.language_model.language_model_options`);
            :func:`beam_options` gives a row's.
        ratio: the decoding λ (``None`` = the model's).
    """

    def run(sources):
        with torch.inference_mode():
            hyps = model.translate_batch(
                pad_sequences(sources), BEAM, options, upsample_ratio=ratio
            )
        return [list(h[0].tokens) for h in hyps]

    return run


def beam_options(
    design: Design, gamma: float | None, beam_size: int = DEFAULT_BEAM_SIZE
) -> dict[str, Any]:
    """The beam search's keywords of a design's row: ``beam_size``, and with an LM (``gamma``
    not ``None``) γ and the design's LM keywords (:attr:`Design.lm_options`)."""
    if gamma is None:
        return {"beam_size": beam_size}
    return {"beam_size": beam_size, "gamma": gamma, **design.lm_options}


_ENGINES: dict[tuple[str, int], Any] = {}


def ort_engine(directory: str, threads: int):
    """The :class:`fadat.engine.runtime.OnnxDAT` of an export with ``threads`` intra-op threads,
    one session per (directory, threads) in this process (the rows of one export share it)."""
    from fadat.engine.runtime import OnnxDAT

    key = (str(directory), threads)
    if key not in _ENGINES:
        _ENGINES[key] = OnnxDAT(directory, intra_threads=threads)
    return _ENGINES[key]


def ort_translate(engine, strategy: str, ratio: float | None = None) -> Translate:
    """Token ids in, token ids out through ONNX Runtime and the numpy decoders."""

    def run(sources):
        return [h.tokens for h in engine.translate_ids(sources, strategy, ratio)]

    return run


def ort_beam_translate(engine, options: dict[str, Any], ratio: float | None = None) -> Translate:
    """Token ids in, token ids out through ONNX Runtime and the beam search
    (:meth:`fadat.engine.runtime.OnnxDAT.translate_ids` with strategy ``beam``: the graph's
    ``top_lp``/``top_tok`` and :func:`fadat.engine.beam_np.beam_search`), as ``fadat translate
    --engine onnxruntime --strategy beam`` runs it.

    Args:
        engine: an :class:`~fadat.engine.runtime.OnnxDAT` of a format-version-2 export.
        options: the beam search's keywords, as :func:`beam_translate`'s (``{}``,
            ``beam_size``, ``gamma`` and an opened ``lm``; ``lm_words`` defaults to the
            export's pieces).
        ratio: the decoding λ (``None`` = the export's).
    """

    def run(sources):
        return [h.tokens for h in engine.translate_ids(sources, BEAM, ratio, **options)]

    return run


# ----------------------------------------------------------------------------- DAT replicas
# ``inter t`` for the DAT: t worker processes of one torch thread each, a batch split into t
# contiguous parts translated side by side (CTranslate2's ``inter_threads``, as a server with
# t one-thread workers runs). Processes, not threads: torch's intra-op thread count is global.

_REPLICA: dict = {}


def _replica_init(
    dat_dir: str,
    precisions: list[str],
    shortlists: list[str],
    onnx_dirs: Sequence[str],
    barrier: Any,
    lm: str | None = None,
) -> None:
    """Worker start: one torch thread; every precision's model, every shortlist, every ONNX
    export (a one-thread session each) and the language model ``lm`` of the ``beam+LM`` rows
    (a KenLM file opened once, with the DAT's LM words for the torch rows; the ONNX Runtime
    rows read the export's) loaded now, so that no timed call pays for loading; ``barrier`` (a
    ``multiprocessing`` Barrier of the pool's size) is what :func:`_replica_ready` waits on."""
    from fadat.models.shortlist import load_shortlist

    _REPLICA["barrier"] = barrier
    torch.set_num_threads(1)
    _REPLICA["models"], _REPLICA["shortlists"], _REPLICA["lm"] = {}, {}, None
    opened = None if lm is None else open_language_model(lm, cli=True)
    _REPLICA["lm_model"] = opened
    if precisions:
        base, sp = load_model(dat_dir, "cpu")
        _REPLICA["models"] = {p: with_precision(base, p) for p in precisions}
        _REPLICA["shortlists"] = {
            path: load_shortlist(path, base.config.vocab_size) for path in shortlists
        }
        if opened is not None:
            _REPLICA["lm"] = language_model_options(opened, base, sp, path=lm, cli=True)
    _REPLICA["engines"] = {d: ort_engine(d, 1) for d in onnx_dirs}


def _replica_ready(seconds: float) -> int:
    """Keeps a worker busy until every worker of the pool has started one of these (waiting on
    the pool's barrier, at most ``seconds``), so that submitting t of these starts all t
    workers however long loading takes: a worker that has finished cannot take a second one
    while another is still loading."""
    _REPLICA["barrier"].wait(seconds)
    return os.getpid()


def _replica_translate(
    precision: str,
    strategy: str,
    shortlist: str | None,
    prune: float | None,
    ratio: float | None,
    sources: list[list[int]],
) -> list[list[int]]:
    model = _REPLICA["models"][precision]
    sl = None if shortlist is None else _REPLICA["shortlists"][shortlist]
    return dat_translate(model, strategy, sl, prune, ratio)(sources)


def _replica_translate_beam(
    precision: str,
    gamma: float | None,
    ratio: float | None,
    beam_size: int,
    sources: list[list[int]],
) -> list[list[int]]:
    options = {"beam_size": beam_size}
    if gamma is not None:
        options.update(gamma=gamma, **_REPLICA["lm"])
    return beam_translate(_REPLICA["models"][precision], options, ratio)(sources)


def _replica_translate_onnx(
    directory: str, strategy: str, ratio: float | None, sources: list[list[int]]
) -> list[list[int]]:
    return ort_translate(_REPLICA["engines"][directory], strategy, ratio)(sources)


def _replica_translate_onnx_beam(
    directory: str,
    gamma: float | None,
    ratio: float | None,
    beam_size: int,
    sources: list[list[int]],
) -> list[list[int]]:
    options = {"beam_size": beam_size}
    if gamma is not None:
        options.update(gamma=gamma, lm=_REPLICA["lm_model"])
    return ort_beam_translate(_REPLICA["engines"][directory], options, ratio)(sources)


class Replicas:
    """A pool of ``workers`` one-thread processes holding the DAT in each of ``precisions``, a
    one-thread ONNX Runtime session of each export in ``onnx_dirs`` and, for the ``beam+LM``
    rows, the language model file ``lm`` (opened once per worker)."""

    def __init__(
        self,
        dat_dir: str,
        workers: int,
        precisions: list[str],
        shortlists: list[str],
        onnx_dirs: Sequence[str] = (),
        lm: str | None = None,
    ):
        import concurrent.futures
        import multiprocessing

        self.workers = workers
        context = multiprocessing.get_context("spawn")
        self.pool = concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_replica_init,
            initargs=(
                dat_dir,
                precisions,
                shortlists,
                list(onnx_dirs),
                context.Barrier(workers),
                lm,
            ),
        )
        ready = [self.pool.submit(_replica_ready, 600.0) for _ in range(workers)]
        pids = {f.result() for f in ready}
        if len(pids) != workers:
            raise RuntimeError(f"{workers} replicas asked for, {len(pids)} started")

    def _split(self, task: Callable, *head) -> Translate:
        """``task(*head, part)`` on each of ``workers`` contiguous parts of a batch, side by
        side; the outputs in order."""

        def run(sources):
            n = len(sources)
            size = math.ceil(n / self.workers)
            parts = [sources[k : k + size] for k in range(0, n, size)]
            futures = [self.pool.submit(task, *head, p) for p in parts]
            return [y for f in futures for y in f.result()]

        return run

    def translate(self, precision, strategy, shortlist, prune, ratio) -> Translate:
        return self._split(_replica_translate, precision, strategy, shortlist, prune, ratio)

    def translate_beam(
        self,
        precision: str,
        gamma: float | None,
        ratio: float | None,
        beam_size: int = DEFAULT_BEAM_SIZE,
    ) -> Translate:
        """The beam search (:func:`beam_translate`) of beam ``beam_size`` in the workers:
        without an LM (``gamma`` ``None``) or with the pool's ``lm`` at weight ``gamma``."""
        return self._split(_replica_translate_beam, precision, gamma, ratio, beam_size)

    def translate_onnx(self, directory: str, strategy: str, ratio: float | None) -> Translate:
        return self._split(_replica_translate_onnx, directory, strategy, ratio)

    def translate_onnx_beam(
        self,
        directory: str,
        gamma: float | None,
        ratio: float | None,
        beam_size: int = DEFAULT_BEAM_SIZE,
    ) -> Translate:
        """The beam search on ONNX Runtime (:func:`ort_beam_translate`) of beam ``beam_size``
        in the workers: without an LM (``gamma`` ``None``) or with the pool's ``lm`` at weight
        ``gamma``."""
        return self._split(_replica_translate_onnx_beam, directory, gamma, ratio, beam_size)

    def close(self) -> None:
        self.pool.shutdown()


def coverage(model, strategy, shortlist, prune, sources, size, ratio=None) -> float:
    """Share of sentences whose full-head path tokens are in the shortlist and whose full-head
    path stays on the vertices pruning keeps."""
    good = 0
    for k in range(0, len(sources), size):
        batch = sources[k : k + size]
        source = pad_sequences(batch)
        top1, links, lengths = graph_top1(model, source, strategy == "greedy", upsample_ratio=ratio)
        keep = kept_vertices(links, lengths, prune) if prune is not None else None
        for row, h in enumerate(decode(top1, links, lengths, strategy)):
            ok = True
            if shortlist is not None:
                ok &= set(h.path_tokens) <= set(shortlist.candidates(batch[row]).tolist())
            if keep is not None:
                ok &= bool(keep[row, h.path].all())
            good += ok
    return good / max(len(sources), 1)


def busy_processes(n: int = 5) -> str:
    out = subprocess.run(
        ["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()[1 : n + 1]
    return "\n".join("  " + line.strip()[:120] for line in out)


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def measure(
    runs: dict[tuple[str, str], tuple[Translate, list]],
    latency_count: int,
    batch_count: int,
    batch_size: int,
    repeats: int,
    warmup: int,
) -> tuple[dict, dict, dict]:
    """Interleaved latency and throughput of every (row, setting).

    Returns:
        ``(latency, throughput, outputs)``: per key the repeat medians (ms), the repeat
        sentences/s, and the batched outputs of the first repeat.
    """
    for run, sources in runs.values():
        for s in sources[:warmup]:
            run([s])
    latency: dict = {key: [] for key in runs}
    rates: dict = {key: [] for key in runs}
    outputs: dict = {key: [None] * batch_count for key in runs}
    for r in range(repeats):
        times: dict = {key: [] for key in runs}
        for k in range(latency_count):
            for key, (run, sources) in runs.items():
                start = time.perf_counter()
                run([sources[k]])
                times[key].append(time.perf_counter() - start)
        for key, t in times.items():
            latency[key].append(statistics.median(t) * 1000)
        seconds = dict.fromkeys(runs, 0.0)
        plans = {}
        for key, (_, sources) in runs.items():
            order = sorted(range(batch_count), key=lambda i, s=sources: len(s[i]))
            plans[key] = [order[k : k + batch_size] for k in range(0, batch_count, batch_size)]
        for b in range(len(next(iter(plans.values())))):
            for key, (run, sources) in runs.items():
                ids = plans[key][b]
                start = time.perf_counter()
                ys = run([sources[i] for i in ids])
                seconds[key] += time.perf_counter() - start
                if r == 0:
                    for i, y in zip(ids, ys, strict=True):
                        outputs[key][i] = y
        for key in runs:
            rates[key].append(batch_count / seconds[key])
    return latency, rates, outputs


# ----------------------------------------------------------------------------- built per run


def build_random_at(dat_dir: str | Path, output: Path) -> Path:
    """An AT model directory of the DAT's shape (layers, widths, heads, vocabulary, position
    limits) and sentencepiece model, with random weights (the config's ``init_std``).

    For the ``=ref len`` rows while no trained AT of that size exists: forced to the
    references' lengths, an AT does the same work whatever its weights (CTranslate2's kernels
    take no shortcut on values); its own outputs and BLEU mean nothing. Seeded (0), so every
    run times the same model.
    """
    from fadat.models.at import ATModel
    from fadat.models.config import ModelConfig
    from fadat.models.directory import read_model_metadata, spm_model_path

    config = dict(read_model_metadata(dat_dir)["config"])
    config.update(model_type="at", copy_source=False, decode_upsample_ratio=None)
    config.pop("upsample_ratio_range", None)
    torch.manual_seed(0)
    ATModel(ModelConfig.from_dict(config)).save_pretrained(
        output, spm_model=spm_model_path(dat_dir)
    )
    return output


def onnx_export_dir(
    dat_dir: str,
    precision: str,
    onnx_dir: str | None,
    work: Path,
    shortlist: Path | None = None,
) -> Path:
    """The ONNX export of ``precision``, without a shortlist (``PRECISION``) or made with the
    shortlist file ``shortlist`` (``PRECISION-sl``: ``fadat export --format onnx --shortlist
    FILE``): ``onnx_dir/NAME`` when it is one, else exported now into ``work`` (int8 from the
    fp32 export; the export time is not timed).

    Raises:
        SystemExit: an export of ``onnx_dir`` in another precision, or whose shortlist is not
            ``shortlist`` (one where none is asked for, none or another table where one is).
    """
    from fadat.engine.runtime import METADATA, is_engine_dir
    from fadat.engine.shortlist import read_shortlist
    from fadat.translation.onnx_export import export_onnx, quantize_export

    name = precision if shortlist is None else f"{precision}-sl"
    if onnx_dir is not None and is_engine_dir(Path(onnx_dir) / name):
        directory = Path(onnx_dir) / name
        meta = json.loads((directory / METADATA).read_text(encoding="utf-8"))
        if meta["precision"] != precision:
            raise SystemExit(f"{directory}: an export in {meta['precision']}, not {precision}")
        has = meta.get("shortlist")
        if shortlist is None and has is not None:
            raise SystemExit(
                f"{directory}: an export with a shortlist; the ORT rows without +sl need one "
                f"without (the shortlisted export goes in {Path(onnx_dir) / (name + '-sl')})"
            )
        if shortlist is not None and (
            has is None
            or not read_shortlist(directory / has["file"]).same_table(read_shortlist(shortlist))
        ):
            raise SystemExit(
                f"{directory}: not an export made with the shortlist {shortlist} (fadat export "
                f"--format onnx --precision {precision} --shortlist {shortlist})"
            )
        return directory
    out = work / f"onnx-{name}"
    if is_engine_dir(out):  # exported earlier in this run
        return out
    start = time.perf_counter()
    if precision == "fp32":
        export_onnx(dat_dir, out, shortlist=shortlist)
    else:
        fp32 = onnx_export_dir(dat_dir, "fp32", onnx_dir, work, shortlist)
        quantize_export(fp32, out)
    print(f"exported {out} in {time.perf_counter() - start:.0f} s (not timed)", flush=True)
    return out


def check_beam_export(directory: Path) -> None:
    """Stop the run when the export ``directory`` cannot feed the ``ORT beam`` rows: format
    version 1 (each vertex's best token only), or fewer top tokens per vertex than the beam
    search's default ``top_cand_n`` (5).

    Raises:
        SystemExit: with :meth:`fadat.engine.runtime.OnnxDAT.check_beam`'s message.
    """
    from fadat.engine.runtime import FORMAT_VERSION, METADATA, TOP_K

    meta = json.loads((Path(directory) / METADATA).read_text(encoding="utf-8"))
    version, top_k = int(meta.get("format_version", 1)), int(meta.get("top_k", 0))
    if version < FORMAT_VERSION or top_k < min(TOP_K, int(meta["vocab_size"])):
        raise SystemExit(
            f"{directory}: an ONNX export of format version {version} with {top_k} top tokens "
            f"per vertex cannot run the ORT beam rows (--beam, --lm; beam search with "
            f"top_cand_n {TOP_K}): export it again (fadat export --format onnx), or leave "
            "--onnx-dir out"
        )


def disk_mib(directory: Path) -> float:
    """The size of the files under ``directory`` in MiB (what a deployment copies)."""
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file()) / 2**20


def longest_batches(sources: list[list[int]], size: int, count: int) -> list[list[list[int]]]:
    """Batch 1 of the longest source, then ``count`` batches of ``size`` of the longest
    sources: the largest working memory the throughput pass (sorted by length) meets."""
    order = sorted(sources, key=len)
    longest = order[-size * count :]
    return [[order[-1]]] + [longest[k : k + size] for k in range(0, len(longest), size)]


def peak_memory(spec: dict, work: Path) -> dict:
    """Peak resident memory of one system in a child process (bench/rss_probe.py)."""
    import sys

    path = work / "rss-probe.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "rss_probe.py"), str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/rss_probe.py failed on {spec['kind']}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def design_rows(
    design: Design,
    ratios: Sequence[float | None],
    precisions: Sequence[str],
    prune_thresholds: Sequence[float],
    replicas: Callable[[Design, int], Replicas],
    beam: bool = False,
    lm: str | None = None,
    gamma: float = DEFAULT_GAMMA,
    beam_size: int = DEFAULT_BEAM_SIZE,
) -> list[Row]:
    """The torch (``DAT``) and ONNX Runtime (``ORT``) rows of one design (its model, shortlist
    and exports loaded by :func:`main`), in the table's order: torch rows by λ, precision,
    strategy, shortlist, pruning; then ONNX Runtime rows by export (each precision's without,
    then with the shortlist: ``+sl``), λ, strategy. Their names
    start with :attr:`Design.prefix`. ``replicas(design, t)``: the design's pool of ``t``
    one-thread workers (``inter t``), started when a setting first needs it.

    ``beam``: also the beam search's rows without an LM (``DAT beam``, ``ORT beam``); ``lm``
    (the LM file as given on the command line; the design's :attr:`Design.lm_options` hold it
    opened): also those with it at weight ``gamma`` (``DAT beam+LM``, ``ORT beam+LM``); after
    each λ and precision's (export's) other strategies, without shortlist or pruning (the torch
    rows read the full token head, the ONNX Runtime rows the export's top tokens). All of them
    search with beam ``beam_size``; their commands say ``--beam-size`` where it is not the
    strategy's default (:data:`DEFAULT_BEAM_SIZE`)."""
    rows: list[Row] = []
    directory, shortlist, shortlist_path = design.directory, design.shortlist, design.shortlist_path
    models = {}
    for ratio in ratios:
        for precision in precisions:
            models[ratio, precision] = with_precision(design.model, precision)

    def info(system: str, strategy: str, precision: str, ratio: float | None, **extra) -> dict:
        lam = design.model.config.decoding_upsample_ratio if ratio is None else ratio
        return {
            "design": design.name,
            "model": str(directory),
            "system": system,
            "strategy": strategy,
            "precision": precision,
            "upsample_ratio": ratio,
            "lambda": float(lam),
            "lm": None,
            "gamma": None,
            "beam_size": None,
            **extra,
        }

    beams = ([("beam", None, None)] if beam else []) + (
        [("beam+LM", gamma, lm)] if lm is not None else []
    )  # (label, γ, LM file) of each beam search row
    beam_flag = "" if beam_size == DEFAULT_BEAM_SIZE else f" --beam-size {beam_size}"

    for (ratio, precision), model in models.items():
        lam = "" if ratio is None else f" λ={ratio:g}"
        for strategy in DAT_STRATEGIES:
            prunes = [None] + ([] if strategy == "greedy" else list(prune_thresholds))
            for use_sl in (False, True) if shortlist is not None else (False,):
                for prune in prunes:
                    name = f"{design.prefix}DAT {strategy} {precision}{lam}"
                    base_name = name
                    name += " +sl" if use_sl else ""
                    name += f" +prune {prune:g}" if prune is not None else ""
                    command = (
                        f"fadat translate --model {directory} --strategy {strategy} "
                        f"--precision {precision}"
                        + (f" --upsample-ratio {ratio:g}" if ratio is not None else "")
                        + (f" --shortlist {shortlist_path}" if use_sl else "")
                        + (f" --prune-threshold {prune:g}" if prune is not None else "")
                    )
                    sl = shortlist if use_sl else None
                    sl_file = str(shortlist_path) if use_sl else None

                    def settings(
                        t, m=model, s=strategy, sl=sl, pr=prune, r=ratio, p=precision, f=sl_file
                    ):
                        own = [(f"torch {t}", lambda: dat_translate(m, s, sl, pr, r))]
                        if t == 1:
                            return own
                        return own + [
                            (f"inter {t}", lambda: replicas(design, t).translate(p, s, f, pr, r))
                        ]

                    rows.append(
                        Row(
                            name,
                            "dat",
                            command + " --threads T",
                            settings,
                            baseline=base_name if name != base_name else None,
                            dat={
                                "model": model,
                                "strategy": strategy,
                                "sl": sl,
                                "prune": prune,
                                "ratio": ratio,
                                "precision": precision,
                            },
                            probe={
                                "kind": "torch",
                                "dat": str(directory),
                                "precision": precision,
                                "strategy": strategy,
                                "shortlist": sl_file,
                                "prune": prune,
                                "ratio": ratio,
                            },
                            disk=directory,
                            design=design,
                            info=info(
                                "torch", strategy, precision, ratio, shortlist=use_sl, prune=prune
                            ),
                        )
                    )
        for label, weight, row_lm in beams:
            name = f"{design.prefix}DAT {label} {precision}{lam}"
            command = (
                f"fadat translate --model {directory} --strategy {BEAM} --precision {precision}"
                + (f" --upsample-ratio {ratio:g}" if ratio is not None else "")
                + beam_flag
                + (f" --lm {lm} --gamma {weight:g}" if weight is not None else "")
            )
            options = beam_options(design, weight, beam_size)

            def settings(t, m=model, o=options, r=ratio, p=precision, g=weight):
                own = [(f"torch {t}", lambda: beam_translate(m, o, r))]
                if t == 1:
                    return own
                return own + [
                    (f"inter {t}", lambda: replicas(design, t).translate_beam(p, g, r, beam_size))
                ]

            rows.append(
                Row(
                    name,
                    "dat",
                    command + " --threads T",
                    settings,
                    dat={
                        "model": model,
                        "strategy": BEAM,
                        "sl": None,
                        "prune": None,
                        "ratio": ratio,
                        "precision": precision,
                        "lm": weight is not None,
                    },
                    probe={
                        "kind": "torch",
                        "dat": str(directory),
                        "precision": precision,
                        "strategy": BEAM,
                        "shortlist": None,
                        "prune": None,
                        "ratio": ratio,
                        "lm": row_lm,
                        "gamma": weight,
                        "beam_size": beam_size,
                    },
                    disk=directory,
                    design=design,
                    info=info(
                        "torch",
                        BEAM,
                        precision,
                        ratio,
                        shortlist=False,
                        prune=None,
                        lm=row_lm,
                        gamma=weight,
                        beam_size=beam_size,
                    ),
                )
            )
    exports = []  # (precision, export, row name suffix, export flag) of each ORT row group
    for precision, export in design.onnx_dirs.items():
        exports.append((precision, export, "", ""))
        if precision in design.onnx_sl_dirs:
            sl_flag = f" --shortlist {shortlist_path}"
            exports.append((precision, design.onnx_sl_dirs[precision], " +sl", sl_flag))
    for precision, export, suffix, export_flag in exports:
        export_command = (
            f"fadat export --format onnx --precision {precision} --model {directory}"
            f"{export_flag} --output DIR; fadat translate --engine onnxruntime --model DIR"
        )
        for ratio in ratios:
            lam = "" if ratio is None else f" λ={ratio:g}"
            for strategy in DAT_STRATEGIES:
                command = (
                    f"{export_command} --strategy {strategy}"
                    + (f" --upsample-ratio {ratio:g}" if ratio is not None else "")
                    + " --threads T"
                )

                def settings(t, d=str(export), s=strategy, r=ratio):
                    own = [(f"intra {t}", lambda: ort_translate(ort_engine(d, t), s, r))]
                    if t == 1:
                        return own
                    return own + [
                        (f"inter {t}", lambda: replicas(design, t).translate_onnx(d, s, r))
                    ]

                name = f"{design.prefix}ORT {strategy} {precision}{lam}"
                rows.append(
                    Row(
                        name + suffix,
                        "ort",
                        command,
                        settings,
                        baseline=name if suffix else None,
                        dat={"onnx": str(export)},
                        probe={
                            "kind": "onnx",
                            "directory": str(export),
                            "strategy": strategy,
                            "ratio": ratio,
                        },
                        disk=export,
                        design=design,
                        info=info(
                            "onnxruntime",
                            strategy,
                            precision,
                            ratio,
                            shortlist=bool(suffix),
                            prune=None,
                        ),
                    )
                )
            for label, weight, row_lm in beams:
                command = (
                    f"{export_command} --strategy {BEAM}"
                    + (f" --upsample-ratio {ratio:g}" if ratio is not None else "")
                    + beam_flag
                    + (f" --lm {lm} --gamma {weight:g}" if weight is not None else "")
                    + " --threads T"
                )
                options = beam_options(design, weight, beam_size)

                def settings(t, d=str(export), o=options, r=ratio, g=weight):
                    own = [(f"intra {t}", lambda: ort_beam_translate(ort_engine(d, t), o, r))]
                    if t == 1:
                        return own
                    return own + [
                        (
                            f"inter {t}",
                            lambda: replicas(design, t).translate_onnx_beam(d, g, r, beam_size),
                        )
                    ]

                name = f"{design.prefix}ORT {label} {precision}{lam}"
                rows.append(
                    Row(
                        name + suffix,
                        "ort",
                        command,
                        settings,
                        baseline=name if suffix else None,
                        dat={"onnx": str(export), "lm": weight is not None},
                        probe={
                            "kind": "onnx",
                            "directory": str(export),
                            "strategy": BEAM,
                            "ratio": ratio,
                            "lm": row_lm,
                            "gamma": weight,
                            "beam_size": beam_size,
                        },
                        disk=export,
                        design=design,
                        info=info(
                            "onnxruntime",
                            BEAM,
                            precision,
                            ratio,
                            shortlist=bool(suffix),
                            prune=None,
                            lm=row_lm,
                            gamma=weight,
                            beam_size=beam_size,
                        ),
                    )
                )
    return rows


# ----------------------------------------------------------------------------- profiles

#: The parts of an exported DAT graph (:func:`onnx_node_parts`), named as
#: bench/work_per_sentence.py names them, by the module scope the exporter records.
ONNX_PARTS = {
    "model.encoder": "encoder",
    "model.decoder": "decoder",
    "model.links_head": "links head",
}
#: The part of the nodes outside those modules: the token projection, its log-softmax and top-k
#: and the masking of the outputs (:class:`fadat.translation.onnx_export.DATGraph`).
TOKEN_HEAD = "token head"
#: The part of the nodes that ONNX Runtime adds to the graph itself when it loads it.
ORT_OWN_NODES = "ONNX Runtime's own nodes"


def onnx_node_parts(graph: str | Path) -> dict[str, str]:
    """Node name → part of the network (``encoder``, ``decoder``, ``links head`` or ``token
    head``) for every node of an engine graph exported by ``fadat export --format onnx``.

    The exporter (``torch.onnx.export(dynamo=True)``) records each node's module scope in its
    ``pkg.torch.onnx.name_scopes`` metadata: ``model.encoder``, ``model.decoder`` and
    ``model.links_head`` are those parts; nodes outside them are the token head
    (:data:`TOKEN_HEAD`). The nodes that int8 quantization adds carry no metadata (the
    ``DynamicQuantizeLinear`` of an activation, the ``MatMulInteger`` and its scale ``Mul`` and
    ``Cast``); each takes the part of the nearest node with a scope downstream of it (the
    operation it quantizes for: the cross-attention's key and value projections of the encoder's
    output are the decoder's, as in the work count), or upstream where none is downstream.
    ONNX Runtime keeps these node names when it fuses them at load time, so an ONNX Runtime
    profile's node events (``NAME_kernel_time``) map through this table; nodes that ONNX Runtime
    adds itself are not in it.
    """
    import ast
    from collections import defaultdict, deque

    import onnx

    nodes = onnx.load(str(graph), load_external_data=False).graph.node
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = defaultdict(list)
    by_name = {n.name: n for n in nodes}
    scoped: dict[str, str] = {}
    for n in nodes:
        producer.update((out, n.name) for out in n.output)
        for name in n.input:
            consumers[name].append(n.name)
        meta = {p.key: p.value for p in n.metadata_props}
        if "pkg.torch.onnx.name_scopes" in meta:
            scopes = ast.literal_eval(meta["pkg.torch.onnx.name_scopes"])  # ['', module, ..., op]
            module = scopes[1] if len(scopes) > 2 else ""
            scoped[n.name] = ONNX_PARTS.get(module, TOKEN_HEAD)

    def nearest(start: str, step: Callable[[Any], list[str]]) -> str | None:
        seen, queue = {start}, deque([start])
        while queue:
            name = queue.popleft()
            if name != start and name in scoped:
                return scoped[name]
            for nxt in step(by_name[name]):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        return None

    def downstream(n: Any) -> list[str]:
        return [c for out in n.output for c in consumers[out]]

    def upstream(n: Any) -> list[str]:
        return [producer[i] for i in n.input if i in producer]

    parts = dict(scoped)
    for n in nodes:
        if n.name not in parts:
            parts[n.name] = nearest(n.name, downstream) or nearest(n.name, upstream) or TOKEN_HEAD
    return parts


def profile_row(
    row: Row,
    sources: list[list[int]],
    count: int,
    warmup: int,
    threads: int,
    work: Path,
    batch: int = 1,
) -> dict:
    """Where the time of ``row`` (its first setting at ``threads``) goes, over the first
    ``count`` sources after ``warmup`` sentences, translated one at a time (``batch`` 1) or,
    as the throughput measurement does, sorted by length into batches of ``batch``; per
    sentence, printed and returned.

    torch rows: ``torch.profiler`` (CPU), operators by self time. ONNX Runtime rows: the
    session's own profiler (``SessionOptions.enable_profiling``), node time summed by op type
    (``ops_ms``) and by part of the network (``parts_ms``: :func:`onnx_node_parts`), and the
    time outside ``session.run`` (padding, the numpy decoder, Python). Per sentence, in ms.
    CTranslate2 rows: not offered (its kernels are outside Python's reach).
    """
    if row.kind == "at":
        raise SystemExit(f"--profile: {row.name} is a CTranslate2 row; profiles are for DAT rows")
    label, factory = row.settings(threads)[0]
    run = factory()
    for s in sources[:warmup]:
        run([s])
    picked = sources[:count]
    ordered = sorted(picked, key=len)
    groups = [ordered[k : k + batch] for k in range(0, len(ordered), batch)]
    what = f"batch {batch}" + ("" if batch == 1 else f" (length-sorted, {len(groups)} batches)")
    if row.kind == "dat":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for group in groups:
                run(group)
            wall = (time.perf_counter() - start) * 1000 / len(picked)
        table = prof.key_averages()
        ops = sorted(table, key=lambda e: -e.self_cpu_time_total)
        by_op = {e.key: (e.self_cpu_time_total / 1000 / len(picked), e.count) for e in ops}
        print(f"{row.name} ({label}), {what}, {len(picked)} sentences: {wall:.2f} ms/sentence")
        print(table.table(sort_by="self_cpu_time_total", row_limit=25))
        return {"setting": label, "batch": batch, "ms_per_sentence": wall, "ops_ms": by_op}
    from fadat.engine.runtime import create_session

    engine = ort_engine(row.dat["onnx"], threads)
    session = create_session(
        Path(row.dat["onnx"]) / engine.metadata["graph"],
        intra_threads=threads,
        profile_prefix=str(work / "ort-profile"),
    )
    plain, engine.session = engine.session, session
    inside = 0.0
    real_run = session.run

    def timed_run(*a, **k):
        nonlocal inside
        start = time.perf_counter()
        out = real_run(*a, **k)
        inside += time.perf_counter() - start
        return out

    session.run = timed_run
    try:
        for s in sources[:warmup]:
            run([s])
        inside = 0.0
        start = time.perf_counter()
        for group in groups:
            run(group)
        wall = (time.perf_counter() - start) * 1000 / len(picked)
    finally:
        engine.session = plain
    events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    # the last len(groups) runs are the measured ones; the warm-up's node events come before
    run_starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    cutoff = run_starts[-len(groups)] if len(run_starts) >= len(groups) else 0
    node_parts = onnx_node_parts(Path(row.dat["onnx"]) / engine.metadata["graph"])
    by_op: dict[str, list[float]] = {}
    by_part: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            if e["ts"] >= cutoff:
                op = e.get("args", {}).get("op_name", "?")
                by_op.setdefault(op, [0.0, 0])
                by_op[op][0] += e["dur"] / 1000 / len(picked)
                by_op[op][1] += 1 / len(picked)
                part = node_parts.get(e["name"].removesuffix("_kernel_time"), ORT_OWN_NODES)
                by_part[part] = by_part.get(part, 0.0) + e["dur"] / 1000 / len(picked)
    session_ms = inside * 1000 / len(picked)
    nodes = sum(v[0] for v in by_op.values())
    print(
        f"{row.name} ({label}), {what}, {len(picked)} sentences, ORT profiling on: "
        f"{wall:.2f} ms/sentence; session.run {session_ms:.2f} ms (its nodes' kernels "
        f"{nodes:.2f}, between them: ORT's scheduling, allocations {session_ms - nodes:.2f}); "
        f"outside session.run (padding, numpy decoding, Python) {wall - session_ms:.2f} ms"
    )
    print(f"{'op type':<28} {'ms/sent':>8} {'share':>6} {'calls/sent':>10}")
    ops_ms = {}
    for op, (ms, calls) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        ops_ms[op] = ms
        print(f"{op:<28} {ms:>8.3f} {ms / wall:>6.1%} {calls:>10.1f}")
    print(f"\n{'part':<28} {'ms/sent':>8} {'share':>6}")
    parts_ms = {}
    for part in [*ONNX_PARTS.values(), TOKEN_HEAD, ORT_OWN_NODES]:
        if part in by_part:
            parts_ms[part] = by_part[part]
            print(f"{part:<28} {by_part[part]:>8.3f} {by_part[part] / wall:>6.1%}")
    between, outside = session_ms - nodes, wall - session_ms
    print(f"{'between kernels (ORT)':<28} {between:>8.3f} {between / wall:>6.1%}")
    print(f"{'outside session.run':<28} {outside:>8.3f} {outside / wall:>6.1%}")
    print(f"(share: of the whole time per sentence at batch {batch})")
    return {
        "setting": label,
        "batch": batch,
        "ms_per_sentence": wall,
        "session_run_ms": session_ms,
        "ops_ms": ops_ms,
        "parts_ms": parts_ms,
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print the table; returns the results by row name (each with its
    ``command``, per thread count its settings' ``ms`` and ``sent_s`` as (median, min, max),
    and at the first thread count its batched ``outputs``, BLEU, ``same_as_full``, ``cover``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--dat",
        required=True,
        action="append",
        metavar="[NAME=]DIR",
        help="DAT model directory; several DATs measured in one run: --dat NAME=DIR once each "
        "(rows named 'NAME: DAT ...')",
    )
    p.add_argument(
        "--at",
        required=True,
        help="AT model directory (exported to CTranslate2), or 'random': an AT of the DAT's "
        "shape and vocabulary with random weights, for the '=ref len' rows only",
    )
    p.add_argument("--data", help="prepared data directory: raw/test.src.txt, raw/test.ref.txt")
    p.add_argument("--src", help="or: source text file")
    p.add_argument("--ref", help="and its reference file")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency-sentences", type=int, default=100)
    p.add_argument("--batch-sentences", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--test-sentences", type=int, default=0, help="first N only (0 = all)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        help="torch rows' precisions (default all; bf16 only where the CPU has bf16 units)",
    )
    p.add_argument("--upsample-ratios", type=float, nargs="*", default=[], help="extra λ values")
    p.add_argument("--prune-thresholds", type=float, nargs="*", default=[1e-2])
    p.add_argument(
        "--shortlist",
        help="shortlist file of the +sl rows (default: the DAT's shortlist.safetensors); given, "
        "also the ORT ... +sl rows, of an export made with it",
    )
    p.add_argument(
        "--at-shortlist",
        help="the AT's shortlist for +vmap (default: the AT's shortlist.safetensors; else the "
        "DAT's when the vocabularies are the same)",
    )
    p.add_argument("--ct2-compute", nargs="+", default=["int8"])
    p.add_argument(
        "--onnx-dir",
        help="ONNX exports to use: DIR/fp32 and DIR/int8 (fadat export --format onnx), with "
        "--shortlist also DIR/fp32-sl and DIR/int8-sl (exported with --shortlist FILE); the "
        "missing ones are exported to a temporary directory (default: all of them)",
    )
    p.add_argument(
        "--onnx-precisions",
        nargs="*",
        default=["fp32", "int8"],
        help="precisions of the ONNX Runtime rows (none: no ONNX Runtime rows)",
    )
    p.add_argument(
        "--memory-batches",
        type=int,
        default=2,
        help="peak memory: batches of the longest sources each row's child process translates "
        "(0: no memory column)",
    )
    p.add_argument(
        "--profile",
        metavar="ROW",
        help="instead of the table, where the batch-1 time of row ROW goes (its exact name); "
        "'fastest': the table, then the profile of its fastest DAT row at batch 1",
    )
    p.add_argument(
        "--profile-batch",
        type=int,
        default=1,
        metavar="B",
        help="--profile ROW: profile batches of B length-sorted sentences (the first "
        "--batch-sentences) instead of batch 1 (the first --latency-sentences)",
    )
    p.add_argument(
        "--beam",
        action="store_true",
        help="add the DAT's beam search rows without a language model ('DAT beam')",
    )
    p.add_argument(
        "--lm",
        metavar="FILE",
        help="add the DAT's beam search rows with this KenLM language model of the DAT's "
        "pieces ('DAT beam+LM'; fadat translate --lm)",
    )
    p.add_argument(
        "--gamma",
        type=float,
        metavar="G",
        help=f"the --lm rows' LM weight γ (default {DEFAULT_GAMMA:g}; needs --lm)",
    )
    p.add_argument(
        "--beam-size",
        type=positive_int,
        metavar="K",
        help=f"the beam size of the --beam and --lm rows (default the strategy's, "
        f"{DEFAULT_BEAM_SIZE}; needs --beam or --lm)",
    )
    p.add_argument("--only", help="keep the rows whose name matches this regular expression")
    p.add_argument("--smoke", action="store_true", help="a few sentences, one repeat: seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    designs = parse_designs(args.dat)
    if args.gamma is not None and args.lm is None:
        raise SystemExit(
            "--gamma weighs the --lm language model of the beam+LM rows and does nothing "
            "without one; give --lm FILE or leave --gamma out"
        )
    gamma = DEFAULT_GAMMA if args.gamma is None else args.gamma  # read only with --lm
    if args.beam_size is not None and not (args.beam or args.lm is not None):
        raise SystemExit(
            "--beam-size sets the beam of the beam search rows and does nothing without them; "
            "give --beam or --lm FILE, or leave --beam-size out"
        )
    beam_size = DEFAULT_BEAM_SIZE if args.beam_size is None else args.beam_size
    opened_lm = None
    if args.lm is not None:  # before any model is loaded: a missing file stops the run at once
        try:
            opened_lm = open_language_model(args.lm, cli=True)
        except InputError as err:
            raise SystemExit(str(err)) from None
    print(f"CPU: {describe_cpu()}", flush=True)
    if args.precisions is None:
        args.precisions = [p for p in PRECISIONS if p != "bf16" or native_bf16("cpu")]
        if "bf16" not in args.precisions:
            print(
                "no bf16 units on this CPU (emulated bf16 ran 33x slower than fp32 on an AVX2 "
                "CPU): bf16 rows left out; --precisions bf16 to time them anyway",
                flush=True,
            )
    if args.smoke:
        args.threads, args.repeats, args.warmup = args.threads[:1], 1, 1
        args.memory_batches = min(args.memory_batches, 1)
        args.latency_sentences, args.batch_sentences, args.batch_size = 2, 4, 2
        args.test_sentences = args.test_sentences or 4

    import sentencepiece as spm

    from fadat.models.directory import read_model_metadata, spm_model_path
    from fadat.models.shortlist import SHORTLIST_NAME, load_shortlist
    from fadat.translation.export import CTranslate2AT, export_ctranslate2

    if args.data:
        raw = Path(args.data) / "raw"
        src_path, ref_path = raw / "test.src.txt", raw / "test.ref.txt"
    else:
        src_path, ref_path = Path(args.src), Path(args.ref)
    lines = src_path.read_text(encoding="utf-8").splitlines()
    refs = ref_path.read_text(encoding="utf-8").splitlines()
    if args.test_sentences:
        lines, refs = lines[: args.test_sentences], refs[: args.test_sentences]
    n_test = len(lines)
    latency_count = min(args.latency_sentences, n_test)
    target_lang = (read_model_metadata(designs[0].directory).get("data") or {}).get(
        "target_lang", "es"
    )

    # λ of the DAT rows: the model's, then the extra ones
    ratios = list(dict.fromkeys([None, *args.upsample_ratios]))
    for design in designs:
        design.model, design.sp = load_model(design.directory, "cpu")
        design.sources = [encode_source(design.sp, x) for x in lines]
        where = "" if design.name is None else f"--dat {design.name}: "
        try:  # the LM must speak each design's own pieces (its sentencepiece model)
            if opened_lm is not None:
                design.lm_options = language_model_options(
                    opened_lm, design.model, design.sp, path=args.lm, cli=True
                )
            for weight in [None] * args.beam + ([gamma] if args.lm is not None else []):
                options = beam_options(design, weight, beam_size)
                check_strategy(design.model, BEAM, options, cli=True)
        except InputError as err:
            raise SystemExit(f"{where}{err}") from None
    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    random_at = args.at == "random"
    first = designs[0]
    at_dir = build_random_at(first.directory, work / "at-random") if random_at else Path(args.at)
    sp_at = spm.SentencePieceProcessor(model_file=str(spm_model_path(at_dir)))
    src_at = [encode_source(sp_at, x) for x in lines]
    ref_lengths = [len(sp_at.encode(y)) for y in refs]
    for design in designs:
        design.shortlist_path = Path(args.shortlist or design.directory / SHORTLIST_NAME)
        if design.shortlist_path.is_file():
            design.shortlist = load_shortlist(design.shortlist_path, design.model.config.vocab_size)
        else:
            print(
                f"no shortlist at {design.shortlist_path}: rows with +sl/+vmap left out",
                flush=True,
            )
    shortlist_path, shortlist = first.shortlist_path, first.shortlist

    export_ctranslate2(at_dir, work / "at-ct2")
    same_vocab = [sp_at.id_to_piece(i) for i in range(sp_at.get_piece_size())] == [
        first.sp.id_to_piece(i) for i in range(first.sp.get_piece_size())
    ]
    at_shortlist_path = Path(args.at_shortlist or at_dir / SHORTLIST_NAME)
    vmap_from = None  # the shortlist CTranslate2's vocabulary map (+vmap) is written from
    if at_shortlist_path.is_file():
        vmap_from = at_shortlist_path  # the AT's own, built the same way for its vocabulary
    elif shortlist is not None and same_vocab:
        vmap_from = shortlist_path
    elif shortlist is not None:
        print(
            f"the AT's vocabulary is not the DAT's and {at_shortlist_path} does not exist "
            "(fadat shortlist --model AT_DIR): +vmap rows left out",
            flush=True,
        )
    if vmap_from is not None:
        export_ctranslate2(at_dir, work / "at-ct2-vmap", shortlist=vmap_from)
        vmap_command = f"fadat export --shortlist {vmap_from}"

    at_name = "AT_RANDOM" if random_at else args.at
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        if args.onnx_precisions:
            print("onnxruntime is not installed: ONNX Runtime rows left out", flush=True)
        args.onnx_precisions = []
    for design in designs:  # a named design's exports: ONNX_DIR/NAME/PRECISION, work/NAME/...
        sub = "" if design.name is None else design.name
        onnx_dir = None if args.onnx_dir is None else str(Path(args.onnx_dir) / sub)
        (work / sub).mkdir(exist_ok=True)
        for precision in args.onnx_precisions:
            design.onnx_dirs[precision] = onnx_export_dir(
                str(design.directory), precision, onnx_dir, work / sub
            )
            if design.shortlist is not None and args.shortlist is not None:  # "ORT ... +sl"
                design.onnx_sl_dirs[precision] = onnx_export_dir(
                    str(design.directory), precision, onnx_dir, work / sub, design.shortlist_path
                )
            if args.beam or args.lm is not None:  # the ORT beam rows need the top tokens
                check_beam_export(design.onnx_dirs[precision])
                if precision in design.onnx_sl_dirs:
                    check_beam_export(design.onnx_sl_dirs[precision])

    pools: dict[tuple[Design, int], Replicas] = {}
    # what each design's replicas hold
    pooled: dict[Design, dict[str, Any]] = {
        d: {"precisions": set(), "onnx": set(), "lm": False} for d in designs
    }

    def replicas(design: Design, t: int) -> Replicas:
        if (design, t) not in pools:
            shortlists = [str(design.shortlist_path)] if design.shortlist is not None else []
            held = pooled[design]
            pools[design, t] = Replicas(
                str(design.directory),
                t,
                sorted(held["precisions"]),
                shortlists,
                sorted(held["onnx"]),
                args.lm if held["lm"] else None,
            )
        return pools[design, t]

    rows: list[Row] = []
    for design in designs:
        rows += design_rows(
            design,
            ratios,
            args.precisions,
            args.prune_thresholds,
            replicas,
            beam=args.beam,
            lm=args.lm,
            gamma=gamma,
            beam_size=beam_size,
        )
    ct2_variants = [("", {}, True), (" =ref len", {"forced": True}, False)]
    if (work / "at-ct2-vmap").is_dir():
        ct2_variants.insert(1, (" +vmap", {"vmap": True}, True))
        ct2_variants.append((" +vmap =ref len", {"vmap": True, "forced": True}, False))
    if random_at:  # a random AT's own outputs run to the length limit: only forced rows
        ct2_variants = [v for v in ct2_variants if v[1].get("forced")]
    for compute in args.ct2_compute:
        for beam in (1, 5):
            for suffix, variant, bleu in ct2_variants:
                name = f"CT2 {'greedy' if beam == 1 else 'beam5'} {compute}{suffix}"
                directory = work / ("at-ct2-vmap" if variant.get("vmap") else "at-ct2")
                command = (
                    f"fadat export --format ctranslate2 --model {at_name} --output DIR"
                    + (vmap_command.removeprefix("fadat export") if variant.get("vmap") else "")
                    + f"; CTranslate2AT(DIR, '{compute}', intra_threads, inter_threads)"
                    + f".translate_ids(ids, beam_size={beam}"
                    + (", use_vmap=True" if variant.get("vmap") else "")
                    + (", target_lengths=reference lengths" if variant.get("forced") else "")
                    + ")"
                )

                def make(intra, inter, d=directory, c=compute, b=beam, v=variant):
                    engine = CTranslate2AT(d, c, intra_threads=intra, inter_threads=inter)
                    lengths = {tuple(s): n for s, n in zip(src_at, ref_lengths, strict=True)}

                    def run(sources):
                        forced = [lengths[tuple(s)] for s in sources] if v.get("forced") else None
                        return engine.translate_ids(
                            sources,
                            beam_size=b,
                            max_batch_size=math.ceil(len(sources) / inter),
                            use_vmap=bool(v.get("vmap")),
                            target_lengths=forced,
                        )

                    return run

                def settings(t, make=make):
                    if t == 1:
                        return [("intra 1", lambda: make(1, 1))]
                    return [(f"intra {t}", lambda: make(t, 1)), (f"inter {t}", lambda: make(1, t))]

                rows.append(
                    Row(
                        name,
                        "at",
                        command,
                        settings,
                        bleu=bleu,
                        probe={
                            "kind": "ct2",
                            "directory": str(directory),
                            "compute": compute,
                            "beam": beam,
                            "vmap": bool(variant.get("vmap")),
                            "forced": bool(variant.get("forced")),
                        },
                        disk=directory,
                        info={
                            "design": None,
                            "model": str(at_name),
                            "system": "ctranslate2",
                            "strategy": "greedy" if beam == 1 else "beam5",
                            "precision": compute,
                            "upsample_ratio": None,
                            "lambda": None,
                            "shortlist": False,
                            "prune": None,
                            "vmap": bool(variant.get("vmap")),
                            "forced": bool(variant.get("forced")),
                            "lm": None,
                            "gamma": None,
                            "beam_size": None,
                        },
                    )
                )

    def sources_of(row: Row) -> list[list[int]]:
        """The test sources in the row's vocabulary: its design's, or the AT's."""
        return src_at if row.design is None else row.design.sources

    if args.profile and args.profile != "fastest":
        chosen = [r for r in rows if r.name == args.profile]
        if not chosen:
            names = ", ".join(r.name for r in rows if r.kind != "at")
            raise SystemExit(f"--profile {args.profile!r}: no such row; rows: {names}")
        torch.set_num_threads(args.threads[0])
        if args.profile_batch < 1:
            raise SystemExit(f"--profile-batch must be >= 1, got {args.profile_batch}")
        count = latency_count if args.profile_batch == 1 else min(args.batch_sentences, n_test)
        result = profile_row(
            chosen[0],
            sources_of(chosen[0]),
            count,
            args.warmup,
            args.threads[0],
            work,
            batch=args.profile_batch,
        )
        shutil.rmtree(work, ignore_errors=True)
        return {chosen[0].name: result}

    if args.only:
        rows = [r for r in rows if re.search(args.only, r.name)]
    for r in rows:  # what ``inter t`` replicas must hold
        if r.kind == "dat":
            pooled[r.design]["precisions"].add(r.dat["precision"])
            pooled[r.design]["lm"] |= bool(r.dat.get("lm"))
        elif r.kind == "ort":
            pooled[r.design]["onnx"].add(r.dat["onnx"])
            pooled[r.design]["lm"] |= bool(r.dat.get("lm"))

    results: dict[str, dict] = {r.name: {"command": r.command, **r.info} for r in rows}
    for t_index, threads in enumerate(args.threads):
        torch.set_num_threads(threads)
        runs = {}
        for r in rows:
            for label, factory in r.settings(threads):
                runs[r.name, label] = (factory(), sources_of(r))
        count = n_test if t_index == 0 else min(args.batch_sentences, n_test)
        lat, rate, outs = measure(
            runs, latency_count, count, args.batch_size, args.repeats, args.warmup
        )
        for r in rows:
            per = {}
            for label, _ in r.settings(threads):
                key = (r.name, label)
                per[label] = {"ms": spread(lat[key]), "sent_s": spread(rate[key])}
            best_ms = min(per, key=lambda k: per[k]["ms"][0])
            best_rate = max(per, key=lambda k: per[k]["sent_s"][0])
            results[r.name][threads] = {
                "settings": per,
                "best_latency": best_ms,
                "best_throughput": best_rate,
            }
            if t_index == 0:
                results[r.name].update(
                    threads=threads,
                    latency_ms=per[best_ms]["ms"],
                    latency_setting=best_ms,
                    sent_s=per[best_rate]["sent_s"],
                    throughput_setting=best_rate,
                )
                outputs = outs[r.name, r.settings(threads)[0][0]]
                results[r.name]["outputs"] = outputs
                if r.bleu:
                    sp = sp_at if r.design is None else r.design.sp
                    scores = corpus_scores([sp.decode(y) for y in outputs], [refs], target_lang)
                    results[r.name]["tok_bleu"] = round(scores["tok_bleu"], 2)
                    results[r.name]["bleu"] = round(scores["bleu"], 2)
            print(f"[{threads} thread(s)] {r.name}: {json.dumps(per)}", flush=True)
    torch.set_num_threads(args.threads[0])
    for pool in pools.values():
        pool.close()
    for r in rows:
        if r.baseline is not None and r.baseline in results:
            mine, full = results[r.name]["outputs"], results[r.baseline]["outputs"]
            same = sum(a == b for a, b in zip(mine, full, strict=True))
            results[r.name]["same_as_full"] = same / len(mine)
            d = r.dat
            if "model" in d:  # a torch row (an ORT +sl row's cover is its torch row's)
                results[r.name]["cover"] = coverage(
                    d["model"],
                    d["strategy"],
                    d["sl"],
                    d["prune"],
                    sources_of(r),
                    args.batch_size,
                    d["ratio"],
                )
        if r.disk is not None:
            results[r.name]["disk_mib"] = disk_mib(r.disk)
    if args.memory_batches > 0:
        forced = {tuple(s): n for s, n in zip(src_at, ref_lengths, strict=True)}
        for r in rows:
            spec = dict(r.probe)
            spec["batches"] = longest_batches(sources_of(r), args.batch_size, args.memory_batches)
            if spec.pop("forced", False):
                spec["lengths"] = [[forced[tuple(s)] for s in b] for b in spec["batches"]]
            results[r.name]["memory"] = peak_memory(spec, work)
            print(f"[memory] {r.name}: {json.dumps(results[r.name]['memory'])}", flush=True)

    print()
    print(f"CPU: {describe_cpu()}")
    head = f"{'#':>2} {'system':<40} {'tokBLEU':>7} {'BLEU':>6} {'=full':>5} {'cover':>5}"
    head += f" {'peakMiB':>7} {'ΔMiB':>6} {'diskMiB':>7}"
    for t in args.threads:
        head += f" | {t}T ms (min-max)      setting | sent/s (min-max)        setting"
    print(head)
    print("-" * len(head))
    for k, r in enumerate(rows, start=1):
        x = results[r.name]
        tok, bleu = x.get("tok_bleu", math.nan), x.get("bleu", math.nan)
        mem = x.get("memory") or {}
        peak = mem.get("peak_mib", math.nan)
        grown = peak - mem.get("base_mib", math.nan)
        row = f"{k:>2} {r.name:<40} {tok:>7.2f} {bleu:>6.2f}"
        row += f" {x.get('same_as_full', math.nan):>5.2f} {x.get('cover', math.nan):>5.2f}"
        row += f" {peak:>7.0f} {grown:>6.0f} {x.get('disk_mib', math.nan):>7.1f}"
        for t in args.threads:
            y = x[t]
            ms = y["settings"][y["best_latency"]]["ms"]
            sr = y["settings"][y["best_throughput"]]["sent_s"]
            row += f" | {ms[0]:>7.1f} ({ms[1]:.1f}-{ms[2]:.1f}) {y['best_latency']:>9}"
            row += f" | {sr[0]:>6.1f} ({sr[1]:.1f}-{sr[2]:.1f}) {y['best_throughput']:>9}"
        print(row)
    print("\ncommands:")
    for k, r in enumerate(rows, start=1):
        print(f"{k:>2} {r.command}")
    if random_at:
        print(
            "AT_RANDOM: an AT of the DAT's shape and vocabulary with random weights "
            "(build_random_at in bench/bench_inference.py); its rows are forced to the "
            "references' lengths"
        )
    versions = f"torch {torch.__version__}, ctranslate2 {__import__('ctranslate2').__version__}"
    if any(d.onnx_dirs for d in designs):
        versions += f", onnxruntime {__import__('onnxruntime').__version__}"
    print(
        f"\n{n_test} test sentences (BLEU, and throughput at {args.threads[0]} thread(s)); "
        f"latency on the first {latency_count}, throughput at other thread counts on the first "
        f"{min(args.batch_sentences, n_test)}; batches of {args.batch_size}; {args.repeats} "
        f"interleaved repeats, medians (min-max); {versions}"
    )
    if args.memory_batches > 0:
        print(
            f"peakMiB: peak resident set size of a child process (bench/rss_probe.py) that loads "
            f"the row's system alone on one thread and translates batch 1, then the "
            f"{args.memory_batches} batches of {args.batch_size} longest sources; ΔMiB: that "
            "peak minus the child's peak after its imports (torch rows and CT2 import torch, "
            "ORT rows only onnxruntime); an 'inter t' setting holds t such processes. diskMiB: "
            "the directory the system is loaded from (torch rows: the model directory)"
        )
    print(f"CPU: {describe_cpu()}")
    print(f"load average {os.getloadavg()}; busiest processes at the end:\n{busy_processes()}")
    if args.profile == "fastest":
        t = args.threads[0]

        def batch1_ms(r: Row) -> float:
            x = results[r.name][t]
            return x["settings"][x["best_latency"]]["ms"][0]

        candidates = [r for r in rows if r.kind in ("dat", "ort")]
        if candidates:
            best = min(candidates, key=batch1_ms)
            print(f"\nprofile of the fastest DAT row at batch 1, {t} thread(s): {best.name}")
            results[best.name]["profile"] = profile_row(
                best, sources_of(best), latency_count, args.warmup, t, work
            )
    if args.json:
        saved = {
            name: {k: v for k, v in x.items() if k != "outputs"} for name, x in results.items()
        }
        saved["machine"] = {"cpu": describe_cpu(), "versions": versions}
        saved["run"] = {
            "designs": {d.name: str(d.directory) for d in designs if d.name is not None},
            "at": str(at_name),
            "source": str(src_path),
            "test_sentences": n_test,
            "latency_sentences": latency_count,
            "threads": args.threads,
            "repeats": args.repeats,
            "beam": args.beam,
            "lm": args.lm,
            "gamma": gamma if args.lm is not None else None,
            "beam_size": beam_size if args.beam or args.lm is not None else None,
        }
        # all or nothing: a benchmark killed while writing leaves the previous file, not half
        atomic_write(args.json, json.dumps(saved, indent=1, default=str) + "\n", "--json")
    shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
