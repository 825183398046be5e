"""DAT inference against the same-size AT in fadat and in CTranslate2, in one run: batch-1
latency (median, p90), batched sentences/s and test BLEU, at 1 and 2 threads.

Usage::

    .venv/bin/python bench/bench_inference.py --dat models/bible-en-es-fadat-cpu-small \
        --at AT_DIR --data data/bible-en-es [--threads 1 2] [--latency-sentences 100] \
        [--batch-sentences 512] [--json out.json]

Systems: the DAT through fadat's fast inference path (fadat.inference) in fp32, bf16 and int8
weights with greedy, lookahead and joint-Viterbi, plus the DAT's full path (the ``(B, L, V)``
log-probabilities, as before the fast path) with lookahead in fp32; the AT in fadat (fp32,
greedy and beam 5) and exported to CTranslate2 (fadat.export; float32 and int8 compute types,
greedy and beam 5, with fadat's decoding rules).

Protocol: token ids in, token ids out (sentencepiece excluded for every system). Latency: the
first ``--latency-sentences`` test sentences one at a time after 5 warm-up sentences; median and
90th percentile. Throughput: the first ``--batch-sentences`` test sentences sorted by length in
batches of ``--batch-size``. All systems take turns sentence by sentence (latency) and batch
by batch (throughput), so that the load of a shared machine falls on all of them alike. BLEU:
the test set (its first ``--test-sentences``) translated in batches at the first thread count,
which is also that count's throughput (tokenized BLEU with the Moses tokenizer, and sacreBLEU;
raw/test.ref.txt). Threads:
torch's intra-op threads for fadat; for CTranslate2 ``intra_threads`` = threads and
``inter_threads`` = 1 (its documentation's setting for one stream of requests; a second
worker per batch was slower here, see RESULTS.md). The machine is shared: the load average and
the busiest other processes are printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fadat.data.contract import pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import decode
from fadat.inference import PRECISIONS, graph_top1, with_precision
from fadat.model_dir import load_pretrained
from fadat.scoring import corpus_scores

Translate = Callable[[list[list[int]]], list[list[int]]]


def dat_system(model, strategy: str) -> Translate:
    def run(sources):
        top1, links, lengths = graph_top1(model, pad_sequences(sources), strategy == "greedy")
        return [h.tokens for h in decode(top1, links, lengths, strategy)]

    return run


def dat_full_path(model) -> Translate:
    def run(sources):
        source = pad_sequences(sources)
        lengths = model.graph_lengths(source.ne(1).sum(1), decoding=True)
        with torch.inference_mode():
            token_logprobs, links = model(source, lengths)
        return [h.tokens for h in decode(token_logprobs, links, lengths, "lookahead")]

    return run


def at_system(model, beam: int) -> Translate:
    def run(sources):
        with torch.inference_mode():
            source = pad_sequences(sources)
            hyps = model.greedy(source) if beam == 1 else model.beam_search(source, beam)
        return [h.tokens for h in hyps]

    return run


def busy_processes(n: int = 5) -> str:
    out = subprocess.run(
        ["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()[1 : n + 1]
    return "\n".join("  " + line.strip()[:120] for line in out)


def latency(runs: dict[str, tuple[Translate, list]], count: int) -> dict[str, tuple]:
    """Median and p90 ms per system at batch 1 on its first ``count`` sources; the systems take
    turns on every sentence, so a change of the machine's load falls on all of them alike."""
    for run, sources in runs.values():
        for s in sources[:5]:
            run([s])
    times: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(count):
        for name, (run, sources) in runs.items():
            start = time.perf_counter()
            run([sources[k]])
            times[name].append(time.perf_counter() - start)
    out = {}
    for name, t in times.items():
        t.sort()
        out[name] = (statistics.median(t) * 1000, t[int(0.9 * (len(t) - 1))] * 1000)
    return out


def batched(
    runs: dict[str, tuple[Translate, list]], count: int, size: int
) -> dict[str, tuple[float, list]]:
    """Sentences/s and outputs per system on its first ``count`` sources, in batches of
    ``size`` sorted by length; the systems take turns on every batch."""
    plans = {}
    for name, (_, sources) in runs.items():
        order = sorted(range(count), key=lambda i: len(sources[i]))
        plans[name] = [order[k : k + size] for k in range(0, count, size)]
    outputs: dict[str, list] = {name: [None] * count for name in runs}
    seconds = dict.fromkeys(runs, 0.0)
    for b in range(len(next(iter(plans.values())))):
        for name, (run, sources) in runs.items():
            ids = plans[name][b]
            start = time.perf_counter()
            ys = run([sources[i] for i in ids])
            seconds[name] += time.perf_counter() - start
            for i, y in zip(ids, ys, strict=True):
                outputs[name][i] = y
    return {name: (count / seconds[name], outputs[name]) for name in runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dat", required=True)
    p.add_argument("--at", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--latency-sentences", type=int, default=100)
    p.add_argument("--batch-sentences", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--test-sentences", type=int, default=0, help="first N only (0 = all)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    import sentencepiece as spm

    from fadat.export import CTranslate2AT, export_ctranslate2

    data = Path(args.data)
    lines = (data / "raw" / "test.src.txt").read_text(encoding="utf-8").splitlines()
    refs = (data / "raw" / "test.ref.txt").read_text(encoding="utf-8").splitlines()
    if args.test_sentences:
        lines, refs = lines[: args.test_sentences], refs[: args.test_sentences]
    dat = load_pretrained(args.dat).eval()
    at = load_pretrained(args.at).eval()
    sp_dat = spm.SentencePieceProcessor(model_file=str(Path(args.dat) / "spm.model"))
    sp_at = spm.SentencePieceProcessor(model_file=str(Path(args.at) / "spm.model"))
    src_dat = [encode_source(sp_dat, x) for x in lines]
    src_at = [encode_source(sp_at, x) for x in lines]
    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    export_ctranslate2(args.at, work / "at-ct2")

    systems: list[tuple[str, str, Callable[[int], Translate]]] = []
    dats = {p: with_precision(dat, p) for p in PRECISIONS}
    for precision in PRECISIONS:
        for strategy in ("greedy", "lookahead", "joint-viterbi"):
            systems.append(
                (
                    f"DAT {strategy} {precision}",
                    "dat",
                    lambda t, m=dats[precision], s=strategy: dat_system(m, s),
                )  # fmt: skip
            )
    systems.append(("DAT lookahead fp32 (full path)", "dat", lambda t: dat_full_path(dat)))
    systems.append(("AT fadat greedy fp32", "at", lambda t: at_system(at, 1)))
    systems.append(("AT fadat beam5 fp32", "at", lambda t: at_system(at, 5)))
    for compute in ("float32", "int8"):
        for beam in (1, 5):
            name = f"AT CT2 {'greedy' if beam == 1 else 'beam5'} {compute}"

            def make(t, compute=compute, beam=beam):
                engine = CTranslate2AT(work / "at-ct2", compute, intra_threads=t, inter_threads=1)
                return lambda sources: engine.translate_ids(sources, beam_size=beam)

            systems.append((name, "at", make))

    results: dict[str, dict] = {name: {} for name, _, _ in systems}
    for t_index, threads in enumerate(args.threads):
        torch.set_num_threads(threads)
        runs = {
            name: (make(threads), src_dat if kind == "dat" else src_at)
            for name, kind, make in systems
        }
        lat = latency(runs, args.latency_sentences)
        # at the first thread count the whole (--test-sentences) test set: throughput and BLEU
        count = len(lines) if t_index == 0 else min(args.batch_sentences, len(lines))
        tput = batched(runs, count, args.batch_size)
        for name, kind, _ in systems:
            rate, outputs = tput[name]
            if t_index == 0:
                sp = sp_dat if kind == "dat" else sp_at
                scores = corpus_scores([sp.decode(y) for y in outputs], [refs], "es")
                results[name]["tok_bleu"] = round(scores["tok_bleu"], 2)
                results[name]["bleu"] = round(scores["bleu"], 2)
            med, p90 = lat[name]
            results[name][threads] = {"median_ms": med, "p90_ms": p90, "sent_s": rate}
            print(f"[{threads} thread(s)] {name}: {med:.1f} / {p90:.1f} ms, {rate:.1f} sent/s",
                  flush=True)  # fmt: skip

    t0 = args.threads[0]
    head = f"{'system':<32} {'tokBLEU':>7} {'BLEU':>6}"
    for t in args.threads:
        head += f" | {t}T med ms {'p90':>6} {'sent/s':>7}"
    print()
    print(head)
    print("-" * len(head))
    for name, _, _ in systems:
        r = results[name]
        row = f"{name:<32} {r['tok_bleu']:>7.2f} {r['bleu']:>6.2f}"
        for t in args.threads:
            x = r[t]
            row += f" | {x['median_ms']:>10.1f} {x['p90_ms']:>6.1f} {x['sent_s']:>7.1f}"
        print(row)
    print(
        f"\n{len(lines)} test sentences (BLEU, and throughput at {t0} thread(s)); latency on the "
        f"first {args.latency_sentences}, throughput at other thread counts on the first "
        f"{args.batch_sentences}; batches of {args.batch_size}; torch {torch.__version__}, "
        f"ctranslate2 {__import__('ctranslate2').__version__}"
    )
    print(f"load average {os.getloadavg()}; busiest processes at the end:\n{busy_processes()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
