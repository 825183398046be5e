"""Scale benchmark: ``fadat prepare`` and ``fadat train`` start-up on generated WMT-size corpora.

For each size (default 0.5M, 1.5M, 4.5M training pairs) this

1. generates the corpus with ``bench/scale_corpus.py`` unless it exists (WMT-like lengths);
2. runs ``fadat prepare`` on it (8k joint BPE, default options) under ``/usr/bin/time``: wall
   time and peak RSS of the process;
3. runs ``torchrun --nproc_per_node P -m fadat.cli train`` (P = 1, 2; cpu-small DA-Transformer,
   ``configs/dat-cpu-small-nll.yaml``, one thread per process) and watches it: the time from the
   launch to the first line of ``train_log.jsonl`` (the first update: Python and torch start-up,
   data, batches, model, one update), the CPU seconds each training process has used by then
   (user + system: what the start-up costs whatever else runs on the machine) and each
   training process's peak RSS (``VmHWM``) at that
   moment, and the trainer's own record of its set-up (seconds from the start of the trainer to
   the end of data, batch plan, model and optimizer, and each process's peak RSS at that point,
   before any update); then it stops the run (each of its processes is killed by pid);
4. the same training start-up on a 3,000-pair dataset with the same vocabulary and model
   (``tiny``), whose peak RSS is the model + optimizer + one update without the large data:
   the difference is what the data costs each process.

Results go to ``--out/results.jsonl`` (one line per measurement; a measurement already there is
not repeated, so the benchmark resumes) and a table is printed. Targets (issue "WMT-size data"):
prepare of 4.5M pairs ≤ 30 min and ≤ 3 GB peak RSS on 2 cores, growing linearly; first update
≤ 60 s; RSS per process ≤ 1.5 GB beyond model and optimizer.

The machine is shared: the table prints the load average and the other busy processes seen at
the start of each measurement. Run it at low priority::

    nice -n 10 python bench/bench_scale.py --sizes 0.5M --root /work/data/scale \\
        --out /work/runs/scale/bench
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SIZES = {"0.5M": 500_000, "1.5M": 1_500_000, "4.5M": 4_500_000}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def others() -> str:
    """Load average and the busiest processes that are not this benchmark's."""
    load = Path("/proc/loadavg").read_text().split()[:3]
    ps = subprocess.run(
        ["ps", "-eo", "pid,pcpu,rss,args", "--sort=-pcpu", "--no-headers"],  # noqa: S607
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    mine = {os.getpid()}  # and the processes of earlier measurements are gone (killed)
    busy = []
    for line in ps:
        pid, cpu, rss, *cmd = line.split(None, 3)
        if int(pid) in mine or float(cpu) < 20 or "ps -eo" in line:
            continue
        busy.append(f"{' '.join(cmd)[:60]} ({cpu}% cpu, {int(rss) // 1024} MiB)")
    return f"load {' '.join(load)}; " + "; ".join(busy[:4])


def record(out: Path, entry: dict) -> None:
    with open(out / "results.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    print(json.dumps(entry), flush=True)


def done(out: Path) -> dict[tuple[str, str], dict]:
    path = out / "results.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["size"], r["what"]): r for r in rows}


def generate(root: Path, size: str) -> Path:
    corpus = root / f"c{size}"
    if not (corpus / "train.tgt").is_file() or not (corpus / "test.tgt").is_file():
        subprocess.run(
            [PY, str(REPO / "bench" / "scale_corpus.py"), "--pairs", str(SIZES[size]),
             "--output", str(corpus)],
            check=True,
        )  # fmt: skip
    return corpus


def prepare_args(corpus: Path, output: Path, *extra: str) -> list[str]:
    files = []
    for split, prefix in (("train", ""), ("valid", "valid-"), ("test", "test-")):
        if split == "train" and extra and extra[0] == "--tiny":
            files += ["--source-file", str(corpus / "valid.src")]
            files += ["--target-file", str(corpus / "valid.tgt")]
            continue
        files += [f"--{prefix}source-file", str(corpus / f"{split}.src")]
        files += [f"--{prefix}target-file", str(corpus / f"{split}.tgt")]
    extra = tuple(e for e in extra if e != "--tiny")
    return [PY, "-m", "fadat.cli", "prepare", *files, "--source-lang", "en", "--target-lang",
            "de", "--output", str(output), *extra]  # fmt: skip


def timed(cmd: list[str], log: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (KiB) and exit code of ``cmd`` under GNU time."""
    with open(log, "w") as f:
        start = time.time()
        rc = subprocess.run(
            ["/usr/bin/time", "-f", "TIME %e %M", *cmd], stderr=f, stdout=f, env=env()
        ).returncode
        seconds = time.time() - start
    last = [ln for ln in log.read_text().splitlines() if ln.startswith("TIME ")][-1].split()
    return seconds, int(last[2]), rc


def run_prepare(root: Path, size: str, out: Path, threads: int) -> dict:
    corpus = generate(root, size)
    data = root / f"d{size}"
    if data.exists():
        shutil.rmtree(data)
    context = others()
    cmd = prepare_args(corpus, data, "--threads", str(threads))
    seconds, rss_kib, rc = timed(cmd, out / f"prepare-{size}.log")
    if rc != 0:
        raise SystemExit(f"prepare failed, see {out / f'prepare-{size}.log'}")
    meta = json.loads((data / "meta.json").read_text())
    return {
        "size": size,
        "what": "prepare",
        "pairs": meta["splits"]["train"]["pairs"],
        "seconds": round(seconds, 1),
        "spm_seconds": meta["spm_seconds"],
        "encode_seconds": meta["encode_seconds"],
        "peak_rss_mib": rss_kib // 1024,
        "dataset_mib": sum(p.stat().st_size for p in data.rglob("*") if p.is_file()) >> 20,
        "threads": threads,
        "others": context,
        "command": " ".join(cmd[1:]),
    }


def descendants(pid: int) -> list[int]:
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        out.append(int(child))
        out += descendants(int(child))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # kB
    return 0


def run_train(data: Path, size: str, procs: int, out: Path, what: str) -> dict:
    run_dir = out / f"run-{what}-{size}-{procs}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs),
        "-m", "fadat.cli", "train", "--config", str(REPO / "configs" / "dat-cpu-small-nll.yaml"),
        "--data", str(data), "--run-dir", str(run_dir), "--threads", "1", "--bf16",
        "--max-updates", "2", "--update-freq", "1", "--no-progress-bar",
    ]  # fmt: skip
    context = others()
    log = open(out / f"train-{what}-{size}-{procs}.log", "w")  # noqa: SIM115
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env())
    first = run_dir / "train_log.jsonl"
    peak: dict[int, int] = {}
    seen: set[int] = set()
    cpu: dict[int, float] = {}
    seconds = None
    try:
        while proc.poll() is None:
            pids = [p for p in descendants(proc.pid) if "fadat.cli" in _cmdline(p)]
            seen.update(pids)
            for p in pids:
                try:
                    peak[p] = max(peak.get(p, 0), status(p, "VmHWM"))
                except (FileNotFoundError, ProcessLookupError):
                    pass
            if first.is_file() and first.stat().st_size > 0:
                seconds = time.time() - start
                for p in pids:
                    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                        cpu[p] = cpu_seconds(p)
                break
            if time.time() - start > 900:
                break
            time.sleep(0.05)
    finally:
        # torchrun starts its workers in sessions of their own: stop each one by its pid.
        for pid in [*sorted(seen), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        log.close()
    if seconds is None:
        raise SystemExit(f"no first update, see {log.name}")
    workers = sorted(peak.values(), reverse=True)
    params = None
    text = (run_dir / "train.log").read_text() if (run_dir / "train.log").is_file() else ""
    ready_s, ready_rss = None, None
    for line in text.splitlines():
        if "parameters" in line:
            params = int(line.split(" model, ")[1].split(" parameters")[0])
        if "ready after" in line:  # the trainer's own start-up record (before the first update)
            ready_s = float(line.split("ready after ")[1].split(" s;")[0])
            ready_rss = [int(x) for x in line.split("so far: ")[1].split(" MiB")[0].split(", ")]
    return {
        "size": size,
        "what": f"{what}-{procs}",
        "first_update_s": round(seconds, 1),
        "peak_rss_mib_per_process": [w // 1024 for w in workers[:procs]],
        "cpu_s_per_process": sorted((round(c, 1) for c in cpu.values()), reverse=True),
        "setup_s": ready_s,
        "setup_rss_mib_per_process": ready_rss,
        "parameters": params,
        "model_optimizer_mib": round(params * 16 / 2**20) if params else None,
        "others": context,
        "command": " ".join(cmd[1:]),
    }


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _first(r: dict | None) -> str:
    if not r:
        return "-"
    cpu = r.get("cpu_s_per_process")
    return f"{r['first_update_s']} s" + (f" ({max(cpu)} s CPU)" if cpu else "")


def _rss(r: dict | None) -> str:
    if not r:
        return "-"
    setup = r.get("setup_rss_mib_per_process") or ["?"] * len(r["peak_rss_mib_per_process"])
    pairs = zip(setup, r["peak_rss_mib_per_process"], strict=False)
    return ", ".join(f"{a} / {b}" for a, b in pairs) + " MiB"


def table(results: dict[tuple[str, str], dict]) -> str:
    rows = [
        "| pairs | prepare wall | prepare peak RSS | dataset | first update, 1 proc (wall, CPU) | "
        "peak RSS 1 proc (set-up / first update) | first update, 2 procs | "
        "peak RSS per proc, 2 procs (set-up / first update) | same on 3,000 pairs: 1; 2 procs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        p = results.get((size, "prepare"))
        t1, t2 = results.get((size, "train-1")), results.get((size, "train-2"))
        b1 = results.get((size, "tiny-1")) or next(
            (r for (_, w), r in results.items() if w == "tiny-1"), None
        )
        b2 = results.get((size, "tiny-2")) or next(
            (r for (_, w), r in results.items() if w == "tiny-2"), None
        )
        if not p:
            continue
        cells = [
            size,
            f"{p['seconds'] / 60:.1f} min (spm {p['spm_seconds']:.0f} s)",
            f"{p['peak_rss_mib']} MiB",
            f"{p['dataset_mib']} MiB",
            _first(t1),
            _rss(t1),
            _first(t2),
            _rss(t2),
            f"{_first(b1)}, {_rss(b1)}; {_first(b2)}, {_rss(b2)}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.5M,1.5M,4.5M")
    parser.add_argument("--root", default="/work/data/scale", help="corpora and datasets")
    parser.add_argument("--out", default="/work/runs/scale/bench", help="logs and results")
    parser.add_argument("--steps", default="prepare,train", help="prepare,train")
    parser.add_argument("--threads", type=int, default=2, help="fadat prepare --threads")
    parser.add_argument("--procs", default="1,2", help="torchrun process counts")
    parser.add_argument("--table", action="store_true", help="only print the table")
    parser.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the 3,000-pair runs (the same at every size: one size's are enough)",
    )
    args = parser.parse_args()
    root, out = Path(args.root), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    steps = args.steps.split(",")
    for size in [] if args.table else args.sizes.split(","):
        have = done(out)
        if "prepare" in steps and (size, "prepare") not in have:
            record(out, run_prepare(root, size, out, args.threads))
        data = root / f"d{size}"
        if "train" in steps and (data / "meta.json").is_file():
            tiny = root / f"d{size}-tiny"
            if args.baseline and not (tiny / "meta.json").is_file():
                spm_model = ("--spm-model", str(data / "spm.model"))
                subprocess.run(
                    prepare_args(root / f"c{size}", tiny, "--tiny", *spm_model),
                    check=True,
                    env=env(),
                )
            runs = (("train", data), ("tiny", tiny)) if args.baseline else (("train", data),)
            for procs in map(int, args.procs.split(",")):
                for what, d in runs:
                    if (size, f"{what}-{procs}") not in done(out):
                        record(out, run_train(d, size, procs, out, what))
    print("Other work shared the machine during these runs (see 'others' in results.jsonl).")
    print(table(done(out)))


if __name__ == "__main__":
    main()
