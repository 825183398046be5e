"""Load test and batching gain of ``fadat serve``, on loopback only.

Usage::

    .venv/bin/python bench/bench_serve.py --model models/bible-en-es-fadat-cpu-small \\
        --data data/bible-en-es [--threads 1] [--time-limit 240]

Starts ``fadat serve`` on 127.0.0.1 (a free port, ``--threads`` torch threads) as a subprocess
for each configuration and sends it requests from concurrent asyncio clients (httpx); every
request loop is bounded in count and the whole run in time (``--time-limit``, after which the
clients stop and the run is reported as cut short). Sentences are source sentences of the
split (``--split``, default test), so lengths are mixed as in real text.

1. **Batching gain** — ``--batch-clients`` clients (16) × ``--batch-requests`` requests (8)
   of one sentence each, against the server without batching (``--max-batch-tokens 0``) and
   with it (``--max-batch-tokens 4096 --max-wait-ms 5``), run twice in the order A B A B; the
   gain is the ratio of sentence throughputs in each pair.
2. **Load** — ``--load-clients`` clients (50) × ``--load-requests`` requests (20), each of
   1 to ``--load-sentences`` (1) sentences of mixed lengths, alternating strategies lookahead /
   greedy, against the
   batching server: errors (any answer but 200 with one translation per sentence), latency
   p50 / p95 / p99, throughput, and the server's resident memory (VmRSS) after a warm-up and
   after the load, with the bound ``after ≤ 1.5 × before``.

Prints markdown tables. Timings are noisy: other work shares the machine (the load average is
printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
RSS_BOUND = 1.5


class Server:
    """``fadat serve`` as a subprocess on 127.0.0.1 (a free port)."""

    def __init__(self, model: str, threads: int, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "fadat.cli", "serve", "--model", model, "--host",
                   "127.0.0.1", "--port", "0", "--threads", str(threads),
                   "--log-level", "warning", *extra]  # fmt: skip
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not match:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {line}")
        self.url = match.group(0)
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise SystemExit("the server did not answer /health")

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(120)


async def drive(
    url: str, jobs: list[list[dict]], deadline: float
) -> tuple[list[float], int, int, float, bool]:
    """Each client sends its list of request bodies in turn.

    Returns ``(latencies in s, errors, sentences, wall seconds, cut short)``.
    """
    latencies: list[float] = []
    errors = 0
    sentences = 0
    cut = False
    limits = httpx.Limits(max_connections=len(jobs), max_keepalive_connections=len(jobs))

    async def client(bodies: list[dict], http: httpx.AsyncClient) -> None:
        nonlocal errors, sentences, cut
        for body in bodies:
            if time.monotonic() > deadline:
                cut = True
                return
            start = time.perf_counter()
            try:
                r = await http.post(url + "/v1/translate", json=body, timeout=120)
                ok = r.status_code == 200 and len(r.json()["translations"]) == len(body["text"])
            except (httpx.HTTPError, ValueError, KeyError):
                ok = False
            latencies.append(time.perf_counter() - start)
            if ok:
                sentences += len(body["text"])
            else:
                errors += 1

    async with httpx.AsyncClient(limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(bodies, http) for bodies in jobs))
        wall = time.perf_counter() - start
    return latencies, errors, sentences, wall, cut


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else (values[0] if values else float("nan"))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-clients", type=int, default=16)
    parser.add_argument("--batch-requests", type=int, default=8)
    parser.add_argument("--load-clients", type=int, default=50)
    parser.add_argument("--load-requests", type=int, default=20)
    parser.add_argument("--load-sentences", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=300, help="seconds for everything")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from fadat.evaluation.scoring import load_split

    sources, _ = load_split(args.data, args.split, 0)
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.time_limit
    print(f"model {args.model}, {args.threads} torch thread(s) for the server, load average "
          f"{os.getloadavg()[0]:.2f} at the start (other work shares the machine)")  # fmt: skip

    # 1. batching gain at args.batch_clients concurrent clients, one sentence per request
    batch_jobs = [
        [{"text": [rng.choice(sources)]} for _ in range(args.batch_requests)]
        for _ in range(args.batch_clients)
    ]
    configs = {
        "no batching": ["--max-batch-tokens", "0"],
        "batching (T 4096, W 5 ms)": ["--max-batch-tokens", "4096", "--max-wait-ms", "5"],
        "batching, one model batch": [
            "--max-batch-tokens",
            "4096",
            "--max-wait-ms",
            "5",
            "--max-tokens",
            "100000",
        ],  # fmt: skip
    }
    rows = []
    for round_ in (1, 2):
        for name, extra in configs.items():
            server = Server(args.model, args.threads, *extra)
            try:
                asyncio.run(drive(server.url, [[{"text": sources[:4]}]], deadline))  # warm-up
                lat, errors, n, wall, cut = asyncio.run(drive(server.url, batch_jobs, deadline))
                stats = server.health()["batching"]
            finally:
                server.stop()
            rows.append((round_, name, n, errors, wall, lat, stats, cut))
    print()
    print(f"Batching gain: {args.batch_clients} concurrent clients x {args.batch_requests} "
          "requests of one test sentence; model batches of 512 unless said")  # fmt: skip
    print()
    print("| round | server | sentences | errors | seconds | sentences/s | p50 ms | p95 ms "
          "| mean batch (sentences) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for round_, name, n, errors, wall, lat, stats, cut in rows:
        print(
            f"| {round_} | {name}{' (cut short)' if cut else ''} | {n} | {errors} | {wall:.1f} | "
            f"{n / wall:.1f} | {1000 * percentile(lat, 50):.0f} | "
            f"{1000 * percentile(lat, 95):.0f} | {stats['mean_batch_sentences'] - 0:.2f} |"
        )
    per_round = len(configs)
    for k in range(0, len(rows), per_round):
        base = rows[k]
        for other in rows[k + 1 : k + per_round]:
            gain = (other[2] / other[4]) / (base[2] / base[4])
            print(f"round {base[0]}: {other[1]} / no batching: throughput {gain:.2f}x")

    # 2. load: many clients, mixed lengths and strategies
    load_jobs = []
    for c in range(args.load_clients):
        bodies = []
        for r in range(args.load_requests):
            count = rng.randint(1, args.load_sentences)
            body = {"text": [rng.choice(sources) for _ in range(count)]}
            if (c + r) % 2:
                body["strategy"] = "greedy"
            bodies.append(body)
        load_jobs.append(bodies)
    server = Server(args.model, args.threads)
    try:
        asyncio.run(drive(server.url, [[{"text": sources[:8]}]] * 4, deadline))  # warm-up
        before = server.rss_mib()
        lat, errors, n, wall, cut = asyncio.run(drive(server.url, load_jobs, deadline))
        after = server.rss_mib()
        stats = server.health()["batching"]
    finally:
        code = server.stop()
    requests = len(lat)
    print()
    print(f"Load: {args.load_clients} concurrent clients x {args.load_requests} requests of 1-"
          f"{args.load_sentences} test sentences, lookahead and greedy alternating, batching "
          "server (T 4096, W 5 ms, model batches of 512)"
          + (" -- CUT SHORT by --time-limit" if cut else ""))  # fmt: skip
    print()
    print("| requests | errors | sentences | seconds | requests/s | sentences/s | p50 ms | p95 ms "
          "| p99 ms | mean batch | RSS before MiB | RSS after MiB | bound |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    within = after <= RSS_BOUND * before
    print(
        f"| {requests} | {errors} | {n} | {wall:.1f} | {requests / wall:.2f} | {n / wall:.2f} | "
        f"{1000 * percentile(lat, 50):.0f} | {1000 * percentile(lat, 95):.0f} | "
        f"{1000 * percentile(lat, 99):.0f} | {stats['mean_batch_sentences']:.2f} | "
        f"{before:.0f} | {after:.0f} | after <= {RSS_BOUND} x before: "
        f"{'yes' if within else 'NO'} |"
    )
    print(f"server exit code after SIGTERM: {code}; load average at the end "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    return 0 if errors == 0 and within and code == 0 and not cut else 1


if __name__ == "__main__":
    sys.exit(main())
