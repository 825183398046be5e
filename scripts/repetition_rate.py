"""Repetition rate of translations: the share of output words equal to the word before them in
the same sentence, words as tokenized BLEU counts them (sacremoses; ``fadat.evaluation.scoring``'s
``repetition_counts``).

    python scripts/repetition_rate.py --lang es HYPS.txt [HYPS.txt ...]

One line per file: the file, its repetition rate in percent, repeated and total words. Files are
plain text, one translation per line (``fadat evaluate --save-hypotheses DIR`` writes them; a
data directory's ``raw/test.ref.txt`` gives the references' rate).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fadat.errors import InputError
from fadat.evaluation.scoring import moses_tokenize, repetition_counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="translations, one per line")
    parser.add_argument("--lang", required=True, help="target language (sacremoses tokenizer)")
    args = parser.parse_args(argv)
    for name in args.files:
        path = Path(name)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            print(f"repetition_rate: {path}: {err}", file=sys.stderr)
            return 2
        repeated, total = repetition_counts(moses_tokenize(lines, args.lang))
        rate = 100.0 * repeated / total if total else 0.0
        print(f"{path}\t{rate:.2f} %\t{repeated} / {total}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as err:
        print(f"repetition_rate: {err}", file=sys.stderr)
        sys.exit(2)
