"""The copy-task corpus of the training tests, prepared by the real ``fadat prepare``
(word-level sentencepiece, vocabulary 12)."""

from __future__ import annotations

import random
from pathlib import Path

from fadat.cli import main

WORDS = "alpha beta gamma delta omega sigma kappa theta".split()


def copy_sentences(rng: random.Random, n: int, repeats: bool) -> list[str]:
    """``n`` sentences of 2–6 words of :data:`WORDS`; without ``repeats`` no word twice in a
    row."""
    out = []
    for _ in range(n):
        words: list[str] = []
        for _ in range(rng.randint(2, 6)):
            allowed = [w for w in WORDS if repeats or not words or w != words[-1]]
            words.append(rng.choice(allowed))
        out.append(" ".join(words))
    return out


def prepare_copy_data(root: Path, repeats: bool) -> Path:
    """train 400 / valid 40 copy pairs, prepared by `fadat prepare` (generic text path)."""
    rng = random.Random(0)
    for split, n in (("train", 400), ("valid", 40)):
        lines = copy_sentences(rng, n, repeats)
        for side in ("src", "tgt"):
            (root / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = root / "data"
    rc = main(
        [
            "prepare",
            "--output", str(out),
            "--source-file", str(root / "train.src"),
            "--target-file", str(root / "train.tgt"),
            "--valid-source-file", str(root / "valid.src"),
            "--valid-target-file", str(root / "valid.tgt"),
            "--source-lang", "xx",
            "--target-lang", "yy",
            "--vocab-size", "12",
            "--model-type", "word",
        ]
    )  # fmt: skip
    assert rc == 0
    return out
