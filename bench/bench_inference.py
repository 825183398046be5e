"""DAT inference against the AT in CTranslate2, measured fairly (issue 34): one run, one table.

Usage::

    python bench/bench_inference.py --dat models/bible-en-es-fadat-cpu-small --at AT_DIR \\
        --data data/bible-en-es [--threads 1 2] [--repeats 3] [--latency-sentences 100] \\
        [--batch-sentences 512] [--batch-size 64] [--test-sentences 0] \\
        [--upsample-ratios 4 3] [--prune-thresholds 1e-2] [--shortlist FILE] \\
        [--at-shortlist FILE] \\
        [--only REGEX] [--json out.json]
    python bench/bench_inference.py --smoke --dat DAT --at AT --src SRC --ref REF   # seconds

Rows (``--only REGEX`` keeps the rows whose name matches):

- DAT through fadat's fast path (fadat.models.inference): greedy / lookahead / joint-Viterbi ×
  fp32 / bf16 / int8 weights × without and with the vocabulary shortlist (``+sl``; the DAT
  directory's ``shortlist.safetensors`` or ``--shortlist``; ``fadat shortlist`` builds one) ×
  without and with pruning at each ``--prune-thresholds`` τ (``+prune τ``; greedy computes the
  token head on its path only and is not pruned), at the model's λ and at each
  ``--upsample-ratios`` λ (``λ=x``; decode-time λ below the training λ);
- the AT exported to CTranslate2 (fadat.translation.export; ``--ct2-compute``, default int8): greedy
  and beam 5; the same with CTranslate2's vocabulary map written from a shortlist built the
  same way for the AT's vocabulary (``+vmap``; ``--at-shortlist``, default the AT directory's
  ``shortlist.safetensors``, else the DAT's when both share a vocabulary; CTranslate2 takes the
  union over a batch's sentences); and with every output
  forced to its reference's length (``=ref len``: ``n + 1`` decoding steps for a reference of
  ``n`` pieces, the work of an AT whose outputs have the references' lengths; for when no
  plateau AT exists; their BLEU is meaningless and not shown).

Protocol: token ids in, token ids out (sentencepiece excluded). Threads: for each of ``--threads``:
at 1 thread, torch's one intra-op thread for the DAT and CTranslate2's ``intra_threads=1``; at t >
1 two settings each, and the table shows the better of the two per column, named: ``torch t`` /
``intra t`` (``t`` intra-op threads) and ``inter t`` (``t`` replicas of one thread each, a batch
split into ``t`` parts run side by side: CTranslate2's ``inter_threads=t``; for the DAT ``t``
worker processes, :class:`Replicas`). Latency: batch 1 on the first ``--latency-sentences`` test
sentences after warm-up; throughput: the first ``--batch-sentences`` sorted by source length in
batches of ``--batch-size``. Every row (and every CTranslate2 setting) takes its turn on every
sentence (latency) and every batch (throughput), and this is repeated ``--repeats`` times: the
table gives the median over repeats of each repeat's median latency (ms) and sentences/s, with the
spread (min–max over repeats). BLEU (tokenized with the Moses tokenizer, and sacreBLEU) of each
row's batched outputs at the first thread count, on the first ``--test-sentences`` (0 = all).
``=full``: share of sentences whose output equals the same row without shortlist and pruning;
``cover``: share of sentences whose full-head path tokens are all in the shortlist (``+sl``) and
whose full-head path stays on kept vertices (``+prune``), from an untimed pass. The load average
and the busiest other processes are printed with the table; run it on a quiet machine.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fadat.data.contract import pad_sequences
from fadat.data.spm import encode_source
from fadat.decoding import decode
from fadat.evaluation.scoring import corpus_scores
from fadat.models.directory import load_model
from fadat.models.inference import PRECISIONS, graph_top1, kept_vertices, with_precision

Translate = Callable[[list[list[int]]], list[list[int]]]
DAT_STRATEGIES = ("greedy", "lookahead", "joint-viterbi")


@dataclass
class Row:
    """One row of the table: a system, its command, and per thread count its settings."""

    name: str
    kind: str  # "dat" or "at"
    command: str
    # threads -> [(setting label, factory of the translate function)]
    settings: Callable[[int], list[tuple[str, Callable[[], Translate]]]]
    bleu: bool = True
    baseline: str | None = None  # the row without shortlist/pruning (for "=full")
    dat: dict = field(default_factory=dict)  # model, strategy, shortlist, prune (for "cover")


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


# ----------------------------------------------------------------------------- DAT replicas
# ``inter t`` for the DAT: t worker processes of one torch thread each, a batch split into t
# contiguous parts translated side by side (CTranslate2's ``inter_threads``, as a server with
# t one-thread workers runs). Processes, not threads: torch's intra-op thread count is global.

_REPLICA: dict = {}


def _replica_init(dat_dir: str, precisions: list[str], shortlists: list[str]) -> None:
    """Worker start: one torch thread; every precision's model and every shortlist loaded now,
    so that no timed call pays for loading."""
    from fadat.models.shortlist import load_shortlist

    torch.set_num_threads(1)
    base, _ = load_model(dat_dir, "cpu")
    _REPLICA["models"] = {p: with_precision(base, p) for p in precisions}
    _REPLICA["shortlists"] = {
        path: load_shortlist(path, base.config.vocab_size) for path in shortlists
    }


def _replica_ready(seconds: float) -> int:
    """Keeps a worker busy a moment, so that submitting t of these starts all t workers."""
    time.sleep(seconds)
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


class Replicas:
    """A pool of ``workers`` one-thread processes holding the DAT in each of ``precisions``."""

    def __init__(self, dat_dir: str, workers: int, precisions: list[str], shortlists: list[str]):
        import concurrent.futures
        import multiprocessing

        self.workers = workers
        self.pool = concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_replica_init,
            initargs=(dat_dir, precisions, shortlists),
        )
        pids = {f.result() for f in [self.pool.submit(_replica_ready, 1.0) for _ in range(workers)]}
        if len(pids) != workers:
            raise RuntimeError(f"{workers} replicas asked for, {len(pids)} started")

    def translate(self, precision, strategy, shortlist, prune, ratio) -> Translate:
        def run(sources):
            n = len(sources)
            size = math.ceil(n / self.workers)
            parts = [sources[k : k + size] for k in range(0, n, size)]
            futures = [
                self.pool.submit(
                    _replica_translate, precision, strategy, shortlist, prune, ratio, p
                )
                for p in parts
            ]
            return [y for f in futures for y in f.result()]

        return run

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


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print the table; returns the results by row name (each with its
    ``command``, per thread count its settings' ``ms`` and ``sent_s`` as (median, min, max),
    and at the first thread count its batched ``outputs``, BLEU, ``same_as_full``, ``cover``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dat", required=True, help="DAT model directory")
    p.add_argument("--at", required=True, help="AT model directory (exported to CTranslate2)")
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
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--upsample-ratios", type=float, nargs="*", default=[], help="extra λ values")
    p.add_argument("--prune-thresholds", type=float, nargs="*", default=[1e-2])
    p.add_argument("--shortlist", help="shortlist file (default: the DAT's shortlist.safetensors)")
    p.add_argument(
        "--at-shortlist",
        help="the AT's shortlist for +vmap (default: the AT's shortlist.safetensors; else the "
        "DAT's when the vocabularies are the same)",
    )
    p.add_argument("--ct2-compute", nargs="+", default=["int8"])
    p.add_argument("--only", help="keep the rows whose name matches this regular expression")
    p.add_argument("--smoke", action="store_true", help="a few sentences, one repeat: seconds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.smoke:
        args.threads, args.repeats, args.warmup = args.threads[:1], 1, 1
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
    target_lang = (read_model_metadata(args.dat).get("data") or {}).get("target_lang", "es")

    dat, sp_dat = load_model(args.dat, "cpu")
    dat_models = {None: dat}  # λ → model: one model, λ passed to each call
    for ratio in args.upsample_ratios:
        dat_models[ratio] = dat
    sp_at = spm.SentencePieceProcessor(model_file=str(spm_model_path(args.at)))
    src_dat = [encode_source(sp_dat, x) for x in lines]
    src_at = [encode_source(sp_at, x) for x in lines]
    ref_lengths = [len(sp_at.encode(y)) for y in refs]
    shortlist_path = Path(args.shortlist or Path(args.dat) / SHORTLIST_NAME)
    shortlist = None
    if shortlist_path.is_file():
        shortlist = load_shortlist(shortlist_path, dat.config.vocab_size)
    else:
        print(f"no shortlist at {shortlist_path}: rows with +sl/+vmap left out", flush=True)

    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    export_ctranslate2(args.at, work / "at-ct2")
    same_vocab = [sp_at.id_to_piece(i) for i in range(sp_at.get_piece_size())] == [
        sp_dat.id_to_piece(i) for i in range(sp_dat.get_piece_size())
    ]
    at_shortlist_path = Path(args.at_shortlist or Path(args.at) / SHORTLIST_NAME)
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
        export_ctranslate2(args.at, work / "at-ct2-vmap", shortlist=vmap_from)
        vmap_command = f"fadat export --shortlist {vmap_from}"

    pools: dict[int, Replicas] = {}

    def replicas(t: int) -> Replicas:
        if t not in pools:
            shortlists = [str(shortlist_path)] if shortlist is not None else []
            pools[t] = Replicas(args.dat, t, list(args.precisions), shortlists)
        return pools[t]

    rows: list[Row] = []
    models = {}
    for ratio, base in dat_models.items():
        for precision in args.precisions:
            models[ratio, precision] = with_precision(base, precision)
    for (ratio, precision), model in models.items():
        lam = "" if ratio is None else f" λ={ratio:g}"
        for strategy in DAT_STRATEGIES:
            prunes = [None] + ([] if strategy == "greedy" else list(args.prune_thresholds))
            for use_sl in (False, True) if shortlist is not None else (False,):
                for prune in prunes:
                    name = f"DAT {strategy} {precision}{lam}"
                    base_name = name
                    name += " +sl" if use_sl else ""
                    name += f" +prune {prune:g}" if prune is not None else ""
                    command = (
                        f"fadat translate --model {args.dat} --strategy {strategy} "
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
                        return own + [(f"inter {t}", lambda: replicas(t).translate(p, s, f, pr, r))]

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
                            },
                        )
                    )
    ct2_variants = [("", {}, True), (" =ref len", {"forced": True}, False)]
    if (work / "at-ct2-vmap").is_dir():
        ct2_variants.insert(1, (" +vmap", {"vmap": True}, True))
    for compute in args.ct2_compute:
        for beam in (1, 5):
            for suffix, variant, bleu in ct2_variants:
                name = f"CT2 {'greedy' if beam == 1 else 'beam5'} {compute}{suffix}"
                directory = work / ("at-ct2-vmap" if variant.get("vmap") else "at-ct2")
                command = (
                    f"fadat export --format ctranslate2 --model {args.at} --output DIR"
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

                rows.append(Row(name, "at", command, settings, bleu=bleu))
    if args.only:
        rows = [r for r in rows if re.search(args.only, r.name)]

    results: dict[str, dict] = {r.name: {"command": r.command} for r in rows}
    for t_index, threads in enumerate(args.threads):
        torch.set_num_threads(threads)
        runs = {}
        for r in rows:
            for label, factory in r.settings(threads):
                runs[r.name, label] = (factory(), src_dat if r.kind == "dat" else src_at)
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
                outputs = outs[r.name, r.settings(threads)[0][0]]
                results[r.name]["outputs"] = outputs
                if r.bleu:
                    sp = sp_dat if r.kind == "dat" else sp_at
                    scores = corpus_scores([sp.decode(y) for y in outputs], [refs], target_lang)
                    results[r.name]["tok_bleu"] = round(scores["tok_bleu"], 2)
                    results[r.name]["bleu"] = round(scores["bleu"], 2)
            print(f"[{threads} thread(s)] {r.name}: {json.dumps(per)}", flush=True)
    torch.set_num_threads(args.threads[0])
    for r in rows:
        if r.baseline is not None and r.baseline in results:
            mine, full = results[r.name]["outputs"], results[r.baseline]["outputs"]
            same = sum(a == b for a, b in zip(mine, full, strict=True))
            results[r.name]["same_as_full"] = same / len(mine)
            d = r.dat
            results[r.name]["cover"] = coverage(
                d["model"], d["strategy"], d["sl"], d["prune"], src_dat, args.batch_size, d["ratio"]
            )

    print()
    head = f"{'#':>2} {'system':<40} {'tokBLEU':>7} {'BLEU':>6} {'=full':>5} {'cover':>5}"
    for t in args.threads:
        head += f" | {t}T ms (min-max)      setting | sent/s (min-max)        setting"
    print(head)
    print("-" * len(head))
    for k, r in enumerate(rows, start=1):
        x = results[r.name]
        tok, bleu = x.get("tok_bleu", math.nan), x.get("bleu", math.nan)
        row = f"{k:>2} {r.name:<40} {tok:>7.2f} {bleu:>6.2f}"
        row += f" {x.get('same_as_full', math.nan):>5.2f} {x.get('cover', math.nan):>5.2f}"
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
    print(
        f"\n{n_test} test sentences (BLEU, and throughput at {args.threads[0]} thread(s)); "
        f"latency on the first {latency_count}, throughput at other thread counts on the first "
        f"{min(args.batch_sentences, n_test)}; batches of {args.batch_size}; {args.repeats} "
        f"interleaved repeats, medians (min-max); torch {torch.__version__}, ctranslate2 "
        f"{__import__('ctranslate2').__version__}"
    )
    print(f"load average {os.getloadavg()}; busiest processes at the end:\n{busy_processes()}")
    if args.json:
        saved = {
            name: {k: v for k, v in x.items() if k != "outputs"} for name, x in results.items()
        }
        Path(args.json).write_text(json.dumps(saved, indent=1, default=str), encoding="utf-8")
    for pool in pools.values():
        pool.close()
    shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
