"""Quality and speed of DAT and AT models side by side (paper Table 2, Table 5): :func:`evaluate`,
whose keyword arguments are the flags of ``fadat evaluate`` with their defaults (the command line,
``report.json`` and the printed table: :mod:`fadat.cli.evaluate`).

One process, one test set, one device, one thread setting for every model and strategy:

- **Systems**: each DAT model × each ``--strategies`` entry; each AT model × greedy and beam
  search (``--at-beam-size``, default 5: the paper's AT baseline).
- **Quality** against the raw references that ``fadat prepare`` wrote (every reference stream:
  es→en Bible has WEB and KJV): sacreBLEU corpus BLEU (default ``13a`` tokenizer, or the target
  language's, e.g. ``zh``) with its signature, chrF with its signature, and *tokenized BLEU*, the
  NAT papers' number (docs/reference-behaviour.md, "Evaluation"): hypotheses and references
  tokenised with sacremoses' ``MosesTokenizer`` (target language, no escaping) and scored with
  ``tokenize="none"``.
- **Length buckets** (paper Table 5): tokenized BLEU of the sentences whose first reference has
  ``< 20``, ``20–40``, ``40–60``, ``≥ 60`` tokens (13a tokens, as ``fadat analyze`` buckets,
  :func:`fadat.evaluation.scoring.length_buckets`).
- **Significance**: sacreBLEU's paired bootstrap (``sacrebleu.significance.PairedTest``,
  ``test_type="bs"``, seed 12345) of every system against a baseline system, for sacreBLEU and
  tokenized BLEU. The baseline is ``--baseline`` or the AT beam system, else the first system;
  with several DAT models, each model's systems are also compared with the first DAT model's
  system of the same strategy (the paper's FA-DAT vs DA-Transformer stars).
  A system whose outputs equal the baseline's is shown as ``same`` (sacreBLEU reports
  ``p = 1/(samples+1)`` for identical systems) and listed in its ``identical_to``.
- **Latency** (docs/reference-behaviour.md, "Evaluation"; the reference's ``--batch-size 1``):
  raw string in → detokenised string out through :func:`fadat.translation.pipeline.translate_lines`
  at batch size 1, median over the test sentences, after
  ``--warmup`` (20) untimed sentences; systems are interleaved sentence by sentence (the order
  rotates each sentence) so drifts of the machine hit every system alike.
- **Throughput**: sentences/s of the whole test set in batches of ``--batch-size`` (64)
  sentences, after one untimed warm-up batch; these are the hypotheses that are scored.
- **Speed-up** of every system relative to the baseline (AT beam-5), as a ratio of median
  latencies (and of throughputs), like the paper's Table 2 column.
- ``--tune-length-penalty``: β_v of joint-Viterbi is chosen per DAT model on the valid split by
  tokenized BLEU over ``--length-penalty-grid`` and reported.
- **Engines** (``--engine``, as ``fadat translate``'s:
  :func:`fadat.translation.engines.load_translation_model`): each directory is loaded on the
  engine it names (``auto``, the default: ONNX Runtime for an export of ``fadat export --format
  onnx``, torch for a model directory) or on the one given; the systems of an export are
  decoded by :class:`fadat.engine.runtime.OnnxDAT` through the same pipeline, batches and
  timers, and every system records its ``engine`` and ``precision``.
  The onnxruntime engine runs DAT models only, on the CPU, with ``--threads`` intra-op threads,
  without ``--prune-threshold``, and the strategies it offers (an AT directory, another strategy
  or a lookahead n-gram ban is refused, naming the model); an export made with a shortlist runs
  it (``--shortlist`` checks that it has that one; a model directory is exported with it).

``report.json`` records the CPU, threads, library versions and every setting; a table is
printed. Only CPU was run; ``--device cuda`` is supported by the code but was not run (GPU timing
would also need ``torch.cuda.synchronize`` around each call, which this module does for CUDA).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from fadat import outputs
from fadat.decoding.strategies import offered
from fadat.engine import DEFAULT_ENGINE, ENGINES, resolve_engine
from fadat.errors import DecodingOptionError, InputError
from fadat.evaluation import validset_metrics
from fadat.evaluation.scoring import (
    DEFAULT_STRATEGIES,
    bleu_metric,
    bucket_scores,
    corpus_scores,
    load_split,
    moses_tokenize,
    paired_bootstrap,
    read_languages,
    tokenized_bleu_metric,
)
from fadat.models.directory import model_device, model_labels, resolve_device
from fadat.models.inference import PRECISIONS
from fadat.options import decoding_keywords, usable_cores
from fadat.process import apply_threads
from fadat.translation.engines import load_translation_model, model_engine, refuse_non_dat
from fadat.translation.language_model import (
    check_takes_language_model,
    language_model_options,
    open_language_model,
)
from fadat.translation.pipeline import (
    apply_precision,
    apply_reduced_head,
    check_option_values,
    check_strategy,
    check_upsample_ratio,
    encode_sources,
    translate_lines,
)

DEFAULT_GRID = (0.6, 0.8, 1.0, 1.2, 1.4)

#: The decoding options that go to the autoregressive models too (the AT's output limit).
AT_OPTIONS = ("max_len_a", "max_len_b")


@dataclass
class System:
    """One (model, strategy) pair to evaluate.

    Attributes:
        name: ``"<model label>:<strategy>"`` (AT beam: ``"<label>:beam<k>"``).
        label: the model's label (its directory name, made unique).
        model, sp: the loaded model (a torch module, or the onnxruntime engine's
            :class:`~fadat.translation.engines.OnnxRuntimeModel`) and its sentencepiece
            processor.
        strategy: a name of :func:`fadat.translation.pipeline.strategy_options`.
        options: the strategy's keyword options.
        upsample_ratio: the decoding λ (``--upsample-ratio``); ``None`` = the model's.
    """

    name: str
    label: str
    model: Any
    sp: Any
    strategy: str
    options: dict[str, Any] = field(default_factory=dict)
    upsample_ratio: float | None = None

    @property
    def model_type(self) -> str:
        return self.model.config.model_type

    @property
    def engine(self) -> str:
        """``torch`` or ``onnxruntime`` (:func:`fadat.translation.engines.model_engine`)."""
        return model_engine(self.model)[0]

    @property
    def precision(self) -> str:
        """``fp32``, ``bf16`` or ``int8``: the torch model's inference precision, or the
        export's."""
        return model_engine(self.model)[1]

    def translate(
        self, sentences: Sequence[str], max_sentences: int | None, max_tokens: int | None
    ) -> list[str]:
        """Detokenised best hypothesis per sentence (:func:`translate_lines`, no re-checks)."""
        results = translate_lines(
            self.model,
            self.sp,
            sentences,
            strategy=self.strategy,
            options=self.options,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            warn=_quiet,
            check=False,
            upsample_ratio=self.upsample_ratio,
        )
        return [hyps[0].text for hyps in results]


def _quiet(message: str) -> None:
    """Truncation warnings are counted once per model in :func:`evaluate`, not per call."""


# ----------------------------------------------------------------------------------------------
# Metrics


# ----------------------------------------------------------------------------------------------
# Speed


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_latency(
    systems: Sequence[System], sentences: Sequence[str], warmup: int
) -> dict[str, list[float]]:
    """Per-sentence latency at batch size 1, systems interleaved sentence by sentence.

    Each call is raw string → detokenised string (:func:`translate_lines` with one sentence).
    The first ``warmup`` calls per system (on sentences ``0, 1, …`` of the list, cycled) are not
    recorded; then every sentence is translated by every system, the system order rotating by
    one each sentence.

    Returns:
        ``{system name: [seconds per sentence, in test order]}``.
    """
    times: dict[str, list[float]] = {s.name: [] for s in systems}
    n = len(systems)
    warm = [sentences[k % len(sentences)] for k in range(warmup)] if sentences else []
    for phase, batch in (("warmup", warm), ("timed", sentences)):
        for i, sentence in enumerate(batch):
            for r in range(n):
                system = systems[(i + r) % n]
                device = model_device(system.model)
                _synchronize(device)
                start = time.perf_counter()
                system.translate([sentence], max_sentences=1, max_tokens=None)
                _synchronize(device)
                if phase == "timed":
                    times[system.name].append(time.perf_counter() - start)
    return times


def translate_timed(
    system: System, sentences: Sequence[str], batch_size: int, max_tokens: int | None
) -> tuple[list[str], float]:
    """Translate ``sentences`` in batches of ``batch_size`` after one untimed warm-up batch.

    Returns:
        ``(hypotheses, seconds)`` of the timed pass.
    """
    device = model_device(system.model)
    system.translate(sentences[:batch_size], max_sentences=batch_size, max_tokens=max_tokens)
    _synchronize(device)
    start = time.perf_counter()
    hyps = system.translate(sentences, max_sentences=batch_size, max_tokens=max_tokens)
    _synchronize(device)
    return hyps, time.perf_counter() - start


# ----------------------------------------------------------------------------------------------
# Length-penalty tuning


def tune_length_penalty(
    system: System,
    sources: Sequence[str],
    references: Sequence[Sequence[str]],
    target_lang: str,
    grid: Sequence[float],
    batch_size: int,
    max_tokens: int | None,
) -> tuple[float, list[dict[str, float]]]:
    """Pick joint-Viterbi's β_v (``length_penalty``) by tokenized BLEU on a held-out split.

    Args:
        system: a DAT joint-Viterbi (or Viterbi) system; its options are not changed.
        sources, references: the valid split (raw text; reference streams).
        target_lang: for the Moses tokenizer.
        grid: candidate values.
        batch_size, max_tokens: batching.

    Returns:
        ``(best value, [{"length_penalty": v, "tok_bleu": x}, …])``; among equal scores the
        value closest to 1 (the decoders' default) wins, then the earlier one.
    """
    tokenized_refs = [moses_tokenize(stream, target_lang) for stream in references]
    table = []
    best, best_score = grid[0], -math.inf
    for value in grid:
        trial = System(
            system.name,
            system.label,
            system.model,
            system.sp,
            system.strategy,
            {**system.options, "length_penalty": float(value)},
        )
        hyps = trial.translate(sources, max_sentences=batch_size, max_tokens=max_tokens)
        score = (
            tokenized_bleu_metric()
            .corpus_score(moses_tokenize(hyps, target_lang), tokenized_refs)
            .score
        )
        table.append({"length_penalty": float(value), "tok_bleu": score})
        if score > best_score or (score == best_score and abs(value - 1) < abs(best - 1)):
            best, best_score = float(value), score
    return best, table


# ----------------------------------------------------------------------------------------------
# The evaluation


def environment(device: torch.device, onnxruntime_threads: int | None = None) -> dict[str, Any]:
    """CPU, threads and versions, for report.json; with ``onnxruntime_threads`` (some model ran
    on the onnxruntime engine) also ONNX Runtime's version and its intra-op threads (as given:
    0 = ONNX Runtime's default, all cores)."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import sacremoses

    import fadat

    env = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": str(device),
        "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "sacrebleu": sacrebleu.__version__,
        "sacremoses": getattr(sacremoses, "__version__", "unknown"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "fadat": fadat.__version__,
    }
    if onnxruntime_threads is not None:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        env["onnxruntime_intra_threads"] = onnxruntime_threads
    return env


def build_systems(
    models: Sequence[tuple[str, Any, Any]],
    strategies: Sequence[str],
    options_for: Callable[[Any, str], dict[str, Any]],
    at_beam_size: int,
    at_length_penalty: float,
    at_options: dict[str, Any] | None = None,
    upsample_ratio: float | None = None,
) -> list[System]:
    """Systems in report order, per model in the given order.

    An autoregressive model (the paper's AT baseline) runs each of its strategies (greedy and
    beam search) with ``length_penalty``, ``beam_size`` (beam only) and ``at_options``
    (``max_len_a/b``). A non-autoregressive model runs each of ``strategies`` that it supports,
    with the options ``options_for(model, strategy)`` that the strategy takes. The systems of
    the models whose decoder length is ``λ·|x|`` (``upsampled``: DAT, CTC) decode at
    λ = ``upsample_ratio`` (``None``: each model's own); the others (AT, NAT) take no λ, as
    ``--shortlist`` goes only to the models that take it.

    A model that runs fewer strategies or options than its architecture offers (the onnxruntime
    engine: no sampling, lookahead without n-gram bans, the beam search on exports of format
    version 2 only) refuses the rest rather than leave them out (:func:`_refuse_missing`).

    Raises:
        InputError: a strategy that no non-autoregressive model supports, a model that supports
            none of them, invalid options.
        DecodingOptionError: ``upsample_ratio`` given but no model takes one
            (:func:`fadat.translation.pipeline.check_upsample_ratio`); a strategy or an option
            that a model's engine does not run (:func:`_refuse_missing`).
    """
    if upsample_ratio is not None and not any(m.upsampled for _, m, _ in models):
        check_upsample_ratio(upsample_ratio, models[0][1])
    systems = []
    for label, model, sp in models:
        ratio = upsample_ratio if model.upsampled else None
        accepted = model.strategies()
        if model.autoregressive:
            for strategy, names in accepted.items():
                settings = {"length_penalty": at_length_penalty, "beam_size": at_beam_size}
                options = {
                    k: v for k, v in {**settings, **(at_options or {})}.items() if k in names
                }
                name = f"{label}:{strategy}"
                if "beam_size" in options:
                    name += str(at_beam_size)
                check_strategy(model, strategy, options, cli=True)
                systems.append(System(name, label, model, sp, strategy, options, ratio))
            continue
        _refuse_missing(label, model, strategies)
        chosen = [s for s in strategies if s in accepted]
        if not chosen:
            raise InputError(
                f"unknown {model.model_type.upper()} strategy {strategies[0]!r}; choose from "
                f"{', '.join(accepted)}"
            )
        for strategy in chosen:
            given = options_for(model, strategy)
            options = {k: v for k, v in given.items() if k in accepted[strategy]}
            _refuse_missing(label, model, [strategy], given)
            check_strategy(model, strategy, options, cli=True)
            name = f"{label}:{strategy}"
            systems.append(System(name, label, model, sp, strategy, options, ratio))
    run = {s.strategy for s in systems if not s.model.autoregressive}
    missing = [s for s in strategies if s not in run]
    if missing and any(not model.autoregressive for _, model, _ in models):
        known = dict.fromkeys(
            name for _, m, _ in models if not m.autoregressive for name in m.strategies()
        )
        raise InputError(f"unknown strategy {missing[0]!r}; choose from {', '.join(known)}")
    return systems


def _refuse_missing(
    label: str, model: Any, strategies: Sequence[str], options: dict[str, Any] | None = None
) -> None:
    """Refuse what the architecture's strategies offer but ``model`` does not run, where
    leaving it out would change the result: a strategy of its decoder kind's registry
    (:func:`fadat.decoding.strategies.offered`) it lacks, or (with ``options``, the keywords given
    to the one strategy in ``strategies``) an option of that strategy's record it does not take,
    unless the record reads the token head only through each vertex's best token with these
    options (lookahead's ``top_cand_n`` and ``top_p`` without n-gram bans: read by no decoder).
    A torch model runs all of its registry's strategies and options; the onnxruntime engine
    (:class:`fadat.translation.engines.OnnxRuntimeModel`) does not.

    Raises:
        DecodingOptionError: naming the model's label, the strategy or the options, and the
            engine (:meth:`~fadat.translation.engines.OnnxRuntimeModel.check_options`'s reason:
            e.g. a format-version-1 export's beam search).
    """
    accepted = model.strategies()
    registry = offered(model.decoder_kind)
    engine = model_engine(model)[0]
    for strategy in strategies:
        record = registry.get(strategy)
        if record is None:
            continue
        if strategy not in accepted:
            reason = f"strategy {strategy!r} is not available on the {engine} engine"
            try:
                model.check_options(strategy, {})
            except ValueError as err:
                reason = str(err)
            raise DecodingOptionError(f"{label}: {reason}")
        given = {k: v for k, v in (options or {}).items() if k in record.option_names}
        missing = [k for k in given if k not in accepted[strategy]]
        if missing and not record.reads_top1_only(given):
            flags = ", ".join("--" + k.replace("_", "-") for k in missing)
            raise DecodingOptionError(
                f"{label}: strategy {strategy!r} on the {engine} engine does not take {flags} "
                f"(the torch engine does)"
            )


def comparison_groups(systems: Sequence[System], baseline: str) -> list[list[str]]:
    """Groups for paired bootstrap: ``[baseline, everyone else]`` and, with several models of
    one architecture, ``[its first model's strategy s, its other models' strategy s]`` for each
    strategy (the paper's FA-DAT vs DA-Transformer comparison)."""
    groups = [[baseline] + [s.name for s in systems if s.name != baseline]]
    for kind in dict.fromkeys(s.model_type for s in systems):
        same = [s for s in systems if s.model_type == kind]
        labels = list(dict.fromkeys(s.label for s in same))
        if len(labels) < 2:
            continue
        for strategy in dict.fromkeys(s.strategy for s in same):
            names = [
                s.name
                for label in labels
                for s in same
                if s.label == label and s.strategy == strategy
            ]
            if len(names) > 1 and names[0] != baseline:
                groups.append(names)
    return groups


def evaluate(
    models: str | Path | Sequence[str | Path],
    *,
    data: str | Path,
    split: str = "test",
    strategies: str | Sequence[str] = DEFAULT_STRATEGIES,
    subset: int = 0,
    at_beam_size: int = 5,
    at_length_penalty: float = 1.0,
    tune_length_penalty: bool = False,
    length_penalty_grid: Sequence[float] = DEFAULT_GRID,
    tune_split: str = "valid",
    tune_subset: int = 0,
    batch_size: int = 64,
    max_tokens: int = 0,
    latency: bool = True,
    latency_subset: int = 0,
    warmup: int = 20,
    threads: int | None = None,
    device: str = "cpu",
    engine: str = DEFAULT_ENGINE,
    precision: str | None = None,
    upsample_ratio: float | None = None,
    shortlist: bool | str | Path | None = None,
    prune_threshold: float | None = None,
    baseline: str | None = None,
    bootstrap: int = 1000,
    save_hypotheses: str | Path | None = None,
    options: Mapping[str, Any] | None = None,
    lm: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate model directories side by side on one split of a prepared dataset (the
    protocol of the module docstring) and return the report that ``fadat evaluate`` writes to
    ``report.json`` and prints as a table (:func:`fadat.cli.evaluate.format_report`). Every
    keyword's default is the flag's of ``fadat evaluate``; progress goes to stderr.

    Example::

        from fadat.evaluation.evaluate import evaluate

        report = evaluate(
            ["runs/at/model", "models/fadat"], data="data/bible-en-es",
            strategies=["lookahead", "joint-viterbi"], latency=False, bootstrap=0,
        )
        {s["name"]: s["bleu"] for s in report["systems"]}

    Args:
        models: model directories (DAT and/or AT) and exports of ``fadat export --format
            onnx``, one path or several; labelled by
            :func:`fadat.models.directory.model_labels`.
        data: a dataset directory written by ``fadat prepare`` (its ``meta.json`` and
            ``raw/<split>.*``).
        split: the split to evaluate.
        strategies: the non-autoregressive models' strategies, a sequence of names or one
            comma-separated string; AT models always run greedy and beam search.
        subset: only the first N sentences (0 = all).
        at_beam_size: the AT beam size (the paper's baseline: 5).
        at_length_penalty: the AT beam search's length penalty α.
        tune_length_penalty: choose (joint-)Viterbi's β_v per DAT model by tokenized BLEU on
            ``tune_split`` over ``length_penalty_grid`` (:func:`tune_length_penalty`).
        length_penalty_grid: the candidate β_v values.
        tune_split: the split for tuning.
        tune_subset: the first N tuning sentences (0 = ``subset``).
        batch_size: sentences per batch of the timed, scored pass (throughput).
        max_tokens: a batch budget as well (0 = none; the model's ``batch_cost`` units).
        latency: measure the batch-1 latency (:func:`measure_latency`).
        latency_subset: measure latency on the first N sentences only (0 = all).
        warmup: untimed warm-up sentences before the latency is measured.
        threads: torch's intra-op threads, set for the whole process (``torch.set_num_threads``;
            0 = leave torch's setting; ``None`` = the command line's default, 2 or the usable
            cores if fewer), and the intra-op threads of each onnxruntime session (0 = ONNX
            Runtime's default, all cores). More than the usable cores is done, with a
            :class:`~fadat.errors.ThreadsAboveCoresWarning`.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (the torch engine's; the onnxruntime engine
            runs on the CPU only).
        engine: one of :data:`fadat.engine.ENGINES`, for every model
            (:func:`fadat.engine.resolve_engine`): ``auto`` (the default) runs an export on
            ``onnxruntime`` and a model directory on ``torch``; ``torch`` refuses an export;
            ``onnxruntime`` runs exports and DAT model directories (exported to a temporary
            directory for the run, as ``fadat translate`` does) and refuses AT directories.
        precision: ``torch``: ``fp32`` (``None``), ``bf16`` or ``int8`` DAT weights on the CPU
            (:func:`fadat.translation.pipeline.apply_precision`; an AT model runs fp32 only);
            ``onnxruntime``: ``fp32`` or ``int8``, checked against each export's (``None``: the
            export's), the precision of a model directory's export (``None``: fp32).
        upsample_ratio: the decoding λ of the models that take one (DAT, CTC); ``None`` = each
            model's own.
        shortlist: DAT models: a vocabulary shortlist (``True`` or ``"model"``: each model
            directory's ``shortlist.safetensors``; or a shortlist file). On the onnxruntime
            engine an export runs the shortlist it was exported with (``fadat export --format
            onnx --shortlist``), with or without this, which then checks that it has that one;
            a model directory is exported with it.
        prune_threshold: DAT models on the torch engine only: compute the token head only on
            vertices with passing probability ≥ τ.
        baseline: the system (``"<label>:<strategy>"``) that speed-ups and significance are
            relative to; default the AT beam system, else the first system.
        bootstrap: paired bootstrap resamples (0 = no significance tests).
        save_hypotheses: a directory to write each system's hypotheses to
            (``<label>.<strategy>.txt``, one line per sentence); ``None`` = none.
        options: decoding options by their command-line names (``{"beta": 1.0}``: the keys of
            :data:`fadat.options.DECODING_OPTIONS`), given to every non-autoregressive strategy
            that takes them (``length_penalty`` is the DAG beam search's α); ``max_len_a`` and
            ``max_len_b`` go to the AT models too. An option that none of the systems takes is
            refused.
        lm: a KenLM language model file for the DAT beam search (``--lm``, strategy ``beam``
            in ``strategies``), opened once; ``options["gamma"]`` is its weight
            (:mod:`fadat.translation.language_model`).

    Returns:
        The report: ``environment`` (CPU, threads, versions: :func:`environment`), ``settings``
        (these arguments), ``data`` (directory, split, sentences, reference streams,
        languages), ``models`` (label, directory, type, ``engine``, ``precision``, config: an
        export's source model's), ``baseline``, ``tuning`` (per tuned system: split, best
        value, grid of tokenized BLEU), ``systems`` (per system, in order: name, model, type,
        ``engine`` (``torch`` or ``onnxruntime``), ``precision`` (``fp32``, ``bf16``, ``int8``),
        strategy, options, ``bleu``/``chrf``/``tok_bleu`` with their
        signatures, ``length_buckets``, ``throughput`` in sentences/s, ``latency_ms_median``
        and ``latency_ms_mean``, ``speedup_latency``/``speedup_throughput`` relative to the
        baseline, ``p_value_bleu``/``p_value_tok_bleu`` per compared baseline,
        ``identical_to``, and ``validset`` for a synthetic corpus) and ``significance``.

    Raises:
        InputError: bad model or data directories, strategies, options or settings (named by
            their ``fadat evaluate`` flags), an option that none of the systems takes, a
            ``save_hypotheses`` directory that cannot be written (checked before any work); an
            ``lm`` without a beam system to use it, or one that cannot be used
            (:func:`fadat.translation.language_model.language_model_options`); an unknown
            ``engine`` or ``precision``; for a model on the onnxruntime engine (naming it): an
            AT directory, a device other than the CPU, ``shortlist`` or ``prune_threshold``, a
            strategy or an option the engine does not run (sampling, lookahead's n-gram bans;
            the beam search on a format-version-1 export), another precision than its
            export's, onnxruntime not installed; on the torch engine: an export, ``precision``
            other than fp32 for an AT model; ``shortlist`` or ``prune_threshold`` with no DAT
            model on the torch engine among ``models`` to take it.
    """
    directories = [models] if isinstance(models, str | Path) else list(models)
    if not directories:
        raise InputError("give at least one model directory")
    # Before any work: the hypotheses can be written (fadat.outputs).
    if save_hypotheses:
        inputs = [("--data", data), *(("--model", m) for m in directories)]
        outputs.check_not_input(save_hypotheses, inputs, "--save-hypotheses")
        outputs.check_output_dir(save_hypotheses, "hypotheses", "--save-hypotheses")
    if not _whole(batch_size) or batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    if not _whole(at_beam_size) or at_beam_size < 1:
        raise InputError(f"--at-beam-size must be >= 1, got {at_beam_size}")
    counts = {
        "--subset": subset,
        "--tune-subset": tune_subset,
        "--max-tokens": max_tokens,
        "--latency-subset": latency_subset,
        "--warmup": warmup,
        "--bootstrap": bootstrap,
    }
    for flag, value in counts.items():
        if not _whole(value) or value < 0:
            raise InputError(f"{flag} must be >= 0, got {value}")
    grid = [float(v) for v in length_penalty_grid if _finite(v)]
    if not grid or len(grid) != len(length_penalty_grid):
        raise InputError(f"--length-penalty-grid must be finite numbers, got {length_penalty_grid}")
    names = strategies.split(",") if isinstance(strategies, str) else list(strategies)
    if not all(isinstance(name, str) for name in names):
        raise InputError(f"--strategies must be strategy names, got {strategies!r}")
    chosen = [s.strip() for s in names if s.strip()]
    flags = decoding_keywords(options)
    check_option_values(flags)
    if lm is not None and not isinstance(lm, str | Path):
        raise InputError(f"--lm must be a path, got {type(lm).__name__}")
    if threads is None:
        threads = min(2, usable_cores())
    if not _whole(threads):
        raise InputError(f"--threads must be an integer, got {threads!r}")
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if precision is not None and precision not in PRECISIONS:
        raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    apply_threads(threads, force=True)  # more than the cores: a ThreadsAboveCoresWarning
    resolved = resolve_device(device)
    source_lang, target_lang = read_languages(data)
    sources, references = load_split(data, split, subset)
    valid_sets = validset_metrics.load_valid_sets(data, split, subset)
    loaded, systems, baseline = _load_systems(
        directories,
        resolved,
        sources,
        engine=engine,
        precision=precision,
        threads=threads,
        strategies=chosen,
        options=flags,
        at_beam_size=at_beam_size,
        at_length_penalty=at_length_penalty,
        upsample_ratio=upsample_ratio,
        shortlist=shortlist,
        prune_threshold=prune_threshold,
        baseline=baseline,
        lm=lm,
    )
    log(f"{len(sources)} sentences of {data} ({split}), {len(references)} reference(s)")
    tuning = {}
    if tune_length_penalty:
        tuning = _tune(
            systems,
            target_lang,
            load_split(data, tune_split, tune_subset or subset),
            split=tune_split,
            grid=grid,
            batch_size=batch_size,
            max_tokens=max_tokens,
        )
    results, hypotheses, tokenized = _translate_and_score(
        systems, sources, references, target_lang, batch_size, max_tokens
    )
    if valid_sets is not None:
        for name, hyps in hypotheses.items():
            results[name]["validset"] = validset_metrics.validset_scores(
                hyps, *valid_sets, references[0]
            )
    if latency:
        _latency(systems, sources, results, latency_subset, warmup)
    base = results[baseline]
    for r in results.values():
        if "latency_ms_median" in r and base.get("latency_ms_median"):
            r["speedup_latency"] = base["latency_ms_median"] / r["latency_ms_median"]
        r["speedup_throughput"] = r["throughput"] / base["throughput"]
    significance = []
    if bootstrap and len(systems) > 1:
        significance = _significance(
            systems, baseline, hypotheses, tokenized, references, target_lang, results, bootstrap
        )
    if save_hypotheses:
        out_dir = outputs.mark_dir(save_hypotheses, "hypotheses")
        for name, hyps in hypotheses.items():
            path = out_dir / (name.replace("/", "_").replace(":", ".") + ".txt")
            outputs.atomic_write(path, "".join(h + "\n" for h in hyps))
    settings = {
        "models": [str(d) for d in directories],
        "data": str(data),
        "split": split,
        "strategies": chosen,
        "subset": subset,
        "at_beam_size": at_beam_size,
        "at_length_penalty": at_length_penalty,
        "tune_length_penalty": tune_length_penalty,
        "length_penalty_grid": grid,
        "tune_split": tune_split,
        "tune_subset": tune_subset,
        "batch_size": batch_size,
        "max_tokens": max_tokens,
        "latency": latency,
        "latency_subset": latency_subset,
        "warmup": warmup,
        "threads": threads,
        "device": str(device),
        "engine": engine,
        "precision": precision,
        "upsample_ratio": upsample_ratio,
        "shortlist": str(shortlist) if isinstance(shortlist, Path) else shortlist,
        "prune_threshold": prune_threshold,
        "baseline": baseline,
        "bootstrap": bootstrap,
        "save_hypotheses": None if save_hypotheses is None else str(save_hypotheses),
        "options": flags,
        "lm": None if lm is None else str(lm),
    }
    on_onnxruntime = any(model_engine(model)[0] == "onnxruntime" for _, model, _ in loaded)
    return {
        "environment": environment(resolved, threads if on_onnxruntime else None),
        "settings": settings,
        "data": {
            "dir": str(data),
            "split": split,
            "sentences": len(sources),
            "references": len(references),
            "source_lang": source_lang,
            "target_lang": target_lang,
        },
        "models": [
            _model_record(label, model, directory)
            for (label, model, _), directory in zip(loaded, directories, strict=True)
        ],
        "baseline": baseline,
        "tuning": tuning,
        "systems": [
            {
                "name": s.name,
                "model": s.label,
                "model_type": s.model_type,
                "engine": s.engine,
                "precision": s.precision,
                "strategy": s.strategy,
                "options": _shown_options(s.options, lm),
                **results[s.name],
            }
            for s in systems
        ],
        "significance": significance,
    }


def _model_record(label: str, model: Any, directory: str | Path) -> dict[str, Any]:
    """A model as report.json records it: label, the directory given, type, engine, precision,
    whether its token head runs over a vocabulary shortlist (an export's own, or the torch
    engine's ``--shortlist``) and config (an export's: the config of the model it was exported
    from)."""
    engine, precision = model_engine(model)
    if engine == "onnxruntime":
        config = model.engine.metadata.get("model_config")
        shortlisted = model.engine.shortlist is not None
    else:
        config = model.config.to_dict()
        shortlisted = getattr(model, "inference_shortlist", None) is not None
    return {
        "label": label,
        "dir": str(directory),
        "model_type": model.config.model_type,
        "engine": engine,
        "precision": precision,
        "shortlist": shortlisted,
        "config": config,
    }


def _shown_options(options: dict[str, Any], lm: str | Path | None) -> dict[str, Any]:
    """A system's options as report.json shows them: the language model as its file, without
    the LM word of every token id."""
    shown = {k: v for k, v in options.items() if k != "lm_words"}
    if "lm" in shown:
        shown["lm"] = str(lm)
    return shown


def _whole(value: Any) -> bool:
    """An integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _load_systems(
    directories: Sequence[str | Path],
    device: torch.device,
    sources: Sequence[str],
    *,
    engine: str = DEFAULT_ENGINE,
    precision: str | None = None,
    threads: int = 1,
    strategies: Sequence[str],
    options: dict[str, Any],
    at_beam_size: int,
    at_length_penalty: float,
    upsample_ratio: float | None,
    shortlist: bool | str | Path | None,
    prune_threshold: float | None,
    baseline: str | None,
    lm: str | Path | None = None,
) -> tuple[list[tuple[str, Any, Any]], list[System], str]:
    """The models ``(label, model, sp)`` (each on its engine: :func:`load_engine_model`), the
    systems and the baseline system's name; logs the sources each model truncates.
    ``options``: the decoding options by command-line name; ``lm``: a language model file for
    the beam systems, opened once."""
    models = []
    for label, directory in zip(model_labels(directories), directories, strict=True):
        model, sp = load_engine_model(
            directory,
            engine,
            device,
            precision,
            threads=threads,
            shortlist=shortlist,
            prune_threshold=prune_threshold,
        )
        models.append((label, model, sp))

    # A DAT-only option that no model takes is refused, not ignored: --shortlist runs on a torch
    # DAT or an export made with one (load_engine_model checked it), pruning on a torch DAT.
    def takes(model: Any, flag: str) -> bool:
        on_engine = flag == "--shortlist" and model_engine(model)[0] == "onnxruntime"
        return getattr(model, "reduced_head", False) or on_engine

    given = [flag for flag, value in (("--shortlist", shortlist), ("--prune-threshold",
             prune_threshold)) if value not in (None, False)]  # fmt: skip
    idle = [flag for flag in given if not any(takes(m, flag) for _, m, _ in models)]
    if idle:
        raise InputError(
            f"{' and '.join(idle)}: for DAT models, and none of the models takes it "
            f"({', '.join(label for label, _, _ in models)})"
        )
    if not strategies and any(not m.autoregressive for _, m, _ in models):
        raise InputError("--strategies is empty")
    with_lm = _language_models(models, strategies, lm)
    systems = build_systems(
        models,
        strategies,
        lambda model, strategy: {
            **decoding_keywords(options, model.flag_aliases.get(strategy, {})),
            **with_lm.get(id(model), {}),
        },
        at_beam_size,
        at_length_penalty,
        # --max-len-a/--max-len-b apply to the AT decoders too.
        {k: options[k] for k in AT_OPTIONS if k in options},
        upsample_ratio,
    )
    for name in options:
        if not any(_takes(system, name) for system in systems):
            raise InputError(
                f"--{name.replace('_', '-')}: none of the systems takes it "
                f"({', '.join(s.name for s in systems)}); choose --strategies that do"
            )
    names = [s.name for s in systems]
    baseline = baseline or next(
        (s.name for s in systems if s.model.autoregressive and s.strategy == "beam"), names[0]
    )
    if baseline not in names:
        raise InputError(f"--baseline {baseline!r} is not one of {', '.join(names)}")
    for label, model, sp in models:
        truncated: list[str] = []
        encode_sources(sp, sources, model.config.max_source_positions, truncated.append)
        if truncated:
            log(
                f"warning: {label}: {len(truncated)} source sentence(s) truncated to the model's "
                f"maximum of {model.config.max_source_positions} tokens"
            )
    return models, systems, baseline


def load_engine_model(
    directory: str | Path,
    engine: str,
    device: torch.device,
    precision: str | None = None,
    *,
    threads: int = 1,
    shortlist: bool | str | Path | None = None,
    prune_threshold: float | None = None,
) -> tuple[Any, Any]:
    """One model of ``fadat evaluate`` on its engine
    (:func:`fadat.translation.engines.load_translation_model`), with its precision, its
    shortlist (on the onnxruntime engine: the export's, which ``shortlist`` checks, or the one a
    model directory is exported with) and, on the torch engine, pruning; messages name the flags
    and the directory.

    Args:
        directory: a model directory or an export of ``fadat export --format onnx``.
        engine: one of :data:`fadat.engine.ENGINES` (``auto``: the directory's own).
        device: the torch engine's device.
        precision: as :func:`evaluate`'s ``precision``.
        threads: the onnxruntime engine's intra-op threads (0 = all cores).
        shortlist, prune_threshold: as :func:`evaluate`'s (DAT models; an AT model ignores
            them, as before; pruning on the torch engine only).

    Returns:
        ``(model, sentencepiece processor)``: a torch model, or an
        :class:`~fadat.translation.engines.OnnxRuntimeModel`.

    Raises:
        InputError: on the onnxruntime engine: an AT (or other non-DAT) model directory, a
            device other than the CPU, pruning, a shortlist the export was not made with
            (:func:`~fadat.translation.pipeline.apply_reduced_head`), onnxruntime not
            installed, an export of another precision; on the torch engine: an export, a
            precision other
            than fp32 for a model without it (AT); as
            :func:`~fadat.translation.engines.load_translation_model`.
    """
    from fadat.engine.runtime import is_engine_dir

    which = resolve_engine(directory, engine)
    if which == "onnxruntime":
        if not is_engine_dir(directory):
            refuse_non_dat(
                directory,
                "an export of fadat export --format onnx, or a DAT model directory, exported for "
                "the run; --engine auto evaluates it on torch beside the exports",
            )
        if device.type != "cpu":
            raise InputError(
                f"--device {device}: {directory} runs on the onnxruntime engine, which runs on "
                "the CPU only"
            )
        if prune_threshold is not None:
            raise InputError(
                f"--prune-threshold is for DAT models on the torch engine; {directory} runs on "
                "the onnxruntime engine"
            )
        model, sp = load_translation_model(
            directory, which, "cpu", precision, intra_threads=threads, cli=True, shortlist=shortlist
        )
        return apply_reduced_head(model, directory, shortlist, cli=True), sp
    model, sp = load_translation_model(directory, which, device, cli=True)
    if precision not in (None, "fp32") and precision not in model.precisions:
        raise InputError(
            f"--precision {precision}: {directory} holds an {model.model_type.upper()} model, "
            f"which runs in {', '.join(model.precisions)} only"
        )
    model = apply_precision(model, precision or "fp32", cli=True)
    if model.reduced_head:  # only such models take --shortlist / --prune-threshold
        model = apply_reduced_head(model, directory, shortlist, prune_threshold, cli=True)
    return model, sp


def _language_models(
    models: Sequence[tuple[str, Any, Any]], strategies: Sequence[str], lm: str | Path | None
) -> dict[int, dict[str, Any]]:
    """The beam search's language model keywords (``lm``, ``lm_words``) per model that decodes
    with a strategy that takes them, keyed by ``id(model)``; the file is opened once.

    Raises:
        DecodingOptionError: ``lm`` given but no model decodes with such a strategy.
        InputError: as :func:`fadat.translation.language_model.language_model_options`.
    """
    if lm is None:
        return {}
    takers = [
        (model, sp)
        for _, model, sp in models
        if not model.autoregressive
        and any("lm" in model.strategies().get(s, ()) for s in strategies)
    ]
    if not takers:
        model = next((m for _, m, _ in models if not m.autoregressive), models[0][1])
        check_takes_language_model(model, strategies, cli=True, strategy_flag="--strategies")
    opened = open_language_model(lm, cli=True)
    return {
        id(model): language_model_options(opened, model, sp, path=lm, cli=True)
        for model, sp in takers
    }


def _takes(system: System, name: str) -> bool:
    """Whether ``system`` decodes with the decoding option ``name`` (a command-line name)."""
    if system.model.autoregressive:
        return name in AT_OPTIONS and name in system.options
    keyword = system.model.flag_aliases.get(system.strategy, {}).get(name, name)
    return keyword in system.options


def _tune(
    systems: list[System],
    target_lang: str,
    tuning_split: tuple[list[str], list[list[str]]],
    *,
    split: str,
    grid: Sequence[float],
    batch_size: int,
    max_tokens: int,
) -> dict[str, Any]:
    """``--tune-length-penalty``: set each (joint-)Viterbi system's β_v from the tuning split
    ``(sources, reference streams)`` named ``split``; returns the tuning record per system."""
    valid_sources, valid_refs = tuning_split
    tuning = {}
    for system in systems:
        if system.strategy in ("joint-viterbi", "viterbi"):
            log(f"tuning length penalty of {system.name} on {split}")
            best, table = tune_length_penalty(
                system,
                valid_sources,
                valid_refs,
                target_lang,
                grid,
                batch_size,
                max_tokens,
            )
            system.options["length_penalty"] = best
            tuning[system.name] = {"split": split, "best": best, "grid": table}
    return tuning


def _translate_and_score(
    systems: list[System],
    sources: Sequence[str],
    references: Sequence[Sequence[str]],
    target_lang: str,
    batch_size: int,
    max_tokens: int,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], dict[str, list[str]]]:
    """Translate the split with every system (timed: throughput) and score it; returns the
    per-system results, hypotheses and Moses-tokenised hypotheses."""
    tokenized_refs = [moses_tokenize(stream, target_lang) for stream in references]
    results: dict[str, dict[str, Any]] = {}
    hypotheses: dict[str, list[str]] = {}
    tokenized: dict[str, list[str]] = {}
    for system in systems:
        log(f"translating with {system.name} (batches of {batch_size})")
        hyps, seconds = translate_timed(system, sources, batch_size, max_tokens)
        hypotheses[system.name] = hyps
        tok = tokenized[system.name] = moses_tokenize(hyps, target_lang)
        scores = corpus_scores(hyps, references, target_lang, tok, tokenized_refs)
        scores["length_buckets"] = bucket_scores(tok, tokenized_refs, references[0])
        scores["throughput"] = len(sources) / seconds if seconds > 0 else math.inf
        scores["throughput_seconds"] = seconds
        results[system.name] = scores
    return results, hypotheses, tokenized


def _latency(
    systems: list[System],
    sources: Sequence[str],
    results: dict[str, dict[str, Any]],
    latency_subset: int,
    warmup: int,
) -> None:
    """Batch-1 latency of every system (on the first ``latency_subset`` sentences, 0 = all),
    into ``results``."""
    latency_sentences = sources[:latency_subset] if latency_subset else sources
    log(
        f"latency: {len(latency_sentences)} sentences × {len(systems)} systems at batch "
        f"size 1 after {warmup} warm-up sentences"
    )
    times = measure_latency(systems, latency_sentences, warmup)
    for name, values in times.items():
        results[name]["latency_ms_median"] = 1000 * statistics.median(values)
        results[name]["latency_ms_mean"] = 1000 * statistics.fmean(values)
        results[name]["latency_sentences"] = len(values)


def _significance(
    systems: list[System],
    baseline: str,
    hypotheses: dict[str, list[str]],
    tokenized: dict[str, list[str]],
    references: Sequence[Sequence[str]],
    target_lang: str,
    results: dict[str, dict[str, Any]],
    samples: int,
) -> list[dict[str, Any]]:
    """Paired bootstrap (``samples`` resamples) of each comparison group (sacreBLEU and
    tokenized BLEU); p-values and identical outputs go into ``results``."""
    tokenized_refs = [moses_tokenize(stream, target_lang) for stream in references]
    significance = []
    for group in comparison_groups(systems, baseline):
        log(f"paired bootstrap ({samples} resamples) against {group[0]}")
        sacre = paired_bootstrap(
            [(n, hypotheses[n]) for n in group],
            references,
            bleu_metric(target_lang),
            samples,
        )
        tok = paired_bootstrap(
            [(n, tokenized[n]) for n in group],
            tokenized_refs,
            tokenized_bleu_metric(),
            samples,
        )
        significance.append({"baseline": group[0], "bleu": sacre, "tok_bleu": tok})
        for n in group[1:]:
            results[n].setdefault("p_value_bleu", {})[group[0]] = sacre[n]["p_value"]
            results[n].setdefault("p_value_tok_bleu", {})[group[0]] = tok[n]["p_value"]
            # sacreBLEU gives identical outputs p = 1/(samples+1) ("a zero difference is not
            # chance"); flag them so the table does not read as a significant difference.
            if hypotheses[n] == hypotheses[group[0]]:
                results[n].setdefault("identical_to", []).append(group[0])
    return significance


def log(message: str) -> None:
    """One progress line on stderr, ``fadat evaluate: <message>``."""
    print(f"fadat evaluate: {message}", file=sys.stderr, flush=True)
