"""Write the training text of an n-gram language model for the DAG beam search
(``fadat translate --strategy beam --lm``): the target side of one split of a ``fadat prepare``d
data directory, as the model's sentencepiece pieces.

    python scripts/lm_corpus.py --data DATA_DIR --output lm.txt [--split train]
    lmplz -o 5 < lm.txt > lm.arpa          # KenLM's estimator
    build_binary lm.arpa lm.bin            # optional: loads faster
    fadat translate --model MODEL --strategy beam --lm lm.bin --gamma 0.1 < in.txt

The text is read from the split's binarized target ids (``{split}.tgt.ids.npy``: exactly the
token ids the model was trained on, so no text is tokenized again), each id written as its piece
of the directory's ``spm.model`` (``▁En ▁el ▁princip io``), one sentence per line, pieces
separated by one space; ``<s>``, ``</s>`` and ``<unk>`` ids are left out
(:func:`fadat.translation.language_model.lm_sentence`). The beam search gives the LM the same
pieces (:func:`fadat.translation.language_model.lm_words`). The file is written all-or-nothing:
on any error no partial output is left.

A model decodes with an LM of the data directory it was trained on (or of one with the same
sentencepiece model): other pieces are other words to the LM.

Exit 0; 2 with one line on stderr for a missing or invalid data directory, an unknown split or
an output that cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fadat import outputs
from fadat.data.binarized import BinarizedDataset
from fadat.data.spm import load_sentencepiece
from fadat.errors import InputError
from fadat.translation.language_model import lm_sentence


def write_corpus(data: str | Path, output: str | Path, split: str = "train") -> int:
    """Write the LM training text of ``split`` of ``data`` to ``output`` (all-or-nothing).

    Args:
        data: a data directory written by ``fadat prepare`` (``meta.json``, ``spm.model``,
            ``{split}.tgt.ids.npy`` and ``.off.npy``).
        output: the text file to write.
        split: the split whose targets are written.

    Returns:
        The number of lines written (one per sentence of the split).

    Raises:
        InputError: a missing or invalid data directory (no ``meta.json``, no ``spm.model``, no
            such split, corrupted id files: :class:`fadat.data.binarized.BinarizedDataset`), an
            output that is a directory, lies inside the data directory or cannot be written
            (:func:`fadat.outputs.check_output_file`; an existing file is replaced).
    """
    outputs.check_output_file(output, "--output", [("--data", data)], force=True)
    dataset = BinarizedDataset(data, split)
    sp = load_sentencepiece(Path(data) / "spm.model")
    with outputs.atomic_path(output, "--output") as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as out:
            for i in range(len(dataset)):
                _, target = dataset[i]
                out.write(lm_sentence(sp, target.tolist()) + "\n")
    return len(dataset)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory written by fadat prepare")
    parser.add_argument("--output", required=True, help="the LM's training text to write")
    parser.add_argument("--split", default="train", help="the split (default train)")
    args = parser.parse_args(argv)
    try:
        lines = write_corpus(args.data, args.output, args.split)
    except InputError as err:
        print(f"lm_corpus: error: {err}", file=sys.stderr)
        return 2
    print(f"lm_corpus: {lines} sentences of {args.data} ({args.split}) written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
