"""``fadat evaluate``: its flags, the run (:func:`fadat.evaluation.evaluate.evaluate`, then
``report.json``) and the printed table (:func:`format_report`). What is measured and how:
:mod:`fadat.evaluation.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from fadat import outputs
from fadat.cli.common import (
    add_decoding_arguments,
    add_force_argument,
    add_head_arguments,
    add_threads_argument,
    add_upsample_argument,
    strategy_help,
)
from fadat.engine import DEFAULT_ENGINE, ENGINES
from fadat.evaluation import validset_metrics
from fadat.evaluation.evaluate import DEFAULT_GRID, evaluate, log
from fadat.evaluation.scoring import DEFAULT_STRATEGIES
from fadat.options import (
    DECODING_OPTIONS,
    check_threads,
    finite_float,
    finite_float_list,
    nonnegative_int,
    positive_int,
    usable_cores,
)


def _fmt(value: float | None, digits: int = 2) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


def format_report(report: dict[str, Any]) -> str:
    """The printed table: one row per system (its engine and precision, quality, buckets, speed,
    speed-ups, p-values), then the metric signatures and the tuned length penalties."""
    systems = report["systems"]
    baseline = report["baseline"]
    buckets = [b["bucket"] for b in systems[0]["length_buckets"]]
    header = (
        ["system", "engine", "BLEU", "chrF", "tokBLEU"]
        + [f"tok {b}" for b in buckets]
        + ["lat ms", "speed-up", "sent/s", "tput ×", f"p vs {baseline}"]
    )
    rows = []
    for s in systems:
        p = (s.get("p_value_bleu") or {}).get(baseline)
        p_text = "same" if baseline in s.get("identical_to", []) else _fmt(p, 4)
        rows.append(
            [s["name"], f"{s['engine']} {s['precision']}"]
            + [_fmt(s["bleu"]), _fmt(s["chrf"]), _fmt(s["tok_bleu"])]
            + [_fmt(b["tok_bleu"]) for b in s["length_buckets"]]
            + [
                _fmt(s.get("latency_ms_median"), 1),
                f"{s['speedup_latency']:.2f}×" if "speedup_latency" in s else "-",
                _fmt(s["throughput"], 1),
                f"{s['speedup_throughput']:.2f}×",
                p_text,
            ]
        )
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(len(header))]
    lines = [
        "  ".join(
            str(c).rjust(w) if k else str(c).ljust(w)
            for k, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    data = report["data"]
    env = report["environment"]
    lines.append("")
    lines.append(
        f"{data['sentences']} sentences, {data['references']} reference stream(s), "
        f"{data['source_lang']}→{data['target_lang']}; bucket counts: "
        + ", ".join(f"{b['bucket']}: {b['count']}" for b in systems[0]["length_buckets"])
    )
    engine = ""
    if "onnxruntime" in env:
        threads = env["onnxruntime_intra_threads"] or "all"
        engine = f"; onnxruntime {env['onnxruntime']}, {threads} intra-op threads"
    lines.append(
        f"speed: {env['device']}, {env['torch_threads']} threads, torch {env['torch']}{engine}, "
        f"{env['cpu']}; latency = median at batch size 1; speed-ups relative to {baseline}"
    )
    lines.append(f"BLEU:    {systems[0]['bleu_signature']}")
    lines.append(f"chrF:    {systems[0]['chrf_signature']}")
    lines.append(f"tokBLEU: {systems[0]['tok_bleu_signature']}")
    for name, t in report["tuning"].items():
        grid = ", ".join(f"{g['length_penalty']:g}: {g['tok_bleu']:.2f}" for g in t["grid"])
        lines.append(f"{name}: length penalty {t['best']:g} tuned on {t['split']} ({grid})")
    lines += validset_metrics.format_table(systems)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fadat evaluate``."""
    parser.add_argument(
        "--model",
        nargs="+",
        required=True,
        help="model directories (DAT and/or AT) and exports of `fadat export --format onnx`",
    )
    parser.add_argument("--data", required=True, help="data directory written by fadat prepare")
    parser.add_argument("--split", default="test", help="split to evaluate (default test)")
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated strategies of the non-autoregressive models "
        f"({strategy_help(autoregressive=False, defaults=False)}; "
        f"default {','.join(DEFAULT_STRATEGIES)}); AT models always run greedy and beam search",
    )
    parser.add_argument(
        "--subset", type=nonnegative_int, default=0, help="only the first N sentences"
    )
    parser.add_argument(
        "--at-beam-size", type=positive_int, default=5, help="AT beam size (default 5)"
    )
    parser.add_argument(
        "--at-length-penalty", type=finite_float, default=1.0, help="AT beam length penalty α"
    )
    parser.add_argument(
        "--tune-length-penalty",
        action="store_true",
        help="tune joint-Viterbi's β_v on --tune-split by tokenized BLEU",
    )
    parser.add_argument(
        "--length-penalty-grid",
        type=finite_float_list,
        default=",".join(f"{v:g}" for v in DEFAULT_GRID),
        help="candidate β_v values (default 0.6,0.8,1,1.2,1.4)",
    )
    parser.add_argument("--tune-split", default="valid", help="split for tuning (default valid)")
    parser.add_argument(
        "--tune-subset",
        type=nonnegative_int,
        default=0,
        help="first N tuning sentences (0 = --subset)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=64,
        help="sentences per batch for throughput (64)",
    )
    parser.add_argument(
        "--max-tokens", type=nonnegative_int, default=0, help="optional batch budget too (0 = none)"
    )
    parser.add_argument(
        "--latency",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure batch-1 latency (default on)",
    )
    parser.add_argument(
        "--latency-subset",
        type=nonnegative_int,
        default=0,
        help="latency on the first N sentences only",
    )
    parser.add_argument("--warmup", type=nonnegative_int, default=20, help="warm-up sentences (20)")
    add_threads_argument(parser, default=min(2, usable_cores()), onnxruntime=True)
    parser.add_argument(
        "--device", default="cpu", help="cpu (default), cuda, cuda:N (the torch engine's)"
    )
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=ENGINES,
        help="auto (default): onnxruntime for an export of `fadat export --format onnx`, torch "
        "for a model directory, each model its own; torch: every model in PyTorch; onnxruntime: "
        "every model an export (or a DAT model directory, exported first) run by ONNX Runtime on "
        "the CPU with --threads intra-op threads, strategies greedy, lookahead (no n-gram bans), "
        "viterbi, joint-viterbi and beam (with --lm too); AT directories and "
        "--prune-threshold are refused there, an export runs the shortlist it was exported "
        "with (docs/engine.md)",
    )
    parser.add_argument(
        "--precision",
        default=None,
        choices=("fp32", "bf16", "int8"),
        help="torch: DAT weights in fp32 (default), bf16 or int8 on the CPU (AT models run fp32 "
        "only); onnxruntime: fp32 or int8, checked against each export's (default the "
        "export's)",
    )
    add_upsample_argument(parser)
    add_head_arguments(parser)
    parser.add_argument(
        "--baseline", default=None, help="system for speed-ups and significance (default AT beam)"
    )
    parser.add_argument(
        "--bootstrap",
        type=nonnegative_int,
        default=1000,
        help="paired bootstrap resamples (0 = skip)",
    )
    parser.add_argument("--report", default="report.json", help="report path (report.json)")
    parser.add_argument("--save-hypotheses", default=None, help="write hypotheses to this dir")
    add_force_argument(parser)
    add_decoding_arguments(parser, language_model=True)


def run(args: argparse.Namespace) -> int:
    """``fadat evaluate``: evaluate (:func:`fadat.evaluation.evaluate.evaluate`), write
    report.json, print the table."""
    # Before any work: the outputs can be written (fadat.outputs); evaluate checks
    # --save-hypotheses itself.
    inputs = [("--data", args.data), *(("--model", m) for m in args.model)]
    path = outputs.check_output_file(args.report, "--report", inputs, args.force)
    # More threads than cores: refused without --force; evaluate warns and uses them.
    check_threads(args.threads, args.force)
    report = evaluate(
        args.model,
        data=args.data,
        split=args.split,
        strategies=args.strategies,
        subset=args.subset,
        at_beam_size=args.at_beam_size,
        at_length_penalty=args.at_length_penalty,
        tune_length_penalty=args.tune_length_penalty,
        length_penalty_grid=args.length_penalty_grid,
        tune_split=args.tune_split,
        tune_subset=args.tune_subset,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        latency=args.latency,
        latency_subset=args.latency_subset,
        warmup=args.warmup,
        threads=args.threads,
        device=args.device,
        engine=args.engine,
        precision=args.precision,
        upsample_ratio=args.upsample_ratio,
        shortlist=args.shortlist,
        prune_threshold=args.prune_threshold,
        baseline=args.baseline,
        bootstrap=args.bootstrap,
        save_hypotheses=args.save_hypotheses,
        options={name: getattr(args, name) for name in DECODING_OPTIONS if hasattr(args, name)},
        lm=args.lm,
    )
    # report.json records the command line's settings: every flag as given or defaulted.
    report["settings"] = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    text = json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    outputs.atomic_write(path, text, "--report", record=True)
    print(format_report(report))
    log(f"report written to {path}")
    return 0
