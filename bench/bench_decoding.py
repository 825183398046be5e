"""Decoding latency per strategy: fadat.decoding against simple per-sentence Python references.

Usage: ``.venv/bin/python bench/bench_decoding.py [--vocab 1000] [--repeats 3]``

For each strategy, batch size (1, 64) and graph size L (120, 240) the table gives the best of
``--repeats`` wall-clock times of one ``decode`` call for the whole batch, and of a plain
reference written here (a Python loop over sentences and vertices, one row of ``links`` at a
time; for Viterbi a per-sentence DP over the full ``(L, L)`` matrix at every length). The
"agree" column says whether the outputs (paths and tokens) are identical. Beam search has no
second implementation (the decoder is already per sentence). At batch 64 beam search and the
references (whose cost is linear in the batch) are timed on the first ``--beam-sentences`` /
``--ref-sentences`` sentences and scaled to 64 (marked "*"); "agree" then covers those.

Graphs are random but shaped like a trained model's: transitions favour short hops, token
distributions are peaked. ``V`` only enters through per-vertex max/top-k, so its value matters
little. Timings are noisy on a shared machine (see the load average printed at the end).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from fadat.data.contract import PAD_ID
from fadat.decoding import decode, output_tokens


def make_graphs(B: int, L: int, V: int, seed: int = 0):
    """Random ``(token_logprobs, links, graph_lengths)`` of full-size graphs, float32."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.full((B,), L, dtype=torch.int64)
    tlp = (torch.randn(B, L, V, generator=g) * 6).log_softmax(-1)  # (B, L, V)
    pos = torch.arange(L, dtype=torch.float32)
    hop = pos[None, :] - pos[:, None]  # (L, L) j - i
    ln = torch.randn(B, L, L, generator=g) * 3 - 0.5 * (hop - 2).abs()  # (B, L, L)
    valid = hop > 0  # (L, L)
    ln = ln.masked_fill(~valid, float("-inf"))
    ln = torch.where(valid.any(-1, keepdim=True), ln.log_softmax(-1), ln)
    return tlp, ln, lens


# ------------------------------------------------------------------------------------------------
# Per-sentence references


def ref_walk(tlp, ln, lens, beta):
    out = []
    for b in range(tlp.shape[0]):
        n = int(lens[b])
        s, tok = tlp[b, :n].max(-1)
        path, i = [0], 0
        while i != n - 1:
            row = ln[b, i, :n] if beta is None else ln[b, i, :n] + beta * s
            i = int(row.argmax())
            path.append(i)
        out.append((path, output_tokens([int(tok[v]) for v in path])))
    return out


def ref_viterbi(tlp, ln, lens, joint):
    out = []
    for b in range(tlp.shape[0]):
        n = int(lens[b])
        s, tok = tlp[b, :n].max(-1)
        links = ln[b, :n, :n]
        emit = s.clone() if joint else torch.zeros_like(s)
        emit[0] = emit[n - 1] = float("-inf")
        a = links[0] + emit
        best, best_k, bps, best_j = float("-inf"), 0, [], 0
        for k in range(1, n - 1):
            if k > 1:
                val, arg = (a[:, None] + links).max(0)
                a = val + emit
                bps.append(arg)
            v, j = (a + links[:, n - 1]).max(0)
            if float(v) / k > best:
                best, best_k, best_j = float(v) / k, k, int(j)
        if best == float("-inf"):
            path = [0, n - 1]
        else:
            rev, j = [n - 1], best_j
            for k in range(best_k, 0, -1):
                rev.append(j)
                if k > 1:
                    j = int(bps[k - 2][j])
            path = (rev + [0])[::-1]
        out.append((path, output_tokens([int(tok[v]) for v in path])))
    return out


def ref_sample(tlp, ln, lens, top_cand_n=5, top_p=0.9, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for b in range(tlp.shape[0]):
        n = int(lens[b])
        lp, tk = tlp[b, :n].topk(top_cand_n, -1)  # (n, c)
        path, toks, i, prev = [0], [], 0, None
        while i != n - 1:
            pair = ln[b, i, :n, None] + lp  # (n, c)
            pair[n - 1] = float("-inf")
            pair[n - 1, 0] = ln[b, i, n - 1]
            sc, flat = pair.reshape(-1).topk(top_cand_n)
            w = sc.double().exp().numpy()
            keep = (np.cumsum(w) - w) < top_p
            js, ts = (flat // top_cand_n).numpy(), tk.reshape(-1)[flat].numpy()
            w = np.where(keep, w, 0.0)
            w = np.where((ts == prev) & (js != n - 1) & keep, 1e-5, w)
            c = rng.choice(len(w), p=w / w.sum())
            i = int(js[c])
            path.append(i)
            if i != n - 1:
                toks.append(int(ts[c]))
                if ts[c] != PAD_ID:
                    prev = int(ts[c])
        out.append((path, toks))
    return out


REFERENCES = {
    "greedy": lambda *g: ref_walk(*g, beta=None),
    "lookahead": lambda *g: ref_walk(*g, beta=1.0),
    "viterbi": lambda *g: ref_viterbi(*g, joint=False),
    "joint-viterbi": lambda *g: ref_viterbi(*g, joint=True),
    "sample": lambda *g: ref_sample(*g),
    "beam": None,
}
DETERMINISTIC = {"greedy", "lookahead", "viterbi", "joint-viterbi"}


def best_time(fn, repeats: int):
    result, times = None, []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--beam-sentences", type=int, default=8)
    parser.add_argument("--ref-sentences", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--sizes", type=int, nargs="+", default=[120, 240])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(
        f"V = {args.vocab}, best of {args.repeats}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU"
    )
    print(
        f"| {'strategy':13} | {'B':>3} | {'L':>4} | {'fadat (ms)':>11} | {'ms/sent':>8} | "
        f"{'reference (ms)':>14} | {'speed-up':>8} | agree |"
    )
    print("|" + "|".join("-" * w for w in (15, 5, 6, 13, 10, 16, 10, 7)) + "|")
    for L in args.sizes:
        for B in args.batches:
            graphs = make_graphs(B, L, args.vocab)
            for strategy, ref in REFERENCES.items():
                opts = {"seed": 0} if strategy == "sample" else {}
                g = graphs
                scale, mark = 1.0, ""
                if strategy == "beam" and B > args.beam_sentences:
                    g = tuple(x[: args.beam_sentences] for x in graphs)
                    scale, mark = B / args.beam_sentences, "*"
                repeats = 1 if strategy == "beam" else args.repeats
                t_fast, hyps = best_time(
                    lambda g=g, s=strategy, o=opts: decode(*g, s, **o), repeats
                )
                t_fast *= scale
                if ref is None:
                    ref_cols, agree = f"{'—':>14} | {'—':>8}", "  —  "
                else:
                    rg, rscale, rmark = g, 1.0, " "
                    if B > args.ref_sentences:
                        rg = tuple(x[: args.ref_sentences] for x in g)
                        rscale, rmark = B / args.ref_sentences, "*"
                    t_ref, ref_out = best_time(lambda g=rg, r=ref: r(*g), args.repeats)
                    t_ref *= rscale
                    ref_cols = f"{t_ref * 1e3:13.1f}{rmark} | {t_ref / t_fast:7.1f}×"
                    if strategy in DETERMINISTIC:
                        pairs = zip(hyps[: len(ref_out)], ref_out, strict=True)
                        same = all((h.path, h.tokens) == r for h, r in pairs)
                        agree = " yes " if same else " NO  "
                    else:
                        agree = " n/a "  # different random streams
                print(
                    f"| {strategy:13} | {B:3d} | {L:4d} | {t_fast * 1e3:10.1f}{mark:1} | "
                    f"{t_fast * 1e3 / B:8.2f} | {ref_cols} | {agree} |"
                )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
