"""Sequence-level knowledge distillation (``fadat distill``, :mod:`fadat.cli.distill`; from Python
:func:`distill`) (Kim & Rush 2016; the FA-DAT paper's
appendix trains on distilled data).

Re-translates the training sources of a prepared dataset with an AT model's beam search and
writes a new dataset directory whose training targets are the AT's outputs (with ``max_pairs``,
``--max-pairs``: only the first pairs of the training split, which is then all the new training
split holds; for smoke tests such as ``scripts/main-job.sh --quick``). The valid and test
splits, their raw text, the sentencepiece model and the vocabulary are copied unchanged, so
scores stay comparable; ``meta.json`` records the provenance under ``"distilled"`` (teacher,
decoding options, engine, source dataset and its fingerprint, time taken). Works on token ids:
no detokenise/retokenise round trip.

Resumable: sentences are translated longest first in fixed batches of ``batch_size``, and each
finished batch is appended as one JSON line to ``OUTPUT/distill.partial.jsonl`` (flushed and
fsynced). A re-run with the same settings skips the batches found there; a last line torn by a
kill is dropped and its batch translated again, so an interrupted and resumed run writes the
same files as an uninterrupted one. ``OUTPUT/meta.json`` is written last: its presence marks a
complete dataset.

Engines: ``fadat`` runs :meth:`fadat.models.at.ATModel.beam_search`; ``ctranslate2`` exports the
teacher (:mod:`fadat.translation.export`) and runs CTranslate2 with fadat's decoding rules, which
gives the same tokens except where a beam reaches the length limit (see
:mod:`fadat.translation.export`).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fadat.data.binarized import DISTILL_PARTIAL, BinarizedDataset, read_meta, write_split
from fadat.data.build import sha256_file
from fadat.data.contract import BOS_ID, EOS_ID, pad_sequences
from fadat.errors import InputError, ThreadsAboveCoresWarning
from fadat.evaluation.distillation import DistillationStatistics, target_statistics
from fadat.evaluation.scoring import read_languages
from fadat.models.architectures import naming_inputs
from fadat.models.directory import (
    load_pretrained,
    read_model_metadata,
    spm_model_path,
)
from fadat.options import check_threads
from fadat.outputs import (
    atomic_path,
    atomic_write,
    check_not_input,
    check_output_dir,
    mark_dir,
    output_lock,
)

PARTIAL = DISTILL_PARTIAL
ENGINES = ("auto", "fadat", "ctranslate2")


def _check_teacher(model_dir: Path, data_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The teacher's config.json after checking it is an AT with the data's vocabulary.

    Raises:
        InputError: not an AT, different vocabulary size, or a different sentencepiece model.
    """
    model_meta = read_model_metadata(model_dir)
    if model_meta["model_type"] != "at":
        raise InputError(
            f"{model_dir}: holds a {model_meta['model_type']!r} model; distillation needs an AT"
        )
    vocab = model_meta["config"]["vocab_size"]
    if vocab != meta["vocab_size"]:
        raise InputError(
            f"{model_dir}: vocabulary size {vocab} differs from {data_dir / 'meta.json'}'s "
            f"{meta['vocab_size']} (the teacher was trained on other data)"
        )
    model_spm, data_spm = spm_model_path(model_dir), data_dir / "spm.model"
    if (
        model_spm is not None
        and data_spm.is_file()
        and sha256_file(model_spm) != sha256_file(data_spm)
    ):
        raise InputError(
            f"{model_spm}: differs from {data_spm} (same size, different vocabulary: the teacher "
            "was trained on other data)"
        )
    return model_meta


def _read_partial(path: Path, settings: dict[str, Any]) -> dict[int, list[list[int]]]:
    """Finished batches ``{batch index: targets}`` of a partial file; drops a torn last line
    (rewriting the file without it).

    Raises:
        InputError: the file was written with other settings, or a line other than the last
            is not a batch record.
    """
    if not path.is_file():
        return {}
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, torn = lines[:-1], lines[-1]  # text after the last newline is a torn write
    done: dict[int, list[list[int]]] = {}
    for number, line in enumerate(complete, start=1):
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"{path}:{number}: not a JSON record ({err})") from err
        if number == 1:
            if record.get("settings") != settings:
                raise InputError(
                    f"{path}:1: written with other settings "
                    f"({_differences(record.get('settings'), settings)}); "
                    "use another --output or delete the file"
                )
            continue
        if not isinstance(record, dict) or "batch" not in record or "targets" not in record:
            raise InputError(f"{path}:{number}: not a batch record")
        done[int(record["batch"])] = record["targets"]
    if torn:
        with open(path, "r+b") as fh:
            fh.truncate(len(data) - len(torn))
    return done


def _append(fh, record: dict[str, Any]) -> None:
    fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def _translator(
    engine: str, model_dir: Path, work: Path, beam: int, length_penalty: float, threads: int
) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    """``(sources (x </s>), their 1-based pair numbers) -> outputs (y)`` for the chosen engine
    (the numbers name the pairs whose outputs are not finite:
    :func:`fadat.models.architectures.naming_inputs`)."""
    if engine == "ctranslate2":
        from fadat.translation.export import CTranslate2AT, export_ctranslate2

        export_ctranslate2(model_dir, work / "teacher-ctranslate2", force=True)
        ct2 = CTranslate2AT(work / "teacher-ctranslate2", "float32", intra_threads=threads)
        return lambda sources, lines: ct2.translate_ids(sources, beam, length_penalty)
    model = load_pretrained(model_dir).eval()

    def run(sources: list[list[int]], lines: list[int]) -> list[list[int]]:
        x = pad_sequences(sources)  # (B, S)
        with torch.inference_mode(), naming_inputs(model, lines):
            if beam > 1:
                hyps = model.beam_search(x, beam, length_penalty)
            else:
                hyps = model.greedy(x, length_penalty=length_penalty)
        return [h.tokens for h in hyps]

    return run


def resolve_engine(engine: str) -> str:
    """``auto`` is ``ctranslate2`` when the package is installed, else ``fadat``."""
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "auto":
        return engine
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return "fadat"
    return "ctranslate2"


@dataclass(frozen=True)
class Distillation:
    """What :func:`distill` did.

    Attributes:
        output: the dataset directory.
        complete: ``output`` is a complete dataset (its ``meta.json`` written); false only when
            ``stop_after`` stopped the run first.
        reused: ``output`` already was a complete dataset of the same settings, returned
            unchanged: nothing was translated (``fadat distill`` prints
            ``OUTPUT: already distilled with these settings``).
        statistics: the distilled targets against the references (pairs changed, length
            ratio, BLEU; :class:`fadat.evaluation.distillation.DistillationStatistics`), also
            in ``meta.json`` under ``distilled.statistics``; ``None`` when incomplete, or reused
            from a dataset written before fadat recorded them.
    """

    output: Path
    complete: bool
    reused: bool = False
    statistics: DistillationStatistics | None = None


def distill(
    model_dir: str | Path,
    data_dir: str | Path,
    output: str | Path,
    *,
    beam: int = 5,
    length_penalty: float = 1.0,
    batch_size: int = 64,
    threads: int = 1,
    engine: str = "auto",
    progress: bool = True,
    force: bool = False,
    stop_after: int | None = None,
    max_pairs: int | None = None,
) -> Distillation:
    """Write a dataset whose training targets are the AT teacher's translations
    (``fadat distill``; every keyword's default is the flag's). Prints nothing (but the tqdm bar
    of ``progress``).

    Args:
        model_dir: the teacher, a fadat AT model directory with the data's sentencepiece model.
        data_dir: a prepared dataset (``fadat prepare``); its train split is re-translated.
        output: the dataset directory to write (created; resumed when it holds a partial run).
        beam: beam size K (1 = greedy).
        length_penalty: α of the beam's ``log P / (|y| + 1)^α``.
        batch_size: sentences per batch (batches are fixed by the longest-first order).
        threads: CPU threads (torch's, or CTranslate2's intra-op threads).
        engine: ``fadat``, ``ctranslate2`` or ``auto`` (see :func:`resolve_engine`).
        progress: show a tqdm bar on stderr (sentences, sentences/s).
        force: allow ``threads`` above the cores this process may use.
        stop_after: translate at most this many batches in this call and return without
            writing the dataset (for tests of resumption).
        max_pairs: distil only the first ``max_pairs`` training pairs (1 to the split's size;
            ``None``: all); the output's training split holds only these. Recorded in
            ``meta.json`` (``distilled.settings.max_pairs``) and in the statistics (``pairs``
            distilled of the data's ``source_pairs``).

    Returns:
        :class:`Distillation`: ``output`` as a Path, whether the dataset is complete, and
        whether ``output`` already was a complete dataset of the same settings (returned
        unchanged).

    Warns:
        ThreadsAboveCoresWarning: ``force`` lets more threads than cores through (``fadat``'s
            command line prints it as one ``fadat: warning: ...`` line).

    Raises:
        InputError: the teacher is not an AT or has another vocabulary; missing or corrupt
            data, or a ``meta.json`` without ``source_lang``/``target_lang``; ``output`` holds
            a run with other settings or is a complete dataset of other settings (another
            teacher, data, ``max_pairs``, ...: the message names what differs); bad
            ``beam``/``batch_size``/``threads``/``max_pairs``, or ``threads`` above the cores
            without ``force`` (:func:`fadat.options.check_threads`); another process distills
            into ``output`` (:func:`fadat.outputs.output_lock`).
    """
    warning = check_threads(threads, force)
    if warning:
        warnings.warn(warning, ThreadsAboveCoresWarning, stacklevel=2)
    with output_lock(output, "--output"):
        return _distill(
            Path(model_dir),
            Path(data_dir),
            Path(output),
            beam=beam,
            length_penalty=length_penalty,
            batch_size=batch_size,
            threads=threads,
            engine=engine,
            progress=progress,
            stop_after=stop_after,
            max_pairs=max_pairs,
        )


def _distill(
    model_dir: Path,
    data_dir: Path,
    output: Path,
    *,
    beam: int,
    length_penalty: float,
    batch_size: int,
    threads: int,
    engine: str,
    progress: bool,
    stop_after: int | None,
    max_pairs: int | None,
) -> Distillation:
    """:func:`distill` once its output is locked."""
    if beam < 1 or batch_size < 1 or threads < 1:
        raise InputError("--beam, --batch-size and --threads must be >= 1")
    check_not_input(output, [("--model", model_dir), ("--data", data_dir)])
    engine = resolve_engine(engine)
    meta = read_meta(data_dir)
    # the statistics' BLEU tokenizes by the target language: checked before any translating
    target_lang = read_languages(data_dir)[1]
    teacher = _check_teacher(model_dir, data_dir, meta)
    train = BinarizedDataset(data_dir, "train")
    if max_pairs is not None and not 1 <= max_pairs <= len(train):
        raise InputError(
            f"--max-pairs must be 1 to the {len(train)} training pairs of {data_dir}, "
            f"got {max_pairs}"
        )
    n = len(train) if max_pairs is None else max_pairs
    settings = _settings(model_dir, data_dir, meta, beam, length_penalty, batch_size, engine)
    if max_pairs is not None:
        # only when given, so that datasets distilled before the option existed still match
        settings["max_pairs"] = max_pairs
    out_meta = output / "meta.json"
    check_output_dir(output, "dataset")
    if out_meta.is_file():
        old = read_meta(output).get("distilled", {}).get("settings")
        if old == settings:
            recorded = read_meta(output).get("distilled", {}).get("statistics")
            stats = DistillationStatistics(**recorded) if recorded else None
            return Distillation(output, complete=True, reused=True, statistics=stats)
        raise InputError(
            f"{out_meta}: a complete dataset of other settings ({_differences(old, settings)}); "
            "use another --output, or delete it to distil again"
        )
    mark_dir(output, "dataset")
    partial = output / PARTIAL
    done = _read_partial(partial, settings)
    batches = _plan_batches(train, n, batch_size, done, partial)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    # The converted teacher goes to a temporary folder of its own, not into the dataset
    # (fadat.outputs: nothing but the dataset's files is written inside a dataset directory).
    work = Path(tempfile.mkdtemp(prefix="fadat-distill-"))
    try:
        translate = _translator(engine, model_dir, work, beam, length_penalty, threads)
        ran = _translate_batches(
            translate, train, n, batches, done, partial, settings, progress, stop_after
        )
    finally:
        torch.set_num_threads(threads_before)
        shutil.rmtree(work, ignore_errors=True)
    if ran is None:
        return Distillation(output, complete=False)
    translated, seconds = ran
    target_of: dict[int, list[int]] = {}
    for b, ids in enumerate(batches):
        target_of.update(zip(ids, done[b], strict=True))
    _write_dataset(data_dir, output, meta, train, n, target_of)
    lengths = [len(target_of[i]) for i in range(n)]
    statistics = target_statistics(
        [train[i][1].tolist() for i in range(n)],
        [target_of[i] for i in range(n)],
        data_dir / "spm.model",
        target_lang,
        source_pairs=len(train),
    )
    run = {"settings": settings, "teacher_config": teacher["config"], "threads": threads}
    source_lengths = [int(length) for length in train.source_lengths[:n]]
    distilled_meta = _distilled_meta(meta, source_lengths, lengths, run, translated, seconds)
    distilled_meta["distilled"]["statistics"] = statistics.as_dict()
    _finish(output, distilled_meta)
    return Distillation(output, complete=True, statistics=statistics)


def _settings(
    model_dir: Path,
    data_dir: Path,
    meta: dict[str, Any],
    beam: int,
    length_penalty: float,
    batch_size: int,
    engine: str,
) -> dict[str, Any]:
    """What decides the distilled targets: a partial run resumes, and a complete dataset is
    reused, only when these are equal."""
    return {
        "teacher": str(model_dir.resolve()),
        "teacher_sha256": sha256_file(model_dir / "model.safetensors"),
        "data": str(data_dir.resolve()),
        "data_fingerprint": meta.get("fingerprint"),
        "beam": beam,
        "length_penalty": length_penalty,
        "max_len_a": 1.2,
        "max_len_b": 10,
        "batch_size": batch_size,
        "engine": engine,
    }


def _differences(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """What differs between the settings a dataset or partial run was made with (``old``) and
    this run's (``new``), for the refusal's message: ``"max_pairs: 300 there, all here"``."""
    if not isinstance(old, dict):
        return "no settings recorded there"

    def shown(settings: dict[str, Any], key: str) -> str:
        if key not in settings:
            return "all" if key == "max_pairs" else "none"
        return str(settings[key])

    keys = [k for k in dict.fromkeys([*new, *old]) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {shown(old, k)} there, {shown(new, k)} here" for k in keys)


def _finish(output: Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (the dataset is complete from then on), then delete the
    partial run and a converted teacher that an earlier version left in the dataset."""
    atomic_write(output / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    (output / PARTIAL).unlink()
    shutil.rmtree(output / "teacher-ctranslate2", ignore_errors=True)


def _plan_batches(
    train: BinarizedDataset,
    n: int,
    batch_size: int,
    done: dict[int, list[list[int]]],
    partial: Path,
) -> list[list[int]]:
    """The batches of the indices of the first ``n`` sentences, longest source first (ties by
    index): the slowest batches come first, so the rate shown is not optimistic, and the
    batches are the same in every run.

    Raises:
        InputError: the batches already in ``partial`` (``done``) do not match.
    """
    order = sorted(range(n), key=lambda i: (-int(train.source_lengths[i]), i))
    batches = [order[k : k + batch_size] for k in range(0, n, batch_size)]
    if any(len(done[b]) != len(batches[b]) for b in done if b < len(batches)) or any(
        b >= len(batches) for b in done
    ):
        raise InputError(f"{partial}: batches do not match the dataset; delete the file")
    return batches


def _translate_batches(
    translate: Callable[[list[list[int]], list[int]], list[list[int]]],
    train: BinarizedDataset,
    n: int,
    batches: list[list[int]],
    done: dict[int, list[list[int]]],
    partial: Path,
    settings: dict[str, Any],
    progress: bool,
    stop_after: int | None,
) -> tuple[int, float] | None:
    """Translate the batches (of the first ``n`` sentences) not ``done`` yet, appending each to
    ``partial`` (and to ``done``) as it finishes. Returns ``(sentences translated, seconds)``,
    or None when ``stop_after`` batches were translated first."""
    bar = None
    try:
        todo = [b for b in range(len(batches)) if b not in done]
        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=n,
                initial=sum(len(batches[b]) for b in done),
                unit="sent",
                dynamic_ncols=True,
                desc="distill",
            )
        started = time.perf_counter()
        translated = 0
        with open(partial, "a", encoding="utf-8") as fh:
            if not done and fh.tell() == 0:
                _append(fh, {"settings": settings})
            for count, b in enumerate(todo):
                if stop_after is not None and count >= stop_after:
                    return None
                sources = [train[i][0].tolist() for i in batches[b]]
                outputs = translate(sources, [i + 1 for i in batches[b]])
                targets = [[BOS_ID, *y, EOS_ID] for y in outputs]
                _append(fh, {"batch": b, "targets": targets})
                done[b] = targets
                translated += len(sources)
                if bar is not None:
                    bar.update(len(sources))
        return translated, time.perf_counter() - started
    finally:
        if bar is not None:
            bar.close()


def _distilled_meta(
    meta: dict[str, Any],
    source_lengths: list[int],
    lengths: list[int],
    run: dict[str, Any],
    translated: int,
    seconds: float,
) -> dict[str, Any]:
    """A copy of the data's ``meta`` with the train split's target statistics of the new
    targets (``lengths`` in tokens, ``<s>``/``</s>`` included) and a ``distilled`` record: the
    ``run``'s ``settings``, ``teacher_config`` and ``threads``, the sentence count, this call's
    time and rate (``translated`` sentences in ``seconds``) and the time it finished. When
    fewer pairs than the data's were distilled (``max_pairs``), the train split's pair count and
    source statistics (``source_lengths``, in tokens with ``</s>``) are those of the pairs kept,
    and its source word count, which describes the whole split, is left out. The target word
    count and the ``<unk>`` count (of the references, both sides) are always left out."""
    n = len(lengths)
    meta = dict(meta)
    meta["splits"] = dict(meta["splits"])
    train = meta["splits"]["train"] = dict(meta["splits"]["train"])
    train["target_tokens"] = _length_stats(lengths)
    # the references' word and <unk> counts do not describe the teacher's targets
    for key in ("target_words", "unk_tokens"):
        train.pop(key, None)
    if n != train["pairs"]:
        train["pairs"] = n
        train["source_tokens"] = _length_stats(source_lengths)
        train.pop("source_words", None)
    meta["distilled"] = {
        **run,
        "sentences": n,
        "seconds_this_run": round(seconds, 1),
        "sentences_per_second_this_run": round(translated / seconds, 2) if seconds else None,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return meta


def _length_stats(lengths: list[int]) -> dict[str, float | int]:
    """``{"mean", "max"}`` of sentence lengths in tokens."""
    return {"mean": round(sum(lengths) / max(len(lengths), 1), 2), "max": max(lengths, default=0)}


def _write_dataset(
    data_dir: Path,
    output: Path,
    meta: dict[str, Any],
    train: BinarizedDataset,
    n: int,
    target_of: dict[int, list[int]],
) -> None:
    """The train split of the first ``n`` sources with the new targets, and every other file of
    ``data_dir`` copied, each written under a temporary name and renamed."""
    with tempfile.TemporaryDirectory(dir=output) as tmp:
        write_split(
            tmp,
            "train",
            [train[i][0].tolist() for i in range(n)],
            [target_of[i] for i in range(n)],
            int(meta["vocab_size"]),
        )
        for f in Path(tmp).iterdir():
            os.replace(f, output / f.name)
    for f in data_dir.iterdir():
        if f.name == "meta.json" or f.name.startswith("train."):
            continue
        if f.is_dir():
            shutil.copytree(f, output / f.name, dirs_exist_ok=True)
        else:
            with atomic_path(output / f.name) as tmp_file:
                shutil.copyfile(f, tmp_file)
