"""The speed sweep's frontier (docs/speed-sweep.md): BLEU against batch-1 latency, one curve per
design through its decoding λ values, CTranslate2 beam 5 and greedy beside them.

Two steps, after the designs are trained (``RUNS/models/STAGE-s1``, recipes/experiment.py)::

    # valid BLEU per design × λ × strategy (fadat.evaluate; fp32, the models as trained)
    python bench/speed_frontier.py bleu --design base=runs/sweep/.../models/base-s1 \\
        --design 5x1-range=runs/sweep/.../models/5x1-range-s1 [--design NAME=DIR ...] \\
        --data data/bible-en-es-4k --ratios 2 3 4 6 [--strategies lookahead,joint-viterbi] \\
        [--lm lm/kd.bin [--gamma 1.0]] [--split valid] [--subset 0] [--threads 1] \\
        --json valid-bleu.json
    # test BLEU and batch-1 latency come from one bench/bench_inference.py run with the same
    # names (--dat NAME=DIR ...; --json bench.json); then the table and the picture:
    python bench/speed_frontier.py table --bench bench.json [more.json ...] \\
        [--bleu valid-bleu.json [more.json ...]] [--precision int8] [--markdown frontier.md] \\
        [--png frontier.png]

``bleu`` runs :func:`fadat.evaluation.evaluate.evaluate` once per design and λ (no latency, no
bootstrap) and writes, per design, λ and strategy, the tokenized BLEU (the NAT papers' number,
the bench's ``tok_bleu``) and sacreBLEU of the split (:func:`valid_bleu`). A design can have
a file of its own, written when it finishes training; ``table`` merges them (:func:`merge_bleu`).

The DAT's beam search: ``--strategies ...,beam`` gives the beam search without a language model
(the bench's ``--beam`` rows); ``--lm FILE [--gamma G]`` adds the points of strategy
``beam+LM`` (the bench's ``--lm FILE --gamma G`` rows, ``DAT beam+LM``): the beam search with
that KenLM model at weight γ (default 1.0, as the bench's), one more ``evaluate`` call per
design and λ. A ``beam+LM`` point takes the valid BLEU of the same design, λ and γ only (a
bench row at another γ shows none).

``table`` reads the bench's JSON files (their per-row fields: bench/bench_inference.py,
"--json") and the BLEU file. A point is a torch row of the bench (``system`` ``torch``) at
``--precision``, without shortlist or pruning, of a named design (a bare ``--dat`` row takes
its model directory's name); where a design has two rows of one strategy at one λ (its own λ
and the same λ asked for), the one asked for is kept. A beam search row with a language model
(its ``lm`` field set) is a point of strategy ``beam+LM`` (:func:`strategy_label`), a curve of
its own beside ``beam`` without one; a beam row of a bench run at ``--beam-size K`` other than
100 is ``beam k=K`` or ``beam+LM k=K``, with the valid BLEU of ``bleu --beam-size K`` only.
Each point's speed-ups are against the CTranslate2 rows of the same bench file
(CTranslate2's batch-1 ms / the point's; > 1: the DAT is faster): beam 5 and greedy at the
CTranslate2 compute type ``--ct2-compute`` (default: the same as ``--precision``), without
``+vmap``; the rows forced to the references' lengths
(``=ref len``, from ``--at random``) where the AT's own rows are missing — those have no BLEU,
and the picture draws them as vertical lines at their latency. Writes a Markdown table
(:func:`markdown_table`, also printed) and a PNG (:func:`frontier_figure`), each atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The DAT rows' engines the frontier can take (the bench JSON's ``system`` field).
ENGINES = ("torch", "onnxruntime")

#: A design's name in ``--design NAME=DIR`` (bench/bench_inference.py's ``--dat NAME=DIR``).
DESIGN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


#: The strategy of a beam search point with a language model (the bench's ``DAT beam+LM`` rows).
LM_STRATEGY = "beam+LM"

#: The LM's weight γ of the ``beam+LM`` points without ``--gamma`` (the bench's default).
DEFAULT_GAMMA = 1.0


#: The beam search's default beam (the DAG beam strategy's ``beam_size``, fadat evaluate's); a
#: bench row or a ``bleu`` point at another beam (``--beam-size``) is a curve of its own.
BLEU_BEAM_SIZE = 100


def strategy_label(row: Mapping[str, Any]) -> str:
    """A bench row's strategy on the frontier: its ``strategy``, or :data:`LM_STRATEGY` for the
    beam search with a language model (a row whose ``lm`` is set); a beam row measured at a
    beam other than :data:`BLEU_BEAM_SIZE` (its ``beam_size``, bench_inference ``--beam-size``)
    adds `` k=K`` (``beam+LM k=20``), so that it is given the valid BLEU of the same beam only
    (``bleu --beam-size K``)."""
    label = LM_STRATEGY if row.get("lm") else row["strategy"]
    beam = row.get("beam_size")
    if beam is not None and beam != BLEU_BEAM_SIZE:
        label += f" k={beam}"
    return label


# ----------------------------------------------------------------------------- valid BLEU


def valid_bleu(
    designs: Mapping[str, str | Path],
    *,
    data: str | Path,
    ratios: Sequence[float],
    strategies: Sequence[str] = ("lookahead", "joint-viterbi"),
    split: str = "valid",
    subset: int = 0,
    threads: int = 1,
    lm: str | Path | None = None,
    gamma: float | None = None,
    beam_size: int = BLEU_BEAM_SIZE,
) -> dict[str, Any]:
    """BLEU of every design at every decoding λ and strategy on one split, through
    :func:`fadat.evaluation.evaluate.evaluate` (one call per design and λ, and one more for
    the ``beam+LM`` points; no latency, no bootstrap; the model directories as stored, i.e.
    fp32 weights).

    Args:
        designs: design name → DAT model directory, in the order of the table.
        data: a dataset directory written by ``fadat prepare``.
        ratios: the decoding λ values (``upsample_ratio``).
        strategies: the DAT strategies (``beam``: the beam search without an LM), and
            :data:`LM_STRATEGY` for the beam search with ``lm`` (added when ``lm`` is given).
        split: the split (``valid``; ``test`` for the fp32 test BLEU).
        subset: the first N sentences only (0 = all).
        threads: torch's intra-op threads.
        lm: a KenLM language model file of the designs' pieces (``fadat evaluate --lm``): the
            ``beam+LM`` points.
        gamma: its weight γ (default :data:`DEFAULT_GAMMA`); only with ``lm``.
        beam_size: the beam of the ``beam`` and ``beam+LM`` points (``fadat evaluate
            --beam-size``); at another beam than :data:`BLEU_BEAM_SIZE` their strategy reads
            ``beam k=K`` / ``beam+LM k=K``, as a bench row's (:func:`strategy_label`).

    Returns:
        ``{"data", "data_fingerprint", "split", "sentences", "subset", "lm", "gamma",
        "beam_size", "designs": {name: directory}, "points": [{"design", "model", "lambda",
        "strategy", "lm", "gamma", "beam_size", "tok_bleu", "bleu"}, ...]}`` (BLEU rounded to
        2 decimals, as the bench's; ``lm`` as given and ``gamma`` on the ``beam+LM`` points,
        ``None`` on the others; ``beam_size`` on the beam points, ``None`` on the others;
        ``data_fingerprint``: the sha256 of the split's raw sources and references,
        :func:`split_digest`, which :func:`merge_bleu` compares, so that one dataset named by
        two paths still merges).

    Raises:
        fadat.errors.InputError: ``gamma`` without ``lm``, :data:`LM_STRATEGY` without ``lm``;
            what :func:`~fadat.evaluation.evaluate.evaluate` raises (a bad model or data
            directory, a strategy the model does not offer, λ ≤ 0, a missing or unreadable LM
            file, an LM that holds too few of a design's pieces).
    """
    from fadat.errors import InputError
    from fadat.evaluation.evaluate import evaluate

    if gamma is not None and lm is None:
        raise InputError(
            "--gamma weighs the --lm language model of the beam+LM points and does nothing "
            "without one; give --lm FILE or leave --gamma out"
        )
    if LM_STRATEGY in strategies and lm is None:
        raise InputError(f"strategy {LM_STRATEGY} needs a language model: give --lm FILE")
    if beam_size < 1:
        raise InputError(f"--beam-size must be >= 1, got {beam_size}")
    plain = [s for s in strategies if s not in (LM_STRATEGY, "beam")]
    weight = (DEFAULT_GAMMA if gamma is None else float(gamma)) if lm is not None else None
    calls: list[tuple[list[str], dict[str, Any]]] = [(plain, {})] if plain else []
    if "beam" in strategies:  # its own call: beam_size is an option of the beam search only
        calls.append((["beam"], {"options": {"beam_size": beam_size}}))
    if lm is not None:
        calls.append(
            ([LM_STRATEGY], {"lm": lm, "options": {"gamma": weight, "beam_size": beam_size}})
        )
    points, sentences = [], None
    for name, directory in designs.items():
        for ratio in ratios:
            for names, extra in calls:
                report = evaluate(
                    directory,
                    data=data,
                    split=split,
                    strategies=["beam" if s == LM_STRATEGY else s for s in names],
                    subset=subset,
                    latency=False,
                    bootstrap=0,
                    threads=threads,
                    upsample_ratio=float(ratio),
                    **extra,
                )
                sentences = report["data"].get("sentences", sentences)
                for system in report["systems"]:
                    with_lm = "lm" in extra
                    beam = beam_size if with_lm or system["strategy"] == "beam" else None
                    row = {"strategy": system["strategy"], "lm": with_lm, "beam_size": beam}
                    points.append(
                        {
                            "design": name,
                            "model": str(directory),
                            "lambda": float(ratio),
                            "strategy": strategy_label(row),
                            "lm": str(lm) if with_lm else None,
                            "gamma": weight if with_lm else None,
                            "beam_size": beam,
                            "tok_bleu": round(system["tok_bleu"], 2),
                            "bleu": round(system["bleu"], 2),
                        }
                    )
    return {
        "data": str(data),
        "data_fingerprint": split_digest(data, split),
        "split": split,
        "sentences": sentences,
        "subset": subset,
        "lm": None if lm is None else str(lm),
        "gamma": weight,
        "beam_size": beam_size if lm is not None or "beam" in strategies else None,
        "designs": {name: str(d) for name, d in designs.items()},
        "points": points,
    }


def split_digest(data: str | Path, split: str) -> str:
    """sha256 over the raw text a split is scored against: ``raw/SPLIT.src.txt`` and every
    ``raw/SPLIT.ref*.txt`` of a ``fadat prepare`` data directory, in name order, each file's
    sha256 with its name (not ``meta.json``'s ``fingerprint``, which hashes the code that built
    the data too).

    Raises:
        fadat.errors.InputError: the data directory has no ``raw/SPLIT.src.txt``.
    """
    from fadat.data.build import sha256_file
    from fadat.errors import InputError

    raw = Path(data) / "raw"
    source = raw / f"{split}.src.txt"
    if not source.is_file():
        raise InputError(f"{source}: no such file (not a fadat prepare directory?)")
    files = sorted([source, *raw.glob(f"{split}.ref*.txt")])
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name} {sha256_file(path)}\n".encode())
    return digest.hexdigest()


def merge_bleu(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One :func:`valid_bleu` result from several (designs evaluated as each finished training,
    one ``bleu`` call each): the designs and points of all, in the order given.

    Args:
        results: :func:`valid_bleu` results (their JSON, read).

    Returns:
        A :func:`valid_bleu` result; the first one itself if there is one.

    The data are compared by their ``data_fingerprint`` where both files have one (a dataset
    given by a relative path in one call and an absolute one in another is the same), else by
    the data directory's name (files written before the fingerprint was recorded).

    Raises:
        ValueError: the results differ in data, split, subset or sentences (their BLEU would not
            be comparable), or one design is in two of them.
    """
    if len(results) == 1:
        return dict(results[0])
    first = results[0]
    keys = ("data", "data_fingerprint", "split", "sentences", "subset")
    merged = {k: first.get(k) for k in keys}
    merged["designs"], merged["points"] = {}, []
    for i, result in enumerate(results):
        for key in ("data", "split", "sentences", "subset"):
            if not _same(key, result, first):
                raise ValueError(
                    f"--bleu: file {i + 1} has {key} {result.get(key)!r}, file 1 "
                    f"{first.get(key)!r}: BLEU of other sentences is not comparable"
                )
        for name, directory in result.get("designs", {}).items():
            if name in merged["designs"]:
                raise ValueError(f"--bleu: design {name!r} is in two files")
            merged["designs"][name] = directory
        merged["points"] += list(result.get("points", []))
    return merged


def _same(key: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two :func:`valid_bleu` results agree on ``key``; ``data`` by fingerprint where
    both have one, else by the directory's name."""
    if key != "data":
        return a.get(key) == b.get(key)
    if a.get("data_fingerprint") and b.get("data_fingerprint"):
        return a["data_fingerprint"] == b["data_fingerprint"]
    return Path(str(a.get("data"))).name == Path(str(b.get("data"))).name


# ----------------------------------------------------------------------------- the frontier


@dataclass(frozen=True)
class Point:
    """One design × λ × strategy of a bench run: ``latency_ms`` and ``sent_s`` as (median, min,
    max) over repeats at the run's first thread count; ``test_bleu`` the bench's tokenized BLEU
    on the test sentences (``None`` if it has none); ``valid_bleu`` from the BLEU file
    (``None`` if absent); ``speedup_beam5`` / ``speedup_greedy``: CTranslate2's batch-1 ms in
    the same run / this point's (``None`` without that row); ``run``: the index of its bench
    file; ``lm`` (the file as given to the bench) and ``gamma`` for a ``beam+LM`` point, else
    ``None``."""

    design: str
    strategy: str
    lam: float
    precision: str
    latency_ms: tuple[float, float, float]
    sent_s: tuple[float, float, float] | None
    test_bleu: float | None
    valid_bleu: float | None
    speedup_beam5: float | None
    speedup_greedy: float | None
    run: int
    lm: str | None = None
    gamma: float | None = None


@dataclass(frozen=True)
class Baseline:
    """A CTranslate2 row of a bench run (``name`` as in the bench), ``beam`` ``greedy`` or
    ``beam5``; ``test_bleu`` is ``None`` for the rows forced to the references' lengths."""

    name: str
    beam: str
    latency_ms: tuple[float, float, float]
    sent_s: tuple[float, float, float] | None
    test_bleu: float | None
    forced: bool
    run: int


def _rows(bench: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The rows of a bench JSON (the entries with a ``command``; not ``machine``, ``run``)."""
    return {k: v for k, v in bench.items() if isinstance(v, dict) and "command" in v}


def _triple(value: Any) -> tuple[float, float, float] | None:
    return None if value is None else tuple(float(v) for v in value)


def baselines(bench: Mapping[str, Any], compute: str, run: int = 0) -> dict[str, Baseline]:
    """The CTranslate2 rows of one bench JSON that the points are compared with: per beam
    (``greedy``, ``beam5``) the row at compute type ``compute`` without ``+vmap``, the AT's
    own outputs where measured, else the one forced to the references' lengths.

    Raises:
        ValueError: a row without the fields of today's bench (``system``, ``latency_ms``):
            a JSON of a bench older than them.
    """
    found: dict[str, Baseline] = {}
    for name, row in _rows(bench).items():
        if "system" not in row or "latency_ms" not in row:
            raise ValueError(f"row {name!r} has no 'system'/'latency_ms': an older bench's JSON")
        if row["system"] != "ctranslate2" or row["precision"] != compute or row.get("vmap"):
            continue
        forced = bool(row.get("forced"))
        if row["strategy"] in found and not found[row["strategy"]].forced:
            continue  # the AT's own row is there: keep it
        found[row["strategy"]] = Baseline(
            name,
            row["strategy"],
            _triple(row["latency_ms"]),
            _triple(row.get("sent_s")),
            None if forced else row.get("tok_bleu"),
            forced,
            run,
        )
    return found


def frontier_points(
    benches: Sequence[Mapping[str, Any]],
    bleu: Mapping[str, Any] | None = None,
    precision: str = "int8",
    ct2_compute: str | None = None,
    engine: str = "torch",
) -> tuple[list[Point], list[Baseline]]:
    """The points of the frontier and the CTranslate2 rows they are compared with.

    Args:
        benches: bench/bench_inference.py JSON files, read (each one run).
        bleu: a :func:`valid_bleu` result (its points give ``valid_bleu``), or ``None``.
        precision: the DAT rows' precision to take.
        ct2_compute: the CTranslate2 compute type of the baselines (default ``precision``).
        engine: the DAT rows' engine, ``torch`` (``DAT ...`` rows) or ``onnxruntime``
            (``ORT ...`` rows, the exports of ``--onnx-dir``); the points' ``precision`` then
            reads ``int8 ORT``.

    Returns:
        ``(points, baselines)``: points ordered by design (first appearance), strategy (first
        appearance; :func:`strategy_label`, so ``beam`` and ``beam+LM`` apart), λ; baselines
        in file order, beam 5 before greedy. A ``beam+LM`` point's valid BLEU is that of the
        same design, λ and γ.

    Raises:
        ValueError: a design measured in two files (its speed-ups would mix runs), or a JSON
            of a bench older than the per-row fields.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    compute = ct2_compute or precision
    valid: dict[tuple[str, str, float, float | None], float] = {}
    for p in (bleu or {}).get("points", []):
        key = (p["design"], p["strategy"], float(p["lambda"]), _gamma(p))
        valid[key] = p["tok_bleu"]
    chosen: dict[tuple[str, str, float], tuple[dict[str, Any], int]] = {}
    runs_of: dict[str, int] = {}
    found_baselines: list[Baseline] = []
    for run, bench in enumerate(benches):
        base = baselines(bench, compute, run)
        found_baselines += [base[b] for b in ("beam5", "greedy") if b in base]
        for row in _rows(bench).values():
            if row.get("system") != engine or row.get("precision") != precision:
                continue
            if row.get("shortlist") or row.get("prune") is not None:
                continue
            design = row.get("design") or Path(row["model"]).name
            if runs_of.setdefault(design, run) != run:
                raise ValueError(
                    f"design {design!r} is in bench files {runs_of[design]} and {run}: one run "
                    "per design (its speed-ups are against its own run's CTranslate2 rows)"
                )
            key = (design, strategy_label(row), float(row["lambda"]))
            if key in chosen and row.get("upsample_ratio") is None:
                continue  # the same λ asked for explicitly is already there
            chosen[key] = (row, run)
    points = []
    for (design, strategy, lam), (row, run) in chosen.items():
        ms = _triple(row["latency_ms"])
        base = {b.beam: b for b in found_baselines if b.run == run}
        speedups = [
            base[b].latency_ms[0] / ms[0] if b in base and ms[0] > 0 else None
            for b in ("beam5", "greedy")
        ]
        points.append(
            Point(
                design,
                strategy,
                lam,
                precision if engine == "torch" else f"{precision} ORT",
                ms,
                _triple(row.get("sent_s")),
                row.get("tok_bleu"),
                valid.get((design, strategy, lam, _gamma(row))),
                *speedups,
                run,
                row.get("lm"),
                _gamma(row),
            )
        )
    designs = list(dict.fromkeys(p.design for p in points))
    strategies = list(dict.fromkeys(p.strategy for p in points))
    points.sort(key=lambda p: (designs.index(p.design), strategies.index(p.strategy), p.lam))
    return points, found_baselines


def _gamma(entry: Mapping[str, Any]) -> float | None:
    """The γ of a bench row or valid-BLEU point with an LM (``None`` without one)."""
    return None if not entry.get("lm") or entry.get("gamma") is None else float(entry["gamma"])


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt % value


def markdown_table(
    points: Sequence[Point],
    found_baselines: Sequence[Baseline],
    benches: Sequence[Mapping[str, Any]] = (),
    bleu: Mapping[str, Any] | None = None,
) -> str:
    """The frontier as Markdown: a line per bench run (CPU, threads, sentences, repeats), then
    one row per design × λ × strategy (valid BLEU, test BLEU, batch-1 ms with its min–max over
    repeats, sentences/s, speed-ups against CTranslate2 beam 5 and greedy of the same run),
    then the CTranslate2 rows; with several bench runs each row names its run. A ``beam+LM``
    row's strategy names its γ (``beam+LM γ=1``), and a line names each LM file."""
    lines = []
    for run, bench in enumerate(benches):
        info, machine = bench.get("run", {}), bench.get("machine", {})
        lines.append(
            f"- run {run}: {machine.get('cpu', '?')}; {info.get('threads', ['?'])[0]} "
            f"thread(s); test BLEU on {info.get('test_sentences', '?')} sentences, batch-1 "
            f"latency on the first {info.get('latency_sentences', '?')}, "
            f"{info.get('repeats', '?')} interleaved repeats (medians, min–max); "
            f"{machine.get('versions', '')}"
        )
    if bleu:
        lines.append(
            f"- valid BLEU: `fadat evaluate --split {bleu.get('split', 'valid')}` "
            f"({bleu.get('sentences', '?')} sentences, fp32 weights) of each design at each λ"
        )
    lines.append("- test BLEU: tokenized BLEU of the bench row's own outputs (its precision)")
    for lm in dict.fromkeys(p.lm for p in points if p.lm):
        lines.append(
            f"- {LM_STRATEGY}: the DAT's beam search with the KenLM language model `{lm}` "
            "(`fadat translate --strategy beam --lm FILE --gamma γ`)"
        )
    lines.append(
        "- speed-up: CTranslate2's batch-1 ms in the same run / the row's (> 1: the DAT is faster)"
    )
    lines += [
        "",
        "| design | λ | strategy | precision | valid BLEU | test BLEU | batch-1 ms (min–max) "
        "| sent/s | speed-up vs CT2 beam 5 | speed-up vs CT2 greedy |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        ms = p.latency_ms
        run = f" (run {p.run})" if len(benches) > 1 else ""
        lines.append(
            f"| {p.design}{run} | {p.lam:g} | {_strategy_cell(p)} | {p.precision} | "
            f"{_cell(p.valid_bleu, '%.2f')} | {_cell(p.test_bleu, '%.2f')} | "
            f"{ms[0]:.2f} ({ms[1]:.2f}–{ms[2]:.2f}) | "
            f"{_cell(p.sent_s[0] if p.sent_s else None, '%.1f')} | "
            f"{_cell(p.speedup_beam5, '%.2f×')} | {_cell(p.speedup_greedy, '%.2f×')} |"
        )
    for b in found_baselines:
        ms = b.latency_ms
        run = f" (run {b.run})" if len(benches) > 1 else ""
        bleu_cell = (
            "– (forced to the references' lengths)" if b.forced else _cell(b.test_bleu, "%.2f")
        )
        lines.append(
            f"| {b.name}{run} | – | {b.beam} | – | – | {bleu_cell} | "
            f"{ms[0]:.2f} ({ms[1]:.2f}–{ms[2]:.2f}) | "
            f"{_cell(b.sent_s[0] if b.sent_s else None, '%.1f')} | – | – |"
        )
    return "\n".join(lines) + "\n"


def _strategy_cell(point: Point) -> str:
    """The table's strategy: ``beam+LM γ=1`` for a point with an LM, else the strategy."""
    return point.strategy + ("" if point.gamma is None else f" γ={point.gamma:g}")


#: The picture's line style and marker per strategy (others: :data:`OTHER_STYLE`).
STYLES: dict[str, tuple[Any, str]] = {
    "lookahead": ("-", "o"),
    "joint-viterbi": ("--", "s"),
    "greedy": (":", "^"),
    "beam": ("-.", "D"),
    LM_STRATEGY: ((0, (5, 1, 1, 1, 1, 1)), "P"),
}
OTHER_STYLE: tuple[Any, str] = ((0, (1, 2)), "v")


def bare_strategy(strategy: str) -> str:
    """A frontier strategy label without the beam suffix :func:`strategy_label` adds
    (``beam+LM k=20`` → ``beam+LM``)."""
    return strategy.split(" k=")[0]


def strategy_style(strategy: str) -> tuple[Any, str]:
    """The line style and marker of a frontier strategy label: that of its
    :func:`bare_strategy` (``beam+LM k=20`` is drawn as ``beam+LM``), :data:`OTHER_STYLE` for
    another."""
    return STYLES.get(bare_strategy(strategy), OTHER_STYLE)


def frontier_figure(points: Sequence[Point], found_baselines: Sequence[Baseline]):
    """BLEU against batch-1 latency (a matplotlib Figure): one panel per strategy (its
    :func:`bare_strategy`: ``beam k=20`` and ``beam`` share one; in order of appearance; the
    panels share their axes), in each a line per design in the design's colour through its λ
    points (in λ order), in the strategy's line style and marker (:func:`strategy_style`:
    ``beam`` dash-dot with diamonds, ``beam+LM`` dash-dot-dot with filled pluses), each point
    labelled ``λ=x``; in every panel CTranslate2 beam 5 (star) and greedy (cross) as single
    points, or, without BLEU (forced to the references' lengths), as vertical lines at their
    latency, so labelled in the legend, and the target as grey lines: a third of beam 5's
    latency (vertical) and, where beam 5 has BLEU, its BLEU − 0.3 (horizontal). Points without
    test BLEU are left out.

    Returns:
        The figure (close it with ``matplotlib.pyplot.close``); x: the median batch-1 ms, y:
        the bench's tokenized test BLEU.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [p for p in points if p.test_bleu is not None]
    panels = list(dict.fromkeys(bare_strategy(p.strategy) for p in drawn)) or [""]
    ncols = 1 if len(panels) == 1 else 2
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(9 if ncols == 1 else 13, 6 if nrows == 1 else 4.8 * nrows),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    designs = list(dict.fromkeys(p.design for p in points))
    several = len({b.run for b in found_baselines}) > 1
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        panel = panels[index]
        for design in designs:
            colour = colours[designs.index(design) % len(colours)]
            for strategy in dict.fromkeys(
                p.strategy
                for p in drawn
                if p.design == design and bare_strategy(p.strategy) == panel
            ):
                curve = [p for p in drawn if p.design == design and p.strategy == strategy]
                xs = [p.latency_ms[0] for p in curve]
                ys = [p.test_bleu for p in curve]
                linestyle, marker = strategy_style(strategy)
                ax.plot(
                    xs,
                    ys,
                    linestyle=linestyle,
                    marker=marker,
                    color=colour,
                    label=f"{design} {strategy}",
                )
                for p, x, y in zip(curve, xs, ys, strict=True):
                    ax.annotate(
                        f"λ={p.lam:g}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize=7,
                    )
        _draw_baselines(ax, found_baselines, several)
        ax.set_title(panel, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("batch-1 latency (ms per sentence, median)")
    for ax in axes[:, 0]:
        ax.set_ylabel("test BLEU (tokenized)")
    fig.tight_layout()
    return fig


def _draw_baselines(ax: Any, found_baselines: Sequence[Baseline], several: bool) -> None:
    """CTranslate2's rows and the target's lines on one panel (:func:`frontier_figure`)."""
    for b in found_baselines:
        label = f"CTranslate2 {'beam 5' if b.beam == 'beam5' else 'greedy'}"
        label += f" (run {b.run})" if several else ""
        if b.test_bleu is None:
            ax.axvline(
                b.latency_ms[0],
                color="black",
                linestyle="-" if b.beam == "beam5" else ":",
                linewidth=1,
                label=f"{label}: latency only (forced to the references' lengths, no BLEU)",
            )
        else:
            ax.plot(
                [b.latency_ms[0]],
                [b.test_bleu],
                marker="*" if b.beam == "beam5" else "X",
                markersize=12,
                color="black",
                linestyle="none",
                label=label,
            )
        if b.beam == "beam5":  # the target: at most a third of its time, within 0.3 of its BLEU
            ax.axvline(
                b.latency_ms[0] / 3,
                color="grey",
                linestyle="--",
                linewidth=0.8,
                label=f"⅓ of {label}'s latency (the target)",
            )
            if b.test_bleu is not None:
                ax.axhline(
                    b.test_bleu - 0.3,
                    color="grey",
                    linestyle="-.",
                    linewidth=0.8,
                    label=f"{label}'s BLEU − 0.3 (the target)",
                )


# ----------------------------------------------------------------------------- command line


def parse_design(value: str) -> tuple[str, Path]:
    """``NAME=DIR`` → (name, directory); raises SystemExit otherwise."""
    name, sep, directory = value.partition("=")
    if not sep or not directory or not DESIGN_NAME.fullmatch(name):
        raise SystemExit(f"--design {value}: give NAME=DIR (NAME of letters, digits, _ . + -)")
    return name, Path(directory)


def main(argv: list[str] | None = None) -> int:
    """``bleu`` and ``table`` (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bleu", help="valid BLEU per design × λ × strategy (fadat.evaluate)")
    p.add_argument("--design", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--data", required=True, help="prepared data directory")
    p.add_argument("--ratios", type=float, nargs="+", required=True, help="decoding λ values")
    p.add_argument(
        "--strategies",
        default="lookahead,joint-viterbi",
        help="DAT strategies, comma-separated (beam: the beam search without an LM; "
        f"{LM_STRATEGY}: with --lm)",
    )
    p.add_argument(
        "--lm",
        metavar="FILE",
        help=f"a KenLM language model of the designs' pieces: adds the {LM_STRATEGY} points "
        "(the bench's --lm rows)",
    )
    p.add_argument(
        "--gamma",
        type=float,
        metavar="G",
        help=f"the LM's weight γ (default {DEFAULT_GAMMA:g}, as the bench's; needs --lm)",
    )
    p.add_argument(
        "--beam-size",
        type=int,
        default=BLEU_BEAM_SIZE,
        metavar="K",
        help=f"the beam of the beam and {LM_STRATEGY} points (default {BLEU_BEAM_SIZE}; "
        "another K labels them 'k=K', as the bench's --beam-size rows)",
    )
    p.add_argument("--split", default="valid")
    p.add_argument("--subset", type=int, default=0, help="first N sentences (0 = all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", required=True, help="write the BLEU here")
    p = sub.add_parser("table", help="the frontier's Markdown table and PNG")
    p.add_argument("--bench", nargs="+", required=True, help="bench_inference.py --json files")
    p.add_argument(
        "--bleu", nargs="+", help="the JSON of the bleu command (several: one per design)"
    )
    p.add_argument("--precision", default="int8", help="the DAT rows' precision (int8)")
    p.add_argument(
        "--engine",
        default="torch",
        choices=ENGINES,
        help="the DAT rows' engine: torch (DAT rows, default) or onnxruntime (ORT rows)",
    )
    p.add_argument("--ct2-compute", help="CTranslate2's compute type (default: --precision)")
    p.add_argument("--markdown", help="write the table here (it is printed too)")
    p.add_argument("--png", help="write the picture here")
    args = parser.parse_args(argv)

    from fadat.outputs import atomic_path, atomic_write

    if args.command == "bleu":
        designs = dict(parse_design(v) for v in args.design)
        if len(designs) != len(args.design):
            raise SystemExit("--design: a name is given twice")
        from fadat.errors import InputError

        try:
            result = valid_bleu(
                designs,
                data=args.data,
                ratios=args.ratios,
                strategies=[s.strip() for s in args.strategies.split(",") if s.strip()],
                split=args.split,
                subset=args.subset,
                threads=args.threads,
                lm=args.lm,
                gamma=args.gamma,
                beam_size=args.beam_size,
            )
        except InputError as err:
            raise SystemExit(f"speed_frontier.py bleu: {err}") from None
        atomic_write(args.json, json.dumps(result, indent=1) + "\n")
        for q in result["points"]:
            weight = "" if q["gamma"] is None else f" γ={q['gamma']:g}"
            print(f"{q['design']} λ={q['lambda']:g} {q['strategy']}{weight}: {q['tok_bleu']:.2f}")
        return 0
    benches = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.bench]
    bleu = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.bleu or []]
    try:
        bleu = merge_bleu(bleu) if bleu else None
        points, found = frontier_points(
            benches, bleu, args.precision, args.ct2_compute, args.engine
        )
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if not points:
        raise SystemExit(
            f"no torch {args.precision} rows without shortlist or pruning in {args.bench}"
        )
    text = markdown_table(points, found, benches, bleu)
    print(text, end="")
    if args.markdown:
        atomic_write(args.markdown, text)
    if args.png:
        import matplotlib.pyplot as plt

        fig = frontier_figure(points, found)
        with atomic_path(args.png) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
