"""A generated parallel corpus with a WMT-like shape, for the scale benchmark (nothing downloaded).

Shape (WMT14 En–De training data, as commonly reported): words per source sentence log-normal
with median ≈ 21 and mean ≈ 24 (clipped to 1–250; about 1 % over 80 words), target length the
source length times a log-normal ratio (median 1.05); words drawn from a Zipf–Mandelbrot law
(``p(r) ∝ 1 / (r + 2.7)``) over 300k invented word types per language (short frequent words,
longer rare ones, some accented letters on the target side), sentence-initial capitals, commas,
a final full stop, numbers now and then. The target is a noisy word-by-word image of the source
(a fixed random bilingual dictionary for 70 % of the words, local swaps, insertions), so the two
sides share structure as real parallel text does. About 130 bytes per source line.

Deterministic in ``--seed``; writes ``train.{src,tgt}`` (``--pairs`` lines) and
``valid/test.{src,tgt}`` (3,000 lines each) to ``--output``::

    python bench/scale_corpus.py --pairs 500000 --output /work/data/scale/c0.5M
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

TYPES = 300_000
BLOCK = 20_000
SRC_LETTERS = list("etaoinshrdlcumwfgypbvkjxqz")
TGT_LETTERS = list("enisratdhulcgmobwfkzpvjyxq") + ["ä", "ö", "ü", "ß"]


def vocabulary(rng: np.random.Generator, letters: list[str]) -> np.ndarray:
    """``TYPES`` distinct invented words; rank r's length grows with log r."""
    freq = np.array([1.0 / (i + 1) ** 0.6 for i in range(len(letters))])
    freq /= freq.sum()
    words: list[str] = []
    seen: set[str] = set()
    rank = 0
    while len(words) < TYPES:
        n = int(np.clip(rng.normal(2 + 0.55 * np.log1p(rank), 1.5), 1, 18))
        w = "".join(rng.choice(letters, size=n, p=freq))
        if w not in seen:
            seen.add(w)
            words.append(w)
            rank += 1
    return np.array(words, dtype=object)


def zipf_cdf() -> np.ndarray:
    p = 1.0 / (np.arange(TYPES) + 2.7)
    return np.cumsum(p / p.sum())


def sentence_text(words: np.ndarray, rng: np.random.Generator) -> str:
    tokens = list(words)
    if rng.random() < 0.08:
        tokens.insert(int(rng.integers(0, len(tokens) + 1)), str(int(rng.integers(1, 2030))))
    for _ in range(int(rng.poisson(len(tokens) / 12))):
        k = int(rng.integers(0, len(tokens)))
        tokens[k] = tokens[k].rstrip(",") + ","
    tokens[0] = tokens[0][:1].upper() + tokens[0][1:]
    return " ".join(tokens).rstrip(",") + "."


def pairs(n: int, seed: int, src_vocab, tgt_vocab, dictionary, cdf):
    """``n`` (source, target) lines, in blocks of ``BLOCK``."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < n:
        m = min(BLOCK, n - done)
        src_len = np.clip(np.rint(rng.lognormal(3.05, 0.6, m)), 1, 250).astype(np.int64)
        ratio = rng.lognormal(0.05, 0.15, m)
        tgt_len = np.clip(np.rint(src_len * ratio), 1, 260).astype(np.int64)
        ranks = np.searchsorted(cdf, rng.random(int(src_len.sum())))  # all source words
        extra = np.searchsorted(cdf, rng.random(int(tgt_len.sum())))  # target noise words
        translate = rng.random(int(tgt_len.sum())) < 0.7
        s_off = np.concatenate([[0], np.cumsum(src_len)])
        t_off = np.concatenate([[0], np.cumsum(tgt_len)])
        out = []
        for i in range(m):
            r = ranks[s_off[i] : s_off[i + 1]]
            k = tgt_len[i]
            src_idx = np.minimum(np.arange(k) * len(r) // k, len(r) - 1)
            words = slice(t_off[i], t_off[i + 1])
            t = np.where(translate[words], dictionary[r[src_idx]], extra[words])
            if k > 2 and rng.random() < 0.5:
                j = int(rng.integers(0, k - 1))
                t[j], t[j + 1] = t[j + 1], t[j]
            out.append((sentence_text(src_vocab[r], rng), sentence_text(tgt_vocab[t], rng)))
        yield out
        done += m


def write(path_src: Path, path_tgt: Path, n: int, seed: int, tables) -> None:
    with open(path_src, "w", encoding="utf-8") as fs, open(path_tgt, "w", encoding="utf-8") as ft:
        for block in pairs(n, seed, *tables):
            fs.write("".join(s + "\n" for s, _ in block))
            ft.write("".join(t + "\n" for _, t in block))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, required=True, help="training pairs")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    start = time.time()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    src_vocab, tgt_vocab = vocabulary(rng, SRC_LETTERS), vocabulary(rng, TGT_LETTERS)
    # The dictionary keeps frequency roughly: source rank r maps near target rank r.
    ranks = np.arange(TYPES)
    dictionary = np.clip(ranks + rng.integers(-50, 50, TYPES) * (ranks // 100), 0, TYPES - 1)
    tables = (src_vocab, tgt_vocab, dictionary, zipf_cdf())
    write(out / "valid.src", out / "valid.tgt", 3000, args.seed + 1, tables)
    write(out / "test.src", out / "test.tgt", 3000, args.seed + 2, tables)
    write(out / "train.src", out / "train.tgt", args.pairs, args.seed + 3, tables)
    size = sum((out / f"train.{s}").stat().st_size for s in ("src", "tgt"))
    print(f"wrote {args.pairs} pairs ({size / 1e6:.0f} MB) to {out} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
